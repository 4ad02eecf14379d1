"""HotpotQA conversion on slices of the shipped real dev sample: ids, tasks vs labels,
supporting facts, the three input layouts, --limit, determinism, and every broken-input
message (``file:line: [index].field: message``)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.hf_layout import hotpot_schema, prepared_differences, write_json_lines, write_parquet
from tests.support.hf_layout import hotpot_to_hf as to_hf
from typer.testing import CliRunner

from memsearch.cli.app import app
from memsearch.data.dataset import load_dataset, save_dataset
from memsearch.data.hotpot import convert_hotpot
from memsearch.errors import InputError
from memsearch.io import iter_jsonl

ROOT = Path(__file__).resolve().parents[2]
DEV_SAMPLE = ROOT / "data" / "samples" / "hotpotqa" / "dev_distractor_sample.json"
FILES = ("corpus.jsonl", "tasks.jsonl", "labels.jsonl", "manifest.json")
N = 20


@pytest.fixture(scope="module")
def dev() -> list[dict]:
    return json.loads(DEV_SAMPLE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def head(dev) -> list[dict]:
    return [dict(ex) for ex in dev[:N]]


@pytest.fixture(scope="module")
def head_file(head, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hotpot") / "dev20.json"
    path.write_text(json.dumps(head), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def converted(head_file):
    return convert_hotpot(head_file, split="dev")


@pytest.fixture(scope="module")
def saved(converted, tmp_path_factory) -> Path:
    return save_dataset(converted, tmp_path_factory.mktemp("saved") / "out")


def problems_of(path: Path, **kwargs) -> list[str]:
    with pytest.raises(InputError) as info:
        convert_hotpot(path, **kwargs)
    return str(info.value).split("\n")


def hashes(folder: Path) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in FILES}


# --------------------------------------------------------------------------- documents


def test_doc_ids_follow_first_appearance(head, converted):
    expected: dict[tuple[str, tuple[str, ...]], str] = {}
    for ex in head:
        for title, sentences in ex["context"]:
            expected.setdefault((title, tuple(sentences)), f"d{len(expected)}")
    assert len(expected) == 199  # 200 paragraphs, one of them in two examples
    assert [d.doc_id for d in converted.documents] == [f"d{i}" for i in range(199)]
    assert [(d.title, tuple(d.sentences)) for d in converted.documents] == list(expected)
    assert converted.tasks[0].doc_ids == [f"d{i}" for i in range(10)]
    assert [converted.documents[i].title for i in range(5)] == [
        "Ed Wood (film)",
        "Scott Derrickson",
        "Woodson, Arkansas",
        "Tyler Bates",
        "Ed Wood",
    ]


def test_shared_paragraph_gets_one_id(head, converted):
    title = "Loan modification in the United States"
    assert head[6]["context"][3][0] == title and head[12]["context"][8][0] == title
    assert converted.tasks[6].doc_ids[3] == "d63"
    assert converted.tasks[12].doc_ids == [f"d{i}" for i in range(120, 128)] + ["d63", "d128"]
    docs = converted.documents_by_id()
    assert docs["d63"].title == title
    assert sum(1 for d in converted.documents if d.title == title) == 1


def test_document_text_joins_sentences(converted):
    doc = converted.documents_by_id()["d1"]
    assert (
        doc.sentences[0] == "Scott Derrickson (born July 16, 1966) is an American director, screenwriter and producer."
    )
    assert doc.text == "".join(doc.sentences)


# --------------------------------------------------------------------------- tasks and labels


def test_tasks_hold_only_id_question_doc_ids(saved, head):
    rows = [obj for _, obj in iter_jsonl(saved / "tasks.jsonl")]
    assert len(rows) == N
    assert all(list(row) == ["id", "question", "doc_ids"] for row in rows)
    assert rows[0] == {
        "id": "5a8b57f25542995d1e6f1371",
        "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
        "doc_ids": [f"d{i}" for i in range(10)],
    }
    assert [r["id"] for r in rows] == [ex["_id"] for ex in head]
    assert [r["question"] for r in rows] == [ex["question"] for ex in head]


def test_labels_of_a_known_example(saved):
    labels = [obj for _, obj in iter_jsonl(saved / "labels.jsonl")]
    assert labels[0] == {
        "id": "5a8b57f25542995d1e6f1371",
        "answers": ["yes"],
        "supporting_facts": ["d1:0", "d4:0"],
        "gold_doc_ids": ["d1", "d4"],
        "type": "comparison",
        "level": "hard",
    }
    # 'Shirley Temple' gives two facts but one gold document
    assert labels[1]["supporting_facts"] == ["d16:0", "d11:0", "d11:1"]
    assert labels[1]["gold_doc_ids"] == ["d16", "d11"]
    assert labels[1]["answers"] == ["Chief of Protocol"]
    docs = {d["doc_id"]: d for _, d in iter_jsonl(saved / "corpus.jsonl")}
    assert docs["d1"]["title"] == "Scott Derrickson"
    assert docs["d4"]["title"] == "Ed Wood"
    assert docs["d4"]["sentences"][0].startswith(
        "Edward Davis Wood Jr. (October 10, 1924 \u2013 December 10, 1978) was an American filmmaker"
    )
    assert docs["d16"]["title"] == "Kiss and Tell (1945 film)"
    assert docs["d11"]["title"] == "Shirley Temple"


def test_every_supporting_fact_points_at_its_sentence(head, converted):
    docs = converted.documents_by_id()
    for ex, task, label in zip(head, converted.tasks, converted.labels):
        assert label.id == task.id == ex["_id"]
        context = dict((t, s) for t, s in reversed(ex["context"]))  # first paragraph of a title wins
        expected_facts, expected_gold = [], []
        for title, sent in ex["supporting_facts"]:
            doc_id = task.doc_ids[[t for t, _ in ex["context"]].index(title)]
            assert docs[doc_id].title == title
            assert docs[doc_id].sentences[sent] == context[title][sent]
            expected_facts.append(f"{doc_id}:{sent}")
            if doc_id not in expected_gold:
                expected_gold.append(doc_id)
        assert label.supporting_facts == list(dict.fromkeys(expected_facts))
        assert label.gold_doc_ids == expected_gold
        assert set(label.gold_doc_ids) <= set(task.doc_ids)
        assert label.answers == [ex["answer"]]
        assert (label.type, label.level) == (ex["type"], ex["level"])


def test_manifest(saved, head_file):
    manifest = json.loads((saved / "manifest.json").read_text(encoding="utf-8"))
    assert manifest == {
        "format": "memsearch-data/1",
        "kind": "hotpotqa",
        "split": "dev",
        "evidence_granularity": "sentence",
        "converter": "hotpot-1",
        "source": {"name": "dev20.json", "sha256": hashlib.sha256(head_file.read_bytes()).hexdigest()},
        "options": {"limit": None},
        "counts": {"documents": 199, "tasks": N, "labels": N},
        "files": {name: hashes(saved)[name] for name in FILES[:3]},
    }
    assert str(saved.parent) not in (saved / "manifest.json").read_text()


def test_saved_folder_round_trips(saved, converted):
    back = load_dataset(saved)
    assert back.documents == converted.documents
    assert back.tasks == converted.tasks
    assert back.labels == converted.labels


# --------------------------------------------------------------------------- layouts and options


def test_hugging_face_layout_gives_identical_outputs(head, saved, tmp_path):
    hf = tmp_path / "hf.json"
    hf.write_text(json.dumps([to_hf(ex) for ex in head]), encoding="utf-8")
    out = save_dataset(convert_hotpot(hf, split="dev"), tmp_path / "out")
    for name in FILES[:3]:
        assert (out / name).read_bytes() == (saved / name).read_bytes(), name
    a = json.loads((out / "manifest.json").read_text())
    b = json.loads((saved / "manifest.json").read_text())
    assert a.pop("source") == {"name": "hf.json", "sha256": hashlib.sha256(hf.read_bytes()).hexdigest()}
    b.pop("source")
    assert a == b


def test_hugging_face_layout_as_json_lines(head, saved, tmp_path):
    hf = tmp_path / "hf.jsonl"
    hf.write_text("".join(json.dumps(to_hf(ex)) + "\n" for ex in head), encoding="utf-8")
    out = save_dataset(convert_hotpot(hf), tmp_path / "out")
    assert [(out / n).read_bytes() for n in FILES[:3]] == [(saved / n).read_bytes() for n in FILES[:3]]


@pytest.mark.parametrize("name", ["validation-00000-of-00001.parquet", "blob-without-extension", "named-dev.json"])
def test_hugging_face_parquet_gives_identical_outputs(head, saved, tmp_path, name):
    """``hotpot_qa`` as the Hub stores it (parquet, structs of parallel lists), recognised by its
    bytes whatever the file is called, prepares the very same data as the original JSON."""
    src = write_parquet(tmp_path / name, [to_hf(ex) for ex in head], hotpot_schema(), row_group_size=7)
    out = save_dataset(convert_hotpot(src, split="dev"), tmp_path / "out")
    assert prepared_differences(out, saved) == []
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"] == {"name": name, "sha256": hashlib.sha256(src.read_bytes()).hexdigest()}


def test_hugging_face_parquet_limit(head, converted, tmp_path):
    src = write_parquet(tmp_path / "hf.parquet", [to_hf(ex) for ex in head], hotpot_schema(), row_group_size=3)
    small = convert_hotpot(src, limit=5)
    assert (small.tasks, small.labels, small.documents) == (converted.tasks[:5], converted.labels[:5],
                                                            converted.documents[:50])


def test_malformed_hugging_face_parquet_names_file_row_and_field(head, tmp_path):
    rows = [to_hf(ex) for ex in head[:6]]
    rows[1]["context"]["title"] = rows[1]["context"]["title"][:-1]
    rows[2]["id"] = rows[0]["id"]
    rows[3]["supporting_facts"]["sent_id"] = [None] + rows[3]["supporting_facts"]["sent_id"][1:]
    rows[4]["answer"] = None
    rows[5]["context"] = None
    src = write_parquet(tmp_path / "hf.parquet", rows, hotpot_schema())
    assert problems_of(src) == [
        f"{src}: [row 1].context: 9 titles but 10 sentence lists, expected parallel lists",
        f"{src}: [row 2].id: duplicate id {rows[0]['id']!r} (first used at row 0), expected unique ids",
        f"{src}: [row 3].supporting_facts[0]: got [{rows[3]['supporting_facts']['title'][0]!r}, None], "
        "expected [title string, integer sentence index]",
        f"{src}: [row 4].answer: got NoneType None, expected the answer string",
        f"{src}: [row 5].context: missing or not a list, expected [[title, [sentence, ...]], ...]",
    ]


def test_malformed_hugging_face_json_lines_names_file_line_and_field(head, tmp_path):
    rows = [to_hf(ex) for ex in head[:3]]
    rows[2]["supporting_facts"]["sent_id"] = rows[2]["supporting_facts"]["sent_id"] + [0]
    src = write_json_lines(tmp_path / "hf.jsonl", rows)
    n = len(rows[2]["supporting_facts"]["title"])
    assert problems_of(src) == [
        f"{src}:3: [2].supporting_facts: {n} titles but {n + 1} sentence ids, expected parallel lists"]


def test_damaged_parquet_is_one_clear_error(head, tmp_path):
    src = write_parquet(tmp_path / "hf.parquet", [to_hf(ex) for ex in head], hotpot_schema())
    src.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    (line,) = problems_of(src)
    assert line.startswith(f"{src}: file: unreadable parquet (") and line.endswith(
        "), expected a complete parquet file as datasets or pyarrow write it")


def test_parquet_without_pyarrow_names_the_package(head, tmp_path):
    """Where pyarrow is not installed (the package does not depend on it), a parquet input says
    which package reads it; a None entry in sys.modules is how Python marks a module unimportable."""
    src = write_parquet(tmp_path / "hf.parquet", [to_hf(ex) for ex in head[:2]], hotpot_schema())
    code = ("import sys; sys.modules['pyarrow'] = sys.modules['pyarrow.parquet'] = None\n"
            "from memsearch.data.hotpot import convert_hotpot\n"
            "from memsearch.errors import InputError\n"
            f"try: convert_hotpot({str(src)!r})\n"
            "except InputError as exc: print(exc)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout == (
        f"{src}: file: a parquet file, but the pyarrow package that reads it is not installed; expected "
        "`pip install pyarrow`, or the dataset exported as JSON lines (datasets: Dataset.to_json)\n")


def test_json_lines_input_gives_identical_outputs(head, saved, tmp_path):
    src = tmp_path / "dev.jsonl"
    src.write_text("".join(json.dumps(ex, ensure_ascii=False) + "\n" for ex in head), encoding="utf-8")
    out = save_dataset(convert_hotpot(src), tmp_path / "out")
    assert [(out / n).read_bytes() for n in FILES[:3]] == [(saved / n).read_bytes() for n in FILES[:3]]


def test_limit_takes_first_n_in_source_order(head_file, converted):
    small = convert_hotpot(head_file, limit=5)
    assert small.tasks == converted.tasks[:5]
    assert small.labels == converted.labels[:5]
    assert small.documents == converted.documents[:50]
    assert small.manifest["options"] == {"limit": 5}
    assert convert_hotpot(head_file, limit=100).tasks == converted.tasks


def test_limit_on_the_real_sample_file(converted):
    """The real file is one 6 MB line; --limit reads it record by record."""
    ds = convert_hotpot(DEV_SAMPLE, limit=N)
    assert ds.tasks == converted.tasks and ds.labels == converted.labels and ds.documents == converted.documents
    assert ds.manifest["source"] == {
        "name": DEV_SAMPLE.name,
        "sha256": hashlib.sha256(DEV_SAMPLE.read_bytes()).hexdigest(),
    }


def test_two_runs_are_byte_identical(head_file, tmp_path):
    a = save_dataset(convert_hotpot(head_file, limit=12), tmp_path / "a")
    copy = tmp_path / "elsewhere" / head_file.name  # same bytes and name in another folder
    copy.parent.mkdir()
    copy.write_bytes(head_file.read_bytes())
    b = save_dataset(convert_hotpot(copy, limit=12), tmp_path / "b")
    assert hashes(a) == hashes(b)
    assert sorted(p.name for p in a.iterdir()) == sorted(FILES)


def test_split_train_is_recorded(head_file):
    assert convert_hotpot(head_file, split="train", limit=1).manifest["split"] == "train"


# --------------------------------------------------------------------------- broken inputs


def test_truncated_json(head, tmp_path):
    path = tmp_path / "cut.json"
    text = json.dumps(head[:3], indent=2)
    cut = text.index('"level"', text.index('"_id": "' + head[1]["_id"]))  # between two keys of record 1
    path.write_text(text[:cut], encoding="utf-8")
    line = text[:cut].count("\n") + 1
    assert problems_of(path) == [
        f"{path}:{line}: json: truncated JSON in record 1 (Expecting property name enclosed in double quotes, column "
        "5), "
        "expected a complete JSON record"
    ]


def test_missing_question(pretty, head, tmp_path):
    records = [dict(ex) for ex in head[:3]]
    del records[1]["question"]
    starts = pretty(tmp_path / "q.json", records)
    assert problems_of(tmp_path / "q.json") == [
        f"{tmp_path / 'q.json'}:{starts[1]}: [1].question: missing, expected the question string"
    ]


def test_supporting_facts_as_string(pretty, head, tmp_path):
    records = [dict(ex) for ex in head[:3]]
    records[2]["supporting_facts"] = "Scott Derrickson"
    path = tmp_path / "sf.json"
    starts = pretty(path, records)
    assert problems_of(path) == [
        f"{path}:{starts[2]}: [2].supporting_facts: missing or not a list, expected [[title, sentence_index], ...]"
    ]


def test_wrong_types(pretty, head, tmp_path):
    records = [dict(ex) for ex in head[:4]]
    records[0]["answer"] = 7
    records[1]["supporting_facts"] = [["Kiss and Tell (1945 film)", "0"]]
    records[2]["context"] = records[2]["context"][:2] + [["Title only"]]
    records[3]["_id"] = None
    path = tmp_path / "types.json"
    s = pretty(path, records)
    assert problems_of(path) == [
        f"{path}:{s[0]}: [0].answer: got int 7, expected the answer string",
        f"{path}:{s[1]}: [1].supporting_facts[0]: got ['Kiss and Tell (1945 film)', '0'], expected [title string, "
        "integer sentence index]",
        f"{path}:{s[2]}: [2].context[2]: got ['Title only'], expected [title, [sentence, ...]]",
        f"{path}:{s[3]}: [3]._id: got NoneType None, expected the example id (string '_id' or 'id')",
    ]


def test_non_string_type_is_an_input_error(pretty, head, tmp_path):
    records = [dict(ex) for ex in head[:2]]
    records[1]["type"] = 5
    path = tmp_path / "type.json"
    s = pretty(path, records)
    assert problems_of(path) == [f"{path}:{s[1]}: [1].type: got 5, expected a string"]


def test_duplicate_id(pretty, head, tmp_path):
    records = [dict(ex) for ex in head[:3]]
    records[2]["_id"] = records[0]["_id"]
    path = tmp_path / "dup.json"
    s = pretty(path, records)
    assert problems_of(path) == [
        f"{path}:{s[2]}: [2]._id: duplicate id '5a8b57f25542995d1e6f1371' (first used at line {s[0]}), expected unique "
        "ids"
    ]


def test_duplicate_id_in_json_lines_names_lines(head, tmp_path):
    records = [dict(ex) for ex in head[:3]]
    records[2]["_id"] = records[1]["_id"]
    path = tmp_path / "dup.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    assert problems_of(path) == [
        f"{path}:3: [2]._id: duplicate id '5a8c7595554299585d9e36b6' (first used at line 2), expected unique ids"
    ]


def test_supporting_fact_title_not_in_context(pretty, head, tmp_path):
    records = [dict(ex) for ex in head[:2]]
    records[0]["supporting_facts"] = [["Scott Derrickson", 0], ["Ed Wood (director)", 0]]
    path = tmp_path / "title.json"
    s = pretty(path, records)
    assert problems_of(path) == [
        f"{path}:{s[0]}: [0].supporting_facts[1]: title 'Ed Wood (director)' is not in the example's context, "
        "expected one of its paragraph titles"
    ]


def test_supporting_fact_sentence_out_of_range(pretty, head, tmp_path):
    records = [dict(ex) for ex in head[:2]]
    n = len(dict(records[1]["context"])["Shirley Temple"])
    records[1]["supporting_facts"] = [["Shirley Temple", n], ["Shirley Temple", -1]]
    path = tmp_path / "range.json"
    s = pretty(path, records)
    assert problems_of(path) == [
        f"{path}:{s[1]}: [1].supporting_facts[0]: sentence {n} of 'Shirley Temple' does not exist, expected 0..{n - 1}",
        f"{path}:{s[1]}: [1].supporting_facts[1]: sentence -1 of 'Shirley Temple' does not exist, expected 0..{n - 1}",
    ]


def test_all_problems_of_a_file_are_reported_together(pretty, head, tmp_path):
    records = [dict(ex) for ex in head[:5]]
    del records[1]["question"]
    records[3]["supporting_facts"] = "x"
    records[4]["_id"] = records[0]["_id"]
    path = tmp_path / "many.json"
    s = pretty(path, records)
    assert problems_of(path) == [
        f"{path}:{s[1]}: [1].question: missing, expected the question string",
        f"{path}:{s[3]}: [3].supporting_facts: missing or not a list, expected [[title, sentence_index], ...]",
        f"{path}:{s[4]}: [4]._id: duplicate id '5a8b57f25542995d1e6f1371' (first used at line {s[0]}), expected unique "
        "ids",
    ]


def test_empty_input_file(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text("", encoding="utf-8")
    assert problems_of(path) == [f"{path}: file: empty file, expected a JSON list of records or JSON lines"]
    path.write_text("[]\n", encoding="utf-8")
    assert problems_of(path) == [f"{path}: file: no examples, expected at least one record"]


def test_invalid_split(head_file):
    assert problems_of(head_file, split="test") == ["--split 'test': expected one of train, dev"]


def test_nothing_written_on_error_through_cli(pretty, head, tmp_path):
    records = [dict(ex) for ex in head[:3]]
    del records[1]["question"]
    path = tmp_path / "bad.json"
    s = pretty(path, records)
    out = tmp_path / "runs" / "out"
    out.parent.mkdir()
    result = CliRunner().invoke(
        app, ["data", "prepare-hotpot", "--input", str(path), "--split", "dev", "--out", str(out)]
    )
    assert result.exit_code == 2
    assert result.stderr == f"error: {path}:{s[1]}: [1].question: missing, expected the question string\n"
    assert result.stdout == ""
    assert not out.exists()
    assert list(out.parent.iterdir()) == []

    result = CliRunner().invoke(
        app, ["data", "prepare-hotpot", "--input", str(path), "--out", str(out), "--split", "val"]
    )
    assert (result.exit_code, result.stderr) == (2, "error: --split 'val': expected one of train, dev\n")
    assert list(out.parent.iterdir()) == []

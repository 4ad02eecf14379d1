"""MuSiQue-Ans conversion on the shipped real samples: paragraph documents, answers with
aliases, paragraph-level supporting facts, type from the id, decomposition, broken records."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from tests.support.hf_layout import as_parallel_lists, prepared_differences, write_json_lines, write_parquet

from memsearch.data.dataset import save_dataset
from memsearch.data.musique import convert_musique
from memsearch.errors import InputError
from memsearch.io import iter_jsonl

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT / "data" / "samples" / "musique" / "musique_ans_dev_sample.json"
TRAIN = ROOT / "data" / "samples" / "musique" / "musique_ans_train_sample.json"
N = 13  # examples 9 and 12 share the paragraph "World Series"


@pytest.fixture(scope="module")
def dev() -> list[dict]:
    return json.loads(DEV.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def converted(dev, tmp_path_factory):
    path = tmp_path_factory.mktemp("musique") / "dev13.json"
    path.write_text(json.dumps(dev[:N]), encoding="utf-8")
    return convert_musique(path, split="dev")


def problems_of(path: Path, **kwargs) -> list[str]:
    with pytest.raises(InputError) as info:
        convert_musique(path, **kwargs)
    return str(info.value).split("\n")


def test_one_document_per_paragraph_with_one_sentence(dev, converted):
    docs = converted.documents_by_id()
    distinct = {(p["title"], p["paragraph_text"]) for ex in dev[:N] for p in ex["paragraphs"]}
    assert len(converted.documents) == len(distinct)
    assert [d.doc_id for d in converted.documents] == [f"d{i}" for i in range(len(distinct))]
    for ex, task in zip(dev[:N], converted.tasks):
        assert task.id == ex["id"] and task.question == ex["question"]
        assert len(task.doc_ids) == len(ex["paragraphs"]) == 20
        for doc_id, para in zip(task.doc_ids, ex["paragraphs"]):
            assert docs[doc_id].title == para["title"]
            assert docs[doc_id].sentences == [para["paragraph_text"]]
    assert converted.tasks[0].doc_ids == [f"d{i}" for i in range(20)]
    assert docs["d1"].title == "My Fair Lady (film)"


def test_paragraph_shared_by_examples_gets_one_id(dev, converted):
    a, b = dev[9]["paragraphs"][12], dev[12]["paragraphs"][2]
    assert (a["title"], a["paragraph_text"]) == (b["title"], b["paragraph_text"]) and a["title"] == "World Series"
    doc_id = converted.tasks[9].doc_ids[12]
    assert converted.tasks[12].doc_ids[2] == doc_id
    assert (
        sum(1 for d in converted.documents if d.title == "World Series" and d.sentences == [a["paragraph_text"]]) == 1
    )
    # the shared paragraph keeps the id of its first appearance; later new paragraphs continue the count
    assert converted.tasks[12].doc_ids[:2] == ["d240", "d241"] and converted.tasks[12].doc_ids[3] == "d242"


def test_answers_and_supporting_facts_of_a_known_example(converted):
    label, task = converted.labels[0], converted.tasks[0]
    assert label.id == "2hop__82713_84616"
    assert label.answers == [
        "for Best Performance by a Leading Actress in a Play in Ondine",
        "leading role",
        "star",
        "leading actress",
        "lead",
    ]
    assert label.supporting_facts == [f"{task.doc_ids[1]}:0", f"{task.doc_ids[12]}:0"] == ["d1:0", "d12:0"]
    assert label.gold_doc_ids == ["d1", "d12"]
    assert label.type == "2hop"
    assert label.level is None and label.gold_positions is None
    assert label.decomposition == [
        {"question": "who was the actress in my fair lady", "answer": "Audrey Hepburn"},
        {
            "question": "what did #1 won a tony for",
            "answer": "for Best Performance by a Leading Actress in a Play in Ondine",
        },
    ]


def test_all_labels_follow_the_source(dev, converted):
    for ex, task, label in zip(dev[:N], converted.tasks, converted.labels):
        support = [task.doc_ids[j] for j, p in enumerate(ex["paragraphs"]) if p["is_supporting"]]
        assert label.gold_doc_ids == support
        assert label.supporting_facts == [f"{d}:0" for d in support]
        assert label.answers == list(dict.fromkeys([ex["answer"], *ex["answer_aliases"]]))
        assert label.type == ex["id"].split("__")[0]
        assert label.decomposition == [
            {"question": s["question"], "answer": s["answer"]} for s in ex["question_decomposition"]
        ]
    assert [lab.type for lab in converted.labels[:8]] == [
        "2hop",
        "2hop",
        "2hop",
        "3hop1",
        "2hop",
        "2hop",
        "3hop1",
        "3hop2",
    ]


def test_answers_deduplicated_and_type_without_prefix(dev, tmp_path):
    ex = dict(dev[6])  # answer 'Rialto Bridge', alias 'Ponte di Rialto'
    ex["answer_aliases"] = ["Ponte di Rialto", "Rialto Bridge", "Ponte di Rialto", "Rialto"]
    plain = dict(dev[0], id="custom-id-without-prefix")
    del plain["question_decomposition"]
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(ex) + "\n" + json.dumps(plain) + "\n", encoding="utf-8")
    ds = convert_musique(path)
    assert ds.labels[0].answers == ["Rialto Bridge", "Ponte di Rialto", "Rialto"]
    assert ds.labels[0].type == "3hop1"
    assert ds.labels[1].type is None and ds.labels[1].decomposition is None
    out = save_dataset(ds, tmp_path / "out")
    rows = [obj for _, obj in iter_jsonl(out / "labels.jsonl")]
    assert "type" not in rows[1] and "decomposition" not in rows[1]
    assert rows[0]["decomposition"][0] == {"question": "Gloria in D Major >> composer", "answer": "Antonio Vivaldi"}


def test_tasks_carry_no_label_fields(converted, tmp_path):
    out = save_dataset(converted, tmp_path / "out")
    assert all(list(obj) == ["id", "question", "doc_ids"] for _, obj in iter_jsonl(out / "tasks.jsonl"))
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["kind"], manifest["split"], manifest["evidence_granularity"], manifest["converter"]) == (
        "musique",
        "dev",
        "paragraph",
        "musique-1",
    )
    assert manifest["source"] == {"name": "dev13.json", "sha256": manifest["source"]["sha256"]}
    assert manifest["counts"] == {"documents": len(converted.documents), "tasks": N, "labels": N}


def test_real_train_sample_converts_whole(tmp_path):
    ds = convert_musique(TRAIN, split="train")
    assert len(ds.tasks) == len(ds.labels) == 100
    assert ds.manifest["split"] == "train"
    assert ds.manifest["source"] == {"name": TRAIN.name, "sha256": hashlib.sha256(TRAIN.read_bytes()).hexdigest()}
    assert len({t.id for t in ds.tasks}) == 100
    assert all(lab.supporting_facts and lab.gold_doc_ids for lab in ds.labels)


@pytest.fixture(scope="module")
def saved(converted, tmp_path_factory) -> Path:
    return save_dataset(converted, tmp_path_factory.mktemp("musique-saved") / "out")


def _parallel(ex: dict) -> dict:
    """``ex`` with its lists of objects stored as a ``datasets`` ``Sequence`` of a dict stores them."""
    return {**ex, "paragraphs": as_parallel_lists(ex["paragraphs"]),
            "question_decomposition": as_parallel_lists(ex["question_decomposition"])}


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda p, rows: write_parquet(p / "validation-00000-of-00001.parquet", rows), id="parquet"),
        pytest.param(lambda p, rows: write_parquet(p / "blob", rows, row_group_size=4), id="parquet-no-extension"),
        pytest.param(lambda p, rows: write_json_lines(p / "dev.jsonl", rows), id="json-lines"),
        pytest.param(lambda p, rows: write_parquet(p / "seq.parquet", [_parallel(r) for r in rows]),
                     id="parquet-parallel-lists"),
        pytest.param(lambda p, rows: write_json_lines(p / "seq.jsonl", [_parallel(r) for r in rows]),
                     id="json-lines-parallel-lists"),
    ],
)
def test_hugging_face_layouts_give_identical_outputs(dev, saved, tmp_path, write):
    """MuSiQue as its Hub exports store it (parquet: lists of arrow structs; JSON lines; either with
    the parallel lists of a ``Sequence`` of a dict) prepares the very same data as the original."""
    src = write(tmp_path, dev[:N])
    out = save_dataset(convert_musique(src, split="dev"), tmp_path / "out")
    assert prepared_differences(out, saved) == []


def test_malformed_hugging_face_parquet_names_file_row_and_field(dev, tmp_path):
    rows = [_parallel(ex) for ex in dev[:4]]
    rows[1]["paragraphs"]["title"] = rows[1]["paragraphs"]["title"][:-1]
    rows[2]["paragraphs"]["is_supporting"] = [None] + rows[2]["paragraphs"]["is_supporting"][1:]
    rows[3]["question_decomposition"]["answer"] = []
    src = write_parquet(tmp_path / "hf.parquet", rows)
    n = len(rows[3]["question_decomposition"]["question"])
    assert problems_of(src) == [
        f"{src}: [row 1].paragraphs: parallel lists of different lengths (idx: 20, title: 19, paragraph_text: 20, "
        "is_supporting: 20), expected one entry per item in each",
        f"{src}: [row 2].paragraphs[0].is_supporting: got NoneType None, expected true or false",
        f"{src}: [row 3].question_decomposition: parallel lists of different lengths (id: {n}, question: {n}, "
        f"answer: 0, paragraph_support_idx: {n}), expected one entry per item in each",
    ]
    rows = [dict(ex) for ex in dev[:2]]
    rows[1]["paragraphs"] = [dict(p) for p in rows[1]["paragraphs"]]
    rows[1]["paragraphs"][3]["paragraph_text"] = None
    src = write_parquet(tmp_path / "hf2.parquet", rows)
    assert problems_of(src) == [
        f"{src}: [row 1].paragraphs[3].paragraph_text: got NoneType None, expected a string"]


def test_limit(dev, converted):
    ds = convert_musique(DEV, limit=5)
    assert ds.tasks == converted.tasks[:5] and ds.labels == converted.labels[:5]


@pytest.mark.parametrize("value, shown", [("yes", "got str 'yes'"), (1, "got int 1"), (None, "got NoneType None")])
def test_is_supporting_not_bool(pretty, dev, tmp_path, value, shown):
    records = [dict(ex) for ex in dev[:3]]
    records[1]["paragraphs"] = [dict(p) for p in records[1]["paragraphs"]]
    records[1]["paragraphs"][2]["is_supporting"] = value
    path = tmp_path / "bad.json"
    s = pretty(path, records)
    assert problems_of(path) == [f"{path}:{s[1]}: [1].paragraphs[2].is_supporting: {shown}, expected true or false"]


def test_other_broken_records(pretty, dev, tmp_path):
    records = [dict(ex) for ex in dev[:5]]
    del records[0]["answer"]
    records[1]["answer_aliases"] = "lead"
    records[2]["paragraphs"] = []
    records[4]["paragraphs"] = [dict(p) for p in records[4]["paragraphs"]]
    del records[4]["paragraphs"][0]["title"]
    records[4]["question_decomposition"] = [{"question": "q"}]
    path = tmp_path / "bad.json"
    s = pretty(path, records)
    assert problems_of(path) == [
        f"{path}:{s[0]}: [0].answer: missing, expected the answer string",
        f"{path}:{s[1]}: [1].answer_aliases: got 'lead', expected a list of alias strings",
        f"{path}:{s[2]}: [2].paragraphs: empty, expected at least one paragraph",
        f"{path}:{s[4]}: [4].paragraphs[0].title: missing, expected a string",
        f"{path}:{s[4]}: [4].question_decomposition[0].answer: missing, expected a string",
    ]
    records[0]["answer"] = "x"
    records[0]["id"] = records[3]["id"] = "shared"
    s = pretty(path, records)
    assert problems_of(path)[0] == f"{path}:{s[1]}: [1].answer_aliases: got 'lead', expected a list of alias strings"
    assert (
        f"{path}:{s[3]}: [3].id: duplicate id 'shared' (first used at line {s[0]}), expected unique ids"
        in problems_of(path)
    )


def test_invalid_split_and_empty_file(tmp_path):
    path = tmp_path / "e.json"
    path.write_text("\n", encoding="utf-8")
    assert problems_of(path) == [f"{path}: file: empty file, expected a JSON list of records or JSON lines"]
    assert problems_of(DEV, split="validation") == ["--split 'validation': expected one of train, dev"]

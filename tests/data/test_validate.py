"""validate-data on prepared folders made from the shipped real samples, and on corrupted
copies of them: each corruption gives exactly the expected ``file:line: field: message``."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from memsearch.data.dataset import save_dataset
from memsearch.data.hotpot import convert_hotpot
from memsearch.data.musique import convert_musique
from memsearch.data.ruler import prepare_ruler
from memsearch.data.validate import check_overlap, normalize_question, validate_data
from memsearch.io import sha256_file, write_json

ROOT = Path(__file__).resolve().parents[2]
HOTPOT_DEV = ROOT / "data" / "samples" / "hotpotqa" / "dev_distractor_sample.json"
HOTPOT_TRAIN = ROOT / "data" / "samples" / "hotpotqa" / "train_sample.json"
MUSIQUE_DEV = ROOT / "data" / "samples" / "musique" / "musique_ans_dev_sample.json"
LEAK = "label field in a task, expected tasks to carry only id, question and doc_ids (labels belong in labels.jsonl)"
ID0 = "5a8b57f25542995d1e6f1371"  # first dev example; its gold documents are d1 and d4


@pytest.fixture(scope="module")
def raw_dev() -> list[dict]:
    return json.loads(HOTPOT_DEV.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> Path:
    """20 real dev examples: 20 tasks, 199 documents."""
    return save_dataset(convert_hotpot(HOTPOT_DEV, split="dev", limit=20), tmp_path_factory.mktemp("valid") / "dev")


@pytest.fixture
def bad(valid, tmp_path) -> Path:
    return Path(shutil.copytree(valid, tmp_path / "bad"))


def edit(path: Path, change: Callable[[list[str]], list[str]]) -> None:
    text = path.read_text(encoding="utf-8")
    path.write_text("".join(line + "\n" for line in change(text.splitlines())), encoding="utf-8")


def edit_record(path: Path, line: int, change: Callable[[dict], None]) -> None:
    def apply(lines: list[str]) -> list[str]:
        obj = json.loads(lines[line - 1])
        change(obj)
        lines[line - 1] = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        return lines

    edit(path, apply)


def reseal(folder: Path) -> None:
    """Make the manifest agree with edited files again, so only the edit itself is reported."""
    manifest = json.loads((folder / "manifest.json").read_text())
    for key, name in (("documents", "corpus.jsonl"), ("tasks", "tasks.jsonl"), ("labels", "labels.jsonl")):
        manifest["files"][name] = sha256_file(folder / name)
        manifest["counts"][key] = sum(1 for line in (folder / name).read_text().splitlines() if line.strip())
    write_json(folder / "manifest.json", manifest)


def problems(folder: Path, against: Path | None = None) -> list[str]:
    return [str(p) for p in validate_data(folder, against)]


# --------------------------------------------------------------------------- valid folders


def test_real_prepared_folder_is_valid(valid):
    assert problems(valid) == []


def test_reseal_of_an_unchanged_copy_is_a_no_op(bad, valid):
    reseal(bad)
    assert (bad / "manifest.json").read_bytes() == (valid / "manifest.json").read_bytes()


def test_musique_folder_is_valid(tmp_path):
    folder = save_dataset(convert_musique(MUSIQUE_DEV, split="dev", limit=30), tmp_path / "mq")
    assert problems(folder) == []


def test_ruler_folder_is_valid_and_gold_positions_are_checked(valid, tmp_path):
    prepare_ruler(valid, tmp_path / "ruler", [30], seed=1, tokenizer=None, show_progress=False)
    folder = tmp_path / "ruler" / "docs30"
    assert problems(folder) == []
    labels = folder / "labels.jsonl"
    first = json.loads(labels.read_text().splitlines()[0])
    right = first["gold_positions"]
    edit_record(labels, 1, lambda o: o.update(gold_positions=right[::-1]))
    reseal(folder)
    assert problems(folder) == [
        f"{labels}:1: gold_positions: got {right[::-1]}, expected {right} "
        "(1-based positions of gold_doc_ids in the task's documents)"
    ]


# --------------------------------------------------------------------------- label leakage


def test_answer_smuggled_into_a_task(bad):
    tasks = bad / "tasks.jsonl"
    edit_record(tasks, 3, lambda o: o.update(answer="Animorphs"))
    reseal(bad)
    assert problems(bad) == [f"{tasks}:3: answer: {LEAK}"]


def test_supporting_facts_and_answers_in_a_task(bad):
    tasks = bad / "tasks.jsonl"
    edit_record(tasks, 1, lambda o: o.update(supporting_facts=["d1:0"], answers=["yes"]))
    reseal(bad)
    assert problems(bad) == [f"{tasks}:1: answers: {LEAK}", f"{tasks}:1: supporting_facts: {LEAK}"]


def test_unknown_field_in_a_task(bad):
    tasks = bad / "tasks.jsonl"
    edit_record(tasks, 2, lambda o: o.update(hint="x"))
    reseal(bad)
    assert problems(bad) == [
        f"{tasks}:2: hint: unexpected field, not part of the schema",
        f"{bad / 'labels.jsonl'}:2: id: '5a8c7595554299585d9e36b6' has no task, expected a label per task id",
    ]


# --------------------------------------------------------------------------- ids and references


def test_duplicate_task_id(bad):
    tasks = bad / "tasks.jsonl"
    edit(tasks, lambda lines: lines + [lines[0]])
    reseal(bad)
    assert problems(bad) == [f"{tasks}:21: id: duplicate '{ID0}' (first at line 1), expected unique values"]


def test_duplicate_doc_id_and_duplicate_paragraph(bad):
    corpus = bad / "corpus.jsonl"
    edit(corpus, lambda lines: lines + [lines[0]])
    reseal(bad)
    assert problems(bad) == [
        f"{corpus}:200: doc_id: duplicate 'd0' (first at line 1), expected unique values",
        f"{corpus}:200: doc_id: 'd0' repeats the paragraph at line 1, expected one copy of each distinct paragraph",
    ]


def test_duplicate_doc_id_with_other_text(bad):
    corpus = bad / "corpus.jsonl"
    edit(corpus, lambda lines: lines + [json.dumps({"doc_id": "d5", "title": "Other", "sentences": ["Other text."]})])
    reseal(bad)
    assert problems(bad) == [f"{corpus}:200: doc_id: duplicate 'd5' (first at line 6), expected unique values"]


def test_dangling_and_repeated_doc_references(bad):
    tasks = bad / "tasks.jsonl"

    def change(o):
        o["doc_ids"][0] = "d9999"  # d0 is not gold
        o["doc_ids"][2] = "d3"

    edit_record(tasks, 1, change)
    reseal(bad)
    assert problems(bad) == [
        f"{tasks}:1: doc_ids[0]: 'd9999' is not in corpus.jsonl, expected an existing doc_id",
        f"{tasks}:1: doc_ids: 'd3' listed 2 times, expected each document once",
    ]


def test_empty_doc_ids(bad):
    tasks = bad / "tasks.jsonl"
    edit_record(tasks, 2, lambda o: o.update(doc_ids=[]))
    reseal(bad)
    labels = bad / "labels.jsonl"
    assert problems(bad) == [
        f"{tasks}:2: doc_ids: empty, expected at least one document",
        f"{labels}:2: supporting_facts[0]: 'd16:0' is not in the task's documents, expected support among them",
        f"{labels}:2: supporting_facts[1]: 'd11:0' is not in the task's documents, expected support among them",
        f"{labels}:2: supporting_facts[2]: 'd11:1' is not in the task's documents, expected support among them",
        f"{labels}:2: gold_doc_ids[0]: 'd16' is not in the task's documents, expected one of them",
        f"{labels}:2: gold_doc_ids[1]: 'd11' is not in the task's documents, expected one of them",
    ]


# --------------------------------------------------------------------------- supporting facts


def test_supporting_facts_pointing_nowhere(bad):
    labels = bad / "labels.jsonl"
    facts = ["d1:3", "d1:99", "d999:0", "d1", "d1:-1", ":0", "d20:0", "d4:0"]
    edit_record(labels, 1, lambda o: o.update(supporting_facts=facts))
    reseal(bad)
    assert problems(bad) == [
        f"{labels}:1: supporting_facts[0]: 'd1:3' points at sentence 3 but d1 has 3, expected an existing sentence",
        f"{labels}:1: supporting_facts[1]: 'd1:99' points at sentence 99 but d1 has 3, expected an existing sentence",
        f"{labels}:1: supporting_facts[2]: 'd999:0' points at unknown document 'd999', expected a doc_id of "
        "corpus.jsonl",
        f"{labels}:1: supporting_facts[3]: 'd1' is malformed, expected 'doc_id:sentence_index'",
        f"{labels}:1: supporting_facts[4]: 'd1:-1' is malformed, expected 'doc_id:sentence_index'",
        f"{labels}:1: supporting_facts[5]: ':0' is malformed, expected 'doc_id:sentence_index'",
        f"{labels}:1: supporting_facts[6]: 'd20:0' is not in the task's documents, expected support among them",
    ]


def test_gold_doc_outside_the_task(bad):
    labels = bad / "labels.jsonl"
    edit_record(labels, 1, lambda o: o.update(gold_doc_ids=["d1", "d20"]))
    reseal(bad)
    assert problems(bad) == [f"{labels}:1: gold_doc_ids[1]: 'd20' is not in the task's documents, expected one of them"]


def test_label_schema_problems(bad):
    labels = bad / "labels.jsonl"
    edit_record(labels, 4, lambda o: o.update(answers=[]))
    edit_record(labels, 5, lambda o: o.pop("supporting_facts"))
    reseal(bad)
    assert problems(bad) == [
        f"{labels}:4: answers: List should have at least 1 item after validation, not 0 (got [])",
        f"{labels}:5: supporting_facts: missing, expected this field",
        # the label that failed its schema is not read, so its task has no label
        f"{bad / 'tasks.jsonl'}:4: id: '5a8e3ea95542995a26add48d' has no label, expected a label per task id",
        f"{bad / 'tasks.jsonl'}:5: id: '5abd94525542992ac4f382d2' has no label, expected a label per task id",
    ]


def test_schema_failure_gives_no_false_count_problem(bad):
    labels = bad / "labels.jsonl"
    edit_record(labels, 4, lambda o: o.update(answers=[]))
    reseal(bad)  # the manifest counts 20 labels, and the file has 20 lines
    assert problems(bad) == [
        f"{labels}:4: answers: List should have at least 1 item after validation, not 0 (got [])",
        f"{bad / 'tasks.jsonl'}:4: id: '5a8e3ea95542995a26add48d' has no label, expected a label per task id",
    ]


# --------------------------------------------------------------------------- tasks vs labels


def test_label_without_task(bad):
    tasks = bad / "tasks.jsonl"
    edit(tasks, lambda lines: lines[:4] + lines[5:])
    reseal(bad)
    assert problems(bad) == [
        f"{bad / 'labels.jsonl'}:5: id: '5abd94525542992ac4f382d2' has no task, expected a label per task id"
    ]


def test_task_without_label(bad):
    labels = bad / "labels.jsonl"
    edit(labels, lambda lines: lines[:4] + lines[5:])
    reseal(bad)
    assert problems(bad) == [
        f"{bad / 'tasks.jsonl'}:5: id: '5abd94525542992ac4f382d2' has no label, expected a label per task id"
    ]


# --------------------------------------------------------------------------- files and manifest


def test_truncated_json_line_in_corpus(bad, valid):
    corpus, manifest = bad / "corpus.jsonl", bad / "manifest.json"
    text = corpus.read_text(encoding="utf-8")
    last = text.splitlines()[-1]
    assert json.loads(last)["doc_id"] == "d198"  # '2014 Bahrain Grand Prix', not gold for its task
    cut = last[: last.index(',"sentences"')]
    corpus.write_text(text[: text.rindex(last)] + cut, encoding="utf-8")  # no final newline: cut short
    old = json.loads(manifest.read_text())["files"]["corpus.jsonl"]
    assert problems(bad) == [
        f"{corpus}:199: json: invalid JSON (Expecting ',' delimiter, column {len(cut) + 1}), expected one JSON object "
        "per line",
        f"{bad / 'tasks.jsonl'}:20: doc_ids[9]: 'd198' is not in corpus.jsonl, expected an existing doc_id",
        f"{manifest}: files.corpus.jsonl: SHA-256 {old!r} does not match the file ({sha256_file(corpus)}), "
        "expected the hash of the file as written",
        f"{manifest}: counts.documents: records 199, but the file has 198",
    ]


def test_edited_file_does_not_match_manifest_hash(bad):
    tasks, manifest = bad / "tasks.jsonl", bad / "manifest.json"
    old = json.loads(manifest.read_text())["files"]["tasks.jsonl"]
    edit_record(tasks, 2, lambda o: o.update(question=o["question"] + " (edited)"))
    assert problems(bad) == [
        f"{manifest}: files.tasks.jsonl: SHA-256 {old!r} does not match the file ({sha256_file(tasks)}), "
        "expected the hash of the file as written"
    ]


def test_manifest_format_split_and_counts(bad):
    manifest = bad / "manifest.json"
    data = json.loads(manifest.read_text())
    data.update(format="memsearch-data/0", split="test")
    data["counts"]["tasks"] = 21
    write_json(manifest, data)
    assert problems(bad) == [
        f"{manifest}: format: got 'memsearch-data/0', expected 'memsearch-data/1'",
        f"{manifest}: split: got 'test', expected 'train' or 'dev'",
        f"{manifest}: counts.tasks: records 21, but the file has 20",
    ]


def test_missing_labels_file(bad):
    (bad / "labels.jsonl").unlink()
    tasks = bad / "tasks.jsonl"
    ids = [json.loads(line)["id"] for line in tasks.read_text().splitlines()]
    assert problems(bad) == (
        [f"{bad / 'labels.jsonl'}: file: missing, expected this file in a prepared data folder"]
        + [f"{tasks}:{i}: id: {tid!r} has no label, expected a label per task id" for i, tid in enumerate(ids, start=1)]
        + [f"{bad / 'manifest.json'}: counts.labels: records 20, but the file has 0"]
    )


def test_missing_manifest_and_missing_folder(bad, tmp_path):
    (bad / "manifest.json").unlink()
    assert problems(bad) == [
        f"{bad / 'manifest.json'}: file: no such file; expected a folder written by `memsearch prepare-*`"
    ]
    assert problems(tmp_path / "nope") == [
        f"{tmp_path / 'nope'}: folder: no such folder, expected a folder written by `memsearch prepare-*`"
    ]


def test_empty_tasks_file(bad):
    (bad / "tasks.jsonl").write_text("\n")
    reseal(bad)
    labels = bad / "labels.jsonl"
    assert problems(bad)[0] == f"{bad / 'tasks.jsonl'}: file: no records, expected at least one"
    assert problems(bad)[1:] == [
        f"{labels}:{i}: id: {json.loads(line)['id']!r} has no task, expected a label per task id"
        for i, line in enumerate(labels.read_text().splitlines(), start=1)
    ]


# --------------------------------------------------------------------------- split overlap


def test_normalize_question():
    assert normalize_question('  Who\'s THE   director, of "Big Stone Gap"?! ') == "who s the director of big stone gap"


def test_overlap_finds_shared_id_and_shared_question(valid, raw_dev, tmp_path):
    train_records = json.loads(HOTPOT_TRAIN.read_text(encoding="utf-8"))[:5]
    same = dict(raw_dev[3])  # same id, same question
    reworded = dict(raw_dev[5], _id="train-only-id")
    reworded["question"] = "  " + raw_dev[5]["question"].upper().replace("?", " ?!").replace(" ", "  ") + "."
    assert normalize_question(reworded["question"]) == normalize_question(raw_dev[5]["question"])
    src = tmp_path / "train.json"
    src.write_text(json.dumps(train_records + [same, reworded]), encoding="utf-8")
    train = save_dataset(convert_hotpot(src, split="train"), tmp_path / "train")
    dev_tasks, train_tasks = valid / "tasks.jsonl", train / "tasks.jsonl"
    expected = [
        f"{dev_tasks}:4: id: '5a8e3ea95542995a26add48d' also in {train_tasks}:6, expected no id shared between splits",
        f"{dev_tasks}:4: question: also in {train_tasks}:6, expected no question shared between splits",
        f"{dev_tasks}:6: question: also in {train_tasks}:7, expected no question shared between splits",
    ]
    assert [str(p) for p in check_overlap(valid, train)] == expected
    assert problems(valid, against=train) == expected
    assert problems(train) == []


def test_overlap_against_folder_without_tasks(valid, tmp_path):
    assert [str(p) for p in check_overlap(valid, tmp_path)] == [
        f"{tmp_path / 'tasks.jsonl'}: file: missing, expected the tasks of the folder given with --against"
    ]


def test_real_samples_validate_and_do_not_overlap(tmp_path):
    """The whole shipped samples: 1000 dev and 100 train HotpotQA examples."""
    dev = save_dataset(convert_hotpot(HOTPOT_DEV, split="dev"), tmp_path / "dev")
    train = save_dataset(convert_hotpot(HOTPOT_TRAIN, split="train"), tmp_path / "train")
    assert json.loads((dev / "manifest.json").read_text())["counts"] == {
        "documents": 9820,
        "tasks": 1000,
        "labels": 1000,
    }
    assert problems(dev) == []
    assert problems(train) == []
    assert check_overlap(dev, train) == []
    assert check_overlap(train, dev) == []


# --------------------------------------------------------------------------- invisible text (issue 11 item 11)


def test_a_question_of_only_invisible_characters_is_refused(bad):
    tasks = bad / "tasks.jsonl"
    edit_record(tasks, 2, lambda o: o.update(question="\u200b"))
    reseal(bad)
    # (The refused task's label then has no task: reported too.)
    assert problems(bad)[0] == (
        f"{tasks}:2: question: Value error, no visible text (only white space or "
        "zero-width characters), expected the question (got '\\u200b')"
    )


def test_a_document_of_blank_sentences_is_refused_but_one_blank_sentence_is_kept(bad):
    corpus = bad / "corpus.jsonl"
    edit_record(corpus, 5, lambda o: o.update(sentences=["", " \u200b"]))
    edit_record(corpus, 6, lambda o: o.update(sentences=[*o["sentences"], ""]))
    reseal(bad)
    found = problems(bad)
    # (Tasks that list the refused document are reported too; the document with one blank sentence is not.)
    assert found[0] == (
        f"{corpus}:5: sentences: Value error, every sentence is blank, expected at least one with "
        "visible text (got ['', ' \\u200b'])"
    )
    assert not any(f"{corpus}:6" in p for p in found)


def test_a_supporting_fact_on_a_blank_sentence_is_refused(bad):
    corpus, labels = bad / "corpus.jsonl", bad / "labels.jsonl"
    first_label = json.loads(labels.read_text().splitlines()[0])
    doc_id, sent = first_label["supporting_facts"][0].split(":")
    line = next(i for i, raw in enumerate(corpus.read_text().splitlines(), 1) if json.loads(raw)["doc_id"] == doc_id)
    edit_record(corpus, line, lambda o: o["sentences"].__setitem__(int(sent), " "))
    reseal(bad)
    assert problems(bad) == [
        f"{labels}:1: supporting_facts[0]: '{doc_id}:{sent}' points at a blank sentence, expected a sentence with text"
    ]

"""Adding a dataset converter: one record converter, one ``register_converter`` call. The shared
loop (``data.convert``) then checks, converts and writes a data folder that validates and runs.

The format here, "TinyQA", is a small JSON-lines layout: ``{"qid", "q", "a", "paragraphs":
[{"title", "sentences"}], "gold": [[title, sentence index]]}``. Its records are made from the
shipped HotpotQA dev sample, so the same questions converted by the HotpotQA converter must give
the same documents, the same tasks and, through the real engine and scorer, the same numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.assets.samples import HOTPOT_DEV, samples_dir
from memsearch.config import load_config
from memsearch.data.convert import SourceConverter, SourceFormat
from memsearch.data.converters import converter_names, register_converter, source_converter, unregister_converter
from memsearch.data.dataset import DocumentPool, load_dataset
from memsearch.data.records import Label, Task, evidence_id
from memsearch.data.source import SourceRecord, check_unique_id
from memsearch.data.validate import validate_data
from memsearch.errors import InputError
from memsearch.eval.runner import run_eval

RULES = Path(__file__).resolve().parents[2] / "configs" / "rules.toml"
QUESTIONS = 8


def tinyqa_record(record: SourceRecord, pool: DocumentPool, seen: dict[str, int]) -> tuple[Task, Label] | None:
    """One TinyQA record -> task and label; ``None`` after recording what is wrong with it."""
    qid = record.get("qid", str, "the question id (a string)")
    question = record.get("q", str, "the question (a string)")
    answer = record.get("a", str, "the gold answer (a string)")
    paragraphs = record.get("paragraphs", list, "a list of {title, sentences}")
    gold = record.get("gold", list, "a list of [title, sentence index]")
    if None in (qid, question, answer, paragraphs, gold) or not check_unique_id(record, "qid", qid, seen):
        return None
    doc_of: dict[str, str] = {}
    doc_ids = []
    for paragraph in paragraphs:
        doc_ids.append(pool.add(paragraph["title"], paragraph["sentences"]))
        doc_of.setdefault(paragraph["title"], doc_ids[-1])
    support = []
    for i, (title, sentence) in enumerate(gold):
        if title not in doc_of:
            record.problem(f"gold[{i}]", f"title {title!r} names no paragraph, expected one of the paragraphs' titles")
            return None
        support.append(evidence_id(doc_of[title], sentence))
    task = Task(id=qid, question=question, doc_ids=list(dict.fromkeys(doc_ids)))
    label = Label(id=qid, answers=[answer], supporting_facts=list(dict.fromkeys(support)),
                  gold_doc_ids=list(dict.fromkeys(doc_of[title] for title, _ in gold)))
    return task, label


TINYQA = SourceConverter("tinyqa", SourceFormat("tinyqa", "sentence", "tinyqa-1"),
                         "TinyQA: JSON lines of {qid, q, a, paragraphs, gold}", tinyqa_record)


@pytest.fixture
def tinyqa():
    register_converter(TINYQA)
    yield TINYQA
    unregister_converter("tinyqa")


def _tinyqa_file(path: Path, n: int = QUESTIONS) -> Path:
    """The first ``n`` shipped HotpotQA dev questions, written as TinyQA."""
    records = json.loads((samples_dir() / HOTPOT_DEV).read_text(encoding="utf-8"))[:n]
    lines = [json.dumps({"qid": r["_id"], "q": r["question"], "a": r["answer"],
                         "paragraphs": [{"title": t, "sentences": s} for t, s in r["context"]],
                         "gold": r["supporting_facts"]}) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_registered_converter_prepares_a_folder_that_validates_and_runs(tinyqa, tmp_path):
    assert converter_names() == ("hotpot", "musique", "tinyqa")
    tiny = source_converter("tinyqa").prepare(_tinyqa_file(tmp_path / "tiny_dev.jsonl"), tmp_path / "tiny", split="dev")
    assert tiny["kind"] == "tinyqa" and tiny["converter"] == "tinyqa-1" and tiny["split"] == "dev"
    assert validate_data(tmp_path / "tiny") == []
    # and the command line has it with no edit: memsearch data prepare --format tinyqa
    from typer.testing import CliRunner

    from memsearch.cli.app import app

    args = ["--input", str(tmp_path / "tiny_dev.jsonl"), "--split", "dev", "--out", str(tmp_path / "cli")]
    result = CliRunner().invoke(app, ["data", "prepare", "--format", "tinyqa", *args])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cli" / "corpus.jsonl").read_bytes() == (tmp_path / "tiny" / "corpus.jsonl").read_bytes()
    hotpot = source_converter("hotpot").prepare(samples_dir() / HOTPOT_DEV, tmp_path / "hotpot", split="dev",
                                                limit=QUESTIONS)
    assert tiny["counts"] == hotpot["counts"] == {"documents": 80, "tasks": QUESTIONS, "labels": QUESTIONS}
    a, b = load_dataset(tmp_path / "tiny"), load_dataset(tmp_path / "hotpot")
    assert a.documents == b.documents and a.tasks == b.tasks
    assert [label.supporting_facts for label in a.labels] == [label.supporting_facts for label in b.labels]
    cfg = load_config(RULES)
    runs = {name: run_eval(cfg, tmp_path / name, tmp_path / f"run-{name}", show_progress=False).metrics
            for name in ("tiny", "hotpot")}
    for metrics in runs.values():
        del metrics["latency_s"]  # wall time, the one number two runs need not share
    assert runs["tiny"] == runs["hotpot"]
    assert runs["tiny"]["em"] == 0.375 and runs["tiny"]["retrieval_support_recall"] == pytest.approx(19 / 24)


def test_its_problems_are_reported_like_a_built_in_converter(tinyqa, tmp_path):
    path = _tinyqa_file(tmp_path / "tiny_dev.jsonl", 3)
    lines = path.read_text(encoding="utf-8").splitlines()
    broken = json.loads(lines[1])
    broken["gold"][0][0] = "No Such Title"
    del broken["a"]
    path.write_text("\n".join([lines[0], json.dumps(broken), lines[2]]) + "\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        source_converter("tinyqa").prepare(path, tmp_path / "tiny", split="dev")
    assert str(info.value) == f"{path}:2: [1].a: missing, expected the gold answer (a string)"
    assert not (tmp_path / "tiny").exists()


def test_an_unknown_converter_is_refused_naming_the_registered_ones():
    assert "tinyqa" not in converter_names()  # the fixture's teardown took it away
    with pytest.raises(InputError, match=r"^unknown dataset converter 'tinyqa'; registered: 'hotpot' or 'musique' "
                                         r"\(hotpot: HotpotQA: .*; musique: MuSiQue-Ans: .*\)$"):
        source_converter("tinyqa")

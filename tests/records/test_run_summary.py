"""``records.run_summary``: an eval run's summary.json read and written through its record, for
summaries of this version and of earlier ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.config import load_config
from memsearch.errors import InputError
from memsearch.eval.runner import run_eval
from memsearch.records.run_summary import MatrixGroup, MemoryBackendIdentity, RunSummary

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "configs" / "rules.toml"

# What summaries written before each field existed lack (the summary keys a record reads as None).
LATER_KEYS = ("caveats", "context_truncated", "served", "memsearch_source", "backend_stats", "data_build", "timing")


@pytest.fixture(scope="module")
def run(hotpot_dev_dir, tmp_path_factory) -> tuple[RunSummary, Path]:
    out = tmp_path_factory.mktemp("summary") / "run"
    return run_eval(load_config(RULES, ["limit=3"]), hotpot_dev_dir, out, show_progress=False), out


def test_the_record_is_the_file_the_run_wrote(run):
    summary, out = run
    written = json.loads((out / "summary.json").read_text())
    assert summary.to_json() == written
    read = RunSummary.read(out / "summary.json")
    assert read == summary and read.to_json() == written
    assert read.tasks.scored == 3 and read.complete and read.usable_for_comparison and read.extra == {}
    assert read.memory_backend.kind == "rules" and read.memory_backend.label == "rules"
    assert read.metrics["f1"] == written["metrics"]["f1"] and read.memory_truncations == 0


def test_an_earlier_summary_reads_and_writes_back_as_it_was(run, tmp_path):
    _, out = run
    earlier = json.loads((out / "summary.json").read_text())
    for key in LATER_KEYS:
        del earlier[key]
    for key in ("retried", "failed_attempts"):
        del earlier["tasks"][key]
    earlier["a_key_of_a_later_version"] = {"kept": True}
    (tmp_path / "summary.json").write_text(json.dumps(earlier))
    read = RunSummary.read(tmp_path / "summary.json")
    assert read.caveats is None and read.timing is None and read.tasks.retried is None
    assert read.extra == {"a_key_of_a_later_version": {"kept": True}}
    assert read.to_json() == earlier


def test_a_summary_that_is_not_one_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "summary.json"
    with pytest.raises(InputError, match=r"summary\.json: missing"):
        RunSummary.read(path)
    for text in ("{not json", json.dumps({"metrics": {}}), json.dumps({"tasks": {"scored": 1}})):
        path.write_text(text)
        with pytest.raises(InputError, match=r"summary\.json: not an eval run summary"):
            RunSummary.read(path)


def test_a_matrix_line_carries_what_the_table_reads(run):
    summary, _ = run
    entry = summary.group_entry()
    assert MatrixGroup.from_json(entry.to_json()) == entry
    assert entry.to_json() == {key: summary.to_json()[key] for key in (
        "agent", "memory_backend", "metrics", "complete", "usable_for_comparison", "request_errors", "note")}


def test_the_memory_backend_label_names_model_server_weights_and_adapter():
    def label(**identity) -> str:
        return MemoryBackendIdentity.from_json(identity).label

    assert label(kind="oracle", model="embedded") == "oracle"
    assert label(kind="hf", model="models/SmolLM2", adapter="runs/a/adapter") == "hf:SmolLM2+adapter"
    assert label(kind="openai", model="policy", base_url="http://127.0.0.1:8001/v1") == "openai:policy@127.0.0.1:8001"
    assert label(kind="hf", model="embedded", weights="q4") == "hf:embedded/q4"


def test_every_published_summary_reads_and_writes_back_as_it_is():
    # The eval summaries under docs/results were written by earlier versions (some lack fields).
    paths = [p for p in sorted((ROOT / "docs" / "results").rglob("*summary.json"))
             if "tasks" in json.loads(p.read_text())]
    assert len(paths) >= 5
    for path in paths:
        assert RunSummary.read(path).to_json() == json.loads(path.read_text()), path

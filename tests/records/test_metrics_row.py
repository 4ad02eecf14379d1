"""``records.metrics_row``: a metrics.jsonl line read and written through its record, for lines of
this version and of earlier engine versions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.config import load_config
from memsearch.errors import InputError
from memsearch.eval.runner import run_eval
from memsearch.io import dumps_line, iter_jsonl
from memsearch.records.metrics_row import MetricsRow, read_metrics

ROOT = Path(__file__).resolve().parents[2]
OLD_RUNS = Path(__file__).resolve().parent / "old_runs"


def test_a_runs_lines_are_the_records_lines(hotpot_dev_dir, tmp_path):
    out = tmp_path / "run"
    summary = run_eval(load_config(ROOT / "configs" / "rules.toml", ["limit=4"]), hotpot_dev_dir, out,
                       show_progress=False)
    text = (out / "metrics.jsonl").read_text().splitlines()
    rows = read_metrics(out / "metrics.jsonl")
    assert [dumps_line(row.to_json()) for row in rows] == text  # byte for byte, key order included
    first = rows[0]
    assert first.ok and first.scores.keys() >= {"em", "f1", "memory_support_recall", "citation_recall"}
    assert first.ops and all(first.column(f"ops_{op}") == n for op, n in first.ops.items())
    assert first.column("f1") == first.scores["f1"] and first.column("searches") == first.searches
    assert first.column("no_such_column") is None and first.extra == {}
    assert sum(row.scores["f1"] for row in rows) / 4 == pytest.approx(summary.metrics["f1"])


@pytest.mark.parametrize("folder", sorted(p.name for p in OLD_RUNS.iterdir() if p.is_dir()))
def test_an_earlier_line_keeps_every_key_it_had(folder):
    lines = [line for _, line in iter_jsonl(OLD_RUNS / folder / "metrics.jsonl.gz")]
    rows = read_metrics(OLD_RUNS / folder / "metrics.jsonl.gz")
    for line, row in zip(lines, rows, strict=True):
        written = row.to_json()
        assert {k: written[k] for k in line} == line, folder
        assert set(written) - set(line) <= {"attempt", "context_truncated_calls", "context_truncated_by_role",
                                            "latency_s", "sub_em_lenient", "boxed_em", "answer_format"}


def test_a_line_that_is_no_metrics_row_is_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"task_id": "t1", "status": "ok", "f1": 1.0}) + "\n" + json.dumps({"f1": 1.0}) + "\n")
    with pytest.raises(InputError, match=r"metrics\.jsonl:2: not a metrics row"):
        read_metrics(path)
    row = MetricsRow.from_json({"task_id": "t1", "f1": 0.5, "a_later_flag": "x", "reader_prompt_tokens": 7})
    assert row.status == "error"  # as eval reads a line without one
    assert (row.scores, row.tokens, row.extra) == ({"f1": 0.5}, {"reader_prompt_tokens": 7}, {"a_later_flag": "x"})

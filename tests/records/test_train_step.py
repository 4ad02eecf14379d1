"""The train-log record (``records.train_step``): every committed log reads, a current line writes
back unchanged (key order included), evaluation fields keep their ``eval_`` names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.records.train_step import TrainStep, read_train_log

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def test_every_committed_train_log_reads():
    logs = sorted(RESULTS.rglob("*train_log.jsonl"))
    assert len(logs) >= 30
    for path in logs:
        steps = read_train_log(path)
        assert steps and all(isinstance(s.step, int) for s in steps)
        for step, line in zip(steps, path.read_text(encoding="utf-8").splitlines(), strict=True):
            data = json.loads(line)
            written = step.to_json()
            # What the line holds reads back as it was; a field newer than the log is null.
            assert {k: v for k, v in written.items() if k in data} == data, path
            assert all(written[k] is None for k in written.keys() - data.keys()), path


def test_a_current_line_writes_back_unchanged_and_evaluations_keep_their_names():
    path = RESULTS / "memory_policy_cpu_v3" / "seed-2" / "grpo1" / "train_log.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    first = TrainStep.from_json(json.loads(lines[0]))
    assert first.step == 0 and not first.trained
    assert first.evaluation["memory_support_recall"] == json.loads(lines[0])["eval_memory_support_recall"]
    assert first.eval_ops == {"ADD": 86, "DELETE": 0, "NOOP": 64, "UPDATE": 0}
    current = dict(json.loads(lines[10]), rows_failed=0, failed_trajectories=0, failed_share=0.0)
    order = list(TrainStep.from_json(current).to_json())
    step = TrainStep.from_json({k: current[k] for k in order if k in current})
    assert json.dumps(step.to_json()) == json.dumps({k: current[k] for k in order if k in current})
    assert step.trained and step.kl == current["kl"] and step.ops == current["ops"]


def test_an_sft_line_keeps_its_fields_and_a_bad_line_is_named(tmp_path):
    sft = {"step": 3, "loss": 0.5, "lr": 1e-4, "tokens_per_s": 120.0}
    assert TrainStep.from_json(sft).to_json() == sft
    path = tmp_path / "train_log.jsonl"
    path.write_text('{"step": 1}\n{"loss": 1}\n')
    with pytest.raises(ValueError, match=r"train_log.jsonl:2: not a train-log line"):
        read_train_log(path)

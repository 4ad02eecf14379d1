"""Adding a metric: one function of the trajectory and the label, one ``register_metric`` call.
Every metrics row then has its column and every summary its mean.

The metric here, ``answer_words``, counts the words of the answer the protocol scores. It is an
answer metric, so a failed task scores 0 on it and stays in the mean, as for em and f1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.config import load_config
from memsearch.data.dataset import load_dataset
from memsearch.eval.metrics import register_metric, registered_metrics, unregister_metric
from memsearch.eval.runner import run_eval
from memsearch.eval.score import answer_keys, protocol_answer, score_trajectory
from memsearch.records.trajectory import Trajectory

RULES = Path(__file__).resolve().parents[2] / "configs" / "rules.toml"


def answer_words(trajectory, label) -> float:
    """Words of the answer the protocol scores (0 for none)."""
    return float(len((protocol_answer(trajectory) or "").split()))


@pytest.fixture
def words():
    register_metric("answer_words", answer_words, answer=True)
    yield "answer_words"
    unregister_metric("answer_words")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_registered_metric_is_a_column_of_every_row_and_a_mean_of_the_summary(words, hotpot_dev_dir, tmp_path):
    assert [m.name for m in registered_metrics()][-2:] == ["citation_recall", "answer_words"]
    assert answer_keys()[-1] == "answer_words"
    summary = run_eval(load_config(RULES, ["limit=10"]), hotpot_dev_dir, tmp_path / "run", show_progress=False)
    rows = _lines(tmp_path / "run" / "metrics.jsonl")
    for row in rows:
        assert row["answer_words"] == len(row["prediction"].split())
        columns = list(row)  # after the metrics registered before it, before the episode's counts
        assert columns[columns.index("citation_recall") + 1] == "answer_words"
        assert columns[columns.index("answer_words") + 1] == "invalid_citations"
    assert summary.metrics["answer_words"] == pytest.approx(sum(r["answer_words"] for r in rows) / 10)
    assert summary.metrics["answer_words"] == pytest.approx(1.4)
    assert summary.metric_counts["answer_words"] == 10


def test_a_failed_task_scores_zero_on_an_answer_metric(words, hotpot_dev_dir, tmp_path):
    run_eval(load_config(RULES, ["limit=2"]), hotpot_dev_dir, tmp_path / "run", show_progress=False)
    labels = {label.id: label for label in load_dataset(hotpot_dev_dir).labels}
    data = next(t for t in _lines(tmp_path / "run" / "trajectories.jsonl") if t["prediction"] != "yes")
    ok = score_trajectory(Trajectory.from_json(data), labels[data["task_id"]])
    failed = score_trajectory(Trajectory.from_json({**data, "status": "error"}), labels[data["task_id"]])
    assert ok.scores["answer_words"] == len(data["prediction"].split()) > 1 and failed.scores["answer_words"] == 0.0


def test_without_it_rows_and_summaries_are_as_before(hotpot_dev_dir, tmp_path):
    assert "answer_words" not in [m.name for m in registered_metrics()]  # the fixture's teardown took it away
    summary = run_eval(load_config(RULES, ["limit=2"]), hotpot_dev_dir, tmp_path / "run", show_progress=False)
    assert "answer_words" not in summary.metrics
    assert all("answer_words" not in row for row in _lines(tmp_path / "run" / "metrics.jsonl"))

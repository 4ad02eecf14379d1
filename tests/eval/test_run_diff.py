"""memsearch.eval.run_diff / scripts/compare_matrix_runs.py: an ablation's matrix minus its control's,
question by question; refusals; the published search-cost comparison is reproduced from its files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from memsearch.errors import InputError
from memsearch.eval.run_diff import matrix_minus_control

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results" / "memory_policy_cpu"


def _group(matrix: Path, group: str, rows: list[dict]) -> None:
    (matrix / group).mkdir(parents=True)
    (matrix / group / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _row(task: str, searches: float, recall: float | None) -> dict:
    return {"task_id": task, "searches": searches, "memory_support_recall": recall}


def test_difference_is_per_question_and_drops_missing_values(tmp_path):
    _group(tmp_path / "abl", "D", [_row("q1", 1, 0.5), _row("q2", 2, None), _row("q3", 3, 1.0)])
    _group(tmp_path / "ctl", "D", [_row("q3", 3, 0.5), _row("q1", 3, 0.5), _row("q2", 3, 0.0)])
    diff = matrix_minus_control(tmp_path / "abl", tmp_path / "ctl", ["D"], ("searches", "memory_support_recall"),
                                resamples=200)
    searches, recall = diff["D"]["searches"], diff["D"]["memory_support_recall"]
    assert searches["n"] == 3 and searches["diff"] == pytest.approx((-2 - 1 + 0) / 3)
    assert (searches["mean_a"], searches["mean_b"]) == (pytest.approx(2.0), pytest.approx(3.0))
    # q2 has no recall in the ablation, so only q1 (0) and q3 (+0.5) are compared
    assert recall["n"] == 2 and recall["diff"] == pytest.approx(0.25)


def test_runs_over_different_questions_are_refused(tmp_path):
    _group(tmp_path / "abl", "C", [_row("q1", 1, 0.5), _row("q2", 1, 0.5)])
    _group(tmp_path / "ctl", "C", [_row("q1", 1, 0.5), _row("q9", 1, 0.5)])
    with pytest.raises(InputError, match="1 only in .*1 only in"):
        matrix_minus_control(tmp_path / "abl", tmp_path / "ctl", ["C"], resamples=100)
    with pytest.raises(InputError, match="no such file"):
        matrix_minus_control(tmp_path / "abl", tmp_path / "ctl", ["D"], resamples=100)


def test_published_search_cost_comparison_is_reproduced_by_the_script(capsys):
    spec = importlib.util.spec_from_file_location("compare_matrix_runs", ROOT / "scripts" / "compare_matrix_runs.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([str(RESULTS / "ablation-search-cost" / "seed-1" / "matrix"),
                        str(RESULTS / "ablation-stage2-control" / "seed-1" / "matrix"), "CD"]) == 0
    published = json.loads((RESULTS / "ablation-search-cost" / "search_cost_minus_control.json").read_text())
    assert json.loads(capsys.readouterr().out) == published
    assert script.main(["only-one"]) == 2

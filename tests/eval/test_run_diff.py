"""memsearch.eval.run_diff / studies.memory_policy.compare_matrix_runs: an ablation's matrix minus its
control's, question by question; refusals; the command reads gzip-compressed metrics (fixtures/run_diff holds
real rows of the published search-cost control, one group compressed as docs/results publishes
it); the published search-cost comparison is reproduced from its files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from studies.memory_policy import compare_matrix_runs

from memsearch.errors import InputError
from memsearch.eval.run_diff import matrix_minus_control

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results" / "memory_policy_cpu"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "run_diff"


def _script():
    return compare_matrix_runs


def _read_metrics(group: Path) -> dict[str, dict]:
    plain, packed = group / "metrics.jsonl", group / "metrics.jsonl.gz"
    text = plain.read_text() if plain.is_file() else gzip.decompress(packed.read_bytes()).decode()
    return {row["task_id"]: row for row in map(json.loads, text.splitlines())}


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


def test_script_reads_compressed_groups_of_real_rows(capsys):
    """Five real questions per group from the published search-cost control and its control;
    the ablation's group D is gzip-compressed, the rest plain."""
    assert (FIXTURE / "search_cost" / "D" / "metrics.jsonl.gz").is_file()
    assert not (FIXTURE / "search_cost" / "D" / "metrics.jsonl").exists()
    script = _script()
    assert script.main([str(FIXTURE / "search_cost"), str(FIXTURE / "control"), "CD"]) == 0
    diff = json.loads(capsys.readouterr().out)
    assert diff == json.loads((FIXTURE / "search_cost_minus_control.json").read_text())
    for group in "CD":
        a, b = _read_metrics(FIXTURE / "search_cost" / group), _read_metrics(FIXTURE / "control" / group)
        assert sorted(a) == sorted(b) and len(a) == 5
        for metric in ("searches", "memory_support_recall", "f1"):
            per_question = [a[t][metric] - b[t][metric] for t in a]
            assert diff[group][metric]["n"] == 5
            assert diff[group][metric]["diff"] == pytest.approx(sum(per_question) / 5)
    # the priced search made fewer searches on these questions, as on all 200
    assert diff["C"]["searches"]["diff"] < 0 and diff["D"]["searches"]["diff"] < 0


def test_published_search_cost_comparison_is_reproduced_by_the_script(capsys):
    """docs/results publishes the matrices' metrics gzip-compressed; the script reads them."""
    assert (RESULTS / "ablation-search-cost" / "seed-1" / "matrix" / "D" / "metrics.jsonl.gz").is_file()
    script = _script()
    assert script.main([str(RESULTS / "ablation-search-cost" / "seed-1" / "matrix"),
                        str(RESULTS / "ablation-stage2-control" / "seed-1" / "matrix"), "CD"]) == 0
    published = json.loads((RESULTS / "ablation-search-cost" / "search_cost_minus_control.json").read_text())
    assert json.loads(capsys.readouterr().out) == published
    assert script.main(["only-one"]) == 2

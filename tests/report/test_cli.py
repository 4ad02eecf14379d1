"""`memsearch report view / plots` on real runs, the report line `eval` prints, and the training
curves' payload from a real train_log.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memsearch.assets.samples import config_path
from memsearch.cli.app import app
from memsearch.report.html import payload_of_html
from memsearch.report.training import training_series

TRAIN_LOG = Path(__file__).resolve().parents[2] / "docs" / "results" / "cpu_grpo_train_log.jsonl"


def test_view_and_plots(rules_matrix, hotpot_dev_dir, tmp_path):
    out = tmp_path / "r.html"
    result = CliRunner().invoke(
        app,
        [
            "report",
            "view",
            str(rules_matrix),
            "--data",
            str(hotpot_dev_dir),
            "--out",
            str(out),
            "--train-log",
            str(TRAIN_LOG),
        ],
    )
    assert result.exit_code == 0, result.output
    assert str(out) in result.output
    payload = payload_of_html(out.read_text(encoding="utf-8"))
    assert payload["run_order"] == ["A", "B", "C", "D"] and len(payload["comparisons"]) == 12
    result = CliRunner().invoke(
        app,
        [
            "report",
            "plots",
            str(rules_matrix),
            "--data",
            str(hotpot_dev_dir),
            "--out",
            str(tmp_path / "plots"),
            "--train-log",
            str(TRAIN_LOG),
        ],
    )
    assert result.exit_code == 0, result.output
    for name in ("metrics.png", "reward-results.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_view_refuses_other_data(rules_matrix, tmp_path, rewrite_data_file, hotpot_dev_dir):
    import shutil

    other = tmp_path / "edited"
    shutil.copytree(hotpot_dev_dir, other)
    labels = [json.loads(line) for line in (other / "labels.jsonl").read_text(encoding="utf-8").splitlines()]
    labels[0]["answers"] = ["something else"]
    rewrite_data_file(other, "labels.jsonl", labels)  # a consistent folder, but not the run's data
    result = CliRunner().invoke(
        app, ["report", "view", str(rules_matrix), "--data", str(other), "--out", str(tmp_path / "x.html")]
    )
    assert result.exit_code == 2 and "data fingerprint differs" in result.output
    assert not (tmp_path / "x.html").exists()


def test_eval_prints_the_report_command(hotpot_dev_dir, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "run",
            "--config",
            str(config_path("rules.toml")),
            "--data",
            str(hotpot_dev_dir),
            "--out",
            str(out),
            "--limit",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("report: memsearch report view"))
    args = line.removeprefix("report: memsearch ").split()
    assert CliRunner().invoke(app, args).exit_code == 0  # the printed command works as printed
    assert (out / "report.html").is_file()


def test_training_series_from_a_real_log():
    series = training_series([TRAIN_LOG, TRAIN_LOG])
    records = [json.loads(line) for line in TRAIN_LOG.read_text(encoding="utf-8").splitlines()]
    assert series["order"][:4] == ["reward_mean", "reward_std", "zero_variance_groups", "invalid_rate"]
    reward = series["metrics"]["reward_mean"]
    assert reward["steps"] == [r["step"] for r in records]
    assert reward["values"] == [[r["reward_mean"]] * 2 for r in records]


@pytest.mark.slow  # converts the whole 1000-question dev sample, as the demo does
def test_demo_ends_by_naming_its_report(tmp_path):
    from memsearch.pipelines.demo import run_demo
    from memsearch.report.html import payload_of_html

    lines: list[str] = []
    run_demo(backend="rules", limit=2, out=tmp_path / "demo", echo=lines.append, show_progress=False)
    assert lines[-1] == f"report (open in a browser, works offline): {tmp_path / 'demo' / 'report.html'}"
    payload = payload_of_html((tmp_path / "demo" / "report.html").read_text(encoding="utf-8"))
    assert payload["run_order"] == ["A", "B", "C", "D"]
    assert all(len(run["episodes"]) == 2 for run in payload["runs"].values())  # every episode browsable


def test_training_view_shows_decision_entropy_and_op_shares(tmp_path):
    """A log with the decision view (train.decisions): decision entropy and each op's share of a
    step's ops and invalid calls come right after the reward, as band-able series."""
    log = tmp_path / "run" / "train_log.jsonl"
    log.parent.mkdir()
    ops = [{"ADD": 3, "UPDATE": 0, "DELETE": 0, "NOOP": 1, "invalid_parse": 0, "invalid_budget": 0, "invalid_rule": 0},
           {"ADD": 0, "UPDATE": 0, "DELETE": 0, "NOOP": 0, "invalid_parse": 0, "invalid_budget": 0, "invalid_rule": 0}]
    log.write_text("".join(json.dumps({"step": s, "reward_mean": 0.1, "decision_entropy": 0.5 / s, "ops": o}) + "\n"
                           for s, o in ((1, ops[0]), (2, ops[1]))))
    series = training_series([log])
    assert series["order"][:4] == ["reward_mean", "decision_entropy", "op_share/ADD", "op_share/UPDATE"]
    assert series["metrics"]["op_share/ADD"] == {"steps": [1], "values": [[0.75]]}  # step 2 had no op at all
    assert series["metrics"]["op_share/NOOP"]["values"] == [[0.25]]
    assert series["metrics"]["decision_entropy"]["values"] == [[0.5], [0.25]]

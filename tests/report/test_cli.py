"""`memsearch report view / plots` on real runs, the report line `eval` prints, and the training
curves' payload from a real train_log.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memsearch.assets.samples import config_path
from memsearch.cli.app import app
from memsearch.errors import InputError
from memsearch.report.html import payload_of_html
from memsearch.report.plots import write_plots
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


@pytest.mark.parametrize("command", ["run", "matrix"])
def test_the_printed_report_command_can_be_pasted_into_a_shell(command, hotpot_dev_dir, tmp_path):
    """Issue 26 item 15: a folder named with a space and a `$(...)` broke the printed command, and
    pasting it ran the `$(...)`. Pasted into bash as printed, it writes the report and runs nothing
    else; `report view` names the page by a percent-encoded file:// URL."""
    import shutil
    import subprocess
    import sys
    from urllib.parse import unquote, urlparse

    out = tmp_path / "my run $(touch pwned)"
    result = CliRunner().invoke(app, ["eval", command, "--config", str(config_path("rules.toml")), "--data",
                                      str(hotpot_dev_dir), "--out", str(out), "--limit", "2"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("report: memsearch report view"))
    bin_dir = Path(sys.executable).parent
    assert shutil.which("memsearch", path=str(bin_dir))
    pasted = subprocess.run(["bash", "-c", line.removeprefix("report: ")], cwd=tmp_path, capture_output=True,
                            text=True, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert pasted.returncode == 0, pasted.stderr[-2000:]
    assert (out / "report.html").is_file() and not (tmp_path / "pwned").exists()
    url = next(w.rstrip(")") for w in pasted.stdout.split() if w.startswith("(file://"))[1:]
    assert " " not in url and "$" not in url and Path(unquote(urlparse(url).path)) == (out / "report.html").resolve()


def test_view_never_replaces_an_existing_file_nor_writes_through_a_symlink(rules_matrix, hotpot_dev_dir, tmp_path):
    """Issue 26 item 3: without --force an existing output (a file, a symlink to one) is refused
    untouched; with --force the output itself is replaced, a symlink's target never written."""
    mine, target, link = tmp_path / "mine.html", tmp_path / "target.txt", tmp_path / "link.html"
    mine.write_text("mine\n")
    target.write_text("someone else's\n")
    link.symlink_to(target)
    view = ["report", "view", str(rules_matrix / "A"), "--data", str(hotpot_dev_dir), "--out"]
    for out in (mine, link):
        result = CliRunner().invoke(app, [*view, str(out)])
        assert result.exit_code == 2 and f"error: {out}: already exists; pass --force" in result.output
    assert mine.read_text() == "mine\n" and link.is_symlink() and target.read_text() == "someone else's\n"
    for out in (mine, link):
        assert CliRunner().invoke(app, [*view, str(out), "--force"]).exit_code == 0
        assert not out.is_symlink() and payload_of_html(out.read_text(encoding="utf-8"))["run_order"] == ["A"]
    assert target.read_text() == "someone else's\n"


def test_plots_never_replace_plots_nor_write_into_an_existing_folder_without_force(tmp_path):
    """Issue 26 item 3: an existing --out folder (`/` included) is refused with nothing written;
    --force replaces the plots only (a symlink among them is replaced, its target untouched); two
    logs that would give one file name are refused."""
    target = tmp_path / "target.txt"
    target.write_text("someone else's\n")
    out = tmp_path / "plots"
    out.mkdir()
    (out / "reward-results.png").symlink_to(target)
    plots = ["report", "plots", "--train-log", str(TRAIN_LOG), "--out"]
    # `/` is given nothing to plot: were it not refused, the command would still write nothing there.
    for args, folder in ((plots, out), (["report", "plots", "--out"], Path("/"))):
        result = CliRunner().invoke(app, [*args, str(folder)])
        assert result.exit_code == 2 and f"error: {folder}: output folder already exists" in result.output
    assert (out / "reward-results.png").is_symlink() and sorted(p.name for p in out.iterdir()) == ["reward-results.png"]
    assert CliRunner().invoke(app, [*plots, str(out), "--force"]).exit_code == 0
    assert (out / "reward-results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "reward-results.png").is_symlink() and target.read_text() == "someone else's\n"
    assert sorted(p.name for p in out.iterdir()) == ["reward-results.png"]  # no temporary left behind
    # Even with --force, a symlinked --out folder is not written through, and `/` is refused.
    before = (out / "reward-results.png").read_bytes()
    linked = tmp_path / "linked"
    linked.symlink_to(out)
    result = CliRunner().invoke(app, [*plots, str(linked), "--force"])
    assert result.exit_code == 2 and f"error: {linked}: --out is a symlink to {out}" in result.output
    assert (out / "reward-results.png").read_bytes() == before
    with pytest.raises(InputError, match="^/: --out is the file system root"):
        write_plots([], None, Path("/"), [], force=True)  # nothing to draw: safe even were it not refused
    twin = tmp_path / "other" / "results" / "train_log.jsonl"
    twin.parent.mkdir(parents=True)
    twin.write_bytes(TRAIN_LOG.read_bytes())
    result = CliRunner().invoke(app, ["report", "plots", "--train-log", str(TRAIN_LOG), "--train-log", str(twin),
                                      "--out", str(tmp_path / "new")])
    assert result.exit_code == 2 and "reward-results.png" in result.output and not (tmp_path / "new").exists()


def test_plots_refuse_a_train_log_with_unusable_records_naming_file_line_and_field(tmp_path):
    """`report plots --train-log` checks every record it draws before it makes the folder: a
    step that is not an integer, a reward that is not a finite number (JSON's NaN included), a
    record that is not an object; each named by file, line and field, exit 2."""
    lines = TRAIN_LOG.read_text(encoding="utf-8").splitlines()[:3]
    bad = [json.loads(line) for line in lines]
    bad[0]["step"] = "one"
    bad[1]["reward_mean"] = float("nan")
    bad[2]["reward_std"] = "high"
    log = tmp_path / "run" / "train_log.jsonl"
    log.parent.mkdir()
    log.write_text("\n".join(json.dumps(r) for r in bad) + "\n[1, 2]\n", encoding="utf-8")
    out = tmp_path / "plots"
    result = CliRunner().invoke(app, ["report", "plots", "--train-log", str(log), "--out", str(out)])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    for where in (f"{log}:1: step", f"{log}:2: reward_mean", f"{log}:3: reward_std", f"{log}:4: record"):
        assert where in text, (where, text)
    assert "Traceback" not in result.output and not out.exists()


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
    """A log with the decision view (train.grpo.decisions): decision entropy and each op's share of a
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

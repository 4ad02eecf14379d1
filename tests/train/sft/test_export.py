"""export-sft on real eval runs over the HotpotQA train sample: rows are exactly the valid calls,
--min-f1 filters by the run's metrics, and bad or mismatched inputs are refused with no output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memsearch.assets.samples import HOTPOT_TRAIN, samples_dir
from memsearch.cli.app import app
from memsearch.config import load_config
from memsearch.data.dataset import save_dataset
from memsearch.data.hotpot import convert_hotpot
from memsearch.errors import InputError
from memsearch.eval.runner import run_eval
from memsearch.io import iter_jsonl, write_jsonl
from memsearch.memory.ops import parse_ops
from memsearch.text.actions import evidence_ids_in
from memsearch.train.sft.export import export_sft

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "configs" / "rules.toml"
ORACLE = ['backends.memory.kind="oracle"', 'backends.reader.kind="oracle"', "budgets.memory_tokens=4096",
          "budgets.policy_tokens=1024"]
TASKS = 30


def _lines(path: Path) -> list[dict]:
    return [obj for _, obj in iter_jsonl(path)]


def invoke(*args):
    return CliRunner().invoke(app, ["train", "export-sft", *[str(a) for a in args]])


def _calls(run: Path, role: str) -> list[tuple[dict, dict]]:
    """(trajectory, call) for every call of ``role`` in the run, in task order (metrics.jsonl's)."""
    by_task = {t["task_id"]: t for t in _lines(run / "trajectories.jsonl")}
    return [(t, e) for t in (by_task[m["task_id"]] for m in _lines(run / "metrics.jsonl")) for e in t["events"]
            if e["type"] == "policy_call" and e["role"] == role]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Real runs on the train sample: the oracle teacher, the rules agent, a summary-mode agent."""
    base = tmp_path_factory.mktemp("export")
    data = base / "hotpot-train"
    save_dataset(convert_hotpot(samples_dir() / HOTPOT_TRAIN, split="train", limit=TASKS), data)
    out = {}
    for name, overrides in (("oracle", ORACLE), ("rules", []), ("summary", ['agent.memory="summary"'])):
        out[name] = base / name
        run_eval(load_config(RULES, overrides), data, out[name], show_progress=False)
    return out


def _args(run: Path, role: str, out: Path, *extra) -> list:
    return ["--trajectories", run / "trajectories.jsonl", "--metrics", run / "metrics.jsonl", "--role", role,
            "--out", out, *extra]


def test_memory_rows_are_exactly_the_valid_memory_calls(runs, tmp_path):
    out = tmp_path / "memory.jsonl"
    result = invoke(*_args(runs["oracle"], "memory", out))
    assert result.exit_code == 0, result.output
    calls = [(t, c) for t, c in _calls(runs["oracle"], "memory") if c["valid"]]
    assert result.stdout == f"wrote {out}: {len(calls)} memory rows from {TASKS} tasks\nskipped calls: none\n"
    rows = _lines(out)
    assert len(rows) == len(calls) > TASKS
    for row, (traj, call) in zip(rows, calls):
        assert row["completion"] == call["text"] and row["messages"] == call["messages"]
        assert [m["role"] for m in row["messages"]] == ["system", "user"]
        assert (row["task_id"], row["role"], row["step"]) == (traj["task_id"], "memory", call["step"])
        assert row["source"] == {
            "run": str(runs["oracle"]),
            "group": "",
            "backend": "oracle",
            "memory_mode": "decision",
            "split": "train",
        }
        assert parse_ops(row["completion"]).ok
        # what the memory cited when the call was made: here the prompt shows it too
        shown_memory = (
            row["messages"][-1]["content"]
            .split("Memory (id, kind, sources, text):", 1)[1]
            .split("New evidence (", 1)[0]
        )
        assert set(row["memory_sources"]) == set(evidence_ids_in(shown_memory))
    assert any(row["memory_sources"] for row in rows)
    reader = export_sft(
        runs["oracle"] / "trajectories.jsonl", runs["oracle"] / "metrics.jsonl", "reader", tmp_path / "r.jsonl"
    )
    assert all("memory_sources" not in r for r in _lines(tmp_path / "r.jsonl"))
    assert reader.exported == TASKS and [r["completion"] for r in _lines(tmp_path / "r.jsonl")] == [
        c["text"] for _, c in _calls(runs["oracle"], "reader")
    ]


def test_min_f1_keeps_tasks_by_the_run_metrics(runs, tmp_path):
    run, out = runs["rules"], tmp_path / "reader.jsonl"
    f1 = {r["task_id"]: r["f1"] for r in _lines(run / "metrics.jsonl")}
    kept = {task for task, score in f1.items() if score >= 0.5}
    assert 0 < len(kept) < TASKS  # the rules reader is right on some tasks only
    result = invoke(*_args(run, "reader", out, "--min-f1", "0.5"))
    assert result.exit_code == 0, result.output
    rows = _lines(out)
    assert {r["task_id"] for r in rows} == {
        t["task_id"] for t, c in _calls(run, "reader") if c["valid"] and t["task_id"] in kept
    }
    assert f"below_min_f1 {TASKS - len(kept)}" in result.stdout
    assert f"tasks kept by --min-f1 0.5: {len(kept)}/{TASKS}" in result.stdout


def test_invalid_failed_and_errored_calls_are_skipped_and_counted(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["oracle"], run)
    trajectories, metrics = _lines(run / "trajectories.jsonl"), _lines(run / "metrics.jsonl")
    memory = [e for e in trajectories[0]["events"] if e.get("role") == "memory"]
    memory[0].update(valid=False, invalid_reason="parse error")
    memory[1].update(error="timeout", finish_reason="error")
    memory[2].update(finish_reason="length")
    trajectories[1]["status"] = next(m for m in metrics if m["task_id"] == trajectories[1]["task_id"])["status"] = (
        "error"
    )
    for name, records in (("trajectories.jsonl", trajectories), ("metrics.jsonl", metrics)):
        (run / name).unlink()
        write_jsonl(run / name, records)
    report = export_sft(run / "trajectories.jsonl", run / "metrics.jsonl", "memory", tmp_path / "m.jsonl")
    failed_task = sum(1 for e in trajectories[1]["events"] if e.get("role") == "memory")
    assert dict(report.skipped) == {"invalid": 1, "request_error": 1, "truncated": 1, "task_status": failed_task}
    assert report.exported == len(_calls(run, "memory")) - 3 - failed_task == len(_lines(tmp_path / "m.jsonl"))


def test_memory_export_from_a_summary_run_is_refused(runs, tmp_path):
    out = tmp_path / "memory.jsonl"
    result = invoke(*_args(runs["summary"], "memory", out))
    assert result.exit_code == 2
    assert "agent.memory is 'summary'; memory-role SFT rows need a decision-mode run" in result.stderr
    assert "not memory operation batches" in result.stderr and not out.exists()
    # The reader of a summary run is still a policy call worth exporting.
    assert invoke(*_args(runs["summary"], "reader", out)).exit_code == 0


def test_existing_output_is_never_overwritten(runs, tmp_path):
    out = tmp_path / "memory.jsonl"
    out.write_text("keep me\n")
    result = invoke(*_args(runs["oracle"], "memory", out))
    assert result.exit_code == 2 and "output file already exists" in result.stderr
    assert out.read_text() == "keep me\n"


def test_bad_trajectory_lines_name_file_line_and_field(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["oracle"], run)
    path = run / "trajectories.jsonl"
    lines = path.read_text().splitlines()
    broken = json.loads(lines[1])
    index = next(i for i, e in enumerate(broken["events"]) if e.get("role") == "memory")
    del broken["events"][index]["messages"]
    path.write_text("\n".join([lines[0], json.dumps(broken), *lines[2:]]) + "\n")
    with pytest.raises(InputError) as err:
        export_sft(path, run / "metrics.jsonl", "memory", tmp_path / "a.jsonl")
    assert str(err.value) == f"{path}:2: events.{index}.messages: missing, expected this field"
    path.write_text("\n".join([*lines[:4], lines[4][:50], *lines[5:]]) + "\n")
    result = invoke(*_args(run, "memory", tmp_path / "b.jsonl"))
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {path}:5: json: invalid JSON")
    assert not list(tmp_path.glob("*.jsonl")) and not list(tmp_path.glob(".*tmp*")), "nothing partial left behind"


def test_metrics_must_come_from_the_same_run(runs, tmp_path):
    traj = runs["oracle"] / "trajectories.jsonl"
    # Another run's folder: its config differs.
    with pytest.raises(InputError, match="comes from another run"):
        export_sft(traj, runs["rules"] / "metrics.jsonl", "memory", tmp_path / "a.jsonl")
    # Another run's rows copied elsewhere: the rows disagree with the trajectories.
    rows = _lines(runs["rules"] / "metrics.jsonl")
    write_jsonl(tmp_path / "metrics.jsonl", rows)
    with pytest.raises(InputError, match=r"task '[^']+': its metrics row .* does not match this trajectory"):
        export_sft(traj, tmp_path / "metrics.jsonl", "memory", tmp_path / "a.jsonl")
    # A task without a metrics row is named.
    own = _lines(runs["oracle"] / "metrics.jsonl")
    (tmp_path / "metrics.jsonl").unlink()
    write_jsonl(tmp_path / "metrics.jsonl", own[1:])
    with pytest.raises(InputError, match=f"task '{own[0]['task_id']}' has no row in"):
        export_sft(traj, tmp_path / "metrics.jsonl", "memory", tmp_path / "a.jsonl")
    assert not (tmp_path / "a.jsonl").exists()


def test_missing_config_is_refused_with_the_expected_file(runs, tmp_path):
    shutil.copy(runs["oracle"] / "trajectories.jsonl", tmp_path / "trajectories.jsonl")
    result = invoke(
        "--trajectories",
        tmp_path / "trajectories.jsonl",
        "--metrics",
        runs["oracle"] / "metrics.jsonl",
        "--role",
        "memory",
        "--out",
        tmp_path / "a.jsonl",
    )
    assert result.exit_code == 2
    assert f"{tmp_path / 'config.json'}: no such file; export-sft reads the run config" in result.stderr
    result = invoke(*_args(runs["oracle"], "critic", tmp_path / "a.jsonl"))
    assert result.exit_code == 2 and "--role 'critic': expected one of memory, controller, reader" in result.stderr


def test_a_dev_run_is_refused(hotpot_dev_dir, tmp_path):
    """Rows from dev questions would leak the evaluation set into training (as GRPO and the
    oracle refuse a dev split, so does the export)."""
    run = tmp_path / "dev-run"
    run_eval(load_config(RULES, ["limit=2"]), hotpot_dev_dir, run, show_progress=False)
    out = tmp_path / "rows.jsonl"
    result = invoke(*_args(run, "memory", out))
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {run / 'run.json'}: data split is 'dev'; SFT rows come from a run on a train "
        "split only (docs/design.md §9); nothing was written\n"
    )
    assert not out.exists()


def test_rows_follow_task_order_not_the_order_episodes_finished(runs, tmp_path):
    """An eval appends trajectories as episodes finish, so two runs of one teacher differ in line
    order; the export (and so a seeded row selection and SFT) must not."""
    run = tmp_path / "run"
    shutil.copytree(runs["oracle"], run)
    path = run / "trajectories.jsonl"
    in_order = export_sft(path, run / "metrics.jsonl", "memory", tmp_path / "a.jsonl")
    lines = path.read_text().splitlines()
    path.write_text("\n".join(reversed(lines)) + "\n")
    shuffled = export_sft(path, run / "metrics.jsonl", "memory", tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert in_order.exported == shuffled.exported > TASKS
    metrics_order = [row["task_id"] for row in _lines(run / "metrics.jsonl")]
    exported = [row["task_id"] for row in _lines(tmp_path / "b.jsonl")]
    assert list(dict.fromkeys(exported)) == [t for t in metrics_order if t in set(exported)]
    steps = {}
    for row in _lines(tmp_path / "b.jsonl"):
        steps.setdefault(row["task_id"], []).append(row["step"])
    assert all(s == sorted(s) for s in steps.values())

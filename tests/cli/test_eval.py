"""`memsearch eval run` / `eval matrix` through the real CLI: what `--limit` accepts and what the exit
status says about the run (issue 11 items 2 and 10)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memsearch.cli.app import EXIT_INCOMPLETE, app
from memsearch.testing.agent_server import AgentServer

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "configs" / "rules.toml"
API = ROOT / "configs" / "api.toml"


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _api_args(url: str, roles=("memory", "controller", "reader", "baseline_memory")) -> list[str]:
    sets = ['tokenizer="lexical"', *[f'backends.{r}.base_url="{url}"' for r in roles],
            *[f"backends.{r}.max_retries=0" for r in roles]]
    return [a for s in sets for a in ("--set", s)]


@pytest.mark.parametrize("command", ["run", "matrix"])
@pytest.mark.parametrize("limit", ["0", "-1"])
def test_limit_below_one_is_refused_before_anything_runs(command, limit, hotpot_dev_dir, tmp_path):
    """`--limit 0` used to mean "no limit": on a paid API, every question of the folder."""
    out = tmp_path / "run"
    result = invoke("eval", command, "--config", RULES, "--data", hotpot_dev_dir, "--out", out, "--limit", limit)
    assert result.exit_code == 2
    assert f"error: --limit {limit}: expected a positive number of tasks" in result.output
    assert not out.exists()


def test_complete_eval_exits_0_and_limit_is_applied(hotpot_dev_dir, tmp_path):
    out = tmp_path / "run"
    result = invoke("eval", "run", "--config", RULES, "--data", hotpot_dev_dir, "--out", out, "--limit", "3")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is True and summary["tasks"]["scored"] == 3


def test_incomplete_eval_exits_with_its_own_status(hotpot_dev_dir, tmp_path):
    """A run the tool itself calls INCOMPLETE must not exit 0, so `eval ... && next-step` stops."""
    out = tmp_path / "run"
    with AgentServer(delay_s=0.0, fail_every=2) as server:
        result = invoke("eval", "run", "--config", API, "--data", hotpot_dev_dir, "--out", out, "--limit", "4",
                        *_api_args(server.base_url))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False
    assert result.exit_code == EXIT_INCOMPLETE == 3, result.output
    assert "INCOMPLETE" in result.output


def test_matrix_exit_status_follows_its_groups(hotpot_dev_dir, tmp_path):
    ok = invoke("eval", "matrix", "--config", RULES, "--data", hotpot_dev_dir, "--out", tmp_path / "ok", "--limit", "2")
    assert ok.exit_code == 0, ok.output
    with AgentServer(delay_s=0.0, fail_every=2) as server:
        bad = invoke(
            "eval",
            "matrix",
            "--config",
            API,
            "--data",
            hotpot_dev_dir,
            "--out",
            tmp_path / "bad",
            "--limit",
            "2",
            *_api_args(server.base_url),
        )
    matrix = json.loads((tmp_path / "bad" / "matrix.json").read_text())
    assert not all(g["complete"] for g in matrix["groups"].values())
    assert bad.exit_code == EXIT_INCOMPLETE, bad.output
    assert "INCOMPLETE: group(s)" in bad.output


def test_a_missing_backend_table_is_named_in_a_notice(hotpot_dev_dir, tmp_path):
    """api.toml without [backends.reader] used to run the rules reader in an "api" run, silently."""
    text = API.read_text()
    config = tmp_path / "api-no-reader.toml"
    config.write_text(text[: text.index("[backends.reader]")])
    with AgentServer(delay_s=0.0) as server:
        result = invoke(
            "eval",
            "run",
            "--config",
            config,
            "--data",
            hotpot_dev_dir,
            "--out",
            tmp_path / "run",
            "--limit",
            "1",
            *_api_args(server.base_url, roles=("memory", "controller")),
        )
    assert result.exit_code == 0, result.output
    assert (
        f"notice: {config} has no [backends.reader] table: that role runs the default backend (kind = 'rules')"
        in result.output
    )
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["backends"]["reader"] == "rules"
    complete = invoke(
        "eval", "run", "--config", RULES, "--data", hotpot_dev_dir, "--out", tmp_path / "rules", "--limit", "1"
    )
    assert "notice:" not in complete.output


def test_set_values_are_strictly_typed_and_errors_name_the_flag(hotpot_dev_dir, tmp_path):
    result = invoke(
        "eval",
        "run",
        "--config",
        RULES,
        "--data",
        hotpot_dev_dir,
        "--out",
        tmp_path / "run",
        "--set",
        "concurrency=true",
        "--set",
        "budgets.max_searches=0",
    )
    assert result.exit_code == 2
    assert "error: --set concurrency=true: concurrency: Input should be a valid integer" in result.output
    assert (
        "error: --set budgets.max_searches=0: budgets.max_searches: Input should be greater than or equal to 1"
        in result.output
    )
    assert not (tmp_path / "run").exists()

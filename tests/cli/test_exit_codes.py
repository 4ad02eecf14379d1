"""Exit statuses through the real CLI (README "Exit status"): bad input is 2 with `error:` lines
and no traceback; an internal error is 1 with Python's traceback, even when it is a ValueError."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memsearch.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "memsearch"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_an_internal_value_error_exits_1_with_its_traceback(hotpot_dev_dir):
    # A bug inside a command (here: the validator itself raising) is not bad input.
    snippet = (
        "import sys\n"
        "import memsearch.data.validate\n"
        "def broken(*args, **kwargs):\n"
        "    raise ValueError('an internal bug')\n"
        "memsearch.data.validate.validate_data = broken\n"
        "from memsearch.cli.app import main\n"
        f"sys.argv = ['memsearch', 'data', 'validate', '--data', {str(hotpot_dev_dir)!r}]\n"
        "main()\n"
    )
    run = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=60, env=_env())
    assert run.returncode == 1
    assert "Traceback (most recent call last):" in run.stderr
    assert run.stderr.rstrip().splitlines()[-1] == "ValueError: an internal bug"
    assert "error:" not in run.stderr


def test_an_internal_error_is_not_reported_as_bad_input(monkeypatch, hotpot_dev_dir):
    import memsearch.data.validate

    def broken(*args, **kwargs):
        raise KeyError("files")

    monkeypatch.setattr(memsearch.data.validate, "validate_data", broken)
    result = invoke("data", "validate", "--data", hotpot_dev_dir)
    assert result.exit_code == 1 and isinstance(result.exception, KeyError)
    assert "error:" not in result.stderr


def test_bad_input_exits_2_with_one_error_line(hotpot_dev_dir, tmp_path):
    run = subprocess.run([str(SCRIPT), "retrieval", "build", "--data", str(hotpot_dev_dir), "--method", "tfidf",
                          "--out", str(tmp_path / "ix")], capture_output=True, text=True, timeout=120, env=_env())
    assert run.returncode == 2
    assert run.stderr == "error: --method 'tfidf': build 'bm25' or 'dense' (a dense folder also serves 'hybrid')\n"
    assert run.stdout == "" and not (tmp_path / "ix").exists()


def test_validate_on_bad_data_exits_2(hotpot_dev_dir, tmp_path):
    import shutil

    bad = Path(shutil.copytree(hotpot_dev_dir, tmp_path / "bad"))
    (bad / "corpus.jsonl").write_text((bad / "corpus.jsonl").read_text() + "{oops\n")
    run = subprocess.run([str(SCRIPT), "data", "validate", "--data", str(bad)], capture_output=True, text=True,
                         timeout=120, env=_env())
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.splitlines()[-1] == f"2 problem(s) in {bad}"  # the bad line, and the changed SHA-256
    assert "Traceback" not in run.stderr


def test_library_checks_of_user_values_exit_2(hotpot_dev_dir, tmp_path):
    # Checks that library functions raise for a bad value a user typed: bad input, not a crash.
    result = invoke("data", "prepare-ruler", "--data", hotpot_dev_dir, "--docs", "20", "--out", tmp_path / "r",
                    "--tokenizer", "no-such-tokenizer")
    assert result.exit_code == 2 and result.stderr.startswith("error: unknown tokenizer 'no-such-tokenizer'")
    log = tmp_path / "train_log.jsonl"
    log.write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
    result = invoke("report", "plots", "--out", tmp_path / "plots", "--train-log", log)
    assert (result.exit_code, result.stderr) == (2, f"error: {log}: no step records with reward_mean\n")
    memagent = ROOT / "configs" / "memagent.toml"
    result = invoke("verl", "config", "--config", memagent, "--agent-loops", tmp_path / "l.yaml")
    assert result.exit_code == 2 and "is a MemAgent pipeline config: give --data" in result.stderr
    result = invoke("report", "view", tmp_path / "a", tmp_path / "b", tmp_path / "c", "--data", hotpot_dev_dir,
                    "--out", tmp_path / "r.html")
    assert (result.exit_code, result.stderr) == (2, "error: expected RUN [RUN_B], got 3 runs\n")


@pytest.mark.parametrize(("setting", "message"), [
    ('tokenizer="no/such/tokenizer"', "tokenizer: 'no/such/tokenizer': no such folder"),
    ('backends.reader.kind="openai"', "backend kind 'openai' needs base_url"),
    ('backends.memory.kind="oracle"', "oracle backend refuses a 'dev' split"),
])
def test_refused_run_settings_exit_2(setting, message, hotpot_dev_dir, tmp_path):
    # README: a run refused before it starts (tokenizer, backend settings, ...) is exit 2, nothing made.
    out = tmp_path / "run"
    result = invoke("eval", "run", "--config", ROOT / "configs" / "rules.toml", "--data", hotpot_dev_dir, "--out", out,
                    "--limit", "2", "--set", setting)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {message}") and "Traceback" not in result.output
    assert not out.exists()

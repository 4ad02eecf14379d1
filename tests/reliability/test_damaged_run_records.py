"""Damaged records of an experiment or pipeline folder (issue 62): a truncated ``run.json`` or
``*.stage.json`` ends the command with exit 2 naming the file and what to do, with no traceback
and before anything in the folder is changed (``invocations.jsonl``, ``config.json`` and every
other file keep their bytes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memsearch.cli.app import app
from memsearch.eval.run_folder import MARKER

ROOT = Path(__file__).resolve().parents[2]
# "outside" counts files of the folder a refused command changed: it must change none.
EXAMPLE = ROOT / "configs" / "experiment.example.toml"
SAMPLES = ROOT / "data" / "samples" / "hotpotqa"


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file's bytes but the lock's (it names whichever process last held the folder)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def _experiment_folder(out: Path) -> None:
    """A folder an earlier `experiment run` left: its marker, one invocation, a finished stage."""
    out.mkdir()
    (out / MARKER).write_text(json.dumps({"made_by": "experiment run"}))
    (out / "invocations.jsonl").write_text(json.dumps({"time": "t", "profile": "cpu", "config": {}}) + "\n")
    (out / "config.json").write_text("{}")
    (out / "run.json").write_text(json.dumps({"attempts": [{"status": "interrupted"}], "services": {}}))
    (out / "models.stage.json").write_text(json.dumps({"version": 4, "fingerprint": "f", "inputs": {},
                                                       "complete": True}))


def _experiment(out: Path):
    return CliRunner().invoke(app, ["experiment", "run", "--config", str(EXAMPLE), "--profile", "cpu", "--out",
                                    str(out), "--set", f'data.train="{SAMPLES / "train_sample.json"}"',
                                    "--set", f'data.dev="{SAMPLES / "dev_distractor_sample.json"}"'])


SCENARIO = "damaged run and stage records"


@pytest.mark.parametrize("damaged", ["run.json", "models.stage.json"])
def test_a_damaged_experiment_record_is_named_before_anything_changes(tmp_path, damaged, rel):
    out = tmp_path / "exp"
    _experiment_folder(out)
    path = out / damaged
    path.write_text(path.read_text()[:17])  # cut mid-write (a full disk, a kill during a copy)
    before = _snapshot(out)
    result = _experiment(out)
    rel.LEDGER.record(f"{SCENARIO}: experiment run", wrong_exit=int(result.exit_code != 2),
                      outside=len(set(_snapshot(out).items()) ^ set(before.items())))
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    kind = "run record" if damaged == "run.json" else "stage record"
    assert f"error: {path}: damaged {kind}, not readable as JSON" in result.output
    assert "nothing was changed" in result.output and "Traceback" not in result.output
    assert _snapshot(out) == before


def test_a_damaged_pipeline_record_is_named_before_the_invocation_is_recorded(tmp_path, rel):
    out = tmp_path / "mp"
    out.mkdir()
    (out / MARKER).write_text(json.dumps({"made_by": "pipeline memory-policy"}))
    (out / "seed-1").mkdir()
    record = out / "seed-1" / "grpo1.stage.json"
    record.write_text('{"version": 4, "stage": "grpo1", "fingerp')
    before = _snapshot(out)
    result = CliRunner().invoke(app, ["pipeline", "memory-policy", "--config",
                                      str(ROOT / "configs" / "memory_policy_cpu.toml"), "--out", str(out)])
    rel.LEDGER.record(f"{SCENARIO}: pipeline", wrong_exit=int(result.exit_code != 2),
                      outside=len(set(_snapshot(out).items()) ^ set(before.items())))
    assert result.exit_code == 2, result.output
    assert f"error: {record}: damaged stage record, not readable as JSON" in result.output
    assert "delete it and the outputs beside it to redo that stage" in result.output
    assert _snapshot(out) == before

"""Malformed training logs in the report's training view: each unusable record is refused with
one line naming the file, the line and the field (exit status 2 from the CLI), never a traceback."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from memsearch.cli.app import app
from memsearch.errors import InputError
from memsearch.report.training import training_series

GOOD = {"step": 1, "reward_mean": 0.5, "loss": 0.25, "ops": {"ADD": 1, "NOOP": 1}}


def _log(tmp_path, *lines: str):
    path = tmp_path / "run" / "train_log.jsonl"
    path.parent.mkdir(exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("bad_line", "field", "expected"),
    [
        ('{"step": "2", "reward_mean": 0.1}', "step", "got '2', expected an integer step number"),
        ('{"step": true, "reward_mean": 0.1}', "step", "got True, expected an integer step number"),
        ('{"step": 2.5, "reward_mean": 0.1}', "step", "got 2.5, expected an integer step number"),
        ('{"step": null, "reward_mean": 0.1}', "step", "got None, expected an integer step number"),
        ('{"reward_mean": 0.1}', "step", "got None, expected an integer step number"),
        ('{"step": [2], "reward_mean": 0.1}', "step", "got [2], expected an integer step number"),
        ('{"step": 2, "reward_mean": "high"}', "reward_mean",
         "got 'high', expected a number (as at other steps) or null"),
        ('{"step": 2, "loss": [0.1]}', "loss", "got [0.1], expected a number (as at other steps) or null"),
        ('{"step": 2, "reward_mean": NaN}', "reward_mean", "got nan, expected a finite number"),
        ('{"step": 2, "loss": -Infinity}', "loss", "got -inf, expected a finite number"),
        ('{"step": 2, "ops": {"ADD": Infinity}}', "ops.ADD", "got inf, expected a finite number"),
        ('[2, 0.1]', "record", "got list, expected a JSON object per step"),
    ],
)
def test_malformed_record_names_file_line_and_field(tmp_path, bad_line, field, expected):
    log = _log(tmp_path, json.dumps(GOOD), bad_line, json.dumps({**GOOD, "step": 3}))
    with pytest.raises(InputError) as info:
        training_series([log])
    assert str(info.value) == f"{log}:2: {field}: {expected}"


def test_every_bad_line_of_every_log_is_listed(tmp_path):
    a = _log(tmp_path, '{"step": "one"}', json.dumps(GOOD), '{"step": 3, "loss": "x"}')
    b = tmp_path / "seed2" / "train_log.jsonl"
    b.parent.mkdir()
    b.write_text('{"step": 1, "loss": NaN}\n', encoding="utf-8")
    with pytest.raises(InputError) as info:
        training_series([a, b])
    assert [f"{p.file}:{p.line}: {p.field}" for p in info.value.problems] == [
        f"{a}:1: step", f"{b}:1: loss", f"{a}:3: loss"]


def test_null_values_are_gaps_not_errors(tmp_path):
    log = _log(tmp_path, json.dumps(GOOD), '{"step": 2, "reward_mean": null, "loss": 0.5, "note": "resumed"}')
    series = training_series([log])
    assert series["metrics"]["reward_mean"] == {"steps": [1, 2], "values": [[0.5], [None]]}
    assert series["metrics"]["loss"] == {"steps": [1, 2], "values": [[0.25], [0.5]]}
    assert "note" not in series["order"]  # never a number: not a metric, so no curve and no error


def test_report_view_exits_2_with_one_line(rules_matrix, hotpot_dev_dir, tmp_path):
    log = _log(tmp_path, json.dumps(GOOD), '{"step": "2", "reward_mean": 0.1}')
    result = CliRunner().invoke(app, ["report", "view", str(rules_matrix / "B"), "--data", str(hotpot_dev_dir),
                                      "--out", str(tmp_path / "r.html"), "--train-log", str(log)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert f"{log}:2: step: got '2', expected an integer step number" in result.output
    assert not (tmp_path / "r.html").exists()

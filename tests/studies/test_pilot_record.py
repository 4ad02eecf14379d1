"""studies.memory_policy.pilot (module and command): a validation pilot's record
read from real evaluation runs (the rules memory at two budgets stands in for two GRPO evaluations)."""

from __future__ import annotations

import json
import shutil

import pytest
from studies.memory_policy import pilot

from memsearch.assets.samples import config_path
from memsearch.config import load_config
from memsearch.eval.runner import run_eval
from memsearch.pipelines.memory_policy.heldout import decision_rates, gold_facts


@pytest.fixture(scope="module")
def stage(hotpot_dev_dir, tmp_path_factory):
    """A GRPO stage folder whose eval/ holds two finished evaluations (steps 0 and 4) and one
    unfinished one (no summary.json), and a rules run of the same questions."""
    root = tmp_path_factory.mktemp("pilot")
    cfg = config_path("group_b_rules.toml")
    run_eval(load_config(cfg, ["limit=12"]), hotpot_dev_dir, root / "grpo1" / "eval" / "step-000000",
             show_progress=False)
    run_eval(load_config(cfg, ["limit=12", "budgets.memory_tokens=40"]), hotpot_dev_dir,
             root / "grpo1" / "eval" / "step-000004", show_progress=False)
    (root / "grpo1" / "eval" / "step-000008").mkdir()
    shutil.copytree(root / "grpo1" / "eval" / "step-000000", root / "rules")
    return root


def test_record_has_every_finished_evaluation_and_its_decision_rates(stage, hotpot_dev_dir, tmp_path):
    out = tmp_path / "pilot.json"
    assert pilot.main([str(stage / "grpo1"), "--data", str(hotpot_dev_dir),
                           "--reference", f"rules={stage / 'rules'}", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert sorted(record) == ["grpo1_step_0", "grpo1_step_4", "rules"]
    step0 = record["grpo1_step_0"]
    summary = json.loads((stage / "grpo1" / "eval" / "step-000000" / "summary.json").read_text())
    assert step0["tasks"] == 12
    assert step0["metrics"]["memory_support_recall"] == summary["metrics"]["memory_support_recall"]
    assert step0["decisions"] == decision_rates(stage / "rules", gold_facts(hotpot_dev_dir))
    assert step0 == record["rules"]
    # the 40-token memory stores less: fewer ADDs, a lower recall than the 96-token one
    assert record["grpo1_step_4"]["memory_calls"]["ops_executed"]["ADD"] < step0["memory_calls"]["ops_executed"]["ADD"]
    assert record["grpo1_step_4"]["metrics"]["memory_support_recall"] < step0["metrics"]["memory_support_recall"]


def test_refusals(stage, hotpot_dev_dir, tmp_path, capsys):
    script = pilot
    out = tmp_path / "pilot.json"
    out.write_text("{}")
    args = [str(stage / "grpo1"), "--data", str(hotpot_dev_dir), "--out", str(out)]
    assert script.main(args) == 2 and "never overwritten" in capsys.readouterr().err
    assert out.read_text() == "{}"
    # the same data folder, but the first 6 questions: not the questions the stage evaluated
    other = tmp_path / "other"
    run_eval(load_config(config_path("group_b_rules.toml"), ["limit=6"]), hotpot_dev_dir, other, show_progress=False)
    args = [str(stage / "grpo1"), "--data", str(hotpot_dev_dir), "--reference", f"rules={other}",
            "--out", str(tmp_path / "new.json")]
    assert script.main(args) == 2 and "different questions" in capsys.readouterr().err
    assert script.main([str(stage / "grpo1"), "--data", str(hotpot_dev_dir), "--reference", "rules",
                        "--out", str(tmp_path / "new.json")]) == 2
    assert "NAME=RUN_FOLDER" in capsys.readouterr().err
    assert not (tmp_path / "new.json").exists()

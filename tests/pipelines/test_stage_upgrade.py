"""Stage records of record version 2 (GRPO configs dumped flat, ``invalid_penalty`` for both
penalties, the MemAgent role ``overwrite``) are recognised by the current code when made from
the same inputs, and rewritten as the current version; a changed config is still refused.

``fixtures/version2_stage_records.json`` holds records written by memsearch at 702ab2b (record
version 2) for the published v3 protocol's two GRPO stages and a MemAgent training stage, with
the configs they were made from (the v3 study config, a MemAgent config in the earlier layout)
and the saved ``config.json`` of the stage-1 run."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from memsearch.config import config_from_tables, load_config
from memsearch.errors import InputError
from memsearch.pipelines import stage_versions
from memsearch.pipelines.memagent.config import MemAgentPipeline
from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline
from memsearch.pipelines.stage_versions import RECORD_VERSION, fingerprint, version2_dump
from memsearch.pipelines.trainer_stages import _trainer_record
from memsearch.train.distributed import Dist
from memsearch.train.run_folder import check_run_folder

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "version2_stage_records.json").read_text())


def _configs():
    mp = load_config(ROOT / FIXTURE["memory_policy_config"], FIXTURE["memory_policy_overrides"],
                     model=MemoryPolicyPipeline)
    ma = config_from_tables(tomllib.loads(FIXTURE["memagent_config"]), None, MemAgentPipeline, "memagent")
    return {"grpo1": mp.grpo_config("prepare/train", 1, "seed-1/sft/adapter", "prepare/val"),
            "grpo2": mp.stage2_config("prepare/train", 1, "seed-1/merged1", "prepare/val"),
            "memagent_train": ma.grpo_config("prepare/train")}


@pytest.mark.parametrize("name", ["grpo1", "grpo2", "memagent_train"])
def test_a_finished_version2_trainer_stage_is_recognised_and_rewritten(tmp_path, name):
    cfg, old = _configs()[name], FIXTURE["records"][name]
    record = tmp_path / f"{name}.stage.json"
    record.write_text(json.dumps(old))
    stage = _trainer_record(tmp_path / name, record, "grpo", cfg, FIXTURE["upstream"][name])
    assert stage.fingerprint != old["fingerprint"]  # the current dump is grouped
    assert stage.done()
    upgraded = json.loads(record.read_text())
    assert (upgraded["version"], RECORD_VERSION) == (4, 4)
    assert upgraded["fingerprint"] == stage.fingerprint and upgraded["fingerprint_before"] == old["fingerprint"]
    assert upgraded["complete"] is True and upgraded["outputs"] == old["outputs"]
    grpo = upgraded["inputs"]["grpo"]
    assert "clip_low" not in grpo and grpo["loss"]["clip_low"] == old["inputs"]["grpo"]["clip_low"]
    assert grpo["reward"]["invalid_call_penalty"] == old["inputs"]["grpo"]["reward"]["invalid_penalty"]
    assert grpo["role"] == {"overwrite": "memagent"}.get(old["inputs"]["grpo"]["role"], old["inputs"]["grpo"]["role"])
    assert version2_dump(stage.inputs) == old["inputs"]
    # read again: a current record, still done, not rewritten
    assert _trainer_record(tmp_path / name, record, "grpo", cfg, FIXTURE["upstream"][name]).done()
    assert json.loads(record.read_text()) == upgraded


def test_the_state_reward_of_v3_reads_under_its_new_name():
    grpo = _configs()["grpo1"]
    flat = FIXTURE["records"]["grpo1"]["inputs"]["grpo"]
    assert grpo.credit.mode == flat["credit"] == "state"
    assert grpo.credit.state_reward.rejected_batch_penalty == flat["state_reward"]["invalid_penalty"] == 0.5
    assert grpo.credit.state_reward.junk_penalty == flat["state_reward"]["junk_penalty"] == 0.25


def test_a_version2_record_made_from_another_config_is_refused_naming_the_field(tmp_path):
    cfg = _configs()["grpo1"]
    changed = cfg.model_copy(update={"loss": cfg.loss.model_copy(update={"clip_high": 0.3})})
    record = tmp_path / "grpo1.stage.json"
    record.write_text(json.dumps(FIXTURE["records"]["grpo1"]))
    stage = _trainer_record(tmp_path / "grpo1", record, "grpo", changed, FIXTURE["upstream"]["grpo1"])
    with pytest.raises(InputError, match=r"made from different inputs \(changed: grpo\.clip_high\)"):
        stage.done()
    assert json.loads(record.read_text()) == FIXTURE["records"]["grpo1"]  # left as it was


def test_version2_dump_is_the_composition_of_its_forms(monkeypatch):
    """A later form (another config's earlier dump) is one more function in VERSION2_FORMS."""
    assert stage_versions.VERSION2_FORMS and version2_dump({"a": [{"x": 1}]}) == {"a": [{"x": 1}]}
    forms = [*stage_versions.VERSION2_FORMS, lambda d: {k: v for k, v in d.items() if k != "x"}]
    monkeypatch.setattr(stage_versions, "VERSION2_FORMS", forms)
    assert version2_dump({"a": [{"x": 1, "y": {"x": 2}}]}) == {"a": [{"y": {}}]}


def test_a_run_saved_with_the_flat_config_resumes_and_a_changed_one_is_refused(tmp_path):
    """--resume compares the saved config.json read through the model: a run saved before the
    fields were grouped resumes with the same config written the new way."""
    cfg = _configs()["grpo1"]
    (tmp_path / "config.json").write_text(json.dumps(FIXTURE["flat_config_json"]))
    check_run_folder(cfg, tmp_path, resume=True, dist=Dist())
    changed = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"group_size": 3})})
    with pytest.raises(InputError, match="config differs from the run being resumed"):
        check_run_folder(changed, tmp_path, resume=True, dist=Dist())
    (tmp_path / "config.json").write_text(json.dumps(cfg.model_dump(mode="json")))  # as a run saves it now
    check_run_folder(cfg, tmp_path, resume=True, dist=Dist())


PIPELINE = json.loads((Path(__file__).parent / "fixtures" / "version2_pipeline_inputs.json").read_text())


@pytest.mark.parametrize("name", sorted(PIPELINE))
def test_every_stage_of_a_version2_pipeline_folder_is_recognised(name):
    """``fixtures/version2_pipeline_inputs.json``: the inputs every stage record held in a tiny
    memory-policy pipeline folder (stage 2 on, from SFT) made at 702ab2b (record version 2), and
    the inputs the current code gave the same stages when it continued that folder (it redid
    none). Paths are written ``$MODEL`` / ``$ROOT`` on both sides. What version 2 fingerprinted is
    one of the ways it may have dumped the current inputs: flat GRPO configs, flat backend tables,
    a pipeline's model in the rules and oracle roles it filled (teacher runs: none filled)."""
    recorded, current = PIPELINE[name]["recorded"], PIPELINE[name]["current"]
    assert fingerprint(recorded) in {fingerprint(d) for d in stage_versions.version2_dumps(current)}
    # ... and not inputs with one more setting: no candidate matches
    changed = {**current, "a_setting": 1}
    assert fingerprint(recorded) not in {fingerprint(d) for d in stage_versions.version2_dumps(changed)}

"""The GRPO config's groups and renamed fields (train.config_keys): every earlier spelling reads as
the current one, giving both is refused naming both, and the flat dump is the exact inverse."""

from __future__ import annotations

import pytest

from memsearch.config import load_config
from memsearch.errors import InputError
from memsearch.pipelines.memagent.config import MemAgentPipeline
from memsearch.train.config import GRPOConfig, RewardSettings, StateReward
from memsearch.train.config_keys import GRPO_GROUPS, flat_grpo_dump, upgrade_grpo_keys

FLAT = {"data": "x", "role": "memory", "tasks_per_step": 3, "group_size": 5, "temperature": 0.9, "top_p": 0.95,
        "max_batch_size": 7, "credit": "state", "state_group_size": 3, "global_weight": 0.25,
        "invalid_decision_credit": False, "std_scale": True, "state_reward": {"invalid_penalty": 0.2},
        "clip_low": 0.1, "clip_high": 0.3, "dual_clip": 2.5, "aggregation": "constant", "aggregation_tokens": 99,
        "kl_coef": 0.01, "kl_reference": "base", "epochs": 2, "mini_batches_per_step": 3,
        "micro_batch_tokens": 512, "share_prompts": True, "disable_dropout": False,
        "reward": {"invalid_penalty": 0.3, "metric": "em"}}


def test_each_group_holds_the_fields_its_table_declares():
    cfg = GRPOConfig(data="x")
    for group, fields in GRPO_GROUPS.items():
        assert tuple(type(getattr(cfg, group)).model_fields) == fields, group
    grouped = {name for fields in GRPO_GROUPS.values() for name in fields}
    assert not grouped & set(GRPOConfig.model_fields)  # none is left at the top as well


def test_the_flat_spelling_reads_as_the_grouped_one():
    flat = GRPOConfig.model_validate(FLAT)
    grouped = GRPOConfig(
        data="x", role="memory",
        rollout={"tasks_per_step": 3, "group_size": 5, "temperature": 0.9, "top_p": 0.95, "max_batch_size": 7},
        credit={"mode": "state", "state_group_size": 3, "global_weight": 0.25, "invalid_decision_credit": "none",
                "std_scale": True, "state_reward": {"rejected_batch_penalty": 0.2}},
        loss={"clip_low": 0.1, "clip_high": 0.3, "dual_clip": 2.5, "aggregation": "constant",
              "aggregation_tokens": 99, "kl_coef": 0.01, "kl_reference": "base"},
        update={"epochs": 2, "mini_batches_per_step": 3, "micro_batch_tokens": 512, "share_prompts": True,
                "disable_dropout": False},
        reward={"invalid_call_penalty": 0.3, "metric": "em"})
    assert flat == grouped
    assert (flat.loss.clip_low, flat.credit.mode, flat.update.epochs, flat.rollout.group_size) == (0.1, "state", 2, 5)
    assert flat.credit.state_reward == StateReward(rejected_batch_penalty=0.2)
    assert flat.reward == RewardSettings(invalid_call_penalty=0.3, metric="em")
    # a flat key beside a group table of other keys: merged
    assert GRPOConfig(data="x", clip_low=0.1, loss={"clip_high": 0.3}).loss == grouped.loss.model_copy(
        update={"dual_clip": 3.0, "aggregation": "trajectory", "aggregation_tokens": 256, "kl_coef": 0.0,
                "kl_reference": "start"})


def test_the_flat_dump_is_the_earlier_layout_exactly():
    dump = GRPOConfig.model_validate(FLAT).model_dump(mode="json")
    flat = flat_grpo_dump(dump)
    assert set(flat) == (set(dump) - set(GRPO_GROUPS)) | {"credit" if name == "mode" else name
                                                           for fields in GRPO_GROUPS.values() for name in fields}
    assert (flat["credit"], flat["clip_low"], flat["invalid_decision_credit"]) == ("state", 0.1, "none")
    assert flat["reward"]["invalid_penalty"] == 0.3 and "invalid_call_penalty" not in flat["reward"]
    assert flat["state_reward"]["invalid_penalty"] == 0.2 and "rejected_batch_penalty" not in flat["state_reward"]
    assert GRPOConfig.model_validate(flat) == GRPOConfig.model_validate(dump)  # and it reads back
    assert flat_grpo_dump({"a": 1}) == {"a": 1}  # anything else is left alone


@pytest.mark.parametrize("fields, named", [
    ({"clip_low": 0.1, "loss": {"clip_low": 0.2}}, "clip_low and loss.clip_low are one setting"),
    ({"credit": "share", "global_weight": 0.5, "std_scale": True, "credit_x": 1}, None),
    ({"reward": {"invalid_penalty": 0.1, "invalid_call_penalty": 0.2}},
     "reward.invalid_penalty and reward.invalid_call_penalty are one setting"),
    ({"state_reward": {"invalid_penalty": 0.1}, "credit": {"state_reward": {"rejected_batch_penalty": 0.2}}},
     "credit.state_reward.invalid_penalty and credit.state_reward.rejected_batch_penalty are one setting"),
    ({"state_reward": {"gold_gain": 0.1}, "credit": {"state_reward": {"gold_gain": 0.2}}},
     "state_reward.gold_gain and credit.state_reward.gold_gain are one setting"),
])
def test_both_spellings_of_one_setting_are_refused_naming_both(fields, named):
    if named is None:  # different settings in both spellings are merged; an unknown key stays unknown
        with pytest.raises(ValueError, match="credit_x"):
            GRPOConfig(data="x", **fields)
        assert upgrade_grpo_keys(fields)["credit"] == {"mode": "share", "global_weight": 0.5, "std_scale": True}
        return
    with pytest.raises(ValueError, match=named):
        GRPOConfig(data="x", **fields)


def test_the_memagent_role_reads_its_earlier_name():
    episode = {"agent": {"evidence": "stream", "memory": "overwrite", "controller": "exhaust"}}
    assert GRPOConfig(data="x", role="overwrite", episode=episode).role == "memagent"
    assert GRPOConfig(data="x", role="memagent", episode=episode).model_dump()["role"] == "memagent"
    with pytest.raises(ValueError, match="'memagent' needs episode.agent.memory = 'overwrite'"):
        GRPOConfig(data="x", role="overwrite")


def test_set_flags_of_either_spelling_and_the_trainer_table_of_a_pipeline(tmp_path):
    cfg = load_config(None, ['data="x"', "clip_high=0.3", "rollout.group_size=6"], model=GRPOConfig)
    assert (cfg.loss.clip_high, cfg.rollout.group_size) == (0.3, 6)
    with pytest.raises(InputError, match="clip_high and loss.clip_high are one setting"):
        load_config(None, ['data="x"', "clip_high=0.3", "loss.clip_high=0.2"], model=GRPOConfig)
    # a MemAgent pipeline config of the earlier layout: [train], flat keys, invalid_penalty
    earlier = tmp_path / "memagent.toml"
    earlier.write_text('pipeline = "memagent"\n[episode.agent]\nevidence = "stream"\nmemory = "overwrite"\n'
                       'controller = "exhaust"\n[train]\ngroup_size = 3\ncredit = "split"\n'
                       '[train.reward]\ninvalid_penalty = 0.0\n')
    grpo = load_config(earlier, model=MemAgentPipeline).grpo_config("data")
    assert (grpo.role, grpo.rollout.group_size, grpo.credit.mode, grpo.reward.invalid_call_penalty) == \
        ("memagent", 3, "split", 0.0)
    same = load_config(earlier, ["grpo.loss.kl_coef=0.01"], model=MemAgentPipeline).grpo_config("data")
    assert same == grpo.model_copy(update={"loss": grpo.loss.model_copy(update={"kl_coef": 0.01})})
    with pytest.raises(InputError, match="train.credit and grpo.credit are one setting"):
        load_config(earlier, ['grpo.credit.mode="share"'], model=MemAgentPipeline)


def test_a_set_in_the_current_spelling_wins_over_a_trainer_file_in_the_earlier_one(tmp_path):
    # The file is put in the current spelling before the command line applies: the --set wins.
    earlier = tmp_path / "grpo.toml"
    earlier.write_text('data = "x"\ncredit = "state"\nstd_scale = true\nclip_high = 0.3\n', encoding="utf-8")
    cfg = load_config(earlier, ["credit.mode=share", "loss.clip_high=0.25"], model=GRPOConfig)
    assert (cfg.credit.mode, cfg.credit.std_scale, cfg.loss.clip_high) == ("share", True, 0.25)
    assert load_config(earlier, ["clip_high=0.2"], model=GRPOConfig).loss.clip_high == 0.2  # its own spelling too
    # a file giving one setting in both spellings is refused naming the file and both keys
    both = tmp_path / "both.toml"
    both.write_text('data = "x"\nclip_high = 0.3\n[loss]\nclip_high = 0.2\n', encoding="utf-8")
    with pytest.raises(InputError, match=f"{both}.*clip_high and loss.clip_high are one setting"):
        load_config(both, ["credit.mode=share"], model=GRPOConfig)


def test_a_published_config_takes_overrides_in_its_own_spelling_and_says_so_for_the_other():
    """The v3 study config is written the earlier way (it is the record of what ran): an override
    in that spelling replaces its value; one in the current spelling names both and says which to
    give, since a --set merges into the file before either is read."""
    from pathlib import Path

    from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline

    v3 = Path(__file__).resolve().parents[2] / "studies" / "memory_policy" / "configs" / "memory_policy_cpu_v3.toml"
    assert load_config(v3, ["grpo.group_size=2"], model=MemoryPolicyPipeline).grpo.rollout.group_size == 2
    with pytest.raises(InputError) as refused:
        load_config(v3, ["grpo.rollout.group_size=2"], model=MemoryPolicyPipeline)
    assert ("group_size and rollout.group_size are one setting, in its earlier and its current spelling; give it "
            "once: rollout.group_size, or group_size where the config file it overrides spells it so"
            ) in str(refused.value)

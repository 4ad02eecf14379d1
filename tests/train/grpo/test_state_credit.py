"""State groups (``credit = "state"``, ``train.grpo.state_credit``): the per-call reward on hand-made
branches, every branch a row with its own group-relative advantage, and the global term only on
the branch the episode continued from."""

from __future__ import annotations

import pytest

from memsearch.data.records import Label
from memsearch.records.events import BranchOutcome, PolicyCall
from memsearch.records.trajectory import Trajectory
from memsearch.train.config import StateReward
from memsearch.train.grpo.state_credit import build_state_batch, call_reward

GOLD = {"d1:0", "d2:3"}
BEFORE = {"kept": ["d1:0"], "cited": ["d1:0"]}
SETTINGS = StateReward(gold_gain=1.0, junk_penalty=0.5, overflow_penalty=0.5, rejected_batch_penalty=0.4)


def memory_call(before):
    """A memory call whose memory kept and cited ``before``'s ids before its branches."""
    return PolicyCall(role="memory", step=0, kept_before=tuple(before["kept"]), cited_before=tuple(before["cited"]))


def branch(status="applied", kept=("d1:0",), cited=("d1:0",), over=0, ids=(7, 8)):
    return {"status": status, "kept": list(kept), "cited": list(cited), "over_budget_tokens": over,
            "budget_tokens": 100, "completion_ids": list(ids), "logprobs": [-0.1] * len(ids), "error": None,
            "constraint_id": None}


@pytest.mark.parametrize("b, reward", [
    (branch(), 0.0),  # NOOP: nothing new
    (branch(kept=("d1:0", "d2:3"), cited=("d1:0", "d2:3")), 0.5),  # one more gold of two, faithfully kept
    (branch(kept=("d1:0",), cited=("d1:0", "d2:3")), 0.0),  # gold cited by an unfaithful item: no gain, no junk
    (branch(kept=("d1:0", "d2:3", "d5:1"), cited=("d1:0", "d2:3", "d5:1", "d6:0")), 0.5 - 0.5 * 2 / 2),  # 2 junk
    (branch(kept=(), cited=()), -0.5),  # DELETE of the faithful gold item
    (branch(status="rejected", over=1), -0.5 * (0.5 + 0.5 * 0.01)),  # one token over: half the penalty
    (branch(status="rejected", over=250), -0.5),  # far over: the whole penalty
    (branch(status="rejected"), -0.4),  # another rule
    (branch(status="parse_error"), -0.4),
])
def test_call_reward_hand_computed(b, reward):
    assert call_reward(BranchOutcome.from_json(b), memory_call(BEFORE), GOLD, SETTINGS) == pytest.approx(reward)


def test_no_gold_facts_only_penalties_count():
    noop, rejected = (BranchOutcome.from_json(b) for b in (branch(kept=("d9:0",), cited=("d9:0",)),
                                                          branch(status="rejected")))
    assert call_reward(noop, memory_call(BEFORE), set(), SETTINGS) == 0.0
    assert call_reward(rejected, memory_call(BEFORE), set(), SETTINGS) == -0.4


def trajectory(task, calls):
    return Trajectory.from_json({"task_id": task, "status": "ok", "events": [
        {"type": "policy_call", "role": "memory", "step": s, "prompt_ids": [1, 2, 3], "error": None,
         "completion_ids": [7], "logprobs": [-0.1], "branches": bs, "branch_chosen": chosen,
         "kept_before": before["kept"], "cited_before": before["cited"]}
        for s, (bs, chosen, before) in enumerate(calls)]})


def test_every_branch_is_a_row_with_its_state_groups_advantage():
    empty = {"kept": [], "cited": []}
    good = branch(kept=("d1:0",), cited=("d1:0",))
    calls = [([branch(kept=(), cited=()), good, branch(status="rejected", over=100)], 1, empty),  # 0, .5, -.5
             ([branch(), branch()], 0, BEFORE)]  # two NOOPs from the same state: no spread
    trajs = [[trajectory("q1", calls), trajectory("q1", calls[:1])]]
    labels = {"q1": Label(id="q1", answers=["x"], supporting_facts=sorted(GOLD), gold_doc_ids=["d1", "d2"])}
    batch = build_state_batch(trajs, [[1.0, 0.0]], labels, SETTINGS, std_scale=False, global_weight=0.0,
                              generated=8)
    assert len(batch.rows) == 8 and batch.counts.converted == 8
    assert batch.groups == 3 and batch.zero_variance_groups == 1
    assert [r.advantage for r in batch.rows] == pytest.approx([0.0, 0.5, -0.5, 0.0, 0.0, 0.0, 0.5, -0.5])
    assert [r.trajectory for r in batch.rows] == [0] * 5 + [1] * 3
    assert len({r.group_index for r in batch.rows}) == 3
    assert [r.valid for r in batch.rows] == [True, True, False, True, True] * 1 + [True, True, False]
    assert [r.over_budget for r in batch.rows] == [False, False, True, False, False, False, False, True]
    assert batch.rows_per_trajectory == [5, 3] and batch.call_rewards[:3] == pytest.approx([0.0, 0.5, -0.5])
    # the global term: trajectory advantages +0.5 / -0.5, weighted, on the continued branch only
    batch = build_state_batch(trajs, [[1.0, 0.0]], labels, SETTINGS, std_scale=False, global_weight=0.2,
                              generated=8)
    assert [r.advantage for r in batch.rows] == pytest.approx([0.0, 0.6, -0.5, 0.1, 0.0, 0.0, 0.4, -0.5])


def test_a_failed_branch_has_no_row_and_a_call_without_branches_is_refused():
    failed = {**branch(), "error": "timeout", "completion_ids": None}
    trajs = [[trajectory("q1", [([failed, branch(kept=(), cited=())], 1, BEFORE)])]]
    labels = {"q1": Label(id="q1", answers=["x"], supporting_facts=sorted(GOLD), gold_doc_ids=["d1", "d2"])}
    batch = build_state_batch(trajs, [[0.0]], labels, SETTINGS, std_scale=False, global_weight=0.0, generated=1)
    assert len(batch.rows) == 1 and batch.counts.failed_calls == 1 and batch.rows[0].advantage == 0.0
    plain = [[Trajectory.from_json({"task_id": "q1", "status": "ok",
                                    "events": [{"type": "policy_call", "role": "memory", "step": 0}]})]]
    with pytest.raises(ValueError, match="without branches"):
        build_state_batch(plain, [[0.0]], labels, SETTINGS, std_scale=False, global_weight=0.0, generated=0)


@pytest.mark.slow
def test_a_grpo_step_with_state_groups_on_the_tiny_llama(tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, tmp_path):
    """Schema-mode rollouts branch every memory call 3 ways: every branch is a row (the row-count
    contract counts them), each call's event carries its branches, and the episode went on from
    the branch it names (the memory after the call is that branch's)."""
    import json

    from tests.train.grpo.test_grpo import grpo_config

    from memsearch.train.grpo.trainer import train_grpo

    cfg = grpo_config(tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, steps=1, group_size=2,
                      credit="state", state_group_size=3, schema_mode=True, invalid_decision_credit=False,
                      **{"episode.budgets.policy_tokens": 48, "episode.budgets.memory_tokens": 96})
    train_grpo(cfg, tmp_path / "run", echo=lambda m: None)
    (record,) = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    trajectories = [json.loads(x) for x in next((tmp_path / "run" / "rollouts").glob("*.jsonl")).read_text()
                    .splitlines()]
    calls = [e for t in trajectories for e in t["events"] if e["type"] == "policy_call" and e["role"] == "memory"]
    memory_events = [e for t in trajectories for e in t["events"] if e["type"] == "memory"]
    assert calls and all(len(c["branches"]) == 3 for c in calls)
    assert record["rows_generated"] == record["rows_converted"] == record["rows_consumed"] == 3 * len(calls)
    assert record["trajectories"] == 2 * 2  # 2 tasks x group 2
    assert record["groups"] == len(calls) and record["call_reward_mean"] is not None
    for call, event in zip(calls, memory_events, strict=True):
        chosen = call["branches"][call["branch_chosen"]]
        assert call["completion_ids"] == chosen["completion_ids"] and call["text"] == chosen["text"]
        assert event["valid"] == (chosen["status"] == "applied")
        assert len({tuple(b["completion_ids"]) for b in call["branches"]}) > 1  # three different samples
    # invalid_decision_credit = false: the op-choosing tokens of every invalid branch left the loss
    from transformers import AutoTokenizer

    from memsearch.train.grpo.decisions import decision_positions

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    invalid = [b for c in calls for b in c["branches"] if b["status"] != "applied"]
    assert invalid and record["masked_decision_tokens"] > 0  # the tiny model's 48-token items do not all fit
    assert record["masked_decision_tokens"] == sum(len(decision_positions(b["completion_ids"], tokenizer, "memory"))
                                                   for b in invalid)


@pytest.mark.slow
def test_extractive_state_groups_sample_only_valid_ops_and_replay_their_per_call_masks(
        tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, tmp_path):
    """The extractive format (``agent.memory_format``) in schema mode: every branch is sampled under
    its call's own constraint, so every one is an op the memory accepts, and the update rebuilds
    each constraint from the row's id: the recomputed log-probs equal the sampled ones."""
    import json

    from tests.train.grpo.test_grpo import grpo_config

    from memsearch.train.grpo.trainer import train_grpo

    cfg = grpo_config(tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, steps=1, group_size=2,
                      credit="state", state_group_size=3, schema_mode=True,
                      **{"episode.budgets.policy_tokens": 48, "episode.budgets.memory_tokens": 96,
                         "episode.agent.memory_format": "extractive"})
    train_grpo(cfg, tmp_path / "run", echo=lambda m: None)
    (record,) = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    trajectories = [json.loads(x) for x in next((tmp_path / "run" / "rollouts").glob("*.jsonl")).read_text()
                    .splitlines()]
    calls = [e for t in trajectories for e in t["events"] if e["type"] == "policy_call" and e["role"] == "memory"]
    branches = [b for c in calls for b in c["branches"]]
    assert calls and all(b["constraint_id"].startswith("memory-extract-v1:") for b in branches)
    # Only a completion cut at the 48-token limit can fail (an open item's text not yet closed).
    assert all(b["status"] == "applied" or len(b["completion_ids"]) == 48 for b in branches), \
        [(b["text"], b["reasons"]) for b in branches if b["status"] != "applied"]
    assert sum(b["status"] == "applied" for b in branches) > len(branches) / 2
    assert record["rows_generated"] == record["rows_consumed"] == 3 * len(calls)
    assert record["logprob_mismatch"] < 1e-4  # the masks replayed from the ids are the sampled ones

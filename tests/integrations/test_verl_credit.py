"""Split and state credit on verl without verl (main environment): real sessions of the engine
through the agent loop's rollout (``run_session``, scripted server, real tokenizer ids), their
per-row credit records, and ``credit.row_advantages`` against memsearch's own trainer
(``build_batch`` / ``build_state_batch``) row by row; bad input named by row. The verl lane
(``test_verl_lane.py``) runs the same records through verl's TransferQueue and the registered
trainer."""

from __future__ import annotations

import asyncio

import pytest

from memsearch.data.dataset import load_dataset
from memsearch.integrations.verl.backend import VerlPolicyBackend
from memsearch.integrations.verl.config import load_grpo_config, rows_per_session, verl_overrides
from memsearch.integrations.verl.credit import CreditRecord, CreditRecordError, row_advantages
from memsearch.integrations.verl.session import run_session, worker_setup
from memsearch.testing.scripted_server import ScriptedServer
from memsearch.train.grpo.batch import build_batch
from memsearch.train.grpo.reward import trajectory_reward
from memsearch.train.grpo.state_credit import build_state_batch
from memsearch.train.sft.trainer import chat_prompt_ids

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    from memsearch.assets.embedded import tokenizer_dir

    return AutoTokenizer.from_pretrained(str(tokenizer_dir()))


def sessions(config: str, tokenizer, task_ids, n: int = 2, training: bool = True):
    """``n`` sessions of each task, as verl keys them: ``[(uid, [(session key, rollout), ...]), ...]``."""
    setup = worker_setup(config)

    async def encode(messages):
        return chat_prompt_ids(tokenizer, messages)

    out = []
    for t, task_id in enumerate(task_ids):
        group = []
        for s in range(n):
            # variants shifted per session: the sessions of a task reach different memories
            server = ScriptedServer(tokenizer, memory_variants=3)
            server.memory_requests = s
            policy = VerlPolicyBackend(server, encode, lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                                       SAMPLING, prompt_length=4096, response_length=512)
            key = f"uid{t}_{s}"
            group.append((key, asyncio.run(run_session(setup, task_id, policy, training=training, session=key))))
        out.append((f"uid{t}", group))
    return setup, out


def flat(groups, rewards):
    """verl's view of the sessions: row keys, records, each row's session score, padding flags."""
    keys, records, scores = [], [], []
    for (_, group), group_rewards in zip(groups, rewards, strict=True):
        for (key, rollout), reward in zip(group, group_rewards, strict=True):
            for i, record in enumerate(rollout.records):
                keys.append(f"{key}_{i}")
                records.append(record.to_json())
                scores.append(reward)
    return keys, records, scores, [False] * len(keys)


def session_rewards(setup, groups):
    labels = setup.labels
    return [[trajectory_reward(r.trajectory, labels[r.trajectory.task_id], setup.cfg.reward, "memory")
             for _, r in group] for _, group in groups]


@pytest.mark.parametrize("std_scale", [False, True])
def test_state_credit_rows_and_advantages_equal_memsearch_trainer(credit_case, hf_tokenizer, hotpot_dev_dir, std_scale):
    config = credit_case("state", state_group_size=3, global_weight=0.5, std_scale=std_scale)
    dev = load_dataset(hotpot_dev_dir).tasks
    setup, groups = sessions(config, hf_tokenizer, [dev[1].id, dev[5].id])  # task 5: sessions answer differently
    rewards = session_rewards(setup, groups)
    assert rewards[0][0] == rewards[0][1] and rewards[1][0] != rewards[1][1]  # the global term, 0 and not
    keys, records, scores, padding = flat(groups, rewards)
    trajectories = [[r.trajectory for _, r in group] for _, group in groups]
    reference = build_state_batch(trajectories, rewards, setup.labels, setup.cfg.credit.state_reward,
                                  std_scale=std_scale, global_weight=0.5, generated=len(keys))
    # one verl row per branch of each memory call: 2 searches x 3 branches per session
    assert len(keys) == len(reference.rows) == 2 * 2 * 2 * 3
    for (_, group) in groups:
        for _, rollout in group:
            calls = rollout.trajectory.policy_calls(["memory"])
            assert [len(c.branches) for c in calls] == [3, 3]
            assert all(c.budget_left is not None for c in calls)  # a branched call records it too
            assert [r.call for r in rollout.records] == [c.step for c in calls for _ in range(3)]
            # the rows are the branches' own tokens, and the continued branch is the call's
            assert [o["response_ids"] for o in rollout.outputs] == [list(b.completion_ids) for c in calls
                                                                    for b in c.branches]
            assert [r.continued for r in rollout.records] == [k == c.branch_chosen for c in calls for k in range(3)]
    got = row_advantages(keys, records, scores, padding, group_size=2, std_scale=std_scale)
    assert [row.completion_ids for row in reference.rows] == [o["response_ids"] for _, g in groups for _, r in g
                                                             for o in r.outputs]
    assert got.advantages == pytest.approx([row.advantage for row in reference.rows], abs=1e-6)
    assert got.call_rewards == pytest.approx(reference.call_rewards, abs=1e-12)
    assert got.state_groups == reference.groups == 8
    assert got.zero_variance_state_groups == reference.zero_variance_groups
    assert got.state_groups - got.zero_variance_state_groups >= 2  # the branches decided differently
    assert any(abs(a) > 1e-3 for a in got.advantages)
    assert got.metrics()["memsearch/state_groups"] == 8.0


def test_split_credit_advantages_equal_memsearch_trainer_and_a_lone_session_gets_zero(credit_case, hf_tokenizer,
                                                                                     hotpot_dev_dir):
    config = credit_case("split")
    tasks = [t.id for t in load_dataset(hotpot_dev_dir).tasks[1:3]]
    setup, groups = sessions(config, hf_tokenizer, tasks)
    rewards = session_rewards(setup, groups)
    assert any(len(set(r)) > 1 for r in rewards)  # a group with variance
    keys, records, scores, padding = flat(groups, rewards)
    trajectories = [[r.trajectory for _, r in group] for _, group in groups]
    reference = build_batch(trajectories, rewards, "memory", "split", False, generated=len(keys))
    got = row_advantages(keys, records, scores, padding, group_size=2, std_scale=False)
    assert len(keys) == len(reference.rows) == 8
    assert got.advantages == pytest.approx([row.advantage for row in reference.rows], abs=1e-6)
    assert got.groups_without_baseline == 0
    # verl's padding rows copy the first row's fields (its record too): advantage 0, in no group
    padded = row_advantages([*keys, "padx_0_0", "padx_1_0"], [*records, records[0], records[0]], [*scores, 0, 0],
                            [*padding, True, True], group_size=2, std_scale=False)
    assert padded.advantages == [*got.advantages, 0.0, 0.0]
    # the first task's second session failed (it returns no row): its sibling has no baseline
    lone = [i for i, k in enumerate(keys) if not k.startswith("uid0_1_")]
    alone = row_advantages([keys[i] for i in lone], [records[i] for i in lone], [scores[i] for i in lone],
                           [False] * len(lone), group_size=2, std_scale=False)
    assert alone.groups_without_baseline == 1
    assert [a for i, a in zip(lone, alone.advantages, strict=True) if keys[i].startswith("uid0")] == [0.0, 0.0]
    kept = [a for i, a in zip(lone, alone.advantages, strict=True) if keys[i].startswith("uid1")]
    assert kept == pytest.approx([a for k, a in zip(keys, got.advantages, strict=True) if k.startswith("uid1")])


def test_a_failed_trajectory_gives_no_row_and_a_validation_row_no_branches(credit_case, hf_tokenizer, hotpot_dev_dir):
    config = credit_case("state", state_group_size=3)
    task = load_dataset(hotpot_dev_dir).tasks[1].id
    setup = worker_setup(config)
    tokenizer = hf_tokenizer

    async def encode(messages):
        return chat_prompt_ids(tokenizer, messages)

    def rollout(prompt_length, training=True):
        policy = VerlPolicyBackend(ScriptedServer(tokenizer, memory_variants=3), encode,
                                   lambda ids: tokenizer.decode(ids, skip_special_tokens=True), SAMPLING,
                                   prompt_length=prompt_length, response_length=512)
        return asyncio.run(run_session(setup, task, policy, training=training))

    failed = rollout(prompt_length=300)  # every memory prompt refused: request errors, the trajectory failed
    assert failed.trajectory.counts.request_errors > 0 and failed.outputs == [] and failed.records == []
    validation = rollout(prompt_length=4096, training=False)
    assert all(c.branches is None for c in validation.trajectory.policy_calls(["memory"]))
    assert len(validation.outputs) == 2 and {r.mode for r in validation.records} == {"share"}


def _records(mode="split", rows=2, **kw):
    return [CreditRecord(mode, i, rows, False, **kw).to_json() for i in range(rows)]


def test_bad_records_are_named_by_row_never_a_silent_share():
    keys = ["u_0_0", "u_0_1", "u_1_0", "u_1_1"]
    good = _records() + _records()
    scores = [1.0, 1.0, 0.0, 0.0]
    pad = [False] * 4
    assert row_advantages(keys, good, scores, pad, group_size=2, std_scale=False).advantages == [0.25, 0.25,
                                                                                                 -0.25, -0.25]
    # an old loop (no record on a row)
    with pytest.raises(CreditRecordError, match="row u_1_0: no extra_fields\\['memsearch_credit'\\]"):
        row_advantages(keys, [*good[:2], None, good[3]], scores, pad, group_size=2, std_scale=False)
    # a record of no known mode
    with pytest.raises(CreditRecordError, match="row u_0_0: credit mode 'shared'; expected one of share, split, state"):
        row_advantages(keys, _records("shared") + _records(), scores, pad, group_size=2, std_scale=False)
    # a row lost between the loop and the update
    with pytest.raises(CreditRecordError, match="session u_1: rows \\[0\\] in the batch, its records say \\[2\\]"):
        row_advantages(keys[:3], good[:3], scores[:3], pad[:3], group_size=2, std_scale=False)
    # verl's std setting edited by hand against the memsearch config
    with pytest.raises(CreditRecordError, match="row u_0_0: the memsearch config has credit.std_scale = False"):
        row_advantages(keys, good, scores, pad, group_size=2, std_scale=True)
    # rows of two configs in one batch
    with pytest.raises(CreditRecordError, match="row u_1_0: credit mode 'share', other rows of the batch 'split'"):
        row_advantages(keys, good[:2] + _records("share"), scores, pad, group_size=2, std_scale=False)
    # a record moved to another row
    with pytest.raises(CreditRecordError, match="row u_0_1: its record names row 0"):
        row_advantages(keys, [good[0], good[0], *good[2:]], scores, pad, group_size=2, std_scale=False)
    # different scores within one session
    with pytest.raises(CreditRecordError, match="session u_0: its rows carry different scores"):
        row_advantages(keys, good, [1.0, 0.5, 0.0, 0.0], pad, group_size=2, std_scale=False)
    # state records without their branch fields; a state group with two continued branches
    with pytest.raises(CreditRecordError, match="row u_0_0: a state-mode record without call"):
        row_advantages(keys, _records("state") * 2, scores, pad, group_size=2, std_scale=False)
    two = [CreditRecord("state", i, 2, False, call=0, continued=True, call_reward=0.1 * i).to_json() for i in range(2)]
    with pytest.raises(CreditRecordError, match="session u_0, memory call 0: 2 continued branches"):
        row_advantages(keys, two * 2, scores, pad, group_size=2, std_scale=False)


def test_a_state_group_of_one_branch_gets_zero_and_the_global_term_only():
    # one branch answered at call 0 (the others failed), three at call 1; global weight 1
    def rec(i, call, continued, reward):
        return CreditRecord("state", i, 4, False, call=call, continued=continued, call_reward=reward,
                            global_weight=1.0).to_json()

    session0 = [rec(0, 0, True, 0.5), rec(1, 1, False, 0.0), rec(2, 1, True, 1.0), rec(3, 1, False, -1.0)]
    keys = [f"u_0_{i}" for i in range(4)] + [f"u_1_{i}" for i in range(4)]
    got = row_advantages(keys, session0 * 2, [1.0] * 4 + [0.0] * 4, [False] * 8, group_size=2, std_scale=False)
    # session 0's group advantage is +0.5, session 1's -0.5 (rewards 1 and 0), on the continued rows only
    assert got.advantages == pytest.approx([0.5, 0.0, 1.5, -1.0, -0.5, 0.0, 0.5, -1.0])
    assert got.zero_variance_state_groups == 2 and got.state_groups == 4


def test_verl_config_names_the_registered_trainer_for_split_and_state(verl_case, credit_case, tmp_path):
    from typer.testing import CliRunner

    from memsearch.cli.app import app

    for mode, extra in (("split", {}), ("state", {"state_group_size": 3})):
        config = credit_case(mode, **extra)
        result = CliRunner().invoke(app, ["verl", "config", "--config", config, "--set", "model=/models/m",
                                          "--train-files", "t.parquet", "--agent-loops", tmp_path / "loops.yaml"])
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert "trainer.v1.trainer_mode=memsearch" in lines
        assert ("+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES="
                "memsearch.integrations.verl.trainer") in lines
    # state: a row per branch; the mini-batch counts them (2 tasks x 2 searches x 3 branches)
    cfg = load_grpo_config(credit_case("state", state_group_size=3), ["model=/models/m"])
    assert rows_per_session(cfg)[0] == 6.0
    overrides = dict(o.split("=", 1) for o in verl_overrides(cfg, "l.yaml", "t.parquet", gpus=1, rollout="vllm",
                                                                tensor_parallel=1)[0])
    assert overrides["actor_rollout_ref.actor.ppo_mini_batch_size"] == "12"
    share = load_grpo_config(verl_case("group_b"), ["model=/models/m"])
    assert not any("trainer_mode" in o for o in verl_overrides(share, "l.yaml", "t.parquet")[0])

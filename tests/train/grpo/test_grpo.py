"""GRPO end to end through the episode engine, on a tiny real Llama (random weights) for speed:
exact resume, the row-count contract in the log, refusals, and two gloo ranks via torchrun."""

from __future__ import annotations

import json

import pytest
import torch

from memsearch.config import load_config
from memsearch.errors import InputError
from memsearch.train.config import GRPOConfig
from memsearch.train.grpo.trainer import step_task_positions, train_grpo

CONFIG = """
role = "memory"
steps = 4
tasks_per_step = 2
group_size = 2
checkpoint_every = 1
keep_checkpoints = 4
kl_coef = 0.1
reward.invalid_call_penalty = 0.5
[lora]
r = 4
alpha = 8.0
target_modules = ["q_proj", "v_proj"]
[optim]
lr = 0.01
[episode]
tokenizer = "embedded"
[episode.budgets]
evidence_tokens = 64
passages_per_search = 1
max_searches = 2
memory_tokens = 64
policy_tokens = 12
answer_tokens = 16
[episode.backends.reader]
kind = "rules"
"""


def grpo_config(tmp_path, model, adapter, data, **extra) -> GRPOConfig:
    path = tmp_path / "grpo.toml"
    path.write_text(CONFIG)
    sets = [f"model={json.dumps(str(model))}", f"adapter={json.dumps(str(adapter))}", f"data={json.dumps(str(data))}"]
    sets += [f"{k}={json.dumps(v)}" for k, v in extra.items()]
    return load_config(path, sets, model=GRPOConfig)


class Crash(Exception):
    pass


def crash_after(step: int):
    def echo(message: str) -> None:
        if message.startswith(f"step {step}/"):
            raise Crash(message)

    return echo


def checkpoint_state(folder):
    from safetensors.torch import load_file

    weights = load_file(str(folder / "adapter" / "adapter_model.safetensors"))
    trainer = torch.load(folder / "trainer.pt", weights_only=False)
    return weights, trainer["optimizer"]


def assert_same_optimizer(a, b):
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        for name, value in a["state"][k].items():
            other = b["state"][k][name]
            assert torch.equal(value, other) if torch.is_tensor(value) else value == other


@pytest.mark.slow
def test_resume_after_a_crash_equals_an_uninterrupted_run(tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, tmp_path):
    # Schema mode with room for a whole op: some rollouts write valid ops, others do not, so groups
    # have a reward spread and steps update (a step whose advantages are all 0 is skipped).
    cfg = grpo_config(tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, kl_reference="base",
                      schema_mode=True, **{"episode.budgets.policy_tokens": 40})
    train_grpo(cfg, tmp_path / "straight", echo=lambda m: None)
    with pytest.raises(Crash):
        train_grpo(cfg, tmp_path / "crashed", echo=crash_after(2))
    assert not (tmp_path / "crashed" / "checkpoints" / "step-000003").exists()
    train_grpo(cfg, tmp_path / "crashed", resume=True, echo=lambda m: None)

    w1, o1 = checkpoint_state(tmp_path / "straight" / "checkpoints" / "step-000004")
    w2, o2 = checkpoint_state(tmp_path / "crashed" / "checkpoints" / "step-000004")
    assert w1.keys() == w2.keys()
    for k in w1:
        assert torch.equal(w1[k], w2[k]), k
    assert_same_optimizer(o1, o2)
    # the weights did move (steps with a reward spread updated them) so equality means something
    from safetensors.torch import load_file

    init = load_file(str(tiny_adapter_dir / "adapter_model.safetensors"))
    assert any(not torch.equal(init[k], w1[k]) for k in w1)

    logs = [[json.loads(line) for line in (tmp_path / run / "train_log.jsonl").read_text().splitlines()]
            for run in ("straight", "crashed")]
    assert [r["step"] for r in logs[1]] == [1, 2, 3, 4]  # no duplicated step after the resume
    # logprob_mismatch is float round-off (~1e-6) of a decode whose batches depend on timing: bounded, not equal
    timing = {"rollout_s", "step_s", "logprob_mismatch", "logprob_mismatch_mean"}
    assert all(r["logprob_mismatch"] < 1e-4 for log in logs for r in log)
    assert [{k: v for k, v in r.items() if k not in timing} for r in logs[0]] == \
           [{k: v for k, v in r.items() if k not in timing} for r in logs[1]]
    for record in logs[0]:
        assert record["rows_generated"] == record["rows_converted"] == record["rows_consumed"] > 0
        assert record["trajectories"] == 4 and record["groups"] == 2
        assert record["logprob_mismatch"] < 1e-4  # rollout log-probs = trainer's recomputation (fp32)
        assert 0 <= record["logprob_mismatch_mean"] <= record["logprob_mismatch"]
    assert (tmp_path / "straight" / "adapter" / "adapter_config.json").is_file()
    assert len(list((tmp_path / "straight" / "rollouts").glob("step-*.jsonl"))) == 4


def test_refusals(tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, hotpot_dev_dir, tmp_path):
    from memsearch.train.distributed import Dist
    from memsearch.train.run_folder import prepare_run_folder

    cfg = grpo_config(tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_dev_dir)
    with pytest.raises(InputError, match="split is 'dev'; GRPO trains on a train split only"):
        train_grpo(cfg, tmp_path / "dev-run")
    assert not (tmp_path / "dev-run").exists()  # refused before the run folder is made: a rerun is not blocked
    (tmp_path / "exists").mkdir()
    with pytest.raises(InputError, match="already exists"):
        train_grpo(grpo_config(tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir), tmp_path / "exists")
    prepare_run_folder(cfg, tmp_path / "started", False, Dist())  # the folder a run of cfg starts with
    with pytest.raises(InputError, match="config differs"):
        train_grpo(
            grpo_config(tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_dev_dir, steps=2),
            tmp_path / "started",
            resume=True,
        )
    with pytest.raises(InputError, match="episode.agent.memory = 'decision'"):
        grpo_config(tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, **{"episode.agent.memory": "summary"})


def test_task_positions_cover_each_epoch_once_and_split_ranks():
    n, per_step = 10, 4
    seen = [i for step in range(1, 6) for i in step_task_positions(step, per_step, n, seed=3, rank=0, world=1)]
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))
    for step in (1, 2, 7):
        both = step_task_positions(step, per_step, n, 3, 0, 2) + step_task_positions(step, per_step, n, 3, 1, 2)
        assert sorted(both) == sorted(step_task_positions(step, per_step, n, 3, 0, 1))


def grpo_under_torchrun(torchrun, tmp_path, model, adapter, data, *sets: str):
    """`memsearch train grpo` with ``CONFIG`` on two gloo ranks into ``tmp_path/run``: the model,
    adapter and data given, then ``sets`` (``--set`` values); the completed process."""
    (tmp_path / "grpo.toml").write_text(CONFIG)
    given = [f"{key}={json.dumps(str(path))}" for key, path in (("model", model), ("adapter", adapter), ("data", data))]
    return torchrun("-m", "memsearch.cli.app", "train", "grpo", "--config", tmp_path / "grpo.toml",
                    "--out", tmp_path / "run", *[a for s in (*given, *sets) for a in ("--set", s)], timeout=400)

@pytest.mark.slow
def test_torchrun_two_gloo_ranks_end_to_end(tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, tmp_path, torchrun):
    """`memsearch train grpo` under torchrun: each rank rolls out its own tasks; rows are counted
    over both ranks; one adapter comes out."""
    proc = grpo_under_torchrun(torchrun, tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, "steps=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2]
    for record in log:
        assert record["trajectories"] == 4  # 2 tasks x group 2, one task per rank
        assert record["rows_generated"] == record["rows_converted"] == record["rows_consumed"] > 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["world_size"] == 2
    assert sorted(p.name for p in (tmp_path / "run" / "rollouts").iterdir())[:2] == [
        "step-000001.rank0.jsonl",
        "step-000001.rank1.jsonl",
    ]


def test_overwrite_role_trains_every_update_turn_and_the_final_answer(
    tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, tmp_path
):
    """MemAgent: stream the task's documents chunk by chunk, overwrite the memory, answer with
    \\boxed{}; every memory update and the final answer of a trajectory become rows."""
    cfg = grpo_config(
        tmp_path,
        tiny_model_dir,
        tiny_adapter_dir,
        hotpot_train_dir,
        role="memagent",
        steps=1,
        credit="split",
        **{
            "reward.metric": "boxed_em",
            "episode.agent.evidence": "stream",
            "episode.agent.memory": "overwrite",
            "episode.agent.controller": "exhaust",
            "episode.budgets.chunk_tokens": 256,
            "episode.budgets.max_chunks": 3,
            "episode.budgets.memory_tokens": 32,
            "episode.backends.reader.kind": "hf",
        },
    )
    train_grpo(cfg, tmp_path / "run", echo=lambda m: None)
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    trajectories = [
        json.loads(line)
        for line in (tmp_path / "run" / "rollouts" / "step-000001.rank0.jsonl").read_text().splitlines()
    ]
    calls = [[e["role"] for e in t["events"] if e["type"] == "policy_call"] for t in trajectories]
    for roles, t in zip(calls, trajectories, strict=True):
        assert roles == ["memory"] * t["counts"]["chunks"] + ["reader"]  # update turns, then the final answer
        assert 1 <= t["counts"]["chunks"] <= 3
    assert record["rows_generated"] == record["rows_consumed"] == sum(len(r) for r in calls)
    assert record["rows_per_trajectory"] == pytest.approx(sum(len(r) for r in calls) / len(calls))


@pytest.mark.slow
def test_torchrun_ranks_wait_for_rank_zero_evaluation_explicitly(
    tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, hotpot_dev_dir, tmp_path, torchrun
):
    """Rank 0 evaluates alone after the last step; the other rank waits for it at an explicit
    barrier bounded by eval.wait_s (docs/design.md §7), not inside a collective: evaluating 40
    tasks of 3 memory calls of 160 sampled tokens each takes several seconds (about 5 s on a
    loaded 2-core CPU), so a 1 s bound fails the run and says why."""
    proc = grpo_under_torchrun(torchrun, tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, "steps=1",
                               f"eval.data={json.dumps(str(hotpot_dev_dir))}", "eval.limit=40", "eval.wait_s=1",
                               "episode.budgets.max_searches=3", "episode.budgets.policy_tokens=160")
    assert proc.returncode != 0
    assert "rank 1 waited more than 1 s for rank 0 (evaluation at step 1); raise eval.wait_s" in proc.stderr, (
        proc.stderr[-3000:]
    )


def test_rows_generated_are_counted_by_the_policy_backend_not_from_the_trajectories(
    tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, tmp_path
):
    """Row-count contract (docs/design.md §7): "generated" is what the live policy backend
    answered with a completion, "converted" the rows built from the trajectories. A trained call
    lost (or duplicated) between the backend and row building breaks the contract; when both
    were counted over the same trajectories, it could not."""
    from dataclasses import replace

    from memsearch.data.dataset import load_dataset
    from memsearch.records.events import PolicyCall
    from memsearch.train.grpo.batch import RowCountError, build_batch
    from memsearch.train.grpo.trainer import Rollouts
    from memsearch.train.policy import load_policy

    cfg = grpo_config(tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir)
    dataset = load_dataset(hotpot_train_dir)
    policy, tokenizer, _ = load_policy(str(tiny_model_dir), str(tiny_adapter_dir), cfg.lora, device="cpu")
    rollouts = Rollouts(cfg, dataset, policy, tokenizer)
    try:
        groups = rollouts.run(dataset.tasks[:2], step=1)
        first = rollouts.generated
        rollouts.run(dataset.tasks[2:3], step=2)  # counted per step: the second run counts only its own calls
        second = rollouts.generated
    finally:
        rollouts.close()
    calls = [c for grp in groups for t in grp for c in t.policy_calls(["memory"])]
    assert all(not c.error for c in calls)
    assert first == len(calls) >= 4  # 2 tasks x group 2, at least one memory call each
    assert 2 <= second < first

    def counts(trajectory_groups):
        batch = build_batch(trajectory_groups, [[0.0, 1.0], [1.0, 0.0]], "memory", "share", False, generated=first)
        batch.counts.consumed = len(batch.rows)  # as the optimizer would: every row it was given
        return batch.counts

    def edited(trajectory_groups, which: tuple[int, int], edit):
        """The groups with trajectory ``which``'s events replaced by ``edit(events)``."""
        out = [list(grp) for grp in trajectory_groups]
        g, k = which
        out[g][k] = replace(out[g][k], events=tuple(edit(list(out[g][k].events))))
        return out

    def first_call(events):
        return next(e for e in events if isinstance(e, PolicyCall))

    counts(groups).check()
    lost = edited(groups, (1, 0), lambda events: [e for e in events if e is not first_call(events)])
    with pytest.raises(RowCountError, match=f"generated {first}, converted {first - 1}, dropped 0, failed 0, "
                                            f"consumed {first - 1}"):
        counts(lost).check()
    duplicated = edited(groups, (0, 1), lambda events: [*events, first_call(events)])
    with pytest.raises(RowCountError, match=f"generated {first}, converted {first + 1}, dropped 0, failed 0, "
                                            f"consumed {first + 1}"):
        counts(duplicated).check()


def test_periodic_evaluation_runs_on_its_own_cadence_not_only_on_checkpoint_steps(
    tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, hotpot_dev_dir, tmp_path
):
    """eval.every = 2 with checkpoint_every = 3 over 4 steps: evaluations at steps 2 and 4 (the
    end), each reading a checkpoint saved at that step; checkpoints also at 3."""
    cfg = grpo_config(
        tmp_path,
        tiny_model_dir,
        tiny_adapter_dir,
        hotpot_train_dir,
        steps=4,
        checkpoint_every=3,
        keep_checkpoints=10,
        **{"eval.data": str(hotpot_dev_dir), "eval.every": 2, "eval.limit": 1},
    )
    train_grpo(cfg, tmp_path / "run", echo=lambda _: None)
    log = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "eval_f1" in r] == [2, 4]
    for r in (x for x in log if "eval_f1" in x):  # greedy decoding's op counts, for the collapse guard
        summary = json.loads((tmp_path / "run" / "eval" / f"step-{r['step']:06d}" / "summary.json").read_text())
        assert r["eval_ops"] == {k.removeprefix("ops_"): v for k, v in summary["memory_ops"].items()}
        assert set(r["eval_ops"]) == {"ADD", "UPDATE", "DELETE", "NOOP"}
    assert sorted(p.name for p in (tmp_path / "run" / "eval").iterdir()) == ["step-000002", "step-000004"]
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == [
        "step-000002",
        "step-000003",
        "step-000004",
    ]


def test_a_damaged_checkpoint_is_named_and_grpo_resumes_from_the_newest_intact_one(
    tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, tmp_path
):
    """Before, NaN weights read from a damaged checkpoint made every rollout fail and the run
    trained on to a NaN adapter (exit 0)."""
    from safetensors.torch import load_file

    cfg = grpo_config(tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, kl_reference="base")
    out = tmp_path / "run"
    with pytest.raises(Crash):
        train_grpo(cfg, out, echo=crash_after(2))
    damaged = out / "checkpoints" / "step-000002" / "adapter" / "adapter_model.safetensors"
    data = bytearray(damaged.read_bytes())
    data[-64:-32] = b"\xff" * 32  # overwritten in place: NaN float32 values, same size
    damaged.write_bytes(bytes(data))
    lines: list[str] = []
    train_grpo(cfg, out, resume=True, echo=lines.append)
    assert any(line.startswith("damaged checkpoint: ") and str(damaged) in line for line in lines), lines
    assert any(line.startswith("resumed at step 1 from ") for line in lines), lines
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4] and all(r["request_errors"] == 0 for r in log)
    final = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert all(torch.isfinite(t).all() for t in final.values())


# Figures of the update that are sums of float products: equal up to round-off, not bit for bit.
_FLOAT_FIELDS = {"loss", "grad_norm", "kl", "entropy", "decision_entropy", "ratio_mean", "clip_fraction"}


@pytest.mark.slow
def test_fast_rollouts_train_the_same_run_as_the_reference_path(tiny_model_dir, tiny_adapter_dir, hotpot_train_dir,
                                                              tmp_path):
    """The v2 recipe's shape (state groups of 4, schema mode, KL to the start, shared-prompt
    scoring, op tokens of item errors masked) for 3 steps: sampling from the merged copy with
    shared prefills (``fast_rollouts``) gives the run of the PEFT policy with every prompt
    prefilled: the same completions, rewards and row counts, the update's figures and the final
    adapter within float round-off."""
    cfg = grpo_config(tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, steps=3, schema_mode=True,
                      credit="state", state_group_size=4, share_prompts=True, kl_reference="start",
                      invalid_decision_credit="over_budget", global_weight=0.5,
                      **{"episode.budgets.policy_tokens": 40})
    train_grpo(cfg, tmp_path / "fast", echo=lambda m: None)
    train_grpo(cfg, tmp_path / "reference", echo=lambda m: None, fast_rollouts=False)

    logs = {run: [json.loads(line) for line in (tmp_path / run / "train_log.jsonl").read_text().splitlines()]
            for run in ("fast", "reference")}
    timing = {"rollout_s", "step_s", "logprob_mismatch", "logprob_mismatch_mean"}
    for fast, ref in zip(logs["fast"], logs["reference"], strict=True):
        assert {k: v for k, v in fast.items() if k not in timing | _FLOAT_FIELDS} == \
               {k: v for k, v in ref.items() if k not in timing | _FLOAT_FIELDS}
        for key in _FLOAT_FIELDS & fast.keys():
            if ref[key] is None:
                assert fast[key] is None, key
            else:
                assert fast[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key
        assert fast["logprob_mismatch"] < 1e-4 and ref["logprob_mismatch"] < 1e-4
    assert any(r["grad_norm"] > 0 for r in logs["fast"])  # the runs did update: equality means something
    assert any(r["rows_consumed"] > 0 and r["zero_variance_groups"] < r["groups"] for r in logs["fast"])
    for step in (1, 2, 3):
        rolled = [[json.loads(line) for line in (tmp_path / run / "rollouts" / f"step-{step:06d}.rank0.jsonl")
                   .read_text().splitlines()] for run in ("fast", "reference")]
        branches = [[[b["completion_ids"] for e in tr["events"] for b in e.get("branches", [])] for tr in run]
                    for run in rolled]
        assert branches[0] == branches[1] and any(branches[0])
        assert [tr["reward"] for tr in rolled[0]] == [tr["reward"] for tr in rolled[1]]
    from safetensors.torch import load_file

    fast_w, ref_w = (load_file(str(tmp_path / run / "adapter" / "adapter_model.safetensors"))
                     for run in ("fast", "reference"))
    for name in fast_w:
        assert torch.allclose(fast_w[name], ref_w[name], atol=1e-5), name


@pytest.mark.slow
def test_a_bfloat16_base_samples_from_the_unmerged_policy_and_trains(tiny_model_dir, tiny_adapter_dir,
                                                                     hotpot_train_dir, tmp_path):
    """``dtype = "bfloat16"``: the base in bf16, the LoRA in float32. Rollouts sample from the
    policy itself (a merged bf16 copy would round W + scale * B @ A, a function the trainer does
    not differentiate); the run trains, its adapter stays float32, and the sampler's log-probs
    differ from the trainer's by bf16 round-off only (another batch and a KV cache), far from
    the float32 1e-4 but well under a nat."""
    from memsearch.data.dataset import load_dataset
    from memsearch.train.grpo.trainer import Rollouts
    from memsearch.train.policy import load_policy

    cfg = grpo_config(tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, steps=2, schema_mode=True,
                      credit="state", state_group_size=4, share_prompts=True, dtype="bfloat16",
                      **{"episode.budgets.policy_tokens": 40})
    policy, tokenizer, _ = load_policy(cfg.model, cfg.adapter, cfg.lora, "cpu", cfg.dtype, cfg.seed)
    rollouts = Rollouts(cfg, load_dataset(cfg.data), policy, tokenizer)
    assert rollouts.sampler is None and rollouts.policy_backend.decoder.model is policy
    assert rollouts.policy_backend.decoder.share_prompts  # the fast path's shared prefills stay
    rollouts.close()
    fp32 = Rollouts(grpo_config(tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir),
                    load_dataset(cfg.data), policy, tokenizer)
    assert fp32.sampler is not None  # float32: the merged copy, as before
    fp32.close()

    train_grpo(cfg, tmp_path / "bf16", echo=lambda m: None)
    log = [json.loads(line) for line in (tmp_path / "bf16" / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 2 and any(r["grad_norm"] > 0 for r in log)
    assert all(0 <= r["logprob_mismatch"] < 0.5 and 0 < r["logprob_mismatch_mean"] < 0.05 for r in log)
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "bf16" / "adapter" / "adapter_model.safetensors"))
    assert weights and all(w.dtype == torch.float32 and torch.isfinite(w).all() for w in weights.values())

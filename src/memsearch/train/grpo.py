"""Multi-turn GRPO through the episode engine: the readable single-node reference trainer.

    memsearch train grpo --config configs/train/grpo_cpu.toml --out runs/grpo
    torchrun --nproc_per_node 2 -m memsearch.cli.app train grpo --config ... --out ...   # one process per device

One step, top to bottom (``train_grpo``):

1. take this step's tasks (a seeded permutation per epoch; rank r takes every world-th one);
2. roll out ``group_size`` episodes per task with the *same* engine as evaluation
   (``run_episode``), the trained role(s) answered by an ``hf`` backend that holds the live LoRA
   policy (sampling at ``temperature``, a distinct seed per step / rollout / task / call), the
   other roles by whatever backend the episode config names (rules, a frozen stage-1 model...);
3. reward each trajectory (``reward.trajectory_reward``), advantage per trajectory inside its
   group, expanded to its rows without dropping any (``rows.build_batch``);
4. recompute log-probs (the schema mask replayed), clipped policy loss (+ k3 KL to the
   reference: the frozen starting adapter, or the base), micro-batched backward, gradients
   summed over ranks and divided by the global denominator, clip, AdamW step and LR-schedule
   step, once per mini-batch and epoch (``update``);
5. check the row-count contract, log, checkpoint, evaluate.

``--resume`` continues from the newest complete checkpoint exactly (weights, optimizer,
scheduler, RNG, data position are functions of the step). The old log-probs of the ratio are
the trainer's own dropout-free forward pass before the first optimizer step (with one step per
batch, the detached new log-probs: the ratio is exactly 1); the rollout log-probs are kept and
their largest deviation from that recomputation is logged (``logprob_mismatch``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from memsearch.errors import InputError
from memsearch.io import write_jsonl
from memsearch.train.checkpoint import checkpoints, load_checkpoint, save_checkpoint
from memsearch.train.config import GRPOConfig
from memsearch.train.distributed import Dist
from memsearch.train.log import TrainLog
from memsearch.train.logprobs import completion_logprobs, micro_batches
from memsearch.train.loss import assign_weights, policy_loss, split_mini_batches
from memsearch.train.rows import TRAINED_CALL_ROLES, Batch, build_batch
from memsearch.train.run_folder import finish_run, prepare_run_folder

ROLES = ("memory", "controller", "reader")


def derived_seed(*parts: Any) -> int:
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def step_task_positions(step: int, tasks_per_step: int, n_tasks: int, seed: int, rank: int, world: int) -> list[int]:
    """Indices (into the train tasks) of this rank's tasks at ``step`` (1-based): consecutive
    slices of a seeded permutation per epoch, dealt round-robin to the ranks."""
    out = []
    for j in range((step - 1) * tasks_per_step, step * tasks_per_step):
        if j % world != rank:
            continue
        epoch, pos = divmod(j, n_tasks)
        order = list(range(n_tasks))
        random.Random(derived_seed(seed, "epoch", epoch)).shuffle(order)
        out.append(order[pos])
    return out


@dataclass
class UpdateStats:
    loss: float = 0.0
    tokens: float = 0.0
    clip_fraction: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    ratio_mean: float = 0.0
    grad_norm: float = 0.0
    consumed: int = 0
    logprob_mismatch: float = 0.0
    denominator: float = 0.0


def _mask_fn(tokenizer):
    """Replays schema-mode masks from the constraint id and the completion ids."""
    from memsearch.backends.hf.constraint import compile_constraint, constraint_by_id

    def masks(row):
        return compile_constraint(constraint_by_id(row.constraint_id), tokenizer).masks_for(row.completion_ids)

    return masks


def update(model, optimizer, batch: Batch, cfg: GRPOConfig, dist: Dist, pad_id: int, mask_fn=None,
           scheduler=None) -> UpdateStats:
    """``cfg.epochs`` passes over this rank's rows, ``cfg.mini_batches_per_step`` optimizer steps
    each (all ranks call it together); ``scheduler`` (if given) is stepped after every optimizer
    step, so a schedule sized ``steps * epochs * mini_batches_per_step`` ends where it should.

    Mini-batches (``loss.split_mini_batches``): each rank deals its own trajectories, whole and
    in order, into ``mini_batches_per_step`` parts; optimizer step k is the loss over the union of
    every rank's part k, normalised by that union's denominator (the aggregation's D summed over
    the ranks by ``reduce_gradients``), i.e. exactly one process training on those rows. Every
    rank calls ``reduce_gradients`` once per part, empty or not, so the collectives stay in step;
    a step whose global denominator is 0 is skipped but still counts for the schedule (the
    learning rate is a function of the step number, which keeps ``--resume`` exact).

    Old log-probs (when the ratio can depart from 1: epochs > 1 or mini-batches) and reference
    log-probs are taken once, before the first optimizer step, without dropout (eval mode). The
    update itself runs without dropout too unless ``cfg.disable_dropout`` is off. Statistics are
    those of the first epoch (over all its mini-batches).
    """
    from memsearch.train.policy import reference_policy, trainable_parameters

    rows = batch.rows
    params = trainable_parameters(model)
    plan = []  # per mini-batch: (local denominator, micro-batches as indices into rows)
    for part in split_mini_batches(rows, cfg.mini_batches_per_step):
        sub = [rows[i] for i in part]
        local_denominator = assign_weights(sub, cfg.aggregation)
        plan.append((local_denominator, [[part[j] for j in idx] for idx in micro_batches(sub, cfg.micro_batch_tokens)]))
    off_policy = cfg.epochs > 1 or cfg.mini_batches_per_step > 1
    stats = UpdateStats()
    old: dict[tuple[int, int], torch.Tensor] = {}
    ref: dict[tuple[int, int], torch.Tensor] = {}
    model.eval()  # old and reference log-probs of the function the rollouts sampled from: no dropout
    with torch.no_grad():
        for k, (_, micros) in enumerate(plan):
            for g, idx in enumerate(micros):
                sub = [rows[i] for i in idx]
                if off_policy:
                    old[k, g] = completion_logprobs(model, sub, pad_id, cfg.temperature, mask_fn).logprobs
                    stats.logprob_mismatch = max(stats.logprob_mismatch, _mismatch(old[k, g], sub))
                if cfg.kl_coef > 0:
                    with reference_policy(model):
                        ref[k, g] = completion_logprobs(model, sub, pad_id, cfg.temperature, mask_fn).logprobs
    model.train(not cfg.disable_dropout)
    sums = {"tokens": 0.0, "clipped": 0.0, "kl": 0.0, "entropy": 0.0, "ratio": 0.0}
    part_loss = [0.0] * len(plan)
    part_denominator = [0.0] * len(plan)
    norms: list[float] = []
    for epoch in range(cfg.epochs):
        for k, (local_denominator, micros) in enumerate(plan):
            optimizer.zero_grad(set_to_none=False)
            for g, idx in enumerate(micros):
                sub = [rows[i] for i in idx]
                scored = completion_logprobs(model, sub, pad_id, cfg.temperature, mask_fn, with_entropy=epoch == 0)
                old_lp = old[k, g] if off_policy else scored.logprobs.detach()
                adv = torch.tensor([r.advantage for r in sub], device=scored.logprobs.device)
                weights = torch.tensor([r.weight for r in sub], device=scored.logprobs.device)
                loss_sum, st = policy_loss(
                    scored.logprobs,
                    old_lp,
                    adv,
                    scored.mask,
                    weights,
                    cfg.clip_low,
                    cfg.clip_high,
                    ref.get((k, g)),
                    cfg.kl_coef,
                    cfg.dual_clip,
                )
                loss_sum.backward()
                if epoch == 0:
                    stats.consumed += len(sub)
                    part_loss[k] += loss_sum.item()
                    for key in ("tokens", "clipped", "kl", "ratio"):
                        sums[key] += st[key]
                    sums["entropy"] += float(scored.entropy.sum()) if scored.entropy is not None else 0.0
                    if not off_policy:  # the first (and only) pass is before any update
                        stats.logprob_mismatch = max(stats.logprob_mismatch, _mismatch(scored.logprobs.detach(), sub))
            denominator = dist.reduce_gradients(params, local_denominator)
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.optim.max_grad_norm or float("inf"))
            if denominator > 0:
                optimizer.step()
            if scheduler is not None:
                scheduler.step()
            if epoch == 0:
                part_denominator[k] = denominator
                if denominator > 0:  # the mean gradient norm of the steps that updated
                    norms.append(float(norm))
    model.eval()
    total = dist.all_sum([*part_loss, sums["tokens"], sums["clipped"], sums["kl"], sums["entropy"], sums["ratio"]])
    losses, (tokens, clipped, kl, entropy, ratio) = total[: len(plan)], total[len(plan) :]
    # The loss of the first epoch: the mean over its optimizer steps of each step's normalised loss.
    stepped = [loss / d for loss, d in zip(losses, part_denominator, strict=True) if d > 0]
    stats.loss = sum(stepped) / len(stepped) if stepped else 0.0
    stats.denominator = sum(part_denominator)
    stats.grad_norm = sum(norms) / len(norms) if norms else 0.0
    stats.tokens = tokens
    if tokens:
        stats.clip_fraction, stats.kl, stats.entropy, stats.ratio_mean = (
            clipped / tokens,
            kl / tokens,
            entropy / tokens,
            ratio / tokens,
        )
    stats.logprob_mismatch = dist.all_max([stats.logprob_mismatch])[0]
    return stats


def _mismatch(logprobs: torch.Tensor, rows) -> float:
    """Largest |recomputed - rollout| log-prob over the rows' completion tokens (right-aligned)."""
    worst, c_max = 0.0, logprobs.shape[1]
    for k, row in enumerate(rows):
        c = len(row.completion_ids)
        if c:
            got = logprobs[k, c_max - c :].detach().cpu()
            worst = max(worst, float((got - torch.tensor(row.rollout_logprobs)).abs().max()))
    return worst


class Rollouts:
    """Episodes of one step through the shared engine, the trained role(s) on the live policy."""

    def __init__(self, cfg: GRPOConfig, dataset, policy, tokenizer) -> None:
        from memsearch.backends import make_backend
        from memsearch.backends.hf.backend import HFBackend
        from memsearch.tokenizer import load_tokenizer

        self.cfg = cfg
        episode = cfg.episode
        self.budget_tokenizer = load_tokenizer(episode.tokenizer)
        self.documents = dataset.documents_by_id()
        self.retriever = None
        if episode.agent.evidence == "search":
            from memsearch.retrieval.index import make_retriever

            # The episode's [retrieval] table: bm25/dense/hybrid in process, a built index, or the
            # shared service (rollout workers on many nodes searching one index).
            self.retriever = make_retriever(episode.retrieval, dataset.documents)
        self.trained = set(TRAINED_CALL_ROLES[cfg.role])
        self.generated = 0  # completions of the trained roles in the last ``run`` (counted by the backend)
        self.policy_backend = HFBackend(
            model=cfg.model,
            loaded=(policy, tokenizer),
            max_batch_size=cfg.max_batch_size,
            seed=cfg.seed,
            name="hf-policy",
        )
        shared: dict[str, Any] = {}
        self.backends = {}
        for role in ROLES:
            if role in self.trained:
                self.backends[role] = self.policy_backend
                continue
            bcfg = getattr(episode.backends, role)
            key = json.dumps(bcfg.model_dump(mode="json", exclude={"sampling"}), sort_keys=True)
            if key not in shared:
                shared[key] = make_backend(bcfg, self.budget_tokenizer, dataset)
            self.backends[role] = shared[key]

    def config_for(self, step: int, k: int):
        """The episode config of rollout ``k`` at ``step``: trained roles sample at T with their own seed."""
        from memsearch.config import RunConfig

        data = trained_role_backends(self.cfg, self.cfg.episode.model_dump(mode="json"))
        for role in self.trained:
            data["backends"][role]["sampling"] = {
                "temperature": self.cfg.temperature,
                "top_p": self.cfg.top_p,
                "seed": derived_seed(self.cfg.seed, "rollout", step, k),
            }
        return RunConfig.model_validate(data)

    def run(self, tasks, step: int) -> list[list[dict[str, Any]]]:
        """``group_size`` trajectories per task, grouped by task (task order, then rollout index)."""
        from memsearch.engine.episode import Environment, run_episode

        envs = [
            Environment(
                self.config_for(step, k),
                self.budget_tokenizer,
                self.documents,
                self.backends,
                self.retriever,
                group="grpo",
            )
            for k in range(self.cfg.group_size)
        ]

        async def all_episodes():
            return await asyncio.gather(*(run_episode(t, env) for t in tasks for env in envs))

        answered = self.policy_backend.completed
        before = sum(answered[role] for role in self.trained)
        flat = asyncio.run(all_episodes()) if tasks else []
        # rows generated, counted where the calls are answered (not re-read from the trajectories)
        self.generated = sum(answered[role] for role in self.trained) - before
        g = self.cfg.group_size
        return [flat[i * g : (i + 1) * g] for i in range(len(tasks))]

    def close(self) -> None:
        async def close_all():
            for backend in {id(b): b for b in self.backends.values()}.values():
                await backend.aclose()

        asyncio.run(close_all())


def trained_role_backends(cfg: GRPOConfig, data: dict[str, Any], adapter: Path | None = None) -> dict[str, Any]:
    """``data`` (a dumped episode config) with the trained roles on the hf policy, sampled the
    way training samples them: the one place rollouts and periodic evaluation take it from, so
    the evaluated policy is the trained one (``schema_mode`` included)."""
    for role in TRAINED_CALL_ROLES[cfg.role]:
        data["backends"][role].update(kind="hf", schema_mode=cfg.schema_mode and role == "memory")
        if adapter is not None:
            data["backends"][role].update(model=cfg.model, adapter=str(adapter))
    return data


def _evaluate(cfg: GRPOConfig, adapter: Path, out: Path) -> dict[str, Any]:
    """Greedy evaluation of the adapter through the eval runner (the same code path as `memsearch eval`)."""
    from memsearch.config import RunConfig
    from memsearch.eval.runner import run_eval

    data = trained_role_backends(cfg, cfg.episode.model_dump(mode="json"), adapter)
    data["limit"] = cfg.eval.limit
    summary = run_eval(RunConfig.model_validate(data), cfg.eval.data, out, show_progress=False)
    return {
        "eval_" + k: v
        for k, v in summary["metrics"].items()
        if k in ("f1", "em", "sub_em", "boxed_em", "invalid_action_rate", "memory_support_recall")
    }


def train_grpo(cfg: GRPOConfig, out: str | Path, resume: bool = False, echo=print) -> dict[str, Any]:
    """Train (or resume) a GRPO run into ``out``; returns the final summary."""
    from memsearch.data.dataset import load_dataset
    from memsearch.train.policy import load_policy, make_optimizer, save_adapter
    from memsearch.train.reward import trajectory_reward

    out = Path(out)
    dist = Dist.from_env(cfg.dist_timeout_s, cfg.eval.wait_s)
    try:
        prepare_run_folder(cfg, out, resume, dist)
        dataset = load_dataset(cfg.data)
        split = dataset.manifest.get("split")
        if split != "train":
            raise InputError(
                f"{cfg.data}: manifest split is {split!r}; GRPO trains on a train split only (docs/design.md §9)"
            )
        labels = dataset.labels_by_id()
        device = dist.device(cfg.device)
        policy, tokenizer, note = load_policy(
            cfg.model,
            cfg.adapter,
            cfg.lora,
            device,
            cfg.dtype,
            cfg.seed,
            keep_reference=cfg.kl_coef > 0 and cfg.kl_reference == "start",
        )
        if dist.main:
            echo(note)
        optimizer, scheduler = make_optimizer(policy, cfg.optim, cfg.steps * cfg.epochs * cfg.mini_batches_per_step)
        start = 0
        found = checkpoints(out / "checkpoints") if resume else []
        if found:
            start, _ = load_checkpoint(found[-1], policy, optimizer, scheduler, dist)
            if dist.main:
                echo(f"resumed from {found[-1]} (step {start})")
        elif resume and dist.main:
            echo("no complete checkpoint yet: starting from step 0")
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        mask_fn = _mask_fn(tokenizer) if cfg.schema_mode else None
        rollouts = Rollouts(cfg, dataset, policy, tokenizer)
        log = TrainLog(out, enabled=dist.main, resume_step=start if resume else None)
        if cfg.eval.data and cfg.eval.at_start and start == 0:
            if dist.main:
                save_adapter(policy, out / "adapter-step0")
                log.write({"step": 0, **_evaluate(cfg, out / "adapter-step0", out / "eval" / "step-000000")})
            dist.wait_for_main("evaluation of the starting adapter")  # bounded by eval.wait_s
        for step in range(start + 1, cfg.steps + 1):
            t0 = time.perf_counter()
            positions = step_task_positions(
                step, cfg.tasks_per_step, len(dataset.tasks), cfg.seed, dist.rank, dist.world
            )
            tasks = [dataset.tasks[i] for i in positions]
            groups = rollouts.run(tasks, step)
            t_roll = time.perf_counter() - t0
            rewards = [
                [trajectory_reward(tr, labels[tr["task_id"]], cfg.reward, cfg.role) for tr in grp] for grp in groups
            ]
            batch = build_batch(groups, rewards, cfg.role, cfg.credit, cfg.std_scale, generated=rollouts.generated)
            lr = optimizer.param_groups[0]["lr"]
            stats = update(policy, optimizer, batch, cfg, dist, pad_id, mask_fn, scheduler)
            batch.counts.consumed = stats.consumed
            record = _step_record(step, batch, groups, stats, dist, lr, cfg.role, t0, t_roll)
            if (
                record["rows_generated"] != record["rows_converted"]
                or record["rows_converted"] != record["rows_consumed"]
            ):
                batch.counts.check()  # this rank's view names the numbers ...
                raise RuntimeError(f"row-count contract broken on another rank: {record}")  # ... or another rank's
            if cfg.save_rollouts:
                (out / "rollouts").mkdir(exist_ok=True)
                write_jsonl(
                    out / "rollouts" / f"step-{step:06d}.rank{dist.rank}.jsonl",
                    [dict(tr, reward=r) for grp, rs in zip(groups, rewards) for tr, r in zip(grp, rs)],
                )
            eval_due = bool(cfg.eval.data) and (
                step == cfg.steps or bool(cfg.eval.every and step % cfg.eval.every == 0)
            )
            # The periodic evaluation reads the checkpoint's adapter, so an evaluation step is also a
            # checkpoint step (before: evaluations fell only on steps that were both, e.g. every = 6 with
            # checkpoint_every = 4 evaluated at the end only).
            if step % cfg.checkpoint_every == 0 or step == cfg.steps or eval_due:
                folder = save_checkpoint(
                    out / "checkpoints",
                    step,
                    policy,
                    optimizer,
                    scheduler,
                    dist,
                    {"tasks_seen": step * cfg.tasks_per_step},
                    cfg.keep_checkpoints,
                )
                if eval_due:
                    if dist.main:
                        record.update(_evaluate(cfg, folder / "adapter", out / "eval" / f"step-{step:06d}"))
                    dist.wait_for_main(f"evaluation at step {step}")  # bounded by eval.wait_s
            log.write(record)
            if dist.main:
                echo(
                    f"step {step}/{cfg.steps}: reward {record['reward_mean']:.3f} (std {record['reward_std']:.3f}), "
                    f"zero-variance groups {record['zero_variance_groups']}/{record['groups']}, rows "
                    f"{record['rows_consumed']}, "
                    f"invalid {record['invalid_rate']:.2f}, {record['step_s']:.1f}s"
                )
        rollouts.close()
        log.close()
        return finish_run(
            policy, out, {"steps": cfg.steps, "role": cfg.role, "world_size": dist.world, "note": note}, dist
        )
    finally:
        dist.close()


def _step_record(
    step, batch: Batch, groups, stats: UpdateStats, dist: Dist, lr: float, role: str, t0, t_roll
) -> dict[str, Any]:
    """One JSON line of the training log, summed over ranks."""
    trajs = [tr for grp in groups for tr in grp]
    calls = [
        c
        for tr in trajs
        for c in tr.get("events", [])
        if c.get("type") == "policy_call" and c["role"] in TRAINED_CALL_ROLES[role]
    ]
    prompt_tokens = sum(len(c.get("prompt_ids") or []) for c in calls)
    rpt = batch.rows_per_trajectory
    local = [
        sum(batch.rewards),
        sum(r * r for r in batch.rewards),
        len(batch.rewards),
        batch.zero_variance_groups,
        batch.groups,
        batch.counts.generated,
        batch.counts.converted,
        batch.counts.consumed,
        batch.counts.failed_calls,
        sum(1 for c in calls if c.get("valid") is False),
        len(calls),
        prompt_tokens,
        sum(tr.get("counts", {}).get("request_errors", 0) for tr in trajs),
        sum(rpt),
        len(rpt),
    ]
    (r_sum, r_sq, n, zero, n_groups, gen, conv, cons, failed, invalid, n_calls, p_tok, errors, rows_sum, n_traj) = (
        dist.all_sum(local)
    )
    mean = r_sum / n if n else 0.0
    var = max(0.0, r_sq / n - mean * mean) if n else 0.0
    return {
        "step": step,
        "reward_mean": mean,
        "reward_std": var**0.5,
        "zero_variance_groups": int(zero),
        "groups": int(n_groups),
        "trajectories": int(n),
        "rows_generated": int(gen),
        "rows_converted": int(conv),
        "rows_consumed": int(cons),
        "rows_per_trajectory": rows_sum / n_traj if n_traj else 0.0,
        "failed_calls": int(failed),
        "request_errors": int(errors),
        "invalid_rate": invalid / n_calls if n_calls else 0.0,
        "loss": stats.loss,
        "clip_fraction": stats.clip_fraction,
        "kl": stats.kl,
        "entropy": stats.entropy,
        "ratio_mean": stats.ratio_mean,
        "grad_norm": stats.grad_norm,
        "completion_tokens": int(stats.tokens),
        "prompt_tokens": int(p_tok),
        "logprob_mismatch": stats.logprob_mismatch,
        "lr": lr,
        "rollout_s": round(t_roll, 3),
        "step_s": round(time.perf_counter() - t0, 3),
    }

"""Does a GRPO update follow its advantages? Repeated updates on one saved step.

    uv run python -m studies.memory_policy.batch_fit RUN --step 1 --updates 4 [--lr 5e-5] [--data DIR] \
        [--adapter DIR] [--json FILE]

A diagnostic for a run that does not learn (docs/results/grpo_learnability): it separates "the
update is broken" (the rows it trains on do not move the way their advantages say) from "the
update works but the step overshoots or the signal is thin".

- ``replay_step``: the rows ``train_grpo`` trained on at one step, rebuilt from the run's saved
  rollouts (``save_rollouts``) with ``grpo.make_batch``, the trainer's own batch building.
- ``fit_batch``: ``updates`` calls of ``grpo.update`` on those rows, each followed by a no-grad
  scoring pass. Per update: the mean change since the start of a row's summed log-prob and of
  its op-choosing tokens (``decision_positions``), for rows with a positive and a negative
  advantage, their correlation with the advantage, and the surrogate gain sum(adv x change),
  which a working update raises.

Each update treats the rows as sampled by the policy being trained (ratio 1, as the trainer's
first pass): exact for the adapter that made the step, a direction check for any other.

The command takes a ``memsearch train grpo`` folder (or a pipeline's ``seed-N/grpo1``) saved with
its rollouts; its ``config.json`` is the recipe. ``--data`` / ``--adapter`` replace the config's
when those folders have moved; ``--adapter`` should be the policy that sampled the step (the start
adapter for step 1, the step-(N-1) checkpoint otherwise). It prints a markdown table, one row per
update; ``--json FILE`` writes the points.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from memsearch.errors import InputError
from memsearch.io import iter_jsonl
from memsearch.records.trajectory import Trajectory
from memsearch.train.config import GRPOConfig
from memsearch.train.grpo.batch import Batch
from memsearch.train.rows import Row, trained_calls


@dataclass
class FitPoint:
    """How the rows moved after ``update`` updates (0: the start)."""

    update: int
    grad_norm: float
    kl: float
    row_pos: float  # mean change of a row's summed log-prob, rows with advantage > 0
    row_neg: float  # ... advantage < 0
    decision_pos: float  # mean change of the log-prob at a row's op-choosing tokens, advantage > 0
    decision_neg: float
    corr: float  # correlation of the row changes with the advantages
    surrogate: float  # sum over rows of advantage x change

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def replay_step(run: Path, step: int, cfg: GRPOConfig, tokenizer, labels) -> Batch:
    """The rows of ``step`` of the GRPO run in ``run``, rebuilt from ``rollouts/step-N.rank0.jsonl``."""
    from memsearch.train.grpo.trainer import make_batch

    path = run / "rollouts" / f"step-{step:06d}.rank0.jsonl"
    if not path.is_file():
        raise InputError(f"{path}: no saved rollouts for step {step} (the run needs save_rollouts = true)")
    groups: dict[str, list[tuple[Trajectory, float]]] = {}
    for n, saved in iter_jsonl(path):  # the shared reader: bad JSON is named file:line
        try:
            # a saved rollout is a trajectory plus its reward (kept in the record's extra keys)
            groups.setdefault(saved["task_id"], []).append((Trajectory.from_json(saved), float(saved["reward"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{path}:{n}: not a saved trajectory with task_id and reward ({exc})") from exc
    missing = [task for task in groups if task not in labels]
    if missing:
        raise InputError(f"{path}: tasks {missing[:3]} are not in the run's data {cfg.data}; "
                         "pass the data it trained on")
    trajectories = [[t for t, _ in group] for group in groups.values()]
    rewards = [[r for _, r in group] for group in groups.values()]
    generated = sum(len(call.branches or [call]) for group in trajectories for t in group
                    for call in trained_calls(t, cfg.role))
    return make_batch(cfg, trajectories, rewards, labels, tokenizer, generated)


def fit_batch(policy, optimizer, batch: Batch, cfg: GRPOConfig, pad_id: int, mask_fn, updates: int,
              echo: Callable[[FitPoint], None] | None = None) -> list[FitPoint]:
    """``updates`` GRPO updates on ``batch`` (module doc); returns a point per update."""
    from memsearch.train.distributed import Dist
    from memsearch.train.grpo.trainer import update

    rows = batch.rows
    advantages = torch.tensor([r.advantage for r in rows], dtype=torch.float64)
    start_rows, start_decisions = _score(policy, rows, cfg, pad_id, mask_fn)
    dist = Dist.from_env(cfg.dist_timeout_s, cfg.eval.wait_s)
    points = []
    for k in range(1, updates + 1):
        stats = update(policy, optimizer, batch, cfg, dist, pad_id, mask_fn, None, step=k)
        now_rows, now_decisions = _score(policy, rows, cfg, pad_id, mask_fn)
        points.append(_point(k, stats, advantages, now_rows - start_rows, now_decisions - start_decisions))
        if echo is not None:
            echo(points[-1])
    return points


def _point(k: int, stats, adv: torch.Tensor, rows: torch.Tensor, decisions: torch.Tensor) -> FitPoint:
    pos, neg = adv > 0, adv < 0

    def mean(x: torch.Tensor, keep: torch.Tensor) -> float:
        return float(x[keep].mean()) if bool(keep.any()) else 0.0

    corr = float(torch.corrcoef(torch.stack([adv, rows]))[0, 1]) if float(adv.std()) > 0 else 0.0
    return FitPoint(k, float(stats.grad_norm), float(stats.kl or 0.0), mean(rows, pos), mean(rows, neg),
                    mean(decisions, pos), mean(decisions, neg), corr, float((adv * rows).sum()))


def _score(policy, rows: list[Row], cfg: GRPOConfig, pad_id: int, mask_fn) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: summed log-prob of its completion tokens in the loss, and of its op-choosing tokens."""
    from memsearch.train.grpo.shared_prompt import shared_micro_batches
    from memsearch.train.grpo.update import row_scorer
    from memsearch.train.logprobs import micro_batches

    packer = shared_micro_batches if cfg.update.share_prompts else micro_batches
    total = torch.zeros(len(rows), dtype=torch.float64)
    decisions = torch.zeros(len(rows), dtype=torch.float64)
    policy.eval()
    with torch.no_grad():
        for idx in packer(rows, cfg.update.micro_batch_tokens):
            sub = [rows[i] for i in idx]
            logprobs = row_scorer(cfg)(policy, sub, pad_id, cfg.rollout.temperature, mask_fn).logprobs.double().cpu()
            width = logprobs.shape[1]
            for k, i in enumerate(idx):
                row_lp = logprobs[k, width - len(rows[i].completion_ids):]
                total[i] = row_lp.sum()
                decisions[i] = sum(float(row_lp[p]) for p in rows[i].decision_positions)
    return total, decisions


def main(argv: list[str] | None = None) -> int:
    """``python -m studies.memory_policy.batch_fit RUN [--step N] [--updates K] [--lr X] [--data DIR]
    [--adapter DIR] [--json FILE]``."""
    parser = argparse.ArgumentParser(description="Repeated GRPO updates on one saved step of a run.")
    parser.add_argument("run", type=Path, help="a GRPO run folder with config.json and rollouts/")
    parser.add_argument("--step", type=int, default=1, help="the saved step whose rows are replayed (1)")
    parser.add_argument("--updates", type=int, default=4, help="updates on those rows (4)")
    parser.add_argument("--lr", type=float, help="learning rate instead of the run's")
    parser.add_argument("--data", help="the prepared data the run trained on, if it has moved")
    parser.add_argument("--adapter", help="the adapter to start from, instead of the run's start")
    parser.add_argument("--json", type=Path, help="also write the points here")
    args = parser.parse_args(argv)
    try:
        points = _run(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps([p.as_dict() for p in points], indent=2))
    return 0


def _run(args) -> list[FitPoint]:
    from memsearch.data.dataset import load_dataset
    from memsearch.train.grpo.trainer import schema_mask_fn
    from memsearch.train.policy import load_policy, make_optimizer

    saved = args.run / "config.json"
    if not saved.is_file():
        raise InputError(f"{saved}: not a GRPO run folder (no config.json)")
    data = json.loads(saved.read_text())
    if args.data:
        data["data"] = args.data
    if args.adapter:
        data["adapter"] = args.adapter
    if args.lr is not None:
        data["optim"]["lr"] = args.lr
    cfg = GRPOConfig.model_validate(data)
    labels = load_dataset(cfg.data).labels_by_id()
    policy, tokenizer, _ = load_policy(cfg.model, cfg.adapter, cfg.lora, cfg.device, cfg.dtype, cfg.seed,
                                       keep_reference=cfg.loss.kl_coef > 0 and cfg.loss.kl_reference == "start")
    optimizer, _ = make_optimizer(policy, cfg.optim, cfg.steps)
    batch = replay_step(args.run, args.step, cfg, tokenizer, labels)
    adv = [r.advantage for r in batch.rows]
    print(f"step {args.step}: {len(adv)} rows, advantage > 0: {sum(a > 0 for a in adv)}, < 0: "
          f"{sum(a < 0 for a in adv)}, = 0: {sum(a == 0 for a in adv)}; lr {cfg.optim.lr}\n")
    print("| update | Δ row log-prob, adv > 0 / < 0 | Δ at op tokens, adv > 0 / < 0 | corr(adv, Δ) | "
          "sum adv×Δ | grad norm | KL |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def echo(p):
        print(f"| {p.update} | {p.row_pos:+.3f} / {p.row_neg:+.3f} | {p.decision_pos:+.3f} / {p.decision_neg:+.3f} | "
              f"{p.corr:+.3f} | {p.surrogate:+.3f} | {p.grad_norm:.3f} | {p.kl:.4f} |", flush=True)

    mask_fn = schema_mask_fn(tokenizer) if cfg.schema_mode else None
    return fit_batch(policy, optimizer, batch, cfg, pad, mask_fn, args.updates, echo=echo)


if __name__ == "__main__":
    sys.exit(main())

"""Does a GRPO update follow its advantages? Repeated updates on one saved step.

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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from memsearch.errors import InputError
from memsearch.io import iter_jsonl
from memsearch.train.config import GRPOConfig
from memsearch.train.rows import Batch, Row, trained_calls


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
    from memsearch.train.grpo import make_batch

    path = run / "rollouts" / f"step-{step:06d}.rank0.jsonl"
    if not path.is_file():
        raise InputError(f"{path}: no saved rollouts for step {step} (the run needs save_rollouts = true)")
    groups: dict[str, list[dict]] = {}
    for n, trajectory in iter_jsonl(path):  # the shared reader: bad JSON is named file:line
        try:
            groups.setdefault(trajectory["task_id"], []).append(trajectory)
            float(trajectory["reward"])
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{path}:{n}: not a saved trajectory with task_id and reward ({exc})") from exc
    missing = [task for task in groups if task not in labels]
    if missing:
        raise InputError(f"{path}: tasks {missing[:3]} are not in the run's data {cfg.data}; "
                         "pass the data it trained on")
    trajectories = list(groups.values())
    rewards = [[float(t["reward"]) for t in group] for group in trajectories]
    generated = sum(len(call.get("branches") or [call]) for group in trajectories for t in group
                    for call in trained_calls(t, cfg.role))
    return make_batch(cfg, trajectories, rewards, labels, tokenizer, generated)


def fit_batch(policy, optimizer, batch: Batch, cfg: GRPOConfig, pad_id: int, mask_fn, updates: int,
              echo: Callable[[FitPoint], None] | None = None) -> list[FitPoint]:
    """``updates`` GRPO updates on ``batch`` (module doc); returns a point per update."""
    from memsearch.train.distributed import Dist
    from memsearch.train.grpo import update

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
    from memsearch.train.logprobs import micro_batches
    from memsearch.train.shared_prompt import shared_micro_batches
    from memsearch.train.update import _scorer

    packer = shared_micro_batches if cfg.share_prompts else micro_batches
    total = torch.zeros(len(rows), dtype=torch.float64)
    decisions = torch.zeros(len(rows), dtype=torch.float64)
    policy.eval()
    with torch.no_grad():
        for idx in packer(rows, cfg.micro_batch_tokens):
            sub = [rows[i] for i in idx]
            logprobs = _scorer(cfg)(policy, sub, pad_id, cfg.temperature, mask_fn).logprobs.double().cpu()
            width = logprobs.shape[1]
            for k, i in enumerate(idx):
                row_lp = logprobs[k, width - len(rows[i].completion_ids):]
                total[i] = row_lp.sum()
                decisions[i] = sum(float(row_lp[p]) for p in rows[i].decision_positions)
    return total, decisions

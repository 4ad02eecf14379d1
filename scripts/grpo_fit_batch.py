"""Repeated GRPO updates on one saved step of a run: does the update follow its advantages, and
how far does one step move the rows? (memsearch.train.batch_fit; docs/results/grpo_learnability)

    uv run python scripts/grpo_fit_batch.py RUN --step 1 --updates 4 [--lr 5e-5] [--data DIR] [--adapter DIR]

RUN is a ``memsearch train grpo`` folder (or a pipeline's ``seed-N/grpo1``) saved with its
rollouts; its ``config.json`` is the recipe. ``--data`` / ``--adapter`` replace the config's when
those folders have moved; ``--adapter`` should be the policy that sampled the step (the start
adapter for step 1, the step-(N-1) checkpoint otherwise). Prints a markdown table, one row per
update; ``--json FILE`` writes the points.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from memsearch.errors import InputError

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a GRPO run folder with config.json and rollouts/")
    parser.add_argument("--step", type=int, default=1, help="the saved step whose rows are replayed (1)")
    parser.add_argument("--updates", type=int, default=4, help="updates on those rows (4)")
    parser.add_argument("--lr", type=float, help="learning rate instead of the run's")
    parser.add_argument("--data", help="the prepared data the run trained on, if it has moved")
    parser.add_argument("--adapter", help="the adapter to start from, instead of the run's start")
    parser.add_argument("--json", type=Path, help="also write the points here")
    args = parser.parse_args(argv)
    try:
        points = run(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps([p.as_dict() for p in points], indent=2))
    return 0


def run(args):
    from memsearch.data.dataset import load_dataset
    from memsearch.errors import InputError
    from memsearch.train.batch_fit import fit_batch, replay_step
    from memsearch.train.config import GRPOConfig
    from memsearch.train.grpo import _mask_fn
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
                                       keep_reference=cfg.kl_coef > 0 and cfg.kl_reference == "start")
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

    mask_fn = _mask_fn(tokenizer) if cfg.schema_mode else None
    return fit_batch(policy, optimizer, batch, cfg, pad, mask_fn, args.updates, echo=echo)


if __name__ == "__main__":
    sys.exit(main())

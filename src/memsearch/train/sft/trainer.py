"""LoRA SFT on completion tokens only (data from ``memsearch export-sft``).

    memsearch train sft --config configs/train/sft_cpu.toml --out runs/sft

Each JSONL line holds chat ``messages`` and the ``completion`` the policy must emit. The prompt
is the chat template with the generation prompt, tokenized exactly as the ``hf`` backend does
(``HFBackend.prompt_ids``); the completion is its tokens plus the end-of-turn token, so the model
learns to stop where the decoder stops. Only completion tokens are in the loss (token mean over
one optimizer step = ``micro_batch_rows x grad_accumulation`` rows).

Warm-up + constant / linear / cosine schedule, resumable checkpoints (``--resume``: from the newest
intact one, ``train.checkpoint``), periodic evaluation through the episode engine with the adapter
in the configured role, the final adapter in ``<out>/adapter``. A non-finite loss, gradient norm or
weight stops the run (``train.finite``).
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any

import torch

from memsearch.devices import apply_training_layout
from memsearch.errors import InputError, Problem
from memsearch.io import iter_jsonl
from memsearch.train.checkpoint import resume_checkpoint, save_checkpoint
from memsearch.train.config import SFTConfig
from memsearch.train.distributed import Dist
from memsearch.train.finite import require_finite, require_finite_weights
from memsearch.train.log import TrainLog
from memsearch.train.logprobs import completion_logprobs
from memsearch.train.rows import Row
from memsearch.train.run_folder import check_run_folder, drop_lost_steps, finish_run, prepare_run_folder


def chat_prompt_ids(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Prompt token ids exactly as the hf backend builds them (chat template + generation prompt)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def load_sft_rows(paths: list[str], tokenizer, max_tokens: int) -> list[Row]:
    """Rows of every file (prompt ids, completion ids + end-of-turn); bad lines name file:line."""
    rows: list[Row] = []
    problems: list[Problem] = []
    eos = tokenizer.eos_token_id
    for path in paths:
        if not Path(path).is_file():
            raise InputError(f"{path}: no such SFT data file (make one with `memsearch export-sft`)")
        for line, record in iter_jsonl(path):
            messages, completion = record.get("messages"), record.get("completion")
            if not isinstance(messages, list) or not messages:
                problems.append(Problem(str(path), line, "messages", "expected a non-empty list of chat messages"))
                continue
            if not isinstance(completion, str) or not completion:
                problems.append(Problem(str(path), line, "completion", "expected a non-empty string"))
                continue
            split = (record.get("source") or {}).get("split") if isinstance(record.get("source"), dict) else None
            if split != "train":
                # Rows without a train provenance may hold dev questions: training on them would
                # leak the evaluation set (docs/design.md §9). export-sft records the split.
                problems.append(Problem(str(path), line, "source.split", f"got {split!r}, expected 'train' "
                                        "(rows written by `memsearch export-sft` from a run on a train split)"))
                continue
            prompt = chat_prompt_ids(tokenizer, messages)
            ids = list(tokenizer(completion, add_special_tokens=False)["input_ids"]) + [eos]
            if len(prompt) + len(ids) > max_tokens:
                problems.append(
                    Problem(str(path), line, "messages", f"{len(prompt) + len(ids)} tokens; max_tokens is {max_tokens}")
                )
                continue
            rows.append(
                Row(
                    prompt_ids=prompt,
                    completion_ids=ids,
                    rollout_logprobs=[0.0] * len(ids),
                    loss_mask=[1] * len(ids),
                    trajectory=len(rows),
                    group_index=len(rows),
                    role=str(record.get("role", "")),
                    step=int(record.get("step", 0)),
                )
            )
    if problems:
        raise InputError(problems)
    if not rows:
        raise InputError(f"{', '.join(paths)}: no SFT rows")
    return rows


def _order(n: int, seed: int, epoch: int) -> list[int]:
    order = list(range(n))
    random.Random(f"{seed}/sft-epoch/{epoch}").shuffle(order)
    return order


def step_rows(step: int, per_step: int, n: int, seed: int) -> list[int]:
    """Row indices of optimizer step ``step`` (1-based): consecutive slices of a seeded
    permutation per epoch (the data position is a function of the step, so resume is exact)."""
    out = []
    for j in range((step - 1) * per_step, step * per_step):
        epoch, pos = divmod(j, n)
        out.append(_order(n, seed, epoch)[pos])
    return out


def evaluate_adapter(
    eval_config: str, role: str, model: str, adapter: Path, data: str, limit: int, out: Path,
    loaded: tuple[Any, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate ``adapter`` in ``role`` with the eval runner (same code path and records as
    `memsearch eval`). ``loaded``: ``(model, tokenizer)`` in memory that holds the adapter's weights
    now (the trainer's live policy), which then answers the role instead of a second model loaded
    from ``model`` + ``adapter`` (``train.live_eval``)."""
    from memsearch.config import load_config
    from memsearch.eval.runner import run_eval
    from memsearch.train.live_eval import evaluate_live

    cfg = load_config(
        eval_config,
        [
            f"backends.{role}.kind=hf",
            f"backends.{role}.model={json.dumps(model)}",
            f"backends.{role}.adapter={json.dumps(str(adapter))}",
            f"limit={limit}",
        ],
    )
    if loaded is not None:
        summary = evaluate_live(cfg, [role], *loaded, data, out)
    else:
        summary = run_eval(cfg, data, out, show_progress=False)
    return {"eval_" + k: v for k, v in summary.metrics.items() if k in ("f1", "em", "invalid_action_rate")}


def train_sft(cfg: SFTConfig, out: str | Path, resume: bool = False, echo=print) -> dict[str, Any]:
    """Train (or resume) LoRA SFT into ``out``; returns the summary."""
    from memsearch.train.memory_plan import check_device_memory
    from memsearch.train.policy import load_policy, make_optimizer, save_adapter, trainable_named_parameters

    out = Path(out)
    apply_training_layout(cfg.devices)  # before CUDA reads CUDA_VISIBLE_DEVICES (memsearch.devices)
    dist = Dist.from_env(cfg.dist_timeout_s, cfg.eval.wait_s)
    try:
        check_run_folder(cfg, out, resume, dist)
        device = dist.device(cfg.device)
        # before any weight loads: refuse a step this GPU cannot hold (train.memory_plan)
        check_device_memory(cfg, device, dist, echo if dist.main else None)
        policy, tokenizer, note = load_policy(
            cfg.model, cfg.adapter, cfg.lora, device, cfg.dtype, cfg.seed,
            gradient_checkpointing=cfg.gradient_checkpointing,
        )
        rows = load_sft_rows(cfg.data, tokenizer, cfg.max_tokens)
        per_step = cfg.micro_batch_rows * cfg.grad_accumulation
        total = max(1, math.ceil(cfg.epochs * len(rows) / per_step))
        optimizer, scheduler = make_optimizer(policy, cfg.optim, total)
        prepare_run_folder(cfg, out, resume, dist)  # only now: everything above may refuse the start
        named = trainable_named_parameters(policy)
        params = [p for _, p in named]
        start = 0
        if resume:
            start, _ = resume_checkpoint(out / "checkpoints", policy, optimizer, scheduler, dist, echo)
            drop_lost_steps(out, start, dist)
        if dist.main:
            echo(
                f"{note}; {len(rows)} rows, {total} optimizer steps of {per_step} rows"
                + (f", resumed at step {start}" if start else "")
            )
        log = TrainLog(out, enabled=dist.main, resume_step=start if resume else None)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

        def run_eval_at(step: int, adapter: Path) -> dict[str, Any]:
            """Rank 0 evaluates; every rank calls this and the others wait (at most eval.wait_s)."""
            if not (cfg.eval.data and cfg.eval_config):
                return {}
            got = (
                evaluate_adapter(
                    cfg.eval_config,
                    cfg.role,
                    cfg.model,
                    adapter,
                    cfg.eval.data,
                    cfg.eval.limit,
                    out / "eval" / f"step-{step:06d}",
                    loaded=(policy, tokenizer),  # the live policy holds the adapter: no second model
                )
                if dist.main
                else {}
            )
            dist.wait_for_main(f"evaluation at step {step}")
            return got

        if cfg.eval.at_start and start == 0 and cfg.eval.data:
            if dist.main:
                save_adapter(policy, out / "adapter-step0")
            log.write({"step": 0, **run_eval_at(0, out / "adapter-step0")})
        for step in range(start + 1, total + 1):
            t0 = time.perf_counter()
            mine = step_rows(step, per_step, len(rows), cfg.seed)[dist.rank :: dist.world]
            batch = [rows[i] for i in mine]
            tokens = float(sum(r.completion_tokens for r in batch))
            policy.train()
            optimizer.zero_grad(set_to_none=False)
            nll_sum = 0.0
            # sorted by length so each micro-batch of micro_batch_rows pads little
            order = sorted(
                range(len(batch)), key=lambda i: (len(batch[i].prompt_ids) + len(batch[i].completion_ids), i)
            )
            for s in range(0, len(order), cfg.micro_batch_rows):
                scored = completion_logprobs(policy, [batch[i] for i in order[s : s + cfg.micro_batch_rows]], pad_id)
                loss = -(scored.logprobs * scored.mask).sum()
                loss.backward()
                nll_sum += loss.item()
            denominator = dist.reduce_gradients(params, tokens)
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.optim.max_grad_norm or float("inf"))
            nll = dist.all_sum([nll_sum])[0] / denominator if denominator else 0.0
            require_finite(step, "the loss", nll)
            require_finite(step, "the gradient norm", float(norm))
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            require_finite_weights(step, named)
            scheduler.step()
            policy.eval()
            record = {
                "step": step,
                "loss": nll,
                "tokens": int(denominator),
                "rows": len(batch) * dist.world,
                "grad_norm": float(norm),
                "lr": lr,
                "step_s": round(time.perf_counter() - t0, 3),
            }
            if step % cfg.checkpoint_every == 0 or step == total:
                folder = save_checkpoint(
                    out / "checkpoints",
                    step,
                    policy,
                    optimizer,
                    scheduler,
                    dist,
                    {"rows": len(rows)},
                    cfg.keep_checkpoints,
                )
                if step == total or (cfg.eval.every and step % cfg.eval.every == 0):
                    record.update(run_eval_at(step, folder / "adapter"))
            elif cfg.eval.every and step % cfg.eval.every == 0 and cfg.eval.data:
                if dist.main:
                    save_adapter(policy, out / "eval" / f"adapter-step-{step:06d}")
                record.update(run_eval_at(step, out / "eval" / f"adapter-step-{step:06d}"))
            log.write(record)
            if dist.main and (step == 1 or step % 5 == 0 or step == total):
                echo(f"step {step}/{total}: loss {nll:.4f}, lr {lr:.2e}, {record['step_s']:.1f}s")
        log.close()
        return finish_run(policy, out, {"steps": total, "rows": len(rows), "note": note}, dist)
    finally:
        dist.close()

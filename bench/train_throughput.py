"""Benchmark: one GRPO step on the CPU, memsearch's trainer code vs TRL's ``GRPOTrainer``.

    OMP_NUM_THREADS=2 uv run python bench/train_throughput.py
    OMP_NUM_THREADS=2 uv run python bench/train_throughput.py --prompts 4 --group 4 --new-tokens 32   # bigger

Defaults: 2 prompts x group 4 = 8 samples per step, 16 new tokens. They are sized for a busy
2-core CPU (about 5 minutes per side there, mostly the step itself); on an idle machine the
larger setting above fits a few minutes. Peak memory grows with the rows in one forward/backward
(activations), so compare sides at the same setting only.

Workload: a single-turn reader task with the embedded SmolLM2-135M-Instruct. The first
``PROMPTS`` questions of the shipped HotpotQA dev sample, each turned into a reader prompt
(``memsearch.engine.prompts.reader(question, memory)``, memory = the gold supporting sentences,
one per line with an evidence id), ``GROUP`` sampled completions per prompt, every completion
exactly ``NEW_TOKENS`` tokens. Reward of a completion (both sides, the same function):
``memsearch.eval.metrics.f1`` of ``memsearch.engine.parsing.parse_reader(text).answer`` against
the gold answer.

Each side runs in a fresh child process (this script re-invoked with a hidden ``--side``), so
imports and allocations of one never count for the other; the parent reads the child's peak
resident set size (``ru_maxrss`` from ``os.wait4``) and the JSON the child writes.

- ours: ``memsearch.train.policy.load_policy("embedded", ...)`` (LoRA on the base), an
  ``HFBackend`` holding that live policy (``ignore_eos=True``: EOS does not end a row, so every
  completion is ``NEW_TOKENS`` long), ``generate_sync`` for prompts x group (a distinct seed per
  completion), rewards, ``Row``s with group advantages (``rows.group_advantages``), then
  ``memsearch.train.grpo.trainer.update`` (micro-batched log-probs + clipped loss + backward + clip +
  AdamW) and the scheduler step: the code ``memsearch train grpo`` runs for one step.
  Timed: from the ``generate_sync`` call to the end of the scheduler step.
- TRL: ``GRPOTrainer(model=<the embedded model's local HF folder>, reward_funcs=[f1 reward],
  args=GRPOConfig(...), train_dataset=<the same prompts as chat messages>, peft_config=LoraConfig)``,
  ``per_device_train_batch_size = PROMPTS x GROUP``, ``num_generations = GROUP``,
  ``gradient_accumulation_steps = 1``, ``max_steps = 1``: one optimizer step covers exactly the
  same prompts x group. Completion length forced with ``max_completion_length = NEW_TOKENS`` and
  ``generation_kwargs = {"min_new_tokens": NEW_TOKENS}``.
  Timed: from the ``on_step_begin`` to the ``on_step_end`` callback of the one step (generation,
  reward, log-probs, loss, backward, clip, optimizer and scheduler step); trainer construction
  and ``train()``'s own setup (accelerator, optimizer creation, dataloader) are not in it, but
  ``train()``'s total time is printed too.

Equal on both sides: model weights (the same local folder, fp32), prompts and their token ids
(checked: TRL's ``_tokenize_prompts`` is compared with our backend's ``prompt_ids``), prompts x
group, completion length (checked: the lengths each side produced are printed), sampling
(temperature 1, top-p 1, no top-k), LoRA r=16 alpha=32 dropout 0 on q,k,v,o,gate,up,down (same
seed before adapter creation: ``torch.manual_seed(0)`` on ours, TRL's ``set_seed(0)``), loss
(clipped token-level policy gradient, clip 0.2 both ways, ``aggregation="token"`` vs TRL's
``loss_type="dapo"``: both normalize by all completion tokens of the batch), advantages (reward
minus the group mean, not divided by the std: TRL ``scale_rewards="none"``), no KL (beta 0: no
reference forward on either side), one iteration (no old-log-prob forward on either side: both
use the detached new log-probs as the old ones), AdamW (torch, lr 1e-5, betas 0.9/0.999, no weight
decay, constant schedule), gradient clipping at 1.0, no gradient checkpointing (TRL's
``GRPOConfig`` default is ``gradient_checkpointing=True``; it is turned off here so both sides do
the same computation), fp32 (TRL's default ``bf16=True`` is turned off), torch's thread count
(from ``OMP_NUM_THREADS``).

Not equal (by design of each library):
- Forcing the length: ours samples from the full distribution and keeps going past an EOS
  (``ignore_eos``; an EOS token mid-completion stays in the row and in the loss); TRL blocks EOS
  for the first ``min_new_tokens`` tokens (its logit set to -inf), so its completions never contain
  EOS. Same token counts, slightly different sampling distributions.
- Decoding: ours is its own batched KV-cache decoder; TRL calls ``model.generate`` (transformers).
- Scoring: ours packs rows into micro-batches of at most ``micro_batch_tokens`` (the trainer's
  default 1024 padded tokens) and takes ``log_softmax`` over the kept logits; TRL runs the whole
  ``per_device_train_batch_size`` batch in one forward with its fused LM-head log-prob path. At the
  default setting the 8 rows (up to ~290 tokens each) go through a few micro-batches, so ours
  holds fewer activations at once for the same update (gradients accumulate exactly). Until
  2026-11 the default was 4096 and all 8 rows fit in one micro-batch.
- Chat template: ours renders it to text and tokenizes without special tokens; TRL tokenizes with
  ``apply_chat_template(tokenize=True)``. The ids are compared and the result printed.
- Rewards: the same function on each side's own completion text (ours decodes with special tokens
  kept, TRL without), so the reward values differ with the samples; the work does not.
- Import footprint: TRL imports more (accelerate, datasets, pandas...); this is part of its RSS.

Target: ours >= TRL on samples/s and on peak memory. The last line is machine-readable:

    RESULT samples_per_s_ratio=<ours/trl> peak_mem_ratio=<trl/ours>

``--case shared-prompt`` (about 2 minutes) measures the update with ``share_prompts``
(``memsearch.train.grpo.shared_prompt``) against the same update row by row, in one process on the
same rows: one real memory-policy prompt (``engine.prompts.memory_decision`` for the first dev
question, its gold sentences as evidence and one item in memory) shared by ``--group`` (6) rows
whose completions are ops JSON texts of ~40 tokens, the embedded model with LoRA. Each side
runs ``grpo.update`` (log-probs, loss, backward, AdamW step) ``--repeats`` times from the same
weights; the fastest is kept. Tokens/s counts the rows' prompt + completion tokens (the work the
row-by-row side does), so the ratio is the speed-up. It also prints the largest difference of the
two sides' gradients after one update. Target: ``tokens_per_s_ratio`` >= 2.5 at group 6.

    RESULT tokens_per_s_ratio=<shared/unshared> shared_tokens_per_s=... unshared_tokens_per_s=... group=6
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "samples" / "hotpotqa" / "dev_distractor_sample.json"
PROMPTS = 2
GROUP = 4
NEW_TOKENS = 16
LORA_R, LORA_ALPHA = 16, 32
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LR = 1e-5
SEED = 0


# ----------------------------------------------------------------- shared task
def tasks(n: int) -> list[dict]:
    """The first ``n`` dev questions as reader messages (memory = gold supporting sentences) + golds."""
    from memsearch.engine.prompts import reader

    out = []
    for row in json.loads(SAMPLE.read_text())[:n]:
        titles = [title for title, _ in row["context"]]
        sentences = {title: sents for title, sents in row["context"]}
        lines = []
        for title, idx in row["supporting_facts"]:
            if title in sentences and idx < len(sentences[title]):
                lines.append(f"[d{titles.index(title)}:{idx}] {title}: {sentences[title][idx].strip()}")
        messages = [dict(m) for m in reader(row["question"], "\n".join(lines))]
        out.append({"messages": messages, "golds": [row["answer"]]})
    return out


def reward(text: str, golds: list[str]) -> float:
    from memsearch.engine.parsing import parse_reader
    from memsearch.eval.metrics import f1

    return f1(parse_reader(text).answer, golds)


def rss_mib() -> dict[str, float]:
    """Current RSS (and its anonymous / file-backed parts) and peak RSS of this process (MiB), from /proc."""
    got = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            got[key] = int(value.split()[0]) / 1024
    return got


def anon_file(rss: dict[str, float]) -> str:
    return f"{rss.get('RssAnon', 0):.0f} / {rss.get('RssFile', 0):.0f}"


def ids_digest(prompt_ids: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:12]


# ------------------------------------------------------------------ our side
def run_ours(args) -> dict:
    import torch

    from memsearch.backends.base import GenerationRequest, SamplingParams
    from memsearch.backends.hf.backend import HFBackend
    from memsearch.train.config import GRPOConfig, LoraSettings, OptimSettings
    from memsearch.train.distributed import Dist
    from memsearch.train.grpo.batch import Batch, group_advantages
    from memsearch.train.grpo.trainer import update
    from memsearch.train.policy import load_policy, make_optimizer
    from memsearch.train.rows import Row

    items = tasks(args.prompts)
    lora = LoraSettings(r=LORA_R, alpha=LORA_ALPHA, dropout=0.0, target_modules=TARGETS)
    cfg = GRPOConfig(data="unused", group_size=args.group, temperature=1.0, top_p=1.0, aggregation="token",
                     std_scale=False, clip_low=0.2, clip_high=0.2, kl_coef=0.0, epochs=1, lora=lora,
                     optim=OptimSettings(lr=LR, weight_decay=0.0, schedule="constant", max_grad_norm=1.0),
                     max_batch_size=16, device="cpu", dtype="float32", seed=SEED)
    policy, tokenizer, note = load_policy("embedded", None, lora, device="cpu", dtype="float32", seed=SEED)
    backend = HFBackend(
        model="embedded", loaded=(policy, tokenizer), ignore_eos=True, max_batch_size=cfg.rollout.max_batch_size,
        seed=SEED,
    )
    optimizer, scheduler = make_optimizer(policy, cfg.optim, 1)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    requests = [
        GenerationRequest(
            role="reader",
            messages=tuple(item["messages"]),
            sampling=SamplingParams(
                temperature=1.0, top_p=1.0, max_tokens=args.new_tokens, seed=SEED * 100003 + p * args.group + k
            ),
        )
        for p, item in enumerate(items)
        for k in range(args.group)
    ]
    prompt_ids = [backend.prompt_ids(GenerationRequest(role="reader", messages=tuple(it["messages"]))) for it in items]
    before = rss_mib()

    t0 = time.perf_counter()
    results = backend.generate_sync(requests)
    t_gen = time.perf_counter() - t0
    after_gen = rss_mib()
    bad = [r.error for r in results if not r.ok]
    if bad:
        raise RuntimeError(f"generation failed: {bad[0]}")
    rows, rewards = [], []
    for p, item in enumerate(items):
        group = results[p * args.group : (p + 1) * args.group]
        rs = [reward(r.text, item["golds"]) for r in group]
        for k, (res, adv) in enumerate(zip(group, group_advantages(rs, std_scale=False), strict=True)):
            ids = list(res.completion_ids)
            rows.append(
                Row(
                    prompt_ids=list(res.prompt_ids),
                    completion_ids=ids,
                    rollout_logprobs=list(res.logprobs),
                    loss_mask=[1] * len(ids),
                    trajectory=p * args.group + k,
                    group_index=p,
                    role="reader",
                    step=0,
                    advantage=adv,
                )
            )
        rewards += rs
    t1 = time.perf_counter()
    stats = update(policy, optimizer, Batch(rows=rows), cfg, Dist(), pad_id)
    scheduler.step()
    t_end = time.perf_counter()
    after = rss_mib()

    return {
        "step_s": t_end - t0,
        "generate_s": t_gen,
        "update_s": t_end - t1,
        "train_total_s": None,
        "completion_lengths": [len(r.completion_ids) for r in results],
        "eos_in_completions": sum(int(tokenizer.eos_token_id in r.completion_ids) for r in results),
        "prompt_lengths": [len(ids) for ids in prompt_ids],
        "prompt_digest": ids_digest(prompt_ids),
        "rewards": rewards,
        "loss": stats.loss,
        "grad_norm": stats.grad_norm,
        "tokens": stats.tokens,
        "logprob_mismatch": stats.logprob_mismatch,
        "rss_before_step": before,
        "rss_after_generation": after_gen,
        "rss_after_step": after,
        "torch_threads": torch.get_num_threads(),
        "note": note,
    }


# ------------------------------------------------------------------- TRL side
def run_trl(args) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from memsearch.assets.embedded import model_dir

    items = tasks(args.prompts)
    seen: dict[str, list] = {"lengths": [], "rewards": [], "eos": []}

    def f1_reward(prompts, completions, completion_ids, golds, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        out = [reward(t, g) for t, g in zip(texts, golds, strict=True)]
        seen["lengths"] += [len(ids) for ids in completion_ids]
        seen["rewards"] += out
        return out

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.begin = self.end = None
            self.rss = self.after = None

        def on_step_begin(self, args, state, control, **kwargs):
            self.rss = rss_mib()
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.end = time.perf_counter()
            self.after = rss_mib()

    n = args.prompts * args.group
    config = GRPOConfig(
        output_dir=args.tmp,
        per_device_train_batch_size=n,
        gradient_accumulation_steps=1,
        num_generations=args.group,
        max_steps=1,
        max_completion_length=args.new_tokens,
        generation_kwargs={"min_new_tokens": args.new_tokens},
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="none",
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        optim="adamw_torch",
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        model_init_kwargs={"dtype": "float32"},
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
        seed=SEED,
        data_seed=SEED,
        shuffle_dataset=False,
        log_completions=False,
        dataloader_num_workers=0,
    )
    peft = LoraConfig(
        r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=TARGETS, bias="none", task_type="CAUSAL_LM"
    )
    dataset = Dataset.from_list([{"prompt": it["messages"], "golds": it["golds"]} for it in items])
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=str(model_dir()),
        reward_funcs=[f1_reward],
        args=config,
        train_dataset=dataset,
        peft_config=peft,
        callbacks=[timer],
    )
    t_gen = [0.0]
    after_gen = {}
    generate = trainer._generate

    def timed_generate(*a, **k):
        t = time.perf_counter()
        try:
            return generate(*a, **k)
        finally:
            t_gen[0] += time.perf_counter() - t
            after_gen.update(rss_mib())

    trainer._generate = timed_generate
    t0 = time.perf_counter()
    out = trainer.train()
    total = time.perf_counter() - t0
    if timer.begin is None or timer.end is None:
        raise RuntimeError("the step callbacks did not fire")
    prompt_ids = [list(map(int, ids)) for ids in trainer._tokenize_prompts([it["messages"] for it in items])[0]]
    eos = trainer._tokenizer.eos_token_id
    return {
        "step_s": timer.end - timer.begin,
        "generate_s": t_gen[0],
        "update_s": timer.end - timer.begin - t_gen[0],
        "train_total_s": total,
        "completion_lengths": seen["lengths"],
        "eos_in_completions": None,
        "eos_id": eos,
        "prompt_lengths": [len(ids) for ids in prompt_ids],
        "prompt_digest": ids_digest(prompt_ids),
        "rewards": seen["rewards"],
        "loss": float(out.training_loss),
        "grad_norm": None,
        "tokens": sum(seen["lengths"]),
        "logprob_mismatch": None,
        "rss_before_step": timer.rss,
        "rss_after_generation": after_gen,
        "rss_after_step": timer.after,
        "torch_threads": torch.get_num_threads(),
        "note": f"trl {__import__('trl').__version__}",
    }


# -------------------------------------------------------------------- parent
def child(side: str, args) -> dict:
    """Run one side in a fresh process; its JSON plus its peak RSS (MiB) from ``wait4``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        log = Path(tmp) / "log.txt"
        cmd = [
            sys.executable,
            __file__,
            "--side",
            side,
            "--out",
            str(out),
            "--tmp",
            tmp,
            "--prompts",
            str(args.prompts),
            "--group",
            str(args.group),
            "--new-tokens",
            str(args.new_tokens),
        ]
        t0 = time.perf_counter()
        with log.open("w") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        if proc.returncode != 0 or not out.is_file():
            tail = log.read_text()[-4000:]
            raise SystemExit(f"side {side} failed (exit {proc.returncode}):\n{tail}")
        result = json.loads(out.read_text())
    result["peak_rss_mib"] = usage.ru_maxrss / 1024  # Linux: KiB
    result["process_s"] = wall
    return result


# ------------------------------------------------------------ shared-prompt case
def shared_prompt_case(group: int, repeats: int) -> None:
    """``--case shared-prompt`` (module doc)."""
    import torch

    from memsearch.engine.prompts import memory_decision
    from memsearch.train.config import GRPOConfig, LoraSettings, OptimSettings
    from memsearch.train.distributed import Dist
    from memsearch.train.grpo.batch import Batch
    from memsearch.train.grpo.trainer import update
    from memsearch.train.policy import load_policy, make_optimizer, trainable_parameters
    from memsearch.train.rows import Row

    row = json.loads(SAMPLE.read_text())[0]
    titles = [title for title, _ in row["context"]]
    sentences = dict((title, sents) for title, sents in row["context"])
    evidence = "\n".join(f"[d{titles.index(t)}:{i}] {t}: {sentences[t][i].strip()}" for t, i in row["supporting_facts"])
    first = row["supporting_facts"][0]
    memory = f"[m1] (fact; d{titles.index(first[0])}:{first[1]}) {sentences[first[0]][first[1]].strip()}"
    lora = LoraSettings(r=LORA_R, alpha=LORA_ALPHA, target_modules=TARGETS)
    torch.manual_seed(SEED)
    policy, tokenizer, _ = load_policy("embedded", None, lora, device="cpu", seed=SEED)
    prompt_text = tokenizer.apply_chat_template(
        [dict(m) for m in memory_decision(row["question"], memory, evidence, 60)], tokenize=False,
        add_generation_prompt=True)
    prompt = tokenizer.encode(prompt_text, add_special_tokens=False)
    rows = []
    for k, (t, i) in enumerate((row["supporting_facts"] * group)[:group]):
        text = sentences[t][i].strip()
        ops = (f'{{"ops": [{{"op": "ADD", "text": "{text}", "sources": ["d{titles.index(t)}:{i}"], '
               f'"kind": "fact"}}]}}' if k % 2 == 0 else '{"ops": [{"op": "NOOP"}]}')
        ids = tokenizer.encode(ops, add_special_tokens=False)
        rows.append(Row(prompt, ids, [0.0] * len(ids), [1] * len(ids), k, 0, "memory", 0,
                        advantage=(k - (group - 1) / 2) / group))
    tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    print(f"shared-prompt case: 1 prompt of {len(prompt)} tokens x group {group}, completions "
          f"{[len(r.completion_ids) for r in rows]} tokens; {tokens} tokens row by row, "
          f"{len(prompt) + sum(len(r.completion_ids) for r in rows)} packed", flush=True)
    start = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    timings, grads = {}, {}
    for shared in (False, True):
        cfg = GRPOConfig(data="unused", lora=lora, optim=OptimSettings(lr=LR), share_prompts=shared,
                         micro_batch_tokens=8192, aggregation="token")
        best = float("inf")
        for _ in range(repeats):
            with torch.no_grad():
                for n, p in policy.named_parameters():
                    if n in start:
                        p.copy_(start[n])
            optimizer, _ = make_optimizer(policy, cfg.optim, 1)
            t0 = time.perf_counter()
            update(policy, optimizer, Batch(rows=rows), cfg, Dist(), tokenizer.eos_token_id)
            best = min(best, time.perf_counter() - t0)
            grads[shared] = [p.grad.detach().clone() for p in trainable_parameters(policy)]
        timings[shared] = best
        print(f"  {'shared' if shared else 'row by row'}: {best:.2f}s per update, {tokens / best:.0f} tokens/s",
              flush=True)
    diff = max(float((a - b).abs().max()) for a, b in zip(grads[False], grads[True], strict=True))
    print(f"largest gradient difference shared vs row by row: {diff:.2e}")
    ratio = timings[False] / timings[True]
    print(f"RESULT tokens_per_s_ratio={ratio:.3f} shared_tokens_per_s={tokens / timings[True]:.1f} "
          f"unshared_tokens_per_s={tokens / timings[False]:.1f} group={group}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=("ours", "trl"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    parser.add_argument("--prompts", type=int, default=PROMPTS)
    parser.add_argument("--group", type=int, default=None, help=f"rows per prompt (default {GROUP}; shared-prompt: 6)")
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    parser.add_argument("--case", choices=("trl", "shared-prompt"), default="trl",
                        help="trl: ours vs TRL (default); shared-prompt: share_prompts vs row by row")
    parser.add_argument("--repeats", type=int, default=2, help="shared-prompt: updates per side (fastest kept)")
    args = parser.parse_args()
    if args.group is None:
        args.group = 6 if args.case == "shared-prompt" else GROUP
    if args.case == "shared-prompt":
        shared_prompt_case(args.group, args.repeats)
        return
    if args.side:
        result = (run_ours if args.side == "ours" else run_trl)(args)
        Path(args.out).write_text(json.dumps(result))
        return

    n = args.prompts * args.group
    print(
        f"GRPO step, embedded SmolLM2-135M-Instruct, CPU fp32, torch threads from OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', '(unset)')}; host load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{args.prompts} reader prompts (HotpotQA dev, gold memory) x group {args.group} = {n} samples, "
        f"{args.new_tokens} new tokens each, temperature 1.0, LoRA r={LORA_R} alpha={LORA_ALPHA} on "
        f"{','.join(TARGETS)}, "
        f"lr {LR}, 1 optimizer step, no KL, 1 iteration, token-level loss, advantages not std-scaled",
        flush=True,
    )
    results = {}
    for side in ("ours", "trl"):
        print(f"running {side} in a child process (host load {os.getloadavg()[0]:.1f}) ...", flush=True)
        results[side] = r = child(side, args)
        r["samples_per_s"] = n / r["step_s"]
        print(
            f"  {side}: step {r['step_s']:.2f}s (generation {r['generate_s']:.2f}s, rest {r['update_s']:.2f}s), "
            f"{r['samples_per_s']:.3f} samples/s, peak RSS {r['peak_rss_mib']:.0f} MiB, process {r['process_s']:.1f}s"
            + (f", trainer.train() {r['train_total_s']:.2f}s" if r["train_total_s"] is not None else ""),
            flush=True,
        )

    ours, trl = results["ours"], results["trl"]
    print()
    print(f"{'':<32}{'ours':>14}{'trl':>14}")
    rows = [
        ("step wall time (s)", f"{ours['step_s']:.2f}", f"{trl['step_s']:.2f}"),
        ("  generation (s)", f"{ours['generate_s']:.2f}", f"{trl['generate_s']:.2f}"),
        ("  reward+logprobs+loss+bwd+opt (s)", f"{ours['update_s']:.2f}", f"{trl['update_s']:.2f}"),
        ("samples/s", f"{ours['samples_per_s']:.3f}", f"{trl['samples_per_s']:.3f}"),
        ("peak RSS (MiB, wait4)", f"{ours['peak_rss_mib']:.0f}", f"{trl['peak_rss_mib']:.0f}"),
        (
            "RSS at step start (MiB)",
            f"{ours['rss_before_step']['VmRSS']:.0f}",
            f"{trl['rss_before_step']['VmRSS']:.0f}",
        ),
        ("  anonymous / file-backed", anon_file(ours["rss_before_step"]), anon_file(trl["rss_before_step"])),
        (
            "peak RSS to end of generation",
            f"{ours['rss_after_generation']['VmHWM']:.0f}",
            f"{trl['rss_after_generation']['VmHWM']:.0f}",
        ),
        ("RSS at step end (MiB)", f"{ours['rss_after_step']['VmRSS']:.0f}", f"{trl['rss_after_step']['VmRSS']:.0f}"),
        ("  anonymous / file-backed", anon_file(ours["rss_after_step"]), anon_file(trl["rss_after_step"])),
        ("completion tokens", str(sum(ours["completion_lengths"])), str(sum(trl["completion_lengths"]))),
        (
            "completion lengths (min-max)",
            f"{min(ours['completion_lengths'])}-{max(ours['completion_lengths'])}",
            f"{min(trl['completion_lengths'])}-{max(trl['completion_lengths'])}",
        ),
        ("prompt tokens", str(sum(ours["prompt_lengths"])), str(sum(trl["prompt_lengths"]))),
        (
            "mean reward (f1)",
            f"{sum(ours['rewards']) / len(ours['rewards']):.3f}",
            f"{sum(trl['rewards']) / len(trl['rewards']):.3f}",
        ),
        ("loss", f"{ours['loss']:.4f}", f"{trl['loss']:.4f}"),
        ("torch threads", str(ours["torch_threads"]), str(trl["torch_threads"])),
    ]
    for name, a, b in rows:
        print(f"{name:<32}{a:>14}{b:>14}")
    same_prompts = ours["prompt_digest"] == trl["prompt_digest"]
    print(
        f"prompt token ids identical on both sides: {same_prompts} (lengths {ours['prompt_lengths']} vs "
        f"{trl['prompt_lengths']})"
    )
    print(
        f"ours: {ours['eos_in_completions']} of {n} completions sampled an EOS mid-way and went on (ignore_eos); "
        f"rollout vs recomputed log-prob max |diff| {ours['logprob_mismatch']:.2e}"
    )
    if len(trl["completion_lengths"]) != n or len(ours["completion_lengths"]) != n:
        print(
            f"WARNING: completions ours {len(ours['completion_lengths'])}, trl {len(trl['completion_lengths'])}, "
            f"expected {n}"
        )
    if set(ours["completion_lengths"]) != {args.new_tokens} or set(trl["completion_lengths"]) != {args.new_tokens}:
        print(f"WARNING: not every completion is {args.new_tokens} tokens long")
    speed = ours["samples_per_s"] / trl["samples_per_s"]
    mem = trl["peak_rss_mib"] / ours["peak_rss_mib"]
    print(f"RESULT samples_per_s_ratio={speed:.3f} peak_mem_ratio={mem:.3f}")


if __name__ == "__main__":
    main()

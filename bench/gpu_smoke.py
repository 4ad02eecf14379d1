"""GPU smoke test (issue 51): what the first minutes on a GPU node would show, in JSON records.

    scripts/gpu_smoke.sh                           # one H100/H200, no network, < 8 min: docs/results/gpu/*.json
    scripts/gpu_smoke.sh --dry-run --out DIR       # the same parts on a CPU at tiny shapes (CI): ~50 CPU s

No pretrained weights travel: each model is a random-init ``AutoModelForCausalLM`` of a real
shape, built on the device from ``configs/model_shapes/<name>/config.json`` (vocabulary, tied or
untied head and all; only the token ids of the embedded SmolLM2 tokenizer are used, which the
memory role's ops schema guarantees: it masks every id the tokenizer lacks). The tokenizer comes
from ``--tokenizer DIR`` (``scripts/prepare_gpu_bench.sh`` copies it to ``.gpu/tokenizer``: the
98 MB GGUF cannot travel) or, without it, from the embedded GGUF; ``--wheels DIR`` installs what
the device image lacks (pydantic, platformdirs, bm25s, ...; ``bench/grpo_gpu.install_wheels``).

Parts, each in a subprocess of its own with a time limit (a hung or crashed part records its
error and the next part runs; the whole run stays inside ``--budget-s``), one record each
(``<out>/<part>.json``, strict JSON), plus ``summary.json``; exit status 0 only when every part
passed:

- ``device``: GPU name, memory, compute capability, driver (``nvidia-smi``), CUDA runtime,
  cuDNN, NCCL, Python, torch, and the versions of the packages memsearch needs (null: missing).
- ``nccl``: a world of one (``init_process_group`` over a file store, no network) all-reducing a
  float32 buffer the size of the gradient ``Dist.reduce_gradients`` flattens for the largest
  shape (its LoRA parameters, counted by peft on the ``meta`` device): init time, bytes, time per
  all-reduce, algorithm bandwidth, and that the sum came back unchanged. On a CPU the backend is
  gloo, as ``Dist`` uses without CUDA, and the record says so (``fallback``).
- ``grpo-<shape>``: two GRPO steps of ``memsearch.train.grpo.trainer.train_grpo`` (the code ``memsearch
  train grpo`` runs, unchanged), ``hf`` rollouts on the device, bfloat16 on CUDA, through
  ``bench/grpo_gpu.py``'s episode and recipe (``ours_config`` / ``run_ours``) with
  4,096-token micro-batches and gradient checkpointing on, 16 tasks x 8 rollouts a step at 0.5B
  and 8 x 8 at 7B (``GPU_SIZING``); rollout and update tokens/s per step as ``run_ours``
  computes them (the last step's on top: step 1 pays CUDA warm-up); the peak memory
  (``torch.cuda.max_memory_allocated`` over the training run; on a CPU the process's peak RSS, a
  stand-in) beside the pre-flight's estimate (``estimate_memory`` of
  ``memsearch.train.memory_plan``, from the model's config.json and the run's config); the train
  log's ``logprob_mismatch`` / ``logprob_mismatch_mean`` (bf16 base, float32 LoRA: sampler vs
  trainer).

Every record has ``part``, ``ok``, ``error`` (null, or ``type`` / ``message`` / ``traceback``; a
part killed at its limit or dead without a record gets its log's tail as the traceback),
``wall_s``, ``cpu_s`` (CPU seconds of its process) and ``time_limit_s``. A non-finite number is
written as null and named in ``non_finite``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from grpo_gpu import ROOT, SHAPES, install_wheels  # bench/ is on sys.path: this script's folder

SHAPES_DIR = ROOT / "configs" / "model_shapes"
DEFAULT_SHAPES = ("qwen2.5-0.5b-instruct", "qwen2.5-7b-instruct")
MICRO_BATCH_TOKENS = 4096
STEPS = 2
# Tasks x group per step on a GPU: grpo_gpu.py's 16 x 8 at 0.5B; half the tasks at 7B keeps the
# part well inside its limit (a step there is ~15x the compute). The CPU dry run: 1 x 2.
GPU_SIZING = {"qwen2.5-0.5b-instruct": (16, 8), "qwen2.5-7b-instruct": (8, 8)}
DRY_SIZING = (1, 2)
# Seconds a part may take at most, cut to what is left of --budget-s (the wheel install included):
# a hung part costs its limit, and the run as a whole stays under 8 minutes.
LIMITS_S = {"device": 60, "nccl": 90, "grpo-qwen2.5-0.5b-instruct": 150}
GRPO_LIMIT_S = 300
BUDGET_S = 465
NCCL_WARMUP, NCCL_ITERS = 3, 10
# Versions the device record reports (null: not installed): the image's stack, then what
# memsearch needs beside it (from --wheels or the image).
PACKAGES = ("transformers", "peft", "accelerate", "tokenizers", "safetensors", "numpy", "pydantic", "pydantic-core",
            "platformdirs", "bm25s", "PyStemmer", "scipy")


# ---------------------------------------------------------------- records


def strict_json(obj: Any, where: str = "", bad: list[str] | None = None) -> Any:
    """``obj`` with every NaN / infinity replaced by None (its path appended to ``bad``)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        if bad is not None:
            bad.append(where or "<record>")
        return None
    if isinstance(obj, dict):
        return {k: strict_json(v, f"{where}.{k}" if where else str(k), bad) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v, f"{where}[{i}]", bad) for i, v in enumerate(obj)]
    return obj


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Strict JSON (no NaN), sorted keys; non-finite numbers become null, named in ``non_finite``."""
    from memsearch.io import write_json

    bad: list[str] = []
    clean = strict_json(record, bad=bad)
    if bad:
        clean["non_finite"] = bad
    write_json(path, clean)


def error_of(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}


# ---------------------------------------------------------------- shapes and models


def shape_config(name: str, tiny: bool) -> dict[str, Any]:
    """The ``config.json`` of a real shape; ``tiny`` keeps its vocabulary, head tying and
    architecture but shrinks the layers to grpo_gpu.py's tiny shape (the CPU dry run)."""
    path = SHAPES_DIR / name / "config.json"
    if not path.is_file():
        known = sorted(p.parent.name for p in SHAPES_DIR.glob("*/config.json"))
        raise FileNotFoundError(f"configs/model_shapes/{name}/config.json: no such model shape (there are {known})")
    config = json.loads(path.read_text())
    return {**config, **SHAPES["tiny"]} if tiny else config


def load_tokenizer(folder: str | None):
    from transformers import AutoTokenizer

    if folder is None:  # the embedded GGUF's tokenizer (not on a device machine: pass --tokenizer)
        from memsearch.assets.embedded import tokenizer_dir

        folder = str(tokenizer_dir())
    elif not Path(folder).is_dir():
        raise FileNotFoundError(f"--tokenizer {folder}: no such folder (scripts/prepare_gpu_bench.sh writes "
                                ".gpu/tokenizer; carry it)")
    return AutoTokenizer.from_pretrained(folder)


def build_random_model(config: dict[str, Any], tokenizer, device: str, dtype: str, out: Path) -> dict[str, Any]:
    """A random-init causal LM of ``config`` built directly on ``device`` in ``dtype`` (seconds,
    even at 7B, on a GPU), saved with ``tokenizer`` as a local Hugging Face folder; returns what
    the record says about it. The special-token ids are the tokenizer's."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    conf = AutoConfig.for_model(**{**config, **ids})
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(conf, dtype=getattr(torch, dtype))
    built_s = time.perf_counter() - t0
    model.save_pretrained(str(out))
    GenerationConfig(**ids).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    info = {
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": conf.vocab_size,
        "tokenizer_ids": len(tokenizer),
        "hidden_size": conf.hidden_size,
        "num_hidden_layers": conf.num_hidden_layers,
        "tie_word_embeddings": bool(conf.tie_word_embeddings),
        "dtype": dtype,
        "build_s": built_s,
        "save_s": time.perf_counter() - t0 - built_s,
    }
    del model
    return info


def lora_elements(config: dict[str, Any], r: int) -> int:
    """Trainable parameters of a LoRA of rank ``r`` on the trainer's default target modules,
    counted by peft on a ``meta``-device model of ``config`` (no memory, no weights)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from memsearch.train.config import LoraSettings

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
        lora = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules=LoraSettings().target_modules))
    return lora.get_nb_trainable_parameters()[0]


# ---------------------------------------------------------------- parts (each runs in its own process)


def nccl_version() -> str:
    import torch

    version = torch.cuda.nccl.version()  # a tuple in recent torch, an int (2.21.5 -> 22105) before
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def part_device(opts, record: dict[str, Any]) -> None:
    import importlib.metadata as md

    import torch

    def version(name: str) -> str | None:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    record.update(python=platform.python_version(), torch=torch.__version__, cuda_runtime=torch.version.cuda,
                  packages={name: version(name) for name in PACKAGES})
    if opts.device != "cuda":
        record.update(kind="cpu", name=platform.processor() or platform.machine(),
                      memory_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), cpu_count=os.cpu_count())
        return
    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device (torch.cuda.is_available() is False)")
    props = torch.cuda.get_device_properties(0)
    record.update(kind="cuda", name=props.name, memory_bytes=props.total_memory,
                  compute_capability=f"{props.major}.{props.minor}", device_count=torch.cuda.device_count(),
                  bf16_supported=torch.cuda.is_bf16_supported(), cudnn=torch.backends.cudnn.version(),
                  nccl=nccl_version(), cpu_count=os.cpu_count())
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        record["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
        record["driver"] = smi.stdout.split(",")[0].strip() if smi.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired) as exc:
        record.update(driver=None, nvidia_smi=f"{type(exc).__name__}: {exc}")


def part_nccl(opts, record: dict[str, Any]) -> None:
    import torch
    import torch.distributed as td

    cuda = opts.device == "cuda"
    shape = opts.shapes[-1]
    r = 64 if cuda else 4  # grpo_gpu.run_ours's LoRA rank
    elements = lora_elements(shape_config(shape, opts.dry_run), r)
    record.update(backend="nccl" if cuda else "gloo", world_size=1,
                  fallback=None if cuda else "CPU dry run: gloo, the backend memsearch.train.distributed.Dist "
                                             "uses without CUDA (NCCL serves CUDA tensors only)",
                  buffer=f"float32 gradient of a LoRA r={r} on the default target modules of {shape}"
                         f"{' (tiny)' if opts.dry_run else ''}",
                  buffer_elements=elements, buffer_bytes=4 * elements)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        record["nccl_version"] = nccl_version()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    store = Path(opts.work) / "nccl-store"
    t0 = time.perf_counter()
    td.init_process_group(record["backend"], init_method=f"file://{store}", rank=0, world_size=1)
    try:
        flat = torch.ones(elements, dtype=torch.float32, device=device)
        td.all_reduce(flat)  # the first collective builds the communicator
        sync()
        record["init_s"] = time.perf_counter() - t0
        for _ in range(NCCL_WARMUP):
            td.all_reduce(flat)
        sync()
        times = []
        for _ in range(NCCL_ITERS):
            t = time.perf_counter()
            td.all_reduce(flat)
            sync()
            times.append(time.perf_counter() - t)
        record["sum_unchanged"] = bool(torch.all(flat == 1.0))  # a world of one: the sum is the buffer itself
        record.update(iterations=NCCL_ITERS, all_reduce_s=times, all_reduce_median_s=sorted(times)[len(times) // 2],
                      algbw_gb_s=4 * elements / sorted(times)[len(times) // 2] / 1e9)
        if not record["sum_unchanged"]:
            raise RuntimeError("all-reduce over a world of one changed the buffer")
    finally:
        td.destroy_process_group()


def part_grpo(opts, record: dict[str, Any], shape: str) -> None:
    from argparse import Namespace

    from grpo_gpu import ours_config, peak_mem_gib, run_ours

    from memsearch.assets.samples import HOTPOT_TRAIN, samples_dir
    from memsearch.data.dataset import save_dataset
    from memsearch.data.hotpot import convert_hotpot
    from memsearch.io import iter_jsonl
    from memsearch.train.memory_plan import estimate_memory

    work = Path(opts.work) / shape
    work.mkdir(parents=True)
    tasks, group = DRY_SIZING if opts.dry_run else GPU_SIZING.get(shape, GPU_SIZING[DEFAULT_SHAPES[-1]])
    args = Namespace(device=opts.device, dtype=opts.dtype, steps=STEPS, tasks_per_step=tasks, group_size=group,
                     no_schema=False)
    record["shape"] = shape
    record["shape_config"] = f"configs/model_shapes/{shape}/config.json" + (" (tiny layers)" if opts.dry_run else "")
    model = work / "model"
    record["model"] = build_random_model(shape_config(shape, opts.dry_run), load_tokenizer(opts.tokenizer),
                                         opts.device, opts.dtype, model)
    data = work / "hotpot-train"
    save_dataset(convert_hotpot(samples_dir() / HOTPOT_TRAIN, split="train"), data)
    cfg = ours_config(args, model, data, work / "ours",
                      overrides=[f"micro_batch_tokens={MICRO_BATCH_TOKENS}", "gradient_checkpointing=true"])
    record["run"] = {
        "steps": cfg.steps, "tasks_per_step": cfg.rollout.tasks_per_step, "group_size": cfg.rollout.group_size,
        "micro_batch_tokens": cfg.update.micro_batch_tokens, "gradient_checkpointing": cfg.gradient_checkpointing,
        "max_batch_size": cfg.rollout.max_batch_size, "lora_r": cfg.lora.r, "lora_alpha": cfg.lora.alpha,
        "kl_coef": cfg.loss.kl_coef, "schema_mode": cfg.rollout.schema_mode, "device": cfg.device, "dtype": cfg.dtype,
        "rollout_backend": cfg.episode.backends.memory.kind,
    }
    try:  # a failing estimate is recorded; the run is still measured
        estimate = estimate_memory(json.loads((model / "config.json").read_text()), cfg)
        record.update(estimate_bytes=estimate.total_bytes, estimate_lines=list(estimate.lines()))
    except Exception as exc:  # noqa: BLE001
        estimate, record["estimate_error"] = None, error_of(exc)
    if opts.device == "cuda":
        import torch

        record["device_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
    record["peak_source"] = ("torch.cuda.max_memory_allocated over train_grpo" if opts.device == "cuda"
                             else "peak RSS of the process (CPU stand-in, includes Python and torch)")
    try:
        ours = run_ours(args, model, data, work / "ours", cfg=cfg)
    finally:  # also after an out-of-memory error: how far it got
        record["peak_bytes"] = int(peak_mem_gib(opts.device) * 2**30)
        if estimate is not None and estimate.total_bytes:
            record["peak_over_estimate"] = record["peak_bytes"] / estimate.total_bytes
    logged = {rec["step"]: rec for _, rec in iter_jsonl(work / "ours" / "train_log.jsonl") if "rollout_s" in rec}
    keep = ("logprob_mismatch", "logprob_mismatch_mean", "reward_mean", "kl", "grad_norm", "step_s")
    record["steps"] = [{**step, **{k: logged[step["step"]].get(k) for k in keep}} for step in ours["steps"]]
    last = record["steps"][-1]
    record.update(total_s=ours["total_s"], rollout_tok_s=last["rollout_tok_s"], update_tok_s=last["update_tok_s"],
                  logprob_mismatch_mean=last["logprob_mismatch_mean"], logprob_mismatch=last["logprob_mismatch"])
    if estimate is None:
        raise RuntimeError(f"the run passed, the pre-flight estimate failed: {record['estimate_error']['message']}")


def run_part(opts) -> int:
    """The child: one part, its record written to ``--record`` whatever happens; exit 0 = passed."""
    record: dict[str, Any] = {"part": opts.part, "ok": False, "error": None}
    try:
        if opts.part == "device":
            part_device(opts, record)
        elif opts.part == "nccl":
            part_nccl(opts, record)
        elif opts.part.startswith("grpo-"):
            part_grpo(opts, record, opts.part.removeprefix("grpo-"))
        else:
            raise ValueError(f"unknown part {opts.part!r}")
        record["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - the record carries any failure, out-of-memory included
        record["error"] = error_of(exc)
        traceback.print_exc()
    write_record(Path(opts.record), record)
    return 0 if record["ok"] else 1


# ---------------------------------------------------------------- the driver


def child_command(opts, part: str, record: Path) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--part", part, "--record", str(record),
           "--work", opts.work, "--shapes", ",".join(opts.shapes)]
    cmd += ["--dry-run"] if opts.dry_run else []
    cmd += ["--tokenizer", opts.tokenizer] if opts.tokenizer else []
    return cmd


def run_child(cmd: list[str], env: dict[str, str], log: Path, limit_s: float) -> tuple[int | None, float, float]:
    """Run one part in its own session, its output into ``log``; kill its process group at
    ``limit_s``. Returns (exit code or None when killed, wall seconds, CPU seconds it used)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        try:
            code = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:  # past its limit, the driver interrupted, or a process the part left behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return code, wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def part_record(part: str, raw: Path, code: int | None, log: str, wall_s: float, limit_s: float) -> dict[str, Any]:
    """A part's final record: the one its process wrote (``raw``), or, when it was killed at its
    limit (``code`` None) or died without one, an error carrying its log's tail; passed only when
    the record says so and the process exited 0."""
    if raw.is_file():
        record = json.loads(raw.read_text())
    else:
        why = (f"killed at its time limit of {limit_s:.0f} s" if code is None
               else f"the part's process exited with status {code} without writing its record")
        record = {"part": part, "ok": False,
                  "error": {"type": "Timeout" if code is None else "Crash", "message": why, "traceback": log[-6000:]}}
    return {**record, "wall_s": wall_s, "time_limit_s": limit_s, "ok": bool(record.get("ok")) and code == 0}


def drive(opts) -> int:
    """Every part in turn within the budget; records into ``opts.out``; 0 when all passed."""
    start = time.perf_counter()
    deadline = start + opts.budget_s
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    work_tmp = None if opts.keep else tempfile.TemporaryDirectory(prefix="gpu-smoke-")
    opts.work = str(Path(opts.keep or work_tmp.name).resolve())
    Path(opts.work).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    paths = [str(ROOT / "src")]
    wheels = None
    if opts.wheels and not opts.dry_run and not Path(opts.wheels).is_dir():
        wheels = (f"--wheels {opts.wheels}: no such folder (scripts/prepare_gpu_bench.sh writes .gpu/wheels; "
                  "carry it); the parts run with what the image has")
        print(wheels)
    elif opts.wheels and not opts.dry_run:
        wheels = install_wheels([opts.wheels], Path(opts.work) / "site")  # an error text, or None
        if wheels:
            print(f"--wheels: {wheels}")
        paths.insert(0, str(Path(opts.work) / "site"))  # what did install still comes first
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p])
    parts = ["device", "nccl"] + [f"grpo-{s}" for s in opts.shapes]
    summary = []
    for part in parts:
        left = deadline - time.perf_counter()
        limit = min(LIMITS_S.get(part, GRPO_LIMIT_S), left)
        target = out / f"{part}.json"
        if limit < 10:
            record = {"part": part, "ok": False, "error": {"type": "Skipped", "traceback": "",
                      "message": f"the run's budget of {opts.budget_s:g} s was spent before this part"}}
            write_record(target, {**record, "wall_s": 0.0, "cpu_s": 0.0, "time_limit_s": 0.0})
            summary.append({"part": part, "ok": False, "wall_s": 0.0, "cpu_s": 0.0, "error": "Skipped"})
            continue
        print(f"== {part} (limit {limit:.0f} s)", flush=True)
        raw, log = Path(opts.work) / f"{part}.record.json", Path(opts.work) / f"{part}.log"
        code, wall, cpu = run_child(child_command(opts, part, raw), env, log, limit)
        text = log.read_text(errors="replace")
        print(text, end="" if text.endswith("\n") else "\n", flush=True)
        record = {**part_record(part, raw, code, text, wall, limit), "cpu_s": cpu}
        write_record(target, record)
        summary.append({"part": part, "ok": record["ok"], "wall_s": wall, "cpu_s": cpu,
                        "error": (record.get("error") or {}).get("type")})
        print(f"== {part}: {'ok' if record['ok'] else 'FAILED'} in {wall:.1f} s -> {target}", flush=True)
    ok = all(s["ok"] for s in summary)
    write_record(out / "summary.json", {"ok": ok, "parts": summary, "dry_run": opts.dry_run, "budget_s": opts.budget_s,
                                        "wheels": None if opts.dry_run or not opts.wheels else wheels or "installed",
                                        "total_s": time.perf_counter() - start, "shapes": opts.shapes,
                                        "micro_batch_tokens": MICRO_BATCH_TOKENS, "steps": STEPS})
    print(f"gpu smoke: {sum(s['ok'] for s in summary)}/{len(summary)} parts passed in "
          f"{time.perf_counter() - start:.0f} s; records in {out}")
    if work_tmp is not None:
        work_tmp.cleanup()
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="the CPU at tiny shapes (float32), records into --out (default: a new temporary folder)")
    parser.add_argument("--out", default=None, help="where the records go (default: docs/results/gpu on a GPU)")
    parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES),
                        help="comma list of configs/model_shapes names, smallest first (the NCCL buffer is the last's)")
    parser.add_argument("--tokenizer", default=None, help="a saved tokenizer folder (default: the embedded one)")
    parser.add_argument("--wheels", default=None, help="a folder of wheels the device image lacks (not in --dry-run)")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="seconds for every part together")
    parser.add_argument("--keep", default=None, help="keep the models and run folders here (default: temporary)")
    parser.add_argument("--part", default=None, help=argparse.SUPPRESS)  # the child's side
    parser.add_argument("--record", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    opts.shapes = [s for s in opts.shapes.split(",") if s]
    if opts.tokenizer:  # the parts run from the checkout's root
        opts.tokenizer = str(Path(opts.tokenizer).resolve())
    opts.device, opts.dtype = ("cpu", "float32") if opts.dry_run else ("cuda", "bfloat16")
    if opts.part is not None:
        sys.exit(run_part(opts))
    if opts.out is None:
        opts.out = tempfile.mkdtemp(prefix="gpu-smoke-dry-") if opts.dry_run else str(ROOT / "docs" / "results" / "gpu")
    sys.exit(drive(opts))


if __name__ == "__main__":
    main()

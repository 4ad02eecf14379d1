"""The device check before ``memsearch experiment run`` starts anything: the GPUs a
``devices.DeviceLayout`` names must be there and compute (a matmul, a one-token generate each);
its record goes into ``run.json``. It imports torch and transformers, so it lives here, beside its
one caller, not in the foundation's ``devices`` (which only describes and applies layouts)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Any

from memsearch.devices import TRAIN, DeviceLayout
from memsearch.errors import InputError


def driver_version() -> str:
    """The NVIDIA driver version ``nvidia-smi`` reports (first GPU), else ``"unknown"``."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "unknown (no nvidia-smi)"
    try:
        done = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({type(exc).__name__})"
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else f"unknown (nvidia-smi exit {done.returncode})"


def _gpu_check(torch: Any, index: int) -> dict[str, Any]:
    """One GPU: a matmul checked against the CPU's, a one-token generate of a tiny random Llama."""
    from transformers import LlamaConfig, LlamaForCausalLM

    device = torch.device("cuda", index)
    gen = torch.Generator().manual_seed(index)
    a, b = torch.randn(64, 64, generator=gen), torch.randn(64, 64, generator=gen)
    diff = ((a.to(device) @ b.to(device)).cpu() - a @ b).abs().max().item()
    if not diff < 1e-2:  # TF32 at most ~1e-3 here; NaN fails too
        raise InputError(f"GPU {index}: a 64x64 matmul differs from the CPU's by {diff:g}; this GPU computes wrong "
                         "results (check `nvidia-smi -q` for ECC errors, or leave it out of the layout)")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    model = LlamaForCausalLM(config).to(device).eval()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(torch.tensor([[1, 2, 3]], device=device), max_new_tokens=1, do_sample=False)
    seconds = time.perf_counter() - start
    if tuple(out.shape) != (1, 4):
        raise InputError(f"GPU {index}: a one-token generate returned shape {tuple(out.shape)}, expected (1, 4)")
    props = torch.cuda.get_device_properties(index)
    del model
    torch.cuda.empty_cache()
    return {"index": index, "name": props.name, "total_memory_bytes": int(props.total_memory),
            "matmul_max_abs_diff": diff, "generate_s": round(seconds, 3)}


def check_devices(layout: DeviceLayout, echo=print) -> dict[str, Any]:
    """The device check before any server starts or any training runs; the returned record goes
    into ``run.json``.

    A layout naming no GPU is a CPU run: ``{"cuda": False, "gpus": [], "note": ...}``. A layout
    naming GPUs is refused (``InputError``) when torch sees no CUDA device or fewer than its
    highest index + 1, saying how many each side has and what to check (driver, torch build);
    otherwise each GPU runs a small matmul checked against the CPU's and a one-token generate of
    a tiny random-init Llama (2 layers, hidden 64), and the record holds its name and memory,
    the driver version (``nvidia-smi``) and torch's CUDA version. The GPU path cannot run on
    the CPU machines of CI; the tests cover the CPU run and the refusal."""
    uses: dict[int, list[str]] = {}
    for name, gpus in {TRAIN: layout.train, **layout.services}.items():
        for gpu in gpus:
            uses.setdefault(gpu, []).append(name)
    if not uses:
        record: dict[str, Any] = {"cuda": False, "gpus": [], "note": "no GPU in the layout: CPU run"}
        echo(f"devices: {record['note']}")
        return record
    import torch

    driver, cuda = driver_version(), torch.version.cuda
    build = f"torch {torch.__version__} " + (f"built for CUDA {cuda}" if cuda else "(CPU-only build)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hint = (f"{build}, NVIDIA driver {driver}"
            + (f", CUDA_VISIBLE_DEVICES={visible}" if visible is not None else "")
            + "; check `nvidia-smi` and install the torch build for this node's driver (docs/server.md)")
    needed = max(uses) + 1
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if seen < needed:
        raise InputError(f"devices: the layout names {len(uses)} GPU(s) ({', '.join(map(str, sorted(uses)))}; "
                         f"indices up to {needed - 1} need {needed}), but torch sees {seen}: {hint}")
    checked = []
    for index in sorted(uses):
        gpu = {**_gpu_check(torch, index), "uses": uses[index]}
        echo(f"devices: GPU {index} ({', '.join(uses[index])}): {gpu['name']}, "
             f"{gpu['total_memory_bytes'] / 2**30:.1f} GiB; matmul ok (max diff {gpu['matmul_max_abs_diff']:.1e}), "
             f"one-token generate ok ({gpu['generate_s']:.2f} s)")
        checked.append(gpu)
    echo(f"devices: NVIDIA driver {driver}, {build}, {seen} GPU(s) visible")
    return {"cuda": True, "driver": driver, "torch": torch.__version__, "torch_cuda": cuda, "visible": visible,
            "device_count": seen, "gpus": checked}

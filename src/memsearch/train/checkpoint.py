"""Resumable checkpoints: adapter + optimizer + scheduler + RNG of every rank + data position.

Layout (``<run>/checkpoints/step-000012/``)::

    adapter/            the LoRA adapter (PEFT save_pretrained; loadable by the hf backend)
    trainer.pt          optimizer and scheduler state, step, extra (data position, counters)
    rng-rank{r}.pt      Python, NumPy, torch CPU (and CUDA) RNG states of rank r
    COMPLETE            written last: a folder without it is ignored (a crash mid-save)

A checkpoint is written into a temporary folder and renamed, so a crash never leaves a folder
that looks complete. ``load_checkpoint`` restores everything in place, so continuing from step
k gives exactly the weights and optimizer state of an uninterrupted run (tested).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memsearch.train.distributed import Dist
from memsearch.train.policy import save_adapter

_COMPLETE = "COMPLETE"


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(root: Path, step: int, model, optimizer, scheduler, dist: Dist, extra: dict[str, Any],
                    keep: int = 2) -> Path:
    """Write ``root/step-{step:06d}`` (all ranks call this); returns the folder."""
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp"
    if dist.main:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        save_adapter(model, tmp / "adapter")
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "step": step,
                    "extra": extra}, tmp / "trainer.pt")
    dist.barrier()
    torch.save(rng_state(), tmp / f"rng-rank{dist.rank}.pt")
    dist.barrier()
    if dist.main:
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        (final / _COMPLETE).write_text(f"{step}\n")
        for old in checkpoints(root)[:-keep]:
            shutil.rmtree(old)
    dist.barrier()
    return final


def checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if (p / _COMPLETE).is_file())


def load_checkpoint(folder: Path, model, optimizer, scheduler, dist: Dist) -> tuple[int, dict[str, Any]]:
    """Restore adapter weights, optimizer, scheduler and this rank's RNG; return (step, extra)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    rng_file = folder / f"rng-rank{dist.rank}.pt"
    if not rng_file.is_file():
        raise FileNotFoundError(f"{rng_file}: missing; resume with the same number of processes as the saved run")
    weights = load_file(str(folder / "adapter" / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, weights)
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise RuntimeError(f"{folder}: adapter weights do not match the model: {unexpected[:3]}")
    state = torch.load(folder / "trainer.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(torch.load(rng_file, map_location="cpu", weights_only=False))
    return int(state["step"]), state["extra"]

"""Resumable checkpoints: adapter + optimizer + scheduler + RNG of every rank + data position.

Layout (``<run>/checkpoints/step-000012/``)::

    adapter/            the LoRA adapter (PEFT save_pretrained; loadable by the hf backend)
    trainer.pt          optimizer and scheduler state, step, extra (data position, counters)
    rng-rank{r}.pt      Python, NumPy, torch CPU (and CUDA) RNG states of rank r
    checksums.json      SHA-256 of every file above, written once they are all complete
    COMPLETE            written last: a folder without it is ignored (a crash mid-save)

A checkpoint is written into a temporary folder and renamed, so a crash never leaves a folder
that looks complete. ``load_checkpoint`` restores everything in place, so continuing from step
k gives exactly the weights and optimizer state of an uninterrupted run (tested).

A checkpoint damaged after it was written (bytes overwritten, a truncated file) must not be
trained on: NaN weights train on as NaN and are merged and evaluated as if they were a result.
So a resume (``resume_checkpoint``) verifies the checksums, reads every file before changing
the model, and refuses non-finite weights or optimizer state (the only check a checkpoint of an
older memsearch, without checksums, gets); a damaged checkpoint is named, moved aside as
``damaged-step-N`` and the next older one is tried. With none left the run starts again from
step 0, which is safe: step 0 is rebuilt from the config (seeded), and the trainer drops the
log lines and evaluations of the lost steps.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memsearch.errors import InputError
from memsearch.io import sha256_file, write_json
from memsearch.train.distributed import Dist
from memsearch.train.policy import save_adapter

_COMPLETE = "COMPLETE"
CHECKSUMS = "checksums.json"
CHECKSUMS_FORMAT = "memsearch-checkpoint-checksums/1"
DAMAGED_PREFIX = "damaged-"


class DamagedCheckpointError(InputError):
    """A checkpoint file is not what was saved: its checksum differs, it is missing or
    unreadable, or it holds non-finite values. The message names the file."""


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
        write_checksums(tmp)  # after the barrier: every rank's files are complete
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


def write_checksums(folder: Path) -> None:
    """``folder/checksums.json``: the SHA-256 of every file of a checkpoint (all complete)."""
    files = {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name not in (CHECKSUMS, _COMPLETE)}
    write_json(folder / CHECKSUMS, {"format": CHECKSUMS_FORMAT, "files": files})


def verify_checkpoint(folder: Path) -> bool:
    """True when every file listed in ``checksums.json`` is present with its recorded SHA-256;
    False for a checkpoint without one (written by an older memsearch: unverified). Raises
    ``DamagedCheckpointError`` naming the first file that differs."""
    path = folder / CHECKSUMS
    if not path.is_file():
        return False
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        listed = record["files"] if record.get("format") == CHECKSUMS_FORMAT else None
    except (ValueError, UnicodeDecodeError, TypeError, KeyError, AttributeError):
        listed = None
    if not isinstance(listed, dict):
        raise DamagedCheckpointError(f"{path}: unreadable, expected the checksums written with the checkpoint")
    for name, want in sorted(listed.items()):
        file = folder / name
        if not file.is_file():
            raise DamagedCheckpointError(f"{file}: missing, listed in {path}")
        got = sha256_file(file)
        if got != want:
            raise DamagedCheckpointError(f"{file}: sha256 {got} ({file.stat().st_size} bytes) is not the {want} "
                                         "recorded when the checkpoint was saved")
    return True


@dataclass
class _Saved:
    """Everything a checkpoint restores, read (and checked) before anything is changed."""

    weights: dict[str, torch.Tensor]
    trainer: dict[str, Any]
    rng: dict[str, Any]


def _read_file(path: Path, read: Callable[[Path], Any]) -> Any:
    try:
        return read(path)
    except Exception as exc:  # any reader's error (SafetensorError, unpickling, EOF...) means the same here
        detail = (str(exc).splitlines() or [""])[0][:200]
        raise DamagedCheckpointError(f"{path}: unreadable ({type(exc).__name__}: {detail})") from None


def _tensors(value: Any, where: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    if torch.is_tensor(value):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _tensors(item, f"{where}[{i}]")


def _require_finite(path: Path, value: Any) -> None:
    for where, tensor in _tensors(value):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise DamagedCheckpointError(f"{path}: {where} holds non-finite values (NaN or inf)")


def _read(folder: Path, rank: int) -> _Saved:
    from safetensors.torch import load_file

    rng_file = folder / f"rng-rank{rank}.pt"
    if not rng_file.is_file():
        raise FileNotFoundError(f"{rng_file}: missing; resume with the same number of processes as the saved run")
    adapter = folder / "adapter" / "adapter_model.safetensors"
    weights = _read_file(adapter, lambda p: load_file(str(p)))
    trainer = _read_file(folder / "trainer.pt", lambda p: torch.load(p, map_location="cpu", weights_only=False))
    rng = _read_file(rng_file, lambda p: torch.load(p, map_location="cpu", weights_only=False))
    _require_finite(adapter, weights)
    _require_finite(folder / "trainer.pt", trainer.get("optimizer") if isinstance(trainer, dict) else None)
    if not isinstance(trainer, dict) or not {"optimizer", "scheduler", "step"} <= trainer.keys():
        raise DamagedCheckpointError(f"{folder / 'trainer.pt'}: expected optimizer, scheduler and step")
    return _Saved(weights, trainer, rng)


def _apply(saved: _Saved, folder: Path, model, optimizer, scheduler) -> tuple[int, dict[str, Any]]:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, saved.weights)
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise RuntimeError(f"{folder}: adapter weights do not match the model: {unexpected[:3]}")
    optimizer.load_state_dict(saved.trainer["optimizer"])
    scheduler.load_state_dict(saved.trainer["scheduler"])
    set_rng_state(saved.rng)
    return int(saved.trainer["step"]), saved.trainer.get("extra", {})


def load_checkpoint(folder: Path, model, optimizer, scheduler, dist: Dist) -> tuple[int, dict[str, Any]]:
    """Restore adapter weights, optimizer, scheduler and this rank's RNG; return (step, extra).
    Raises ``DamagedCheckpointError`` (nothing restored) when the checkpoint is damaged."""
    verify_checkpoint(folder)
    return _apply(_read(folder, dist.rank), folder, model, optimizer, scheduler)


def resume_checkpoint(root: Path, model, optimizer, scheduler, dist: Dist, echo=print) -> tuple[int, dict[str, Any]]:
    """Restore the newest intact checkpoint under ``root`` (all ranks call this); return (step,
    extra), or (0, {}) when there is none. A damaged one is named in one line, moved aside to
    ``damaged-step-N`` (kept for inspection, no longer a checkpoint, so it is neither resumed nor
    counted by ``keep``) and the next older one is tried. A checkpoint without checksums (an
    older memsearch) is loaded unverified, and said so."""
    found = checkpoints(root)
    lost = False
    for i in range(len(found) - 1, -1, -1):
        folder, problem, verified = found[i], None, False
        try:
            verified = verify_checkpoint(folder)
            saved = _read(folder, dist.rank)
        except DamagedCheckpointError as exc:
            problem = str(exc)
        # every rank reads its own RNG file: all ranks skip a checkpoint any of them finds damaged
        if dist.all_sum([1.0 if problem else 0.0])[0]:
            lost = True
            aside = _set_aside(folder, dist)
            if dist.main:
                then = f"resuming from the older {found[i - 1].name}" if i else "no older checkpoint"
                echo(f"damaged checkpoint: {problem or f'{folder}: damaged on another rank'}; moved to {aside}, {then}")
            continue
        if not verified and dist.main:
            echo(f"{folder}: no {CHECKSUMS} (written by an older memsearch): loading it unverified")
        step, extra = _apply(saved, folder, model, optimizer, scheduler)
        if dist.main:
            echo(f"resumed at step {step} from {folder}")
        return step, extra
    if dist.main:
        echo(f"{root}: no intact checkpoint left: starting again from step 0 (the starting weights are rebuilt "
             "from the config, so the run ends as an uninterrupted one)" if lost
             else "no complete checkpoint yet: starting from step 0")
    return 0, {}


def _set_aside(folder: Path, dist: Dist) -> Path:
    """Rename a damaged checkpoint ``damaged-step-N`` (``-2``, ... when taken); returns the new path."""
    aside, n = folder.with_name(DAMAGED_PREFIX + folder.name), 1
    while aside.exists():
        n += 1
        aside = folder.with_name(f"{DAMAGED_PREFIX}{folder.name}-{n}")
    dist.barrier()  # every rank has read the folder before it moves
    if dist.main:
        folder.rename(aside)
    dist.barrier()
    return aside

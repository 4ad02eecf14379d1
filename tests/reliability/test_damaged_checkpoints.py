"""Damaged checkpoints through the real CLI (issue 26): a `memsearch train sft` process is killed
after step 5 (checkpoints every 2 steps, at least at 2 and 4; killed once, each case works on a
copy), the newest checkpoint is damaged on disk (bytes overwritten in place, same size; or the file
truncated), and ``--resume`` must name the damaged file, fall back to the newest intact
checkpoint (to step 0 when none is left), exit 0 and end with the finite adapter of an
uninterrupted run. Before, an overwritten checkpoint trained on with NaN loss and exit 0; a
truncated one stopped with a raw SafetensorError naming no file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

SCENARIO = "damaged checkpoint + resume (train sft)"
STEPS = 12  # 12 rows, 2 per step, 2 epochs; checkpoints every 2 steps, all kept (the kill may come late)
ENV = {"OMP_NUM_THREADS": "1"}  # two cores, and a step is a fraction of a second anyway


def sft_args(rel, model: Path, rows: Path, out: Path, resume: bool = False) -> list[str]:
    """The command line; its config file ``sft.toml`` beside ``out`` must exist (empty: every
    field comes from --set)."""
    config = out.parent / "sft.toml"
    sets = [f"model={json.dumps(str(model))}", f"data=[{json.dumps(str(rows))}]", "epochs=2.0",
            "micro_batch_rows=2", "grad_accumulation=1", "checkpoint_every=2", "keep_checkpoints=12", "lora.r=4",
            "optim.lr=1e-2", "optim.warmup_steps=0"]
    args = [str(rel.EXE), "train", "sft", "--config", str(config), "--out", str(out)]
    return args + [a for s in sets for a in ("--set", s)] + (["--resume"] if resume else [])


def killed_after_step(args: list[str], step: int, timeout: float = 300) -> int | None:
    """Run ``args``; SIGKILL it when it prints ``step {step}/`` (after that step's log line, so the
    checkpoints of the steps before it are complete). Returns the exit status, None when killed."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, **ENV})
    deadline = time.monotonic() + timeout
    try:
        for line in proc.stdout:
            if line.startswith(f"step {step}/"):
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
                return None
            if time.monotonic() > deadline:
                break
        return proc.wait(max(deadline - time.monotonic(), 1))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def outside(rel, out: Path, *roots: Path) -> dict[str, tuple[int, int, int]]:
    """``tree_state`` of the folders around and read by the run, without ``out`` and the entry of
    its parent folder (whose mtime creating ``out`` changes)."""
    return {f"{root}/{name}": st for root in roots for name, st in rel.tree_state(root, exclude=(out,)).items()
            if not (root == out.parent and name == ".")}


def overwrite(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-64:-32] = b"\xff" * 32  # inside the last tensor: 0xffffffff is a NaN float32
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def adapter_weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "adapter" / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def reference(rel, tiny_model_dir, short_sft_rows, tmp_path_factory):
    out = tmp_path_factory.mktemp("sft-ref") / "run"
    (out.parent / "sft.toml").write_text("")
    proc = rel.run_cli(sft_args(rel, tiny_model_dir, short_sft_rows, out), timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def damage_plan(case: str, saved: list[str]) -> tuple[list[tuple[object, str]], int]:
    """(what is done to which file of which checkpoint, newest first; the step the resume continues
    from), for the checkpoints ``saved`` (oldest first) that the killed run left."""
    adapter = "adapter/adapter_model.safetensors"
    if case == "all damaged":
        files = ("trainer.pt", "rng-rank0.pt")
        return [((overwrite, truncate)[i % 2], f"{name}/{files[i % 2]}") for i, name in enumerate(saved[::-1])], 0
    return [({"overwritten in place": overwrite, "truncated": truncate}[case], f"{saved[-1]}/{adapter}")], \
        int(saved[-2].removeprefix("step-"))


CASES = ("overwritten in place", "truncated", "all damaged")


@pytest.fixture(scope="module")
def killed(rel, tiny_model_dir, short_sft_rows, tmp_path_factory):
    """One run killed after step 5, made once: each case damages its own copy of it (the kill and
    the checkpoints it leaves are the same for every case; only the damage and the resume differ)."""
    out = tmp_path_factory.mktemp("sft-killed") / "run"
    (out.parent / "sft.toml").write_text("")
    started = time.perf_counter()
    status = killed_after_step(sft_args(rel, tiny_model_dir, short_sft_rows, out), 5)
    saved = sorted(p.name for p in (out / "checkpoints").glob("step-*"))
    # it must still have been running at step 5, with the checkpoints of steps 2 and 4 complete
    rel.LEDGER.record(SCENARIO, runs=1, wrong_exit=int(status is not None), seconds=time.perf_counter() - started)
    if status is not None or saved[:2] != ["step-000002", "step-000004"]:
        pytest.fail(f"the first run was not killed after step 5: status {status}, checkpoints {saved}")
    return out, saved


@pytest.mark.parametrize("case", CASES)
def test_a_damaged_checkpoint_is_named_and_the_run_resumes_from_the_newest_intact_one(
    case, rel, reference, killed, tiny_model_dir, short_sft_rows, tmp_path
):
    import shutil

    out = tmp_path / "run"
    (tmp_path / "sft.toml").write_text("")
    shutil.copytree(killed[0], out)
    before = outside(rel, out, tmp_path, tiny_model_dir, short_sft_rows.parent)
    started, saved = time.perf_counter(), killed[1]
    damages, resumed_at = damage_plan(case, saved)
    for damage, name in damages:
        damage(out / "checkpoints" / name)
    final = rel.run_cli(sft_args(rel, tiny_model_dir, short_sft_rows, out, resume=True), timeout=300, env=ENV)
    wrong = int(final.returncode != 0)
    steps = [json.loads(line)["step"] for line in (out / "train_log.jsonl").read_text().splitlines()]
    lost = len(set(range(1, STEPS + 1)) - set(steps))
    duplicated = len(steps) - len(set(steps))
    touched = len(rel.changed_paths(before, outside(rel, out, tmp_path, tiny_model_dir, short_sft_rows.parent)))
    rel.LEDGER.record(SCENARIO, runs=1, lost=lost, duplicated=duplicated, wrong_exit=wrong, outside=touched,
                      seconds=time.perf_counter() - started)

    assert final.returncode == 0, final.stderr[-2000:]
    assert (wrong, lost, duplicated, touched) == (0, 0, 0, 0)
    warnings = [line for line in final.stdout.splitlines() if line.startswith("damaged checkpoint:")]
    assert len(warnings) == len(damages), final.stdout  # one line per damaged checkpoint, newest first
    assert all(str(out / "checkpoints" / name) in w for w, (_, name) in zip(warnings, damages)), warnings
    if resumed_at:
        assert f"resumed at step {resumed_at} from {out / 'checkpoints' / f'step-{resumed_at:06d}'}" in final.stdout
    else:
        assert "no intact checkpoint left: starting again from step 0" in final.stdout, final.stdout
    got, want = adapter_weights(out), adapter_weights(reference)
    assert all(torch.isfinite(t).all() for t in got.values())
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)  # = the uninterrupted run

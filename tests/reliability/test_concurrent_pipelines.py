"""Concurrent pipelines (issue 54): two `memsearch pipeline memory-policy` processes on one --out
used to train SFT and GRPO at the same time (train logs with interleaved duplicate steps, a
report saying usable). A pipeline folder has the run folder's one-writer lock: the second process
is refused (exit 2, naming the folder and the holder's pid) before it writes anything, and the
first finishes as if alone. Real CLI subprocesses on the tiny random-init Llama (the tiny recipe
of tests/pipelines: 3 questions, one seed, one GRPO step per stage)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "data" / "samples" / "hotpotqa"


def _tiny_recipe(model: Path) -> list[str]:
    """``--set`` flags of the tiny memory-policy recipe (as tests/pipelines/conftest.py's)."""
    sets = [
        f"model={json.dumps(str(model))}", "seeds=[7]", "matrix_seeds=[7]",
        f"data.train={json.dumps(str(SAMPLES / 'train_sample.json'))}",
        f"data.dev={json.dumps(str(SAMPLES / 'dev_distractor_sample.json'))}",
        "data.train_questions=3", "data.dev_questions=3", "data.val_questions=0", "grpo.eval.every=0",
        "episode.budgets.policy_tokens=12", "episode.budgets.max_searches=2", "sft.epochs=1.0",
        "sft.micro_batch_rows=8", "sft.grad_accumulation=1", "grpo.steps=1", "grpo.rollout.tasks_per_step=1",
        "grpo.rollout.group_size=2", "grpo.checkpoint_every=1", "stage2.grpo.steps=1",
        "stage2.grpo.rollout.tasks_per_step=1",
        "stage2.grpo.rollout.group_size=2", "report.bootstrap_resamples=200",
    ]
    return [arg for s in sets for arg in ("--set", s)]


def _duplicate_steps(out: Path) -> int:
    """Rows of every train log whose step an earlier row of that log already has."""
    duplicated = 0
    for log in out.rglob("train_log.jsonl"):
        steps = [json.loads(line).get("step") for line in log.read_text().splitlines() if line.strip()]
        duplicated += len(steps) - len(set(steps))
    return duplicated


def test_a_second_pipeline_on_the_same_folder_is_refused_and_the_first_runs_as_if_alone(tiny_model_dir, tmp_path, rel):
    out = tmp_path / "mp"
    args = [str(rel.EXE), "pipeline", "memory-policy", "--config", str(ROOT / "configs" / "memory_policy_cpu.toml"),
            "--out", str(out), *_tiny_recipe(tiny_model_dir)]
    started = time.perf_counter()
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = out / ".lock"
    deadline = time.time() + 120
    while time.time() < deadline and first.poll() is None:
        if lock.is_file() and lock.read_text() == f"pid {first.pid}\n":
            break
        time.sleep(0.05)
    second = rel.run_cli(args, timeout=300)
    overlapped = first.poll() is None
    _, first_err = first.communicate(timeout=900)
    invocations = (out / "invocations.jsonl").read_text().splitlines()
    duplicated = _duplicate_steps(out)
    refused = second.returncode == 2 and "Traceback" not in second.stderr
    rel.LEDGER.record("concurrent pipelines", runs=2, duplicated=duplicated,
                      wrong_exit=int(first.returncode != 0) + int(not refused), seconds=time.perf_counter() - started)
    assert overlapped, "the first pipeline ended before the second started: the test did not exercise two writers"
    assert first.returncode == 0, first_err[-3000:]
    assert refused, second.stderr[-3000:]
    assert second.stderr == (
        f"error: {out}: another memsearch process (pid {first.pid}) is writing this pipeline folder ({lock} is "
        "locked); wait for it to finish, or stop it, then run the pipeline again\n"
    )
    assert len(invocations) == 1  # the refused process recorded nothing
    assert duplicated == 0 and list(out.rglob("train_log.jsonl"))
    # The lock of the finished (gone) process is taken over: a re-run skips every stage.
    rerun = rel.run_cli(args, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert lock.read_text() != f"pid {first.pid}\n" and _duplicate_steps(out) == 0

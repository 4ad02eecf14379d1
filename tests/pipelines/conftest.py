"""Shared by the memory-policy pipeline tests: the tiny pipeline config (the CPU recipe cut down
to 3 train / 3 held-out questions, one seed, one GRPO step per stage) on the tiny Llama."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MP_CONFIG = ROOT / "configs" / "memory_policy_cpu.toml"
SAMPLES = ROOT / "data" / "samples" / "hotpotqa"


def mp_settings(model: Path, *extra: str) -> list[str]:
    """The ``--set`` overrides of the tiny memory-policy pipeline, then ``extra``."""
    return [
        f"model={json.dumps(str(model))}",
        "seeds=[7]",
        "matrix_seeds=[7]",
        f"data.train={json.dumps(str(SAMPLES / 'train_sample.json'))}",
        f"data.dev={json.dumps(str(SAMPLES / 'dev_distractor_sample.json'))}",
        "data.train_questions=3",
        "data.dev_questions=3",
        "data.val_questions=0",
        "grpo.eval.every=0",
        "episode.budgets.policy_tokens=12",
        "episode.budgets.max_searches=2",
        "sft.epochs=1.0",
        "sft.micro_batch_rows=8",
        "sft.grad_accumulation=1",
        "grpo.steps=1",
        "grpo.rollout.tasks_per_step=1",
        "grpo.rollout.group_size=2",
        "grpo.checkpoint_every=1",
        "stage2.grpo.steps=1",
        "stage2.grpo.rollout.tasks_per_step=1",
        "stage2.grpo.rollout.group_size=2",
        "report.bootstrap_resamples=200",
        *extra,
    ]


@pytest.fixture(scope="session")
def mp_config(tiny_model_dir):
    """``mp_config(*extra, config_file=...)``: the tiny memory-policy pipeline config on
    ``tiny_model_dir`` (the CPU recipe's file, or ``config_file`` with the same overrides)."""
    from memsearch.config import load_config
    from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline

    def config(*extra: str, config_file: Path = MP_CONFIG) -> MemoryPolicyPipeline:
        return load_config(config_file, mp_settings(tiny_model_dir, *extra), model=MemoryPolicyPipeline)

    return config

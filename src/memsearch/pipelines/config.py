"""What every pipeline config shares: its ``[episode]`` table is a run config (``memsearch eval``
and ``matrix`` accept a pipeline config as one: ``load_run_config``) whose budgets are counted
with the model's tokenizer (``check_episode_tokenizer``), its trainer tables are
validated with their place in the pipeline config (``validated``), and its report has paired
bootstrap settings (``PipelineReport``). The configs of the pipelines themselves are
``memsearch.pipelines.memagent.config`` and ``memsearch.pipelines.memory_policy.config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from memsearch.config import (
    KeyProblems,
    RunConfig,
    StrictConfig,
    config_from_tables,
    merge_tables,
    read_config_file,
    validation_problems,
)


def episode_table(data: dict[str, Any]) -> dict[str, Any]:
    """The ``[episode]`` table of a pipeline config (raw TOML data) as a run config: its
    tokenizer and memory/reader backends come from ``model`` unless the table sets them."""
    model = data.get("model", "embedded")
    backends = {role: {"kind": "hf", "model": model} for role in ("memory", "reader")}
    from_model = {"tokenizer": model, "backends": backends}
    return merge_tables(from_model, data.get("episode") or {})


def check_episode_tokenizer(episode: RunConfig, model: str) -> None:
    """A pipeline counts budgets with the tokenizer of the model it trains: its ``[episode]``'s
    tokenizer (``model`` unless the table sets one) must be ``model``'s."""
    if episode.tokenizer != model:
        raise KeyProblems((
            "episode.tokenizer",
            f"{episode.tokenizer!r} differs from model {model!r}: budgets must "
            "be counted with the model's own tokenizer (leave episode.tokenizer unset)",
        ))


def load_run_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """The run config in a file that ``memsearch eval`` / ``matrix`` accept: a run config, or a
    pipeline config (``pipeline = ...``), whose ``[episode]`` is its run config, filled from
    ``model`` as the pipeline fills it (``episode_table``). ``--set`` keys address the run config
    itself (``budgets.max_chunks=3``), so ``memsearch eval run --config configs/memagent.toml`` runs
    the recipe's agent. It lives here, not in ``memsearch.config``, so that the bottom layer never
    has to know the pipelines above it (docs/design.md §11)."""
    return config_from_tables(run_config_tables(path), overrides, RunConfig, str(path))


def run_config_tables(path: str | Path) -> dict[str, Any]:
    """The raw run-config tables of a run config or pipeline config file (before validation)."""
    data = read_config_file(path)
    return episode_table(data) if "pipeline" in data else data


def validated(model: type[BaseModel], fields: dict[str, Any], table: str) -> Any:
    """``model`` validated from ``fields`` (a trainer table of a pipeline config); problems are
    named by their place in the pipeline config (``table.field``), not the trainer's, as
    ``KeyProblems``: raised in the pipeline config's validator, they keep those key paths."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise KeyProblems(*validation_problems(exc, table)) from None


class PipelineReport(StrictConfig):
    """How the report compares base and trained (``report`` stage)."""

    bootstrap_resamples: int = Field(
        10_000, ge=100, description="Paired bootstrap resamples per base-vs-trained difference"
    )
    confidence: float = Field(0.95, gt=0.0, lt=1.0, description="Confidence of the paired bootstrap intervals")
    seed: int = Field(0, description="Seed of the bootstrap resampling (the report is deterministic)")

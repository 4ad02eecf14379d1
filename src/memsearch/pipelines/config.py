"""What every pipeline config shares: its ``[episode]`` table is a run config (``memsearch eval``
and ``matrix`` accept a pipeline config as one: ``load_run_config``) whose budgets are counted
with the model's tokenizer (``check_episode_tokenizer``); its trainer tables are typed
(``train.config.trainer_table``) and composed with what the pipeline sets into trainer configs
named by their place in the pipeline config (``trainer_config``); validated parts are replaced
without a dump (``updated``); its report has paired bootstrap settings (``PipelineReport``).
The configs of the pipelines themselves are ``memsearch.pipelines.memagent.config`` and
``memsearch.pipelines.memory_policy.config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

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
from memsearch.train.config import TrainerTable

M = TypeVar("M", bound=BaseModel)


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


def every_problem(data: Any, validate: Any, tables: tuple[str, ...]) -> Any:
    """``validate(data)`` (a pipeline config's validation: a wrap validator's handler) that names
    every problem in one run: a bad value in a trainer table (``tables``: dotted keys) is a field
    error, which would hide the pipeline's checks across its fields, so when only tables have
    errors the config is validated once more without them and both runs' problems are raised."""
    try:
        return validate(data)
    except ValidationError as exc:
        places = [".".join(map(str, err["loc"])) + "." for err in exc.errors()]
        bad = {t for t in tables for place in places if place.startswith(t + ".")}
        if not isinstance(data, dict) or not all(any(p.startswith(t + ".") for t in bad) for p in places):
            raise
        problems = validation_problems(exc)
    for table in bad:
        data = _emptied(data, table.split("."))
    try:
        validate(data)
    except ValidationError as exc:
        problems += [p for p in validation_problems(exc) if p not in problems]
    raise KeyProblems(*problems)


def _emptied(data: dict[str, Any], key: list[str]) -> dict[str, Any]:
    """A copy of ``data`` with an empty table at ``key`` (the tables above it copied, not changed)."""
    head, *rest = key
    below = data.get(head)
    return {**data, head: _emptied(below, rest) if rest and isinstance(below, dict) else {}}


def trainer_config(trainer: type[M], key: str, /, *tables: TrainerTable, **owned: Any) -> M:
    """The trainer config (``trainer``) of a pipeline stage: the fields its ``tables`` set (a later
    table's field replaces an earlier one's whole) and the ``owned`` fields the pipeline sets, all
    validated values (models, not dumps), composed. The trainer's checks across fields (role
    against episode, schema mode...) run on the result; their problems are named by their place
    in the pipeline config (``key.field``) as ``KeyProblems``: raised in the pipeline config's
    validator, they keep those key paths."""
    given = {name: value for table in tables for name, value in table.given().items()}
    try:
        return trainer.model_validate({**given, **owned})
    except ValidationError as exc:
        raise KeyProblems(*validation_problems(exc, key)) from None


def updated(config: M, where: str = "", /, **fields: Any) -> M:
    """``config`` with ``fields`` (validated values: models, not dumps) replaced, its own checks
    across fields run on the result, so a composed config is refused where one written in a file
    would be (an hf backend given an openai-only field), as ``KeyProblems`` under ``where`` (the
    key of ``config`` in the pipeline config). Nothing is dumped to JSON and read back: the fields
    not replaced are the validated objects themselves."""
    try:
        return type(config).model_validate({**dict(config), **fields})
    except ValidationError as exc:
        raise KeyProblems(*validation_problems(exc, where)) from None


class PipelineReport(StrictConfig):
    """How the report compares base and trained (``report`` stage)."""

    bootstrap_resamples: int = Field(
        10_000, ge=100, description="Paired bootstrap resamples per base-vs-trained difference"
    )
    confidence: float = Field(0.95, gt=0.0, lt=1.0, description="Confidence of the paired bootstrap intervals")
    seed: int = Field(0, description="Seed of the bootstrap resampling (the report is deterministic)")

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
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, Field, ValidationError, field_validator, model_serializer, model_validator

from memsearch.config import (
    KeyProblems,
    RunConfig,
    StrictConfig,
    apply_overrides,
    config_from_tables,
    merge_tables,
    read_config_file,
    validation_problems,
)
from memsearch.config.strict import without_default
from memsearch.registry import BACKEND_KINDS, backend_settings
from memsearch.train.config import TrainerTable
from memsearch.train.config_keys import merge_disjoint

M = TypeVar("M", bound=BaseModel)


def episode_table(data: dict[str, Any], overrides: list[str] | None = None) -> dict[str, Any]:
    """The ``[episode]`` table of a pipeline config (raw TOML data) as a run config: its
    tokenizer and memory/reader backends come from ``model`` unless the table sets them (a
    role the table gives a kind without a model, rules or oracle, gets no model). ``overrides``:
    the ``--set`` flags that will be applied to the result (``load_run_config``); a role's kind
    set there decides as the table's would."""
    model = data.get("model", "embedded")
    episode = data.get("episode") or {}
    kinds = apply_overrides(episode, overrides) if overrides and isinstance(episode, dict) else episode
    tables = kinds.get("backends") if isinstance(kinds.get("backends"), dict) else {}
    backends = {}
    for role in ("memory", "reader"):
        table = tables.get(role)
        kind = table.get("kind", "hf") if isinstance(table, dict) else "hf"
        reads_model = BACKEND_KINDS.problem(kind) is not None or "model" in backend_settings(kind).model_fields
        backends[role] = {"kind": "hf", **({"model": model} if reads_model else {})}
    return merge_tables({"tokenizer": model, "backends": backends}, episode)


def renamed_tables(data: Any, renames: dict[str, str]) -> Any:
    """Raw pipeline config tables with each table at an earlier key (dotted) of ``renames`` moved
    to its current key, merged key by key with what that key already holds (a published config
    says ``[stage2.train]``, an override of it ``[stage2.grpo]``); a setting given under both is
    refused naming both (``KeyProblems``)."""
    if not isinstance(data, dict):
        return data
    problems: list[tuple[str, str]] = []
    for before, now in renames.items():
        *above, old = before.split(".")
        new = now.rsplit(".", 1)[-1]  # a table is renamed where it is
        parent = data
        for key in above:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or not isinstance(parent.get(old), dict):
            continue
        parent = {k: v for k, v in parent.items() if k != old}
        parent[new] = merge_disjoint(parent.get(new), _value_at(data, before), now, before, problems)
        data = _replaced(data, above, parent)
    if problems:
        raise KeyProblems(*problems)
    return data


def _value_at(data: dict[str, Any], key: str) -> Any:
    """The value at dotted ``key`` of raw tables (None where a table on the way is missing)."""
    for part in key.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _replaced(data: dict[str, Any], key: list[str], value: Any) -> dict[str, Any]:
    """A copy of ``data`` with ``value`` at ``key`` (the tables above it copied, not changed; a
    value on the way that is no table is replaced by one)."""
    if not key:
        return value
    head, *rest = key
    below = data.get(head)
    return {**data, head: _replaced(below if isinstance(below, dict) else {}, rest, value)}


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
    return config_from_tables(run_config_tables(path, overrides), overrides, RunConfig, str(path))


def run_config_tables(path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """The raw run-config tables of a run config or pipeline config file (before validation;
    ``overrides``: see ``episode_table``)."""
    data = read_config_file(path)
    return episode_table(data, overrides) if "pipeline" in data else data


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
        data = _replaced(data, table.split("."), {})
    try:
        validate(data)
    except ValidationError as exc:
        problems += [p for p in validation_problems(exc) if p not in problems]
    raise KeyProblems(*problems)


class SourceFiles(StrictConfig):
    """The base of a pipeline's ``[data]`` table: the dataset format its source files are in."""

    format: str = Field("hotpot", description="The converter that reads data.train and data.dev: a registered "
                        "dataset (memsearch.data.converters: hotpot, musique, ...), as `memsearch data prepare "
                        "--format` takes it")

    @field_validator("format")
    @classmethod
    def _registered(cls, value: str) -> str:
        from memsearch.data.converters import source_converter

        source_converter(value)  # an unregistered name: refused, naming the registered ones
        return value

    @model_serializer(mode="wrap")
    def _omit_default_format(self, handler):
        # At its default the field is left out of every dump: the prepare stages' fingerprints
        # (which hash this table) and saved configs of HotpotQA runs stay those of earlier versions.
        return without_default(handler(self), "format", "hotpot")

    def convert(self, path: str, split: str, limit: int | None = None):
        """``path`` converted in memory by the ``format`` converter (a ``Dataset``)."""
        from memsearch.data.converters import source_converter

        return source_converter(self.format).convert(path, split=split, limit=limit)


class PipelineConfig(StrictConfig):
    """What every pipeline config does with its raw tables before its own checks: a trainer table
    under an earlier name is read at its current one (``EARLIER_TABLE_NAMES``: earlier -> current
    dotted key, ``renamed_tables``), and a bad value in a trainer table (``TRAINER_TABLES``) does
    not hide the pipeline's checks across its fields (``every_problem``)."""

    TRAINER_TABLES: ClassVar[tuple[str, ...]] = ()
    EARLIER_TABLE_NAMES: ClassVar[dict[str, str]] = {}

    @model_validator(mode="wrap")
    @classmethod
    def _every_problem(cls, data: Any, handler) -> Any:
        return every_problem(data, handler, cls.TRAINER_TABLES)

    @model_validator(mode="before")
    @classmethod
    def _earlier_table_names(cls, data: Any) -> Any:
        return renamed_tables(data, cls.EARLIER_TABLE_NAMES)

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

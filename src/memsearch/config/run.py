"""Typed run configuration, loaded from TOML, with ``--set key=value`` overrides.

Every field is documented where it is declared. The resolved config (after overrides) is saved
with every run, so a run folder says exactly what produced it.

    cfg = load_config("configs/rules.toml", overrides=["budgets.max_searches=2"])
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from memsearch.config.backend import BackendConfig, HFSettings, OpenAISettings, RulesSettings
from memsearch.config.backend import Sampling as Sampling
from memsearch.config.compose import with_values

# The machinery every config model imports from here (apply_overrides only re-exported).
from memsearch.config.strict import (
    KeyProblems,
    StrictConfig,
    config_check,
    config_from_tables,
    read_config_file,
    validation_problems,
)
from memsearch.config.strict import apply_overrides as apply_overrides
from memsearch.errors import InputError
from memsearch.records.trajectory import CALL_ROLES
from memsearch.registry import BACKEND_KINDS, MEMORY_MODES, MemoryModeName, either, memory_mode

# The most paired bootstrap resamples a config may ask for (``Matrix.bootstrap_resamples``,
# ``eval.bootstrap.paired_bootstrap``): a bound checked at load, not after every group has run.
MAX_BOOTSTRAP_RESAMPLES = 1_000_000


# Default of ``Agent.memory_max_sources``: the rules and oracle backends cite one sentence per item.
MEMORY_MAX_SOURCES = 3


class Budgets(StrictConfig):
    """Limits the engine enforces (counted with the run's tokenizer), identical across groups."""

    evidence_tokens: int = Field(256, ge=1, description="Tokens of new evidence shown per search step")
    passages_per_search: int = Field(3, ge=1, description="Passages retrieved per search (before the token cut)")
    max_searches: int = Field(3, ge=1, description="Searches per episode (search mode)")
    memory_tokens: int = Field(256, ge=8, description="Size limit of the memory as rendered to the policy")
    answer_tokens: int = Field(64, ge=1, description="Reader completion limit")
    policy_tokens: int = Field(256, ge=1, description="Completion limit of memory and controller calls")
    chunk_tokens: int = Field(2048, ge=16, description="Tokens per chunk (stream mode)")
    max_chunks: int = Field(64, ge=1, description="Chunks read at most (stream mode); the rest is recorded as cut off")


class Agent(StrictConfig):
    """The three orthogonal choices of an episode (see docs/design.md §3)."""

    evidence: Literal["search", "stream"] = Field(
        "search", description="search a retriever, or stream a long context in chunks"
    )
    memory: MemoryModeName = Field(
        "decision", description="how memory changes: summary | decision | overwrite, or a mode registered with "
        "engine.memory_modes.register_memory_mode")
    controller: Literal["fixed", "policy", "exhaust"] = Field(
        "fixed", description="who decides the next search / when to stop"
    )
    retrieval_scope: Literal["candidates", "corpus"] = Field(
        "candidates", description="search the task's candidates or the whole corpus"
    )
    memory_sources: Literal["shown", "hidden"] = Field(
        "shown",
        description="Decision memory: 'shown' renders each item with its evidence ids; 'hidden' renders "
        "items without them to the memory policy, controller and reader (and counts the budget on that rendering), "
        "while the store still records them, so memory support recall is scored as before (the no-sources control, "
        "docs/design.md §5). Summary and overwrite notes are unaffected",
    )
    memory_max_sources: int = Field(
        MEMORY_MAX_SOURCES,
        ge=1,
        description="Decision memory: the most distinct evidence ids one item may cite; an ADD or UPDATE citing "
        "more is rejected (an invalid action), and schema mode's constraint allows no more (maxItems). Citing every "
        "shown sentence from one item must not buy memory support recall (docs/design.md §6)",
    )
    memory_format: Literal["text", "extractive"] = Field(
        "text",
        description="Decision memory: 'text', an op writes the item's text and cites its sources; 'extractive', an "
        "op names evidence ids only and the environment writes the item from those sentences (an open sub-question "
        "keeps a short free text), one op per call in schema mode, where only ops that fit the budget can be "
        "sampled (memory/extractive.py, docs/design.md §5)",
    )



class Retrieval(StrictConfig):
    """Which retriever answers ``search`` evidence (docs/design.md §8); identical for all groups of a matrix."""

    method: Literal["bm25", "dense", "hybrid"] = Field(
        "bm25", description="bm25 (bm25s), dense (MiniLM + faiss) or hybrid (both, reciprocal-rank fusion)"
    )
    index: str | None = Field(
        None,
        description="a folder from `memsearch retrieval build` (built from the run's "
        "data folder); none: the index is built in process",
    )
    url: str | None = Field(
        None,
        description="a `memsearch retrieval serve` service, e.g. http://127.0.0.1:8000; "
        "the service's index and method answer (method and index are then unused)",
    )


class Backends(StrictConfig):
    """One backend per role; roles may differ (a trained memory policy + a fixed reader)."""

    memory: BackendConfig = Field(default_factory=RulesSettings, description="memory policy / summarizer")
    controller: BackendConfig = Field(default_factory=RulesSettings, description="search controller")
    reader: BackendConfig = Field(default_factory=RulesSettings, description="final answer")
    baseline_memory: BackendConfig | None = Field(
        None,
        description="Matrix only: the backend that writes the memory of the summary groups A and C (the seed's "
        "baseline_memory_backend), so they never summarize with the trained memory policy of B/D. Unset: "
        "backends.memory with its adapter removed and, when its model is a merged checkpoint (a folder with "
        "memsearch_merge.json), that checkpoint's recorded base model; a served memory (kind 'openai') needs it "
        "set (the matrix refuses otherwise); see group_config",
    )


GROUP_DESIGNS = {
    "A": ("summary", "fixed"),
    "B": ("decision", "fixed"),
    "C": ("summary", "policy"),
    "D": ("decision", "policy"),
}
# Keys a group's overrides may not set: what every group shares (the matrix compares groups under
# identical budgets and tokenizer, seeing the same evidence), the matrix itself, and the memory and
# controller that make the group what it is (B with summary memory would be A, run under B's name).
_SHARED_BY_GROUPS = ("budgets", "tokenizer", "retrieval")
_GROUP_DESIGN = ("agent.memory", "agent.controller")
# Validation context of a group's own config (``group_config``).
_AS_GROUP = "matrix_group"


def _dotted_keys(table: dict[str, Any], group: str) -> dict[str, Any]:
    """A group's overrides as dotted keys: a sub-table and a dotted key mean the same
    (``[matrix.overrides.B.backends.memory] adapter = ...`` is ``"backends.memory.adapter" = ...``).
    A key given in both forms, or both a key and a key below it, is refused: which one would win
    is not visible in the file."""
    flat: dict[str, Any] = {}
    todo = [("", table)]
    while todo:
        prefix, node = todo.pop(0)
        for key, value in node.items():
            if isinstance(value, dict) and value:
                todo.append((f"{prefix}{key}.", value))
            elif f"{prefix}{key}" in flat:
                raise KeyProblems((f"{group}.{prefix}{key}", "given twice (as a dotted key and in a table); keep one"))
            else:
                flat[f"{prefix}{key}"] = value
    for key in flat:
        if above := next((other for other in flat if key.startswith(f"{other}.")), None):
            raise KeyProblems((f"{group}.{key}", f"set below {group}.{above}, which is also set; keep one"))
    return flat


class Matrix(StrictConfig):
    """Groups of ``memsearch matrix``: memory x controller (docs/design.md §3), same budgets for all."""

    groups: list[Literal["A", "B", "C", "D"]] = Field(
        ["A", "B", "C", "D"],
        min_length=1,
        description="A summary+fixed, B decision+fixed, C summary+policy, D decision+policy",
    )
    overrides: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Per-group settings over the run config, applied last: a table per group, e.g. "
        "[matrix.overrides.B.backends.memory] adapter = 'runs/stage1', or the same as dotted keys "
        "([matrix.overrides.B] 'backends.memory.adapter' = ...; recorded in this form). A group must be one of "
        "A-D; budgets, tokenizer and retrieval (identical across groups), agent.memory and agent.controller (the "
        "group's design), backends.baseline_memory (set once for A/C) and matrix are refused",
    )
    bootstrap_resamples: int = Field(
        10_000,
        ge=100,
        le=MAX_BOOTSTRAP_RESAMPLES,
        description=f"Paired bootstrap resamples for group differences ({MAX_BOOTSTRAP_RESAMPLES:,} at most: the "
        "Monte Carlo error of a 95 % interval is already below 0.001 there, and each pair of groups costs "
        "resamples x tasks random draws)",
    )

    @field_validator("groups")
    @classmethod
    def _distinct_groups(cls, groups: list[str]) -> list[str]:
        if twice := sorted({g for g in groups if groups.count(g) > 1}):
            raise ValueError(f"{', '.join(twice)} given twice; expected each group once, e.g. ['A', 'B']")
        return groups

    @field_validator("overrides", mode="before")
    @classmethod
    def _one_form(cls, overrides: Any) -> Any:
        if not isinstance(overrides, dict):
            return overrides  # pydantic says what was expected
        return {g: _dotted_keys(t, g) if isinstance(t, dict) else t for g, t in overrides.items()}

    @field_validator("overrides")
    @classmethod
    def _groups_and_keys_that_exist(cls, overrides: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        # An override nobody reads would run the ablation as the control: refused, never ignored.
        problems = []
        for group, table in overrides.items():
            if group not in GROUP_DESIGNS:
                problems.append((group, "no such group; expected A, B, C or D (upper case)"))
                continue
            memory, controller = GROUP_DESIGNS[group]
            for top in sorted({key.split(".")[0] for key in table} & {*_SHARED_BY_GROUPS, "matrix"}):
                problems.append((f"{group}.{top}", "a group's overrides cannot change the matrix; set it outside "
                                 "[matrix]" if top == "matrix" else "budgets, tokenizer and retrieval are identical "
                                 "across groups: set them for every group, outside [matrix]"))
            problems += [(f"{group}.{key}", f"the group sets it ({group}: {memory} memory, {controller} controller); "
                          "run another group instead") for key in table if key in _GROUP_DESIGN]
            if any(key.startswith("backends.baseline_memory") for key in table):
                # group_config has already turned it into the group's memory backend when overrides apply
                problems.append((f"{group}.backends.baseline_memory", "set once for the summary groups, outside "
                                 "[matrix]; for this group alone set backends.memory"))
        if problems:
            raise KeyProblems(*problems)
        return overrides


_PROMPT_FIELDS = {"overwrite_update": {"question", "memory", "chunk"}, "overwrite_final": {"question", "memory"}}


class Prompts(StrictConfig):
    """Wording of the overwrite-memory (MemAgent) prompts. Unset fields use the built-in
    wording of ``engine/prompts.py``; set wording is hashed into the run's ``prompt_version``,
    so runs with different prompts are never mixed."""

    initial_memory: str | None = Field(None, description="Memory shown before the first chunk (built-in: '(empty)')")
    overwrite_update: str | None = Field(
        None, description="User message of a memory update: a template with {question}, {memory} and {chunk}"
    )
    overwrite_final: str | None = Field(
        None, description="User message of the final answer: a template with {question} and {memory}; ask for \\boxed{}"
    )

    @config_check
    def _templates_name_their_fields(self, context: dict[str, Any]) -> None:
        import string

        problems = []
        for name, wanted in _PROMPT_FIELDS.items():
            template = getattr(self, name)
            if template is None:
                continue
            try:
                used = {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}
            except ValueError as exc:
                problems.append((name, f"not a format template ({exc}); write literal braces as {{{{ and }}}}"))
                continue
            if used != wanted:
                problems.append((
                    name,
                    f"uses {{{'}, {'.join(sorted(used))}}} but must use exactly "
                    f"{{{'}, {'.join(sorted(wanted))}}} (literal braces as {{{{ and }}}})",
                ))
        if problems:
            raise KeyProblems(*problems)


# Files of a local tokenizer folder, one of which ``RunConfig.tokenizer`` needs (transformers
# loads a fast tokenizer from tokenizer.json, any other from what tokenizer_config.json names).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def tokenizer_problem(spec: str, missing_ok: bool = False) -> str | None:
    """Why ``spec`` is no budget tokenizer (``RunConfig.tokenizer``), else ``None``: a name of
    ``memsearch.tokenizer.TOKENIZERS`` or a local folder holding one of ``TOKENIZER_FILES``.
    ``missing_ok``: a path where nothing exists is not (yet) a problem."""
    from memsearch.tokenizer import TOKENIZERS

    expected = f"expected {' or '.join(repr(n) for n in TOKENIZERS)} or a local Hugging Face tokenizer folder"
    if spec in TOKENIZERS:
        return None
    if not spec.strip():
        return f"empty; {expected}"
    folder = Path(spec)
    if not os.path.lexists(folder):
        return None if missing_ok else f"{spec!r}: no such folder; {expected}"
    if not folder.is_dir():
        return f"{spec!r} is not a folder; {expected}"
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return f"{spec!r} is a folder without {' or '.join(TOKENIZER_FILES)}; {expected}"
    return None


class RunConfig(StrictConfig):
    """Everything an eval run needs besides the data folder."""

    tokenizer: str = Field("embedded", description="embedded | lexical | a local tokenizer folder; counts every budget")
    agent: Agent = Field(default_factory=Agent, description="Episode design")
    budgets: Budgets = Field(default_factory=Budgets, description="Budgets, identical for all groups of a matrix")
    backends: Backends = Field(default_factory=Backends, description="Backend per role")
    concurrency: int = Field(8, ge=1, description="Episodes run at once")
    limit: int | None = Field(None, ge=1, description="Evaluate only the first N tasks")
    matrix: Matrix = Field(default_factory=Matrix, description="Groups for `memsearch matrix`")
    prompts: Prompts = Field(default_factory=Prompts, description="Wording of the overwrite (MemAgent) prompts")
    retrieval: Retrieval = Field(default_factory=Retrieval, description="Retriever of search evidence")

    @field_validator("tokenizer")
    @classmethod
    def _a_tokenizer_there_is(cls, spec: str) -> str:
        # Checked at load: an empty name would load the working folder ("" is "."), a folder of
        # something else fails deep inside transformers after the run folder exists. A folder
        # that is not there (yet: a GPU recipe's model) is refused when a run starts
        # (``eval.run_folder.model_identity``), where the model folders are checked.
        problem = tokenizer_problem(spec, missing_ok=True)
        if problem:
            raise ValueError(problem)
        return spec

    @config_check
    def _consistent_agent(self, context: dict[str, Any]) -> None:
        agent, mode = self.agent, memory_mode(self.agent.memory)
        problems = []
        if agent.evidence == "stream" and (agent.controller != "exhaust" or not mode.streams):
            problems.append(("agent", "evidence 'stream' reads every chunk: use controller 'exhaust' and memory "
                             f"{either([n for n in MEMORY_MODES if MEMORY_MODES.get(n).streams])}"))
        if agent.memory_format == "extractive" and not mode.operations:
            problems.append(("agent.memory_format", "'extractive' is a format of decision memory (memory = "
                             f"{either([n for n in MEMORY_MODES if MEMORY_MODES.get(n).operations])})"))
        if agent.evidence == "search" and agent.controller == "exhaust":
            problems.append(
                ("agent", "controller 'exhaust' belongs to evidence 'stream'; use 'fixed' or 'policy' with 'search'")
            )
        if problems:
            raise KeyProblems(*problems)

    @config_check
    def _schema_mode_runs_locally(self, context: dict[str, Any]) -> None:
        memory = self.backends.memory
        if memory.schema_mode and not BACKEND_KINDS.get(memory.kind).schema_mode:
            kinds = either([kind for kind in BACKEND_KINDS if BACKEND_KINDS.get(kind).schema_mode])
            raise KeyProblems(("backends.memory.schema_mode", f"schema_mode = true needs backends.memory.kind = "
                               f"{kinds} (hf: constrained decoding in the local model; openai: the server "
                               f"constrains it, schema_style); got kind {memory.kind!r}"))

    @config_check
    def _group_overrides_validate(self, context: dict[str, Any]) -> None:
        # Each group's config is validated at load, where the problem can still name its file and
        # key, not when the matrix reaches that group. A group's own config skips this (its
        # matrix table is the base's), or every group would validate every group again.
        if not self.matrix.overrides or context.get(_AS_GROUP):
            return
        if self.agent.evidence != "search":
            raise KeyProblems(("matrix.overrides", "the A-D matrix runs search agents (agent.evidence = 'search'); "
                               "this config streams, so no group of it runs"))
        problems = []
        for group in self.matrix.overrides:
            try:
                group_config(self, group)
            except ValidationError as exc:
                problems += validation_problems(exc, f"matrix.overrides.{group}")
        if problems:
            raise KeyProblems(*problems)


def defaulted_sections(tables: dict[str, Any], uses_controller: bool) -> list[str]:
    """Tables a run depends on that its config leaves out (so defaults fill them silently).

    A whole missing backend table means that role runs the default ``rules`` backend, e.g. an
    "api" run whose reader is not the API: worth a notice naming the table. The controller
    counts only when the run calls it (``uses_controller``: a policy controller, or a matrix).
    """
    missing = [name for name in ("agent", "budgets") if name not in tables]
    backends = tables.get("backends") if isinstance(tables.get("backends"), dict) else {}
    roles = CALL_ROLES if uses_controller else ("memory", "reader")
    return missing + [f"backends.{role}" for role in roles if role not in backends]


def _merged_base(model: str) -> str:
    """The base model a ``memsearch merge-adapter`` checkpoint records, followed back to a model
    that is not such a checkpoint (bounded: a record that loops is a broken folder)."""
    for _ in range(8):
        record = Path(model) / "memsearch_merge.json"
        if not record.is_file():
            return model
        model = json.loads(record.read_text(encoding="utf-8"))["base"]
    raise InputError(
        f"{model}: memsearch_merge.json records bases 8 levels deep; set backends.baseline_memory explicitly"
    )


def baseline_memory_backend(backends: Backends) -> BackendConfig:
    """The memory backend of the summary groups A/C (docs/design.md §3).

    ``backends.baseline_memory`` when set. Otherwise the run's original memory model: the
    run's ``backends.memory`` (every field as written: kind, sampling, limits), for ``kind = "hf"``
    with ``adapter`` removed and, with a merged checkpoint as ``model`` (a folder holding
    ``memsearch_merge.json``, which ``memsearch merge-adapter`` writes), the base model that
    checkpoint records. A served model (``kind = "openai"``) cannot be traced to its base, so
    without ``baseline_memory`` it is refused (``InputError``): A/C would otherwise summarise with
    the served, perhaps trained, model without a word. Which backend was used is recorded in every
    summary (``memory_backend``). The settings are validated where they are set (``group_config``).
    """
    if backends.baseline_memory is not None:
        return backends.baseline_memory
    memory = backends.memory
    if isinstance(memory, OpenAISettings):
        raise InputError(
            f"backends.memory is a served model ({memory.model!r} at {memory.base_url}) and "
            "backends.baseline_memory is unset: the summary groups A/C would summarise with that same model, "
            "trained or not; set backends.baseline_memory to the original model's backend (a [backends."
            "baseline_memory] table: kind, base_url, model), the same as backends.memory if it is untrained"
        )
    if isinstance(memory, HFSettings):
        memory = memory.model_copy(update={"adapter": None, "model": _merged_base(memory.model)})
    return memory


def group_config(base: RunConfig, group: str) -> RunConfig:
    """The config of one matrix group: the base with the group's memory and controller, the
    summary groups' memory backend (``baseline_memory_backend``), then the group's overrides
    (applied last, so an explicit per-group setting wins), composed as values and validated once
    (``config.compose.with_values``)."""
    memory, controller = GROUP_DESIGNS[group]
    values: dict[str, Any] = {"agent.memory": memory, "agent.controller": controller}
    if memory == "summary":
        # A/C are the untrained-summary baselines: a trained memory policy must not write their memory.
        values["backends.memory"] = baseline_memory_backend(base.backends)
        values["agent.memory_format"] = "text"  # a format of decision memory (B/D's); summary notes have none
    # Values are set as they were read, not round-tripped through `--set` text (a table would
    # come back a string). In order: a group's empty table (``backends.memory = {}``) changes nothing.
    overrides = base.matrix.overrides.get(group, {})
    return with_values(base, [*values.items(), *overrides.items()], context={_AS_GROUP: True})


def load_config(path: str | Path | None, overrides: list[str] | None = None, model: type[BaseModel] = RunConfig) -> Any:
    """Read a TOML config, apply overrides, validate; problems name the file and field.

    The file must hold ``model`` itself. A pipeline config holds its run config in a table of its
    own and turns itself into one (``memsearch.pipelines.config.load_run_config``): this module
    sits below the pipelines and does not know them (docs/design.md §11)."""
    return config_from_tables(read_config_file(path), overrides, model, str(path) if path else "<defaults>")

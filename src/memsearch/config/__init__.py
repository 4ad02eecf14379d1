"""Run configuration (docs/design.md §11): ``run`` holds the run config's models and loaders,
``backend`` one role's backend settings (one model per kind), ``strict`` the base every config model shares
(``StrictConfig``: extra keys refused, no coercion) and the one ``--set`` merge, ``compose`` configs made
from configs as values (``with_values``) and the one JSON form of a recorded config (``config_json``). The names code
uses are re-exported here: ``from memsearch.config import RunConfig, load_config``."""

from memsearch.config.backend import (
    BackendConfig,
    HFSettings,
    OpenAISettings,
    OracleSettings,
    RulesSettings,
    Sampling,
)
from memsearch.config.compose import config_json, with_values
from memsearch.config.flat_form import legacy_backend_dump
from memsearch.config.run import (
    GROUP_DESIGNS,
    MAX_BOOTSTRAP_RESAMPLES,
    MEMORY_MAX_SOURCES,
    TOKENIZER_FILES,
    Agent,
    Backends,
    Budgets,
    Matrix,
    Prompts,
    Retrieval,
    RunConfig,
    baseline_memory_backend,
    config_from_tables,
    defaulted_sections,
    group_config,
    load_config,
    read_config_file,
    tokenizer_problem,
    validation_problems,
)
from memsearch.config.strict import (
    KeyProblems,
    StrictConfig,
    apply_overrides,
    config_check,
    merge_tables,
)

__all__ = [
    "GROUP_DESIGNS", "MAX_BOOTSTRAP_RESAMPLES", "MEMORY_MAX_SOURCES", "TOKENIZER_FILES", "Agent", "BackendConfig",
    "Backends", "Budgets", "HFSettings", "KeyProblems", "Matrix", "OpenAISettings", "OracleSettings", "Prompts",
    "Retrieval", "RulesSettings", "RunConfig", "Sampling", "StrictConfig", "apply_overrides", "baseline_memory_backend",
    "config_check", "config_from_tables", "config_json", "defaulted_sections", "group_config", "legacy_backend_dump",
    "load_config", "merge_tables", "read_config_file", "tokenizer_problem", "validation_problems", "with_values",
]

"""The flat form: how every backend table was dumped before each kind had its own settings
(``config.backend``), every key of every kind in each. Run folders, trainer configs and stage
records written then hold it; this module is the one place that reads it and rebuilds it.

On read (``BackendConfig``), a key of another kind at the value the flat form wrote when it was
unset is dropped (``unset_in_flat_form``), and so is the ``model`` a table of that form gives a
kind that runs none (``filled_model``: a pipeline filled it in). Both are decided by the table
alone, never by what exists on disk: a config validates alike on every machine. Stage records of
version 2 compare in this form (``legacy_backend_dump``, ``pipelines.stage_versions``).
"""

from __future__ import annotations

from typing import Any

# What the flat form wrote for openai's max_concurrency, which it kept apart from the other kinds'.
_FLAT_OPENAI_MAX_CONCURRENCY = 8

# The flat form every backend table was dumped in before each kind had its own settings: every
# key, in this order, at the value written when unset (openai's max_concurrency: 8).
FLAT_FIELDS: tuple[tuple[str, Any], ...] = (
    ("kind", "rules"), ("model", "embedded"), ("adapter", None), ("base_url", None), ("max_concurrency", 16),
    ("timeout_s", 120.0), ("max_retries", 8), ("retry_window_s", 60.0), ("extra_body", None),
    ("schema_style", "response_format"), ("context_tokens", None),
    ("sampling", {"temperature": 0.0, "top_p": 1.0, "seed": 0}), ("schema_mode", False), ("open_items", False),
)


# What earlier flat forms wrote for an unset key besides the values above (max_retries was 4
# until the retry window came): their run folders hold it in every role's table.
_EARLIER_UNSET: dict[str, tuple[Any, ...]] = {"max_retries": (4,), "schema_style": ("auto",)}
# Keys kinds gained after the flat form, at their unset values: a table composed from another
# kind's (a pipeline's local backend on the served memory's settings; the rules row of the demo
# from an hf one) holds them.
_LATER_UNSET: dict[str, Any] = {"engine": "auto", "weights": "float32"}


def flat_default(kind: str, key: str) -> Any:
    return _FLAT_OPENAI_MAX_CONCURRENCY if (kind, key) == ("openai", "max_concurrency") else dict(FLAT_FIELDS)[key]


def unset_in_flat_form(key: str, value: Any) -> bool:
    """Whether ``value`` of ``key``, held by a kind that does not read it, is what the flat form
    wrote for an unset key (``model``: 'embedded'). Decided by the value alone, never by what
    exists on disk."""
    if key in _LATER_UNSET:
        return value == _LATER_UNSET[key]
    if key not in dict(FLAT_FIELDS):
        return False
    return value == dict(FLAT_FIELDS)[key] or value in _EARLIER_UNSET.get(key, ())


# The keys of the first flat form, which every later one kept: a backend table holding them all
# was dumped by an earlier version (no kind's settings hold them all now).
_FIRST_FLAT_KEYS = frozenset(("kind", "model", "adapter", "base_url", "max_concurrency", "timeout_s", "max_retries",
                              "sampling"))


def filled_model(key: str, value: Any, table: dict[str, Any]) -> bool:
    """Whether ``value`` of ``key``, held by a kind that does not read it, is the ``model`` of a
    table an earlier version dumped (``_FIRST_FLAT_KEYS``): a pipeline filled its model into a
    rules or oracle role of its runs (``legacy_pipeline_run_form``), which read none, so in such
    a record it is dropped whatever it names. In a table of this version's form it is refused."""
    return key == "model" and isinstance(value, str) and _FIRST_FLAT_KEYS <= table.keys()


def legacy_backend_dump(dump: dict[str, Any]) -> dict[str, Any]:
    """A backend table as this version dumps it (its kind's keys) turned into the flat form of
    earlier versions: every key of that form in its order, a key the kind lacks at the value the
    flat form wrote for it unset. A registered kind's own keys follow (the flat form never had
    them). Records written before the split (a pipeline's stage records) compare in this form."""
    kind = dump.get("kind", "rules")
    out = {key: dump.get(key, flat_default(kind, key)) for key, _ in FLAT_FIELDS}
    later = {key: value for key, value in dump.items()
             if key not in out and not (key in _LATER_UNSET and value == _LATER_UNSET[key])}
    return {**out, **later}



def legacy_backend_form(dump: dict[str, Any]) -> dict[str, Any]:
    """``legacy_backend_dump`` of a backend table found in a larger dump (a dict holding ``kind``,
    ``sampling`` and ``schema_mode``); any other dict as it is."""
    if isinstance(dump.get("kind"), str) and {"sampling", "schema_mode"} <= dump.keys():
        return legacy_backend_dump(dump)
    return dump


def legacy_pipeline_run_form(dump: dict[str, Any], roles: tuple[str, ...]) -> dict[str, Any]:
    """A run config dump as a pipeline's stage may have recorded it before each kind had its own
    settings: a pipeline filled its model (the run's ``tokenizer``) into the memory and reader
    roles of its ``[episode]`` whatever their kind, so a rules or oracle role there held it
    (``pipelines.config.episode_table``); the configs it built itself (a teacher's) did not.
    ``roles``: the roles filled. Any other dict as it is."""
    backends, model = dump.get("backends"), dump.get("tokenizer")
    if not isinstance(backends, dict) or not isinstance(model, str):
        return dump
    filled = {role: {**table, "model": model} if isinstance(table, dict) and "model" not in table else table
              for role, table in backends.items() if role in roles}
    return {**dump, "backends": {**backends, **filled}}

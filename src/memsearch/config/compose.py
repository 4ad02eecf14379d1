"""Configs composed as values (docs/design.md §11): ``config_json`` is the one place that decides the
JSON form of a config a record holds or a fingerprint hashes; ``with_values`` makes a config from
another by setting values at dotted keys, validated once, never by dumping it to JSON, editing the
dump and reading it back.

This module knows no config model: it works on any pydantic model (``StrictConfig`` or not).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


def config_json(config: BaseModel) -> Any:
    """``config`` as JSON values (dicts, lists, str, numbers, bools, None): the form a run folder
    records (``config.json``, ``run.json``, a summary's ``config``) and a stage fingerprint hashes.
    Every such record goes through here, so the form is decided in one place; it must not change
    for a config that did not change, or recorded runs would no longer resume (their records and
    fingerprints compare with this form)."""
    return config.model_dump(mode="json")


def _fields(node: Any) -> dict[str, Any] | None:
    """The values a key below ``node`` is set in: a model's fields (its validated values), a
    table's (dict's) items; ``None`` for anything else (a key below it replaces it)."""
    if isinstance(node, BaseModel):
        return dict(node)
    if isinstance(node, Mapping):
        return dict(node)
    return None


def _merged(node: Any, table: Mapping[str, Any]) -> dict[str, Any]:
    """``table`` (a dict value) over ``node``: a model or table present in both merges key by key,
    any other value replaces (``strict.merge_tables``, with models taken as their fields)."""
    out = _fields(node)
    assert out is not None
    for key, value in table.items():
        below = out.get(key)
        out[key] = _merged(below, value) if isinstance(value, Mapping) and _fields(below) is not None else _set(value)
    return out


def _set(value: Any) -> Any:
    """A value as it is set: a model given whole is validated again in its new place (its fields)."""
    return _fields(value) if isinstance(value, BaseModel) else value


def with_values(
    config: M, values: Mapping[str, Any] | Iterable[tuple[str, Any]], context: dict[str, Any] | None = None
) -> M:
    """``config`` with ``values`` set, validated once as ``type(config)`` (with ``context``), so a
    composed config is refused where the same config written in a file would be, its problems at
    the same key paths (``config.strict.validation_problems``).

    ``values`` maps dotted keys (``"backends.memory.adapter"``) to values (or is such pairs, where
    a key may come again), applied in order. A
    value replaces what its key holds, except a dict, which is merged into the model or table
    there (``strict.merge_tables``: ``{}`` changes nothing). A model given as a value is validated
    again from its fields where it is set (``backends.memory``: as that role's backend). What no
    key reaches stays the validated object it was (not validated again); the models a key passes
    through, and ``config`` itself, are validated again from their fields, so their checks across
    fields run on the composed result. Nothing is dumped to JSON and read back."""
    root = _fields(config)
    assert root is not None
    for dotted, value in values.items() if isinstance(values, Mapping) else values:
        *above, last = dotted.split(".")
        node = root
        for part in above:
            below = _fields(node.get(part))
            node[part] = below if below is not None else {}
            node = node[part]
        below = node.get(last)
        node[last] = _merged(below, value) if isinstance(value, Mapping) and _fields(below) is not None else _set(value)
    return type(config).model_validate(root, context=context)

"""The config machinery every config model of the package uses: ``StrictConfig`` (the one base:
unknown keys refused, no coercion, frozen, finite floats), its checks across fields
(``@config_check`` raising ``KeyProblems``, all reported together), reading a TOML file and the
``--set key=value`` overrides (``merge_tables``, ``apply_overrides``, ``config_from_tables``).

The run config's models live in ``memsearch.config``, which re-exports these names; this module
knows no model of its own.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, model_validator

from memsearch.errors import InputError, InputValueError, Problem


class KeyProblems(InputValueError):
    """Problems a validator found, each at a dotted key path relative to the model it validates
    (``("matrix.overrides.b", "no such group")``). Raised inside a pydantic validator it reaches
    ``validation_problems`` in the error's context, which prefixes the error's location, so a
    check across fields still names a full key path; outside pydantic it reads ``path: what``."""

    def __init__(self, *problems: tuple[str, str]) -> None:
        self.keyed = list(problems)
        super().__init__("; ".join(f"{path}: {what}" if path else what for path, what in self.keyed))


def validation_problems(exc: ValidationError, prefix: str = "") -> list[tuple[str, str]]:
    """Every error of ``exc`` as (full dotted key path below ``prefix``, what was expected): the
    problems of a ``KeyProblems`` one by one, a validator's own words without pydantic's
    "Value error, ", "unknown field" for a key the model does not have."""
    problems = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in (prefix, *err["loc"]) if part != "")
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, KeyProblems):
            problems += [(".".join(p for p in (loc, path) if p), what) for path, what in cause.keyed]
        elif err["type"] == "extra_forbidden":
            problems.append((loc, "unknown field"))
        else:
            problems.append((loc, str(cause) if err["type"] == "value_error" and cause else err["msg"]))
    return problems


def without_default(data: Any, field: str, default: Any) -> Any:
    """A model's dump (``data``) with ``field`` left out where it holds ``default``: a field added
    later keeps the dumps, saved configs and stage fingerprints of configs that never set it
    (used by a ``model_serializer(mode="wrap")``)."""
    if isinstance(data, dict) and field in data and data[field] == default:
        data.pop(field)
    return data


def config_check(method: Callable[..., None]) -> Callable[..., None]:
    """Mark a method of a ``StrictConfig`` as one of its checks across fields: called with the
    validated model and the validation context (a dict, empty when none), it raises
    ``KeyProblems`` for what is wrong. The model runs every check and reports the problems of
    all of them together (``StrictConfig._run_checks``): a config with several problems is
    refused once, naming each, not once per problem (a pydantic ``model_validator`` that raises
    hides the validators after it)."""
    method.__config_check__ = True  # type: ignore[attr-defined]
    return method


class StrictConfig(BaseModel):
    """The base of every config model of the package (run, trainer, pipeline, verl).

    Strict: `--set steps=true` must be an error naming the key, not 1 (no silent bool->int or
    str->number); unknown keys are refused (a typo must not fall back to a default); frozen, so
    a validated config is what was recorded. TOML ints are accepted for float fields (pydantic's
    strict mode allows int -> float); a field that needs more (a tuple written as a TOML list)
    says so where it is declared. A float that is NaN or infinite (TOML ``inf``, ``nan``) is
    refused naming its field: no setting means "unbounded" by inf, and a record file (the saved
    ``config.json``) holds strict JSON, which has no spelling for them. Checks across fields are
    methods marked ``@config_check``, all run and reported together."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    @model_validator(mode="after")
    def _run_checks(self, info: ValidationInfo) -> StrictConfig:
        problems: list[tuple[str, str]] = []
        context = info.context or {}
        for name in _checks_of(type(self)):
            try:
                getattr(self, name)(context)
            except KeyProblems as exc:
                problems += exc.keyed
        if problems:
            raise KeyProblems(*problems)
        return self


def _checks_of(model: type[BaseModel]) -> list[str]:
    """Names of the ``@config_check`` methods of ``model`` and its bases, in definition order."""
    names: list[str] = []
    for klass in reversed(model.__mro__):
        for name, value in vars(klass).items():
            if getattr(value, "__config_check__", False) and name not in names:
                names.append(name)
    return names


def _parse_value(raw: str) -> Any:
    """``--set`` values are TOML literals when they parse as such, else plain strings."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def merge_tables(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``: tables (dicts) present in both merge key by key, any other value of
    ``top`` replaces ``base``'s. Neither argument is changed. The one merge of raw config tables
    in the package: a trainer's ``episode_config`` under its ``[episode]``, a pipeline's defaults
    under what its tables set."""
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        out[key] = merge_tables(below, value) if isinstance(value, dict) and isinstance(below, dict) else value
    return out


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides to a nested dict (copy). The value replaces what the key
    holds (a table given whole replaces that table; ``merge_tables`` is for merging tables)."""
    data = json.loads(json.dumps(data))
    for item in overrides:
        if "\n" in item or "\r" in item:
            # TOML would read the first line as the value and drop the rest without a word.
            raise InputError(f"--set {item!r}: holds a line break; expected one key=value on one line "
                             "(give each setting its own --set)")
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set {item!r}: expected key=value, e.g. budgets.max_searches=2")
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise InputError(f"--set {item!r}: {part} is not a table")
        node[parts[-1]] = _parse_value(raw.strip())
    return data


def read_config_file(path: str | Path | None) -> dict[str, Any]:
    """The raw tables of a TOML config file (none for no file); problems name the file."""
    if path is None:
        return {}
    from memsearch.io import file_kind_problem

    path = Path(path)
    # Named before it is opened: a FIFO would block, /dev/zero never ends, a symlink loop is no "missing file".
    if (problem := file_kind_problem(path, "a TOML config file")) is not None:
        raise InputError(f"{path}: {'no such config file' if problem == 'no such file' else problem}")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a BOM is not part of the TOML
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: invalid TOML ({exc})") from None
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); save the file as UTF-8"
        ) from None


def _origin(path: str, flags: list[tuple[list[str], str]], where: str) -> str:
    """Where the value at key ``path`` came from: the last ``--set`` of that key or of a table
    above it (that value won); else the last one that set a key below it (``--set nosuch.key=1``
    is refused at ``nosuch``; a check across a table's fields is refused at the table); else the
    file ``where``."""
    keys = path.split(".") if path else []
    above = [flag for key, flag in flags if keys[: len(key)] == key]
    below = [flag for key, flag in flags if keys and key[: len(keys)] == keys]
    return (above or below or [where])[-1]


_SPELLING_PROBE = "\0--set\0"  # a value no config holds: where upgrade_keys moves it is the key's current path


def _current_key(upgrade: Callable[[Any], Any], key: str) -> str:
    """``key`` (a ``--set`` key path) in the current spelling, as ``upgrade`` (a model's
    ``upgrade_keys``) would move it; unchanged when it cannot tell."""
    parts = key.split(".")
    if not key or not all(parts):
        return key
    probe: Any = _SPELLING_PROBE
    for part in reversed(parts):
        probe = {part: probe}
    try:
        moved = upgrade(probe)
    except KeyProblems:
        return key

    def find(node: Any, path: list[str]) -> list[str] | None:
        if node == _SPELLING_PROBE:
            return path
        for name, value in node.items() if isinstance(node, dict) else ():
            found = find(value, [*path, str(name)])
            if found is not None:
                return found
        return None

    return ".".join(find(moved, []) or parts)


def config_from_tables(data: dict[str, Any], overrides: list[str] | None, model: type[BaseModel], where: str) -> Any:
    """Apply ``--set`` overrides to raw tables and validate them; problems name ``where`` and the field.

    A model that reads earlier spellings (its ``upgrade_keys`` classmethod, the trainer configs)
    has the file's tables put in the current spelling first, so a ``--set`` in the current one
    applies over a file in the earlier one: a command-line value always wins."""
    given = list(overrides or [])
    keys = [item.partition("=")[0].strip() for item in given]
    upgrade = getattr(model, "upgrade_keys", None)
    if callable(upgrade):
        try:
            data = upgrade(data)
        except KeyProblems as exc:  # the file gives a field in both spellings
            raise InputError([Problem(where, None, path, what) for path, what in exc.keyed]) from None
        current = [_current_key(upgrade, key) for key in keys]
        for i, (key, now) in enumerate(zip(keys, current, strict=True)):
            other = next((k for k, n in zip(keys[:i], current[:i], strict=True) if n == now and k != key), None)
            if other is not None:  # two flags, two spellings, one setting: which was meant is unclear
                raise InputError(f"--set {key}: {other} and {key} are one setting, in its earlier and its current "
                                 f"spelling; give it once: {now}")
        keys = current
    data = apply_overrides(data, [f"{key}={item.partition('=')[2]}" if "=" in item else item
                                  for key, item in zip(keys, given, strict=True)])
    # A problem in a field that `--set` wrote is reported against the flag, not the file.
    flags = [(key.split("."), f"--set {item}") for key, item in zip(keys, given, strict=True)]
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        found = [Problem(_origin(path, flags, where), None, path, what) for path, what in validation_problems(exc)]
    if all(problem.field for problem in found):
        raise InputError(found)
    # A check of the whole config names no key: `source: what`, never `source: : what`.
    raise InputError("\n".join(str(p) if p.field else f"{p.file}: {p.message}" for p in found))

"""Where a config problem is, and what the table takes: the line of a key in its TOML file, the
valid keys of the table an unknown key was found in, the value a wrong one holds.

``config_from_tables`` (``strict.py``) reports ``file: dotted.key: what``. ``locate_problems``
adds to each problem of its ``InputError`` what the person fixing the file needs: the line the key
(or its nearest table) is on, ``file:line: key: ...``, for a problem that came from the file (one
that came from ``--set`` keeps naming the flag); for an unknown key the keys its table takes (and
the closest, for a typo); for a value of the wrong type or outside the choices, the value given::

    try:
        return config_from_tables(tables, overrides, Model, str(path))
    except InputError as exc:
        raise locate_problems(exc, Model, apply_overrides(tables, overrides), file_locator(path)) from None

``config_from_file`` is that for a config that is one file's tables. The lines come from the file's
text (``toml_key_lines``), read after ``tomllib`` has accepted it: the scan needs no error handling
of its own, and a file it cannot follow only loses lines, never a problem.
"""

from __future__ import annotations

import bisect
import difflib
import re
import tomllib
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, NamedTuple, Union, get_args, get_origin

from pydantic import BaseModel

from memsearch.config.strict import apply_overrides, config_from_tables, read_config_file
from memsearch.errors import InputError, Problem

_BARE = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR_END = re.compile(r"[,\]}\n#]")
FLAG_PREFIX = "--set "


class Where(NamedTuple):
    """Where a dotted key of the validated config is written: the file, its line (``None``: not
    found) and the key as the file spells it (a profile's key sits under ``profile.NAME.``)."""

    file: str
    line: int | None
    key: str


def toml_key_lines(text: str) -> dict[str, int]:
    """Dotted key -> line (1-based) where the key is defined: table headers, keys (dotted ones
    too), keys of inline tables; elements of arrays and arrays of tables by index (``a.0.b``), as
    pydantic's locations name them. A table defined only by a longer header or dotted key has the
    line of its first mention. Expects text ``tomllib`` accepts; stops quietly where it cannot follow."""
    scan = _Scan(text)
    try:
        scan.document()
    except (IndexError, ValueError):
        pass
    return scan.lines


class _Scan:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0
        self.lines: dict[str, int] = {}
        self.explicit: set[str] = set()
        self.arrays: dict[str, int] = {}
        self.newlines = [i for i, ch in enumerate(text) if ch == "\n"]

    def _line(self, pos: int) -> int:
        return bisect.bisect_left(self.newlines, pos) + 1

    def _record(self, keys: list[str], pos: int, explicit: bool = True) -> None:
        line = self._line(pos)
        for end in range(1, len(keys) + 1):
            path = ".".join(keys[:end])
            last = end == len(keys) and explicit
            if path not in self.lines or (last and path not in self.explicit):
                self.lines[path] = line
            if last:
                self.explicit.add(path)

    def _space(self, newlines: bool) -> None:
        text = self.text
        while self.pos < len(text):
            ch = text[self.pos]
            if ch in " \t\r" or (newlines and ch == "\n"):
                self.pos += 1
            elif ch == "#":
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end
            else:
                return

    def document(self) -> None:
        table: list[str] = []
        while True:
            self._space(newlines=True)
            if self.pos >= len(self.text):
                return
            start = self.pos
            if self.text[start] == "[":
                double = self.text.startswith("[[", start)
                self.pos += 2 if double else 1
                table = self._header(self._key(), double, start)
                self.pos = self.text.index("]]" if double else "]", self.pos) + (2 if double else 1)
            else:
                keys = table + self._key()
                self._record(keys, start)
                self._space(newlines=False)
                self.pos = self.text.index("=", self.pos) + 1
                self._value(keys)

    def _header(self, keys: list[str], double: bool, start: int) -> list[str]:
        resolved: list[str] = []
        for i, part in enumerate(keys):
            resolved.append(part)
            path = ".".join(resolved)
            if path in self.arrays and not (double and i == len(keys) - 1):
                resolved.append(str(self.arrays[path]))  # a table below an array of tables: its last element
        if double:
            path = ".".join(resolved)
            self.arrays[path] = self.arrays.get(path, -1) + 1
            self._record(resolved, start)
            resolved.append(str(self.arrays[path]))
        self._record(resolved, start)
        return resolved

    def _key(self) -> list[str]:
        parts = []
        while True:
            self._space(newlines=False)
            text, pos = self.text, self.pos
            if text[pos] in "\"'":
                end = self._string_end(pos)
                parts.append(tomllib.loads(f"k = {text[pos:end]}")["k"])
                self.pos = end
            else:
                match = _BARE.match(text, pos)
                if match is None:
                    raise ValueError(f"no key at offset {pos}")
                parts.append(match.group())
                self.pos = match.end()
            self._space(newlines=False)
            if self.text[self.pos] != ".":
                return parts
            self.pos += 1

    def _string_end(self, pos: int) -> int:
        """The offset after the string starting at ``pos`` (any of TOML's four kinds)."""
        text = self.text
        quote = text[pos]
        if text.startswith(quote * 3, pos):
            i = pos + 3
            while not text.startswith(quote * 3, i):
                i += 2 if quote == '"' and text[i] == "\\" else 1
            i += 3
            extra = 0
            while extra < 2 and i < len(text) and text[i] == quote:  # up to two quotes end the content
                i, extra = i + 1, extra + 1
            return i
        i = pos + 1
        while text[i] != quote:
            i += 2 if quote == '"' and text[i] == "\\" else 1
        return i + 1

    def _value(self, keys: list[str]) -> None:
        self._space(newlines=False)
        text, pos = self.text, self.pos
        ch = text[pos]
        if ch in "\"'":
            self.pos = self._string_end(pos)
        elif ch == "[":
            self.pos += 1
            index = 0
            while True:
                self._space(newlines=True)
                if self.text[self.pos] == "]":
                    self.pos += 1
                    return
                self._record([*keys, str(index)], self.pos)
                self._value([*keys, str(index)])
                index += 1
                self._space(newlines=True)
                if self.text[self.pos] == ",":
                    self.pos += 1
        elif ch == "{":
            self.pos += 1
            while True:
                self._space(newlines=False)
                if self.text[self.pos] == "}":
                    self.pos += 1
                    return
                start = self.pos
                inner = [*keys, *self._key()]
                self._record(inner, start)
                self._space(newlines=False)
                self.pos = self.text.index("=", self.pos) + 1
                self._value(inner)
                self._space(newlines=False)
                if self.text[self.pos] == ",":
                    self.pos += 1
        else:
            match = _SCALAR_END.search(text, pos)
            self.pos = len(text) if match is None else match.start()


def nearest_line(lines: Mapping[str, int], key: str) -> int | None:
    """The line of ``key``, else of the nearest table above it that the file writes (a missing
    key: its table's header); ``None`` when the file writes none of them."""
    parts = key.split(".") if key else []
    while parts:
        if (line := lines.get(".".join(parts))) is not None:
            return line
        parts.pop()
    return None


def file_locator(path: str | Path) -> Callable[[str], Where]:
    """``Where`` of each key of a config that is the tables of the file at ``path``."""
    try:
        lines = toml_key_lines(Path(path).read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError):
        lines = {}
    return lambda key: Where(str(path), nearest_line(lines, key), key)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The one config model an annotation holds (``Model``, ``Model | None``), else ``None``."""
    if get_origin(annotation) is Annotated:
        return _model_of(get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        models = {m for arg in get_args(annotation) if (m := _model_of(arg)) is not None}
        return models.pop() if len(models) == 1 else None
    return None


def table_keys(model: type[BaseModel], path: Sequence[str]) -> list[str] | None:
    """The keys the table at dotted ``path`` of ``model`` takes (sorted), following fields, dict
    values and list elements; ``None`` where the table holds no single config model (a free-form
    table such as ``[recipe.override]``)."""
    annotation: Any = model
    for part in path:
        if (table := _model_of(annotation)) is not None:
            if part not in table.model_fields:
                return None
            annotation = table.model_fields[part].annotation
            continue
        origin = get_origin(annotation)
        args = get_args(annotation)
        if origin in (dict, Mapping) and len(args) == 2:
            annotation = args[1]
        elif origin in (list, tuple, Sequence) and args:
            annotation = args[0]
        else:
            return None
    table = _model_of(annotation)
    return None if table is None else sorted(field.alias or name for name, field in table.model_fields.items())


def _value_at(data: Any, keys: list[str]) -> tuple[bool, Any]:
    for key in keys:
        if isinstance(data, dict) and key in data:
            data = data[key]
        elif isinstance(data, list) and key.isdigit() and int(key) < len(data):
            data = data[int(key)]
        else:
            return False, None
    return True, data


def _explained(problem: Problem, model: type[BaseModel], data: dict[str, Any], shown: str,
               top_level: Sequence[str]) -> str:
    keys = problem.field.split(".")
    message = problem.message
    if message == "unknown field":
        valid = table_keys(model, keys[:-1])
        if valid is None:
            return message
        if len(keys) == 1 and shown == problem.field:
            valid = sorted({*valid, *top_level})
        close = difflib.get_close_matches(keys[-1], valid, n=1)
        table = shown.rsplit(".", 1)[0] if "." in shown else ""
        listed = f"valid keys of [{table}]" if table else "valid top-level keys"
        return ("unknown field" + (f" (did you mean {close[0]!r}?)" if close else "")
                + f"; {listed}: {', '.join(valid)}")
    found, value = _value_at(data, keys)
    if found and message.startswith("Input should"):  # pydantic's own words name no value
        return f"{message}; got {value!r:.80}"
    return message


def locate_problems(error: InputError, model: type[BaseModel], data: dict[str, Any],
                    locate: Callable[[str], Where], top_level: Sequence[str] = ()) -> InputError:
    """``error`` (from ``config_from_tables``) with each problem that came from the file at its
    line (``locate``: the file's ``Where`` of a dotted key), an unknown key's message listing the
    keys its table takes, a wrong value's message naming it. ``data``: the tables as validated
    (``--set`` applied); ``top_level``: keys the file may hold beside the model's own (a table
    the loader reads itself, such as ``profile``). An error with no keyed problem comes back as
    it is."""
    if not error.problems:
        return error
    located = []
    for problem in error.problems:
        if problem.file.startswith(FLAG_PREFIX):
            # --set applies to the model's tables only (the loader has read its own ones by then)
            located.append(replace(problem, message=_explained(problem, model, data, problem.field, ())))
            continue
        where = locate(problem.field)
        message = _explained(problem, model, data, where.key, top_level)
        located.append(Problem(where.file, where.line, where.key, message))
    return InputError(located)


def config_from_file(path: str | Path, overrides: list[str] | None, model: type[BaseModel]) -> Any:
    """``model`` from the TOML file at ``path`` and ``--set`` ``overrides``, problems located
    (``locate_problems``): ``file:line: key: what``, unknown keys with the keys their table takes."""
    tables = read_config_file(path)
    try:
        return config_from_tables(tables, overrides, model, str(path))
    except InputError as exc:
        raise locate_problems(exc, model, apply_overrides(tables, overrides or []), file_locator(path)) from None

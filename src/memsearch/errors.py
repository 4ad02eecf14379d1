"""Errors about user input, worded for the person who has to fix the file.

Every problem names where it is and what was expected: ``file:line: field: what was wrong,
what was expected``. The CLI prints these messages and exits non-zero without a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One problem found in an input file."""

    file: str
    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.field}: {self.message}"


class InputError(Exception):
    """Bad input (file, folder, option): carries one or more ``Problem``s or a plain message."""

    def __init__(self, problems: list[Problem] | str) -> None:
        self.problems = [] if isinstance(problems, str) else list(problems)
        text = problems if isinstance(problems, str) else "\n".join(str(p) for p in problems)
        super().__init__(text)


class InputValueError(InputError, ValueError):
    """Bad input found by a check whose callers may also catch it as ``ValueError``: argument
    checks of library functions, and checks that run inside pydantic validators. The CLI reports
    it like any ``InputError`` (exit status 2), never as an internal error."""


class StorageError(Exception):
    """A write failed for a reason outside the program (disk full, read-only file system,
    permissions): what is saved is safe and the message says how to continue. The CLI prints it
    as one ``error:`` line and exits with status 4."""


class IncompleteResult(Exception):
    """A command ran to its end but what it made is not a result: some task failed or is missing
    (e.g. request timeouts). Nothing is lost: the same command continues and retries exactly those
    tasks. The CLI prints the message as ``INCOMPLETE:`` lines and exits with status 3."""

"""What every ``memsearch`` command group shares: exit statuses, the error handling of a command,
the group factory, renamed-command aliases, and the option types used by several groups.

Only typer is imported here; each command imports what it needs inside its body, so
``memsearch --help`` stays instant.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Annotated, Any, Callable, NoReturn, Optional

import typer
from typer.core import TyperCommand, TyperGroup

# Bad input or a refused command: the ``error:`` lines say why.
EXIT_INPUT = 2
# Exit status of `eval run` / `eval matrix` when the run finished but is not a result (tasks missing
# or failed): distinct from 1 (a crash) and 2 (bad input), so `memsearch eval run ... && next` stops.
EXIT_INCOMPLETE = 3
# A write failed (disk full, read-only, permissions): the saved tasks are safe; --resume continues.
EXIT_STORAGE = 4


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn bad input into ``error:`` lines and exit status 2, a failed write into one line and
    status 4, and a result with failed or missing tasks (``IncompleteResult``) into ``INCOMPLETE:``
    lines and status 3. Bad input is ``InputError`` (and its subclasses) and ``FileNotFoundError``,
    which the library raises for a missing user path (model, adapter, tokenizer folder). Anything
    else is a bug: it propagates, so the command ends with a traceback and status 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from memsearch.errors import IncompleteResult, InputError, StorageError

        try:
            return fn(*args, **kwargs)
        except (InputError, FileNotFoundError) as exc:
            _refuse(exc)
        except IncompleteResult as exc:
            for line in str(exc).splitlines():
                typer.echo(f"INCOMPLETE: {line}", err=True)
            raise typer.Exit(EXIT_INCOMPLETE) from None
        except StorageError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(EXIT_STORAGE) from None

    return wrapper


def _refuse(exc: Exception) -> NoReturn:
    """Bad input: its ``error:`` lines on stderr, then exit status 2."""
    for line in str(exc).splitlines():
        typer.echo(f"error: {line}", err=True)
    raise typer.Exit(EXIT_INPUT) from None


def out_problem(path: Path, kind: str) -> str | None:
    """Why no command can write the output ``path`` (``kind``: "folder" or "file"), else ``None``:
    a symlink to nothing, a path under a file or under such a symlink, or an existing path of the
    other kind. Whether an existing output may be written again is each command's own rule."""
    if path.is_symlink() and not path.exists():
        return (f"--out is a symlink to {os.readlink(path)}, which does not exist; remove the link or choose "
                "another --out")
    for parent in path.parents:  # the nearest existing ancestor decides whether the path can be made
        if os.path.lexists(parent):
            if parent.is_dir():
                break
            what = "a file" if parent.is_file() else "not a folder"
            if parent.is_symlink():
                what = f"a symlink to {os.readlink(parent)}, " + (what if parent.exists() else "which does not exist")
            return f"--out is under {parent}, {what}; expected a path under a folder"
    if path.exists() and path.is_dir() != (kind == "folder"):
        return f"--out is {'a folder' if path.is_dir() else 'a file'}; expected a {kind}"
    return None


def _out_check(kind: str) -> Callable[[Optional[Path]], Optional[Path]]:
    def check(value: Optional[Path]) -> Optional[Path]:
        from memsearch.errors import InputError

        problem = None if value is None else out_problem(value, kind)
        if problem:  # as --out is parsed: before any other option is read or anything runs
            _refuse(InputError(f"{value}: {problem}"))
        return value

    return check


# ``callback=`` of every ``--out`` option: one ``error:`` line and status 2 for an output path
# that cannot be written, instead of a traceback from deep inside the command.
out_folder = _out_check("folder")
out_file = _out_check("file")


class HelpGroup(TyperGroup):
    """A group whose ``--help`` lists each command with the whole first sentence of its help,
    wrapped, where plain click cuts it to the terminal width."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, command.get_short_help_str(limit=300)) for name in self.list_commands(ctx)
                if (command := self.get_command(ctx, name)) is not None and not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def command_group(help: str, cls: type[HelpGroup] = HelpGroup, **settings: Any) -> typer.Typer:
    """A command group in the style of every ``memsearch`` group: plain help (no rich panels,
    which also keeps ``--help`` fast), help when called with nothing, tracebacks as Python prints
    them."""
    return typer.Typer(help=help, cls=cls, no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                       pretty_exceptions_enable=False, **settings)


def say_renamed(old: str, new: str) -> None:
    """The one stderr line a renamed command prints before it runs."""
    typer.echo(f"`memsearch {old}` is now `memsearch {new}`", err=True)


def renamed(old: str, new: str, base: type[TyperCommand] = TyperCommand) -> type[TyperCommand]:
    """The command class of a hidden old name: it says what replaced it (also on ``--help`` and on
    a usage error, since the line is printed before the arguments are parsed), then runs the new
    command's body unchanged: same output, same exit statuses."""

    class Renamed(base):  # type: ignore[misc, valid-type]
        def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
            say_renamed(old, new)
            return super().parse_args(ctx, args)

    Renamed.__name__ = Renamed.__qualname__ = f"Renamed[{old}]"
    return Renamed


def renamed_options(command: str, flags: dict[str, str]) -> type[TyperCommand]:
    """The command class of a command whose options were renamed (old flag -> new flag): an old
    flag still works, after one stderr line saying what replaced it, and ``--help`` shows only the
    new one."""

    class RenamedOptions(TyperCommand):
        def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
            rewritten = []
            for i, arg in enumerate(args):
                if arg == "--":  # what follows is values only
                    rewritten += args[i:]
                    break
                flag, sep, value = arg.partition("=")
                if flag in flags:
                    typer.echo(f"`{flag}` of `memsearch {command}` is now `{flags[flag]}`", err=True)
                    arg = flags[flag] + sep + value
                rewritten.append(arg)
            return super().parse_args(ctx, rewritten)

    return RenamedOptions


def add_renamed(root: typer.Typer, old: str, new: str, command: Callable[..., Any],
                base: type[TyperCommand] = TyperCommand) -> None:
    """Register ``command`` on ``root`` under its old name ``old``, hidden from ``--help``
    (``base``: the new command's class, when it has one)."""
    root.command(old, hidden=True, cls=renamed(old, new, base))(command)


Limit = Annotated[Optional[int], typer.Option(help="Take only the first N examples, in source order.")]
Overrides = Annotated[Optional[list[str]], typer.Option(
    "--set", help="Override a config field: key=value (repeatable).")]
DataDir = Annotated[Path, typer.Option("--data", help="A prepared data folder.")]

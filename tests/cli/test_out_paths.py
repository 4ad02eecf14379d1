"""Every command's ``--out`` is checked before anything runs (issue 26 item 18): a dangling
symlink, or a path under a regular file or under a dangling symlink, is one ``error:`` line naming
the path and exit status 2, never a traceback. The commands are found by walking the app, so a new
command with an ``--out`` is checked here without being listed (the real runs of each command on
such paths: tests/reliability/test_output_safety.py)."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from memsearch.cli.app import app

# Owned by another change of issue 26 (its own output-folder checks).
NOT_HERE = {("retrieval", "build"), ("index", "build")}


def _commands_with_out() -> list[tuple[str, ...]]:
    found = []

    def walk(command, path: tuple[str, ...]) -> None:
        if hasattr(command, "commands"):  # a group (typer's own click: not click.Group)
            for name, sub in command.commands.items():
                walk(sub, (*path, name))
        elif any("--out" in p.opts for p in command.params):
            found.append(path)

    walk(typer.main.get_command(app), ())
    return found


COMMANDS = [c for c in _commands_with_out() if c not in NOT_HERE]


def test_the_walk_finds_every_kind_of_command():
    assert {("eval", "run"), ("eval", "matrix"), ("data", "prepare-hotpot"), ("train", "sft"), ("report", "view"),
            ("pipeline", "memagent"), ("verl", "export-data"), ("demo",), ("walkthrough",)} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_an_out_no_command_can_create_is_one_error_line(command, tmp_path):
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    regular = tmp_path / "notes.txt"
    regular.write_text("mine\n")
    for out, why in ((dangling, "is a symlink to"), (dangling / "sub", "is under"), (regular / "sub", "is under")):
        # --out first: it is checked as it is parsed, before any other option is even read.
        result = CliRunner().invoke(app, [*command, "--out", str(out)])
        errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
        assert result.exit_code == 2 and len(errors) == 1 and errors[0].startswith(f"error: {out}: --out {why}"), (
            result.output)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "notes.txt"]

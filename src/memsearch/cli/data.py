"""``memsearch data``: convert HotpotQA / MuSiQue / RULER-HQA into data folders and check them.

Every command imports what it needs inside its body, so ``memsearch --help`` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
import typer.core

from memsearch.cli.common import (
    EXIT_INPUT,
    DataDir,
    Limit,
    add_renamed,
    command_group,
    friendly,
    out_folder,
    renamed_options,
)

data_app = command_group("Prepare data folders (HotpotQA, MuSiQue, RULER-HQA long contexts) and validate them.")

NewFolder = Annotated[Path, typer.Option(help="New output folder (must not exist).", callback=out_folder)]
Split = Annotated[str, typer.Option(
    help="train or dev (required): recorded in the manifest, which keeps dev data out of training.")]


def _prepare(converter: str, input: Path, out: Path, split: str, limit: int | None) -> None:
    """Check the split and convert into the new folder with the converter registered as
    ``converter`` (``memsearch.data.converters``)."""
    import sys

    from memsearch.data.converters import source_converter
    from memsearch.data.source import check_split

    prepare = source_converter(converter).prepare  # an unknown name: refused, naming the registered ones
    check_split(input, split)
    # Written as converted (memory does not grow with the source), with a bar of the bytes read
    # (the official train file takes minutes) only on a terminal: a log or a captured stderr
    # keeps just the result and the problems.
    manifest = prepare(input, out, split=split, limit=limit, show_progress=sys.stderr.isatty())
    counts = manifest["counts"]
    skipped = "".join(f"; skipped {n} record(s) with {reason} (no answer to score)"
                      for reason, n in manifest.get("skipped", {}).items())
    typer.echo(f"wrote {out}: {counts['tasks']} tasks, {counts['documents']} documents "
               f"({manifest['kind']} {split}){skipped}")


HotpotFile = Annotated[Path, typer.Option(
    "--input", help="HotpotQA file: the original JSON list or JSON lines, or the Hugging Face hotpot_qa layout "
    "(parquet or JSON lines; parquet needs pyarrow).")]
MusiqueFile = Annotated[Path, typer.Option(
    "--input", help="MuSiQue-Ans file: the original JSON list or JSON lines, or a Hugging Face export "
    "(parquet or JSON lines; parquet needs pyarrow).")]


SourceFile = Annotated[Path, typer.Option("--input", help="The source file (what each format reads: "
                                                           "memsearch data prepare --help).")]


def _formats_help() -> str:
    # Read at --help time from the registry (a registered dataset shows up with no edit here).
    from memsearch.data.converters import CONVERTERS

    return "; ".join(f"{name}: {CONVERTERS.get(name).reads}" for name in CONVERTERS)


class PrepareCommand(typer.core.TyperCommand):
    """``data prepare``: its help lists the registered formats when it is shown."""

    def format_help(self, ctx, formatter) -> None:
        self.help = f"{(self.help or '').split(' Formats:')[0]} Formats: {_formats_help()}."
        super().format_help(ctx, formatter)


@data_app.command("prepare", cls=PrepareCommand)
@friendly
def prepare(
    format: Annotated[str, typer.Option("--format", help="A registered dataset converter: hotpot, musique, ...")],
    input: SourceFile, out: NewFolder, split: Split, limit: Limit = None,
) -> None:
    """Convert a source file of a registered format into corpus.jsonl, tasks.jsonl, labels.jsonl and
    manifest.json."""
    _prepare(format, input, out, split, limit)


# The per-dataset commands still answer (scripts and docs use them); their help gives the one
# spelling every registered dataset shares.
@data_app.command("prepare-hotpot")
@friendly
def prepare_hotpot(input: HotpotFile, out: NewFolder, split: Split, limit: Limit = None) -> None:
    """Convert HotpotQA (the same as data prepare --format hotpot)."""
    _prepare("hotpot", input, out, split, limit)


@data_app.command("prepare-musique")
@friendly
def prepare_musique(input: MusiqueFile, out: NewFolder, split: Split, limit: Limit = None) -> None:
    """Convert MuSiQue-Ans, paragraph-level evidence (the same as data prepare --format musique)."""
    _prepare("musique", input, out, split, limit)


# Its source is a prepared folder, which every other command takes as --data.
RulerCommand = renamed_options("data prepare-ruler", {"--input": "--data"})


@data_app.command("prepare-ruler", cls=RulerCommand)
@friendly
def prepare_ruler(
    data: Annotated[Path, typer.Option(help="A prepared dev folder (from data prepare-hotpot --split dev).")],
    docs: Annotated[str, typer.Option(help="Comma-separated numbers of documents per context.")],
    out: Annotated[Path, typer.Option(help="New output folder; one docs{N} subfolder per N.", callback=out_folder)],
    seed: Annotated[int, typer.Option(help="Seed for sampling and shuffling documents.")] = 42,
    limit: Limit = None,
    tokenizer: Annotated[str, typer.Option(
        help="Tokenizer for the context-length stats: embedded, lexical, none, or a folder.")] = "embedded",
) -> None:
    """RULER-HQA-style long contexts: each question's own paragraphs hidden among N-own others."""
    from memsearch.data.ruler import prepare_ruler as build
    from memsearch.errors import InputError
    from memsearch.tokenizer import load_tokenizer

    try:
        numbers = [int(x) for x in docs.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--docs {docs!r}: expected comma-separated integers, e.g. 50,200,800") from None
    tok = None if tokenizer == "none" else load_tokenizer(tokenizer)
    manifests = build(data, out, numbers, seed=seed, limit=limit, tokenizer=tok)
    for n, m in manifests.items():
        stats = m.get("context_tokens")
        length = (f", context tokens mean {stats['mean']} (min {stats['min']}, max {stats['max']}, "
                  f"{stats['tokenizer']})" if stats else "")
        typer.echo(f"{out / f'docs{n}'}: {m['counts']['tasks']} tasks, {m['counts']['documents']} documents{length}")


@data_app.command("validate")
@friendly
def validate(
    data: DataDir,
    against: Annotated[Optional[Path], typer.Option(
        help="Another prepared folder that must share no task id or question.")] = None,
) -> None:
    """Check schemas, ids, references, supporting facts, label leakage, hashes and split overlap
    (exit status 2 when there is a problem)."""
    from memsearch.data.validate import validate_data

    problems = validate_data(data, against)
    for problem in problems:
        typer.echo(str(problem), err=True)
    if problems:
        typer.echo(f"{len(problems)} problem(s) in {data}", err=True)
        raise typer.Exit(EXIT_INPUT)
    typer.echo(f"{data}: valid" + (f", no overlap with {against}" if against else ""))


def add_renamed_data_commands(root: typer.Typer) -> None:
    """The old top-level names of the data commands, hidden, each saying what replaced it."""
    add_renamed(root, "prepare-hotpot", "data prepare-hotpot", prepare_hotpot)
    add_renamed(root, "prepare-musique", "data prepare-musique", prepare_musique)
    add_renamed(root, "prepare-ruler", "data prepare-ruler", prepare_ruler, base=RulerCommand)
    add_renamed(root, "validate-data", "data validate", validate)

"""Stage records: each resumable pipeline stage keeps a record (``stage.json``) with the
fingerprint of what its outputs were made from (``Stage``), read and checked here.

A re-run skips a stage whose record is complete and whose fingerprint matches, continues one
that started with the same fingerprint (trainers and eval runs resume themselves), and refuses
a folder made from different inputs instead of mixing results:

    stage = Stage(out / "merged", "merge", {"model": "embedded", "adapter_sha256": "..."}, out / "merge.stage.json")
    if not stage.done():
        stage.start(); ...; stage.finish({"merged": "merged"})

Inside ``with run_folder(out):`` (both pipelines run their stages so) a path under the run folder
is recorded and fingerprinted as ``$OUT/...``: a fingerprint names what a stage was made from,
not where the run folder lies, so finished stages copied into another run folder are reused
there (docs/memory_policy.md, "Controls").

Where a served model answers (``config.backend.ADDRESS_KEYS``) is no input: a run continued with
its servers on other ports reuses its finished stages.

Every record carries ``version`` (``RECORD_VERSION``). A record of an earlier version (none:
version 1) is upgraded when it was made from the same inputs, dumped as that version dumped
them, else refused (``pipelines.stage_versions``: every earlier form in one place). Inputs are
recorded and fingerprinted in the fingerprint form, so a renamed config field leaves them alone.
A damaged record (not JSON) is refused, naming it, before any stage of the run starts
(``check_stage_records``).

Which stages a run left unfinished is ``pipelines.unfinished``; the stages themselves are
``pipelines.trainer_stages``, ``pipelines.merge_stage`` and ``pipelines.eval_stage``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from memsearch.config.backend import without_addresses
from memsearch.errors import InputError
from memsearch.io import sha256_file, write_json
from memsearch.pipelines.stage_versions import (
    EARLIER_DUMPS,
    RECORD_VERSION,
    fingerprint,
    fingerprint_form,
    upgrade_record,
)

RECORD = "stage.json"
OUT_TOKEN = "$OUT"
_RUN_FOLDER: ContextVar[Path | None] = ContextVar("memsearch_run_folder", default=None)


@contextmanager
def run_folder(out: Path) -> Iterator[None]:
    """Stages created inside record paths under ``out`` as ``$OUT/...`` (see the module docstring)."""
    token = _RUN_FOLDER.set(Path(out))
    try:
        yield
    finally:
        _RUN_FOLDER.reset(token)


def portable_inputs(inputs: Any, out: Path) -> Any:
    """``inputs`` with every string that is ``out`` or a path under it written as ``$OUT[/...]``
    (``out`` as given and resolved; nested dicts and lists too)."""
    prefixes = sorted({str(out), str(Path(out).resolve())}, key=len, reverse=True)

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, str):
            for prefix in prefixes:
                if value == prefix or value.startswith(prefix + os.sep):
                    return OUT_TOKEN + value[len(prefix):]
        return value

    return walk(inputs)


def folder_sha256(folder: Path, exclude: tuple[str, ...] = (RECORD,)) -> str:
    """One SHA-256 over every file of ``folder`` (relative names and contents, sorted)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in exclude):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + sha256_file(path).encode() + b"\0")
    return digest.hexdigest()


def _changed(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += _changed(a, b, f"{prefix}{key}.")
        elif a != b:
            keys.append(f"{prefix}{key}")
    return keys


class Stage:
    """One stage's outputs and record. ``inputs`` must be JSON-able and name everything the
    outputs depend on (config sections, input file hashes, upstream fingerprints). The record
    is ``outputs/stage.json`` unless ``record`` names another file (for outputs that another
    tool creates and wants new, like an eval run folder)."""

    def __init__(self, outputs: Path, name: str, inputs: dict[str, Any], record: Path | None = None) -> None:
        self.folder, self.name = Path(outputs), name
        self.record_path = Path(record) if record else self.folder / RECORD
        out = _RUN_FOLDER.get()
        # In the fingerprint form (stage_versions.fingerprint_form): a renamed field changes no fingerprint.
        portable = fingerprint_form(portable_inputs(inputs, out) if out is not None else inputs)
        self.inputs = without_addresses(portable)
        self.fingerprint = fingerprint(self.inputs)
        self.addressed_inputs = portable  # what records before version 4 fingerprinted (with base_url)
        self.given_inputs = fingerprint_form(inputs)  # before $OUT: what a version-1 record may have fingerprinted

    def record(self) -> dict[str, Any] | None:
        return read_stage_record(self.record_path, self.folder)

    def _check_same_inputs(self) -> dict[str, Any] | None:
        record = self.record()
        if record is None:
            if self.folder.exists() and any(p != self.record_path for p in self.folder.iterdir()):
                raise InputError(
                    f"{self.folder}: exists but has no record ({self.record_path.name}), so what made it is unknown; "
                    "move it away or choose a new --out"
                )
            return None
        version = record.get("version", 1)
        if version != RECORD_VERSION:
            if version in EARLIER_DUMPS:
                return upgrade_record(self, record, EARLIER_DUMPS[version], _RUN_FOLDER.get())
            raise InputError(
                f"{self.record_path}: stage record version {version!r}, this memsearch reads version "
                f"{RECORD_VERSION}; use the memsearch that wrote it, or delete {self.folder} and "
                f"{self.record_path} to redo the stage"
            )
        if record["fingerprint"] != self.fingerprint:
            self.refuse(record.get("inputs", {}), self.inputs)
        return record

    def refuse(self, recorded: dict[str, Any], inputs: dict[str, Any]) -> None:
        """Raise: the record was made from ``recorded``, not from ``inputs`` (changed keys named)."""
        changed = ", ".join(_changed(recorded, inputs)[:8]) or "inputs"
        raise InputError(
            f"{self.folder}: stage '{self.name}' was made from different inputs (changed: {changed}); "
            f"refusing to reuse or mix it. Choose a new --out, or delete {self.folder} and {self.record_path} to redo "
            "the stage"
        )

    def restart_if_changed(self, echo=print, outputs_of: dict[str, Path] | None = None) -> None:
        """For a stage whose unfinished outputs nothing else reads (a download): a record that never
        finished, made from other inputs, is removed with the stage's folder, so a corrected config
        (a local path after an offline failure) starts the stage over instead of being refused. A
        finished stage is kept and refused as ever. ``outputs_of``: the outputs made from each
        top-level input; then only those of the inputs that changed are removed, the rest kept
        for the stage to reuse (one corrected data URL does not fetch the other file again)."""
        record = self.record()
        if record is None or record.get("complete") or record.get("fingerprint") == self.fingerprint:
            return
        before = record.get("inputs", {})
        changed = ", ".join(_changed(before, self.inputs)[:8]) or "inputs"
        keys = [k for k in set(before) | set(self.inputs) if before.get(k) != self.inputs.get(k)]
        if outputs_of is not None and set(keys) <= set(outputs_of):
            echo(f"{self.name}: unfinished, and its inputs changed since ({changed}); redoing what they made, "
                 "keeping the rest")
            for key in keys:
                shutil.rmtree(outputs_of[key], ignore_errors=True)
            # Still unfinished, now for today's inputs: what is kept was made from inputs that did not change.
            write_json(self.record_path, {**record, "version": RECORD_VERSION, "fingerprint": self.fingerprint,
                                          "inputs": self.inputs})
            return
        echo(f"{self.name}: unfinished, and its inputs changed since ({changed}); starting it over")
        shutil.rmtree(self.folder, ignore_errors=True)
        self.record_path.unlink()

    def done(self) -> bool:
        """True when the stage finished with these inputs; raises on a fingerprint mismatch."""
        record = self._check_same_inputs()
        return bool(record and record.get("complete"))

    def started(self) -> bool:
        """True when a run with these inputs started here (and may be resumed)."""
        return self._check_same_inputs() is not None

    def start(self) -> None:
        """Write the record (incomplete) before any output, so a crash leaves a resumable,
        fingerprinted folder."""
        if self.started():
            return
        self.record_path.parent.mkdir(parents=True, exist_ok=True)
        write_json(
            self.record_path,
            {
                "version": RECORD_VERSION,
                "stage": self.name,
                "fingerprint": self.fingerprint,
                "inputs": self.inputs,
                "complete": False,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            },
        )

    def adopt(self, outputs: dict[str, Any]) -> None:
        """Record that this finished stage's outputs stand for the current inputs too: the caller
        has checked that what the changed inputs name is the same (a download's new source giving
        the recorded bytes). The fingerprint and inputs become today's, ``outputs`` replace the
        recorded ones and the earlier inputs are kept, newest last, in ``inputs_before``."""
        record = self.record() or {}
        before = [*record.get("inputs_before", []), record.get("inputs", {})]
        write_json(self.record_path, {**record, "fingerprint": self.fingerprint, "inputs": self.inputs,
                                      "outputs": outputs, "inputs_before": before,
                                      "adopted": time.strftime("%Y-%m-%dT%H:%M:%S%z")})

    def finish(self, outputs: dict[str, Any]) -> None:
        record = self.record() or {}
        write_json(
            self.record_path,
            {**record, "complete": True, "outputs": outputs, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        )


def read_stage_record(path: Path, folder: Path | None = None) -> dict[str, Any] | None:
    """The stage record at ``path`` (``None`` when there is none); ``InputError`` naming it when it
    is damaged (not a JSON object with a fingerprint: a write cut by a full disk, an edit), with
    what to do: it alone says what made the stage's outputs (``folder``), so neither is guessed."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        problem = None if isinstance(record, dict) and isinstance(record.get("fingerprint"), str) else (
            "not a stage record (no fingerprint)")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        problem = f"not readable as JSON ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    if problem is None:
        return record
    outputs = f" and the stage's outputs ({folder})" if folder is not None else " and the outputs beside it"
    raise InputError(f"{path}: damaged stage record, {problem}; nothing was changed. Restore it, or delete it{outputs} "
                     "to redo that stage: the same command then makes it again")


def check_stage_records(out: Path) -> None:
    """Refuse (``InputError``, the first damaged one named) a run folder holding a damaged stage
    record, before the command writes anything (``read_stage_record``)."""
    for path in sorted(Path(out).glob("**/*.stage.json")) + sorted(Path(out).glob(f"**/{RECORD}")):
        read_stage_record(path)

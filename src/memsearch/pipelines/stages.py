"""Resumable pipeline stages: each stage keeps a record (``stage.json``) with the fingerprint
of what its outputs were made from.

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
them, else refused (``pipelines.stage_versions``: every earlier form in one place). A damaged record (not JSON) is
refused, naming it, before any stage of the run starts (``check_stage_records``).

A stage whose tasks did not all succeed (an eval or matrix with failed or missing tasks) stays
unfinished: the same command retries those tasks, and ``unfinished_stages`` names it so the
command ends incomplete (exit 3), never "finished".
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from memsearch.config.backend import without_addresses
from memsearch.errors import InputError
from memsearch.io import sha256_file, write_json
from memsearch.pipelines.stage_versions import EARLIER_DUMPS, RECORD_VERSION, fingerprint, upgrade_record

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
        portable = portable_inputs(inputs, out) if out is not None else inputs
        self.inputs = without_addresses(portable)
        self.fingerprint = fingerprint(self.inputs)
        self.addressed_inputs = portable  # what records before version 4 fingerprinted (with base_url)
        self.given_inputs = inputs  # as given, before $OUT: what a version-1 record may have fingerprinted

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


def stage_states(out: Path) -> dict[str, bool]:
    """Every stage record under ``out`` by name (``seed-1/matrix``), with whether it finished."""
    states = {}
    for path in sorted(Path(out).glob("**/*.stage.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            record = {}
        states[path.relative_to(out).as_posix().removesuffix(".stage.json")] = bool(
            isinstance(record, dict) and record.get("complete"))
    return states


# Stage records this process left open because tasks failed (``leave_open``), by run folder: what
# makes a command end incomplete. A record left open by an interrupted earlier invocation, or by a
# stage this one no longer runs (another seed list), is no failed task of this invocation.
_LEFT_OPEN: dict[Path, set[Path]] = {}


def leave_open(stage: Stage) -> None:
    """Note that ``stage`` ends this invocation unfinished because some of its tasks failed or are
    missing (its record stays open: the next run of the same command resumes it)."""
    out = _RUN_FOLDER.get()
    if out is not None:
        _LEFT_OPEN.setdefault(Path(out).resolve(), set()).add(stage.record_path.resolve())


def unfinished_stages(out: Path) -> list[str]:
    """The stages of ``out`` (by record name, ``seed-1/matrix``) this process left open with
    failed or missing tasks (``leave_open``) and that are still not finished, in name order."""
    root = Path(out).resolve()
    names = []
    for path in _LEFT_OPEN.get(root, ()):
        record = read_stage_record(path) if path.is_file() else None
        if record is not None and not record.get("complete"):
            names.append(path.relative_to(root).as_posix().removesuffix(".stage.json").removesuffix(f"/{RECORD}"))
    return sorted(names)


def raise_if_unfinished(out: Path) -> None:
    """``IncompleteResult`` naming every unfinished stage under ``out``: called when a command's
    stages all ran, so these are the ones with failed or missing tasks; its exit status is 3."""
    from memsearch.errors import IncompleteResult

    if unfinished := unfinished_stages(out):
        raise IncompleteResult(f"{len(unfinished)} stage(s) have failed or missing tasks, so the report is not a "
                               f"result: {', '.join(unfinished)}\nrun the same command again: it keeps every "
                               "finished stage and task and retries only those tasks")


OnCollapse = Literal["stop", "score_last_checkpoint"]


def grpo_stage(folder: Path, record: Path, grpo: Any, upstream: dict[str, Any], echo=print, around=None,
               on_collapse: OnCollapse = "stop") -> Path:
    """A fingerprinted ``train_grpo`` run into ``folder`` (resumed after a crash); returns the
    final adapter. Shared by every pipeline: ``grpo`` is the trainer config, ``upstream`` the
    fingerprints and hashes of what it was made from. ``around`` (a context-manager factory) is
    entered only while training runs, e.g. a model server the rollouts call (skipped stages start
    nothing). ``on_collapse``: what a stop of the collapse guard does; ``"stop"`` raises
    (``CollapseError``), ``"score_last_checkpoint"`` finishes the stage with the newest checkpoint's
    adapter and records the stop in the stage's outputs (``finish_stopped_by_guard``)."""
    from memsearch.train.grpo.collapse import CollapseError
    from memsearch.train.grpo.trainer import train_grpo

    label = (f"GRPO role={grpo.role}, {grpo.steps} steps x {grpo.rollout.tasks_per_step} questions x group "
             f"{grpo.rollout.group_size}")
    try:
        return _trainer_stage(folder, record, "grpo", grpo, upstream, train_grpo, label, echo, around)
    except CollapseError:
        if on_collapse != "score_last_checkpoint":
            raise
        return finish_stopped_by_guard(folder, _trainer_record(folder, record, "grpo", grpo, upstream), echo)


def finish_stopped_by_guard(folder: Path, stage: Stage, echo=print) -> Path:
    """Finish a GRPO stage that the collapse guard stopped, with the adapter of its newest
    checkpoint (verified against its checksums) copied to ``folder/adapter``. The stage's
    outputs keep ``collapse`` (the guard's step and reason, and the checkpoint used) so that every
    report and re-run sees the stage did not end normally. The checkpoint of the stop's step is
    the policy at the stop when the stop falls on a checkpoint step (an evaluation step always is);
    otherwise it is the newest one before it, and ``collapse.checkpoint`` names which."""
    from memsearch.train.checkpoint import checkpoints, verify_checkpoint

    record = json.loads((folder / "collapse.json").read_text())
    found = checkpoints(folder / "checkpoints")
    if not found or not verify_checkpoint(found[-1]):
        raise InputError(f"{folder}: the collapse guard stopped GRPO at step {record['step']} and no complete, "
                         "intact checkpoint is left to score; change the recipe or delete the stage to train again")
    newest = found[-1]
    shutil.rmtree(folder / "adapter", ignore_errors=True)
    shutil.copytree(newest / "adapter", folder / "adapter")
    collapse = {"step": record["step"], "reason": record["reason"], "checkpoint": newest.relative_to(folder).as_posix()}
    write_json(folder / "summary.json", {"adapter": str(folder / "adapter"), "stopped_by_collapse_guard": collapse})
    stage.finish({"adapter": "adapter", "adapter_sha256": folder_sha256(folder / "adapter"), "collapse": collapse})
    echo(f"{folder.name}: the collapse guard stopped it at step {record['step']} ({record['reason']}); "
         f"scoring {collapse['checkpoint']} as the stage's adapter (on_collapse = 'score_last_checkpoint')")
    return folder / "adapter"


def sft_stage(folder: Path, record: Path, sft: Any, upstream: dict[str, Any], echo=print) -> Path:
    """A fingerprinted ``train_sft`` run into ``folder`` (resumed after a crash); returns the adapter."""
    from memsearch.train.sft.trainer import train_sft

    return _trainer_stage(folder, record, "sft", sft, upstream, train_sft, "LoRA SFT", echo)


def _trainer_record(folder: Path, record: Path, key: str, cfg: Any, upstream: dict[str, Any]) -> Stage:
    """A trainer stage's record, fingerprinted by its trainer config and what it was made from
    (one definition: the stage that trains and the one that finishes a guard stop must agree)."""
    from memsearch.train.config import without_placement

    # Placement (GPUs, checkpointing) changes no number: a stage re-run on another node still matches.
    return Stage(folder, folder.name, {key: without_placement(cfg.model_dump(mode="json")), **upstream}, record)


def _trainer_stage(
    folder: Path, record: Path, key: str, cfg: Any, upstream: dict[str, Any], train, label: str, echo, around=None
) -> Path:
    stage = _trainer_record(folder, record, key, cfg, upstream)
    if stage.done():
        _check_adapter(folder, stage)
        echo(f"{folder.name}: done ({folder})")
        return folder / "adapter"
    resume = stage.started() and (folder / "config.json").is_file()
    from memsearch.train.launch import training_ranks

    ranks = training_ranks(cfg)  # > 1: the trainer runs under torchrun, a child of this process
    # `around` first: a server that fails to start or is refused leaves no record behind.
    with around() if around is not None else nullcontext():
        stage.start()
        echo(f"{folder.name}: {label}" + (f" on {ranks} ranks (torchrun)" if ranks > 1 else "")
             + (" (resuming)" if resume else ""))
        # The trainer owns the folder's config.json / checkpoints; it refuses a changed config on resume.
        if ranks > 1:
            _train_under_torchrun(folder, key, cfg, resume, ranks)
        else:
            train(cfg, folder, resume=resume, echo=echo)
    return _finish_adapter(folder, stage)


def _train_under_torchrun(folder: Path, kind: str, cfg: Any, resume: bool, ranks: int) -> None:
    """Train ``cfg`` into ``folder`` as ``ranks`` torchrun processes (``memsearch.train.launch``),
    their output passed through. The config JSON lies beside the folder, which the trainer owns.
    A collapse-guard stop is raised as ``CollapseError`` (the caller decides what it means), any
    other failure as ``InputError``; an interrupt stops every rank (their process group) first."""
    import subprocess

    from memsearch.serving.ownership import child_processes, kill_groups
    from memsearch.serving.process import stop_process
    from memsearch.train.grpo.collapse import CollapseError
    from memsearch.train.launch import launch_command, launch_environment, write_config

    config = folder.with_name(f"{folder.name}.launch.json")
    folder.parent.mkdir(parents=True, exist_ok=True)
    write_config(cfg, config)
    collapse = folder / "collapse.json"
    before = collapse.stat().st_mtime_ns if collapse.is_file() else None
    command = launch_command(kind, config, folder, resume, ranks)
    proc = subprocess.Popen(command, env=launch_environment(cfg), start_new_session=True)
    try:
        code = proc.wait()
    except BaseException:  # Ctrl-C, SIGTERM as SystemExit: no rank may outlive the stage
        # torchrun starts each rank in a session of its own and stops them on SIGTERM; the ranks
        # are noted first so that none is left running if torchrun itself must be killed.
        ranks_started = child_processes(proc.pid)
        stop_process(proc)
        kill_groups(ranks_started)
        raise
    if code == 0:
        return
    if collapse.is_file() and collapse.stat().st_mtime_ns != before:
        raise CollapseError(f"{folder}: the collapse guard stopped the run ({collapse})")
    raise InputError(f"{folder.name}: the trainer under torchrun exited with status {code} "
                     f"(its output above says why): {' '.join(command)}")


def _check_adapter(folder: Path, stage: Stage) -> None:
    if folder_sha256(folder / "adapter") != stage.record()["outputs"]["adapter_sha256"]:
        raise InputError(
            f"{folder / 'adapter'}: missing or changed since training finished; delete {folder} and "
            f"{stage.record_path} to train again, or choose a new --out"
        )


def _finish_adapter(folder: Path, stage: Stage) -> Path:
    if not (folder / "adapter" / "adapter_config.json").is_file():
        raise InputError(f"{folder}: training ended without an adapter")
    stage.finish({"adapter": "adapter", "adapter_sha256": folder_sha256(folder / "adapter")})
    return folder / "adapter"


def merge_stage(folder: Path, record: Path, model: str, adapter: Path, dtype: str, echo=print) -> tuple[Path, str]:
    """``adapter`` merged into ``model`` as a plain Hugging Face folder; returns (folder, fingerprint)."""
    from memsearch.train.merge import merge_adapter

    stage = Stage(folder, "merge", {"model": model, "adapter_sha256": folder_sha256(adapter), "dtype": dtype}, record)
    if stage.done():
        recorded = (stage.record().get("outputs") or {}).get("merged_sha256")
        if recorded is not None:
            _check_merged(folder, recorded, stage)
            echo(f"merge: done ({folder})")
            return folder, stage.fingerprint
        # An older memsearch recorded no hash, so what the folder holds is unknown (a truncated
        # merge passed as done). The merge is a function of the fingerprinted inputs: redo it.
        echo(f"merge: {stage.record_path} records no hash of {folder} (an older memsearch): merging again")
        shutil.rmtree(folder, ignore_errors=True)
    stage.start()
    if not (folder / "config.json").is_file():  # merge_adapter writes atomically: present = finished
        merge_adapter(model, adapter, folder, dtype=dtype)
    stage.finish({"merged": folder.name, "merged_sha256": folder_sha256(folder)})
    echo(f"merge: {folder}")
    return folder, stage.fingerprint


def _check_merged(folder: Path, recorded: str, stage: Stage) -> None:
    """Refuse a merged folder whose files are not the ones the finished merge recorded."""
    actual = folder_sha256(folder) if folder.is_dir() else None
    if actual != recorded:
        raise InputError(
            f"{folder}: missing or changed since the merge finished (sha256 {actual}, recorded {recorded}); "
            f"delete {folder} and {stage.record_path} to merge again, or choose a new --out"
        )


def eval_run(
    folder: Path, record: Path, run_config, data: Path, upstream: dict[str, Any], echo=print,
    label: str | None = None, group: str | None = None, show_progress: bool = False,
) -> dict[str, Any]:
    """One fingerprinted ``run_eval`` (resumed after a crash); returns its summary. A run with
    failed or missing tasks is not finished: its record stays open, so the next run of the same
    command resumes it and retries exactly those tasks (``eval --resume``); the caller reads
    ``summary["complete"]``, and the command ends incomplete (``unfinished_stages``). ``label``
    names it in what is echoed (default: the folder's name), ``group`` in its trajectories."""
    from memsearch.eval.runner import run_eval

    stage = Stage(
        folder,
        folder.name,
        {
            "run_config": run_config.model_dump(mode="json"),
            "data_manifest_sha256": sha256_file(data / "manifest.json"),
            **upstream,
        },
        record,
    )
    label = label or folder.name
    if stage.done() and (folder / "summary.json").is_file():
        echo(f"{label}: done")
        return json.loads((folder / "summary.json").read_text())
    resume = stage.started() and folder.exists()
    stage.start()
    if show_progress:
        echo(f"{label}: {'resuming' if resume else 'running'}")
    summary = run_eval(run_config, data, folder, resume=resume, group=group or folder.name,
                       show_progress=show_progress)
    if summary["complete"]:
        stage.finish({"summary": "summary.json"})
    else:
        leave_open(stage)
        echo(f"{label}: INCOMPLETE, {incomplete_words(summary)}; the same command retries them")
    return summary


def incomplete_words(summary: dict[str, Any]) -> str:
    """How an eval summary is incomplete: ``2 of 3 tasks failed, 0 missing``."""
    tasks = summary["tasks"]
    return (f"{tasks['failed']} of {tasks['expected']} tasks failed, {tasks['expected'] - tasks['scored']} "
            "missing")

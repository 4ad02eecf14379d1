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

Every record carries ``version`` (``RECORD_VERSION``). A record of an earlier version (none:
version 1) is upgraded by ``upgrade_record`` when it was made from the same inputs, dumped as
that version dumped them (``EARLIER_DUMPS``), else refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from functools import partial
from pathlib import Path
from typing import Any, Literal

from memsearch.config.backend import legacy_backend_form, legacy_pipeline_run_form
from memsearch.errors import InputError
from memsearch.io import sha256_file, write_json
from memsearch.train.config_keys import flat_grpo_dump

RECORD = "stage.json"
RECORD_VERSION = 3
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


def fingerprint(inputs: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of ``inputs``."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


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
        self.inputs = portable_inputs(inputs, out) if out is not None else inputs
        self.fingerprint = fingerprint(self.inputs)
        self.given_inputs = inputs  # as given, before $OUT: what a version-1 record may have fingerprinted

    def record(self) -> dict[str, Any] | None:
        return json.loads(self.record_path.read_text()) if self.record_path.is_file() else None

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
        if version in EARLIER_DUMPS:
            return upgrade_record(self, record, EARLIER_DUMPS[version])
        if version != RECORD_VERSION:
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

    def restart_if_changed(self, echo=print) -> None:
        """For a stage whose unfinished outputs nothing else reads (a download): a record that never
        finished, made from other inputs, is removed with the stage's folder, so a corrected config
        (a local path after an offline failure) starts the stage over instead of being refused. A
        finished stage is kept and refused as ever."""
        record = self.record()
        if record is None or record.get("complete") or record.get("fingerprint") == self.fingerprint:
            return
        changed = ", ".join(_changed(record.get("inputs", {}), self.inputs)[:8]) or "inputs"
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

    def finish(self, outputs: dict[str, Any]) -> None:
        record = self.record() or {}
        write_json(
            self.record_path,
            {**record, "complete": True, "outputs": outputs, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        )


# Config fields that version 1 left out of every dump while at their default (values of
# memsearch.config's Agent.memory_sources and BackendConfig.open_items): a version-1
# fingerprint of a config dump is the fingerprint of the dump without them.
VERSION1_OMITTED = {"memory_sources": "shown", "open_items": False}


def _version1_omitted(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if not (k in VERSION1_OMITTED and v == VERSION1_OMITTED[k])}


def version1_dump(value: Any) -> Any:
    """``value`` (stage inputs, or any part of them) as version 1 dumped it: without the fields
    of ``VERSION1_OMITTED`` that hold their defaults."""
    return _walk(value, [_version1_omitted])


def _walk(value: Any, forms: list[Callable[[dict[str, Any]], dict[str, Any]]]) -> Any:
    """``value`` with every dict in it passed through ``forms`` in order, outermost first (a
    form's output is walked on: a table it moves is still found)."""
    if isinstance(value, dict):
        for form in forms:
            value = form(value)
        return {k: _walk(v, forms) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, forms) for v in value]
    return value


# The forms of config dumps that version 2 recorded and version 3 writes otherwise, one function
# each (a dict of a dump -> that dict as version 2 dumped it; any other dict as it is): the GRPO
# config's fields flat, its two invalid-output penalties both ``invalid_penalty``, the MemAgent
# role ``overwrite`` (``train.config_keys.flat_grpo_dump``); every backend table flat, with every
# kind's keys (``config.backend.legacy_backend_form``).
VERSION2_FORMS: list[Callable[[dict[str, Any]], dict[str, Any]]] = [flat_grpo_dump, legacy_backend_form]

# Which roles of a run config a pipeline had filled its model into, whatever their kind: the
# current dump no longer says (a rules role holds no model), so each is a candidate.
VERSION2_FILLED_ROLES: tuple[tuple[str, ...], ...] = ((), ("memory",), ("reader",), ("memory", "reader"))


def version2_dump(value: Any, filled: tuple[str, ...] = ()) -> Any:
    """``value`` (stage inputs, or any part of them) as version 2 dumped it (``VERSION2_FORMS``),
    with the pipeline's model in the ``filled`` roles of its run configs."""
    return _walk(value, [partial(legacy_pipeline_run_form, roles=filled), *VERSION2_FORMS])


def version2_dumps(value: Any) -> list[Any]:
    """Every way version 2 may have dumped ``value`` (``VERSION2_FILLED_ROLES``)."""
    return [version2_dump(value, roles) for roles in VERSION2_FILLED_ROLES]


# How each earlier record version may have dumped the current inputs: its fingerprint is of one.
EARLIER_DUMPS: dict[int, Callable[[Any], list[Any]]] = {
    1: lambda inputs: [version1_dump(dump) for dump in version2_dumps(inputs)],
    2: version2_dumps,
}


def upgrade_record(stage: Stage, record: dict[str, Any], earlier_dumps: Callable[[Any], list[Any]]) -> dict[str, Any]:
    """A record of an earlier version of ``stage``, rewritten as the current version when it was
    made from the stage's inputs (one of ``earlier_dumps`` of them has its fingerprint); else the
    refusal naming what changed.

    Earlier versions differ in ways that change a fingerprint, not what a stage made: version 1's
    config dumps left ``memory_sources`` and ``open_items`` out at their defaults
    (``VERSION1_OMITTED``) and its records written before ``$OUT`` paths hold the run folder's raw
    paths; version 2's dumps spell some configs in an earlier form (``VERSION2_FORMS``). Each is
    reproducible from the current inputs, so a finished stage made from the same inputs is
    recognised and reused instead of redone (hours of training): migrated, not refused. The
    rewritten record keeps the old fingerprint as ``fingerprint_before``. What a resumed stage's
    own tool checks (a trainer's or eval run's ``config.json``) is not a stage record: the tool
    reads its own earlier forms (``train.run_folder.check_run_folder``) or refuses the changed
    config dump (delete the stage's folder and record to redo it)."""
    candidates = [*earlier_dumps(stage.inputs), *earlier_dumps(stage.given_inputs)]
    if record.get("fingerprint") not in {fingerprint(inputs) for inputs in candidates}:
        stage.refuse(record.get("inputs", {}), candidates[0])
    upgraded = {
        **record,
        "version": RECORD_VERSION,
        "fingerprint": stage.fingerprint,
        "inputs": stage.inputs,
        "fingerprint_before": record["fingerprint"],
    }
    write_json(stage.record_path, upgraded)
    return upgraded


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
        ranks_started = _children(proc.pid)
        stop_process(proc)
        _kill_left(ranks_started)
        raise
    if code == 0:
        return
    if collapse.is_file() and collapse.stat().st_mtime_ns != before:
        raise CollapseError(f"{folder}: the collapse guard stopped the run ({collapse})")
    raise InputError(f"{folder.name}: the trainer under torchrun exited with status {code} "
                     f"(its output above says why): {' '.join(command)}")


def _start_time(pid: int) -> str | None:
    """``pid``'s start time (``/proc/PID/stat`` field 22), None when gone: tells a process from a
    later one given the same id."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _children(pid: int) -> dict[int, str]:
    """The child processes of ``pid`` by id, with their start times (Linux ``/proc``; else none)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid):
            found[int(stat.parent.name)] = fields[19]
    return found


def _kill_left(processes: dict[int, str]) -> None:
    """SIGKILL the process group of each of ``processes`` still running (the same start time)."""
    import signal

    for pid, started in processes.items():
        if _start_time(pid) == started:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


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
    folder: Path, record: Path, run_config, data: Path, upstream: dict[str, Any], echo=print
) -> dict[str, Any]:
    """One fingerprinted ``run_eval`` (resumed after a crash); returns its summary."""
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
    if stage.done() and (folder / "summary.json").is_file():
        echo(f"{folder.name}: done")
        return json.loads((folder / "summary.json").read_text())
    resume = stage.started() and folder.exists()
    stage.start()
    summary = run_eval(run_config, data, folder, resume=resume, group=folder.name, show_progress=False)
    stage.finish({"summary": "summary.json"})
    return summary

"""``memsearch experiment run --config FILE --out DIR``: the whole path on one node, resumable.

Stages, in order (each fingerprinted; a re-run skips finished ones and continues the one cut
off; ``DIR/run.json`` records each invocation's outcome and what it used):

1. ports: every service's port checked free, the recipe validated: before anything starts;
2. ``data/``: the HotpotQA files fetched (``data/manifest.json``: source, SHA-256, size);
3. ``models``: the policy and reader folders (hub ids fetched), fingerprinted;
4. ``prepare/``: converted and validated, train and held-out dev apart (the pipeline's stage);
5. the device check (``memsearch.experiment.device_check.check_devices``), in ``run.json``;
6. the reader service (``services/reader.log``; its ``/v1/models`` identity in ``run.json``);
7. ``baseline/matrix``: the A-D matrix before training (the served reader);
8. the memory-policy pipeline's stages (``teacher/``, ``heldout/``, ``seed-N/sft``, ``grpo1``,
   ``merged1``), then per seed stage 1 deployed as its own service (``services/stage1.log``) while
   the held-out grpo row, stage 2 (``grpo2``, ``merged2``) and the A-D matrix (``seed-N/matrix``:
   A/C summarised by the original policy model, B/D by the served stage 1) run against it;
9. ``report.md`` (the pipeline's report, then this experiment's section).

Every service is stopped when the command ends, fails or is interrupted (Ctrl-C, SIGTERM,
SIGHUP): ``serving.running_services`` inside ``serving.stop_on_signals``.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from memsearch.config import config_json
from memsearch.errors import IncompleteResult, InputError
from memsearch.eval.provenance import source_identity
from memsearch.experiment.config import ExperimentConfig
from memsearch.experiment.stages import (
    baseline_stage,
    download_stage,
    models_stage,
    pipeline_config,
    reader_spec,
    stage1_name,
    stage1_spec,
)
from memsearch.io import dumps_line, write_json

COMMAND = "experiment run"


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class RunRecord:
    """``DIR/run.json``: what this experiment used (data, models, devices, services, memsearch)
    and the outcome of every invocation (``attempts``); rewritten whole after each change. Read
    when made (``InputError`` naming a damaged one, before anything is written); ``begin`` starts
    this invocation's attempt."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = read_run_record(path)

    def begin(self, profile: str | None) -> None:
        """This invocation's attempt, ``running``; the services of the previous one forgotten
        (``stop_orphans`` has dealt with any still alive)."""
        self.data.setdefault("attempts", [])
        self.data.update(command=f"memsearch {COMMAND}", profile=profile, config="config.json", status="running",
                         memsearch=source_identity(), services={})
        self.data["attempts"].append({"started": _stamp(), "status": "running"})
        self.write()

    def write(self) -> None:
        write_json(self.path, self.data)

    def update(self, **fields: Any) -> None:
        self.data.update(fields)
        self.write()

    def service(self, name: str, running, seed: int | None = None, served_name: str | None = None) -> None:
        """A started service: engine, URL, served name (``served_name``: an adapter it serves),
        pid and its start time (a later process given the pid is not it), log and its /v1/models
        entry (the adapter's, where one is named)."""
        identity = running.identity
        if served_name is not None and served_name != running.served_name:
            from memsearch.serving.process import served_identity

            identity = served_identity(running.url, served_name)
        entry = {"engine": running.engine, "url": running.url, "served_name": served_name or running.served_name,
                 "pid": running.pid, "started": running.started, "log": str(running.log), "identity": identity}
        if seed is None:
            self.data["services"][name] = entry
        else:
            self.data["services"].setdefault(name, {})[f"seed-{seed}"] = entry
        self.write()

    def end(self, out: Path, status: str, error: str | None = None) -> None:
        """This invocation's outcome, and every stage record under ``out`` with whether it finished."""
        from memsearch.pipelines.unfinished import stage_states

        self.data["attempts"][-1].update(ended=_stamp(), status=status, **({"error": error} if error else {}))
        self.update(status=status, stages=stage_states(out), **({"error": error} if error else {"error": None}))


def read_run_record(path: Path) -> dict[str, Any]:
    """``run.json`` as a dict (empty when there is none); ``InputError`` naming a damaged one."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        problem = None if isinstance(data, dict) and isinstance(data.get("attempts", []), list) else (
            "not a run record (expected a JSON object with a list of attempts)")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        problem = f"not readable as JSON ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    if problem is None:
        return data
    raise InputError(f"{path}: damaged run record, {problem}; nothing was changed. It holds what earlier invocations "
                     "used and did, not what the stages were made from (their own records say that): restore it, or "
                     "delete it and run the same command again")


def stop_orphans(record: RunRecord, echo=print) -> None:
    """Stop every server the previous invocation of this folder started that still runs (its pid
    alive with the recorded start time): that invocation was killed (``kill -9``, the out-of-memory
    killer) and its servers' reapers with it, and this one needs their ports. Called under the
    folder's lock, so no live command of this folder owns them."""
    from memsearch.serving import recorded_orphans, stop_orphan

    for orphan in recorded_orphans(record.data.get("services") or {}):
        stop_orphan(orphan, echo)


def _lock(out: Path) -> None:
    """Create ``out`` (or reopen one this command made) and lock it for this process."""
    from memsearch.eval.run_folder import claim_folder, hold_folder_lock

    claim_folder(out, COMMAND, lambda folder: False)
    hold_folder_lock(out, "experiment folder", "then run the experiment again")


def _record_invocation(cfg: ExperimentConfig, out: Path, profile: str | None) -> None:
    """Append the invocation to ``invocations.jsonl`` and save the resolved config as ``config.json``."""
    resolved = config_json(cfg)
    with open(out / "invocations.jsonl", "a", encoding="utf-8") as fh:
        fh.write(dumps_line({"time": _stamp(), "profile": profile, "config": resolved}) + "\n")
    write_json(out / "config.json", resolved)


def run_experiment(cfg: ExperimentConfig, out: str | Path, echo=print, profile: str | None = None) -> dict[str, Any]:
    """Run (or continue) every stage (module docstring); returns the pipeline's report. Services
    are stopped however it ends; ``run.json`` records the outcome (finished, incomplete, failed,
    interrupted). A stage left with failed or missing tasks ends it with ``IncompleteResult``
    (exit status 3) after every other stage ran: the same command retries those tasks."""
    from memsearch.pipelines.stage_record import check_stage_records
    from memsearch.pipelines.unfinished import raise_if_unfinished, unfinished_stages
    from memsearch.serving import check_ports_free, stop_on_signals

    out = Path(out)
    # Before anything starts or is written: a damaged record, a taken port, a recipe the pipeline refuses.
    services = {"reader": reader_spec(cfg)}
    if not cfg.stage1_on_reader():  # else stage 1 is loaded on the reader's server: no port of its own
        services["stage1"] = stage1_spec(cfg, "<each seed's merged stage 1>")
    record = RunRecord(out / "run.json")
    check_stage_records(out)
    pipeline_config(cfg)
    with stop_on_signals():
        if record.data:  # a folder of an earlier invocation: under its lock, its servers still alive are stopped
            _lock(out)
            stop_orphans(record, echo)
        check_ports_free(services)
        _lock(out)
        _record_invocation(cfg, out, profile)
        record.begin(profile)
        try:
            report = _stages(cfg, out, record, echo)
        except (KeyboardInterrupt, SystemExit) as exc:
            code = exc.code if isinstance(exc, SystemExit) else 130
            record.end(out, "interrupted", f"{type(exc).__name__} (exit status {code})")
            raise
        except IncompleteResult as exc:  # a stage others build on has failed tasks (the teacher run)
            record.end(out, "incomplete", str(exc).splitlines()[0])
            raise
        except BaseException as exc:
            record.end(out, "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            raise
        if unfinished := unfinished_stages(out):
            record.end(out, "incomplete", f"stages with failed or missing tasks: {', '.join(unfinished)}")
            raise_if_unfinished(out)
        record.end(out, "finished")
    echo(f"finished: every stage complete; report {out / 'report.md'}")
    return report


# The device check in a child process: it initialises CUDA, seeing every GPU of the node, while
# this process must not touch CUDA before the training layout applies (devices.apply_training_layout).
_CHECK = """import json, sys
from memsearch.devices import DeviceLayout
from memsearch.experiment.device_check import check_devices
from memsearch.errors import InputError
try:
    layout = DeviceLayout.model_validate_json(sys.argv[1])
    record = check_devices(layout, echo=lambda line: print(line, file=sys.stderr))
except InputError as exc:
    print(exc, file=sys.stderr)
    sys.exit(2)
print(json.dumps(record))
"""


def device_check(layout, echo=print, timeout_s: float = 600) -> dict[str, Any]:
    """``experiment.device_check.check_devices`` of ``layout``, then the training layout applied to this
    process. A layout with GPUs is checked in a child process (it initialises CUDA on every GPU
    the layout names; this process must see the trainer's GPUs only). ``InputError`` with the
    check's words when it refuses."""
    import sys

    from memsearch.devices import apply_training_layout
    from memsearch.experiment.device_check import check_devices

    if layout.empty:
        return check_devices(layout, echo)
    try:
        done = subprocess.run([sys.executable, "-c", _CHECK, layout.model_dump_json()], capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise InputError(f"devices: the device check did not finish within {timeout_s:g} s; "
                         "check `nvidia-smi`") from None
    for line in done.stderr.splitlines():
        echo(line)
    if done.returncode != 0:
        raise InputError(f"devices: the device check failed (exit status {done.returncode}): "
                         + (done.stderr.strip().splitlines() or ["no output"])[-1])
    apply_training_layout(layout)
    return json.loads(done.stdout)


def _stages(cfg: ExperimentConfig, out: Path, record: RunRecord, echo) -> dict[str, Any]:
    from memsearch.pipelines.memory_policy.pipeline import prepare_stage, run_stages, write_report
    from memsearch.pipelines.stage_record import run_folder
    from memsearch.serving import running_services

    gpus = dict(cfg.devices.services) or None
    with run_folder(out):
        record.update(data=download_stage(cfg, out, echo))
        models = models_stage(cfg, out, echo)
        record.update(models=models)
        pcfg = pipeline_config(cfg, record.data["data"], models)
        write_json(out / "pipeline.json", config_json(pcfg))  # what the pipeline's stages ran
        paths = prepare_stage(pcfg, out, echo)
        record.update(devices=device_check(cfg.devices, echo))
        with running_services({"reader": reader_spec(cfg, models)}, out / "services", gpus, echo) as running:
            record.service("reader", running["reader"])
            baseline = baseline_stage(pcfg, out, paths, echo)

            @contextmanager
            def deploy(seed: int, merged1: Path, adapter1: Path) -> Iterator[tuple[str, str]]:
                if cfg.stage1_on_reader():
                    with adapter_on(running["reader"], stage1_name(seed), adapter1, echo) as s1:
                        record.service("stage1", s1, seed)
                        yield s1.url, s1.served_name
                    return
                spec = stage1_spec(cfg, merged1, adapter1, seed, models)
                with running_services({"stage1": spec}, out / "services", gpus, echo) as s1:
                    served = stage1_name(seed) if spec.adapters else s1["stage1"].served_name
                    record.service("stage1", s1["stage1"], seed, served)
                    yield s1["stage1"].url, served

            shared, seeds = run_stages(pcfg, out, paths, echo, serve_stage1=deploy)
    report = write_report(pcfg, out, shared, seeds, lambda _: None)
    with open(out / "report.md", "a", encoding="utf-8") as fh:
        fh.write(experiment_section(out, record.data, baseline))
    from memsearch.report.experiment import write_experiment_html

    page = write_experiment_html(out, paths["dev"])  # with each matrix's view (`report view`) linked
    echo(report["table"])
    echo(f"report: {out / 'report.md'}; in a browser: {page}")
    return report


@contextmanager
def adapter_on(reader, name: str, adapter: Path, echo=print):
    """The adapter in ``adapter`` served as ``name`` on the running vLLM ``reader`` while inside
    (loaded at entry, unloaded at exit); yields it as a ``RunningService`` of that server."""
    from dataclasses import replace

    from memsearch.serving.adapters import load_adapter, unload_adapter
    from memsearch.serving.process import served_identity

    load_adapter(reader.url, name, adapter)
    try:
        identity = served_identity(reader.url, name)
        echo(f"stage 1: adapter {adapter} served as {name!r} on the reader's server at {reader.url}")
        yield replace(reader, name="stage1", served_name=name, identity=identity)
    finally:
        unload_adapter(reader.url, name)


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def experiment_section(out: Path, run: dict[str, Any], baseline: dict[str, Any]) -> str:
    """The experiment's part of ``report.md``: what ran (memsearch, data, devices, services) and
    the untrained baseline matrix with its caveats."""
    from memsearch.pipelines.memory_policy.report import usable_cell
    ident = run["memsearch"]
    lines = ["", "## Experiment (`memsearch experiment run`)", "",
             f"memsearch {ident.get('version')}, commit {ident.get('commit') or 'unknown'}"
             + (" (with uncommitted changes)" if ident.get("dirty") else "") + f"; the record: `{out / 'run.json'}`.",
             "", "| data | source | SHA-256 | bytes |", "|---|---|---|---|"]
    lines += [f"| {name} | {f['source']} | `{f['sha256']}` | {f['bytes']} |" for name, f in run["data"].items()]
    lines += ["", f"Devices: {run['devices'].get('note') or run['devices']}", "",
              "| service | engine | served name | URL | /v1/models id |", "|---|---|---|---|---|"]
    for name, entry in run["services"].items():
        for label, s in ({name: entry} if "url" in entry else {f"{name} ({k})": v for k, v in entry.items()}).items():
            lines.append(f"| {label} | {s['engine']} | `{s['served_name']}` | {s['url']} | {s['identity'].get('id')} |")
    lines += ["", "B/D of each seed's matrix were summarised by that seed's stage 1 served as above (its adapter, or "
              "merged1), A/C by "
              "the original policy model in process (`backends.baseline_memory`).", "",
              "### Baseline: the A-D matrix before training", "",
              "B/D memory and C/D controller are the untrained policy model: prompt baselines, not RL results.", "",
              "| group | memory backend | f1 | em | memory support recall | usable |", "|---|---|---|---|---|---|"]
    for group, g in baseline["groups"].items():
        backend = g["memory_backend"]
        lines.append(f"| {group} | {backend['kind']}:{Path(str(backend.get('model'))).name} | "
                     f"{_cell(g['metrics'].get('f1'))} | {_cell(g['metrics'].get('em'))} | "
                     f"{_cell(g['metrics'].get('memory_support_recall'))} | {usable_cell(g)} |")
    lines += ["", *[f"- {note}" for note in baseline.get("caveats") or []], ""]
    return "\n".join(lines)


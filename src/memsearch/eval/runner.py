"""``memsearch eval``: run one agent over a prepared data folder and write a run folder.

    run_eval(config, data_dir="data/hotpot-dev", out_dir="runs/eval-1")

A run folder holds ``config.json`` (resolved), ``run.json`` (data fingerprint, model identity,
versions, the memsearch commit: ``eval.provenance``, what served models said they are),
``trajectories.jsonl`` (one line per task, appended as episodes finish), ``metrics.jsonl``
(per task, in task order) and ``summary.json``. The folder must not exist unless ``resume``:
then it must be a folder ``eval run`` made (``eval.run_folder.check_made_by``), the saved config
must equal the new one, finished tasks are kept and only missing and failed ones run (a failed
attempt moves to ``failed_attempts.jsonl``: ``eval.attempts``), so a crashed run, or one a
server outage failed, is completed without losing or repeating a task.
"""

from __future__ import annotations

import asyncio
import platform
import time
from collections.abc import Mapping
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

from tqdm import tqdm

from memsearch import DISTRIBUTION
from memsearch.backends import check_served_models
from memsearch.config import RunConfig, config_json
from memsearch.data.dataset import Dataset, load_dataset
from memsearch.errors import InputError, Problem
from memsearch.eval.attempts import cut_torn_tail, failed_attempt_counts, supersede_failed
from memsearch.eval.provenance import source_identity
from memsearch.eval.run_folder import check_run_folder, claim_run_folder, model_identity, storage_error, write_record
from memsearch.io import NonFiniteNumberError, dumps_line, first_non_finite, iter_jsonl, sha256_file, write_jsonl
from memsearch.records.metrics_row import MetricsRow
from memsearch.records.run_summary import RunSummary
from memsearch.records.trajectory import CALL_ROLES, Trajectory

# Version of what turns trajectories into numbers (``eval.score`` + ``eval.metrics``: answer
# normalization, sub_em / boxed_em rules, which rows enter a mean). Bump it whenever a metric's
# definition changes, so summaries scored differently are never compared.
# eval-2: a reader asked for a box is scored on the box only; sub_em_lenient added.
# eval-3: invalid_action_rate is over calls that returned a completion (request errors apart).
# eval-4: memory_support_precision added (memory support recall counts faithful items: engine-5).
# eval-5: a failed task scores 0 on every answer metric whatever text came back (eval.score.answer_keys).
EVALUATOR_VERSION = "eval-5"

# The episode counts a summary means, after the registered metrics (eval.metrics.registered_metrics).
SUMMARY_COUNTS = (
    "searches", "chunks", "chunks_cut", "memory_truncations", "policy_calls", "invalid_actions", "invalid_action_rate",
    "request_errors", "context_truncated_calls", "latency_s",
)


def software_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in ("memsearch", "torch", "transformers", "bm25s", "faiss-cpu", "tokenizers", "aiohttp"):
        try:
            out[pkg] = metadata.version(DISTRIBUTION if pkg == "memsearch" else pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def data_fingerprint(data_dir: Path, dataset: Dataset) -> dict[str, Any]:
    return {"manifest_sha256": sha256_file(data_dir / "manifest.json"), "files": dataset.manifest.get("files"),
            "kind": dataset.manifest.get("kind"), "split": dataset.manifest.get("split")}


def read_finished(path: Path, task_ids: list[str] | None = None) -> dict[str, Trajectory]:
    """Trajectories already written, by task id. A torn last line (a crash mid-write) is cut
    off the file so appending continues from a clean line. Every other line must be a trajectory
    (``Trajectory.from_json`` reads it) of a task of this run (``task_ids``, when given) that no
    earlier line holds: anything else is refused (``InputError``), naming each such line and the
    fix (remove that line: its task runs again), never kept or dropped silently."""
    if not path.is_file():
        return {}
    cut_torn_tail(path)
    known = set(task_ids) if task_ids is not None else None
    done: dict[str, Trajectory] = {}
    first_line: dict[str, int] = {}
    problems = []
    for lineno, data in iter_jsonl(path):
        traj = _read_trajectory(data, known, path, lineno)
        if isinstance(traj, Problem):
            problems.append(traj)
            continue
        task_id = traj.task_id
        if task_id in done:
            same = "an identical copy of" if traj == done[task_id] else "a second, different result for"
            problems.append(Problem(
                str(path), lineno, "task_id",
                f"{same} task {task_id!r} (first on line {first_line[task_id]}): a task has one line; remove "
                f"line {lineno}{'' if same.startswith('an') else ' or line ' + str(first_line[task_id])} "
                "(keep one) and --resume",
            ))
            continue
        done[task_id] = traj
        first_line[task_id] = lineno
    if problems:
        raise InputError(problems)
    return done


def _read_trajectory(data: Any, known: set[str] | None, path: Path, lineno: int) -> Trajectory | Problem:
    """Line ``lineno`` of ``trajectories.jsonl`` as a trajectory of this run, or why it is none.
    The JSON object is checked here, before it is a record, so the problem names the field."""
    fix = f"remove line {lineno} (its task, if any, runs again) and --resume"
    if not isinstance(data, dict):
        return Problem(str(path), lineno, "json", f"a JSON {type(data).__name__}, expected a trajectory object; {fix}")
    task_id = data.get("task_id")
    if not isinstance(task_id, str):
        got = "no task_id" if "task_id" not in data else f"task_id {task_id!r} ({type(task_id).__name__})"
        return Problem(str(path), lineno, "task_id", f"{got}, expected the id of a task (a string); {fix}")
    if known is not None and task_id not in known:
        return Problem(str(path), lineno, "task_id", f"{task_id!r} is no task of this run (data folder and limit); "
                       f"{fix}")
    try:
        return Trajectory.from_json(data)
    except (ValueError, TypeError) as exc:
        return Problem(str(path), lineno, "events", f"not a trajectory ({exc}); {fix}")


def build_environment(config: RunConfig, dataset: Dataset, group: str = "",
                      answered_by: Mapping[str, Any] | None = None):
    """The run's ``Environment``: ``engine.environment.build_shared`` with every role built here
    but those ``answered_by`` gives (already built backends); ``engine.environment.close_environment``
    closes it, those included."""
    from memsearch.engine.environment import build_shared

    answered_by = answered_by or {}
    return build_shared(config, dataset, leave_out=set(answered_by)).environment(config, group, answered_by)


async def _run_all(env, tasks, traj_path: Path, labels, show_progress: bool, desc: str, written: list[str],
                   earlier_failures: Mapping[str, int]) -> None:
    """Run ``tasks`` and append each trajectory as it finishes, with its ``attempt`` (1 + the
    task's ``earlier_failures``); ``written`` collects the task ids written (so a failed write
    can say how many are safe)."""
    from memsearch.engine.environment import close_environment
    from memsearch.engine.episode import run_episode
    from memsearch.eval.score import score_trajectory

    sem = asyncio.Semaphore(env.config.concurrency)
    bar = tqdm(total=len(tasks), desc=desc, unit="task", disable=not show_progress, mininterval=0.5)
    f1_sum, n = 0.0, 0

    async def one(task):
        async with sem:
            try:
                return await run_episode(task, env)
            except Exception as exc:  # a bug or backend crash: keep the task, mark it failed
                return Trajectory.failed(task.id, task.question, env.group, f"{type(exc).__name__}: {exc}")

    try:
        with open(traj_path, "a", encoding="utf-8") as fh:
            for next_done in asyncio.as_completed([one(t) for t in tasks]):
                traj = await next_done
                traj = replace(traj, attempt=earlier_failures.get(traj.task_id, 0) + 1)
                fh.write(_trajectory_line(traj))
                fh.flush()
                written.append(traj.task_id)
                n += 1
                f1_sum += score_trajectory(traj, labels[traj.task_id]).scores["f1"]  # as the summary scores it
                bar.set_postfix(f1=f"{f1_sum / n:.3f}")
                bar.update(1)
    finally:
        bar.close()
        await close_environment(env)


def _trajectory_line(traj: Trajectory) -> str:
    """The trajectory as one JSON line, or, when it holds text that cannot be written as UTF-8
    (a lone surrogate that got past the backends) or a number JSON cannot hold (NaN, an
    infinity: ``io.NonFiniteNumberError``), a failed-task record in its place: one bad
    completion must never end the run, make every ``--resume`` crash on it, or put a line no
    strict JSON parser reads into the file."""
    data = traj.to_json()
    try:
        line = dumps_line(data) + "\n"
        line.encode("utf-8")
    except (UnicodeEncodeError, NonFiniteNumberError) as exc:
        why = (f"not writable as UTF-8 ({exc.reason} at character {exc.start})" if isinstance(exc, UnicodeEncodeError)
               else f"not writable as strict JSON ({exc.where} is {first_non_finite(data)[1]!r})")
        failed = Trajectory.failed(traj.task_id, traj.question, traj.run_label, f"trajectory {why}; task marked failed",
                                   traj.attempt)
        line = dumps_line(failed.to_json()) + "\n"
    return line


def _chunk_truncation(config: RunConfig, rows: list[MetricsRow], complete: bool) -> dict[str, Any]:
    """What ``max_chunks`` cut off, stated so a truncated run cannot pass for a full read.

    ``read_whole_context`` is ``None`` outside stream mode (there is no long context), and
    ``True`` only when every expected task finished and none lost a chunk to the limit: a
    missing or crashed task is not known to have read its context.
    """
    cut_tasks = sum(1 for r in rows if r.truncated_by_chunk_limit)
    cut_chunks = sum(r.chunks_cut for r in rows)
    stream = config.agent.evidence == "stream"
    max_chunks = config.budgets.max_chunks if stream else None
    disclosure = None
    if cut_tasks:
        disclosure = (
            f"TRUNCATED: {cut_tasks} of {len(rows)} task(s) were cut by max_chunks={max_chunks} "
            f"({cut_chunks} chunk(s) never read); this run did not read the whole context"
        )
    return {
        "max_chunks": max_chunks,
        "tasks_cut_by_chunk_limit": cut_tasks,
        "chunks_cut": cut_chunks,
        "read_whole_context": (complete and cut_tasks == 0) if stream else None,
        "disclosure": disclosure,
    }


def _context_truncation(rows: list[MetricsRow]) -> dict[str, Any]:
    """Calls the server's context cut short (``context_truncated``: ``finish_reason`` "length" with
    fewer completion tokens than asked), by role, and the note that makes such a run unusable for
    comparison: its answers may differ from what the budgets allow. A completion cut at its own
    ``max_tokens`` is the budget working, counted apart (``finish_reason`` only)."""
    roles: dict[str, int] = {}
    for row in rows:
        for role, n in row.context_truncated_by_role.items():
            roles[role] = roles.get(role, 0) + n
    calls = sum(r.context_truncated_calls for r in rows)
    tasks = sum(1 for r in rows if r.context_truncated_calls)
    note = None
    if calls:
        by_role = ", ".join(f"{role} {n}" for role, n in sorted(roles.items()))
        note = (f"CONTEXT-TRUNCATED: {calls} call(s) in {tasks} task(s) (by role: {by_role}) were cut short by the "
                "server's context (finish_reason length below max_tokens); not usable for comparison: give the "
                "server a longer context or lower the budgets")
    return {"calls": calls, "tasks": tasks, "by_role": roles, "note": note}


def summarize(
    config: RunConfig, run_info: dict[str, Any], rows: list[MetricsRow], expected: int, env_info: dict[str, Any]
) -> RunSummary:
    from memsearch.eval.caveats import run_caveats
    from memsearch.eval.metrics import aggregate
    from memsearch.eval.score import registered_metrics  # through eval.score, which registers the built-in ones

    agg = aggregate([r.to_json() for r in rows], [*(metric.name for metric in registered_metrics()), *SUMMARY_COUNTS])
    failed = [r.task_id for r in rows if not r.ok]
    request_errors = sum(r.request_errors for r in rows)
    complete = len(rows) == expected and not failed
    ops = {f"ops_{op}": sum(r.ops.get(op, 0) for r in rows) for op in sorted({op for r in rows for op in r.ops})}
    tokens = {k: sum(r.tokens.get(k, 0) for r in rows) for k in sorted({k for r in rows for k in r.tokens})}
    truncation = _chunk_truncation(config, rows, complete)
    notes = (
        []
        if complete
        else [
            f"INCOMPLETE: {expected - len(rows)} task(s) missing, {len(failed)} failed "
            "(a failed task scores 0 in every answer metric); not a result"
        ]
    )
    if truncation["disclosure"]:
        notes.append(truncation["disclosure"])
    context = _context_truncation(rows)
    if context["note"]:
        notes.append(context["note"])
    retried = [r for r in rows if r.attempt > 1]
    return RunSummary.from_json({
        "complete": complete,
        "usable_for_comparison": complete and request_errors == 0 and context["calls"] == 0,
        "note": "; ".join(notes) or None,
        "evaluator_version": EVALUATOR_VERSION,
        # retried: tasks whose scored attempt followed failed ones (kept in failed_attempts.jsonl).
        "tasks": {"expected": expected, "scored": len(rows), "failed": len(failed), "failed_ids": failed[:50],
                  "retried": len(retried), "failed_attempts": sum(r.attempt - 1 for r in retried)},
        "request_errors": request_errors,
        "truncation": {**truncation, "memory_truncations": sum(r.memory_truncations for r in rows)},
        # Completions the server's context cut short (a budget cut is finish_reason "length" alone).
        "context_truncated": {k: context[k] for k in ("calls", "tasks", "by_role")},
        # What this run's numbers are not (eval.caveats): say it where the numbers are read.
        "caveats": run_caveats(config, env_info.get("group", "")),
        "metrics": agg["mean"],
        "metric_counts": agg["count"],
        # What each mean is over, so a reader of summary.json need not guess.
        "denominators": {
            "answer_metrics": "every scored task; a failed task (request errors, crash) counts 0",
            "invalid_action_rate": "per task: policy calls that returned a completion (request "
            "errors are counted apart, in request_errors)",
        },
        "memory_ops": ops,
        "tokens": tokens,
        "entailment_evaluated": False,
        "config": config_json(config),
        **env_info,
        "data": run_info["data"],
        "software": run_info["software"],
    })


def run_eval(
    config: RunConfig,
    data_dir: str | Path,
    out_dir: str | Path,
    resume: bool = False,
    group: str = "",
    show_progress: bool = True,
    answered_by: Mapping[str, Any] | None = None,
) -> RunSummary:
    """Run (or resume) an evaluation; returns the summary (also written to ``summary.json``).

    ``answered_by``: backends already built for some call roles, used instead of building the ones
    ``config`` describes (a trainer's periodic evaluation answers the trained roles with the model it
    holds: ``train.live_eval``); they must compute what ``config`` says, which the records state.
    The run closes them.

    Raises ``InputError`` (nothing created) for bad input, a folder that exists without
    ``resume``, a resume of another run or of a folder another process is writing;
    ``StorageError`` when a write fails (disk full, permissions): what was saved is safe and
    ``resume`` continues."""
    from memsearch.engine.environment import close_environment
    from memsearch.eval.score import score_trajectory

    data_dir, out = Path(data_dir), Path(out_dir)
    dataset = load_dataset(data_dir)
    tasks = dataset.tasks[: config.limit]
    labels = dataset.labels_by_id()
    resolved = config_json(config)
    run_info = {
        "data": data_fingerprint(data_dir, dataset),
        "models": model_identity(config),
        "software": software_versions(),
        "memsearch_source": source_identity(),  # the commit (and dirty flag) or installed version that ran
        "group": group,
    }
    # Everything that can fail is checked before the folder exists: a corrected command must not
    # meet a half-made folder (docs/design.md §10).
    check_run_folder(out, resume, resolved, run_info)
    started = time.perf_counter()
    env = build_environment(config, dataset, group, answered_by)
    if env.retriever is not None:
        from memsearch.retrieval.index import describe

        run_info["retrieval"] = describe(env.retriever)  # which index (or service) answered
    try:
        # GET /models of each served model: one the server does not list is refused here.
        asyncio.run(check_served_models(env.backends))
        if served := served_backends(env):
            run_info["served"] = served
        lock = claim_run_folder(out, resume, resolved, run_info)
    except BaseException:
        asyncio.run(close_environment(env))
        raise
    traj_path = out / "trajectories.jsonl"
    written: list[str] = []
    done: dict[str, Trajectory] = {}
    try:
        done = read_finished(traj_path, [t.id for t in tasks])  # under the lock: no other writer can add lines now
        for task_id in supersede_failed(out, done):  # a failed task runs again (eval.attempts)
            del done[task_id]
        todo = [t for t in tasks if t.id not in done]
        episodes_started = time.perf_counter()
        # CPU seconds of this process (all threads): on a shared machine wall time also measures
        # everyone else's jobs, CPU time mostly does not.
        episodes_cpu_started = time.process_time()
        if todo:
            asyncio.run(_run_all(env, todo, traj_path, labels, show_progress, f"eval {group}".strip(), written,
                                 failed_attempt_counts(out)))
        else:
            asyncio.run(close_environment(env))
        episodes_s = time.perf_counter() - episodes_started
        episodes_cpu_s = time.process_time() - episodes_cpu_started
        finished = read_finished(traj_path, [t.id for t in tasks])
        rows = [score_trajectory(finished[t.id], labels[t.id]) for t in tasks if t.id in finished]
        write_jsonl(out / "metrics.jsonl", [row.to_json() for row in rows])
        summary = _summary(config, run_info, rows, tasks, dataset, env, group)
        summary = summary.with_timing({
            "wall_s_this_invocation": round(time.perf_counter() - started, 2),
            "episodes_wall_s": round(episodes_s, 3),
            "episodes_cpu_s": round(episodes_cpu_s, 3),
            "episodes_run": len(todo),
            "resumed_tasks": len(done),
        })
        write_record(out / "summary.json", summary.to_json())
        return summary
    except OSError as exc:
        error = storage_error(exc, traj_path, len(done) + len(written), len(tasks))
        if error is None:
            raise
        raise error from None
    finally:
        lock.release()


def served_backends(env) -> dict[str, dict[str, Any]]:
    """Per role answered by a served model, what its server said it is (``served_identity``: the
    ``/models`` entry); other roles are left out. What the requests carried (``sent_fields``) is in
    ``backend_stats``: a count of this invocation, like ``timing``."""
    return {role: {"served_identity": backend.served_identity} for role in CALL_ROLES
            if hasattr(backend := env.backends.get(role), "served_identity")}


def _backend_stats(env) -> list[dict[str, Any]]:
    shared: dict[int, dict[str, Any]] = {}
    for role, backend in env.backends.items():
        if hasattr(backend, "stats"):
            entry = shared.setdefault(id(backend), {"roles": [], "name": backend.name, "stats": backend.stats()})
            entry["roles"].append(role)
    return list(shared.values())


def _summary(
    config: RunConfig, run_info: dict[str, Any], rows, tasks, dataset: Dataset, env, group: str
) -> RunSummary:
    from memsearch.engine.episode import ENGINE_VERSION
    from memsearch.engine.prompts import prompt_version

    env_info = {
        "group": group,
        "tokenizer": env.tokenizer.name,
        "engine_version": ENGINE_VERSION,
        "prompt_version": prompt_version(config.prompts.model_dump()),  # names any wording the config sets
        "budgets": config.budgets.model_dump(),
        "agent": config.agent.model_dump(),
        "sampling": {role: getattr(config.backends, role).sampling.model_dump() for role in CALL_ROLES},
        "backends": {role: env.backends[role].name for role in CALL_ROLES},
        # Which backend wrote the memory (matrix groups A/C use the baseline, B/D the trained policy).
        "memory_backend": {
            "kind": config.backends.memory.kind,
            **config.backends.memory.recorded_identity(),  # model, adapter, base_url: None where the kind has none
            "name": env.backends["memory"].name,
            "served_identity": getattr(env.backends["memory"], "served_identity", None),
        },
        "served": served_backends(env),
        "memsearch_source": run_info["memsearch_source"],
        # Requests, retries and errors by kind of each backend (roles that share one are listed
        # together); this invocation only: a resume counts its own requests, like "timing".
        "backend_stats": _backend_stats(env),
        # How a derived set (e.g. RULER-HQA docs{N}) was built; its bytes are in "data".
        "data_build": {
            k: dataset.manifest[k]
            for k in ("builder", "num_docs", "seed", "pool_size", "context_sha256", "context_tokens", "counts")
            if k in dataset.manifest
        },
    }
    return summarize(config, run_info, rows, len(tasks), env_info)

"""What a report shows, as one JSON-able dict (the payload the page decodes).

    payload = build_payload([Path("runs/eval-1")], data_dir=Path("data/hotpot-dev"))

A run is an eval run folder (``summary.json``, ``run.json``, ``trajectories.jsonl``,
``metrics.jsonl``) or a matrix folder (``matrix.json`` and one such folder per group, each
becoming a run named after its group). Labels (gold answers, supporting facts) are joined by
task id here, from the data folder the run was made on, never inside the engine (docs/design.md
§6). Run folders do not record where their data folder is, only its fingerprint, so the folder
is named by the caller and refused unless its fingerprint equals the run's ``run.json`` ``data``
record: a report never joins a run with labels of other data.

Nothing is cut: every text of every event goes into the payload whole; the page collapses long
texts behind "show all" instead. Only the token-level arrays of a policy call (prompt and
completion ids, log-probs: training data, not text) are replaced by their lengths.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memsearch.errors import InputError
from memsearch.records.events import PolicyCall
from memsearch.records.metrics_row import MetricsRow, read_metrics
from memsearch.records.run_summary import RunSummary
from memsearch.records.trajectory import Trajectory, read_trajectories

SCHEMA = "memsearch-report/1"
# Columns of the task table, in order; each is a key of a metrics.jsonl row (or derived below).
TABLE_COLUMNS = ("em", "f1", "sub_em", "searches", "chunks", "invalid_actions", "request_errors",
                 "memory_truncations", "tokens", "latency_s")
CI_METRICS = ("em", "f1", "sub_em", "retrieval_support_recall", "memory_support_recall", "memory_support_precision",
              "citation_precision", "citation_recall")


def run_folders(path: Path) -> dict[str, Path]:
    """Run name -> eval run folder: a matrix folder gives one run per group, in matrix order."""
    path = Path(path)
    if (path / "matrix.json").is_file():
        groups = [p.name for p in sorted(path.iterdir()) if (p / "summary.json").is_file()]
        return {g: path / g for g in groups}
    if (path / "summary.json").is_file():
        return {path.name: path}
    raise InputError(f"{path}: not a run folder (no summary.json) nor a matrix folder (no matrix.json)")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: missing; a report needs a finished run folder") from None


def check_data(data_dir: Path, run_dir: Path) -> None:
    """Refuse a data folder whose fingerprint is not the one the run recorded."""
    from memsearch.data.dataset import load_dataset
    from memsearch.eval.runner import data_fingerprint

    recorded = _read_json(run_dir / "run.json").get("data")
    actual = data_fingerprint(Path(data_dir), load_dataset(data_dir))
    if recorded != actual:
        raise InputError(f"{data_dir}: data fingerprint differs from {run_dir / 'run.json'} (data); "
                         "pass --data the folder this run was made on")


def bootstrap_ci(values: list[float], resamples: int = 2000, seed: int = 0) -> list[float] | None:
    """95 % percentile bootstrap interval of a mean (seeded: the same run gives the same bytes)."""
    import numpy as np

    if not values:
        return None
    arr = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = arr[rng.integers(0, len(arr), size=(resamples, len(arr)))].mean(axis=1)
    return [round(float(np.percentile(means, 2.5)), 6), round(float(np.percentile(means, 97.5)), 6)]


def _tokens(row: MetricsRow) -> int:
    # Reported and estimated counts are never added together; the table shows whichever the run has.
    reported = sum(v for k, v in row.tokens.items() if not k.startswith("estimated_"))
    return reported or sum(v for k, v in row.tokens.items() if k.startswith("estimated_"))


def run_caveats_of(summary: RunSummary) -> list[str]:
    """What the run's numbers are not (``eval.caveats``): as its summary recorded them, or, for a
    summary written before they were recorded, derived from its config."""
    from memsearch.eval.caveats import run_caveats

    if summary.caveats is not None:
        return list(summary.caveats)
    return run_caveats(summary.config, summary.group) if summary.config is not None else []


def _header(run_dir: Path, summary: RunSummary, rows: list[MetricsRow]) -> dict[str, Any]:
    run_info = _read_json(run_dir / "run.json")
    ci = {k: bootstrap_ci([r.column(k) for r in rows if r.column(k) is not None]) for k in CI_METRICS}
    tokens = summary.tokens
    return {
        "group": summary.group, "agent": summary.agent, "budgets": summary.budgets, "backends": summary.backends,
        "models": run_info.get("models"), "tokenizer": summary.tokenizer, "data": summary.data,
        "evaluator_version": summary.evaluator_version, "engine_version": summary.engine_version,
        "prompt_version": summary.prompt_version, "complete": summary.complete,
        "usable_for_comparison": summary.usable_for_comparison, "note": summary.note,
        "tasks": summary.tasks.to_json(), "request_errors": summary.request_errors, "metrics": dict(summary.metrics),
        "ci": ci,
        "tokens_reported": {k: v for k, v in tokens.items() if not k.startswith("estimated_")},
        "tokens_estimated": {k: v for k, v in tokens.items() if k.startswith("estimated_")},
        "software": run_info.get("software"),
        "memsearch_source": run_info.get("memsearch_source"),
        "memory_backend": None if summary.memory_backend is None else summary.memory_backend.to_json(),
        "context_truncated": summary.context_truncated, "caveats": run_caveats_of(summary),
    }


def _task_row(row: MetricsRow, traj: Trajectory | None, label: dict[str, Any] | None) -> dict[str, Any]:
    calls = traj.policy_calls() if traj is not None else []
    out = {k: row.column(k) for k in ("task_id", "status", "prediction", "em", "f1", "sub_em", "searches", "chunks",
                                   "chunks_cut", "invalid_actions", "request_errors", "memory_truncations", "latency_s",
                                   "retrieval_support_recall", "memory_support_recall", "memory_support_precision",
                                   "citation_precision", "citation_recall", "invalid_citations",
                                   "context_truncated_calls", "attempt")}
    out["question"] = traj.question if traj is not None else ""
    out["gold"] = label["answers"][0] if label else None
    out["tokens"] = _tokens(row)
    # finish_reason=length on any call: a completion cut by its token budget or, context_truncated,
    # by the server's context (a filter of the table).
    out["length_cut"] = any(c.finish_reason == "length" for c in calls)
    out["context_cut"] = any(c.context_truncated for c in calls)
    return out


# Token-level arrays of a policy call: training data, not text a person reads. The page shows
# their lengths; trajectories.jsonl keeps them (an hf run's report would otherwise be mostly ids).
TOKEN_ARRAYS = ("prompt_ids", "completion_ids", "logprobs")


def _readable(traj: Trajectory | None) -> dict[str, Any]:
    """The trajectory as its file line holds it (``{"events": []}`` for a task with none), each
    policy call's token arrays replaced by their lengths (``token_counts``)."""
    if traj is None:
        return {"events": []}
    events = []
    for event in traj.events:
        data = event.to_json(traj.memory_outcome(event)) if isinstance(event, PolicyCall) else event.to_json()
        if isinstance(event, PolicyCall):
            arrays = {"prompt_ids": event.prompt_ids, "completion_ids": event.completion_ids,
                      "logprobs": event.logprobs}
            data = {**{k: v for k, v in data.items() if k not in TOKEN_ARRAYS},
                    "token_counts": {k: None if arrays[k] is None else len(arrays[k]) for k in TOKEN_ARRAYS}}
        events.append(data)
    return {**traj.to_json(), "events": events}


def read_episodes(run_dir: Path) -> dict[str, Trajectory]:
    """The run's trajectories by task id."""
    return {t.task_id: t for _, t in read_trajectories(run_dir / "trajectories.jsonl")}


def load_run(run_dir: Path, labels: dict[str, dict[str, Any]],
             episodes: dict[str, Trajectory] | None = None) -> dict[str, Any]:
    """One run's header, task rows (metrics.jsonl order) and full trajectories by task id;
    ``episodes``: the run's trajectories when already read (``read_episodes``)."""
    summary = RunSummary.read(run_dir / "summary.json")
    rows = read_metrics(run_dir / "metrics.jsonl")
    trajs = read_episodes(run_dir) if episodes is None else episodes
    missing = [r.task_id for r in rows if r.task_id not in labels]
    if missing:
        raise InputError(f"{run_dir}: {len(missing)} task(s) have no label in the data folder, e.g. {missing[0]!r}")
    return {"header": _header(run_dir, summary, rows),
            "tasks": [_task_row(r, trajs.get(r.task_id), labels.get(r.task_id)) for r in rows],
            "episodes": {r.task_id: _readable(trajs.get(r.task_id)) for r in rows}}


def _shown_sentences(episodes: list[Trajectory | None], documents: dict[str, Any]) -> dict[str, str]:
    """Text of every evidence id any episode was shown (or cites), so the page can show evidence."""
    ids: set[str] = set()
    for traj in episodes:
        if traj is not None:
            ids.update(traj.shown_evidence)
            ids.update(traj.citations)
    out = {}
    for eid in sorted(ids):
        doc_id, _, index = eid.rpartition(":")
        doc = documents.get(doc_id)
        if doc is not None and index.isdigit() and int(index) < len(doc.sentences):
            out[eid] = f"{doc.title}: {doc.sentences[int(index)]}"
    return out


def build_payload(paths: list[Path], data_dir: Path, train_logs: list[Path] | None = None) -> dict[str, Any]:
    """The whole report: runs, labels, shown evidence text, comparisons, training curves."""
    from memsearch.data.dataset import load_dataset
    from memsearch.report.compare import compare_runs

    folders: dict[str, Path] = {}
    for path in paths:
        for name, folder in run_folders(path).items():
            # Two single runs of the same folder name stay apart: prefix the second with its parent.
            key = name if name not in folders else f"{folder.parent.name}/{name}"
            folders[key] = folder
    for folder in folders.values():
        check_data(data_dir, folder)
    dataset = load_dataset(data_dir)
    all_labels = {lab.id: lab.model_dump(include={"answers", "supporting_facts", "gold_doc_ids", "type"})
                  for lab in dataset.labels}
    episodes = {name: read_episodes(folder) for name, folder in folders.items()}
    runs = {name: load_run(folder, all_labels, episodes[name]) for name, folder in folders.items()}
    used = sorted({t["task_id"] for run in runs.values() for t in run["tasks"]})
    names = list(runs)
    comparisons = {f"{a}|{b}": compare_runs(runs[a]["tasks"], runs[b]["tasks"])
                   for a in names for b in names if a != b}
    from memsearch.report.training import training_series

    return {
        "schema": SCHEMA,
        "runs": runs,
        "run_order": names,
        "labels": {tid: all_labels[tid] for tid in used},
        "evidence": _shown_sentences([episodes[name].get(t["task_id"]) for name, run in runs.items()
                                      for t in run["tasks"]], dataset.documents_by_id()),
        "comparisons": comparisons,
        "columns": list(TABLE_COLUMNS),
        "training": training_series(train_logs) if train_logs else None,
    }

"""``memsearch matrix``: groups A-D (memory x controller) from one config, identical budgets.

Each group is an ordinary eval run in ``OUT/<group>``; ``OUT/matrix.json`` and
``OUT/matrix.md`` compare them: per group the headline metrics and the backend that wrote its
memory, per pair of groups the F1 and EM difference with a paired bootstrap 95 % CI over the
same tasks, then the caveats that apply (``eval.caveats``). Summary groups A/C write memory with
the baseline memory backend, B/D with ``backends.memory`` (``memsearch.config.baseline_memory_backend``:
a served memory without ``backends.baseline_memory`` is refused before anything runs). ``OUT`` is
created with the matrix's marker (``eval.run_folder.MARKER``): ``--resume`` continues only a
matrix folder.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memsearch.config import RunConfig, config_json, group_config
from memsearch.errors import InputError
from memsearch.eval.caveats import caveats
from memsearch.eval.run_folder import MARKER, claim_folder
from memsearch.io import write_json
from memsearch.records.metrics_row import read_metrics
from memsearch.records.run_summary import MatrixGroup

MATRIX_COMMAND = "eval matrix"

TABLE_METRICS = ("f1", "em", "retrieval_support_recall", "memory_support_recall", "memory_support_precision",
                 "citation_precision", "searches", "invalid_action_rate", "request_errors")


def check_comparable(configs: dict[str, RunConfig]) -> None:
    """Refuse a matrix whose groups differ in budgets, tokenizer or retrieval settings."""
    first_group, first = next(iter(configs.items()))
    for group, cfg in configs.items():
        if cfg.budgets != first.budgets:
            raise InputError(
                f"group {group}: budgets differ from group {first_group}; a matrix compares groups under identical "
                "budgets"
            )
        if cfg.tokenizer != first.tokenizer:
            raise InputError(
                f"group {group}: tokenizer {cfg.tokenizer!r} differs from group {first_group}'s {first.tokenizer!r}"
            )
        if cfg.retrieval != first.retrieval:
            raise InputError(
                f"group {group}: retrieval settings {cfg.retrieval.model_dump()} differ from group "
                f"{first_group}'s {first.retrieval.model_dump()}; a matrix compares groups that see the same evidence"
            )


def _earlier_matrix_folder(out: Path, groups: list[str]) -> bool:
    """A matrix folder of an earlier version (no marker): some group folder holds an eval run of
    that group (its ``run.json`` names it). Each group's run is then checked by its own resume."""
    for group in groups:
        try:
            if json.loads((out / group / "run.json").read_text(encoding="utf-8")).get("group") == group:
                return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


def _per_task(out: Path, group: str, key: str) -> dict[str, float]:
    return {row.task_id: row.column(key) for row in read_metrics(out / group / "metrics.jsonl")}


def compare(out: Path, groups: list[str], resamples: int) -> list[dict[str, Any]]:
    from memsearch.eval.bootstrap import paired_bootstrap

    pairs = []
    for a, b in itertools.combinations(groups, 2):
        entry: dict[str, Any] = {"a": a, "b": b}
        for key in ("f1", "em"):
            ra, rb = _per_task(out, a, key), _per_task(out, b, key)
            common = [t for t in ra if t in rb]
            result = paired_bootstrap([ra[t] for t in common], [rb[t] for t in common], n_resamples=resamples, seed=0)
            entry[key] = {k: result[k] for k in ("diff", "ci_low", "ci_high", "p_value", "n")}
        pairs.append(entry)
    return pairs


def render_table(
    groups: Mapping[str, MatrixGroup], pairs: list[dict[str, Any]], notes: list[str] | None = None
) -> str:
    """A Markdown table a person can read: one row per group, the pairwise differences, then
    ``notes`` (the caveats), once."""
    head = "| group | memory | controller | memory backend | " + " | ".join(TABLE_METRICS) + " | complete |"
    lines = [head, "|" + "---|" * (len(TABLE_METRICS) + 5)]
    for group, g in groups.items():
        cells = []
        for key in TABLE_METRICS:
            value = g.metrics.get(key)
            cells.append("-" if value is None else f"{value:.3f}")
        lines.append(
            f"| {group} | {g.agent['memory']} | {g.agent['controller']} | {g.memory_backend.label} | "
            + " | ".join(cells)
            + f" | {g.complete} |"
        )
    lines += ["", "| pair | ΔF1 (a-b) | 95% CI | ΔEM (a-b) | 95% CI | n |", "|---|---|---|---|---|---|"]
    for p in pairs:
        f, e = p["f1"], p["em"]
        lines.append(
            f"| {p['a']}-{p['b']} | {f['diff']:+.3f} | [{f['ci_low']:+.3f}, {f['ci_high']:+.3f}] | "
            f"{e['diff']:+.3f} | [{e['ci_low']:+.3f}, {e['ci_high']:+.3f}] | {f['n']} |"
        )
    if notes:
        lines += ["", "Caveats:", *[f"- {note}" for note in notes]]
    return "\n".join(lines) + "\n"


def run_matrix(
    config: RunConfig, data_dir: str | Path, out_dir: str | Path, resume: bool = False, show_progress: bool = True
) -> dict[str, Any]:
    """Run every group (or finish them, with ``resume``) and write the comparison."""
    from memsearch.eval.runner import run_eval

    out = Path(out_dir)
    groups = list(config.matrix.groups)
    if config.agent.evidence != "search":
        # Every group's controller (fixed or policy) searches: a streaming base has no group to run.
        raise InputError(
            f"agent.evidence = {config.agent.evidence!r}: the A-D matrix (memory x controller) runs search "
            "agents; use `memsearch eval run` for this config"
        )
    configs = {g: group_config(config, g) for g in groups}
    check_comparable(configs)
    if out.exists() and not resume:
        raise InputError(
            f"{out}: output folder already exists; pass --resume to continue that matrix, or choose a new folder"
        )
    if resume and not out.is_dir():
        raise InputError(f"{out}: nothing to resume (no such folder)")
    created = claim_folder(out, MATRIX_COMMAND, lambda folder: _earlier_matrix_folder(folder, groups))
    summaries = {}
    try:
        for group, cfg in configs.items():
            summaries[group] = run_eval(
                cfg,
                data_dir,
                out / group,
                resume=resume and (out / group).exists(),
                group=group,
                show_progress=show_progress,
            )
    except BaseException:
        # The first group's run checks data, models and backends before its folder exists: a bad
        # command must leave nothing behind, so a new matrix folder holding only its marker goes.
        if created and [p.name for p in out.iterdir()] == [MARKER]:
            (out / MARKER).unlink()
            out.rmdir()
        raise
    pairs = compare(out, groups, config.matrix.bootstrap_resamples)
    notes = caveats({g: config_json(cfg) for g, cfg in configs.items()})
    entries = {g: s.group_entry() for g, s in summaries.items()}
    table = render_table(entries, pairs, notes)
    result = {
        "groups": {g: entry.to_json() for g, entry in entries.items()},
        "pairs": pairs,
        "budgets": configs[groups[0]].budgets.model_dump(),
        "tokenizer": summaries[groups[0]].tokenizer,
        "complete": all(s.complete for s in summaries.values()),
        "usable_for_comparison": all(s.usable_for_comparison for s in summaries.values()),
        "caveats": notes,
    }
    write_json(out / "matrix.json", result)
    (out / "matrix.md").write_text(table, encoding="utf-8")
    result["table"] = table
    return result

"""The comparison report of ``memsearch pipeline memagent``: base vs trained at every N.

Every number comes from the eval runs' ``summary.json``; the report adds nothing but layout
and the discipline notes: a run with request errors, failed or missing tasks is marked unusable
for comparison, and a run cut by ``max_chunks`` says how many questions were not read whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memsearch.io import write_json

METRICS = ("sub_em", "em", "f1", "boxed_em")


def comparison_rows(summaries: dict[str, dict[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (N, checkpoint) in N order, base first."""
    rows = []
    for n in sorted({n for by_n in summaries.values() for n in by_n}):
        for checkpoint, by_n in summaries.items():
            if n not in by_n:
                continue
            s = by_n[n]
            trunc = s.get("truncation") or {}
            tokens = (s.get("data_build") or {}).get("context_tokens") or {}
            rows.append({
                "docs": n, "checkpoint": checkpoint, **{m: s["metrics"].get(m) for m in METRICS},
                "questions": s["tasks"]["scored"], "expected": s["tasks"]["expected"], "failed": s["tasks"]["failed"],
                "request_errors": s["request_errors"], "context_tokens_mean": tokens.get("mean"),
                "chunks_mean": s["metrics"].get("chunks"), "tasks_cut_by_chunk_limit": trunc.get("tasks_cut_by_chunk_limit"),
                "chunks_cut": trunc.get("chunks_cut"), "read_whole_context": trunc.get("read_whole_context"),
                "memory_truncations": trunc.get("memory_truncations"), "usable_for_comparison": s["usable_for_comparison"],
                "episodes_cpu_s": (s.get("timing") or {}).get("episodes_cpu_s"),
            })
    return rows


def _cell(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    head = ("N docs", "model", "context tokens", "sub_em", "em", "f1", "boxed_em", "questions", "cut by max_chunks",
            "chunks never read", "memory truncations", "request errors", "usable")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = (r["docs"], r["checkpoint"], _cell(r["context_tokens_mean"], 0), *(_cell(r[m]) for m in METRICS),
                 f"{r['questions']}/{r['expected']}", r["tasks_cut_by_chunk_limit"], r["chunks_cut"], r["memory_truncations"],
                 r["request_errors"], _cell(r["usable_for_comparison"]))
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def write_report(cfg, out: Path, summaries: dict[str, dict[int, dict[str, Any]]], rewards: dict[str, Any]) -> dict[str, Any]:
    """``OUT/report.md`` and ``OUT/report.json``; returns the report (with its ``table``)."""
    rows = comparison_rows(summaries)
    table = markdown_table(rows)
    any_summary = next(s for by_n in summaries.values() for s in by_n.values())
    budgets = cfg.episode.budgets
    notes = []
    for r in rows:
        if r["tasks_cut_by_chunk_limit"]:
            notes.append(f"- N={r['docs']} {r['checkpoint']}: TRUNCATED, {r['tasks_cut_by_chunk_limit']} of {r['questions']} "
                         f"question(s) cut by max_chunks={budgets.max_chunks} ({r['chunks_cut']} chunks never read): "
                         "this run did not read the whole context.")
        if not r["usable_for_comparison"]:
            notes.append(f"- N={r['docs']} {r['checkpoint']}: NOT USABLE for comparison ({r['request_errors']} request "
                         f"errors, {r['failed']} failed, {r['expected'] - r['questions']} missing).")
    sampling = any_summary["sampling"]["reader"]
    lines = [
        "# MemAgent pipeline: base vs trained", "",
        f"Model `{cfg.model}` (trained: `merged/`, the final GRPO adapter merged). Same recurrent inference code for both "
        "(`memsearch eval`, run configs identical but for the model folder).", "",
        f"Chunk {budgets.chunk_tokens} tokens, at most {budgets.max_chunks} chunks, memory {budgets.memory_tokens} tokens "
        f"(hard limit after every update), memory update at most {budgets.policy_tokens} tokens, answer {budgets.answer_tokens} "
        f"tokens; tokenizer `{any_summary['tokenizer']}`; prompt version `{any_summary['prompt_version']}`; evaluator "
        f"`{any_summary['evaluator_version']}`; reader sampling temperature {sampling['temperature']}, top_p {sampling['top_p']}.",
        "", table, "", "sub_em: a gold answer occurs in the normalized prediction (MemAgent's metric); boxed_em: exact "
        "match of the last \\boxed{}; empty predictions and failed requests score 0 and stay in the denominator.", "",
    ]
    if notes:
        lines += ["## Disclosures", "", *notes, ""]
    if rewards.get("steps"):
        lines += ["## Training reward", "", f"{rewards['steps']} GRPO steps, mean reward {rewards['first']:.4f} at step 1, "
                  f"{rewards['last']:.4f} at the last step (per step: `rewards.md`; curve: `reward_curve.png`).", "",
                  "![reward curve](reward_curve.png)", ""]
        if rewards["no_signal_steps"] == rewards["steps"]:
            still = " and the adapter's gradient was 0 throughout" if rewards["grad_norm_max"] == 0 else ""
            lines += [f"NO LEARNING SIGNAL: in all {rewards['steps']} steps every group's rollouts had the same reward, so "
                      f"every advantage was 0{still} (largest gradient norm {rewards['grad_norm_max']}).", ""]
    report = {"rows": rows, "table": table, "rewards": rewards, "notes": notes,
              "data": {f"{c}/docs{n}": s["data"] for c, by_n in summaries.items() for n, s in by_n.items()}}
    (out / "report.md").write_text("\n".join(lines), encoding="utf-8")
    write_json(out / "report.json", report)
    return report

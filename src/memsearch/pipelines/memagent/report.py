"""The comparison report of ``memsearch pipeline memagent``: base vs trained on every set.

Every number comes from the eval runs' ``summary.json`` and per-question ``metrics.jsonl``; the
report adds layout, the discipline notes (a run with request errors, failed or missing tasks is
unusable for comparison; a run cut by ``max_chunks`` says how many questions were not read
whole), a paired bootstrap CI on every base-vs-trained difference (``eval.bootstrap``, over the
questions both runs scored), and a verdict per acceptance criterion of the recipe:

- at every RULER-HQA length N: trained > base on ``sub_em`` (the main metric);
- on plain HotpotQA: trained > base on ``boxed_em``.

A criterion is ``PASS`` when the trained mean is higher and the CI of the difference excludes
0, ``NOT SIGNIFICANT`` when it is higher but the CI includes 0, ``FAIL`` when it is not higher,
and ``NOT USABLE`` when either run is incomplete, has request errors, or the two runs did not
score the same questions: such runs may not be used to claim the criterion either way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memsearch.eval.run_diff import paired_difference, per_task_metrics
from memsearch.io import write_json
from memsearch.records.run_summary import RunSummary

METRICS = ("sub_em", "em", "f1", "boxed_em")
HOTPOT_SET = "hotpotqa"
# Acceptance criteria: (set kind, metric). RULER-HQA sets are judged on sub_em, HotpotQA on boxed EM.
CRITERION_METRIC = {"ruler": "sub_em", HOTPOT_SET: "boxed_em"}


def _set_order(name: str) -> tuple[int, int]:
    # docs{N} in N order, then plain HotpotQA.
    return (1, 0) if name == HOTPOT_SET else (0, int(name.removeprefix("docs")))


def set_label(name: str) -> str:
    """How the report names a set: ``N=50`` for ``docs50``, ``HotpotQA`` for plain HotpotQA."""
    return "HotpotQA" if name == HOTPOT_SET else f"N={name.removeprefix('docs')}"


def comparison_rows(summaries: dict[str, dict[str, RunSummary]]) -> list[dict[str, Any]]:
    """One row per (set, checkpoint): RULER-HQA sets in N order, then HotpotQA; base first."""
    rows = []
    for set_name in sorted({name for by_set in summaries.values() for name in by_set}, key=_set_order):
        for checkpoint, by_set in summaries.items():
            if set_name not in by_set:
                continue
            s = by_set[set_name]
            trunc = s.truncation
            tokens = (s.data_build or {}).get("context_tokens") or {}
            rows.append(
                {
                    "set": set_name,
                    "docs": None if set_name == HOTPOT_SET else int(set_name.removeprefix("docs")),
                    "checkpoint": checkpoint,
                    **{m: s.metrics.get(m) for m in METRICS},
                    "sub_em_lenient": s.metrics.get("sub_em_lenient"),
                    "questions": s.tasks.scored,
                    "expected": s.tasks.expected,
                    "failed": s.tasks.failed,
                    "request_errors": s.request_errors,
                    "context_tokens_mean": tokens.get("mean"),
                    "chunks_mean": s.metrics.get("chunks"),
                    "tasks_cut_by_chunk_limit": trunc.get("tasks_cut_by_chunk_limit"),
                    "chunks_cut": trunc.get("chunks_cut"),
                    "read_whole_context": trunc.get("read_whole_context"),
                    "memory_truncations": trunc.get("memory_truncations"),
                    "usable_for_comparison": s.usable_for_comparison,
                    "episodes_cpu_s": (s.timing or {}).get("episodes_cpu_s"),
                }
            )
    return rows


def verdict(
    criterion: str, base: RunSummary, trained: RunSummary, delta: dict[str, Any] | None
) -> dict[str, Any]:
    """The verdict on one criterion ("trained > base") from the two runs' summaries and their
    paired difference: PASS, NOT SIGNIFICANT, FAIL or NOT USABLE (see the module docstring)."""
    problems = []
    for name, s in (("base", base), ("trained", trained)):
        if not s.usable_for_comparison:
            problems.append(
                f"{name} run unusable ({s.request_errors} request errors, {s.tasks.failed} failed, "
                f"{s.tasks.expected - s.tasks.scored} missing)"
            )
    if delta is None or delta["n"] != base.tasks.expected or delta["n"] != trained.tasks.expected:
        problems.append("the runs did not score the same questions")
    if problems:
        status = "NOT USABLE"
    elif delta["diff"] <= 0:
        status = "FAIL"
    elif delta["ci_low"] > 0:
        status = "PASS"
    else:
        status = "NOT SIGNIFICANT"
    out = {
        "criterion": criterion,
        "status": status,
        "problems": problems,
        "trained_above_base": None if delta is None else delta["diff"] > 0,
        "ci_excludes_0": None if delta is None else (delta["ci_low"] > 0 or delta["ci_high"] < 0),
        "delta": delta,
    }
    detail = (
        "; ".join(problems)
        if problems
        else (
            f"Δ {delta['diff']:+.3f}, {delta['confidence']:.0%} CI [{delta['ci_low']:+.3f}, {delta['ci_high']:+.3f}] "
            f"({'excludes' if out['ci_excludes_0'] else 'includes'} 0), n={delta['n']}"
        )
    )
    out["line"] = f"{status}: {criterion}: {detail}"
    return out


def _delta_cell(d: dict[str, Any] | None) -> str:
    if d is None:
        return "-"
    return f"{d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"


def deltas_table(deltas: dict[str, dict[str, dict[str, Any] | None]], confidence: float) -> str:
    """Markdown: one row per set, each metric's trained − base difference with its CI."""
    head = ("set", *(f"Δ {m} (trained − base) [{confidence:.0%} CI]" for m in METRICS), "questions paired")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for set_name, by_metric in deltas.items():
        n = next((d["n"] for d in by_metric.values() if d is not None), 0)
        lines.append(
            "| " + " | ".join([set_label(set_name), *(_delta_cell(by_metric[m]) for m in METRICS), str(n)]) + " |"
        )
    return "\n".join(lines)


def _cell(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one row per (set, checkpoint) with the metrics and the discipline columns."""
    head = (
        "set",
        "model",
        "context tokens",
        "sub_em",
        "em",
        "f1",
        "boxed_em",
        "sub_em_lenient",
        "questions",
        "cut by max_chunks",
        "chunks never read",
        "memory truncations",
        "request errors",
        "usable",
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = (
            set_label(r["set"]),
            r["checkpoint"],
            _cell(r["context_tokens_mean"], 0),
            *(_cell(r[m]) for m in METRICS),
            _cell(r["sub_em_lenient"]),
            f"{r['questions']}/{r['expected']}",
            r["tasks_cut_by_chunk_limit"],
            r["chunks_cut"],
            r["memory_truncations"],
            r["request_errors"],
            _cell(r["usable_for_comparison"]),
        )
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def write_report(
    cfg, out: Path, summaries: dict[str, dict[str, RunSummary]], rewards: dict[str, Any]
) -> dict[str, Any]:
    """``OUT/report.md`` and ``OUT/report.json``; returns the report (with its ``table``,
    ``deltas`` and ``verdicts``). ``summaries[checkpoint][set]``, sets named as their eval folders."""
    rows = comparison_rows(summaries)
    table = markdown_table(rows)
    any_summary = next(s for by_set in summaries.values() for s in by_set.values())
    budgets = cfg.episode.budgets
    settings = cfg.report
    deltas: dict[str, dict[str, dict[str, Any] | None]] = {}
    verdicts = []
    for set_name in sorted(set(summaries["base"]) & set(summaries["trained"]), key=_set_order):
        base_rows, trained_rows = (
            per_task_metrics(out / "eval" / c / set_name / "metrics.jsonl") for c in ("base", "trained")
        )
        deltas[set_name] = {
            m: paired_difference(
                base_rows, trained_rows, m, settings.bootstrap_resamples, settings.confidence, settings.seed
            )
            for m in METRICS
        }
        metric = CRITERION_METRIC[HOTPOT_SET if set_name == HOTPOT_SET else "ruler"]
        where = "plain HotpotQA" if set_name == HOTPOT_SET else f"RULER-HQA {set_label(set_name)}"
        verdicts.append(
            verdict(
                f"trained > base on {metric} at {where}",
                summaries["base"][set_name],
                summaries["trained"][set_name],
                deltas[set_name][metric],
            )
        )
    delta_md = deltas_table(deltas, settings.confidence)
    statuses = {v["status"] for v in verdicts}
    overall = "NOT USABLE" if "NOT USABLE" in statuses else "ACCEPTED" if statuses == {"PASS"} else "NOT ACCEPTED"
    notes = []
    for r in rows:
        if r["tasks_cut_by_chunk_limit"]:
            notes.append(
                f"- {set_label(r['set'])} {r['checkpoint']}: TRUNCATED, {r['tasks_cut_by_chunk_limit']} of "
                f"{r['questions']} question(s) cut by max_chunks={budgets.max_chunks} ({r['chunks_cut']} chunks "
                "never read): this run did not read the whole context."
            )
        if not r["usable_for_comparison"]:
            notes.append(
                f"- {set_label(r['set'])} {r['checkpoint']}: NOT USABLE for comparison ({r['request_errors']} request "
                f"errors, {r['failed']} failed, {r['expected'] - r['questions']} missing)."
            )
    sampling = any_summary.sampling["reader"]
    lines = [
        "# MemAgent pipeline: base vs trained",
        "",
        f"Model `{cfg.model}` (trained: `merged/`, the final GRPO adapter merged). Same recurrent inference code for "
        "both "
        "(`memsearch eval`, run configs identical but for the model folder). Sets: RULER-HQA-style contexts at every "
        "N, "
        f"and plain HotpotQA dev (each question's own paragraphs, {cfg.data.questions or 'all'} questions).",
        "",
        f"Chunk {budgets.chunk_tokens} tokens, at most {budgets.max_chunks} chunks, memory {budgets.memory_tokens} "
        "tokens "
        f"(hard limit after every update), memory update at most {budgets.policy_tokens} tokens, answer "
        f"{budgets.answer_tokens} "
        f"tokens; tokenizer `{any_summary.tokenizer}`; prompt version `{any_summary.prompt_version}`; evaluator "
        f"`{any_summary.evaluator_version}`; reader sampling temperature {sampling['temperature']}, top_p "
        f"{sampling['top_p']}.",
        "",
        table,
        "",
        "The reader is asked for `\\boxed{}`: sub_em, em and f1 score the boxed answer only (a reply without a box "
        "scores 0, "
        "as in MemAgent's evaluator). sub_em: after normalization, the gold answer is contained in the prediction or "
        "the "
        "prediction in the gold answer (containment either way; MemAgent's metric); boxed_em: exact match of the boxed "
        "answer; sub_em_lenient: sub_em of the tolerant parse (first line when there is no box), for comparison only. "
        "Empty predictions and failed requests score 0 and stay in the denominator.",
        "",
        "## Base vs trained",
        "",
        f"Paired bootstrap ({settings.bootstrap_resamples} resamples, seed {settings.seed}) over the questions both "
        "runs "
        "scored.",
        "",
        delta_md,
        "",
        "## Acceptance criteria",
        "",
        *[f"- {v['line']}" for v in verdicts],
        "",
        f"Overall: {overall} (PASS needs trained > base with the CI excluding 0; NOT USABLE runs decide nothing).",
        "",
    ]
    if notes:
        lines += ["## Disclosures", "", *notes, ""]
    if rewards.get("steps"):
        lines += [
            "## Training reward",
            "",
            f"{rewards['steps']} GRPO steps, mean reward {rewards['first']:.4f} at step 1, "
            f"{rewards['last']:.4f} at the last step (per step: `rewards.md`; curve: `reward_curve.png`).",
            "",
            "![reward curve](reward_curve.png)",
            "",
        ]
        if rewards["no_signal_steps"] == rewards["steps"]:
            still = " and the adapter's gradient was 0 throughout" if rewards["grad_norm_max"] == 0 else ""
            lines += [
                f"NO LEARNING SIGNAL: in all {rewards['steps']} steps every group's rollouts had the same reward, so "
                f"every advantage was 0{still} (largest gradient norm {rewards['grad_norm_max']}).",
                "",
            ]
    report = {
        "rows": rows,
        "table": table,
        "deltas": deltas,
        "deltas_table": delta_md,
        "verdicts": verdicts,
        "overall": overall,
        "rewards": rewards,
        "notes": notes,
        "data": {f"{c}/{name}": s.data for c, by_set in summaries.items() for name, s in by_set.items()},
    }
    (out / "report.md").write_text("\n".join(lines), encoding="utf-8")
    write_json(out / "report.json", report)
    return report

"""The report of ``memsearch pipeline memory-policy``: ``report.md``, ``report.json`` and ``curves.png``.

Every number is read from the runs' own files (each group's ``summary.json`` and
``metrics.jsonl``, each trainer's ``train_log.jsonl``), nothing typed by hand. Per seed: the
A-D table (memory backend that wrote each group's memory, metrics, disclosures: incomplete runs,
request errors, truncation, memory-call invalid rate) and the paired bootstrap difference of
every pair that isolates one change (B-A, D-C: trained vs base memory; C-A, D-B: controller).
A run that is incomplete or had request errors is marked NOT USABLE and its differences are
not a result. ``curves.png``: SFT loss and GRPO reward per step (and stage 1's decision entropy
and ADD / NOOP shares, where its log has them), mean over seeds with a
min-max band.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memsearch.eval.caveats import caveats
from memsearch.eval.run_diff import paired_difference, per_task_metrics
from memsearch.io import write_json
from memsearch.records.run_summary import RunSummary
from memsearch.records.train_step import read_train_log

GROUPS = ("A", "B", "C", "D")
PAIRS = (("B", "A"), ("D", "C"), ("C", "A"), ("D", "B"))
METRICS = ("memory_support_recall", "memory_support_precision", "f1", "em", "invalid_action_rate", "searches")
DIFF_METRICS = ("memory_support_recall", "f1", "em")


def _group_row(folder: Path, group: str) -> dict[str, Any]:
    s = RunSummary.read(folder / group / "summary.json")
    run = json.loads((folder / group / "run.json").read_text())
    # The backend that wrote the memory as the summary records it, and its weights by content (run.json).
    return {
        "group": group,
        "memory_backend": s.memory_backend.to_json(),
        "memory_identity": run["models"]["memory"],
        # Only a policy controller consults its backend; fixed-plan groups (A/B) show "fixed".
        "controller_backend": s.config["backends"]["controller"]
        if s.agent["controller"] == "policy"
        else {"kind": "fixed"},
        **{m: s.metrics.get(m) for m in METRICS},
        "questions": s.tasks.scored,
        "expected": s.tasks.expected,
        "request_errors": s.request_errors,
        "memory_truncations": s.memory_truncations,
        "complete": s.complete,
        "usable_for_comparison": s.usable_for_comparison,
        "note": s.note,
    }


def seed_section(cfg, seed: dict[str, Any]) -> dict[str, Any]:
    """The rows and paired differences of one seed's matrix."""
    folder = seed["root"] / "matrix"
    rows = [_group_row(folder, g) for g in GROUPS]
    per_task = {g: per_task_metrics(folder / g / "metrics.jsonl") for g in GROUPS}
    usable = {r["group"]: r["usable_for_comparison"] for r in rows}
    diffs = []
    for a, b in PAIRS:
        for metric in DIFF_METRICS:
            d = paired_difference(
                per_task[b], per_task[a], metric, cfg.report.bootstrap_resamples, cfg.report.confidence, cfg.report.seed
            )
            diffs.append({"pair": f"{a}-{b}", "metric": metric, "usable": usable[a] and usable[b], **(d or {})})
    configs = {g: RunSummary.read(folder / g / "summary.json").config for g in GROUPS}
    return {"seed": seed["seed"], "rows": rows, "diffs": diffs, "stage2": seed["stage2"], "caveats": caveats(configs)}


def format_cell(v: Any) -> str:
    """A table cell: "-" for none, yes / NO for a check, three decimals for a figure."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def usable_cell(row: dict[str, Any]) -> str:
    """A row's "usable" cell: ``INCOMPLETE`` when tasks failed or are missing (the same command
    retries them), else yes / NO."""
    return "INCOMPLETE" if not row.get("complete", True) else format_cell(row["usable_for_comparison"])


def _backend(b: dict[str, Any]) -> str:
    return b["kind"] if b["kind"] in ("rules", "oracle", "fixed") else f"{b['kind']}:{Path(b['model']).name}"


def _reward(table) -> str:
    """The reward settings of a GRPO table (``config.GRPOTable``), defaults included."""
    return ", ".join(f"{k} = {v}" for k, v in table.reward.model_dump().items())


def _diff_line(name: str, metric: str, d: dict[str, Any] | None, usable: bool = True) -> str:
    if not d or "diff" not in d:
        return f"| {name} | {metric} | - | - | - | - | 0 | {format_cell(usable)} |"
    return (
        f"| {name} | {metric} | {d['mean_a']:.3f} | {d['mean_b']:.3f} | {d['diff']:+.3f} | "
        f"[{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] | {d['n']} | {'yes' if usable else 'NOT USABLE'} |"
    )


def render_heldout(cfg, comparison: dict[str, Any]) -> list[str]:
    """The held-out comparison of memory policies (``pipeline.heldout``) as markdown lines."""
    from memsearch.pipelines.memory_policy.heldout import DIFF_METRICS

    cols = (
        "policy",
        "memory support recall",
        "retrieval support recall",
        "F1",
        "EM",
        "memory-call invalid rate",
        "invalid calls by cause",
        "ADD / UPDATE / DELETE / NOOP",
        "questions",
        "usable",
    )
    lines = [
        "## Memory policies on the held-out questions (group B)",
        "",
        f"Decision memory, fixed plan, the same reader and budgets; {comparison['questions']} held-out dev questions. "
        "base = the untrained model in schema mode; rules = the rules memory heuristic; sft / grpo = the seed's SFT "
        f"adapter / merged stage-1 model (schema mode: {format_cell(comparison['schema_mode'])}). GRPO reward: "
        + ", ".join(f"{k} = {v}" for k, v in comparison["reward"].items())
        + ".",
        "",
    ]
    if comparison.get("not_run"):  # a cold start: stage 1 from the base model, no SFT
        lines += [
            f"Cold start (grpo_start = {comparison['grpo_start']}): GRPO stage 1 started from the base model; "
            f"not run: {', '.join(comparison['not_run'])} (its rows and the differences that need it are absent).",
            "",
        ]
    shared = comparison["policies"]["shared"]
    for seed, rows in comparison["policies"]["seeds"].items():
        lines += [f"### Seed {seed}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for policy, r in {**shared, **rows}.items():
            calls = r["memory_calls"]
            ops = " / ".join(str(calls["ops_executed"][k]) for k in ("ADD", "UPDATE", "DELETE", "NOOP"))
            lines.append(
                "| "
                + " | ".join(
                    [
                        policy,
                        *(format_cell(r[m]) for m in ("memory_support_recall", "retrieval_support_recall", "f1", "em")),
                        format_cell(calls["invalid_rate"]),
                        _invalid_cell(calls["invalid"]),
                        ops,
                        str(r["questions"]),
                        usable_cell(r),
                    ]
                )
                + " |"
            )
        lines += ["", "| policy | gold kept share | junk ids / call | overflow rate | stores in gold calls "
                  "| stores in other calls | calls with ADD | calls with NOOP |", "|---|---|---|---|---|---|---|---|"]
        for policy, r in {**shared, **rows}.items():
            dec, calls = r.get("decisions") or {}, r["memory_calls"]
            with_op = calls.get("calls_with") or {}  # absent in summaries written before it was counted
            share = {op: with_op[op] / calls["calls"] if calls["calls"] and op in with_op else None
                     for op in ("ADD", "NOOP")}
            lines.append(f"| {policy} | " + " | ".join(format_cell(v) for v in (
                dec.get("gold_kept_share"), dec.get("junk_ids_per_call"), dec.get("overflow_rate"),
                dec.get("store_rate_gold_calls"), dec.get("store_rate_other_calls"),
                share["ADD"], share["NOOP"])) + " |")
        lines += _gold_call_table({**shared, **rows})
        lines += ["", "| pair | metric | a | b | a - b | CI | n | usable |", "|---|---|---|---|---|---|---|---|"]
        for pair, metrics in comparison["per_seed"][seed].items():
            lines += [_diff_line(pair, m, metrics[m], metrics[m]["usable"]) for m in DIFF_METRICS]
        lines.append("")
    lines += [
        "### Over seeds (per-question mean over the seeds)",
        "",
        "| pair | metric | a | b | a - b | CI | n | usable |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for pair, metrics in comparison["over_seeds"].items():
        lines += [_diff_line(pair, m, metrics[m]) for m in DIFF_METRICS]
    lines.append("")
    return lines


def _invalid_cell(invalid: dict[str, int]) -> str:
    """The invalid calls of a row as ``cause count`` pairs, those that occurred: a summary counts
    them per cause code (``heldout.INVALID_KEYS``), one written before in four groups; both read."""
    found = [f"{cause} {n}" for cause, n in invalid.items() if n]
    return ", ".join(found) if found else "0"


def _stage2_memory(cfg) -> str:
    s2 = cfg.stage2
    if s2.memory_serving == "in_process":
        return "its rollouts' memory was the stage-1 model in process."
    if cfg.stage1_serving == "http" and not s2.memory_url:
        return (f"its rollouts' memory, the held-out grpo row and B/D: the stage-1 folder served over HTTP on port "
                f"{s2.serve_port}, one server per seed (stage1_serving = 'http').")
    if s2.memory_url:
        return (
            f"its rollouts' memory was served over HTTP at `{s2.memory_url}` as `{s2.memory_model}` "
            "(a server the user ran; which weights it served is not verified)."
        )
    return ("its rollouts' memory was the stage-1 folder served over HTTP by `transformers serve` "
            "(launched by the pipeline).")


def _stage2_start(cfg) -> str:
    if cfg.stage2.start == "sft":
        return (
            f"the seed's SFT of the controller on the teacher's controller rows (`teacher2`: "
            f"{cfg.stage2.teacher.kind} controller, {cfg.teacher.kind} memory)"
        )
    return "a fresh LoRA on the base model (no controller SFT)"


def render(cfg, sections: list[dict[str, Any]], comparison: dict[str, Any] | None = None) -> str:
    """The markdown of the report (also returned as ``table``)."""
    lines = [
        "# Memory-policy pipeline",
        "",
        f"Base model `{cfg.model}`, seeds {cfg.seeds}; held-out dev: the first {cfg.data.dev_questions} questions of "
        f"`{cfg.data.dev}` (never used for training or early stopping). A/C write memory with the untrained base "
        "(`backends.baseline_memory`), B/D with the stage-1 model.",
        "",
        f"GRPO stage 1 reward: {_reward(cfg.grpo)}.",
        "",
        "GRPO stage 1 starts from: "
        + (
            "the seed's SFT adapter."
            if cfg.grpo_start == "sft"
            else "**the base model** (cold start, grpo_start = base: no teacher, no SFT)."
        ),
        "",
        "Stage 2 (controller GRPO): "
        + (
            f"on: C/D use the stage-2 controller, trained from {_stage2_start(cfg)}; {_stage2_memory(cfg)}"
            if cfg.stage2.enabled
            else "**skipped**: C/D use the untrained base controller."
        ),
        "",
    ]
    if comparison is not None:
        lines += render_heldout(cfg, comparison)
    cols = (
        "group",
        "memory backend",
        "controller",
        *METRICS,
        "questions",
        "request errors",
        "memory truncations",
        "complete",
        "usable",
    )
    for sec in sections:
        lines += [
            f"## Seed {sec['seed']}: the A-D matrix",
            "",
            "| " + " | ".join(cols) + " |",
            "|" + "---|" * len(cols),
        ]
        for r in sec["rows"]:
            lines.append(
                "| "
                + " | ".join(
                    [
                        r["group"],
                        _backend(r["memory_backend"]),
                        _backend(r["controller_backend"]),
                        *(format_cell(r[m]) for m in METRICS),
                        f"{r['questions']}/{r['expected']}",
                        str(r["request_errors"]),
                        str(r["memory_truncations"]),
                        format_cell(r["complete"]),
                        usable_cell(r),
                    ]
                )
                + " |"
            )
        notes = [f"- {r['group']}: {r['note']}" for r in sec["rows"] if r["note"]]
        lines += [
            "",
            *notes,
            "" if notes else "",
            f"Paired bootstrap differences ({cfg.report.confidence:.0%} CI, {cfg.report.bootstrap_resamples} "
            "resamples):",
            "",
            "| pair | metric | a | b | a - b | CI | n | usable |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += [_diff_line(d["pair"], d["metric"], d, d["usable"]) for d in sec["diffs"]]
        lines.append("")
    # What the rows are not (eval.caveats), once for every seed.
    notes = list(dict.fromkeys(c for sec in sections for c in sec.get("caveats", [])))
    lines += ["Caveats:", "", *[f"- {c}" for c in notes], ""] if notes else []
    lines += ["![training curves](curves.png)", "", "Curves: mean over seeds with a min-max band."]
    return "\n".join(lines) + "\n"


def plot_curves(logs: dict[str, list[Path]], png: Path) -> Path:
    """One panel per entry of ``logs`` (``name`` or ``name:key``): SFT loss, GRPO reward per step
    and, with a validation split, GRPO's periodic validation metric; mean over seeds, min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from memsearch.report.training import with_op_shares
    from memsearch.train.log import read_log

    cols = min(3, len(logs))  # a grid, so seven panels stay readable
    rows = -(-len(logs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), dpi=110, squeeze=False)
    for ax in axes.flat[len(logs) :]:
        ax.set_visible(False)
    for ax, (name, paths) in zip(axes.flat, logs.items()):
        name, key = name.split(":") if ":" in name else (name, "loss" if name.startswith("sft") else "reward_mean")
        runs = [{r["step"]: r[key] for r in map(with_op_shares, read_log(p)) if r.get(key) is not None}
                for p in paths if p.is_file()]
        # Every step some seed logged (a periodic evaluation may fall on other steps in another seed's
        # run); the mean and band are over the seeds that have the step.
        steps = sorted(set().union(*(set(r) for r in runs))) if runs else []
        values = [[r[s] for r in runs if s in r] for s in steps]
        ax.plot(steps, [sum(v) / len(v) for v in values], marker="o", label=f"mean of up to {len(runs)} seed(s)")
        ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], alpha=0.25, label="min-max")
        ax.set_title(name if key in ("loss", "reward_mean") else f"{name}: validation {key.removeprefix('eval_')}"
                     if key.startswith("eval_") else f"{name}: {key}")
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return png


def write_mp_report(
    cfg, out: Path, seeds: list[dict[str, Any]], comparison: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Write ``report.md``, ``report.json`` and ``curves.png``; returns the report."""
    sections = [seed_section(cfg, s) for s in seeds if s.get("matrix") is not None]
    panels = {n: [s["logs"][n] for s in seeds] for n in seeds[0]["logs"]}
    if cfg.data.val_questions:  # the periodic evaluation on the validation split, per GRPO stage
        for n in [n for n in panels if n.startswith("grpo")]:
            for key in ("eval_memory_support_recall", "eval_f1"):
                panels[f"{n}:{key}"] = panels[n]
    # The decision view of the memory stage (train.grpo.decisions), where its logs have it.
    for n in [n for n in panels if n == "grpo1"]:
        if any(p.is_file() and any(step.decision_entropy is not None for step in read_train_log(p))
               for p in panels[n]):
            for key in ("decision_entropy", "op_share/ADD", "op_share/NOOP"):
                panels[f"{n}:{key}"] = panels[n]
    plot_curves(panels, out / "curves.png")
    times = stage_times(out)
    table = render(cfg, sections, comparison) + render_stage_times(times)
    from memsearch.pipelines.unfinished import unfinished_stages

    if unfinished := unfinished_stages(out):  # said first: no number below is a result
        table = table.replace("# Memory-policy pipeline\n", "# Memory-policy pipeline\n\n**INCOMPLETE**: stage(s) "
                              f"{', '.join(unfinished)} have failed or missing tasks (their rows: INCOMPLETE); not a "
                              "result. The same command retries only those tasks.\n", 1)
    heldout_usable = comparison is None or all(
        r["usable_for_comparison"]
        for rows in (comparison["policies"]["shared"], *comparison["policies"]["seeds"].values())
        for r in rows.values()
    )
    report = {
        "seeds": sections,
        "stage2": cfg.stage2.enabled,
        "heldout": comparison and {k: comparison[k] for k in ("per_seed", "over_seeds")},
        "stage_times": times,
        "unfinished_stages": unfinished,
        "usable_for_comparison": not unfinished and heldout_usable
        and all(r["usable_for_comparison"] for s in sections for r in s["rows"]),
    }
    write_json(out / "report.json", report)
    (out / "report.md").write_text(table, encoding="utf-8")
    return {**report, "table": table}


def _gold_call_table(rows: dict[str, Any]) -> list[str]:
    """What each policy did in the calls that showed it a gold sentence (``decision_rates``);
    none in summaries written before the outcomes were counted."""
    from memsearch.pipelines.memory_policy.heldout import GOLD_CALL_OUTCOMES

    counted = {p: r["decisions"]["gold_call_outcomes"] for p, r in rows.items()
               if "gold_call_outcomes" in (r.get("decisions") or {})}
    if not counted:
        return []
    lines = ["", "Calls that showed a gold sentence the memory did not hold, by what the call did:", "",
             "| policy | " + " | ".join(o.replace("_", " ") for o in GOLD_CALL_OUTCOMES) + " |",
             "|---|" + "---|" * len(GOLD_CALL_OUTCOMES)]
    for policy, outcomes in counted.items():
        lines.append(f"| {policy} | " + " | ".join(str(outcomes[o]) for o in GOLD_CALL_OUTCOMES) + " |")
    return lines


def stage_times(out: Path) -> list[dict[str, Any]]:
    """What each finished stage of the run folder ``out`` took, from its ``*.stage.json`` record:
    the span from its first start to its finish (an interrupted stage resumes under its first
    ``started``, so the span includes the interruption) and, for a trainer, the sum of its logged
    ``step_s`` (the steps' own time: an interruption adds nothing to it). Ordered by start."""
    from datetime import datetime

    rows = []
    for path in out.rglob("*.stage.json"):
        record = json.loads(path.read_text(encoding="utf-8"))
        if not record.get("complete") or not record.get("started") or not record.get("finished"):
            continue
        start, end = (datetime.strptime(record[k], "%Y-%m-%dT%H:%M:%S%z") for k in ("started", "finished"))
        log = path.parent / path.name.removesuffix(".stage.json") / "train_log.jsonl"
        steps = sum(step.step_s or 0.0 for step in read_train_log(log)) if log.is_file() else None
        rows.append({"stage": str(path.relative_to(out)).removesuffix(".stage.json"), "started": record["started"],
                     "span_s": (end - start).total_seconds(), "step_s": steps,
                     "collapse": (record.get("outputs") or {}).get("collapse")})
    return sorted(rows, key=lambda r: (r["started"], r["stage"]))


def render_stage_times(times: list[dict[str, Any]]) -> str:
    """The report's section on ``stage_times``."""
    if not times:
        return ""
    lines = ["", "## What each stage took", "",
             "From each stage's record: first start to finish (an interrupted stage's span includes the "
             "interruption), and for trainers the sum of the logged step times.", "",
             "| stage | started | first start to finish | trainer steps |", "|---|---|---|---|"]
    for t in times:
        steps = "" if t["step_s"] is None else f"{t['step_s'] / 60:.1f} min"
        lines.append(f"| {t['stage']} | {t['started']} | {t['span_s'] / 60:.1f} min | {steps} |")
    # A stage the collapse guard stopped and the pipeline scored at a checkpoint (on_collapse =
    # "score_last_checkpoint") did not end normally: every reader of the report must see that.
    stopped = [t for t in times if t.get("collapse")]
    if stopped:
        lines += ["", "## Stages the collapse guard stopped", "",
                  "Finished with the adapter of their newest checkpoint (on_collapse = 'score_last_checkpoint'); "
                  "their held-out rows are that checkpoint's.", ""]
        lines += [f"- {t['stage']}: stopped at step {t['collapse']['step']} ({t['collapse']['reason']}); scored "
                  f"{t['collapse']['checkpoint']}" for t in stopped]
    return "\n".join(lines) + "\n"

"""The verdict of a run's registered bar on its held-out comparison.

    uv run python -m studies.memory_policy.verdict docs/results/memory_policy_cpu_v3 [--from-metrics]
    uv run python -m studies.memory_policy.verdict runs/mp-v4 --bar pooled_extractive [--out verdict.json]

FOLDER is a results folder or a pipeline run folder (``studies.memory_policy.published``). A
folder that ``studies/protocols.toml`` registers is judged by its registered bar and no other
(``--bar`` may only repeat it); one registered without a bar has no verdict. An unregistered run
(a new run under runs/) names its bar with ``--bar``: register it in protocols.toml, with the
commit that fixes it, before the held-out rows run. ``--from-metrics`` re-derives the comparison
from the per-question metrics first (the published figures then stand on their own records).

Prints the study's held-out table (invalid calls in ``published.HELDOUT_GROUPS``), then the verdict
and every check with the figures it read; where the summary still holds the verdict the pipeline
once wrote beside it, says whether the two agree. ``--out`` writes the verdict as JSON (never
over an existing file).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from memsearch.errors import InputError
from memsearch.pipelines.memory_policy.report import format_cell
from studies.memory_policy import bar as bars
from studies.memory_policy.published import HELDOUT_GROUPS, group_invalid, read_summary, rederive
from studies.protocols import registered


def table_lines(comparison: dict[str, Any]) -> list[str]:
    """Per seed, each policy's recall / precision / F1, invalid calls by group and calls with ADD /
    NOOP; then each seed's grpo - rules and grpo - sft recall and the pooled differences."""
    lines = ["| seed | policy | memory support recall | precision | F1 | "
             + " | ".join(f"invalid: {g}" for g in HELDOUT_GROUPS) + " | calls with ADD / NOOP / all |",
             "|---" * (6 + len(HELDOUT_GROUPS)) + "|"]
    shared = comparison["policies"]["shared"]
    for seed, rows in comparison["policies"]["seeds"].items():
        for policy, r in {**shared, **rows}.items():
            calls = r["memory_calls"]
            with_op = calls.get("calls_with") or {}  # absent in summaries written before it was counted
            ops = f"{with_op.get('ADD', '-')} / {with_op.get('NOOP', '-')} / {calls['calls']}"
            lines.append(f"| {seed} | {policy} | " + " | ".join(format_cell(r.get(m)) for m in (
                "memory_support_recall", "memory_support_precision", "f1"))
                + " | " + " | ".join(str(n) for n in group_invalid(calls["invalid"]).values()) + f" | {ops} |")
    lines += ["", "| difference | memory support recall | F1 |", "|---|---|---|"]
    diffs = [(f"seed {s} {pair}", d) for s, pairs in comparison["per_seed"].items() for pair, d in pairs.items()
             if pair in ("grpo-rules", "grpo-sft")]
    diffs += [(f"pooled {pair}", d) for pair, d in comparison["over_seeds"].items()]
    for name, d in diffs:
        lines.append(f"| {name} | " + " | ".join(_diff(d.get(m)) for m in ("memory_support_recall", "f1")) + " |")
    return lines


def _diff(d: dict[str, Any] | None) -> str:
    if not d or "diff" not in d:
        return "-"
    return f"{d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"


def verdict_lines(bar: dict[str, Any]) -> list[str]:
    """The bar's verdict, per seed, and each check of a pooled bar with the figures it read."""
    on_sft = "not run (no SFT)" if bar["grpo_improves_on_sft"] is None else format_cell(bar["grpo_improves_on_sft"])
    lines = [f"Bar {bar['name']} ({bar['criterion']}): **{'holds' if bar['holds'] else 'does not hold'}** "
             f"(per seed: {', '.join(f'{s}: {format_cell(v)}' for s, v in bar['per_seed'].items())}); GRPO improves on "
             f"SFT over seeds with a CI above 0: {on_sft}."]
    if "checks" in bar:
        lines += ["", "| check | holds | figures |", "|---|---|---|"]
        lines += [f"| {name} | {format_cell(c['holds'])} | "
                  + ", ".join(f"{k} = {format_cell(v)}" for k, v in c.items() if k != "holds") + " |"
                  for name, c in bar["checks"].items()]
    return lines


def bar_of(folder: Path, asked: str | None) -> str:
    """The bar that judges ``folder``: its registered one, else ``asked`` (module doc)."""
    protocol = registered(folder)
    if protocol is not None:
        if protocol.bar is None:
            raise InputError(f"{folder}: no bar was registered for it before its numbers ({protocol.name} in "
                             "studies/protocols.toml); it has no verdict")
        if asked is not None and asked != protocol.bar:
            raise InputError(f"{folder}: its registered bar is {protocol.bar!r} ({protocol.name} in "
                             f"studies/protocols.toml); {asked!r} is not its verdict")
        return protocol.bar
    if asked is None:
        raise InputError(f"{folder}: no protocol registers it; name its bar with --bar ({', '.join(bars.BARS)})")
    return asked


def main(argv: list[str] | None = None) -> int:
    """``python -m studies.memory_policy.verdict FOLDER [--bar NAME] [--from-metrics] [--out FILE]``."""
    parser = argparse.ArgumentParser(description="The verdict of a run's registered bar on its held-out comparison.")
    parser.add_argument("folder", type=Path, help="a results folder (docs/results/...) or a pipeline run folder")
    parser.add_argument("--bar", choices=bars.BARS, default=None, help="the bar of an unregistered run")
    parser.add_argument("--from-metrics", action="store_true",
                        help="re-derive the differences and row means from the per-question metrics first")
    parser.add_argument("--out", type=Path, default=None, help="write the verdict here as JSON (must not exist)")
    args = parser.parse_args(argv)
    try:
        name = bar_of(args.folder, args.bar)
        if args.out is not None and args.out.exists():
            raise InputError(f"{args.out} exists; choose another --out (a verdict is never overwritten)")
        summary = read_summary(args.folder)
        comparison = rederive(args.folder) if args.from_metrics else summary
        verdict = bars.evaluate(name, comparison["per_seed"], comparison["over_seeds"],
                                comparison["policies"]["shared"], comparison["policies"]["seeds"])
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join([*table_lines(comparison), "", *verdict_lines(verdict)]))
    if "bar" in summary:  # the verdict the pipeline wrote when it still judged a bar
        agrees = summary["bar"]["holds"] == verdict["holds"]
        print(f"\nsummary.json's own verdict: {'holds' if summary['bar']['holds'] else 'does not hold'} "
              f"({'the same' if agrees else 'DIFFERENT'})")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(verdict, indent=1, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

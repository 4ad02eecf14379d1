"""The bar a trained memory policy must clear on the held-out questions (group B).

A bar is fixed before the held-out numbers of its recipe exist (a results folder's
``PROTOCOL.md`` names it), so its thresholds are constants here, not config fields; which bar
judges which published run is registered in ``studies/protocols.toml``. The pipeline writes the
comparison (``memsearch.pipelines.memory_policy.heldout``); a bar reads it: the differences per
seed and over seeds, the shared rows and each seed's rows as ``summary.json`` holds them.
``python -m studies.memory_policy.verdict`` prints a run's verdict.

``recall_every_seed`` (recipe v1, docs/results/memory_policy_cpu/): for every seed, grpo - rules
on memory support recall has a paired bootstrap CI above 0.

``pooled`` (recipe v2, docs/results/memory_policy_cpu_v2/PROTOCOL.md): every check below holds.
"Pooled" differences take, per question, the mean over the seeds and bootstrap over questions.

- ``recall_pooled``: grpo - rules, memory support recall, pooled: CI low above 0;
- ``recall_each_seed``: each seed's grpo - rules point estimate above 0;
- ``recall_over_sft``: grpo - sft, memory support recall, pooled: CI low above 0;
- ``precision``: in every seed grpo's memory support precision >= rules' - ``PRECISION_MARGIN``
  (a memory that cites nothing has no precision: the check fails);
- ``f1``: grpo - rules, F1, pooled: CI low above ``F1_FLOOR`` (no loss in answers);
- ``ops_each_seed``: in every seed ADD and NOOP each appear in at least ``MIN_OP_SHARE`` of
  grpo's held-out memory calls (no collapse to one operation);
- ``overflow_each_seed``: in every seed grpo's over-budget rate (calls rejected for
  overflowing the memory budget / calls) is below sft's.

``pooled_extractive`` (recipe v3, docs/results/memory_policy_cpu_v3/PROTOCOL.md): ``pooled`` for
the extractive format, whose constrained decoding cannot sample an op that overflows, so both
rates are 0 by construction and "below sft's" could never hold: ``overflow_each_seed`` reads
"grpo's over-budget rate is 0 in every seed" (it fails only if the constraint does).

Each check records the numbers it read, so ``summary.json`` shows why it holds or not.
"""

from __future__ import annotations

from typing import Any

BARS = ("recall_every_seed", "pooled", "pooled_extractive")
RECALL = "memory_support_recall"
PRECISION_MARGIN = 0.05
F1_FLOOR = -0.03
MIN_OP_SHARE = 0.10


def _ci_low(diff: dict[str, Any] | None) -> float | None:
    return None if not diff else diff.get("ci_low")


def _above(value: float | None, threshold: float) -> bool:
    return value is not None and value > threshold


def recall_every_seed(per_seed: dict[int, dict[str, Any]], over: dict[str, Any]) -> dict[str, Any]:
    """Recipe v1's bar (module doc)."""
    bar = {"name": "recall_every_seed",
           "criterion": "for every seed, grpo - rules on memory_support_recall has a paired bootstrap CI above 0",
           "per_seed": {s: bool(_above(_ci_low(d["grpo-rules"][RECALL]), 0) and d["grpo-rules"][RECALL]["usable"])
                        for s, d in per_seed.items()}}
    bar["holds"] = bool(per_seed) and all(bar["per_seed"].values())
    # None after a cold start: there is no SFT model to improve on.
    grpo_sft = over.get("grpo-sft")
    bar["grpo_improves_on_sft"] = _above(_ci_low(grpo_sft[RECALL]), 0) if grpo_sft is not None else None
    return bar


def _call_share(row: dict[str, Any], key: str) -> float | None:
    calls = row["memory_calls"]
    count = calls["calls_with"][key] if key in calls["calls_with"] else calls["invalid"][key]
    return count / calls["calls"] if calls["calls"] else None


def _seed_figures(diff: dict[str, Any], rows: dict[str, Any], rules_precision: float | None,
                  extractive: bool) -> dict[str, Any]:
    """One seed's figures for the per-seed checks of ``pooled`` and whether each holds."""
    point = (diff["grpo-rules"][RECALL] or {}).get("diff")
    precision = rows["grpo"]["memory_support_precision"]
    shares = {op: _call_share(rows["grpo"], op) for op in ("ADD", "NOOP")}
    overflow = {p: _call_share(rows[p], "over_budget") if p in rows else None for p in ("grpo", "sft")}
    return {
        "figures": {"recall_diff": point, "precision": precision, "call_share": shares, "over_budget_rate": overflow},
        "recall_each_seed": _above(point, 0),
        # the margin's float round-off must not fail a precision exactly at rules - margin
        "precision": rules_precision is not None and _above(precision, rules_precision - PRECISION_MARGIN - 1e-12),
        "ops_each_seed": all(v is not None and v >= MIN_OP_SHARE for v in shares.values()),
        "overflow_each_seed": (overflow["grpo"] == 0 if extractive
                               else None not in overflow.values() and overflow["grpo"] < overflow["sft"]),
    }


def pooled(per_seed: dict[int, dict[str, Any]], over: dict[str, Any], shared: dict[str, Any],
           seeds: dict[int, dict[str, Any]], extractive: bool = False) -> dict[str, Any]:
    """Recipe v2's bar (module doc): every check, with the figures it read; ``extractive``: v3's."""
    rules_precision = shared["rules"]["memory_support_precision"]
    figures = {s: _seed_figures(per_seed[s], rows, rules_precision, extractive) for s, rows in seeds.items()}
    grpo_sft = over.get("grpo-sft")
    pooled_lows = {"recall_pooled": _ci_low(over["grpo-rules"][RECALL]),
                   "recall_over_sft": _ci_low(grpo_sft[RECALL]) if grpo_sft else None,
                   "f1": _ci_low(over["grpo-rules"]["f1"])}
    floors = {"recall_pooled": 0.0, "recall_over_sft": 0.0, "f1": F1_FLOOR}
    checks = {name: {"holds": _above(low, floors[name]), "ci_low": low, "above": floors[name]}
              for name, low in pooled_lows.items()}
    for name in ("recall_each_seed", "precision", "ops_each_seed", "overflow_each_seed"):
        checks[name] = {"holds": bool(figures) and all(f[name] for f in figures.values())}
    checks["precision"]["rules"] = rules_precision
    usable = bool(per_seed) and all(d["grpo-rules"][RECALL]["usable"] for d in per_seed.values())
    overflow = "over-budget rate 0 (extractive decoding)" if extractive else "over-budget rate below sft's"
    return {"name": "pooled_extractive" if extractive else "pooled",
            "criterion": "pooled grpo - rules recall CI above 0 and above 0 in each seed; pooled grpo - sft recall "
                         f"CI above 0; grpo precision >= rules - {PRECISION_MARGIN}; pooled grpo - rules F1 CI low "
                         f"above {F1_FLOOR}; ADD and NOOP each >= {MIN_OP_SHARE:.0%} of grpo's memory calls and "
                         f"{overflow}, in every seed",
            "checks": checks,
            "seed_figures": {s: f["figures"] for s, f in figures.items()},
            "usable": usable,
            "per_seed": {s: all(v for k, v in f.items() if k != "figures") for s, f in figures.items()},
            "holds": usable and all(c["holds"] for c in checks.values()),
            "grpo_improves_on_sft": checks["recall_over_sft"]["holds"] if grpo_sft else None}


def evaluate(name: str, per_seed: dict[int, dict[str, Any]], over: dict[str, Any], shared: dict[str, Any],
             seeds: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The bar ``name`` (one of ``BARS``) on the held-out comparison's differences and rows."""
    if name in ("pooled", "pooled_extractive"):
        return pooled(per_seed, over, shared, seeds, extractive=name == "pooled_extractive")
    return recall_every_seed(per_seed, over)

"""What a measured GRPO learning curve says about the training a win over a baseline would need.

    uv run python -m studies.memory_policy.learning_curve runs/mp-v3/seed-*/grpo1/train_log.jsonl \
        --baseline runs/val-rules-x-v3 [--margin 0.03] [--metric memory_support_recall] [--out FILE.json]

When a registered run does not beat the rules heuristic, its report says what it would take
(docs/results/memory_policy_cpu_v3/). The evidence is the run's own curve: each seed's greedy
validation evaluations every few GRPO steps (the ``eval_*`` rows of ``grpo1/train_log.jsonl``,
all on the same validation questions) and the baseline's figure on those questions.

The fit is a straight line in the step with one intercept per seed (least squares on the
within-seed deviations), so seeds that start at different heights do not fake a slope. Its 95 %
interval comes from the residuals (t with points - seeds - 1 degrees of freedom): the scatter
between neighbouring checkpoints, not the sampling of the questions, is what limits how well the
slope is known. From it:

- ``gap``: target - the fitted figure at the last trained step (mean over seeds), where target
  is the baseline's figure plus ``margin`` (a held-out comparison needs a lead about as large as
  its CI half-width for the CI's lower bound to clear 0);
- ``steps_at_upper``: further steps to close the gap at the slope's upper bound, the most
  optimistic slope the curve allows, so a lower bound on the steps; ``steps_at_point``: at the
  point estimate. Either is ``None`` when that slope is not above 0 (no finite number of steps
  follows from the curve), 0 when the gap is already closed;
- hours at the median measured seconds per training step (evaluations excluded).

A line through a curve that swings between behaviours is a crude model; it is the estimate the
curve supports and nothing more, and a reader sees the points it came from (``points``).

The command reads each seed's GRPO stage log (its ``eval_*`` rows) and ``--baseline``, an
evaluation run on the same validation questions (its summary.json); ``--out`` is never overwritten.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from memsearch.errors import InputError
from memsearch.records.run_summary import RunSummary
from memsearch.records.train_step import TrainStep


def _steps_of(log: Path) -> list[TrainStep]:
    from memsearch.records.train_step import read_train_log

    if not Path(log).is_file():
        raise InputError(f"{log}: no such train log (a GRPO stage's train_log.jsonl)")
    return read_train_log(log)


def log_curves(log: Path, metric: str) -> dict[str, Any]:
    """One GRPO train log's validation curve of ``metric`` (step -> value), its training-reward
    curve (step -> mean sampled reward) and its seconds per training step."""
    steps = _steps_of(log)
    validation = {s.step: float(s.evaluation[metric]) for s in steps if s.evaluation.get(metric) is not None}
    training = [s for s in steps if s.trained]
    if len(validation) < 2:
        raise InputError(f"{log}: {len(validation)} validation evaluation(s) with 'eval_{metric}'; a curve needs 2 "
                         "or more")
    return {"validation": validation, "reward": {s.step: float(s.reward_mean) for s in training},
            "step_s": [float(s.step_s) for s in training if s.step_s is not None]}


def fit_slope(series: dict[str, dict[int, float]]) -> dict[str, Any]:
    """Least-squares slope per step with one intercept per series, its 95 % t interval, and the
    fitted value at each series' last step (module doc)."""
    from scipy import stats

    deviations: list[tuple[float, float]] = []
    fitted_last: dict[str, float] = {}
    means = {}
    for name, curve in series.items():
        steps, values = list(curve), list(curve.values())
        means[name] = (statistics.fmean(steps), statistics.fmean(values))
        deviations += [(s - means[name][0], v - means[name][1]) for s, v in zip(steps, values)]
    sxx = sum(x * x for x, _ in deviations)
    df = len(deviations) - len(series) - 1
    if sxx == 0 or df < 1:
        raise InputError(f"{len(deviations)} points in {len(series)} series: too few to fit a slope with an "
                         "interval (need at least one more point than series + 1, at two or more steps)")
    slope = sum(x * y for x, y in deviations) / sxx
    residual = sum((y - slope * x) ** 2 for x, y in deviations)
    se = (residual / df / sxx) ** 0.5
    half = float(stats.t.ppf(0.975, df)) * se
    for name, curve in series.items():
        last = max(curve)
        fitted_last[name] = means[name][1] + slope * (last - means[name][0])
    return {"slope": slope, "ci": [slope - half, slope + half], "se": se, "df": df, "points": len(deviations),
            "fitted_last": fitted_last}


def _steps(gap: float, slope: float) -> float | None:
    if gap <= 0:
        return 0.0
    return gap / slope if slope > 0 else None


def estimate(logs: dict[str, Path], baseline: float, metric: str = "memory_support_recall",
             margin: float = 0.0) -> dict[str, Any]:
    """The estimate of the module doc from each seed's GRPO ``train_log.jsonl`` (name -> path)
    and the baseline's ``metric`` on the same validation questions."""
    if not logs:
        raise InputError("no train logs given")
    curves = {name: log_curves(path, metric) for name, path in logs.items()}
    fit = fit_slope({name: c["validation"] for name, c in curves.items()})
    reward_fit = fit_slope({name: c["reward"] for name, c in curves.items()})
    step_s = [s for c in curves.values() for s in c["step_s"]]
    seconds = statistics.median(step_s) if step_s else None
    target = baseline + margin
    fitted_last = statistics.fmean(fit["fitted_last"].values())
    gap = target - fitted_last
    steps = {"at_upper": _steps(gap, fit["ci"][1]), "at_point": _steps(gap, fit["slope"])}
    hours = {k: (v * seconds / 3600 if v is not None and seconds is not None else None) for k, v in steps.items()}
    return {"metric": metric, "baseline": baseline, "margin": margin, "target": target,
            "validation_slope": fit, "reward_slope": reward_fit, "fitted_last_mean": fitted_last, "gap": gap,
            "last_step": max(max(c["validation"]) for c in curves.values()),
            "steps_at_upper": steps["at_upper"], "steps_at_point": steps["at_point"],
            "seconds_per_step": seconds, "hours_at_upper": hours["at_upper"], "hours_at_point": hours["at_point"],
            "points": {name: c["validation"] for name, c in curves.items()}}


def describe(result: dict[str, Any]) -> list[str]:
    """The estimate in a few lines a reader can check against ``points``."""
    fit, reward = result["validation_slope"], result["reward_slope"]

    def per100(x: float) -> str:
        return f"{100 * x:+.4f}"

    def steps(value: float | None) -> str:
        return "no finite number (slope not above 0)" if value is None else f"{value:,.0f}"

    lines = [
        f"validation {result['metric']} per 100 GRPO steps: {per100(fit['slope'])} "
        f"[{per100(fit['ci'][0])}, {per100(fit['ci'][1])}] ({fit['points']} evaluations, df {fit['df']})",
        f"sampled training reward per 100 steps: {per100(reward['slope'])} "
        f"[{per100(reward['ci'][0])}, {per100(reward['ci'][1])}]",
        f"fitted {result['metric']} at step {result['last_step']}: {result['fitted_last_mean']:.4f}; target "
        f"{result['target']:.4f} (baseline {result['baseline']:.4f} + margin {result['margin']:.4f}); "
        f"gap {result['gap']:+.4f}",
        f"further steps to close it: at the slope's upper bound {steps(result['steps_at_upper'])}, "
        f"at its point estimate {steps(result['steps_at_point'])}",
    ]
    if result["seconds_per_step"] is not None:
        def hours(value: float | None) -> str:
            return "-" if value is None else f"{value:,.1f} h"
        lines.append(f"at the measured median {result['seconds_per_step']:.1f} s per training step: "
                     f"{hours(result['hours_at_upper'])} (upper bound), {hours(result['hours_at_point'])} (point)")
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m studies.memory_policy.learning_curve LOG [LOG ...] --baseline RUN [--metric M]
    [--margin X] [--out FILE]``."""
    parser = argparse.ArgumentParser(description="Estimate from measured GRPO learning curves how much more "
                                     "training a win over a baseline would need.")
    parser.add_argument("logs", type=Path, nargs="+", help="GRPO train logs (RUN/seed-N/grpo1/train_log.jsonl)")
    parser.add_argument("--baseline", type=Path, required=True,
                        help="an evaluation run on the validation questions (e.g. the rules heuristic's)")
    parser.add_argument("--metric", default="memory_support_recall", help="default: memory_support_recall")
    parser.add_argument("--margin", type=float, default=0.0,
                        help="lead over the baseline to reach (e.g. a held-out CI half-width); default 0")
    parser.add_argument("--out", type=Path, default=None, help="also write the estimate here (must not exist)")
    args = parser.parse_args(argv)
    try:
        summary_path = args.baseline / "summary.json"
        if not summary_path.is_file():
            raise InputError(f"{summary_path}: missing (--baseline takes a finished evaluation run folder)")
        summary = RunSummary.read(summary_path)
        baseline = summary.metrics.get(args.metric)
        if baseline is None:
            raise InputError(f"{summary_path}: no metrics.{args.metric}")
        if args.out is not None and args.out.exists():
            raise InputError(f"{args.out} exists; choose another --out (an estimate is never overwritten)")
        # a seed's name is its folder (RUN/seed-N/grpo1/train_log.jsonl -> seed-N)
        names = [p.parent.parent.name or str(p) for p in args.logs]
        if len(set(names)) != len(names):
            names = [str(p) for p in args.logs]
        result = estimate(dict(zip(names, args.logs)), float(baseline), args.metric, args.margin)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result["baseline_run"] = {"tasks": summary.tasks.to_json(), "data_manifest_sha256": summary.data["manifest_sha256"]}
    print(f"baseline: {args.metric} {float(baseline):.4f} on {summary.tasks.scored} questions")
    for line in describe(result):
        print(line)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

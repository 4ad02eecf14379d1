"""The held-out comparison of memory policies (group B) in ``pipeline memory-policy``.

Four memory policies write the memory of the same episodes, everything else fixed (decision
memory, the fixed plan, the same reader, budgets and held-out dev questions):

    base    the untrained base model, schema mode (constrained JSON, so it can emit operations at all)
    rules   the rules memory heuristic (``backends.rules``): the baseline a trained policy is compared with
    sft     the base model with the seed's SFT adapter
    grpo    the seed's merged stage-1 model (SFT + GRPO), in process or served (``stage1_serving``)

A cold start (``grpo_start = "base"``) trains no SFT: the ``sft`` row is not run, and every pair
and over-seeds difference that needs it is left out (``not_run`` names it).

``base`` and ``rules`` do not depend on the seed and run once (``OUT/heldout/{base,rules}``);
``sft`` and ``grpo`` run per seed (``OUT/seed-N/heldout/{sft,grpo}``). Trained policies decode
as ``schema_mode`` says (the same for GRPO's rollouts). Each run is an ordinary fingerprinted
eval run, resumed after a kill.

Per seed: the paired bootstrap difference on every question of ``PAIRS`` x ``DIFF_METRICS``;
over seeds: ``grpo - sft`` and ``grpo - rules`` on the per-question mean over seeds. The
memory role's own calls are summarised apart from the reader's (``memory_calls``): op counts
executed, invalid calls per cause code (``INVALID_KEYS``: cut at the token limit, else the
call's ``InvalidCause``), the calls that executed each op, and the per-decision rates against
the gold labels (``decisions``). ``summary.json`` holds the comparison and nothing else: whether
a result clears a bar is decided outside the library, by the study that registered the bar
before the numbers existed. Older summaries also hold a ``bar`` verdict and count invalid calls
in four groups (``over_budget``, ``truncated``, ``unshown_source``, ``other``); the report reads
both forms.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from memsearch.eval.run_diff import paired_difference, per_task_metrics
from memsearch.io import iter_jsonl, write_json
from memsearch.pipelines.eval_stage import eval_run
from memsearch.records.causes import InvalidCause
from memsearch.records.events import MemoryEvent, PolicyCall
from memsearch.records.metrics_row import MetricsRow
from memsearch.records.run_summary import RunSummary
from memsearch.records.trajectory import read_trajectories

POLICIES = ("base", "rules", "sft", "grpo")
SHARED = ("base", "rules")
PAIRS = (("grpo", "rules"), ("grpo", "sft"), ("sft", "rules"), ("sft", "base"), ("grpo", "base"))
DIFF_METRICS = ("memory_support_recall", "f1", "em")
METRICS = ("memory_support_recall", "memory_support_precision", "retrieval_support_recall", "f1", "em",
           "invalid_action_rate")
# ``memory_calls``' invalid counts: a call cut at its token limit, else its cause code. A failed
# request is no action (valid None) and is never counted here.
INVALID_KEYS = ("truncated", *(c.value for c in InvalidCause if c is not InvalidCause.REQUEST_FAILED))
GOLD_CALL_OUTCOMES = ("kept_gold", "stored_other_only", "stored_nothing", "over_budget", "invalid_other")


def policy_backend(cfg, policy: str, sft: Path | None = None, stage1: Path | None = None,
                   served: tuple[str, str] | None = None):
    """The memory backend of ``policy`` (module docstring); ``served``: the seed's stage-1 server."""
    from memsearch.config import BackendConfig
    from memsearch.pipelines.config import updated

    if policy == "rules":
        return BackendConfig.model_validate({"kind": "rules"})
    if policy == "base":
        return cfg.base_backend(schema_mode=True)
    if policy == "sft":
        return updated(cfg.base_backend(), "episode.backends.memory", adapter=str(sft))
    return cfg.stage1_backend(str(stage1), served)


def policy_config(cfg, policy: str, sft: Path | None = None, stage1: Path | None = None,
                  served: tuple[str, str] | None = None):
    return cfg._episode(memory=policy_backend(cfg, policy, sft, stage1, served), limit=None)


def _invalid_key(call: PolicyCall) -> str:
    """The count an invalid call goes to: cut at its token limit, whatever broke, else its cause code."""
    if call.finish_reason == "length":
        return "truncated"
    return (call.invalid_cause or InvalidCause.OTHER).value


def memory_calls(run: Path) -> dict[str, Any]:
    """The memory role's calls of a run: count, ops executed by kind, the calls that executed
    each kind (``calls_with``: a call with two ADDs counts once), invalid calls per ``INVALID_KEYS``."""
    calls, ops, calls_with, invalid = 0, Counter(), Counter(), Counter()
    for _, traj in read_trajectories(run / "trajectories.jsonl"):
        for call in traj.policy_calls(["memory"]):
            calls += 1
            executed = traj.executed(call)
            ops.update(executed)
            calls_with.update(op for op, n in executed.items() if n)
            if call.valid is False:
                invalid[_invalid_key(call)] += 1
    kinds = ("ADD", "UPDATE", "DELETE", "NOOP")
    return {"calls": calls, "ops_executed": {k: ops.get(k, 0) for k in kinds},
            "calls_with": {k: calls_with.get(k, 0) for k in kinds},
            "invalid": {k: invalid.get(k, 0) for k in INVALID_KEYS},
            "invalid_rate": round(sum(invalid.values()) / calls, 4) if calls else None}


def decision_rates(run: Path, gold: dict[str, set[str]]) -> dict[str, Any]:
    """Per-decision rates of the memory calls of a run against the gold supporting facts:

    - ``gold_kept_share``: of the gold sentences shown by a step's search and not yet cited by the
      memory, the share the memory cites after that step's call;
    - ``junk_ids_per_call``: ids newly cited by a call that are not gold, per memory call;
    - ``overflow_rate``: calls rejected for overflowing the memory budget, per memory call;
    - ``store_rate_gold_calls`` / ``store_rate_other_calls``: the share of calls after which the
      memory cites an id it did not before, among the calls whose search showed a gold sentence
      the memory did not yet cite ("gold calls") and among the others. Their ratio is how well
      the policy tells the two states apart; their level is how readily it stores at all (a
      greedy policy can swing the level without changing the ratio);
    - ``gold_call_outcomes``: what each gold call did, counted (``GOLD_CALL_OUTCOMES``): kept a
      shown gold sentence, stored only other ids (the wrong sentence), stored nothing, rejected
      for overflowing the memory budget, rejected for another reason. Where a policy's kept share
      falls short of another's, this says which of its moves lost the gold.

    A step's memory after its call is the next call's ``sources_before`` (the last: the
    trajectory's ``memory_cited``)."""
    shown_gold = kept = junk = overflows = calls = 0
    stored = {True: 0, False: 0}
    calls_of = {True: 0, False: 0}
    outcomes = Counter({outcome: 0 for outcome in GOLD_CALL_OUTCOMES})
    for _, traj in read_trajectories(run / "trajectories.jsonl"):
        facts = gold.get(traj.task_id, set())
        shown: dict[int, set[str]] = {}
        for search in traj.searches:
            shown.setdefault(search.step, set()).update(search.shown)
        updates = [e for e in traj.memory_events if e.sources_before is not None]
        afters = [set(e.sources_before) for e in updates[1:]] + [set(traj.memory_cited)]
        for event, after in zip(updates, afters):
            before = set(event.sources_before)
            new_gold = (shown.get(event.step, set()) & facts) - before
            shown_gold += len(new_gold)
            kept += len(new_gold & after)
            junk += len(after - before - facts)
            overflow = event.cause == InvalidCause.OVER_BUDGET
            overflows += overflow
            calls += 1
            gold_call = bool(new_gold)
            calls_of[gold_call] += 1
            stored[gold_call] += bool(after - before)
            if gold_call:
                outcomes[_gold_call_outcome(event, overflow, new_gold, after - before)] += 1
    return {"gold_shown": shown_gold, "gold_kept_share": _share(kept, shown_gold),
            "junk_ids_per_call": _share(junk, calls), "overflow_rate": _share(overflows, calls),
            "gold_calls": calls_of[True], "store_rate_gold_calls": _share(stored[True], calls_of[True]),
            "store_rate_other_calls": _share(stored[False], calls_of[False]),
            "gold_call_outcomes": dict(outcomes)}


def _gold_call_outcome(event: MemoryEvent, overflow: bool, new_gold: set[str], added: set[str]) -> str:
    if overflow:
        return "over_budget"
    if not event.valid:
        return "invalid_other"
    if new_gold & added:
        return "kept_gold"
    return "stored_other_only" if added else "stored_nothing"


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def gold_facts(data: Path) -> dict[str, set[str]]:
    """Task id -> gold supporting-fact ids of a prepared data folder (its ``labels.jsonl``)."""
    return {r["id"]: set(r["supporting_facts"]) for _, r in iter_jsonl(Path(data) / "labels.jsonl")}


def _row(run: Path, summary: RunSummary, data: Path) -> dict[str, Any]:
    return {"run": str(run), **{m: summary.metrics.get(m) for m in METRICS},
            "questions": summary.tasks.scored, "request_errors": summary.request_errors,
            "complete": summary.complete, "usable_for_comparison": summary.usable_for_comparison,
            "memory_calls": memory_calls(run), "decisions": decision_rates(run, gold_facts(data))}


def run_shared(cfg, out: Path, paths: dict[str, Any], echo=print) -> dict[str, dict[str, Any]]:
    """The seed-independent policies (base, rules) on the held-out dev questions."""
    rows = {}
    for policy in SHARED:
        folder = out / "heldout" / policy
        summary = eval_run(folder, out / "heldout" / f"{policy}.stage.json", policy_config(cfg, policy), paths["dev"],
                           {"prepare": paths["fingerprint"]}, echo)
        rows[policy] = _row(folder, summary, paths["dev"])
    return rows


def trained_policies(cfg) -> tuple[str, ...]:
    """The seed's trained policies: sft and grpo, or grpo alone after a cold start."""
    return ("sft", "grpo") if cfg.grpo_start == "sft" else ("grpo",)


def run_seed(cfg, root: Path, paths: dict[str, Any], sft: Path | None, stage1: Path, upstream: dict[str, str],
             echo=print, served: tuple[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """The seed's trained policies (sft unless a cold start, grpo) on the held-out dev questions;
    ``served``: the seed's stage-1 server (API root, served name) that answers the grpo row."""
    rows = {}
    kwargs_of = {"sft": {"sft": sft}, "grpo": {"stage1": stage1, "served": served}}
    for policy in trained_policies(cfg):
        kwargs = kwargs_of[policy]
        folder = root / "heldout" / policy
        summary = eval_run(folder, root / "heldout" / f"{policy}.stage.json", policy_config(cfg, policy, **kwargs),
                           paths["dev"], {"prepare": paths["fingerprint"], **upstream}, echo)
        rows[policy] = _row(folder, summary, paths["dev"])
    return rows


def _mean_rows(runs: list[Path]) -> dict[str, MetricsRow]:
    """Per question, each metric's mean over the runs (questions every run scored)."""
    per_run = [per_task_metrics(r / "metrics.jsonl") for r in runs]
    common = set.intersection(*(set(p) for p in per_run))
    out = {}
    for task in (t for t in per_run[0] if t in common):  # the first run's order: the bootstrap is reproducible
        means = {}
        for m in DIFF_METRICS:
            values = [p[task].column(m) for p in per_run]
            means[m] = None if None in values else sum(values) / len(values)
        out[task] = MetricsRow(task_id=task, status="ok", scores=means)
    return out


def paired_differences(shared: dict[str, Path], seeds: dict[Any, dict[str, Path]], usable: dict[Any, bool],
                       resamples: int, confidence: float, seed: int) -> tuple[dict[Any, Any], dict[str, Any]]:
    """``(per_seed, over_seeds)`` of the comparison from the runs' per-question metrics: ``shared``
    maps base / rules to their run folders, ``seeds`` each seed's sft (unless a cold start) and
    grpo run folders; ``usable[seed]``: whether every run of that seed's pairs is usable. A folder
    needs ``metrics.jsonl`` (or the ``.gz`` a results folder publishes), so a published comparison
    can be recomputed from its own records."""
    def diff(a_rows, b_rows, metric):
        return paired_difference(b_rows, a_rows, metric, resamples, confidence, seed)

    trained = tuple(p for p in ("sft", "grpo") if all(p in runs for runs in seeds.values()))
    policies = (*SHARED, *trained)
    pairs = [(a, b) for a, b in PAIRS if a in policies and b in policies]
    per_seed = {}
    for s, runs in seeds.items():
        folders = {**shared, **runs}
        per_task = {p: per_task_metrics(Path(folders[p]) / "metrics.jsonl") for p in policies}
        per_seed[s] = {f"{a}-{b}": {m: {**(diff(per_task[a], per_task[b], m) or {}), "usable": usable[s]}
                                    for m in DIFF_METRICS} for a, b in pairs}
    means = {p: _mean_rows([Path(runs[p]) for runs in seeds.values()]) for p in trained}
    rules = per_task_metrics(Path(shared["rules"]) / "metrics.jsonl")
    over = {**({"grpo-sft": {m: diff(means["grpo"], means["sft"], m) for m in DIFF_METRICS}} if "sft" in means else {}),
            "grpo-rules": {m: diff(means["grpo"], rules, m) for m in DIFF_METRICS}}
    return per_seed, over


def compare(cfg, shared: dict[str, dict[str, Any]], seeds: dict[int, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Differences per seed and over seeds; the content of ``summary.json``."""
    r = cfg.report
    policies = (*SHARED, *trained_policies(cfg))
    per_seed, over = paired_differences(
        {p: Path(shared[p]["run"]) for p in SHARED},
        {s: {p: Path(row["run"]) for p, row in rows.items()} for s, rows in seeds.items()},
        {s: all({**shared, **rows}[p]["usable_for_comparison"] for p in policies) for s, rows in seeds.items()},
        r.bootstrap_resamples, r.confidence, r.seed)
    return {
        "policies": {"shared": shared, "seeds": seeds},
        "per_seed": per_seed,
        "over_seeds": over,
        "grpo_start": cfg.grpo_start,
        "not_run": [p for p in POLICIES if p not in policies],
        "reward": cfg.grpo.reward.model_dump(),
        "schema_mode": cfg.schema_mode,
        "questions": cfg.data.dev_questions,
        "confidence": r.confidence,
        "resamples": r.bootstrap_resamples,
    }


def write_summary(out: Path, result: dict[str, Any]) -> None:
    write_json(out / "heldout" / "summary.json", json.loads(json.dumps(result, default=str)))

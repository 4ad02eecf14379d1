"""Every published result reproduces its figures from its own committed records.

docs/results/memory_policy_cpu_v3: the held-out comparison is re-derived from the published
per-question metrics (metrics.jsonl.gz) with the pipeline's own code, the registered bar is
applied to it, and both are compared with summary.json and with the figures README.md quotes.
docs/results/memagent_cpu: the training verdict is re-derived from the committed train log and
compared with report.md and rewards.md. What the records cannot give (trajectories are not
published) is read from summary.json and said so where it is used.
"""

from __future__ import annotations

import gzip
import json
import math
import shutil
from dataclasses import replace
from typing import Any

import pytest
from studies.memagent import published as memagent
from studies.memory_policy import bar as bars
from studies.memory_policy import published, verdict
from studies.protocols import ROOT, protocols, registered

from memsearch.config import load_config
from memsearch.eval.run_diff import per_task_metrics
from memsearch.pipelines.memagent.config import MemAgentPipeline
from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline

V3 = ROOT / "docs" / "results" / "memory_policy_cpu_v3"
MEMAGENT = ROOT / "docs" / "results" / "memagent_cpu"


def _close(new: Any, old: Any, where: str = "") -> list[str]:
    """Where ``new`` differs from ``old``: floats within 1e-12 (a mean recomputed from the
    per-question metrics may differ in the last bit), every other value exactly; a key the old
    record does not have is not compared (older bars wrote no ``name``)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [p for k in old for p in (_close(new[k], old[k], f"{where}.{k}") if k in new else [f"{where}.{k}"])]
    if isinstance(old, float) and isinstance(new, float):
        return [] if math.isclose(new, old, rel_tol=0, abs_tol=1e-12) else [f"{where}: {new} != {old}"]
    return [] if new == old else [f"{where}: {new!r} != {old!r}"]


@pytest.fixture(scope="module")
def v3() -> tuple[dict[str, Any], dict[str, Any]]:
    """(summary.json as committed, the comparison re-derived from the per-question metrics)."""
    return published.read_summary(V3), published.rederive(V3)


def test_every_registered_protocol_names_what_exists_and_its_config_loads():
    registry = protocols()
    assert {"memory_policy_cpu", "memory_policy_cpu_v2", "memory_policy_cpu_v3", "memagent_cpu"} <= set(registry)
    for p in registry.values():
        assert (ROOT / p.results).is_dir() and (ROOT / p.pipeline).is_file(), p.name
        assert p.bar is None or p.bar in bars.BARS, p.name
        model = MemAgentPipeline if p.study == "memagent" else MemoryPolicyPipeline
        load_config(ROOT / p.pipeline, model=model)  # no moved config keeps a `bar` the pipeline refuses
        if p.protocol_commit is not None:  # the commit as the results folder's README states it
            assert p.protocol_commit in (ROOT / p.results / "README.md").read_text(encoding="utf-8"), p.name
        assert p.protocol is None or (ROOT / p.protocol).is_file(), p.name
    assert registered(V3).bar == "pooled_extractive" and registered(MEMAGENT).bar is None
    assert registered(ROOT / "runs" / "mp-v3") is None


def test_v3_heldout_comparison_is_rederived_from_its_per_question_metrics(v3):
    summary, again = v3
    # the paired differences: the same bootstrap on the same questions gives the same numbers
    assert again["per_seed"] == summary["per_seed"] and again["over_seeds"] == summary["over_seeds"]
    # each row's metric means, from the same per-question metrics
    assert _close(again["policies"], summary["policies"]) == []
    assert again["policies"]["seeds"]["1"]["grpo"]["memory_support_recall"] == pytest.approx(0.26241667, abs=1e-8)


def test_v3_registered_bar_gives_the_published_verdict_on_the_rederived_comparison(v3):
    summary, again = v3
    bar = json.loads(json.dumps(bars.evaluate(registered(V3).bar, again["per_seed"], again["over_seeds"],
                                              again["policies"]["shared"], again["policies"]["seeds"])))
    assert _close(bar, summary["bar"]) == []
    assert bar["holds"] is False and [name for name, c in bar["checks"].items() if not c["holds"]] == [
        "recall_pooled", "recall_over_sft", "recall_each_seed", "precision"]


def _cell(d: dict[str, Any]) -> str:
    """A difference as README.md writes it: -0.040 [-0.068, -0.013]."""
    return f"{d['diff']:.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"


def _rpf(row: dict[str, Any]) -> str:
    return " / ".join(f"{row[m]:.3f}" for m in ("memory_support_recall", "memory_support_precision", "f1"))


def test_v3_readme_quotes_the_rederived_figures(v3):
    """The "Result" section's table, pooled differences, rows and checks, each rebuilt from the
    re-derived comparison and found in README.md. The calls with ADD / NOOP and the gold-call
    counts come from summary.json: they were counted from trajectories, which are not published."""
    text = " ".join((V3 / "README.md").read_text(encoding="utf-8").split())
    again = v3[1]
    seeds, shared = again["policies"]["seeds"], again["policies"]["shared"]
    for seed, rows in seeds.items():
        d = again["per_seed"][seed]
        calls = rows["grpo"]["memory_calls"]
        line = (f"| {seed} | {_rpf(rows['sft'])} | {_rpf(rows['grpo'])} | "
                f"{_cell(d['grpo-rules']['memory_support_recall'])} | "
                f"{_cell(d['grpo-sft']['memory_support_recall'])} | {calls['calls_with']['ADD']} / "
                f"{calls['calls_with']['NOOP']} of {calls['calls']} |")
        assert line in text, line
    over = again["over_seeds"]
    assert (f"GRPO - rules recall {_cell(over['grpo-rules']['memory_support_recall'])}; GRPO - SFT recall "
            f"{_cell(over['grpo-sft']['memory_support_recall'])}; GRPO - rules F1 {_cell(over['grpo-rules']['f1'])}"
            ) in text
    assert f"rules {_rpf(shared['rules'])}; base {_rpf(shared['base'])}" in text
    checks = bars.evaluate("pooled_extractive", again["per_seed"], over, shared, seeds)["checks"]
    labels = [("recall_pooled", "1 recall pooled"), ("recall_each_seed", "2 each seed"),
              ("recall_over_sft", "3 over SFT"), ("precision", "4 precision"), ("f1", "5 F1"),
              ("ops_each_seed", "6 ADD and NOOP >= 10 %"), ("overflow_each_seed", "7 over-budget rate 0")]
    for name, label in labels:
        assert f"{label} {'yes' if checks[name]['holds'] else 'NO'}" in text, label
    outcomes = {p: [seeds[s][p]["decisions"]["gold_call_outcomes"] for s in seeds] for p in ("sft", "grpo")}
    rules = shared["rules"]["decisions"]["gold_call_outcomes"]
    quoted = f"rules {rules['kept_gold']} / {rules['stored_nothing']} / {rules['stored_other_only']}"
    for policy, label in (("sft", "SFT"), ("grpo", "GRPO")):
        spans = [(min(o[k] for o in outcomes[policy]), max(o[k] for o in outcomes[policy]))
                 for k in ("kept_gold", "stored_nothing", "stored_other_only")]
        quoted += f"; {label} " + " / ".join(f"{lo}-{hi}" for lo, hi in spans)
    assert quoted in text, quoted
    v2 = published.rederive(ROOT / "docs" / "results" / "memory_policy_cpu_v2")
    assert f"(v2 {v2['over_seeds']['grpo-rules']['memory_support_recall']['diff']:.3f})" in text


def test_v3_shipped_copy_scores_as_seed_1s_heldout_grpo_row():
    """README.md: the shipped bf16 adapter re-scored (group_b_trained/) equals seed 1's float32
    held-out grpo row on all 200 questions: every per-question figure but the wall time."""
    shipped = per_task_metrics(V3 / "group_b_trained" / "metrics.jsonl")
    trained = per_task_metrics(V3 / "seed-1" / "heldout" / "grpo" / "metrics.jsonl")
    assert len(shipped) == len(trained) == 200
    for task, row in shipped.items():
        assert replace(row, latency_s=None) == replace(trained[task], latency_s=None), task


def test_a_changed_per_question_metric_no_longer_reproduces_the_published_comparison(tmp_path):
    copy = tmp_path / "v3"
    shutil.copytree(V3, copy, ignore=shutil.ignore_patterns("*.png", "pilot*", "seed-*"))
    for seed in ("1", "2", "3"):
        shutil.copytree(V3 / f"seed-{seed}" / "heldout", copy / f"seed-{seed}" / "heldout")
    packed = copy / "seed-1" / "heldout" / "grpo" / "metrics.jsonl.gz"
    rows = [json.loads(x) for x in gzip.decompress(packed.read_bytes()).decode().splitlines()]
    rows[0]["memory_support_recall"] = 1.0 - rows[0]["memory_support_recall"]
    packed.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode(), mtime=0))
    again, summary = published.rederive(copy), published.read_summary(copy)
    assert again["per_seed"]["1"]["grpo-rules"]["memory_support_recall"] != summary["per_seed"]["1"]["grpo-rules"][
        "memory_support_recall"]
    assert again["per_seed"]["2"] == summary["per_seed"]["2"]  # the other seeds are untouched


def test_the_verdict_command_applies_the_registered_bar_only(capsys, tmp_path):
    assert verdict.main([str(V3), "--from-metrics", "--out", str(tmp_path / "v.json")]) == 0
    out = capsys.readouterr().out
    assert "Bar pooled_extractive (" in out and "**does not hold**" in out and "(the same)" in out
    assert "| pooled grpo-rules | -0.029 [-0.055, -0.003] |" in out
    assert json.loads((tmp_path / "v.json").read_text())["holds"] is False
    assert verdict.main([str(V3), "--bar", "pooled"]) == 2
    assert "registered bar is 'pooled_extractive'" in capsys.readouterr().err
    ablation = ROOT / "docs" / "results" / "memory_policy_cpu" / "ablation-cold-start"
    assert verdict.main([str(ablation)]) == 2 and "no bar was registered" in capsys.readouterr().err
    assert verdict.main([str(tmp_path)]) == 2 and "name its bar with --bar" in capsys.readouterr().err


def test_memagent_training_verdict_is_rederived_from_its_train_log(tmp_path, capsys):
    """report.md says NO LEARNING SIGNAL over 4 steps with reward 0 and gradient norm 0; rewards.md
    is the per-step table. Both follow from train_log.jsonl. (The per-N table is not re-derivable:
    its evaluation runs were not published.)"""
    derived = memagent.rederive(MEMAGENT)
    assert (derived["steps"], derived["first"], derived["last"], derived["grad_norm_max"]) == (4, 0.0, 0.0, 0.0)
    assert derived["no_learning_signal"] is True
    assert memagent.claims(MEMAGENT) == {"steps": 4, "first": 0.0, "last": 0.0, "no_learning_signal": True,
                                         "grad_norm_max": 0.0}
    assert memagent.agrees(MEMAGENT) == [] and memagent.main([str(MEMAGENT)]) == 0
    # a log in which one step had a signal contradicts the published verdict
    changed = tmp_path / "memagent"
    shutil.copytree(MEMAGENT, changed, ignore=shutil.ignore_patterns("*.png"))
    log = [json.loads(x) for x in (changed / "train_log.jsonl").read_text().splitlines()]
    log[2].update(zero_variance_groups=0, grad_norm=0.5, reward_mean=0.25)
    (changed / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    problems = memagent.agrees(changed)
    assert any(p.startswith("no_learning_signal:") for p in problems) and any("rewards.md" in p for p in problems)
    assert memagent.main([str(changed)]) == 1

"""Schema mode in the text format: the episode samples memory calls under the budget-bounded
memory-ops constraint (``memory.action_format.text_ops_constraint``), so the embedded model's
answers end within ``policy_tokens`` instead of running on to the token limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.config import load_config
from memsearch.eval.runner import run_eval
from memsearch.memory.action_format import bounded_ops_constraint, constraint_by_id, memory_ops_constraint
from memsearch.records.trajectory import read_trajectories

RULES = Path(__file__).resolve().parents[2] / "configs" / "rules.toml"
SCHEMA_MODE = ['backends.memory.kind="hf"', "backends.memory.schema_mode=true"]


@pytest.mark.parametrize("policy_tokens, max_sources, expected", [
    (256, 3, bounded_ops_constraint(256, 3)),
    (512, 2, bounded_ops_constraint(512, 2)),
    (96, 3, memory_ops_constraint(3)),  # no sentence fits a bounded op: v2, as before
    (80, 3, memory_ops_constraint(3)),
])
def test_the_run_builds_the_bounded_constraint_of_its_budget(hotpot_dev_dir, policy_tokens, max_sources, expected):
    from memsearch.data.dataset import load_dataset
    from memsearch.engine.episode import _Run
    from memsearch.eval.runner import build_environment

    dataset = load_dataset(hotpot_dev_dir)
    cfg = load_config(RULES, [*SCHEMA_MODE, f"budgets.policy_tokens={policy_tokens}",
                              f"agent.memory_max_sources={max_sources}"])
    run = _Run(dataset.tasks[0], build_environment(cfg, dataset))
    assert run.ops_constraint([]) is expected
    off = load_config(RULES, [f"budgets.policy_tokens={policy_tokens}"])
    assert _Run(dataset.tasks[0], build_environment(off, dataset)).ops_constraint([]) is None


@pytest.mark.slow
def test_sampled_memory_calls_end_within_the_budget(hotpot_dev_dir, tmp_path):
    """The embedded model at T = 1 in the text format: every memory call under the bounded
    constraint stops on its own (no call runs to policy_tokens), and training can rebuild each
    call's constraint from its id and replay its masks on the sampled ids."""
    from transformers import AutoTokenizer

    from memsearch.assets.embedded import tokenizer_dir
    from memsearch.backends.hf.constraint import compile_constraint

    overrides = [*SCHEMA_MODE, "backends.memory.sampling.temperature=1.0", "budgets.policy_tokens=256",
                 "budgets.passages_per_search=1", "budgets.max_searches=2", "limit=4"]
    summary = run_eval(load_config(RULES, overrides), hotpot_dev_dir, tmp_path / "hf", show_progress=False)
    trajs = [traj for _, traj in read_trajectories(tmp_path / "hf" / "trajectories.jsonl")]
    calls = [call for traj in trajs for call in traj.policy_calls(["memory"])]
    assert summary.complete and len(calls) >= 6
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    for call in calls:
        assert call.constraint_id == bounded_ops_constraint(256, 3).id
        assert call.finish_reason == "stop" and len(call.completion_ids) <= 256, call.text
        json.loads(call.text)  # a whole JSON value, whatever the store then makes of it
        masks = compile_constraint(constraint_by_id(call.constraint_id), tok).masks_for(call.completion_ids)
        assert all(bool(masks[k, t]) for k, t in enumerate(call.completion_ids))

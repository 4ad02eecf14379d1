"""The collapse guard (``train.collapse``): which sequences of steps trip it, and a real GRPO run on
the tiny Llama that it stops with a record and a non-zero end instead of training on."""

from __future__ import annotations

import json

import pytest

from memsearch.train.collapse import CollapseError, CollapseGuard


def ops(**counts):
    base = dict.fromkeys(("ADD", "UPDATE", "DELETE", "NOOP", "invalid_parse", "invalid_budget", "invalid_rule"), 0)
    return {**base, **counts}


def feed(guard, records):
    return [guard.observe({"step": s, **r}) for s, r in enumerate(records, start=1)]


def test_low_decision_entropy_for_patience_steps_trips_it():
    guard = CollapseGuard(min_decision_entropy=0.05, max_op_share=0.95, patience=3)
    seq = [{"decision_entropy": e} for e in (0.10, 0.013, 0.007, 0.2, 0.01, 0.005, 0.004)]
    reasons = feed(guard, seq)
    # 0.013, 0.007 then 0.2 resets the count; 0.01, 0.005, 0.004 are three in a row
    assert reasons[:6] == [None] * 6
    assert reasons[6] == "decision entropy below 0.05 for 3 steps (steps 5-7: 0.0100, 0.0050, 0.0040)"
    # a step with no decision token (None) neither counts nor resets
    guard = CollapseGuard(min_decision_entropy=0.05, max_op_share=0.95, patience=2)
    assert feed(guard, [{"decision_entropy": 0.01}, {"decision_entropy": None}, {"decision_entropy": 0.02}])[-1]


def test_one_op_over_the_share_for_patience_steps_trips_it_and_a_change_of_op_restarts_the_count():
    guard = CollapseGuard(min_decision_entropy=0.0, max_op_share=0.9, patience=2, min_ops=4)
    reasons = feed(guard, [
        {"ops": ops(NOOP=10)},          # NOOP 100 %
        {"ops": ops(ADD=19, NOOP=1)},   # ADD 95 %: another op, the count restarts
        {"ops": ops(ADD=2)},            # too few ops to judge: neither counts nor resets
        {"ops": ops(ADD=9, NOOP=1)},    # ADD 90 % is not *more* than 0.9: resets
        {"ops": ops(ADD=10)},
        {"ops": ops(ADD=12, invalid_budget=0)},
    ])
    assert reasons[:5] == [None] * 5
    assert reasons[5] == "ADD took more than 90% of the memory calls' ops for 2 steps (steps 5-6: 1.00, 1.00)"
    assert guard.evidence()["one_op"] == [{"step": 5, "op": "ADD", "share": 1.0}, {"step": 6, "op": "ADD",
                                                                                   "share": 1.0}]


def test_greedy_evaluations_in_one_op_trip_it_although_the_sampled_steps_do_not():
    """Pilot 1 of CPU v2: sampled steps kept ADD near 20 % (never over max_op_share), while the
    greedy evaluations at steps 4 and 8 wrote NOOP in almost every call."""
    guard = CollapseGuard(min_decision_entropy=0.05, max_op_share=0.95, patience=3, max_eval_op_share=0.95,
                          eval_patience=2)
    sampled = {"decision_entropy": 0.5, "ops": ops(ADD=5, NOOP=19)}
    greedy = {"ADD": 0, "UPDATE": 0, "DELETE": 0, "NOOP": 150}
    reasons = feed(guard, [
        sampled, sampled, sampled,
        {**sampled, "eval_ops": {**greedy, "ADD": 19, "NOOP": 130}},  # 87 % NOOP: under the share, resets
        sampled,
        {**sampled, "eval_ops": greedy},
        {**sampled, "eval_ops": {k: 0 for k in greedy}},  # an evaluation with no memory op: neither counts nor resets
        sampled,
        {**sampled, "eval_ops": {**greedy, "ADD": 1, "NOOP": 149}},
    ])
    assert reasons[:8] == [None] * 8
    assert reasons[8] == ("NOOP took more than 95% of the greedy evaluation's ops in 2 evaluations in a row "
                          "(steps 6, 9: 1.00, 0.99)")
    assert [r["step"] for r in guard.evidence()["eval_one_op"]] == [6, 9]
    # off by default: the same records never trip a guard without max_eval_op_share
    plain = CollapseGuard(min_decision_entropy=0.05, max_op_share=0.95, patience=3)
    assert feed(plain, [{**sampled, "eval_ops": greedy}] * 4) == [None] * 4


@pytest.mark.slow
def test_a_run_stuck_in_one_bucket_stops_with_collapse_json(tiny_model_dir, tiny_adapter_dir, hotpot_train_dir,
                                                            tmp_path):
    """The tiny random model cannot write ops in 12 tokens: every memory call is unparsable, one
    bucket holds 100 % of every step. With patience 2 the run stops after step 2 of 4."""
    from tests.train.test_grpo import grpo_config

    from memsearch.train.grpo import train_grpo

    cfg = grpo_config(tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir,
                      **{"collapse_guard.enabled": True, "collapse_guard.patience": 2, "collapse_guard.min_ops": 1})
    with pytest.raises(CollapseError, match="collapse guard stopped GRPO at step 2: invalid_parse took more than"):
        train_grpo(cfg, tmp_path / "run", echo=lambda m: None)
    log = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2]
    assert all(r["ops"]["invalid_parse"] > 0 and sum(r["ops"].values()) == r["ops"]["invalid_parse"] for r in log)
    record = json.loads((tmp_path / "run" / "collapse.json").read_text())
    assert record["step"] == 2 and record["last_checkpoint"].endswith("step-000002")
    assert [r["step"] for r in record["one_op"]] == [1, 2]
    assert not (tmp_path / "run" / "summary.json").exists()  # the run is not finished

"""The collapse guard (``train.grpo.collapse``): which sequences of steps trip it, and a real GRPO run on
the tiny Llama that it stops with a record and a non-zero end instead of training on."""

from __future__ import annotations

import json

import pytest

from memsearch.records.train_step import TrainStep
from memsearch.train.grpo.collapse import CollapseError, CollapseGuard


def ops(**counts):
    base = dict.fromkeys(("ADD", "UPDATE", "DELETE", "NOOP", "invalid_parse", "invalid_budget", "invalid_rule"), 0)
    return {**base, **counts}


def feed(guard, records):
    return [guard.observe(TrainStep.from_json({"step": s, **r})) for s, r in enumerate(records, start=1)]


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
    from tests.train.grpo.test_grpo import grpo_config

    from memsearch.train.grpo.trainer import train_grpo

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


def test_a_resume_whose_kept_steps_already_trip_the_guard_stops_at_once(tmp_path):
    """Seed 2 of CPU v2 was stopped at step 8 of 8 with a checkpoint at 8: resuming from it ran
    no step and would have finished the run as if never stopped. Now the kept records trip the
    guard again before any step."""
    from memsearch.train.config import CollapseGuardSettings
    from memsearch.train.distributed import Dist
    from memsearch.train.grpo.collapse import guard_for_run

    settings = CollapseGuardSettings(enabled=True, min_decision_entropy=0.05, max_op_share=0.95, patience=3,
                                     max_eval_op_share=0.95, eval_patience=2)
    greedy = {"ADD": 96, "UPDATE": 0, "DELETE": 0, "NOOP": 0}
    steps = [{"step": s, "decision_entropy": 0.4, "ops": ops(ADD=20, NOOP=4),
              **({"eval_ops": greedy} if s in (4, 8) else {})} for s in range(1, 9)]
    (tmp_path / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    with pytest.raises(CollapseError, match="stopped GRPO at step 8: ADD took more than 95% of the greedy"):
        guard_for_run(settings, tmp_path, 8, Dist())
    assert json.loads((tmp_path / "collapse.json").read_text())["step"] == 8
    # resumed from step 4 (the trip at 8 is not kept): the run goes on, and the count so far is kept
    guard = guard_for_run(settings, tmp_path, 4, Dist())
    assert [r["step"] for r in guard.evidence()["eval_one_op"]] == [4]
    assert guard_for_run(settings.model_copy(update={"enabled": False}), tmp_path, 8, Dist()) is None


@pytest.mark.slow
def test_a_grpo_stage_the_collapse_guard_stopped_stops_or_is_scored_at_its_newest_checkpoint(
        tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, tmp_path):
    """The tiny random model writes no parsable op, so the guard (patience 2) stops GRPO at step 2
    of 4. By default the stage stays unfinished, also when run again (the resume trips at once
    instead of training past the stop); with on_collapse = "score_last_checkpoint" it finishes with
    the step-2 checkpoint's adapter, and its record and the report say so."""
    from tests.train.grpo.test_grpo import grpo_config

    from memsearch.pipelines.memory_policy.report import render_stage_times, stage_times
    from memsearch.pipelines.stage_record import folder_sha256
    from memsearch.pipelines.trainer_stages import grpo_stage

    cfg = grpo_config(tmp_path, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir,
                      **{"collapse_guard.enabled": True, "collapse_guard.patience": 2, "collapse_guard.min_ops": 1})
    folder, record = tmp_path / "out" / "grpo1", tmp_path / "out" / "grpo1.stage.json"

    def logged_steps():
        return [json.loads(x)["step"] for x in (folder / "train_log.jsonl").read_text().splitlines()]

    for _ in range(2):
        with pytest.raises(CollapseError, match="stopped GRPO at step 2"):
            grpo_stage(folder, record, cfg, {"start": "test"}, echo=lambda m: None)
        assert logged_steps() == [1, 2] and not json.loads(record.read_text())["complete"]
    messages = []
    adapter = grpo_stage(folder, record, cfg, {"start": "test"}, echo=messages.append,
                         on_collapse="score_last_checkpoint")
    assert logged_steps() == [1, 2]  # nothing trained past the stop
    assert folder_sha256(adapter) == folder_sha256(folder / "checkpoints" / "step-000002" / "adapter")
    finished = json.loads(record.read_text())
    assert finished["complete"] and finished["outputs"]["adapter_sha256"] == folder_sha256(adapter)
    collapse = finished["outputs"]["collapse"]
    assert (collapse["step"], collapse["checkpoint"]) == (2, "checkpoints/step-000002")
    assert collapse["reason"].startswith("invalid_parse took more than")
    assert json.loads((folder / "summary.json").read_text())["stopped_by_collapse_guard"] == collapse
    assert "scoring checkpoints/step-000002" in messages[-1]
    # a finished stage is reused as it is, whatever on_collapse says now
    assert grpo_stage(folder, record, cfg, {"start": "test"}, echo=lambda m: None) == adapter
    text = render_stage_times(stage_times(tmp_path / "out"))
    assert "## Stages the collapse guard stopped" in text
    assert "- grpo1: stopped at step 2 (invalid_parse took more than" in text

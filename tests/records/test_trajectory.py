"""The trajectory record (``memsearch.records``): causes as codes, the upgrade of records written
before engine-6, and a trajectory read from its JSON and written again unchanged."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from memsearch.data.dataset import load_dataset
from memsearch.engine.episode import run_episode
from memsearch.engine.memory_modes import make_memory
from memsearch.eval.runner import build_environment
from memsearch.pipelines.config import load_run_config
from memsearch.records.causes import CAUSES, InvalidCause, first_cause, legacy_cause
from memsearch.records.events import EventKind, MemoryEvent, PolicyCall, SearchEvent, event_from_json
from memsearch.records.trajectory import ENGINE_VERSION, Counts, Trajectory, read_trajectories, upgrade
from memsearch.tokenizer import LexicalTokenizer

RULES = Path(__file__).resolve().parents[2] / "configs" / "rules.toml"
SHOWN = {"d1:0", "d1:1"}
OVER = "memory after the batch would be 40 tokens, over the budget of 24 tokens"


def test_every_cause_has_its_bucket_and_the_enum_order_is_the_precedence():
    assert set(CAUSES) == set(InvalidCause)
    assert first_cause([InvalidCause.EMPTY_TEXT, InvalidCause.UNSHOWN_SOURCE, InvalidCause.OVER_BUDGET]) is (
        InvalidCause.OVER_BUDGET)
    assert first_cause([]) is None
    assert [CAUSES[c].histogram for c in (InvalidCause.PARSE, InvalidCause.OVER_BUDGET, InvalidCause.UNKNOWN_ID)] == [
        "invalid_parse", "invalid_budget", "invalid_rule"]
    # A StrEnum is its JSON string: records stay plain JSON and compare with what was read back.
    assert json.loads(json.dumps({"c": InvalidCause.OVER_BUDGET, "t": EventKind.MEMORY})) == {
        "c": "over_budget", "t": "memory"}


def test_a_decision_memory_records_the_cause_of_its_rejection():
    memory = make_memory("decision", LexicalTokenizer(), 24)
    long_text = " ".join(["word"] * 30)
    record = memory.update(json.dumps({"ops": [{"op": "ADD", "text": long_text, "sources": ["d9:0"]}]}), SHOWN, step=3)
    # Two rules broken (an unshown source, the budget): the code is the overflow, the reason says both.
    assert record.step == 3 and record.valid is False and record.cause == InvalidCause.OVER_BUDGET
    assert "was not shown" in record.reason and "over the budget" in record.reason
    assert memory.update("not json at all", SHOWN, step=4).cause == InvalidCause.PARSE
    assert memory.update('{"ops": [{"op": "NOOP"}]}', SHOWN, step=5).cause is None
    assert make_memory("summary", LexicalTokenizer(), 24).update("   ", SHOWN, step=0).cause == InvalidCause.EMPTY_TEXT


def _engine5_trajectory() -> dict:
    """A trajectory as engines before engine-6 wrote it: reasons in words, no codes, no version."""
    def call(role, step, valid, reason=None, error=None):
        return {"type": "policy_call", "role": role, "step": step, "valid": valid, "invalid_reason": reason,
                "error": error, "finish_reason": "stop", "action": {"memory": {"executed": {}}}}

    unshown_and_over = f"op 0 (ADD): source 'd9:0' was not shown to the agent; {OVER}"
    return {"task_id": "q1", "events": [
        {"type": "search", "step": 0, "shown": ["d1:0"]},
        call("memory", 0, False, "parse error: no JSON object or list found"),
        {"type": "memory", "step": 0, "valid": False, "reason": "parse error: no JSON object or list found"},
        call("memory", 1, False, unshown_and_over),
        {"type": "memory", "step": 1, "valid": False, "reason": unshown_and_over},
        call("memory", 2, False, "op 0 (DELETE): id 'm7' does not exist"),
        call("memory", 3, None, "request failed: timeout", error="timeout"),
        {**call("memory", 4, True), "action": {"memory": {"executed": {"ADD": 1}}}},
        {"type": "memory", "step": 4, "valid": True, "reason": None},
        call("controller", 0, False, "SEARCH without a query"),
        call("reader", 0, False, "no answer found in the reader output"),
    ]}


def test_an_old_record_reads_with_the_codes_its_words_meant(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps(_engine5_trajectory()) + "\n")
    ((lineno, read),) = list(read_trajectories(path))
    assert lineno == 1 and read.engine_version is None
    assert [c.invalid_cause for c in read.policy_calls()] == [
        InvalidCause.PARSE, InvalidCause.OVER_BUDGET, InvalidCause.UNKNOWN_ID, InvalidCause.REQUEST_FAILED, None,
        InvalidCause.PARSE, InvalidCause.PARSE]
    assert [e.cause for e in read.memory_events] == [InvalidCause.PARSE, InvalidCause.OVER_BUDGET, None]
    assert read.policy_calls(["controller"])[0].invalid_cause is InvalidCause.PARSE
    assert read.policy_calls()[1].invalid_reason.endswith(OVER)  # the words stay as written
    assert read.memory_ops == {"ADD": 1}  # step 4's event had no ops: its call's action held them
    (search,) = read.searches
    assert search.shown == ("d1:0",) and search.query == "" and search.doc_ids == ()  # absent fields: defaults


def test_upgrade_leaves_current_and_malformed_records_alone():
    current = {"task_id": "q", "engine_version": ENGINE_VERSION, "events": [
        {"type": "policy_call", "role": "memory", "valid": False, "invalid_reason": OVER, "invalid_cause": "parse"}]}
    assert upgrade(json.loads(json.dumps(current))) == current  # a code is never re-derived from words
    for malformed in ({"task_id": "q", "events": "nope"}, {"task_id": "q", "events": [3, None]}, {"task_id": "q"}):
        assert upgrade(json.loads(json.dumps(malformed))) == malformed


def test_what_is_not_a_trajectory_is_named_with_its_line(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    path.write_text('{"task_id": "q", "events": []}\n{"events": []}\n')
    with pytest.raises(ValueError, match=r"trajectories.jsonl:2: not a trajectory"):
        list(read_trajectories(path))
    with pytest.raises(ValueError, match="not a trajectory event: type 'nope'"):
        event_from_json({"type": "nope"})


@pytest.mark.parametrize("reason, cause", [
    ("op 1 (ADD): cites 4 distinct sources, over the cap of 3 per item (agent.memory_max_sources)",
     InvalidCause.TOO_MANY_SOURCES),
    ("empty batch (use a single NOOP to change nothing)", InvalidCause.EMPTY_BATCH),
    ("empty output; memory unchanged", InvalidCause.EMPTY_TEXT),
    ("something no engine ever wrote", InvalidCause.OTHER),
    (None, InvalidCause.OTHER),
])
def test_legacy_wording(reason, cause):
    assert legacy_cause(reason) is cause


def test_the_executed_ops_are_stored_once_and_written_where_files_hold_them():
    call = PolicyCall(role="memory", step=0, text='{"ops": [{"op": "NOOP"}]}', valid=True)
    outcome = MemoryEvent(step=0, valid=True, executed={"ADD": 0, "NOOP": 1}, before="(empty)", after="(empty)")
    second = MemoryEvent(step=1, valid=True, executed={"ADD": 2, "NOOP": 0}, before="(empty)", after="x")
    traj = Trajectory(task_id="q", events=(call, outcome, PolicyCall(role="memory", step=1), second),
                      counts=Counts(searches=2))
    assert traj.executed(call) == {"ADD": 0, "NOOP": 1} and traj.memory_ops == {"ADD": 2, "NOOP": 1}
    written = traj.to_json()
    assert written["counts"]["memory_ops"] == {"ADD": 2, "NOOP": 1}
    assert written["events"][0]["action"] == {"memory": {"executed": {"ADD": 0, "NOOP": 1}, "truncated": False}}
    assert Trajectory.from_json(written) == traj


# The engine's record formats, one variant each: every line reads into a record and writes back
# unchanged, key order included (files read by other tools stay as they were).
VARIANTS = {
    "fixed": [], "policy": ["agent.controller='policy'"], "summary": ["agent.memory='summary'"],
    "extractive": ["agent.memory_format='extractive'", "agent.controller='policy'"],
    "hidden": ["agent.memory_sources='hidden'"],
    "stream": ["agent.evidence='stream'", "agent.memory='overwrite'", "agent.controller='exhaust'"],
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_engine_trajectories_survive_their_json(hotpot_dev_dir, variant):
    dataset = load_dataset(hotpot_dev_dir)
    config = load_run_config(RULES, VARIANTS[variant])
    env = build_environment(config, dataset)
    for task in dataset.tasks[:6]:
        traj = asyncio.run(run_episode(task, env))
        written = json.loads(json.dumps(traj.to_json()))
        again = Trajectory.from_json(written)
        assert again == traj
        assert json.dumps(again.to_json()) == json.dumps(written)
        assert written["engine_version"] == ENGINE_VERSION and not traj.extra
        assert sum(written["counts"]["memory_ops"].values()) == sum(
            sum(e.executed.values()) for e in traj.memory_events)
        kinds = {type(e) for e in traj.events}
        assert PolicyCall in kinds and (SearchEvent in kinds) == (variant != "stream")


def test_the_run_label_is_the_lines_group_key_and_no_grpo_group():
    line = {"task_id": "t1", "group": "B", "question": "q?", "status": "error", "error": "crash", "counts": {},
            "events": [], "prediction": None}
    traj = Trajectory.from_json(line)
    assert traj.run_label == "B" and "group" not in traj.extra and not hasattr(traj, "group")
    assert traj.to_json() == line
    assert Trajectory.failed("t1", "q?", "B", "crash").to_json() == line

"""The trajectory contract (``memsearch.trajectory``): event kinds, invalid causes as codes, one
cause table, and the upgrade of records written before engine-6."""

from __future__ import annotations

import json

import pytest

from memsearch.engine.memory_modes import make_memory
from memsearch.tokenizer import LexicalTokenizer
from memsearch.train.decisions import op_histogram
from memsearch.trajectory import (
    CAUSES,
    ENGINE_VERSION,
    EventKind,
    InvalidCause,
    first_cause,
    legacy_cause,
    policy_calls,
    read_trajectories,
    upgrade,
)

SHOWN = {"d1:0", "d1:1"}
OVER = "memory after the batch would be 40 tokens, over the budget of 24 tokens"


def test_every_cause_has_its_groups_and_the_enum_order_is_the_precedence():
    assert set(CAUSES) == set(InvalidCause)
    assert first_cause([InvalidCause.EMPTY_TEXT, InvalidCause.UNSHOWN_SOURCE, InvalidCause.OVER_BUDGET]) is (
        InvalidCause.OVER_BUDGET)
    assert first_cause([]) is None
    assert [CAUSES[c].histogram for c in (InvalidCause.PARSE, InvalidCause.OVER_BUDGET, InvalidCause.UNKNOWN_ID)] == [
        "invalid_parse", "invalid_budget", "invalid_rule"]
    assert [CAUSES[c].heldout for c in (InvalidCause.OVER_BUDGET, InvalidCause.UNSHOWN_SOURCE, InvalidCause.PARSE)] == [
        "over_budget", "unshown_source", "other"]
    # A StrEnum is its JSON string: records stay plain JSON and compare with what was read back.
    assert json.loads(json.dumps({"c": InvalidCause.OVER_BUDGET, "t": EventKind.MEMORY})) == {
        "c": "over_budget", "t": "memory"}


def test_a_decision_memory_records_the_cause_of_its_rejection():
    memory = make_memory("decision", LexicalTokenizer(), 24)
    long_text = " ".join(["word"] * 30)
    record = memory.update(json.dumps({"ops": [{"op": "ADD", "text": long_text, "sources": ["d9:0"]}]}), SHOWN)
    # Two rules broken (an unshown source, the budget): the code is the overflow, the reason says both.
    assert record["valid"] is False and record["cause"] == InvalidCause.OVER_BUDGET
    assert "was not shown" in record["reason"] and "over the budget" in record["reason"]
    assert memory.update("not json at all", SHOWN)["cause"] == InvalidCause.PARSE
    assert memory.update('{"ops": [{"op": "NOOP"}]}', SHOWN)["cause"] is None
    assert make_memory("summary", LexicalTokenizer(), 24).update("   ", SHOWN)["cause"] == InvalidCause.EMPTY_TEXT


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
        call("memory", 4, True),
        call("controller", 0, False, "SEARCH without a query"),
        call("reader", 0, False, "no answer found in the reader output"),
    ]}


def test_upgrade_gives_an_old_record_the_codes_its_words_meant(tmp_path):
    old = _engine5_trajectory()
    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps(old) + "\n")
    ((lineno, read),) = list(read_trajectories(path))
    assert lineno == 1 and read["events"][0] == old["events"][0]
    assert [c["invalid_cause"] for c in policy_calls(read)] == [
        InvalidCause.PARSE, InvalidCause.OVER_BUDGET, InvalidCause.UNKNOWN_ID, InvalidCause.REQUEST_FAILED, None,
        InvalidCause.PARSE, InvalidCause.PARSE]
    assert [e["cause"] for e in read["events"] if e["type"] == EventKind.MEMORY] == [
        InvalidCause.PARSE, InvalidCause.OVER_BUDGET]
    assert op_histogram(policy_calls(read, ("memory",)))["invalid_budget"] == 1
    # The reasons stay as they were written; the accessors upgrade in-memory records too.
    assert policy_calls(_engine5_trajectory(), ("controller",))[0]["invalid_cause"] == InvalidCause.PARSE
    assert read["events"][3]["invalid_reason"].endswith(OVER)


def test_upgrade_leaves_current_and_malformed_records_alone():
    current = {"task_id": "q", "engine_version": ENGINE_VERSION, "events": [
        {"type": "policy_call", "role": "memory", "valid": False, "invalid_reason": OVER, "invalid_cause": "parse"}]}
    assert upgrade(json.loads(json.dumps(current))) == current  # a code is never re-derived from words
    for malformed in ({"task_id": "q", "events": "nope"}, {"task_id": "q", "events": [3, None]}, {"task_id": "q"}):
        assert upgrade(json.loads(json.dumps(malformed))) == malformed


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

"""The bounded memory: rendering, each validation rule, atomicity, ids, budget."""

from __future__ import annotations

import json

import pytest

from memsearch.memory import EMPTY_RENDER, Add, ApplyResult, Delete, Memory, MemoryItem, Noop, Update
from memsearch.records.causes import InvalidCause, legacy_cause
from memsearch.tokenizer import LexicalTokenizer, load_tokenizer

SHOWN = {"d3:0", "d5:2", "d7:1", "d7:2"}
ZERO = {"ADD": 0, "UPDATE": 0, "DELETE": 0, "NOOP": 0}


def make(budget: int = 200) -> Memory:
    return Memory(LexicalTokenizer(), budget)


def filled() -> Memory:
    """m1 fact, m2 open, m3 fact; next id 4."""
    memory = make()
    result = memory.apply(
        [Add("Paris is the capital of France.", ("d3:0", "d5:2")),
         Add("Which river flows through Paris?", (), "open"),
         Add("The Seine flows through Paris.", ("d7:1",))],
        SHOWN,
    )
    assert result.applied, result.reasons
    return memory


# --- rendering ----------------------------------------------------------------------------

def test_empty_memory_renders_placeholder():
    memory = make()
    assert memory.render() == EMPTY_RENDER == "(empty)"
    assert memory.tokens() == 3  # "(", "empty", ")"
    assert len(memory) == 0 and memory.next_id == 1
    assert memory.snapshot() == {"items": [], "next_id": 1}


def test_render_format():
    assert filled().render() == (
        "[m1] (fact; d3:0, d5:2) Paris is the capital of France.\n"
        "[m2] (open) Which river flows through Paris?\n"
        "[m3] (fact; d7:1) The Seine flows through Paris."
    )


def test_tokens_count_the_rendering():
    memory = filled()
    assert memory.tokens() == LexicalTokenizer().count(memory.render()) == 49
    assert memory.remaining_tokens() == 200 - 49


def test_budget_must_hold_the_empty_memory():
    with pytest.raises(ValueError, match=r"budget_tokens=2 cannot hold even the empty memory"):
        make(2)
    assert make(3).tokens() == 3


def test_text_white_space_is_collapsed_and_sources_deduplicated():
    memory = make()
    assert memory.apply([Add("  two\nlines\t here ", ("d3:0", "d5:2", "d3:0"))], SHOWN).applied
    assert memory.render() == "[m1] (fact; d3:0, d5:2) two lines here"


def test_open_item_may_cite_sources():
    memory = make()
    assert memory.apply([Add("Who founded it?", ("d7:2",), "open")], SHOWN).applied
    assert memory.render() == "[m1] (open; d7:2) Who founded it?"


# --- applying -----------------------------------------------------------------------------

def test_applied_result_records_counts_ids_and_tokens():
    memory = filled()
    result = memory.apply(
        [Update("m2", "The Seine flows through Paris; which sea does it reach?"), Delete("m3"),
         Add("It reaches the English Channel.", ("d7:2",)), Add("Where is Le Havre?", (), "open")],
        SHOWN,
    )
    assert result == ApplyResult(
        status="applied", reasons=(), ops=result.ops,
        executed={"ADD": 2, "UPDATE": 1, "DELETE": 1, "NOOP": 0}, added_ids=("m4", "m5"),
        tokens_before=49, tokens_after=memory.tokens(), proposed_tokens=memory.tokens(), budget_tokens=200,
    )
    assert result.valid and result.reason is None
    # UPDATE keeps the item's place, kind and sources when omitted.
    assert memory.render() == (
        "[m1] (fact; d3:0, d5:2) Paris is the capital of France.\n"
        "[m2] (open) The Seine flows through Paris; which sea does it reach?\n"
        "[m4] (fact; d7:2) It reaches the English Channel.\n"
        "[m5] (open) Where is Le Havre?"
    )
    assert memory.next_id == 6
    json.dumps(result.to_dict())  # JSON-able for trajectories


def test_update_can_change_kind_and_sources():
    memory = filled()
    assert memory.apply([Update("m2", "The Seine flows through Paris.", ("d7:1",), "fact")], SHOWN).applied
    assert memory.get("m2") == MemoryItem("m2", "The Seine flows through Paris.", ("d7:1",), "fact")


def test_noop_alone_is_valid_and_changes_nothing():
    memory = filled()
    before = memory.snapshot()
    result = memory.apply([Noop()], SHOWN)
    assert result.applied and result.executed == {**ZERO, "NOOP": 1} and result.added_ids == ()
    assert memory.snapshot() == before


def test_same_batch_sequential_semantics_add_then_update():
    memory = make()
    result = memory.apply([Add("Q?", (), "open"), Update("m1", "Answer.", ("d3:0",), "fact")], SHOWN)
    assert result.applied
    assert memory.items == (MemoryItem("m1", "Answer.", ("d3:0",), "fact"),)


@pytest.mark.parametrize(
    ("ops", "reasons"),
    [
        ([Update("m9", "x", ("d3:0",))], ["op 0 (UPDATE): id 'm9' does not exist"]),
        ([Delete("m9")], ["op 0 (DELETE): id 'm9' does not exist"]),
        ([Noop(), Delete("m9"), Update("m1", "x"), Delete("m2"), Update("m2", "y")],
         ["op 0 (NOOP): NOOP must stand alone, but the batch has 5 ops",
          "op 1 (DELETE): id 'm9' does not exist",
          "op 4 (UPDATE): id 'm2' does not exist (deleted by op 3)"]),
        ([Delete("m1"), Delete("m1")], ["op 1 (DELETE): id 'm1' does not exist (deleted by op 0)"]),
        ([Add("x", ("d9:0",))], ["op 0 (ADD): source 'd9:0' was not shown to the agent"]),
        ([Add("x", ("d3",))],
         ["op 0 (ADD): source 'd3' is not an evidence id (expected 'doc_id:sentence_index')"]),
        ([Add("x", ("d3:zero", "d5:2"))],
         ["op 0 (ADD): source 'd3:zero' is not an evidence id (expected 'doc_id:sentence_index')"]),
        ([Add("x")], ["op 0 (ADD): a fact must cite at least one source"]),
        ([Add("  \n ", ("d3:0",))], ["op 0 (ADD): text is empty"]),
        ([Add("", (), "fact")], ["op 0 (ADD): text is empty", "op 0 (ADD): a fact must cite at least one source"]),
        ([Update("m1", "x", ())], ["op 0 (UPDATE): a fact must cite at least one source"]),
        ([Update("m2", "x", None, "fact")], ["op 0 (UPDATE): a fact must cite at least one source"]),
        ([Update("m3", "", ("d7:9",))],
         ["op 0 (UPDATE): text is empty", "op 0 (UPDATE): source 'd7:9' was not shown to the agent"]),
        ([Noop(), Noop()], ["op 0 (NOOP): NOOP must stand alone, but the batch has 2 ops",
                            "op 1 (NOOP): NOOP must stand alone, but the batch has 2 ops"]),
        ([], ["empty batch (use a single NOOP to change nothing)"]),
        # The ADD is invalid but still takes id m4, so the UPDATE of m4 is judged on its own.
        ([Add("x", ("d9:9",)), Update("m4", "y", ("d3:0",))],
         ["op 0 (ADD): source 'd9:9' was not shown to the agent"]),
    ],
)
def test_rule_rejections_leave_memory_unchanged(ops, reasons):
    memory = filled()
    before = memory.snapshot()
    result = memory.apply(ops, SHOWN)
    assert result.status == "rejected" and not result.valid
    assert list(result.reasons) == reasons
    # Each reason has its code, the one the wording of engines before engine-6 maps to (trajectory.upgrade).
    assert list(result.causes) == [legacy_cause(r) for r in reasons]
    assert InvalidCause.OTHER not in result.causes
    assert result.executed == ZERO and result.added_ids == ()
    assert result.tokens_before == result.tokens_after == memory.tokens() == 49
    assert memory.snapshot() == before and memory.next_id == 4


def test_rejected_batch_with_valid_adds_does_not_advance_the_counter():
    memory = filled()
    twin = filled()
    result = memory.apply([Add("ok", ("d3:0",)), Add("ok too", ("d5:2",)), Delete("m42")], SHOWN)
    assert not result.applied and result.reasons == ("op 2 (DELETE): id 'm42' does not exist",)
    assert memory == twin and memory.next_id == 4
    assert memory.apply([Add("next", ("d3:0",))], SHOWN).added_ids == ("m4",)


def test_ids_are_never_reused_after_delete():
    memory = make()
    assert memory.apply([Add("a", ("d3:0",))], SHOWN).added_ids == ("m1",)
    assert memory.apply([Delete("m1")], SHOWN).applied
    assert memory.render() == "(empty)"
    assert memory.apply([Add("b", ("d3:0",)), Add("c", ("d3:0",))], SHOWN).added_ids == ("m2", "m3")
    assert memory.apply([Delete("m2"), Delete("m3"), Add("d", ("d3:0",))], SHOWN).added_ids == ("m4",)
    assert [item.id for item in memory.items] == ["m4"]
    assert memory.apply([Update("m1", "back?", ("d3:0",))], SHOWN).reasons == (
        "op 0 (UPDATE): id 'm1' does not exist",
    )


def test_budget_rejection_reports_counts_and_never_evicts():
    memory = make(20)
    assert memory.apply([Add("Paris is the capital of France.", ("d3:0",))], SHOWN).applied
    assert memory.tokens() == 17  # "[ m1 ] ( fact ; d3 : 0 )" is 10 tokens, the text 7
    before = memory.snapshot()
    result = memory.apply([Add("Lyon is a city.", ("d5:2",))], SHOWN)
    assert result.status == "rejected"
    assert result.reasons == ("memory after the batch would be 32 tokens, over the budget of 20 tokens",)
    assert (result.tokens_before, result.tokens_after, result.proposed_tokens, result.budget_tokens) == (17, 17, 32, 20)
    assert memory.snapshot() == before  # nothing was evicted to make room
    # Making room is the policy's decision: delete and add in one batch fits.
    result = memory.apply([Delete("m1"), Add("Lyon is a city.", ("d5:2",))], SHOWN)
    assert result.applied and result.added_ids == ("m2",) and memory.tokens() == 15  # m2: the rejected ADD took no id


def test_budget_is_checked_on_the_final_state_not_per_op():
    memory = make(20)
    assert memory.apply([Add("Paris is the capital of France.", ("d3:0",))], SHOWN).applied
    # The intermediate state (two items) is over budget; the final one is not.
    assert memory.apply([Add("Lyon is a city.", ("d5:2",)), Delete("m1")], SHOWN).applied
    assert memory.render() == "[m2] (fact; d5:2) Lyon is a city."


def test_budget_reason_is_listed_with_rule_reasons():
    memory = make(10)
    result = memory.apply([Add("a b c d e f g h", ("d9:0",))], SHOWN)
    assert result.reasons == (
        "op 0 (ADD): source 'd9:0' was not shown to the agent",
        "memory after the batch would be 18 tokens, over the budget of 10 tokens",
    )
    # Several rules broken: the batch's cause is the overflow (first in InvalidCause's order).
    assert result.causes == (InvalidCause.UNSHOWN_SOURCE, InvalidCause.OVER_BUDGET)
    assert result.cause == InvalidCause.OVER_BUDGET


# --- apply_text ---------------------------------------------------------------------------

def test_apply_text_applies_fenced_model_output():
    memory = make()
    text = 'Here you go:\n```json\n{"ops": [{"op": "add", "text": "Paris.", "sources": ["d3:0"]}]}\n```'
    result = memory.apply_text(text, SHOWN)
    assert result.applied and result.ops == (Add("Paris.", ("d3:0",)),) and result.added_ids == ("m1",)
    assert memory.render() == "[m1] (fact; d3:0) Paris."


def test_apply_text_parse_error_vs_rule_rejection():
    memory = filled()
    before = memory.snapshot()
    parse_fail = memory.apply_text("I think we should keep everything.", SHOWN)
    assert parse_fail == ApplyResult(
        status="parse_error", reasons=("parse error: no JSON object or list found",), causes=(InvalidCause.PARSE,),
        ops=None,
        tokens_before=49, tokens_after=49, proposed_tokens=None, budget_tokens=200,
    )
    assert not parse_fail.valid
    rejected = memory.apply_text('{"ops": [{"op": "DELETE", "id": "m7"}]}', SHOWN)
    assert rejected.status == "rejected" and rejected.reasons == ("op 0 (DELETE): id 'm7' does not exist",)
    assert (parse_fail.cause, rejected.causes, rejected.to_dict()["causes"]) == (
        InvalidCause.PARSE, (InvalidCause.UNKNOWN_ID,), ["unknown_id"])
    assert rejected.ops == (Delete("m7"),)
    assert memory.snapshot() == before
    assert parse_fail.to_dict()["status"] == "parse_error" and rejected.to_dict()["valid"] is False


@pytest.mark.parametrize("text", [None, "", "{", "[" * 3000, '{"ops": [{"op": "ADD", "text": 5}]}'])
def test_apply_text_never_raises(text):
    memory = filled()
    assert memory.apply_text(text, SHOWN).status == "parse_error"  # type: ignore[arg-type]


# --- snapshots and equality ---------------------------------------------------------------

def test_snapshot_round_trip_and_equality():
    memory = filled()
    snap = memory.snapshot()
    assert json.loads(json.dumps(snap)) == snap
    assert snap["next_id"] == 4
    assert snap["items"][0] == {"id": "m1", "text": "Paris is the capital of France.",
                                "sources": ["d3:0", "d5:2"], "kind": "fact"}
    copy = Memory.from_snapshot(snap, LexicalTokenizer(), 200)
    assert copy == memory and copy.tokens() == memory.tokens() and copy.render() == memory.render()
    assert copy != Memory.from_snapshot(snap, LexicalTokenizer(), 100)
    assert copy.apply([Delete("m1")], SHOWN).applied
    assert copy != memory  # independent state


@pytest.mark.parametrize(
    ("snap", "message"),
    [
        ({"items": [{"id": "m1", "text": "x", "sources": ["d3:0"]}], "next_id": 1}, "bad or duplicate id"),
        ({"items": [{"id": "x1", "text": "x", "sources": ["d3:0"]}], "next_id": 5}, "bad or duplicate id"),
        ({"items": [{"id": "m1", "text": "x", "sources": ["d3:0"]}] * 2, "next_id": 2}, "bad or duplicate id"),
        ({"items": [{"id": "m1", "text": "x", "sources": [], "kind": "fact"}], "next_id": 2}, "has no sources"),
        ({"items": [{"id": "m1", "text": "a " * 50, "kind": "open"}], "next_id": 2}, "over the budget"),
    ],
)
def test_from_snapshot_rejects_inconsistent_state(snap, message):
    with pytest.raises(ValueError, match=message):
        Memory.from_snapshot(snap, LexicalTokenizer(), 40)


def test_apply_rejects_non_ops_as_programming_error():
    with pytest.raises(TypeError):
        make().apply([{"op": "NOOP"}], SHOWN)  # type: ignore[list-item]


# --- the real tokenizer -------------------------------------------------------------------

@pytest.mark.slow
def test_budget_with_embedded_tokenizer():
    tokenizer = load_tokenizer("embedded")
    first = Add("Paris is the capital of France.", ("d3:0", "d5:2"))
    second = Add("The Seine flows through Paris and reaches the English Channel at Le Havre.", ("d7:1",))
    one_line = "[m1] (fact; d3:0, d5:2) Paris is the capital of France."
    two_lines = one_line + "\n[m2] (fact; d7:1) " + second.text
    budget = tokenizer.count(one_line) + 5
    assert tokenizer.count(two_lines) > budget  # the test needs the second ADD not to fit

    memory = Memory(tokenizer, budget)
    assert memory.tokens() == tokenizer.count("(empty)")
    assert memory.apply([first], SHOWN).applied
    assert memory.render() == one_line and memory.tokens() == tokenizer.count(one_line)
    result = memory.apply([second], SHOWN)
    assert result.reasons == (
        f"memory after the batch would be {tokenizer.count(two_lines)} tokens, over the budget of {budget} tokens",
    )
    assert memory.render() == one_line and memory.tokens() <= budget


# --- the no-sources control (agent.memory_sources = "hidden") ---------------------------------

def test_hidden_sources_render_without_ids_count_that_rendering_and_keep_provenance():
    hidden = Memory(LexicalTokenizer(), 200, show_sources=False)
    assert hidden.apply(list(filled_ops()), SHOWN).applied
    assert hidden.render() == (
        "[m1] (fact) Paris is the capital of France.\n"
        "[m2] (open) Which river flows through Paris?\n"
        "[m3] (fact) The Seine flows through Paris."
    )
    # The budget is counted on what the agent sees: "; d3 : 0 , d5 : 2" and "; d7 : 1" are gone.
    assert hidden.tokens() == LexicalTokenizer().count(hidden.render()) == 49 - 12
    # Provenance is still recorded (memory support recall reads it) and survives a snapshot.
    assert hidden.snapshot() == filled().snapshot()
    assert [i.sources for i in hidden.items] == [("d3:0", "d5:2"), (), ("d7:1",)]
    again = Memory.from_snapshot(hidden.snapshot(), LexicalTokenizer(), 200, show_sources=False)
    assert again == hidden and again.render() == hidden.render() and again != filled()


def test_hidden_sources_fit_a_budget_the_shown_rendering_would_exceed():
    ops = [Add("Paris is the capital of France.", ("d3:0",))]
    assert Memory(LexicalTokenizer(), 16).apply(ops, SHOWN).status == "rejected"  # 17 tokens with "; d3 : 0"
    hidden = Memory(LexicalTokenizer(), 16, show_sources=False)
    assert hidden.apply(ops, SHOWN).applied and hidden.tokens() == 13
    # A fact must still cite a source, and only shown evidence: the rules are the same.
    reasons = hidden.apply([Delete("m1"), Add("Lyon.", ())], SHOWN).reasons
    assert reasons == ("op 1 (ADD): a fact must cite at least one source",)
    assert hidden.apply([Delete("m1"), Add("Lyon.", ("d9:9",))], SHOWN).reasons == (
        "op 1 (ADD): source 'd9:9' was not shown to the agent",
    )


def filled_ops():
    return (
        Add("Paris is the capital of France.", ("d3:0", "d5:2")),
        Add("Which river flows through Paris?", (), "open"),
        Add("The Seine flows through Paris.", ("d7:1",)),
    )


# --- the sources cap (agent.memory_max_sources) ------------------------------------------------

MANY = ("d1:0", "d1:1", "d1:2", "d1:3")
SHOWN_MANY = SHOWN | set(MANY)


def test_an_add_citing_more_sources_than_the_cap_is_rejected_with_the_cap_named():
    memory = Memory(LexicalTokenizer(), 200, max_sources=3)
    result = memory.apply([Add("Paris is the capital of France.", MANY)], SHOWN_MANY)
    assert result.status == "rejected" and not result.valid
    assert result.reasons == (
        "op 0 (ADD): cites 4 distinct sources, over the cap of 3 per item (agent.memory_max_sources)",
    )
    assert memory.render() == EMPTY_RENDER and memory.next_id == 1  # nothing changed
    # At the cap it is valid; a repeated id is one source (the store keeps distinct ids).
    assert memory.apply([Add("Paris is the capital of France.", MANY[:3])], SHOWN_MANY).applied
    assert memory.apply([Add("Lyon is in France.", ("d1:0",) * 5)], SHOWN_MANY).applied
    assert [len(item.sources) for item in memory.items] == [3, 1]


def test_an_update_over_the_cap_is_rejected_and_kept_sources_are_not_rechecked():
    memory = Memory(LexicalTokenizer(), 200, max_sources=3)
    assert memory.apply([Add("Paris is the capital of France.", MANY[:3])], SHOWN_MANY).applied
    result = memory.apply([Update("m1", "Paris, France.", MANY)], SHOWN_MANY)
    assert result.reasons == (
        "op 0 (UPDATE): cites 4 distinct sources, over the cap of 3 per item (agent.memory_max_sources)",
    )
    assert memory.apply([Update("m1", "Paris, France.")], SHOWN_MANY).applied  # keeps its 3 sources
    assert memory.items[0].sources == MANY[:3]


def test_no_cap_by_default_and_snapshots_respect_the_cap():
    uncapped = make()
    assert uncapped.max_sources is None and uncapped.apply([Add("Paris.", MANY)], SHOWN_MANY).applied
    with pytest.raises(ValueError, match="snapshot: item 'm1' cites 4 sources, over the cap of 3"):
        Memory.from_snapshot(uncapped.snapshot(), LexicalTokenizer(), 200, max_sources=3)
    assert Memory.from_snapshot(uncapped.snapshot(), LexicalTokenizer(), 200, max_sources=4).max_sources == 4
    with pytest.raises(ValueError, match="max_sources must be at least 1"):
        Memory(LexicalTokenizer(), 200, max_sources=0)

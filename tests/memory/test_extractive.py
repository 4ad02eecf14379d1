"""The extractive action format (``memory.extractive``) and what a constrained call may offer
from a state (``memory.choices``), on the real store with the lexical tokenizer."""

from __future__ import annotations

import json

import pytest

from memsearch.memory import Add, Delete, Memory, Noop, Update
from memsearch.memory.choices import fitting_choices
from memsearch.memory.extractive import OPEN_TEXT_CHARS, fact_text, format_extractive, parse_extractive, written_text
from memsearch.records.causes import InvalidCause
from memsearch.tokenizer import LexicalTokenizer

TEXTS = {  # what an episode showed: evidence id -> "title\nsentence"
    "d1:0": "Le Havre\nLe Havre is a port city in Normandy.",
    "d1:1": "Le Havre\nIt lies at the mouth of the Seine.",
    "d2:0": "Seine (river)\nThe Seine flows through Paris.",
}
SHOWN = set(TEXTS)


def test_a_fact_is_written_from_its_sentences():
    assert fact_text("Le Havre", "Le Havre is a port city. ") == "Le Havre is a port city."
    assert fact_text("Le Havre", "It lies at the mouth of the Seine.") == "Le Havre: It lies at the mouth of the Seine."
    # the title's disambiguation does not count, the name does
    assert fact_text("Seine (river)", "The Seine flows through Paris.") == "The Seine flows through Paris."
    assert written_text(["d1:1", "d2:0"], TEXTS) == (
        "Le Havre: It lies at the mouth of the Seine. The Seine flows through Paris.")
    assert written_text(["d9:9"], TEXTS) == "d9:9"  # never shown: stands for itself


def test_parse_gives_the_store_its_own_ops_with_the_text_written():
    text = json.dumps({"ops": [
        {"op": "ADD", "sources": ["d1:1"]},
        {"op": "ADD", "kind": "open", "text": "Where does the Seine end?"},
        {"op": "UPDATE", "id": "m1", "sources": ["d1:0", "d2:0"]},
        {"op": "delete", "id": "m2"},
    ]})
    parsed = parse_extractive(f"Here you go:\n```json\n{text}\n```", TEXTS)  # wrapping as parse_ops tolerates
    assert parsed.ops == (
        Add("Le Havre: It lies at the mouth of the Seine.", ("d1:1",), "fact"),
        Add("Where does the Seine end?", (), "open"),
        Update("m1", "Le Havre is a port city in Normandy. The Seine flows through Paris.", ("d1:0", "d2:0"), "fact"),
        Delete("m2"),
    )
    assert parse_extractive('{"ops": [{"op": "NOOP"}]}', TEXTS).ops == (Noop(),)
    assert parse_extractive(format_extractive(parsed.ops), TEXTS).ops == parsed.ops


@pytest.mark.parametrize("op, reason", [
    ({"op": "ADD", "text": "Le Havre is a port.", "sources": ["d1:0"]}, "a fact has no 'text' in the extractive"),
    ({"op": "ADD"}, "'sources' must be a non-empty list"),
    ({"op": "ADD", "sources": []}, "'sources' must be a non-empty list"),
    ({"op": "ADD", "kind": "open"}, "an open item needs a 'text'"),
    ({"op": "UPDATE", "id": "m1", "text": "x", "sources": ["d1:0"]}, "unexpected field 'text'"),
    ({"op": "UPDATE", "id": "m1"}, "missing field 'sources'"),
    ({"op": "KEEP", "sources": ["d1:0"]}, "unknown op 'KEEP'"),
])
def test_malformed_extractive_ops_are_parse_errors_with_a_reason(op, reason):
    parsed = parse_extractive(json.dumps({"ops": [op]}), TEXTS)
    assert parsed.ops is None and reason in parsed.error


def test_the_store_judges_an_extractive_batch_by_its_own_rules():
    memory = Memory(LexicalTokenizer(), 60)
    result = memory.apply_text('{"ops": [{"op": "ADD", "sources": ["d1:0"]}]}', SHOWN, TEXTS)
    assert result.applied and memory.render() == "[m1] (fact; d1:0) Le Havre is a port city in Normandy."
    unshown = memory.apply_text('{"ops": [{"op": "ADD", "sources": ["d9:9"]}]}', SHOWN, TEXTS)
    assert unshown.status == "rejected" and unshown.causes == (InvalidCause.UNSHOWN_SOURCE,)
    # the text format refuses the same text: a fact there must have a text
    assert memory.apply_text('{"ops": [{"op": "ADD", "sources": ["d1:1"]}]}', SHOWN).cause == InvalidCause.PARSE


def _fits(memory: Memory, op) -> bool:
    scratch = Memory.from_snapshot(memory.snapshot(), memory.tokenizer, memory.budget_tokens)
    return scratch.apply([op], SHOWN).applied


@pytest.mark.parametrize("budget", [14, 30, 45, 200])
def test_fitting_choices_offer_exactly_the_ops_that_fit(budget):
    memory = Memory(LexicalTokenizer(), max(budget, 14))
    assert memory.apply([Add("Paris.", ("d2:0",))], SHOWN).applied or budget == 14
    choices = fitting_choices(memory, ["d1:0", "d1:1", "d2:0"], TEXTS, SHOWN)
    singles_and_pairs = [["d1:0"], ["d1:1"], ["d2:0"], ["d1:0", "d1:1"], ["d1:0", "d2:0"], ["d1:1", "d2:0"]]
    for sources in singles_and_pairs:
        op = Add(written_text(sources, TEXTS), tuple(sources))
        assert (sources in choices["add"]) == _fits(memory, op), sources
        for item in memory.items:
            up = Update(item.id, written_text(sources, TEXTS), tuple(sources), "fact")
            assert (sources in choices["update"].get(item.id, [])) == _fits(memory, up)
    assert choices["delete"] == [item.id for item in memory.items]
    if choices["open"]:  # an open item of the longest text surely fits
        assert choices["open"] == OPEN_TEXT_CHARS
        assert _fits(memory, Add("x" * OPEN_TEXT_CHARS, (), "open"))
    if budget == 200:
        assert len(choices["add"]) == 6 and choices["open"]
    if budget == 30:
        assert choices["add"] and len(choices["add"]) < 6  # some fit, the longer pairs do not

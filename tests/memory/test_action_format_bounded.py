"""The budget-bounded memory-ops format (``memory-ops-v3-...``, ``memory.action_format``): every
answer it allows ends within ``policy_tokens`` (proved on the schema, reached by real values),
what it accepts and refuses (the JSON check a server's answer gets and the hf automaton alike,
then the token masks over the embedded tokenizer), and its ids."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from memsearch.backends.hf.constraint import Automaton, compile_constraint
from memsearch.backends.schema_check import schema_problem
from memsearch.memory.action_format import (
    ITEM_ID_CHARS,
    SOURCE_CHARS,
    OpsBounds,
    bounded_constraint,
    bounded_ops_constraint,
    bounded_ops_schema,
    constraint_by_id,
    memory_ops_constraint,
    min_bounded_policy_tokens,
    ops_bounds,
    text_ops_constraint,
)
from memsearch.memory.extractive import OPEN_TEXT_CHARS
from memsearch.memory.extractive_constraint import extractive_ops_schema
from memsearch.memory.ops import parse_ops
from memsearch.text.constraint import max_compact_length

ROOT = Path(__file__).resolve().parents[2]
BUDGETS = (89, 96, 128, 160, 256, 384, 512, 1024)
NOOP = '{"ops":[{"op":"NOOP"}]}'


def compact(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def source(chars: int = SOURCE_CHARS) -> str:
    return "d" + "7" * (chars - 3) + ":0"  # d777...:0, an evidence id of ``chars`` characters


def item(chars: int = ITEM_ID_CHARS) -> str:
    return "m" + "9" * (chars - 1)


def add(text: int, sources: int, source_chars: int = SOURCE_CHARS) -> dict:
    return {"op": "ADD", "text": "a" * text, "sources": [source(source_chars)] * sources, "kind": "fact"}


def update(text: int, sources: int, id_chars: int = ITEM_ID_CHARS) -> dict:
    return {"op": "UPDATE", "id": item(id_chars), "text": "u" * text, "sources": [source()] * sources, "kind": "open"}


def delete(id_chars: int = ITEM_ID_CHARS) -> dict:
    return {"op": "DELETE", "id": item(id_chars)}


def longest(b: OpsBounds) -> list[str]:
    """Values as long as ``b`` lets each op kind be: ``b.ops`` ops, every string at its cap."""
    ops = (add(b.add_text, b.sources), update(b.update_text, b.sources), delete())
    return [compact({"ops": [op] * b.ops}) for op in ops] + [NOOP]


def accepted(constraint, text: str) -> bool:
    """Both checkers agree, and say whether ``text`` is allowed."""
    by_json = schema_problem(text, constraint.json_schema) is None
    assert Automaton(constraint).accepts(text) is by_json, text
    return by_json


# --------------------------------------------------------------------------- the bound
@pytest.mark.parametrize("max_sources", [1, 3, 5])
@pytest.mark.parametrize("budget", BUDGETS)
def test_every_allowed_answer_leaves_room_for_the_end_token(budget, max_sources):
    constraint = bounded_ops_constraint(budget, max_sources)
    b = ops_bounds(budget, max_sources)
    assert constraint.id == b.id and constraint.json_schema == bounded_ops_schema(b)
    worst = max_compact_length(constraint.json_schema)
    assert worst <= budget - 1  # every allowed compact text, then EOS, within policy_tokens
    assert worst >= budget - 1 - b.ops  # and the budget is used (rounding per op aside)
    values = longest(b)
    assert max(len(v) for v in values) == worst  # the bound is reached by a real answer ...
    for text in values:  # ... which both checkers accept, and the memory's parser reads
        assert accepted(constraint, text) and parse_ops(text).ok
    assert 1 <= b.sources <= max_sources and b.source_chars == SOURCE_CHARS and b.id_chars == ITEM_ID_CHARS


@pytest.mark.parametrize("budget, split", [
    (96, (1, 1, 23, 8)),  # (ops, sources per item, ADD text, UPDATE text), agent.memory_max_sources = 3
    (128, (1, 1, 55, 40)),
    (256, (1, 3, 155, 140)),
    (512, (2, 3, 160, 145)),
    (1024, (4, 3, 162, 147)),
])
def test_the_split_of_a_budget(budget, split):
    b = ops_bounds(budget, 3)
    assert (b.ops, b.sources, b.add_text, b.update_text) == split


def test_a_budget_without_room_for_one_op_is_refused():
    need = min_bounded_policy_tokens()
    assert need == 89
    for budget in (24, 64, need - 1):
        with pytest.raises(ValueError, match=f"policy_tokens = {budget} cannot hold .* needs policy_tokens >= 89"):
            bounded_ops_constraint(budget, 3)
    assert ops_bounds(need, 3).update_text == 1
    with pytest.raises(ValueError, match="max_sources must be at least 1"):
        ops_bounds(256, 0)


def test_the_engine_keeps_v2_where_no_sentence_fits():
    """v3 where one UPDATE holds a sentence (USEFUL_TEXT_CHARS), else v2 as before: the CPU
    recipe's 96 tokens would leave 23 characters for a fact."""
    assert text_ops_constraint(40, 3) is memory_ops_constraint(3)  # such a budget cuts any op anyway
    assert text_ops_constraint(96, 3) is memory_ops_constraint(3)
    assert text_ops_constraint(200, 3) is memory_ops_constraint(3)
    assert text_ops_constraint(210, 3).id == "memory-ops-v3-ops1-src1x11-id4-add137-upd122"
    assert text_ops_constraint(256, 3) is bounded_ops_constraint(256, 3)
    assert text_ops_constraint(512, 3).id == "memory-ops-v3-ops2-src3x11-id4-add160-upd145"


# ----------------------------------------------------------------- accepted and refused
B1024 = ops_bounds(1024, 3)  # four ops per call
B256 = ops_bounds(256, 3)  # one
OK = {
    "NOOP alone": NOOP,
    "NOOP alone, spaced": '{"ops": [{"op": "NOOP"}]}',
    "three ops": compact({"ops": [add(10, 1), update(5, 0), delete()]}),
    "texts at their caps": compact({"ops": [add(B1024.add_text, 3), update(B1024.update_text, 2)]}),
    "UPDATE without sources and kind": '{"ops":[{"op":"UPDATE","id":"m1","text":"x"}]}',
}
REFUSED = {
    "NOOP twice": '{"ops":[{"op":"NOOP"},{"op":"NOOP"}]}',
    "NOOP after an op": compact({"ops": [delete(), {"op": "NOOP"}]}),
    "NOOP before an op": compact({"ops": [{"op": "NOOP"}, delete()]}),
    "too many ops": compact({"ops": [delete()] * (B1024.ops + 1)}),
    "no op": '{"ops":[]}',
    "ADD text too long": compact({"ops": [add(B1024.add_text + 1, 1)]}),
    "UPDATE text too long": compact({"ops": [update(B1024.update_text + 1, 1)]}),
    "too many sources": compact({"ops": [add(5, B1024.sources + 1)]}),
    "a source too long": compact({"ops": [add(5, 1, SOURCE_CHARS + 1)]}),
    "an item id too long": compact({"ops": [delete(ITEM_ID_CHARS + 1)]}),
    "an empty text": compact({"ops": [add(0, 1)]}),
}


@pytest.mark.parametrize("name", sorted(OK))
def test_allowed_answers(name):
    assert accepted(bounded_constraint(B1024), OK[name])


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_answers(name):
    assert not accepted(bounded_constraint(B1024), REFUSED[name])


def test_one_op_per_call_where_the_budget_holds_one():
    one = bounded_constraint(B256)
    assert B256.ops == 1 and accepted(one, compact({"ops": [add(B256.add_text, 3)]}))
    assert not accepted(one, compact({"ops": [delete(), delete()]}))


# ------------------------------------------------------------------------- token masks
@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from memsearch.assets.embedded import tokenizer_dir

    return AutoTokenizer.from_pretrained(str(tokenizer_dir()))


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def test_masks_allow_what_is_accepted_and_nothing_else(tokenizer):
    tc = compile_constraint(bounded_constraint(B1024), tokenizer)
    for text in (*OK.values(), *longest(B1024)):
        ids = encode(tokenizer, text)
        masks = tc.masks_for(ids)
        assert all(bool(masks[p, t]) for p, t in enumerate(ids)) and int(masks[-1].sum()) == 1, text
    for name in ("NOOP twice", "NOOP after an op", "too many ops", "ADD text too long", "UPDATE text too long",
                 "a source too long", "an item id too long"):
        with pytest.raises(ValueError, match="is not allowed here"):
            tc.masks_for(encode(tokenizer, REFUSED[name]))


def test_a_full_text_lets_only_the_quote_through(tokenizer):
    """At its cap a text may only close: no token adds a character (nor starts an escape)."""
    tc = compile_constraint(bounded_constraint(B1024), tokenizer)
    full = compact({"ops": [add(B1024.add_text, 1)]}).split('","sources"')[0]
    allowed = tc.allowed(tc.automaton.walk(full)).nonzero()[:, 0].tolist()
    texts = [tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(i)]) for i in allowed]
    assert texts and all(t.startswith('"') for t in texts)


# ----------------------------------------------------------------------------------- ids
def test_ids_round_trip():
    for budget in BUDGETS:
        constraint = bounded_ops_constraint(budget, 3)
        assert constraint_by_id(constraint.id) is constraint
    # Any bounds, not only those today's split gives: rows replay if the split changes.
    odd = OpsBounds(ops=2, sources=4, source_chars=9, id_chars=3, add_text=30, update_text=20)
    assert odd.id == "memory-ops-v3-ops2-src4x9-id3-add30-upd20"
    assert constraint_by_id(odd.id).json_schema == bounded_ops_schema(odd)


@pytest.mark.parametrize("bad", [
    "memory-ops-v3-",
    "memory-ops-v3-ops1-src1x11-id4-add23",  # a bound missing
    "memory-ops-v3-ops0-src1x11-id4-add23-upd8",  # a bound of 0
    "memory-ops-v3-ops01-src1x11-id4-add23-upd8",  # not the one spelling
    "memory-ops-v3-ops1-src1x11-id4-add23-upd8-x",
    "memory-ops-v3-ops\u0661-src1x11-id4-add23-upd8",  # a digit, but not an ASCII one
])
def test_malformed_ids_say_what_was_expected(bad):
    with pytest.raises(ValueError, match="expected memory-ops-v3-ops<k>-src<s>x<e>-id<i>-add<a>-upd<u>"):
        constraint_by_id(bad)
    with pytest.raises(ValueError, match="must be integers >= 1"):
        OpsBounds(1, 1, 11, 4, 0, 1)


# ------------------------------------------------------------------- the extractive format
def _found(table, key: str) -> list:
    """Every value of ``key`` anywhere in a TOML table (run and pipeline configs nest it)."""
    if not isinstance(table, dict):
        return []
    return [v for k, v in table.items() if k == key] + [x for v in table.values() for x in _found(v, key)]


def test_extractive_calls_end_within_every_extractive_configs_budget():
    """The extractive schema is finite except the open text; its longest call (an open item of
    ``OPEN_TEXT_CHARS``; ADD / UPDATE of two long evidence ids are shorter) leaves the end token
    room in every shipped extractive config's policy budget."""
    long_ids = [[source(), source()]]
    worst = max_compact_length(extractive_ops_schema(long_ids, {item(): long_ids}, [item()], OPEN_TEXT_CHARS))
    assert worst == max_compact_length(extractive_ops_schema([], {}, [], OPEN_TEXT_CHARS)) == 94
    budgets = {}
    for path in sorted(ROOT.glob("configs/**/*.toml")):
        table = tomllib.loads(path.read_text(encoding="utf-8"))
        if "extractive" in _found(table, "memory_format"):
            budgets[path.name] = min(_found(table, "policy_tokens"))
    assert budgets and all(worst <= budget - 1 for budget in budgets.values()), budgets

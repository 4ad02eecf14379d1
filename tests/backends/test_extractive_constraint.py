"""Schema mode for the extractive memory action format: the per-call constraint of one
op citing evidence ids, its id round trip and its token masks with the real embedded tokenizer
(no model needed)."""

from __future__ import annotations

import json
import time

import pytest

from memsearch.backends.base import Constraint
from memsearch.backends.hf import constraint as constraint_mod
from memsearch.backends.hf.constraint import Automaton, compile_constraint, token_texts
from memsearch.memory.action_format import constraint_by_id
from memsearch.memory.extractive_constraint import EXTRACT_PREFIX, extractive_ops_constraint

ADD = [["d1:0"], ["d1:0", "d2:3"], ["d2:3"]]
UPDATE = {"m2": [["d4:1"], ["d4:1", "d5:0"]], "m1": [["d1:2"]], "m9": []}
DELETE = ["m1", "m2"]


def spaced(op: dict) -> str:
    """``{"ops": [op]}`` with single spaces after ``:`` and ``,``, but enum values (source
    lists) compact, as the automaton matches them."""
    parts = [f'"{k}": ' + (json.dumps(v, separators=(",", ":")) if isinstance(v, list) else json.dumps(v))
             for k, v in op.items()]
    return '{"ops": [{' + ", ".join(parts) + "}]}"


def compact(op: dict) -> str:
    return json.dumps({"ops": [op]}, separators=(",", ":"))


def both(op: dict) -> list[str]:
    return [compact(op), spaced(op)]


@pytest.fixture(scope="module")
def full() -> Constraint:
    return extractive_ops_constraint(ADD, UPDATE, DELETE, open_chars=12)


# --------------------------------------------------------------------------- the automaton
def test_every_allowed_op_is_accepted(full):
    auto = Automaton(full)
    allowed = [
        *({"op": "ADD", "sources": s} for s in ADD),
        {"op": "ADD", "kind": "open", "text": "Who wrote it"},  # 12 characters: the limit
        {"op": "ADD", "kind": "open", "text": "?"},
        {"op": "UPDATE", "id": "m2", "sources": ["d4:1"]},
        {"op": "UPDATE", "id": "m2", "sources": ["d4:1", "d5:0"]},
        {"op": "UPDATE", "id": "m1", "sources": ["d1:2"]},
        {"op": "DELETE", "id": "m1"},
        {"op": "DELETE", "id": "m2"},
        {"op": "NOOP"},
    ]
    for op in allowed:
        for text in both(op):
            assert auto.accepts(text), text
    assert auto.accepts('{"ops": [{"op": "ADD", "sources": ["d1:0","d2:3"]}]}')  # the example
    assert auto.accepts('{\n"ops": [ {"op": "NOOP"} ]\n}')  # one white-space character per gap


def test_everything_else_is_refused(full):
    auto = Automaton(full)
    refused = {
        "an item id not in delete": {"op": "DELETE", "id": "m3"},
        "an item id not in update": {"op": "UPDATE", "id": "m3", "sources": ["d1:2"]},
        "an item whose update list is empty": {"op": "UPDATE", "id": "m9", "sources": ["d1:2"]},
        "a source list not in add": {"op": "ADD", "sources": ["d2:3", "d1:0"]},
        "a source list of another item's update": {"op": "UPDATE", "id": "m1", "sources": ["d4:1"]},
        "an ADD citing a subset of an allowed list": {"op": "ADD", "sources": ["d1"]},
        "open text past open_chars": {"op": "ADD", "kind": "open", "text": "Who wrote it?"},
        "empty open text": {"op": "ADD", "kind": "open", "text": ""},
        "keys out of order": {"sources": ["d1:0"], "op": "ADD"},
        "an extra key": {"op": "NOOP", "id": "m1"},
        "a kind on a fact ADD": {"op": "ADD", "sources": ["d1:0"], "kind": "fact"},
    }
    for why, op in refused.items():
        for text in both(op):
            assert not auto.accepts(text), why
    assert not auto.accepts('{"ops": [{"op": "NOOP"}, {"op": "NOOP"}]}'), "two ops"
    assert not auto.accepts('{"ops": [{"op": "DELETE", "id": "m1"}, {"op": "NOOP"}]}'), "two ops"
    assert not auto.accepts('{"ops": []}'), "no op"
    assert not auto.accepts('{"ops": [{"op": "ADD", "sources": ["d1:0", "d2:3"]}]}'), "a spaced enum value"


def test_absent_options_are_refused():
    auto = Automaton(extractive_ops_constraint([], {"m1": [["d1:2"]]}, [], open_chars=0))
    for op in ({"op": "ADD", "sources": ["d1:0"]}, {"op": "ADD", "kind": "open", "text": "x"},
               {"op": "DELETE", "id": "m1"}):
        for text in both(op):
            assert not auto.accepts(text), text
    assert auto.accepts(spaced({"op": "UPDATE", "id": "m1", "sources": ["d1:2"]}))
    assert auto.accepts(spaced({"op": "NOOP"}))


def test_over_budget_only_delete_or_noop():
    """Nothing fits the budget: the memory may only shrink or stay."""
    c = extractive_ops_constraint(add=[], update={}, delete=["m1"], open_chars=0)
    auto = Automaton(c)
    assert c.json_schema["properties"]["ops"]["items"]["anyOf"] == [
        {"type": "object", "properties": {"op": {"const": "DELETE"}, "id": {"enum": ["m1"]}},
         "required": ["op", "id"], "additionalProperties": False},
        {"type": "object", "properties": {"op": {"const": "NOOP"}}, "required": ["op"],
         "additionalProperties": False},
    ]
    for text in [*both({"op": "DELETE", "id": "m1"}), *both({"op": "NOOP"})]:
        assert auto.accepts(text), text
    for op in ({"op": "DELETE", "id": "m2"}, {"op": "ADD", "sources": ["d1:0"]},
               {"op": "ADD", "kind": "open", "text": "x"}, {"op": "UPDATE", "id": "m1", "sources": ["d1:0"]}):
        for text in both(op):
            assert not auto.accepts(text), text


def test_schema_shape_and_variant_order(full):
    schema = full.json_schema
    assert schema["required"] == ["ops"] and schema["additionalProperties"] is False
    ops = schema["properties"]["ops"]
    assert (ops["type"], ops["minItems"], ops["maxItems"]) == ("array", 1, 1)
    variants = ops["items"]["anyOf"]
    keys = [list(v["properties"]) for v in variants]
    assert keys == [["op", "sources"], ["op", "kind", "text"], ["op", "id", "sources"], ["op", "id", "sources"],
                    ["op", "id"], ["op"]]
    assert all(v["required"] == k and v["additionalProperties"] is False for v, k in zip(variants, keys))
    assert variants[0]["properties"]["sources"] == {"enum": ADD}
    assert variants[1]["properties"]["text"] == {"type": "string", "minLength": 1, "maxLength": 12}
    # UPDATE variants in the id's (sorted) item order; m9 has no list and is left out
    assert [v["properties"]["id"] for v in variants[2:4]] == [{"const": "m1"}, {"const": "m2"}]
    assert variants[4]["properties"]["id"] == {"enum": DELETE}


# ------------------------------------------------------------------------------- the id
def test_id_is_a_pure_function_and_round_trips(full):
    payload = {"add": ADD, "delete": DELETE, "open": 12, "update": UPDATE}
    assert full.id == EXTRACT_PREFIX + json.dumps(payload, separators=(",", ":"), sort_keys=True)
    again = extractive_ops_constraint(tuple(tuple(s) for s in ADD), dict(reversed(UPDATE.items())), tuple(DELETE), 12)
    assert again == full  # same id and schema whatever the sequence types or the mapping's order
    rebuilt = constraint_by_id(full.id)
    assert rebuilt == full and rebuilt.id == full.id and rebuilt.json_schema == full.json_schema
    small = extractive_ops_constraint([], {}, ["m1"])
    assert small.id == EXTRACT_PREFIX + '{"add":[],"delete":["m1"],"open":0,"update":{}}'
    assert constraint_by_id(small.id) == small
    # the fixed ids still work
    assert constraint_by_id("memory-ops-v1").id == "memory-ops-v1"
    assert constraint_by_id("memory-ops-v2-sources4").id == "memory-ops-v2-sources4"


@pytest.mark.parametrize("payload", [
    "", "{", "[]", "null", '{"add":[]}',
    '{"add":[],"delete":[],"open":0,"update":{},"x":1}',
    '{"add":["d1:0"],"delete":[],"open":0,"update":{}}',  # a list of ids, not of lists
    '{"add":[[]],"delete":[],"open":0,"update":{}}',
    '{"add":[[1]],"delete":[],"open":0,"update":{}}',
    '{"add":[],"delete":"m1","open":0,"update":{}}',
    '{"add":[],"delete":[""],"open":0,"update":{}}',
    '{"add":[],"delete":[],"open":-1,"update":{}}',
    '{"add":[],"delete":[],"open":1.5,"update":{}}',
    '{"add":[],"delete":[],"open":true,"update":{}}',
    '{"add":[],"delete":[],"open":0,"update":[]}',
    '{"add":[],"delete":[],"open":0,"update":{"m1":"d1:0"}}',
    '{"add": [], "delete": [], "open": 0, "update": {}}',  # valid, but not the canonical text
    '{"delete":[],"add":[],"open":0,"update":{}}',
])
def test_malformed_ids_raise_value_error(payload):
    with pytest.raises(ValueError, match="expected"):
        constraint_by_id(EXTRACT_PREFIX + payload)


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="add"):
        extractive_ops_constraint(["d1:0"], {}, [])  # a bare id is not a source list
    with pytest.raises(ValueError, match="delete"):
        extractive_ops_constraint([], {}, "m1")
    with pytest.raises(ValueError, match="open_chars"):
        extractive_ops_constraint([], {}, [], open_chars=-2)


# ------------------------------------------------------------------------- token masks
@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from memsearch.assets.embedded import tokenizer_dir

    return AutoTokenizer.from_pretrained(str(tokenizer_dir()))


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def test_masks_allow_every_token_of_an_allowed_op(tokenizer, full):
    tc = compile_constraint(full, tokenizer)
    for op in ({"op": "ADD", "sources": ["d1:0", "d2:3"]}, {"op": "ADD", "kind": "open", "text": "Who wrote it"},
               {"op": "UPDATE", "id": "m2", "sources": ["d4:1", "d5:0"]}, {"op": "DELETE", "id": "m2"},
               {"op": "NOOP"}):
        for text in both(op):
            ids = encode(tokenizer, text)
            masks = tc.masks_for(ids)
            assert masks.shape == (len(ids), len(tokenizer))
            assert all(bool(masks[p, t]) for p, t in enumerate(ids)), text
            assert int(masks[-1].sum()) == 1  # once complete, EOS alone
    with pytest.raises(ValueError, match="not allowed"):
        tc.masks_for(encode(tokenizer, spaced({"op": "DELETE", "id": "m3"})))


def _first_op_letters(tc, texts) -> set[str]:
    state = tc.automaton.walk('{"ops": [{"op": "')
    allowed = tc.allowed(state).nonzero().flatten().tolist()
    assert allowed
    for i in allowed:  # every allowed token continues some variant's op name
        assert tc.automaton.prefix_ok('{"ops": [{"op": "' + texts[i]), texts[i]
    return {texts[i][0] for i in allowed}


def test_mask_after_op_key_admits_only_the_variants_ops(tokenizer):
    texts = token_texts(tokenizer)
    update_only = compile_constraint(extractive_ops_constraint([], {"m1": [["d1:2"]]}, []), tokenizer)
    assert _first_op_letters(update_only, texts) == {"U", "N"}  # no token starting with A or D
    budget = compile_constraint(extractive_ops_constraint([], {}, ["m1"]), tokenizer)
    assert _first_op_letters(budget, texts) == {"D", "N"}
    full = compile_constraint(extractive_ops_constraint(ADD, UPDATE, DELETE, 12), tokenizer)
    assert _first_op_letters(full, texts) == {"A", "U", "D", "N"}
    # and the whole over-budget walk: only DELETE m1 or NOOP complete
    ids = encode(tokenizer, spaced({"op": "DELETE", "id": "m1"}))
    assert all(bool(m[t]) for m, t in zip(budget.masks_for(ids), ids))
    with pytest.raises(ValueError, match="not allowed"):
        budget.masks_for(encode(tokenizer, spaced({"op": "ADD", "sources": ["d1:0"]})))


def test_replay_through_the_id_reuses_the_compiled_constraint(tokenizer, full):
    tc = compile_constraint(full, tokenizer)
    assert compile_constraint(constraint_by_id(full.id), tokenizer) is tc  # no rebuild
    with pytest.raises(ValueError, match="already names a different constraint"):
        compile_constraint(Constraint(full.id, json_schema={"type": "null"}), tokenizer)


def test_per_call_constraints_live_in_a_bounded_lru(tokenizer, monkeypatch):
    monkeypatch.setattr(constraint_mod, "PER_CALL_CACHE_SIZE", 2)
    cs = [extractive_ops_constraint([[f"d{k}:0"]], {}, []) for k in range(900, 903)]
    first = compile_constraint(cs[0], tokenizer)
    second = compile_constraint(cs[1], tokenizer)
    assert compile_constraint(cs[0], tokenizer) is first  # used again: now the most recent
    compile_constraint(cs[2], tokenizer)  # evicts cs[1], the least recently used
    assert compile_constraint(cs[0], tokenizer) is first
    again = compile_constraint(cs[1], tokenizer)
    assert again is not second  # compiled again, with the same masks
    ids = encode(tokenizer, spaced({"op": "ADD", "sources": ["d901:0"]}))
    assert again.masks_for(ids).equal(second.masks_for(ids))
    assert compile_constraint(constraint_by_id("memory-ops-v1"), tokenizer) is compile_constraint(
        constraint_by_id("memory-ops-v1"), tokenizer)  # fixed ids are not per call


def test_cost_of_one_call(tokenizer):
    """Prints (never asserts) what a per-call constraint costs: build, compile, walk the masks."""
    compile_constraint(constraint_by_id("memory-ops-v1"), tokenizer)  # the vocabulary, once per tokenizer
    singles = [[f"d{i // 3}:{i % 3}"] for i in range(15)]
    pairs = [[a[0], b[0]] for k, a in enumerate(singles) for b in singles[k + 1:]][:100]
    update = {"m1": [["d0:0"], ["d1:1", "d2:2"]], "m2": [["d3:0"]], "m3": [["d4:1"], ["d4:2"]]}
    t0 = time.perf_counter()
    c = extractive_ops_constraint(singles + pairs, update, ["m1", "m2", "m3"], open_chars=80)
    t1 = time.perf_counter()
    tc = compile_constraint(c, tokenizer)
    t2 = time.perf_counter()
    ids = encode(tokenizer, spaced({"op": "UPDATE", "id": "m1", "sources": ["d1:1", "d2:2"]}))[:20]
    tc.masks_for(ids)
    t3 = time.perf_counter()
    compile_constraint(constraint_by_id(c.id), tokenizer).masks_for(ids)
    t4 = time.perf_counter()
    print(f"\nextractive constraint, {len(singles)} single + {len(pairs)} pair sources, 3 updates: build "
          f"{1e3 * (t1 - t0):.2f} ms, compile {1e3 * (t2 - t1):.2f} ms, masks of {len(ids)} tokens (first time) "
          f"{1e3 * (t3 - t2):.1f} ms ({tc.states_seen} states), by id again (cached) {1e3 * (t4 - t3):.2f} ms")


def test_an_escape_cannot_start_in_a_string_that_is_full():
    """Found by sampling: at maxLength characters a backslash was allowed, and the escape it began
    could never be finished (no token allowed: a dead state)."""
    a = Automaton(extractive_ops_constraint([], {}, [], open_chars=5))
    head = '{"ops":[{"op":"ADD","kind":"open","text":"'
    assert a.step(a.walk(head + "abcd"), "\\") and not a.step(a.walk(head + "abcde"), "\\")
    assert a.accepts(head + 'abcd\\u00e9"}]}') and not a.prefix_ok(head + "abcde\\")


def test_what_the_teacher_writes_is_what_the_constraint_can_produce():
    """SFT rows of the extractive oracle (``memory.extractive.format_extractive``) are spelled so
    the per-call constraint accepts them: a pair of sources compact, the gaps as format_ops has them."""
    from memsearch.memory import Add, Delete, Noop, Update
    from memsearch.memory.extractive import format_extractive

    c = extractive_ops_constraint([["d1:0"], ["d1:0", "d2:1"]], {"m1": [["d2:1"]]}, ["m1"], open_chars=20)
    a = Automaton(c)
    for op in (Add("x y", ("d1:0", "d2:1")), Add("x", ("d1:0",)), Add("Find: Paris", (), "open"),
               Update("m1", "y", ("d2:1",), "fact"), Delete("m1"), Noop()):
        text = format_extractive([op])
        assert a.accepts(text), text
    assert format_extractive([Add("x y", ("d1:0", "d2:1"))]) == '{"ops": [{"op": "ADD", "sources": ["d1:0","d2:1"]}]}'


def test_a_bounded_string_admits_no_surrogate_escape_and_unbounded_ones_are_unchanged():
    """The parser refuses a lone surrogate (``\\ud800``-``\\udfff``), so the extractive open text
    (the one bounded string) cannot sample one; the text format's strings keep their masks."""
    from memsearch.memory.action_format import MEMORY_OPS

    a = Automaton(extractive_ops_constraint([], {}, [], open_chars=20))
    head = '{"ops":[{"op":"ADD","kind":"open","text":"'
    assert a.accepts(head + '\\u00e9\\ud7ff\\uE000"}]}')
    assert not a.prefix_ok(head + "\\ud800") and not a.prefix_ok(head + "\\uDfff")
    text_format = Automaton(MEMORY_OPS)
    assert text_format.prefix_ok('{"ops": [{"op": "ADD", "text": "\\ud800')

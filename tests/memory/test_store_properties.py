"""Invariants of the memory under arbitrary sequences of op batches, valid or not.

Batches are drawn as op *templates* and turned into ops against the memory as it is when the
batch is applied: an id reference is either an index into the current items (so UPDATE and
DELETE often hit, and a second reference after a DELETE misses) or an id that never existed.
Drawing everything up front keeps hypothesis fast and its shrinking simple.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from memsearch.memory import Add, Delete, Memory, Noop, Op, Update, format_ops
from memsearch.tokenizer import LexicalTokenizer

SHOWN = frozenset({"d1:0", "d1:1", "d2:0", "d3:4"})
MISSING_IDS = ["m0", "m99", "x", "M1"]
WORDS = "Paris is the capital of France and the Seine flows through it to the sea at Le Havre".split()

# Pools drawn with sampled_from, so the mix of valid and invalid draws is set here. Hypothesis
# draws the first element of a pool more often than the rest (its "simplest" value), so each
# pool starts with a typical valid value; otherwise most batches would be rejected and the
# memory would rarely hold more than one item.
# Texts: empty (invalid) to 20 words (over small budgets), joined by odd white space at times.
_texts = st.tuples(st.sampled_from([3, 1, 2, 5, 8, 12, 20, 0]), st.sampled_from([" ", " ", "\n", " \t "])).map(
    lambda n_sep: n_sep[1].join(WORDS[: n_sep[0]])
)
_sources = st.sampled_from([
    ("d1:0",), ("d1:1", "d2:0"), ("d3:4",), ("d2:0", "d2:0"), ("d1:0", "d1:1", "d3:4"),  # shown
    (), ("d9:0",), ("d1:0", "d1:7"), ("d1",), ("d1:x",), (":0",), ("",),  # none, not shown, malformed
])
_kinds = st.sampled_from(["fact", "fact", "open"])
# int: index into the items at apply time (or the last assigned id when empty); str: literal id.
_id_refs = st.sampled_from([0, 1, 2, 3, 0, 1, *MISSING_IDS])
_by_name = {
    "ADD": st.tuples(st.just("ADD"), _texts, _sources, _kinds),
    "UPDATE": st.tuples(st.just("UPDATE"), _id_refs, _texts, st.none() | _sources, st.none() | _kinds),
    "DELETE": st.tuples(st.just("DELETE"), _id_refs),
    "NOOP": st.just(("NOOP",)),
}
_templates = st.sampled_from(["ADD", "ADD", "ADD", "UPDATE", "UPDATE", "DELETE", "NOOP"]).flatmap(_by_name.get)
# Mostly one op (so a memory grows), sometimes up to four (NOOP mixed in, sequential ids),
# and an empty batch (invalid) now and then.
_batches = st.lists(
    st.one_of(st.lists(_templates, min_size=1, max_size=1), st.lists(_templates, max_size=4)),
    min_size=1, max_size=12,
)


def resolve(template: tuple, memory: Memory) -> Op:
    name, *args = template
    if name in ("UPDATE", "DELETE") and isinstance(args[0], int):
        ids = [item.id for item in memory.items]
        args[0] = ids[args[0] % len(ids)] if ids else f"m{max(memory.next_id - 1, 1)}"
    return {"ADD": Add, "UPDATE": Update, "DELETE": Delete, "NOOP": Noop}[name](*args)


def check_invariants(memory: Memory, budget: int, tokenizer: LexicalTokenizer) -> None:
    assert memory.tokens() == tokenizer.count(memory.render()) <= budget
    ids = [item.id for item in memory.items]
    assert len(ids) == len(set(ids))
    for item in memory.items:
        assert re.fullmatch(r"m[1-9][0-9]*", item.id) and int(item.id[1:]) < memory.next_id
        assert set(item.sources) <= SHOWN
        assert item.kind != "fact" or item.sources
        assert item.text and item.text == " ".join(item.text.split())


@settings(max_examples=150, deadline=None)
@given(budget=st.integers(10, 60), batches=_batches, via_text=st.lists(st.booleans(), min_size=12, max_size=12))
def test_invariants_hold_after_every_batch(budget, batches, via_text):
    tokenizer = LexicalTokenizer()
    memory = Memory(tokenizer, budget)
    ever_assigned: set[str] = set()
    for templates, as_text in zip(batches, via_text, strict=False):  # via_text has 12, enough
        batch = [resolve(t, memory) for t in templates]
        before = memory.snapshot()
        # Half the batches go through the model-text path, which must behave identically.
        result = memory.apply_text(format_ops(batch), SHOWN) if as_text and batch else memory.apply(batch, SHOWN)
        if result.applied:
            # Ids come from the counter in op order and are new for the whole episode.
            n_add = sum(isinstance(op, Add) for op in batch)
            assert result.added_ids == tuple(f"m{before['next_id'] + k}" for k in range(n_add))
            assert not ever_assigned & set(result.added_ids)
            ever_assigned |= set(result.added_ids)
            assert memory.next_id == before["next_id"] + n_add
            assert sum(result.executed.values()) == len(batch)
            assert result.tokens_after == memory.tokens() == result.proposed_tokens
            assert not result.reasons
        else:
            assert result.status == "rejected" and result.reasons
            assert memory.snapshot() == before
            assert result.executed == {"ADD": 0, "UPDATE": 0, "DELETE": 0, "NOOP": 0}
            assert result.tokens_after == result.tokens_before == memory.tokens()
        check_invariants(memory, budget, tokenizer)
        assert {item.id for item in memory.items} <= ever_assigned


@settings(max_examples=100, deadline=None)
@given(budget=st.integers(10, 60), batches=_batches)
def test_batches_that_break_no_visible_rule_apply(budget, batches):
    """No hidden rules: a well-formed single ADD is refused only by the budget; a DELETE of an
    existing id and a lone NOOP always apply."""
    tokenizer = LexicalTokenizer()
    memory = Memory(tokenizer, budget)
    for templates in batches:
        batch = [resolve(t, memory) for t in templates]
        existing = {item.id for item in memory.items}
        before = memory.snapshot()
        result = memory.apply(batch, SHOWN)
        if len(batch) == 1:
            op = batch[0]
            if isinstance(op, Add) and op.text.split() and set(op.sources) <= SHOWN and (
                op.kind == "open" or op.sources
            ):
                assert result.applied == (result.proposed_tokens <= budget), result.reasons
            elif isinstance(op, Delete) and op.id in existing:
                assert result.applied  # the rendering only shrinks ("(empty)" is shorter than any line)
            elif isinstance(op, Noop):
                assert result.applied and memory.snapshot() == before
        check_invariants(memory, budget, tokenizer)

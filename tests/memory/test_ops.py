"""Parsing memory ops from model text: tolerant wrapping, strict structure, never raises."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsearch.memory import Add, Delete, Noop, ParseResult, Update, format_ops, ops_to_json, parse_ops

CANONICAL = (
    '{"ops": [{"op": "ADD", "text": "Paris is in France.", "sources": ["d7:2"], "kind": "fact"},'
    ' {"op": "UPDATE", "id": "m3", "text": "Lyon too.", "sources": ["d7:2", "d2:0"]},'
    ' {"op": "DELETE", "id": "m1"}]}'
)
CANONICAL_OPS = (
    Add("Paris is in France.", ("d7:2",), "fact"),
    Update("m3", "Lyon too.", ("d7:2", "d2:0")),
    Delete("m1"),
)


def test_canonical_object():
    result = parse_ops(CANONICAL)
    assert result.ok and result.error is None
    assert result.ops == CANONICAL_OPS
    assert result.span == (0, len(CANONICAL))


def test_noop_alone():
    assert parse_ops('{"ops": [{"op": "NOOP"}]}').ops == (Noop(),)


@pytest.mark.parametrize(
    "text",
    [
        f"```json\n{CANONICAL}\n```",
        f"```\n{CANONICAL}\n```",
        f"Sure! Here are the operations:\n```json\n{CANONICAL}\n```\nLet me know if you need more.",
        f"I looked at [the evidence] and {{thinking}}... {CANONICAL}",
        f"{CANONICAL} }}]] trailing garbage {{\"ops\": oops",
        f"Answer: {CANONICAL}\n\nExplanation: the [1] item was outdated.",
    ],
    ids=["json-fence", "plain-fence", "chatter-fenced", "chatter-brackets-before", "trailing-garbage",
         "chatter-after"],
)
def test_tolerant_wrapping(text):
    assert parse_ops(text).ops == CANONICAL_OPS


def test_bare_list_of_ops():
    text = 'ops: [{"op": "DELETE", "id": "m2"}, {"op": "ADD", "text": "Q?", "kind": "open"}]'
    assert parse_ops(text).ops == (Delete("m2"), Add("Q?", (), "open"))


def test_op_names_and_kinds_in_any_case():
    text = ('{"ops": [{"op": "add", "text": "a", "sources": ["d1:0"], "kind": "Fact"},'
            ' {"op": " Update ", "id": "m1", "text": "b", "kind": "OPEN"}, {"op": "delete", "id": "m2"}]}')
    assert parse_ops(text).ops == (Add("a", ("d1:0",)), Update("m1", "b", None, "open"), Delete("m2"))


def test_add_defaults_and_update_keeps_omitted_fields():
    result = parse_ops('{"ops": [{"op": "ADD", "text": "t"}, {"op": "UPDATE", "id": "m1", "text": "u"}]}')
    assert result.ops == (Add("t", (), "fact"), Update("m1", "u", None, None))


def test_raw_newline_inside_string_is_tolerated():
    assert parse_ops('{"ops": [{"op": "ADD", "text": "line one\nline two", "sources": ["d1:0"]}]}').ops == (
        Add("line one\nline two", ("d1:0",)),
    )


def test_first_well_formed_value_wins_after_a_malformed_one():
    text = '{"ops": [{"op": "FOO"}]} no wait: {"ops": [{"op": "NOOP"}]}'
    result = parse_ops(text)
    assert result.ops == (Noop(),)
    assert result.span == (text.index('{"ops": [{"op": "NOOP"'), len(text))


def test_nested_list_is_not_taken_on_its_own():
    # The object is malformed (extra key); the valid-looking list inside it must not be used.
    result = parse_ops('{"ops": [{"op": "NOOP"}], "thought": "nothing new"}')
    assert result.ops is None
    assert result.error == "unexpected key 'thought' next to 'ops' (only 'ops' is allowed)"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "empty output"),
        ("   \n ", "empty output"),
        ("I have nothing to add.", "no JSON object or list found"),
        ("{not json at all", "no JSON object or list found"),
        ('{"answer": "Paris"}', "no JSON object with an 'ops' list found"),
        ('{"op": "NOOP"}', 'found a single op object; wrap it as {"ops": [...]}'),
        ('{"ops": "ADD Paris"}', "'ops' must be a list, got string"),
        ('{"ops": {"op": "NOOP"}}', "'ops' must be a list, got object"),
        ('{"ops": []}', 'the ops list is empty (use [{"op": "NOOP"}] to change nothing)'),
        ("[]", 'the ops list is empty (use [{"op": "NOOP"}] to change nothing)'),
        ("see [1, 2]", "op 0 is not an object (got number)"),
        ('{"ops": ["ADD"]}', "op 0 is not an object (got string)"),
        ('{"ops": [{"op": "NOOP"}, {"text": "x"}]}', "op 1: missing field 'op'"),
        ('{"ops": [{"op": 3}]}', "op 0: 'op' must be a string, got number"),
        ('{"ops": [{"op": "INSERT", "text": "x"}]}',
         "op 0: unknown op 'INSERT' (expected ADD, UPDATE, DELETE or NOOP)"),
        ('{"ops": [{"op": "ADD", "sources": ["d1:0"]}]}', "op 0 (ADD): missing field 'text'"),
        ('{"ops": [{"op": "UPDATE", "id": "m1"}]}', "op 0 (UPDATE): missing field 'text'"),
        ('{"ops": [{"op": "UPDATE", "text": "x"}]}', "op 0 (UPDATE): missing field 'id'"),
        ('{"ops": [{"op": "DELETE"}]}', "op 0 (DELETE): missing field 'id'"),
        ('{"ops": [{"op": "DELETE", "id": 1}]}', "op 0 (DELETE): 'id' must be a string, got number"),
        ('{"ops": [{"op": "ADD", "text": null}]}', "op 0 (ADD): 'text' must be a string, got null"),
        ('{"ops": [{"op": "ADD", "text": "x", "sources": "d1:0"}]}',
         "op 0 (ADD): 'sources' must be a list of strings"),
        ('{"ops": [{"op": "ADD", "text": "x", "sources": ["d1:0", 2]}]}',
         "op 0 (ADD): 'sources' must be a list of strings"),
        ('{"ops": [{"op": "ADD", "text": "x", "kind": "guess"}]}',
         "op 0 (ADD): 'kind' must be 'fact' or 'open', got \"guess\""),
        ('{"ops": [{"op": "ADD", "text": "x", "kind": 1}]}',
         "op 0 (ADD): 'kind' must be 'fact' or 'open', got 1"),
        ('{"ops": [{"op": "ADD", "text": "x", "source": ["d1:0"]}]}',
         "op 0 (ADD): unexpected field 'source' (allowed: op, text, sources, kind)"),
        ('{"ops": [{"op": "DELETE", "id": "m1", "text": "x"}]}',
         "op 0 (DELETE): unexpected field 'text' (allowed: op, id)"),
        ('{"ops": [{"op": "NOOP", "reason": "nothing new"}]}',
         "op 0 (NOOP): unexpected field 'reason' (allowed: op)"),
        # Cut off by the token limit before the list closed.
        ('{"ops": [{"op": "ADD", "text": "x", "sources": ["d1:0"]}',
         "invalid JSON in the ops object: Expecting ',' delimiter at char 56"),
        ('{"ops": [{"op": "NOOP"}, ]}', "invalid JSON in the ops object: Expecting value at char 25"),
    ],
)
def test_malformed_gives_reason(text, error):
    result = parse_ops(text)
    assert result == ParseResult(None, error, result.span)
    assert not result.ok


def test_complete_list_in_unclosed_object_is_used():
    # Output cut off after the list closed but before the final brace: the ops are complete.
    assert parse_ops('{"ops": [{"op": "NOOP"}]').ops == (Noop(),)


def test_error_prefers_the_ops_object_over_chatter_lists():
    result = parse_ops('Step [1] done. {"ops": [{"op": "DELETE"}]}')
    assert result.error == "op 0 (DELETE): missing field 'id'"


def test_round_trip_format_ops():
    text = format_ops(CANONICAL_OPS + (Add("Q?", (), "open"),))
    assert json.loads(text) == ops_to_json(CANONICAL_OPS + (Add("Q?", (), "open"),))
    assert parse_ops(text).ops == CANONICAL_OPS + (Add("Q?", (), "open"),)


def test_non_string_input_and_pathological_nesting_do_not_raise():
    assert parse_ops(None).error == "expected text, got NoneType"  # type: ignore[arg-type]
    assert parse_ops("[" * 50_000).error == "gave up after 1000 brackets that start no JSON value"
    assert parse_ops("[" * 5000 + "]" * 5000).ops is None
    # Brackets that fail cheaply before the real answer are fine below the cap.
    assert parse_ops("[x " * 900 + '{"ops": [{"op": "NOOP"}]}').ops == (Noop(),)


def test_op_constructors_reject_programming_errors():
    with pytest.raises(ValueError):
        Add("x", (), "guess")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Add("x", "d1:0")  # type: ignore[arg-type]
    assert Add("x", ["d1:0"]).sources == ("d1:0",)  # type: ignore[arg-type]


# --- fuzzing ------------------------------------------------------------------------------

def _check_result(result: ParseResult) -> None:
    assert isinstance(result, ParseResult)
    assert (result.ops is None) != (result.error is None)
    if result.ops is not None:
        assert len(result.ops) > 0
        assert all(isinstance(op, (Add, Update, Delete, Noop)) for op in result.ops)
    else:
        assert isinstance(result.error, str) and result.error


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_fuzz_any_text_never_raises(text):
    _check_result(parse_ops(text))


FRAGMENTS = [
    "{", "}", "[", "]", ":", ",", " ", "\n", "```json\n", "```", '"ops"', '"op"', '"ADD"', '"add"',
    '"UPDATE"', '"DELETE"', '"NOOP"', '"noop"', '"id"', '"m1"', '"text"', '"Paris"', '""', '"sources"',
    '["d1:0"]', '[]', '"kind"', '"fact"', '"open"', "null", "true", "1", "-2.5e3", '"\\u00e9"', '"\\',
    "Sure! ", "{\"ops\": [", "{\"op\": \"ADD\", \"text\": \"x\"}", "]}",
]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join))
def test_fuzz_json_fragments_never_raise(text):
    _check_result(parse_ops(text))


_texts = st.text(max_size=30)
_sources = st.lists(st.text(max_size=8), max_size=3).map(tuple)
_kinds = st.sampled_from(["fact", "open"])
_ops = st.one_of(
    st.builds(Add, _texts, _sources, _kinds),
    st.builds(Update, _texts, _texts, st.none() | _sources, st.none() | _kinds),
    st.builds(Delete, _texts),
    st.just(Noop()),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_ops, min_size=1, max_size=5), st.text(max_size=20), st.text(max_size=20),
       st.booleans(), st.booleans())
def test_formatted_ops_survive_wrapping(ops, before, after, fenced, bare):
    body = format_ops(ops)
    if bare:
        body = json.dumps(ops_to_json(ops)["ops"], ensure_ascii=False)
    if fenced:
        body = f"```json\n{body}\n```"
    # Chatter without brackets before (a bracket there could open a competing value); anything
    # after, since a decoded value ends where it ends.
    before = before.replace("{", "").replace("[", "")
    assert parse_ops(f"{before}{body}{after}").ops == tuple(ops)


@pytest.mark.parametrize("field, op", [
    ("text", r'{"op": "ADD", "text": "Paris \ud800", "sources": ["d1:0"]}'),
    ("id", r'{"op": "UPDATE", "id": "m1\udc00", "text": "x"}'),
    ("sources", r'{"op": "ADD", "text": "x", "sources": ["d1:0\ud800"]}'),
])
def test_an_op_with_a_lone_surrogate_escape_is_an_invalid_action(field, op):
    """Stored in memory, "\\ud800" made the trajectory unwritable (UTF-8) and ended the run."""
    result = parse_ops('{"ops": [%s]}' % op)
    assert result.ops is None
    assert f"'{field}' holds a lone surrogate escape" in result.error

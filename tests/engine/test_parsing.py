"""Reading decisions out of real-looking model text never raises and says why it failed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from memsearch.engine.parsing import evidence_ids_in, parse_controller, parse_reader


def test_controller_forms():
    assert parse_controller("SEARCH: Ed Wood nationality").query == "Ed Wood nationality"
    assert parse_controller('Thought: need more.\nsearch("Scott Derrickson")').query == "Scott Derrickson"
    assert parse_controller("I have enough. FINISH").kind == "finish"
    assert parse_controller("FINISH, no wait, SEARCH: x").kind == "finish"  # the first decision counts
    bad = parse_controller("Let me think about it")
    assert bad.kind == "invalid" and bad.error == "neither 'SEARCH: <query>' nor 'FINISH' found"
    assert parse_controller("SEARCH:   ").kind == "invalid"


def test_reader_forms():
    a = parse_reader("Answer: Chief of Protocol\nEvidence: [d3:0], [d7:2]")
    assert (a.answer, a.citations) == ("Chief of Protocol", ("d3:0", "d7:2"))
    assert parse_reader("The answer is yes. See [d1:0].").answer == "yes"
    assert parse_reader("Reasoning...\n\\boxed{\\text{Paris}}").answer == "Paris"
    assert parse_reader("**American** [d1:0]").answer == "American"
    empty = parse_reader("   ")
    assert empty.answer is None and empty.error == "no answer found in the reader output"


def test_evidence_ids_keep_first_mention_order():
    assert evidence_ids_in("see d2:1, [d10:0] and d2:1 again; not 12:30 or http://x:80") == ("d2:1", "d10:0")


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parsers_never_raise(text):
    parse_controller(text)
    parse_reader(text)


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet="ab1:-_/.@ [],é", max_size=40))
def test_evidence_ids_match_the_reference_pattern(text):
    """The linear-time id finder gives exactly the matches of the id pattern's own finditer."""
    from memsearch.text.actions import EVIDENCE_ID_IN_TEXT, evidence_id_spans

    assert evidence_id_spans(text) == [m.span() for m in EVIDENCE_ID_IN_TEXT.finditer(text)]


def test_evidence_ids_in_hyphenated_runs():
    assert evidence_ids_in("x-d1:0, 1-d2:3, --d3:4 and a-b-c:5") == ("x-d1:0", "d2:3", "d3:4", "a-b-c:5")
    assert parse_reader("Answer: Paris d1:0 [d2:1]").answer == "Paris"

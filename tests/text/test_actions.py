"""Action parsers on raw model output: what they read, and linear time on degenerate text
(issue 11 item 7). That the id finder equals its reference pattern is a property test in
tests/engine/test_parsing.py.

Model output is parsed inside the event loop that drives every concurrent episode: the old
controller pattern took 14 s on a 2,000-space query and never finished on 20,000, freezing the
whole run. The time bound below is a guard against that class of bug (seconds versus hours), not
a speed target.
"""

from __future__ import annotations

import time

import pytest

from memsearch.text.actions import evidence_ids_in, parse_controller


def test_evidence_id_examples():
    assert evidence_ids_in("see d2:1, [d10:0] and d2:1 again; not 12:30 or http://x:80") == ("d2:1", "d10:0")
    assert evidence_ids_in("a-b-d1:0 then -c2:3") == ("a-b-d1:0", "c2:3")  # leftmost start of a run
    assert evidence_ids_in("d1:0-b2:3") == ("d1:0", "b2:3")
    assert evidence_ids_in("x:1:2, mail@d1:0, path/d1:0, d1:0x, d1:0:") == ()


@pytest.mark.parametrize(
    "text, kind, query",
    [
        ("SEARCH: Ed Wood nationality", "search", "Ed Wood nationality"),
        ('Thought: need more.\nsearch("Scott Derrickson")', "search", "Scott Derrickson"),
        ("SEARCH(foo))", "search", "foo)"),  # one closing parenthesis belongs to the call
        ("SEARCH:\n  <Ed Wood>  \nmore text", "search", "Ed Wood"),  # the head may end its line
        ("research: not a head. FINISH", "finish", None),
        ("FINISH, no wait, SEARCH: x", "finish", None),
        ("SEARCH:   ", "invalid", None),
        ("SEARCH:)", "invalid", None),  # used to search for ")"
        ("Let me think about it", "invalid", None),
    ],
)
def test_controller_readings(text, kind, query):
    action = parse_controller(text)
    assert (action.kind, action.query) == (kind, query)


def test_controller_errors_say_what_was_missing():
    assert parse_controller("SEARCH:  \n ").error == "SEARCH without a query"
    assert parse_controller("hmm").error == "neither 'SEARCH: <query>' nor 'FINISH' found"


ADVERSARIAL = {
    "spaces inside a query": "SEARCH: x" + " " * 100_000 + "y",
    "spaces then a paren": "SEARCH(" + " " * 100_000 + ")" * 3,
    "dash run": "a-" * 50_000,
    "dash run ending in an id": "a-" * 50_000 + "d1:0",
    "colon chain": "d1:" * 40_000,
    "word run without colon": "w" * 100_000 + ":",
    "heads without queries": "SEARCH " * 20_000,
    "brackets": "[" * 50_000 + "d1:0" + "]" * 50_000,
    "braces": "{" * 50_000 + "}" * 50_000,
    "newlines and spaces": "SEARCH:" + " \n" * 50_000,
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_parsers_are_linear_on_degenerate_text(name):
    text = ADVERSARIAL[name]
    t0 = time.perf_counter()
    parse_controller(text)
    evidence_ids_in(text)
    elapsed = time.perf_counter() - t0
    # Linear code takes milliseconds on these 100K-character inputs; the replaced patterns took
    # from seconds (quadratic) to hours (cubic). 2 s leaves room for a loaded CI machine.
    assert elapsed < 2.0, f"{name}: {elapsed:.2f} s on {len(text)} characters"

r"""Answer extraction (``memsearch.text.answers``): every box rule of its docstring, LaTeX unwrapping,
and linear time on long adversarial replies (the engine's tolerant reader parse included)."""

from __future__ import annotations

import time

import pytest

from memsearch.engine.parsing import parse_reader
from memsearch.text.answers import boxed_answer, boxed_prediction, unwrap_latex_text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # rule 2/3: the space box of MemAgent ("\boxed " then the answer, up to the first "$")
        (r"so $\boxed 42$.", "42"),
        (r"The answer: \boxed Paris", "Paris"),
        (r"\boxed  Chief of Protocol", "Chief of Protocol"),
        (r"\boxed{London} but then \boxed Paris$ ok", "Paris"),  # a space box anywhere wins
        (r"\boxed Paris$ ... \boxed{London}", "Paris"),
        (r"\boxed {Paris}", "Paris"),  # white space then a brace: a brace box
        # rule 4: the last \boxed decides
        (r"\boxed{A} then \boxed{B", None),
        (r"\boxed{A} and a stray \boxed", None),
        (r"\boxed{A} \boxedfoo", None),
        # rule 5: \fbox only without any \boxed
        (r"\fbox{Paris}", "Paris"),
        (r"\fbox {Paris} maybe", "Paris"),
        (r"\boxed{London} \fbox{Paris}", "London"),
        (r"\fbox{Paris", None),
        # rule 1: text before the last </think> is not searched
        (r"<think>\boxed{London}</think> It is \boxed{Paris}", "Paris"),
        (r"<think>\boxed{London}</think> It is Paris", None),
        # rule 6 and 7
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\boxed{}", ""),
        ("Paris", None),
        (None, None),
    ],
)
def test_box_rules(text, expected):
    assert boxed_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\text{Paris}", "Paris"),
        (r"\textbf{\text{The Beatles}}", "The Beatles"),
        (r"\text {New} \mathrm{York}", "New York"),
        (r"\text{a{b}c}", "a{b}c"),  # inner plain braces stay
        (r"\text{Paris", r"\text{Paris"),  # unclosed: kept as written
        (r"\frac{1}{2}", r"\frac{1}{2}"),  # not a text wrapper
        (r"\emph{x}\%", r"x\%"),
    ],
)
def test_unwrap_latex_text(text, expected):
    assert unwrap_latex_text(text) == expected


def test_boxed_prediction_unwraps_and_strips():
    assert boxed_prediction(r"so \boxed{ \text{ Paris } }") == "Paris"
    assert boxed_prediction(r"\fbox{\textbf{Chief of Protocol}}") == "Chief of Protocol"
    assert boxed_prediction("It is probably Paris") is None


N = 100_000
ADVERSARIAL = {
    "blank lines": "\n" * N + "x",
    "answer line with inner spaces": "answer: x" + " " * N + "y",
    "nested text wrappers": r"\boxed{" + r"\text{" * (N // 6) + "x" + "}" * (N // 6 + 1),
    "unclosed boxes": r"\boxed{" * (N // 7),
    "space boxes": r"\boxed " * (N // 7),
    "open brackets": "[" * N + "x",
    "the answer is": "the answer is " * (N // 14),
    "hyphenated run": "Answer: " + "a-" * (N // 2),  # the evidence-id pattern rescanned it: 50 s
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_extraction_is_linear_time(name):
    """Each 100K-character reply is read in well under a second; the quadratic versions these
    replace took about 17 s on the blank lines at a fifth of this length."""
    text = ADVERSARIAL[name]
    started = time.perf_counter()
    boxed_answer(text)
    boxed_prediction(text)
    parse_reader(text)
    assert time.perf_counter() - started < 1.0, name

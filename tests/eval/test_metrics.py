"""Answer and provenance metrics: hand-computed values, the HotpotQA formulas, aggregation."""

from __future__ import annotations

import math
import re
import string
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsearch.eval.metrics import (
    ANSWER_METRICS,
    aggregate,
    answer_metric,
    boxed_em,
    citation_scores,
    exact_match,
    f1,
    memory_support_precision,
    normalize_answer,
    sub_em,
    support_recall,
)
from memsearch.text.answers import boxed_answer

# --- reference: the HotpotQA evaluation formulas, written from the published definition -----


def ref_normalize(s):
    s = s.lower()
    s = "".join(c for c in s if c not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def ref_em(prediction, gold):
    return float(ref_normalize(prediction) == ref_normalize(gold))


def ref_f1(prediction, gold):
    p, g = ref_normalize(prediction), ref_normalize(gold)
    if p in ("yes", "no", "noanswer") and p != g:
        return 0.0
    if g in ("yes", "no", "noanswer") and p != g:
        return 0.0
    common = Counter(p.split()) & Counter(g.split())
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(p.split())
    recall = same / len(g.split())
    return 2 * precision * recall / (precision + recall)


TRICKY = [
    ("The Beatles", "Beatles"),
    ("U.S.A.", "USA"),
    ("an apple a day", "apple day"),
    ("Yes.", "yes"),
    ("no", "no idea"),
    ("noanswer", "no answer"),
    ("  Barack\t Obama\n", "Obama, Barack"),
    ("the the the", "A"),
    ("Theatre", "the atre"),
    ("1,000", "1000"),
    ("rock-and-roll", "rock and roll"),
    ("Café", "cafe"),
    ("1 2 2", "2 2 3"),
    ("it's", "its"),
    ("New York City", "New York"),
    ("Anne and the Apostles", "anne apostles"),
    ("yes it is", "yes"),
]


@pytest.mark.parametrize(("prediction", "gold"), TRICKY)
def test_matches_hotpotqa_formulas(prediction, gold):
    assert normalize_answer(prediction) == ref_normalize(prediction)
    assert exact_match(prediction, [gold]) == ref_em(prediction, gold)
    assert f1(prediction, [gold]) == pytest.approx(ref_f1(prediction, gold), abs=1e-12)


_WORDS = st.sampled_from(
    ["a", "an", "the", "The", "yes", "no", "Noanswer", "cat", "Cat.", "dog", "x-y", "U.S.", "", " "]
)
_ANSWERS = st.lists(_WORDS, max_size=6).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(prediction=_ANSWERS, golds=st.lists(_ANSWERS, min_size=1, max_size=3))
def test_matches_hotpotqa_formulas_max_over_golds(prediction, golds):
    assert exact_match(prediction, golds) == max(ref_em(prediction, g) for g in golds)
    assert f1(prediction, golds) == pytest.approx(max(ref_f1(prediction, g) for g in golds), abs=1e-12)


# --- normalization ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  An   apple,\ta day! ", "apple day"),
        ("U.S.A.", "usa"),
        ("rock-and-roll", "rockandroll"),
        ("Theatre of the Absurd", "theatre of absurd"),
        ("a", ""),
        ("", ""),
        ('"Hello," she said.', "hello she said"),
        ("Café", "café"),  # only ASCII punctuation and no accent folding, as the official script
        ("the-end", "theend"),  # punctuation goes first, so "the" is no longer a word here
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


# --- exact match and F1 ----------------------------------------------------------------------


def test_exact_match_cases():
    assert exact_match("The Eiffel Tower.", ["eiffel tower"]) == 1.0
    assert exact_match("Eiffel", ["eiffel tower"]) == 0.0
    assert exact_match("NYC", ["New York City", "NYC"]) == 1.0  # max over golds
    assert exact_match(None, ["anything"]) == 0.0


def test_f1_hand_computed():
    # P = 2/3, R = 1 -> 0.8
    assert f1("New York City", ["New York"]) == pytest.approx(0.8)
    # pred tokens [cat, sat, on, mat], gold [cat, on, mat]: P = 3/4, R = 1 -> 6/7
    assert f1("The cat sat on the mat.", ["cat on mat"]) == pytest.approx(6 / 7)
    # duplicates count by multiset: pred [1,2,2] gold [2,2,3]: common 2 -> P = R = 2/3
    assert f1("1 2 2", ["2 2 3"]) == pytest.approx(2 / 3)
    assert f1("London", ["Paris"]) == 0.0


def test_f1_max_over_golds():
    assert f1("New York City", ["Los Angeles", "New York"]) == pytest.approx(0.8)
    assert f1("New York City", ["New York", "new york city"]) == 1.0


def test_f1_yes_no_rule():
    assert f1("yes it is", ["yes"]) == 0.0  # token overlap would give 0.5
    assert f1("yes", ["yes sir"]) == 0.0
    assert f1("noanswer", ["no answer"]) == 0.0
    assert f1("No.", ["no"]) == 1.0
    assert f1("no", ["yes", "No"]) == 1.0  # the matching gold wins


def test_f1_empty_strings():
    assert f1("", ["Paris"]) == 0.0
    assert f1("the", ["a"]) == 0.0  # both normalize to "": no shared token, as HotpotQA
    assert exact_match("the", ["a"]) == 1.0  # official EM compares the normalized strings


@pytest.mark.parametrize("metric", [exact_match, f1, sub_em, boxed_em])
def test_none_prediction_scores_zero(metric):
    assert metric(None, ["Paris"]) == 0.0


@pytest.mark.parametrize("metric", [exact_match, f1, sub_em, boxed_em])
def test_golds_must_be_a_non_empty_sequence(metric):
    with pytest.raises(TypeError, match="single string"):
        metric("Paris", "Paris")
    with pytest.raises(ValueError, match="at least one gold"):
        metric("Paris", [])


# --- sub_em ----------------------------------------------------------------------------------


def test_sub_em_both_directions():
    assert sub_em("The answer is Paris, France.", ["paris"]) == 1.0  # gold in prediction
    assert sub_em("Paris", ["Paris, France"]) == 1.0  # prediction in gold
    assert sub_em("London", ["Paris"]) == 0.0
    assert sub_em("London", ["Paris", "the city of London"]) == 1.0


def test_sub_em_empty_prediction_never_contained():
    assert sub_em("", ["Paris"]) == 0.0
    assert sub_em("The.", ["Paris"]) == 0.0  # normalizes to ""
    assert sub_em("  ", ["Paris"]) == 0.0
    assert sub_em("Paris", ["the"]) == 0.0  # an empty gold is no match either


def test_sub_em_is_character_containment():
    # By the rule, gold "no" is contained in "no idea": sub_em is loose by design (RULER-HQA).
    assert sub_em("no idea", ["no"]) == 1.0
    assert sub_em("Parisian", ["Paris"]) == 1.0


# --- boxed -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"The answer is \boxed{\text{Paris}}.", r"\text{Paris}"),
        (r"\boxed{London} wait, no: \boxed{Paris}", "Paris"),
        (r"\boxed{a{b{c}}d}", "a{b{c}}d"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces do not count
        (r"\boxed { Paris }", "Paris"),
        (r"\boxed{}", ""),
        (r"\boxed{\text{Paris}", None),  # unbalanced
        (r"\boxed{A} then \boxed{B", None),  # the last box is unfinished: no final answer
        ("Paris", None),
        ("{Paris}", None),
        (None, None),
    ],
)
def test_boxed_answer(text, expected):
    assert boxed_answer(text) == expected


def test_boxed_em():
    assert boxed_em(r"so \boxed{\text{Paris}}", ["Paris"]) == 1.0
    assert boxed_em(r"\boxed{\textbf{The Beatles}}", ["Beatles"]) == 1.0
    assert boxed_em(r"\boxed{Paris} ... \boxed{London}", ["Paris"]) == 0.0  # last wins
    assert boxed_em(r"\boxed{NYC}", ["New York City", "NYC"]) == 1.0
    assert boxed_em("Paris", ["Paris"]) == 0.0  # no box
    assert boxed_em(r"\boxed{Paris", ["Paris"]) == 0.0


def test_answer_metric_registry():
    assert answer_metric("sub_em") is sub_em
    assert set(ANSWER_METRICS) == {"em", "f1", "sub_em", "boxed_em"}
    with pytest.raises(KeyError, match="valid names: em, f1, sub_em, boxed_em"):
        answer_metric("subem")


# --- provenance ------------------------------------------------------------------------------

GOLD = ["d1:0", "d2:1", "d2:3"]


def test_support_recall():
    assert support_recall(["d1:0", "d2:3", "d9:1"], GOLD) == pytest.approx(2 / 3)
    assert support_recall(["d1:0", "d1:0"], GOLD) == pytest.approx(1 / 3)
    assert support_recall({"d1:0", "d2:1", "d2:3", "d4:0"}, GOLD) == 1.0
    assert support_recall([], GOLD) == 0.0
    assert support_recall(None, GOLD) == 0.0
    assert support_recall(["d1:0"], ["d1:0", "d1:0"]) == 1.0  # gold counted once
    assert support_recall(["d1:0"], []) is None
    assert support_recall(["d1:1"], ["d1:10"]) == 0.0  # exact ids, no prefix match


def test_memory_support_precision():
    # cited d1:0 d2:1 d9:9 d9:8; counted (faithful) d1:0 d9:9; gold d1:0 d2:1 d2:3: 1 / 4
    assert memory_support_precision(["d1:0", "d2:1", "d9:9", "d9:8"], ["d1:0", "d9:9"], GOLD) == 0.25
    assert memory_support_precision(["d1:0", "d2:1"], ["d1:0", "d2:1"], GOLD) == 1.0
    assert memory_support_precision(["d1:0", "d1:0", "d9:9"], ["d1:0"], GOLD) == 0.5  # distinct ids
    assert memory_support_precision(["d1:0", "d2:1"], [], GOLD) == 0.0  # cited gold, but by no faithful item
    assert memory_support_precision(["d9:9"], ["d1:0"], GOLD) == 0.0  # counted ids outside the cited ones ignored
    assert memory_support_precision([], [], GOLD) is None  # the memory cites nothing
    assert memory_support_precision(None, None, GOLD) is None
    assert memory_support_precision(["d1:0"], ["d1:0"], []) is None  # no gold facts


def test_citation_scores():
    # p = 1/2, r = 1/3, f1 = 2 * (1/2) * (1/3) / (5/6) = 0.4
    scores = citation_scores(["d1:0", "d9:9"], GOLD)
    assert scores == pytest.approx({"precision": 0.5, "recall": 1 / 3, "f1": 0.4})
    assert citation_scores(GOLD, GOLD) == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    duplicated = citation_scores(["d1:0", "d1:0"], GOLD)  # cited once, counted once
    assert duplicated == pytest.approx({"precision": 1.0, "recall": 1 / 3, "f1": 0.5})
    assert citation_scores(["d9:9"], GOLD) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_citation_scores_edge_cases():
    # Nothing cited while gold exists: precision 0.0 (stays in the mean), not None.
    assert citation_scores([], GOLD) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert citation_scores(None, GOLD) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    # No gold: nothing to judge against.
    assert citation_scores(["d1:0"], []) == {"precision": None, "recall": None, "f1": None}
    assert citation_scores([], []) == {"precision": None, "recall": None, "f1": None}
    with pytest.raises(TypeError, match="single string"):
        citation_scores("d1:0", GOLD)


# --- aggregate -------------------------------------------------------------------------------


def test_aggregate_skips_none():
    rows = [
        {"em": 1.0, "f1": 0.5, "recall": None, "task": "t1"},
        {"em": 0.0, "f1": 1.0, "recall": 0.5, "task": "t2"},
        {"em": True, "recall": None, "task": "t3"},
    ]
    result = aggregate(rows, ["em", "f1", "recall", "absent"])
    assert result["n"] == 3
    assert result["mean"] == pytest.approx({"em": 2 / 3, "f1": 0.75, "recall": 0.5, "absent": None})
    assert result["count"] == {"em": 3, "f1": 2, "recall": 1, "absent": 0}
    # keys=None picks every all-numeric key in first-seen order; "task" is text, so skipped
    auto = aggregate(rows)
    assert list(auto["mean"]) == ["em", "f1", "recall"]
    assert auto["count"] == {"em": 3, "f1": 2, "recall": 1}


def test_aggregate_empty_and_errors():
    assert aggregate([], ["em"]) == {"n": 0, "mean": {"em": None}, "count": {"em": 0}}
    assert aggregate([]) == {"n": 0, "mean": {}, "count": {}}
    with pytest.raises(ValueError, match="row 1: em: expected a number"):
        aggregate([{"em": 1.0}, {"em": "1"}], ["em"])
    with pytest.raises(ValueError, match="row 0: em: NaN"):
        aggregate([{"em": math.nan}], ["em"])
    with pytest.raises(TypeError, match="single string"):
        aggregate([{"em": 1.0}], "em")


def test_aggregate_exact_sum():
    rows = [{"x": 0.1}] * 10
    assert aggregate(rows, ["x"])["mean"]["x"] == 0.1

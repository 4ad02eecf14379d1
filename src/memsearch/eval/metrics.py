"""Per-task metrics as small pure functions: answers, provenance, and their aggregation.

    from memsearch.eval.metrics import exact_match, f1, sub_em, boxed_em, citation_scores, memory_support_precision

    exact_match("The Eiffel Tower", ["Eiffel Tower"])            # 1.0
    f1("no", ["yes"])                                             # 0.0 (yes/no rule)
    sub_em("It was Paris, France.", ["Paris"])                   # 1.0 (RULER-HQA)
    boxed_em(r"so \\boxed{\\text{Paris}}", ["Paris"])              # 1.0
    citation_scores(["d1:0", "d9:3"], ["d1:0", "d2:1"])          # p 0.5, r 0.5, f1 0.5
    memory_support_precision(["d1:0", "d9:3"], ["d1:0"], ["d1:0"])  # 0.5

Answer metrics follow the official HotpotQA evaluation script (SQuAD normalization, max over
gold answers). Every answer metric takes ``prediction=None`` (a failed request) and scores it 0,
so failed requests stay in the denominator (docs/design.md §6). ``golds`` must be a non-empty
sequence of strings; a bare string is refused because iterating it would score characters.

``register_metric`` names a per-task metric (a function of the trajectory and the label) and how it
aggregates; every metrics row and summary lists the registered ones (``eval.score``,
``eval.runner``).

Provenance metrics compare evidence ids (``"doc_id:sentence_index"``, see
``memsearch.data.records``) as exact strings, as sets. They return ``None`` when the task has
no gold supporting facts: such a task carries no provenance label, so it is left out of the
provenance means instead of counting as 0 or 1.
"""

from __future__ import annotations

import math
import numbers
import re
import string
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memsearch.registry import Registry
from memsearch.text.answers import boxed_prediction

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# HotpotQA: a yes/no/noanswer answer shares no partial credit with anything but itself.
_SPECIAL_ANSWERS = frozenset({"yes", "no", "noanswer"})


def normalize_answer(s: str) -> str:
    """SQuAD / HotpotQA answer normalization.

    Lower-case, remove ASCII punctuation (``string.punctuation``; as the official script, so
    "U.S." becomes "us" and "a-b" becomes "ab"), replace the whole words a / an / the with a
    space, then collapse runs of white space and strip. Order matters and is the official one.
    """
    text = s.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _gold_list(golds: Sequence[str]) -> list[str]:
    if isinstance(golds, str):
        raise TypeError("golds must be a sequence of answer strings, not a single string; wrap it: [gold]")
    gold_list = list(golds)
    if not gold_list:
        raise ValueError("golds is empty: a task needs at least one gold answer")
    return gold_list


def _em_one(pred_norm: str, gold_norm: str) -> float:
    return float(pred_norm == gold_norm)


def _f1_one(pred_norm: str, gold_norm: str) -> float:
    if (pred_norm in _SPECIAL_ANSWERS or gold_norm in _SPECIAL_ANSWERS) and pred_norm != gold_norm:
        return 0.0
    pred_tokens = pred_norm.split()
    gold_tokens = gold_norm.split()
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _sub_em_one(pred_norm: str, gold_norm: str) -> float:
    # The empty string is a substring of everything; it must never earn credit.
    if not pred_norm or not gold_norm:
        return 0.0
    return float(gold_norm in pred_norm or pred_norm in gold_norm)


def _max_over_golds(one: Callable[[str, str], float], prediction: str | None, golds: Sequence[str]) -> float:
    gold_list = _gold_list(golds)
    if prediction is None:
        return 0.0
    pred_norm = normalize_answer(prediction)
    return max(one(pred_norm, normalize_answer(g)) for g in gold_list)


def exact_match(prediction: str | None, golds: Sequence[str]) -> float:
    """1.0 when the normalized prediction equals some normalized gold answer, else 0.0.

    As the official script, two strings that both normalize to "" match; ``None`` scores 0.
    """
    return _max_over_golds(_em_one, prediction, golds)


def f1(prediction: str | None, golds: Sequence[str]) -> float:
    """Token-level F1 between normalized prediction and gold, max over gold answers.

    HotpotQA rule: when either normalized side is "yes", "no" or "noanswer" and the two differ,
    F1 is 0. No shared token (including two empty strings) gives 0; ``None`` scores 0.
    """
    return _max_over_golds(_f1_one, prediction, golds)


def sub_em(prediction: str | None, golds: Sequence[str]) -> float:
    """RULER-HQA substring match: normalized gold inside normalized prediction, or the reverse.

    Containment is on characters, as in the reference implementation, so gold "no" is found
    in "no idea" (and in "not sure"): a loose metric by design. A prediction or gold that
    normalizes to "" never matches; ``None`` scores 0.
    """
    return _max_over_golds(_sub_em_one, prediction, golds)


def boxed_em(text: str | None, golds: Sequence[str]) -> float:
    r"""Exact match of the final boxed answer in ``text``; 0.0 when there is no complete box.

    The box is read by ``memsearch.text.answers.boxed_prediction`` (``\boxed{}``, ``\boxed x``,
    ``\fbox{}``; every rule is in that module's docstring); text wrappers such as
    ``\text{...}`` are unwrapped before normalization, so ``\boxed{\text{Paris}}`` matches "Paris".
    """
    gold_list = _gold_list(golds)
    answer = boxed_prediction(text)
    if answer is None:
        return 0.0
    return exact_match(answer, gold_list)


# Answer metrics by name, for configs and reports.
ANSWER_METRICS: dict[str, Callable[[str | None, Sequence[str]], float]] = {
    "em": exact_match,
    "f1": f1,
    "sub_em": sub_em,
    "boxed_em": boxed_em,
}


def answer_metric(name: str) -> Callable[[str | None, Sequence[str]], float]:
    """The answer metric called ``name``; a ``KeyError`` listing the valid names on a typo."""
    try:
        return ANSWER_METRICS[name]
    except KeyError:
        raise KeyError(f"unknown answer metric {name!r}; valid names: {', '.join(ANSWER_METRICS)}") from None


@dataclass(frozen=True)
class Metric:
    """A per-task metric of a run's rows and summary. ``score(trajectory, label)`` returns a
    number, or ``None`` where the metric does not apply to the task (no gold supporting facts):
    the summary means it over the tasks with a number (``aggregate``). ``answer``: it scores the
    answer, so a failed task scores 0 on it and stays in the mean's denominator; the others
    (what the episode saw and stored) are kept as measured (``eval.score``)."""

    name: str
    score: Callable[[Any, Any], float | None]
    answer: bool = False


METRICS: Registry[Metric] = Registry("metric")


def register_metric(name: str, score: Callable[[Any, Any], float | None], *, answer: bool = False) -> Metric:
    """Add a metric column to every metrics row (after those registered before it) and its mean
    to every summary; a name already taken is refused. The built-in ones are registered by
    ``eval.score``, which binds each to the trajectory's fields."""
    return METRICS.register(name, Metric(name, score, answer))


def unregister_metric(name: str) -> Metric:
    """Remove a registered metric (a test's teardown)."""
    return METRICS.unregister(name)


def registered_metrics() -> tuple[Metric, ...]:
    """The registered metrics, in registration order (a metrics row's column order)."""
    return tuple(METRICS.get(name) for name in METRICS)


def _id_set(ids: Iterable[str] | None) -> set[str]:
    if ids is None:
        return set()
    if isinstance(ids, str):
        raise TypeError("evidence ids must be a collection of 'doc_id:sentence' strings, not a single string")
    return set(ids)


def support_recall(seen_ids: Iterable[str] | None, supporting_facts: Iterable[str]) -> float | None:
    """Fraction of distinct gold supporting facts found among ``seen_ids``.

    Retrieval support recall passes every evidence id ever shown to the agent; memory support
    recall passes the ids cited by the final memory's faithful items (the trajectory's
    ``memory_sources``). ``None`` when there are no gold facts; ``seen_ids=None`` counts as nothing
    seen.
    """
    gold = _id_set(supporting_facts)
    if not gold:
        return None
    return len(gold & _id_set(seen_ids)) / len(gold)


def memory_support_precision(
    cited_ids: Iterable[str] | None, counted_ids: Iterable[str] | None, supporting_facts: Iterable[str]
) -> float | None:
    """Share of the distinct ids the final memory cites (``cited_ids``) that are gold supporting
    facts and counted (``counted_ids``: cited by a faithful item, ``memory.faithfulness``):
    ``|counted & gold| / |cited|``, counted ids outside ``cited_ids`` ignored. ``None`` when there
    are no gold facts or the memory cites nothing (nothing to judge).
    """
    gold = _id_set(supporting_facts)
    cited = _id_set(cited_ids)
    if not gold or not cited:
        return None
    return len(_id_set(counted_ids) & gold & cited) / len(cited)


def citation_scores(
    cited_ids: Iterable[str] | None, supporting_facts: Iterable[str]
) -> dict[str, float | None]:
    """Precision, recall and F1 of distinct cited evidence ids against gold supporting facts.

    With no gold facts all three are ``None`` (nothing to judge against). With gold facts but
    nothing cited, precision is 0.0, not ``None``: an agent that cites nothing must not drop out
    of the precision mean and so look better than one that cites imperfectly. F1 is 0.0 when
    precision and recall are both 0. Validity of an id is not entailment of the claim.
    """
    gold = _id_set(supporting_facts)
    if not gold:
        return {"precision": None, "recall": None, "f1": None}
    cited = _id_set(cited_ids)
    hits = len(cited & gold)
    precision = hits / len(cited) if cited else 0.0
    recall = hits / len(gold)
    f1_score = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1_score}


def _numeric_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, numbers.Real) and not isinstance(value, str))


def aggregate(rows: Sequence[Mapping[str, Any]], keys: Sequence[str] | None = None) -> dict[str, Any]:
    """Mean of each metric over rows, skipping ``None`` and missing values.

    Returns ``{"n": len(rows), "mean": {key: float | None}, "count": {key: int}}`` where
    ``count`` is how many rows entered the mean (``mean`` is ``None`` when that is 0). Booleans
    count as 0 / 1. With ``keys=None`` every key whose values in all rows are numbers or ``None``
    is aggregated, in first-seen order. A non-numeric value under a requested key, or a NaN,
    raises ``ValueError``: it is a bug upstream, not a missing value.
    """
    if keys is None:
        seen: dict[str, bool] = {}
        for row in rows:
            for key, value in row.items():
                seen[key] = seen.get(key, True) and _numeric_or_none(value)
        keys = [key for key, ok in seen.items() if ok]
    elif isinstance(keys, str):
        raise TypeError("keys must be a sequence of metric names, not a single string; wrap it: [key]")
    means: dict[str, float | None] = {}
    counts: dict[str, int] = {}
    for key in keys:
        values: list[float] = []
        for i, row in enumerate(rows):
            value = row.get(key)
            if value is None:
                continue
            if not _numeric_or_none(value):
                raise ValueError(f"row {i}: {key}: expected a number or None, got {value!r}")
            value = float(value)
            if math.isnan(value):
                raise ValueError(f"row {i}: {key}: NaN; use None for a metric that does not apply")
            values.append(value)
        means[key] = math.fsum(values) / len(values) if values else None
        counts[key] = len(values)
    return {"n": len(rows), "mean": means, "count": counts}

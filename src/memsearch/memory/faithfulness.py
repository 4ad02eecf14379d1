"""Whether a memory item's text is supported by the sentences it cites (memory support recall).

The rule, one pure function (``is_faithful``): an item's *content words* are its lower-cased
alphanumeric tokens of at least 2 characters that are not in ``STOP_WORDS`` (numbers such as
"1966" are content words); an item is faithful when at least ``FAITHFUL_SHARE`` (0.5) of its
distinct content words occur among the content words of the cited texts, and unfaithful when it
has no content word at all. An item citing nothing is never faithful.

Only faithful items' sources count for memory support recall (and so for the GRPO reward): an
ADD whose text is "x", or "the quick brown fox", citing every shown sentence cites them all yet
is supported by none, and scores nothing. The engine passes, for each cited id, the sentence as
shown *with its paragraph title* (the title heads the passage the agent read; a fact such as
"Title: It was released in 2001." is supported by it). Word overlap is a floor against gaming,
not entailment.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

# At least this share of an item's distinct content words must occur in its cited texts.
FAITHFUL_SHARE = 0.5

# A small English stop-word list: articles, pronouns, prepositions, conjunctions, auxiliaries.
STOP_WORDS = frozenset(
    "a an the and or but nor if then than so as of in on at to for from by with without into onto about over "
    "under after before between through during against among per via is are was were be been being am do does "
    "did done has have had having it its this that these those there here he she they them his her hers their "
    "theirs him we us our you your i me my mine who whom whose which what when where why how not no also both "
    "either neither any all each some such can could will would shall should may might must".split()
)
_TOKEN = re.compile(r"[^\W_]+")  # runs of Unicode letters and digits


def content_words(text: str) -> set[str]:
    """Distinct lower-cased alphanumeric tokens of ``text``, 2 characters or more, not stop words."""
    return {w for w in (m.group(0) for m in _TOKEN.finditer(text.lower())) if len(w) >= 2 and w not in STOP_WORDS}


def is_faithful(text: str, cited_texts: Iterable[str]) -> bool:
    """True when at least ``FAITHFUL_SHARE`` of ``text``'s content words occur among the content
    words of ``cited_texts``; False for a text without content words or with no cited text."""
    words = content_words(text)
    if not words:
        return False
    support: set[str] = set()
    for cited in cited_texts:
        support |= content_words(cited)
    return len(words & support) >= FAITHFUL_SHARE * len(words)


def faithful_sources(items: Iterable[tuple[str, Iterable[str]]], texts: Mapping[str, str]) -> list[str]:
    """The distinct ids cited by the faithful ``(text, sources)`` items, first citation first.

    ``texts`` maps an evidence id to the text it stands for, for every id the agent was shown;
    an id missing from it supports nothing and is never returned. Items without sources
    contribute nothing."""
    out: dict[str, None] = {}
    for text, sources in items:
        known = [s for s in sources if s in texts]
        if known and is_faithful(text, [texts[s] for s in known]):
            out.update(dict.fromkeys(known))
    return list(out)

"""The rules backend's controller and reader around open items and hidden sources (the open-items
and no-sources controls); the end-to-end behaviour on real data is in test_oracle.py and
tests/engine/test_memory_modes.py."""

from __future__ import annotations

import asyncio

from memsearch.backends import GenerationRequest, SamplingParams
from memsearch.backends.rules import RulesBackend
from memsearch.records.observation import Observation
from memsearch.tokenizer import LexicalTokenizer

QUESTION = "What nationality was the director of the 1994 film about the man who made Plan 9?"
FACT = {"id": "m1", "text": "Ed Wood is a 1994 film directed by Tim Burton.", "sources": ["d1:0"], "kind": "fact"}
OPEN = {"id": "m2", "text": "Find: Tim Burton (director)", "sources": ["d1:0"], "kind": "open"}
LATER = {"id": "m3", "text": "Find: Plan 9 from Outer Space", "sources": ["d1:0"], "kind": "open"}


def _ask(role: str, obs: dict) -> str:
    request = GenerationRequest(role=role, sampling=SamplingParams(max_tokens=64),
                                observation=Observation.from_json(obs))
    (result,) = asyncio.run(RulesBackend(LexicalTokenizer()).generate([request]))
    return result.text


def _controller(items: list[dict], past: list[str]) -> str:
    return _ask("controller", {"question": QUESTION, "memory_items": items, "past_queries": past, "searches_left": 2})


def test_controller_queries_the_first_open_item_not_asked_yet():
    assert _controller([], []) == f"SEARCH: {QUESTION}"  # first the question
    assert _controller([FACT, OPEN, LATER], [QUESTION]) == "SEARCH: Find: Tim Burton (director)"
    # Asked already, as the engine recorded it (the parser drops the closing parenthesis): the next one.
    assert (
        _controller([FACT, OPEN, LATER], [QUESTION, "Find: Tim Burton (director"])
        == "SEARCH: Find: Plan 9 from Outer Space"
    )
    # Without open items: a query from memory words the question lacks (the bridge entity guess).
    assert _controller([FACT], [QUESTION]) == f"SEARCH: Ed Wood {QUESTION}"


def test_reader_cites_nothing_when_sources_are_hidden():
    obs = {"question": "Who directed Ed Wood?", "memory_items": [FACT], "mode": "decision"}
    assert _ask("reader", obs) == "Answer: 1994 film\nEvidence: [d1:0]"  # the rules reader's span, whatever it is
    assert _ask("reader", {**obs, "sources_shown": False}) == "Answer: 1994 film\nEvidence: "

"""Deterministic heuristics for every role: no model, a floor to compare against, and the
fast path for tests. The rules read the structured observation the engine attaches to each
request (never labels) and answer in the same text format a model must use, so their output
goes through the same parsers.

- memory (decision): ADD the new evidence sentences that share the most content words with the
  question, best first, while the memory stays within budget; NOOP when none overlaps. In the
  extractive format (``memory_format`` in the observation) the ADDs cite the ids only and the
  budget is counted on the items the memory will write (``item_texts``).
- memory (summary / overwrite): the best sentences with their evidence ids, as notes.
- controller: first the question; then the text of the first open item (``kind = "open"``) not
  asked yet; else a query built from memory words not in the question (the bridge entity of a
  multi-hop question); FINISH when there is nothing new to ask.
- reader: yes/no questions get "yes"; otherwise the capitalized or numeric span from the memory
  fact that best matches the question, with that fact's sources as citations (none when the
  observation says ``sources_shown: false``, the no-sources control).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence

from memsearch.backends.base import GenerationRequest, GenerationResult, Usage
from memsearch.records.observation import Observation
from memsearch.text.actions import parse_controller
from memsearch.tokenizer import Tokenizer

_STOP = frozenset(
    "a an the of in on at to for from by with and or is are was were be been which who whom what when where "
    "how why that this these those did does do has have had as it its his her their they he she than then "
    "same both either also not".split()
)
_WORD = re.compile(r"\w+")
_SPAN = re.compile(r"(?:[A-Z][\w'\-]*(?:\s+(?:of|the|de|and|&)?\s*[A-Z][\w'\-]*)*|\d[\d,\.]*(?:\s+[A-Za-z]+)?)")
_YES_NO = ("is ", "are ", "was ", "were ", "do ", "does ", "did ", "can ", "could ", "has ", "have ", "will ")


def content_words(text: str) -> set[str]:
    return {w for w in (m.group(0).lower() for m in _WORD.finditer(text)) if w not in _STOP and len(w) > 1}


class RulesBackend:
    """The ``rules`` backend (see module docstring)."""

    name = "rules"

    def __init__(self, tokenizer: Tokenizer, max_facts_per_step: int = 2) -> None:
        self.tokenizer = tokenizer
        self.max_facts_per_step = max_facts_per_step

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        out = []
        for request in requests:
            start = time.perf_counter()
            obs = request.observation or Observation(question="")
            handler = {"memory": self._memory, "controller": self._controller, "reader": self._reader}.get(request.role)
            if handler is None:
                out.append(GenerationResult("", "error", error=f"rules backend has no rule for role {request.role!r}"))
                continue
            text = handler(obs)
            out.append(
                GenerationResult(text, "stop", usage=Usage(source="none"), latency_s=time.perf_counter() - start)
            )
        return out

    async def aclose(self) -> None:
        return None

    def _ranked(self, obs: Observation) -> list[tuple[float, str, str]]:
        target = content_words(obs.question)
        for item in obs.memory_items or ():
            if item.kind == "open":
                target |= content_words(item.text)
        ranked = []
        for i, (eid, sentence) in enumerate(obs.evidence):
            overlap = len(target & content_words(sentence))
            if overlap:
                ranked.append((overlap - i * 1e-3, eid, sentence.strip()))
        return sorted(ranked, reverse=True)

    def _memory(self, obs: Observation) -> str:
        ranked = self._ranked(obs)[: self.max_facts_per_step]
        if obs.memory_items is None:  # a rewritten memory: notes, not ops
            notes = [obs.memory_text or ""] + [f"{s} [{eid}]" if eid else s for _, eid, s in ranked]
            return "\n".join(n for n in notes if n)
        left = obs.budget_left
        extractive = obs.extractive  # cite ids; the memory writes the item
        ops = []
        for _, eid, sentence in ranked:
            text = obs.item_texts.get(eid, sentence) if extractive else sentence
            # An item's rendered line is "[mN] (fact; eid) text" plus a newline.
            cost = self.tokenizer.count(f"\n[m99] (fact; {eid}) {text}")
            if cost <= left:
                ops.append({"op": "ADD", "sources": [eid]} if extractive else
                           {"op": "ADD", "text": sentence, "sources": [eid], "kind": "fact"})
                left -= cost
        return json.dumps({"ops": ops or [{"op": "NOOP"}]})

    def _controller(self, obs: Observation) -> str:
        question = obs.question
        past = obs.past_queries
        if not past:
            return f"SEARCH: {question}"
        for item in obs.memory_items or ():
            # Compared as the engine records the query (the parser trims a closing parenthesis).
            if item.kind == "open" and parse_controller(f"SEARCH: {item.text}").query not in past:
                return f"SEARCH: {item.text}"
        asked = content_words(question)
        for q in past:
            asked |= content_words(q)
        spans = [s for s in _SPAN.findall(" ".join(obs.memory_item_texts)) if content_words(s) - asked]
        if spans:
            return f"SEARCH: {spans[0]} {question}"
        return "FINISH"

    def _reader(self, obs: Observation) -> str:
        question = obs.question
        if question.lower().startswith(_YES_NO):
            answer, sources = "yes", []
        else:
            q_words = content_words(question)
            # The no-sources control (sources_shown false): the reader sees no evidence ids to cite.
            facts = [(item.text, list(item.sources) if obs.sources_shown else []) for item in obs.memory_items or ()]
            if not facts and obs.memory_text:
                facts = [(line, re.findall(r"\[([^\]]+:\d+)\]", line)) for line in obs.memory_text.splitlines()]
            best, answer, sources = -1.0, None, []
            for text, srcs in facts:
                overlap = len(q_words & content_words(text))
                for span in _SPAN.findall(text):
                    novel = content_words(span) - q_words
                    if novel and overlap > best:
                        best, answer, sources = overlap, span.strip(), list(srcs)
            if answer is None:
                answer = "unknown"
        if obs.answer_format == "boxed":  # MemAgent's reader answers in \boxed{}
            return f"\\boxed{{{answer}}}"
        cites = ", ".join(f"[{s}]" for s in sources)
        return f"Answer: {answer}\nEvidence: {cites}"


def from_config(cfg, tokenizer: Tokenizer, dataset=None) -> RulesBackend:
    """The ``rules`` kind's factory (``memsearch.registry``): no model, no setting read."""
    return RulesBackend(tokenizer)

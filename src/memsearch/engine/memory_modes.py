"""The three memory modes of an episode, one small strategy object each.

- ``decision``: the memory policy emits ADD / UPDATE / DELETE / NOOP as JSON; the store checks
  and applies the batch atomically (``memsearch.memory``).
- ``summary``: the model rewrites free-text notes; the engine cuts them to ``memory_tokens``.
- ``overwrite`` (MemAgent): the model's output replaces the memory and is re-tokenized and hard
  truncated to ``memory_tokens``.

``update`` returns a JSON-able record of what happened (valid or not, why in words and as an
``InvalidCause`` code, what changed).
``cited`` lists every evidence id the memory cites; ``faithful_cited`` only those cited by an item
whose text its cited sentences support (``memory.faithfulness``): what memory support recall
counts. A summary or overwrite note is judged line by line, each line's ids being its sources.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsearch.engine import prompts
from memsearch.engine.parsing import evidence_ids_in
from memsearch.memory import EMPTY_RENDER, Memory
from memsearch.memory.faithfulness import faithful_sources
from memsearch.tokenizer import Tokenizer
from memsearch.trajectory import InvalidCause


class DecisionMemory:
    """``show_sources=False`` (``agent.memory_sources = "hidden"``): the memory policy, the
    controller and the reader see the items without their evidence ids, while the store keeps
    them (memory support recall is still scored); the observation says ``sources_shown: false``
    so rule-based backends can play by the same rule (docs/design.md §5)."""

    mode = "decision"

    def __init__(self, tokenizer: Tokenizer, budget: int, show_sources: bool = True,
                 max_sources: int | None = None, extractive: bool = False) -> None:
        self.store = Memory(tokenizer, budget, show_sources, max_sources)
        self.extractive = extractive  # agent.memory_format = "extractive" (memory.extractive)

    def render(self) -> str:
        return self.store.render()

    def observation(self) -> dict[str, Any]:
        obs = {
            "memory_items": [item.to_dict() for item in self.store.items],
            "budget_left": self.store.remaining_tokens(),
        }
        if self.extractive:
            obs["memory_format"] = "extractive"
        return obs if self.store.show_sources else {**obs, "sources_shown": False}

    def messages(self, question: str, evidence: str) -> tuple[dict[str, str], ...]:
        prompt = prompts.memory_extractive if self.extractive else prompts.memory_decision
        return prompt(question, self.render(), evidence, self.store.remaining_tokens(), sources=self.store.show_sources)

    def apply_text(self, store: Memory, text: str, shown: set[str], texts: Mapping[str, str]):
        """Apply model ``text`` to ``store`` (this memory's or a branch's scratch copy) in this
        memory's format; ``texts``: what each shown id stands for (``title\nsentence``)."""
        return store.apply_text(text, shown, texts if self.extractive else None)

    def update(self, text: str, shown: set[str], texts: Mapping[str, str] | None = None) -> dict[str, Any]:
        before = self.render()
        # The evidence ids the store held when the call was made, whatever the rendering showed:
        # with hidden sources the prompt does not carry them, and row selection needs them.
        sources_before = self.cited()
        result = self.apply_text(self.store, text, shown, texts or {})
        return {
            "valid": result.valid,
            "reason": result.reason,
            "cause": result.cause,
            "executed": result.executed,
            "before": before,
            "after": self.render(),
            "truncated": False,
            "sources_before": sources_before,
        }

    def cited(self) -> list[str]:
        return list(dict.fromkeys(s for item in self.store.items for s in item.sources))

    def faithful_cited(self, texts: Mapping[str, str]) -> list[str]:
        return faithful_sources(((item.text, item.sources) for item in self.store.items), texts)


class RewriteMemory:
    """Summary and overwrite modes: the output replaces the memory, cut to the budget."""

    extractive = False  # free-text notes have no action format (agent.memory_format is decision memory's)

    def __init__(
        self, mode: str, tokenizer: Tokenizer, budget: int, initial: str | None = None, template: str | None = None
    ) -> None:
        self.mode, self.tokenizer, self.budget = mode, tokenizer, budget
        self.text = ""
        self.initial = initial if initial is not None else EMPTY_RENDER
        self.template = template

    def render(self) -> str:
        return self.text or self.initial

    def observation(self) -> dict[str, Any]:
        return {"memory_text": self.text, "budget_left": self.budget - self.tokenizer.count(self.text)}

    def messages(self, question: str, evidence: str) -> tuple[dict[str, str], ...]:
        if self.mode == "overwrite":
            return prompts.memory_overwrite(question, self.render(), evidence, self.template)
        return prompts.memory_summary(question, self.render(), evidence, self.budget)

    def update(self, text: str, shown: set[str], texts: Mapping[str, str] | None = None) -> dict[str, Any]:
        before = self.render()
        new = text.strip()
        if not new:
            return {
                "valid": False,
                "reason": "empty output; memory unchanged",
                "cause": InvalidCause.EMPTY_TEXT,
                "executed": {},
                "before": before,
                "after": before,
                "truncated": False,
            }
        cut = self.tokenizer.truncate(new, self.budget)
        self.text = cut
        return {
            "valid": True,
            "reason": None,
            "cause": None,
            "executed": {},
            "before": before,
            "after": self.render(),
            "truncated": cut != new,
        }

    def cited(self) -> list[str]:
        return list(evidence_ids_in(self.text))

    def faithful_cited(self, texts: Mapping[str, str]) -> list[str]:
        # One item per line: the ids it mentions are its sources, the rest of the line its text.
        items = []
        for line in self.text.splitlines():
            ids = evidence_ids_in(line)
            for eid in ids:
                line = line.replace(eid, " ")
            items.append((line, ids))
        return faithful_sources(items, texts)


def make_memory(mode: str, tokenizer: Tokenizer, budget: int, wording=None, show_sources: bool = True,
                max_sources: int | None = None, extractive: bool = False):
    """The memory strategy for ``mode`` (``decision``, ``summary`` or ``overwrite``);
    ``wording`` (``config.Prompts``) sets the overwrite mode's initial memory and update prompt;
    ``show_sources`` and ``max_sources`` (decision mode only; ``agent.memory_sources``,
    ``agent.memory_max_sources``) whether items render with their evidence ids and how many one
    item may cite; ``extractive`` its action format (``agent.memory_format``). Summary and
    overwrite notes are free text the model writes: unaffected."""
    if mode == "decision":
        return DecisionMemory(tokenizer, budget, show_sources, max_sources, extractive)
    if mode == "summary":
        return RewriteMemory(mode, tokenizer, budget)
    if mode == "overwrite":
        return RewriteMemory(
            mode,
            tokenizer,
            budget,
            getattr(wording, "initial_memory", None),
            getattr(wording, "overwrite_update", None),
        )
    raise ValueError(f"unknown memory mode {mode!r}: expected decision, summary or overwrite")

"""What the engine hands a policy backend beside the prompt (``GenerationRequest.observation``).

A model reads its prompt; rule-based and oracle backends read this structured view of the same
state instead of parsing the prompt text. It never holds labels. Which fields are set depends on
the call: every call has ``question``; a memory call has ``mode``, ``evidence`` and the memory's
state (``memory_items`` for decision memory, ``memory_text`` for a rewritten one); a controller
call has ``searches_left`` and ``past_queries``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MemoryItemView:
    """One item of a decision memory as a policy sees it."""

    id: str  # the item's id ("m1", ...)
    text: str  # what it says
    sources: tuple[str, ...] = ()  # the evidence ids it cites
    kind: str = "fact"  # "fact" or "open" (an open question)

    def to_json(self) -> dict[str, Any]:
        """The item as ``memory.MemoryItem.to_dict`` writes it (a store snapshot's item)."""
        return {"id": self.id, "text": self.text, "sources": list(self.sources), "kind": self.kind}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryItemView:
        return cls(str(data["id"]), str(data["text"]), tuple(data.get("sources") or ()), data.get("kind", "fact"))


@dataclass(frozen=True)
class MemoryView:
    """A memory's part of an ``Observation``: what a memory mode's ``observation()`` returns
    (``engine.memory_modes.MemoryStrategy``)."""

    budget_left: int  # memory tokens left
    memory_items: tuple[MemoryItemView, ...] | None = None  # decision memory's items
    memory_text: str | None = None  # a rewritten memory's text (summary, overwrite)
    extractive: bool = False  # decision memory's extractive format
    sources_shown: bool = True  # whether items show their evidence ids

    def observation(self, question: str, **call: Any) -> Observation:
        """The ``Observation`` of one call on this memory; ``call``: that call's own fields
        (``mode``, ``evidence``, ``searches_left``, ...)."""
        return Observation(question=question, memory_items=self.memory_items, memory_text=self.memory_text,
                           budget_left=self.budget_left, extractive=self.extractive,
                           sources_shown=self.sources_shown, **call)


@dataclass(frozen=True)
class Observation:
    """The state of the episode at one policy call (module doc)."""

    question: str  # the task's question
    mode: str | None = None  # the memory mode of a memory or reader call ("decision", "summary", "overwrite")
    answer_format: str = "free"  # a reader call: "boxed" when the answer is asked for in \boxed{}
    # This memory call's new evidence: (evidence id, sentence); stream chunks carry no ids (None).
    evidence: tuple[tuple[str | None, str], ...] = ()
    memory_items: tuple[MemoryItemView, ...] | None = None  # decision memory's items
    memory_text: str | None = None  # a rewritten memory's text (summary, overwrite)
    budget_left: int = 0  # memory tokens left
    extractive: bool = False  # decision memory's extractive format: ADD cites ids, the memory writes the item
    sources_shown: bool = True  # whether items show their evidence ids (False: the no-sources control)
    item_texts: Mapping[str, str] = field(default_factory=dict)  # extractive: the item each id would become
    searches_left: int | None = None  # a controller call: searches the budget still allows
    past_queries: tuple[str, ...] = ()  # a controller call: the queries made so far

    @property
    def memory_item_texts(self) -> list[str]:
        """The texts of the memory's items (decision memory), else its text as one entry."""
        if self.memory_items is not None:
            return [item.text for item in self.memory_items]
        return [self.memory_text] if self.memory_text else []

    def to_json(self) -> dict[str, Any]:
        """The observation as a JSON object: the fields a call has (module doc), unset ones left out."""
        out: dict[str, Any] = {"question": self.question}
        if self.mode is not None:
            out["mode"] = self.mode
        if self.answer_format != "free":
            out["answer_format"] = self.answer_format
        if self.evidence:
            out["evidence"] = [list(pair) for pair in self.evidence]
        if self.memory_items is not None:
            out["memory_items"] = [item.to_json() for item in self.memory_items]
        if self.memory_text is not None:
            out["memory_text"] = self.memory_text
        out["budget_left"] = self.budget_left
        if self.extractive:
            out["memory_format"] = "extractive"
        if not self.sources_shown:
            out["sources_shown"] = False
        if self.item_texts:
            out["item_texts"] = dict(self.item_texts)
        if self.searches_left is not None:
            out.update(searches_left=self.searches_left, past_queries=list(self.past_queries))
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Observation:
        """The observation of a JSON object as ``to_json`` writes it."""
        items = data.get("memory_items")
        return cls(
            question=data.get("question", ""), mode=data.get("mode"), answer_format=data.get("answer_format", "free"),
            evidence=tuple((eid, sentence) for eid, sentence in data.get("evidence") or ()),
            memory_items=None if items is None else tuple(MemoryItemView.from_json(i) for i in items),
            memory_text=data.get("memory_text"), budget_left=data.get("budget_left", 0),
            extractive=data.get("memory_format") == "extractive", sources_shown=data.get("sources_shown", True),
            item_texts=dict(data.get("item_texts") or {}), searches_left=data.get("searches_left"),
            past_queries=tuple(data.get("past_queries") or ()),
        )

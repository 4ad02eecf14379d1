"""The memory modes of an episode, one small strategy object each, built by name from the
registry (``memsearch.registry.MEMORY_MODES``: a mode's factory and properties, e.g. the reader's
answer format).

- ``decision``: the memory policy emits ADD / UPDATE / DELETE / NOOP as JSON; the store checks
  and applies the batch atomically (``memsearch.memory``).
- ``summary``: the model rewrites free-text notes; the engine cuts them to ``memory_tokens``.
- ``overwrite`` (MemAgent): the model's output replaces the memory and is re-tokenized and hard
  truncated to ``memory_tokens``; the reader answers in ``\\boxed{}``.

``update`` returns a JSON-able record of what happened (valid or not, why in words and as an
``InvalidCause`` code, what changed).
``cited`` lists every evidence id the memory cites; ``faithful_cited`` only those cited by an item
whose text its cited sentences support (``memory.faithfulness``): what memory support recall
counts. A summary or overwrite note is judged line by line, each line's ids being its sources.

A new mode is one strategy class (``MemoryStrategy``) and one ``register_memory_mode`` call
(tests/extension/test_add_memory_mode.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from memsearch.engine import prompts
from memsearch.engine.parsing import evidence_ids_in
from memsearch.memory import EMPTY_RENDER, Memory
from memsearch.memory.faithfulness import faithful_sources
from memsearch.records.causes import InvalidCause
from memsearch.records.events import MemoryEvent
from memsearch.records.observation import MemoryItemView, MemoryView
from memsearch.registry import MEMORY_MODES, MemoryMode, load_factory, memory_mode, register_memory_mode
from memsearch.tokenizer import Tokenizer

__all__ = ["DecisionMemory", "MemoryMode", "MemorySettings", "MemoryStrategy", "RewriteMemory", "make_memory",
           "memory_mode", "memory_modes", "register_memory_mode", "unregister_memory_mode"]


@dataclass(frozen=True)
class MemorySettings:
    """What a mode's factory may read besides the tokenizer and the budget: ``wording``
    (``config.Prompts``: the overwrite mode's initial memory and update prompt), ``show_sources``
    and ``max_sources`` (``agent.memory_sources``, ``agent.memory_max_sources``) and
    ``extractive`` (``agent.memory_format``); the last three concern item stores only."""

    wording: Any = None
    show_sources: bool = True
    max_sources: int | None = None
    extractive: bool = False


class MemoryStrategy(Protocol):
    """What the episode asks of a memory. ``make_memory`` sets ``mode`` (the registered name,
    the observation's ``mode``) and ``answer_format`` (the mode's). ``extractive``: ops name
    evidence ids only (item stores; ``False`` for free-text notes)."""

    mode: str
    answer_format: str
    extractive: bool

    def render(self) -> str: ...
    def observation(self) -> MemoryView: ...
    def messages(self, question: str, evidence: str) -> tuple[dict[str, str], ...]: ...
    def update(self, text: str, shown: set[str], texts: Mapping[str, str] | None = None, *,
               step: int) -> MemoryEvent: ...
    def cited(self) -> list[str]: ...
    def faithful_cited(self, texts: Mapping[str, str]) -> list[str]: ...


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

    def observation(self) -> MemoryView:
        """This memory's part of a policy call's ``records.observation.Observation``."""
        items = tuple(MemoryItemView(item.id, item.text, tuple(item.sources), item.kind) for item in self.store.items)
        return MemoryView(budget_left=self.store.remaining_tokens(), memory_items=items, extractive=self.extractive,
                          sources_shown=self.store.show_sources)

    def messages(self, question: str, evidence: str) -> tuple[dict[str, str], ...]:
        prompt = prompts.memory_extractive if self.extractive else prompts.memory_decision
        return prompt(question, self.render(), evidence, self.store.remaining_tokens(), sources=self.store.show_sources)

    def apply_text(self, store: Memory, text: str, shown: set[str], texts: Mapping[str, str]):
        """Apply model ``text`` to ``store`` (this memory's or a branch's scratch copy) in this
        memory's format; ``texts``: what each shown id stands for (``title\nsentence``)."""
        return store.apply_text(text, shown, texts if self.extractive else None)

    def update(self, text: str, shown: set[str], texts: Mapping[str, str] | None = None, *,
               step: int) -> MemoryEvent:
        """Apply memory call ``step``'s output; what it did, as the step's ``MemoryEvent``."""
        before = self.render()
        # The evidence ids the store held when the call was made, whatever the rendering showed:
        # with hidden sources the prompt does not carry them, and row selection needs them.
        sources_before = tuple(self.cited())
        result = self.apply_text(self.store, text, shown, texts or {})
        return MemoryEvent(step=step, valid=result.valid, reason=result.reason, cause=result.cause,
                           executed=dict(result.executed), before=before, after=self.render(), truncated=False,
                           sources_before=sources_before)

    def cited(self) -> list[str]:
        return list(dict.fromkeys(s for item in self.store.items for s in item.sources))

    def faithful_cited(self, texts: Mapping[str, str]) -> list[str]:
        return faithful_sources(((item.text, item.sources) for item in self.store.items), texts)


class RewriteMemory:
    """Summary and overwrite modes: the output replaces the memory, cut to the budget.
    ``prompt(question, memory, evidence)``: the messages of one update (the mode's wording)."""

    extractive = False  # free-text notes have no action format (agent.memory_format is decision memory's)

    def __init__(self, tokenizer: Tokenizer, budget: int, prompt: Callable[[str, str, str], tuple[dict[str, str], ...]],
                 initial: str | None = None) -> None:
        self.tokenizer, self.budget, self.prompt = tokenizer, budget, prompt
        self.text = ""
        self.initial = initial if initial is not None else EMPTY_RENDER

    def render(self) -> str:
        return self.text or self.initial

    def observation(self) -> MemoryView:
        """This memory's part of a policy call's ``records.observation.Observation``."""
        return MemoryView(budget_left=self.budget - self.tokenizer.count(self.text), memory_text=self.text)

    def messages(self, question: str, evidence: str) -> tuple[dict[str, str], ...]:
        return self.prompt(question, self.render(), evidence)

    def update(self, text: str, shown: set[str], texts: Mapping[str, str] | None = None, *,
               step: int) -> MemoryEvent:
        """Replace the memory with memory call ``step``'s output, cut to the budget; what it did."""
        before = self.render()
        new = text.strip()
        if not new:
            return MemoryEvent(step=step, valid=False, reason="empty output; memory unchanged",
                               cause=InvalidCause.EMPTY_TEXT, before=before, after=before)
        cut = self.tokenizer.truncate(new, self.budget)
        self.text = cut
        return MemoryEvent(step=step, valid=True, before=before, after=self.render(), truncated=cut != new)

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


def decision_memory(tokenizer: Tokenizer, budget: int, settings: MemorySettings) -> DecisionMemory:
    """The ``decision`` mode's factory."""
    return DecisionMemory(tokenizer, budget, settings.show_sources, settings.max_sources, settings.extractive)


def summary_memory(tokenizer: Tokenizer, budget: int, settings: MemorySettings) -> RewriteMemory:
    """The ``summary`` mode's factory."""
    return RewriteMemory(tokenizer, budget, lambda q, memory, evidence: prompts.memory_summary(q, memory, evidence,
                                                                                                budget))


def overwrite_memory(tokenizer: Tokenizer, budget: int, settings: MemorySettings) -> RewriteMemory:
    """The ``overwrite`` mode's factory: ``settings.wording`` sets the initial memory and the update prompt."""
    template = getattr(settings.wording, "overwrite_update", None)
    return RewriteMemory(tokenizer, budget, lambda q, memory, evidence: prompts.memory_overwrite(q, memory, evidence,
                                                                                                  template),
                         getattr(settings.wording, "initial_memory", None))


def memory_modes() -> tuple[str, ...]:
    """The registered memory modes, in registration order."""
    return MEMORY_MODES.names()


def unregister_memory_mode(name: str) -> MemoryMode:
    """Remove a registered mode (a test's teardown)."""
    return MEMORY_MODES.unregister(name)


def make_memory(mode: str, tokenizer: Tokenizer, budget: int, wording=None, show_sources: bool = True,
                max_sources: int | None = None, extractive: bool = False) -> MemoryStrategy:
    """The memory strategy for the registered ``mode`` (``InputValueError`` naming the registered
    modes otherwise); ``wording`` (``config.Prompts``) sets the overwrite mode's initial memory and
    update prompt; ``show_sources`` and ``max_sources`` (decision mode only; ``agent.memory_sources``,
    ``agent.memory_max_sources``) whether items render with their evidence ids and how many one
    item may cite; ``extractive`` its action format (``agent.memory_format``). Summary and
    overwrite notes are free text the model writes: unaffected."""
    spec = memory_mode(mode)
    memory = load_factory(spec.factory)(tokenizer, budget, MemorySettings(wording, show_sources, max_sources,
                                                                          extractive))
    # The episode and the rule-based backends ask the memory, not a mode string, what it is.
    memory.mode, memory.answer_format = mode, spec.answer_format
    return memory

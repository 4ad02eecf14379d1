"""State groups at a memory call: several completions from one state, one of them continued.

Used by GRPO's ``credit = "state"`` (``train.grpo.state_credit``, docs/design.md §7) through
``Environment.branches``; evaluation never branches. At a decision-memory call the engine draws
``branches`` completions of the same prompt in one batch (each with its own seed, derived from the
call's), applies each to a copy of the memory, and records every branch's outcome in the call's
event (``records.events.PolicyCall``): ``branches`` (one ``BranchOutcome`` each: the completion,
what applying it did, ``kept``: the ids cited by faithful items after it, what memory support
recall counts, ``memory.faithfulness``; ``cited``: every id cited), ``branch_chosen`` and
``kept_before`` / ``cited_before`` (the same before the call).
The episode continues from branch ``j``, drawn uniformly among the branches that got an answer
with a seed of the call's own, so the next call sees a state the policy reaches; the event's own
fields (text, ids, log-probs) are branch ``j``'s, so everything that reads an unbranched
trajectory reads this one the same way.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from memsearch.backends.base import Constraint, GenerationResult
from memsearch.memory import Memory
from memsearch.memory.faithfulness import faithful_sources
from memsearch.records.events import BranchOutcome
from memsearch.records.observation import Observation

if TYPE_CHECKING:
    from memsearch.engine.memory_modes import DecisionMemory


def _copy(store: Memory) -> Memory:
    return Memory.from_snapshot(store.snapshot(), store.tokenizer, store.budget_tokens, store.show_sources,
                                store.max_sources)


def _outcome(result: GenerationResult, memory: DecisionMemory, shown: set[str], texts: dict[str, str],
             constraint: Constraint | None) -> BranchOutcome:
    """One branch's completion and what applying it to a copy of ``store`` did."""
    out = BranchOutcome(
        text=result.text, error=result.error,
        completion_ids=tuple(result.completion_ids) if result.completion_ids is not None else None,
        logprobs=tuple(result.logprobs) if result.logprobs is not None else None,
        constraint_id=constraint.id if constraint is not None else None,
    )
    if not result.ok:
        return out
    store = memory.store
    copy = _copy(store)
    applied = memory.apply_text(copy, result.text, shown, texts)
    over = 0
    if applied.status == "rejected" and applied.proposed_tokens is not None:
        over = max(0, applied.proposed_tokens - store.budget_tokens)
    return replace(
        out, status=applied.status, reasons=tuple(applied.reasons), cause=applied.cause,
        executed=dict(applied.executed), over_budget_tokens=over, budget_tokens=store.budget_tokens,
        kept=tuple(faithful_sources(((i.text, i.sources) for i in copy.items), texts)),
        cited=tuple(dict.fromkeys(s for i in copy.items for s in i.sources)),
    )


async def branched_memory_call(ep: Any, memory: DecisionMemory, step: int, messages, observation: Observation,
                               max_tokens: int, constraint: Constraint | None, branches: int) -> GenerationResult:
    """Draw ``branches`` completions, record them on one policy-call event, return the continued one.

    ``ep`` is the running episode (``engine.episode``: its ``sample``, ``record``, ``branch_seed``,
    ``shown``, ``texts`` and ``events``). The caller applies the returned result to ``memory``
    and judges it, as for any call."""
    results = await ep.sample("memory", step, messages, observation, max_tokens, constraint, branches)
    shown = set(ep.shown)
    outcomes = [_outcome(r, memory, shown, ep.texts, constraint) for r in results]
    answered = [k for k, r in enumerate(results) if r.ok] or [0]
    chosen = random.Random(ep.branch_seed(step)).choice(answered)
    ep.record("memory", step, messages, results[chosen], constraint, observation)
    ep.events[-1] = replace(ep.events[-1], branches=tuple(outcomes), branch_chosen=chosen,
                            kept_before=tuple(memory.faithful_cited(ep.texts)), cited_before=tuple(memory.cited()))
    return results[chosen]

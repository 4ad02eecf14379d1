"""Every prompt memsearch sends, in one place, per role. ``PROMPT_VERSION`` is recorded in runs:
change it whenever any wording changes, so results from different prompts are never mixed.

Prompts see only what an agent may see: the question, evidence shown so far (with evidence
ids), the memory, and the remaining budget. Labels never reach this module.
"""

from __future__ import annotations

# p2: the memory example names no evidence id a model could copy. The extractive memory prompt
# (p2 too) is its own function; a run's agent.memory_format says which one it used.
PROMPT_VERSION = "p2"

_SYSTEM = "You are a careful research assistant that answers multi-hop questions from evidence."


def _chat(user: str) -> tuple[dict[str, str], ...]:
    return ({"role": "system", "content": _SYSTEM}, {"role": "user", "content": user})


def _memory_state(question: str, memory: str, evidence: str, budget_left: int, sources: bool) -> str:
    """The state a decision-memory call sees: question, memory, new evidence, budget left."""
    header = "id, kind, sources, text" if sources else "id, kind, text"
    return (
        f"Question: {question}\n\n"
        f"Memory ({header}):\n{memory}\n\n"
        f"New evidence (each sentence has an evidence id in brackets):\n{evidence}\n\n"
        f"Memory budget left: {budget_left} tokens.\n"
    )


def memory_decision(question: str, memory: str, evidence: str, budget_left: int,
                    sources: bool = True) -> tuple[dict[str, str], ...]:
    """Decision mode: emit ADD / UPDATE / DELETE / NOOP operations as one JSON object.
    ``sources=False``: the memory is rendered without its items' evidence ids (the no-sources
    control, ``agent.memory_sources = "hidden"``) and its header says so."""
    return _chat(
        _memory_state(question, memory, evidence, budget_left, sources)
        + "Update the memory so it keeps the facts needed to answer the question, each with the "
        "evidence ids it comes from, and the sub-questions that are still open (kind \"open\").\n"
        # No concrete evidence id in the example: a small model copies it (p1 had "d3:0", and the
        # untrained embedded model cited it in 156 of 176 calls, all rejected as not shown).
        'Reply with one JSON object only: {"ops": [...]}. Ops: ADD (text, sources, kind), UPDATE '
        '(id, text, sources), DELETE (id), or {"op": "NOOP"} alone when nothing is worth keeping. '
        "sources are evidence ids copied from the brackets of the new evidence; add a fact only "
        "if it fits in the budget left."
    )


def memory_extractive(question: str, memory: str, evidence: str, budget_left: int,
                      sources: bool = True) -> tuple[dict[str, str], ...]:
    """Decision mode, extractive format (``memory.extractive``): choose evidence by id; the
    memory writes the sentences. ``sources`` as in ``memory_decision``."""
    return _chat(
        _memory_state(question, memory, evidence, budget_left, sources)
        + "Keep the evidence needed to answer the question. You do not write facts: you choose "
        "sentences by their evidence ids and the memory stores them.\n"
        'Reply with one JSON object only: {"ops": [...]}. Ops: ADD (sources: the ids of one or two '
        'new sentences, kept as one item), ADD with kind "open" and a short text (a sub-question '
        "still open), UPDATE (id, sources: the item becomes those sentences), DELETE (id), or "
        '{"op": "NOOP"} alone when nothing is worth keeping. Keep an item only if it fits in the '
        "budget left."
    )


def memory_summary(question: str, memory: str, evidence: str, memory_tokens: int) -> tuple[dict[str, str], ...]:
    """Summary mode: rewrite a free-text summary (cut to ``memory_tokens``)."""
    return _chat(
        f"Question: {question}\n\n"
        f"Current notes:\n{memory}\n\n"
        f"New evidence (each sentence has an evidence id in brackets):\n{evidence}\n\n"
        f"Rewrite the notes in at most {memory_tokens} tokens, keeping what helps answer the "
        "question and the evidence ids in brackets after each fact. Reply with the notes only."
    )


def prompt_version(custom: dict[str, str | None] | None = None) -> str:
    """``PROMPT_VERSION``, plus a hash of any wording a config sets (``RunConfig.prompts``)."""
    import hashlib
    import json

    custom = {k: v for k, v in (custom or {}).items() if v is not None}
    if not custom:
        return PROMPT_VERSION
    digest = hashlib.sha256(json.dumps(custom, sort_keys=True).encode()).hexdigest()[:12]
    return f"{PROMPT_VERSION}+custom-{digest}"


def memory_overwrite(question: str, memory: str, chunk: str, template: str | None = None) -> tuple[dict[str, str], ...]:
    """Overwrite mode (MemAgent): read one chunk of a long context and rewrite the memory.
    ``template`` (``{question}``, ``{memory}``, ``{chunk}``) replaces the built-in wording."""
    if template is not None:
        return _chat(template.format(question=question, memory=memory, chunk=chunk))
    return _chat(
        "You read a long document one section at a time and keep a memory of what matters.\n\n"
        f"Question: {question}\n\n"
        f"Memory so far:\n{memory}\n\n"
        f"Next section:\n{chunk}\n\n"
        "Write the updated memory: keep everything from the memory and this section that helps "
        "answer the question. Reply with the memory only."
    )


def controller(question: str, memory: str, searches_left: int, past_queries: list[str]) -> tuple[dict[str, str], ...]:
    """Policy controller: SEARCH a query or FINISH, driven by the memory's open sub-questions."""
    past = "\n".join(f"- {q}" for q in past_queries) or "(none)"
    return _chat(
        f"Question: {question}\n\n"
        f"Memory (facts and open sub-questions):\n{memory}\n\n"
        f"Queries already made:\n{past}\n"
        f"Searches left: {searches_left}.\n\n"
        "If the memory is enough to answer, reply FINISH. Otherwise reply SEARCH: <query> with a "
        "query for the missing evidence (an open sub-question is a good query). Reply with one line."
    )


def reader(question: str, memory: str, boxed: bool = False, template: str | None = None) -> tuple[dict[str, str], ...]:
    """Final answer from the question and the memory only, with citations. ``template``
    (``{question}``, ``{memory}``) replaces the built-in wording of the boxed form."""
    if boxed and template is not None:
        return _chat(template.format(question=question, memory=memory))
    if boxed:
        form = "Think briefly, then give the final answer as \\boxed{answer}."
    else:
        form = (
            "Reply in two lines:\nAnswer: <a short answer, a few words, or yes/no>\n"
            "Evidence: <the evidence ids that support it, e.g. [d3:0], [d7:2]>"
        )
    return _chat(f"Question: {question}\n\nMemory:\n{memory}\n\n{form}")

"""Scoring, after the episode: join a trajectory with its label (by task id) and compute the
per-task metrics row. This is the only place labels meet agent output.

Which answer the answer metrics score depends on what the reader was asked for
(``answer_format`` of the trajectory, docs/design.md §6):

- ``"boxed"`` (memory ``overwrite``, the MemAgent protocol): ``em``, ``f1`` and ``sub_em`` score
  the boxed answer only (``memsearch.text.answers.boxed_prediction``); a reply without a complete
  box scores 0 on all three, as in MemAgent's evaluator, even when its first line mentions the
  gold answer.
- ``"free"`` (every other memory mode, and trajectories written before the field existed):
  they score ``prediction``, the engine's tolerant parse (``engine.parsing.parse_reader``).

``sub_em_lenient`` is ``sub_em`` of the tolerant parse in both cases: what the lenient reading
would have scored, kept apart so it is never reported as the protocol's sub_em. ``boxed_em``
is exact match of the box whatever the format.

A failed task (``status`` other than ``"ok"``: a request error, a crash) scores 0 on every
metric of its answer (``ANSWER_KEYS``: em, f1, sub_em, boxed_em, sub_em_lenient and the
answer's citation precision / recall), whatever text came back: an answer read from a memory a
failed call left half-written is no result. It stays in every denominator. What the episode saw
and stored (retrieval and memory support) is measured as it happened.

Memory provenance (docs/design.md §6): ``memory_support_recall`` scores the trajectory's
``memory_sources`` (ids cited by faithful memory items); ``memory_support_precision`` is the share
of ``memory_cited`` (every id the final memory cites; ``memory_sources`` for trajectories written
before it existed) that is gold and counted.
"""

from __future__ import annotations

from typing import Any

from memsearch.data.records import Label
from memsearch.eval.metrics import (
    boxed_em,
    citation_scores,
    exact_match,
    f1,
    memory_support_precision,
    sub_em,
    support_recall,
)
from memsearch.text.answers import boxed_prediction
from memsearch.trajectory import EventKind


def token_costs(events: list[dict[str, Any]]) -> dict[str, int]:
    """Tokens by role, service-reported and tokenizer-estimated kept apart (never summed)."""
    out: dict[str, int] = {}
    for event in events:
        if event.get("type") != EventKind.POLICY_CALL:
            continue
        role = event["role"]
        for key, value in event["usage"].items():
            if key != "source" and value is not None:
                name = (
                    f"{key.replace('estimated_', 'estimated_' + role + '_', 1)}"
                    if key.startswith("estimated_")
                    else f"{role}_{key}"
                )
                out[name] = out.get(name, 0) + int(value)
    return out


def protocol_answer(traj: dict[str, Any]) -> str | None:
    """The answer the protocol scores with em / f1 / sub_em: the box when the reader was asked
    for one (``None``, scoring 0, when it gave none), else the engine's tolerant parse. The GRPO
    reward uses this too, so training optimizes exactly what evaluation measures."""
    if traj.get("answer_format") == "boxed":
        return boxed_prediction(traj.get("reader_text"))
    return traj.get("prediction")


# The metrics of a task's answer: 0 for a failed task (module doc); citation ones stay None
# when the task has no gold supporting facts (nothing to judge against).
ANSWER_KEYS = ("em", "f1", "sub_em", "boxed_em", "sub_em_lenient", "citation_precision", "citation_recall")


def context_truncations(events: list[dict[str, Any]]) -> dict[str, int]:
    """Policy calls whose completion the server's context cut short (``context_truncated``:
    ``finish_reason`` "length" below the requested ``max_tokens``), by role."""
    out: dict[str, int] = {}
    for event in events:
        if event.get("type") == EventKind.POLICY_CALL and event.get("context_truncated"):
            out[event["role"]] = out.get(event["role"], 0) + 1
    return out


def score_trajectory(traj: dict[str, Any], label: Label) -> dict[str, Any]:
    """One metrics row. A failed episode keeps its row and scores 0 on every answer metric
    (``ANSWER_KEYS``, module doc)."""
    pred = traj.get("prediction")
    scored = protocol_answer(traj)
    counts = traj.get("counts", {})
    cites = citation_scores(traj.get("citations", []), label.supporting_facts)
    calls = counts.get("policy_calls", 0)
    status = traj.get("status", "error")
    cut = context_truncations(traj.get("events", []))
    row: dict[str, Any] = {
        "task_id": traj["task_id"],
        "status": status,
        "prediction": pred,
        "answers": label.answers,
        "answer_format": traj.get("answer_format", "free"),
        "em": exact_match(scored, label.answers),
        "f1": f1(scored, label.answers),
        "sub_em": sub_em(scored, label.answers),
        "boxed_em": boxed_em(traj.get("reader_text"), label.answers),
        "sub_em_lenient": sub_em(pred, label.answers),
        "retrieval_support_recall": support_recall(traj.get("shown_evidence", []), label.supporting_facts),
        "memory_support_recall": support_recall(traj.get("memory_sources", []), label.supporting_facts),
        # Trajectories before engine-5 have no memory_cited: their memory_sources is every cited id.
        "memory_support_precision": memory_support_precision(
            traj.get("memory_cited", traj.get("memory_sources", [])), traj.get("memory_sources", []),
            label.supporting_facts,
        ),
        "citation_precision": cites["precision"],
        "citation_recall": cites["recall"],
        "invalid_citations": len(traj.get("invalid_citations", [])),
        "searches": counts.get("searches", 0),
        "chunks": counts.get("chunks", 0),
        "chunks_cut": counts.get("chunks_cut", 0),
        "truncated_by_chunk_limit": counts.get("chunks_cut", 0) > 0,
        "memory_truncations": counts.get("memory_truncations", 0),
        "policy_calls": calls,
        "invalid_actions": counts.get("invalid_actions", 0),
        # Over the calls that returned a completion: transport failures are request_errors, not
        # the policy's invalid actions (the task itself stays in every answer metric's denominator).
        "invalid_action_rate": (
            counts.get("invalid_actions", 0) / answered
            if (answered := calls - counts.get("request_errors", 0)) > 0
            else None
        ),
        "request_errors": counts.get("request_errors", 0),
        "context_truncated_calls": counts.get("context_truncated_calls", sum(cut.values())),
        "context_truncated_by_role": cut,
        "attempt": traj.get("attempt", 1),
        "latency_s": traj.get("latency_s"),
    }
    if status != "ok":
        row.update({key: None if row[key] is None else 0.0 for key in ANSWER_KEYS})
    for op, n in counts.get("memory_ops", {}).items():
        row[f"ops_{op}"] = n
    row.update(token_costs(traj.get("events", [])))
    return row

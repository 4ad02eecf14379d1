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
metric of its answer (``answer_keys()``: em, f1, sub_em, boxed_em, sub_em_lenient and the
answer's citation precision / recall), whatever text came back: an answer read from a memory a
failed call left half-written is no result. It stays in every denominator. What the episode saw
and stored (retrieval and memory support) is measured as it happened.

Memory provenance (docs/design.md §6): ``memory_support_recall`` scores the trajectory's
``memory_sources`` (ids cited by faithful memory items); ``memory_support_precision`` is the share
of ``memory_cited`` (every id the final memory cites; ``memory_sources`` for trajectories written
before it existed) that is gold and counted.
"""

from __future__ import annotations

from memsearch.data.records import Label
from memsearch.eval.metrics import (
    boxed_em,
    citation_scores,
    exact_match,
    f1,
    memory_support_precision,
    register_metric,
    registered_metrics,
    sub_em,
    support_recall,
)
from memsearch.records.metrics_row import MetricsRow
from memsearch.records.trajectory import Trajectory
from memsearch.text.answers import boxed_prediction


def token_costs(trajectory: Trajectory) -> dict[str, int]:
    """Tokens by role, service-reported and tokenizer-estimated kept apart (never summed):
    ``<role>_prompt_tokens`` when the service reported them, ``estimated_<role>_prompt_tokens``
    when memsearch's tokenizer counted them (completion tokens likewise)."""
    out: dict[str, int] = {}
    for call in trajectory.policy_calls():
        usage = call.usage
        prefix = f"{call.role}_" if usage.source == "reported" else f"estimated_{call.role}_"
        for name, value in (("prompt_tokens", usage.prompt_tokens), ("completion_tokens", usage.completion_tokens)):
            if value is not None:
                out[prefix + name] = out.get(prefix + name, 0) + int(value)
    return out


def scored_answer(answer_format: str | None, reader_text: str | None, prediction: str | None) -> str | None:
    """The answer the protocol scores with em / f1 / sub_em: the box when the reader was asked
    for one (``answer_format`` "boxed"; ``None``, scoring 0, when it gave none), else the engine's
    tolerant parse ``prediction``. For a record that holds these fields but is no trajectory (a
    verl session's summary); a trajectory's is ``protocol_answer``."""
    if answer_format == "boxed":
        return boxed_prediction(reader_text)
    return prediction


def protocol_answer(traj: Trajectory) -> str | None:
    """The answer of ``traj`` the protocol scores (``scored_answer``). The GRPO reward uses this
    too, so training optimizes exactly what evaluation measures."""
    return scored_answer(traj.answer_format, traj.reader_text, traj.prediction)


# The built-in metrics, in a row's column order. Answer metrics score 0 for a failed task (module
# doc); provenance and citation ones stay None when the task has no gold supporting facts.
register_metric("em", lambda t, label: exact_match(protocol_answer(t), label.answers), answer=True)
register_metric("f1", lambda t, label: f1(protocol_answer(t), label.answers), answer=True)
register_metric("sub_em", lambda t, label: sub_em(protocol_answer(t), label.answers), answer=True)
register_metric("boxed_em", lambda t, label: boxed_em(t.reader_text, label.answers), answer=True)
register_metric("sub_em_lenient", lambda t, label: sub_em(t.prediction, label.answers), answer=True)
register_metric("retrieval_support_recall", lambda t, label: support_recall(list(t.shown_evidence),
                                                                            label.supporting_facts))
register_metric("memory_support_recall", lambda t, label: support_recall(list(t.memory_sources),
                                                                         label.supporting_facts))
# Trajectories before engine-5 have no memory_cited: records.trajectory.upgrade reads their
# memory_sources (every cited id then) as it.
register_metric("memory_support_precision", lambda t, label: memory_support_precision(
    list(t.memory_cited), list(t.memory_sources), label.supporting_facts))
register_metric("citation_precision", lambda t, label: citation_scores(list(t.citations),
                                                                       label.supporting_facts)["precision"],
                answer=True)
register_metric("citation_recall", lambda t, label: citation_scores(list(t.citations),
                                                                    label.supporting_facts)["recall"], answer=True)


def answer_keys() -> tuple[str, ...]:
    """The registered answer metrics (``Metric.answer``): 0 for a failed task."""
    return tuple(metric.name for metric in registered_metrics() if metric.answer)


def context_truncations(trajectory: Trajectory) -> dict[str, int]:
    """Policy calls whose completion the server's context cut short (``context_truncated``:
    ``finish_reason`` "length" below the requested ``max_tokens``), by role."""
    out: dict[str, int] = {}
    for call in trajectory.policy_calls():
        if call.context_truncated:
            out[call.role] = out.get(call.role, 0) + 1
    return out


def score_trajectory(traj: Trajectory, label: Label) -> MetricsRow:
    """One metrics row: the registered metrics (``eval.metrics.register_metric``) and the
    episode's counts. A failed episode keeps its row and scores 0 on every answer metric
    (``answer_keys``, module doc)."""
    counts = traj.counts
    calls = counts.policy_calls
    cut = context_truncations(traj)
    scores = {metric.name: metric.score(traj, label) for metric in registered_metrics()}
    if not traj.ok:
        scores.update({key: None if scores[key] is None else 0.0 for key in answer_keys()})
    return MetricsRow(
        task_id=traj.task_id,
        status=traj.status,
        prediction=traj.prediction,
        answers=tuple(label.answers),
        answer_format=traj.answer_format,
        scores=scores,
        invalid_citations=len(traj.invalid_citations),
        searches=counts.searches,
        chunks=counts.chunks,
        chunks_cut=counts.chunks_cut,
        truncated_by_chunk_limit=counts.chunks_cut > 0,
        memory_truncations=counts.memory_truncations,
        policy_calls=calls,
        invalid_actions=counts.invalid_actions,
        # Over the calls that returned a completion: transport failures are request_errors, not
        # the policy's invalid actions (the task itself stays in every answer metric's denominator).
        invalid_action_rate=(
            counts.invalid_actions / answered if (answered := calls - counts.request_errors) > 0 else None
        ),
        request_errors=counts.request_errors,
        # Trajectories before engine-7 have no count (read as 0): their events are counted instead.
        context_truncated_calls=counts.context_truncated_calls or sum(cut.values()),
        context_truncated_by_role=cut,
        attempt=1 if traj.attempt is None else traj.attempt,
        # A task that failed without an episode has no latency on file (None, left out of the mean).
        latency_s=traj.latency_s if traj.ran else None,
        ops=dict(traj.memory_ops),
        tokens=token_costs(traj),
    )

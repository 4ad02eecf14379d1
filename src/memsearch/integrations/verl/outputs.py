"""Trajectory -> the rows verl trains on, and the episode summary the reward reads.

One trained policy call is one verl output (``AgentLoopOutput`` fields, as plain dicts so this
module needs no verl): the prompt ids the server saw, the raw completion ids it sampled, a
response mask of ones (memsearch puts observations in the next call's *prompt*, never in a
response, so every response token is generated) and the rollout log-probs. The calls are the
ones ``memsearch.train.grpo.batch`` turns into rows (``rows_from_trajectory``: failed calls dropped,
missing ids refused), in episode order, so the last output is the last trained call: the
reader's answer when the reader is trained (``overwrite``), the last memory update otherwise.

verl's v1 trainer reads the reward and the GRPO advantage from the *last* output of a session
and broadcasts them to the others (memsearch's ``credit.mode = "share"``); it reads the advantage at
the last output's first mask-1 token, so ``session_outputs`` refuses a last output without a
generated token instead of silently giving the whole session advantage 0.

The summary travels in the last output's ``extra_fields["memsearch"]`` (in verl 0.9.1 the
reward-loop managers ``naive``, the default, ``rate_limited`` and ``remote`` merge it into
``extra_info``; the legacy ``verl.workers.reward_manager`` classes and reward-loop ``dapo``/``gdpo``
do not: ``reward.py``): exactly the trajectory fields ``train.grpo.reward.trajectory_reward`` reads, and no
label.
"""

from __future__ import annotations

from typing import Any

from memsearch.records.events import EventKind
from memsearch.records.trajectory import Trajectory
from memsearch.train.grpo.batch import rows_from_trajectory
from memsearch.train.rows import trained_calls


def session_outputs(trajectory: Trajectory, role: str) -> list[dict[str, Any]]:
    """The trained calls of ``trajectory`` as verl output fields, in episode order (module doc)."""
    rows, _failed = rows_from_trajectory(trajectory, role, index=0, group_index=0)
    outputs = [{"prompt_ids": list(r.prompt_ids), "response_ids": list(r.completion_ids),
                "response_mask": list(r.loss_mask), "response_logprobs": list(r.rollout_logprobs)} for r in rows]
    if outputs and not any(rows[-1].loss_mask):
        raise ValueError(f"task {trajectory.task_id}: the last trained call generated no token; verl would "
                         "read its session's advantage from an all-masked row (advantage 0 for every row)")
    return outputs


def reward_summary(trajectory: Trajectory, role: str) -> dict[str, Any]:
    """What the reward needs of a trajectory (``train.grpo.reward.trajectory_reward``), small and label-free:
    a trajectory line that ``Trajectory.from_json`` reads back (``reward.compute_score``), plus the
    trained ``role``.

    The trained calls keep only role and validity (the invalid-action penalty); documents,
    memory and prompts stay out, because verl copies every field into every row.
    """
    counts = trajectory.counts
    return {
        "task_id": trajectory.task_id,
        "role": role,
        "prediction": trajectory.prediction,
        "reader_text": trajectory.reader_text,
        "answer_format": trajectory.answer_format,
        "citations": list(trajectory.citations),
        "invalid_citations": list(trajectory.invalid_citations),
        "memory_sources": list(trajectory.memory_sources),
        "counts": {"searches": counts.searches, "policy_calls": counts.policy_calls,
                   "request_errors": counts.request_errors},
        "events": [{"type": EventKind.POLICY_CALL, "role": c.role, "valid": c.valid, "invalid_cause": c.invalid_cause}
                   for c in trained_calls(trajectory, role)],
        "status": trajectory.status,
    }

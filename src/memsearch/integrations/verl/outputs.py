"""Trajectory -> the rows verl trains on, and the episode summary the reward reads.

One trained policy call is one verl output (under state credit, one branch of a memory call;
``AgentLoopOutput`` fields, as plain dicts so this module needs no verl): the prompt ids the server
saw, the raw completion ids it sampled, a response mask of ones (memsearch puts observations in the
next call's *prompt*, never in a response, so every response token is generated) and the rollout
log-probs. The calls are the ones ``memsearch.train.grpo.batch`` turns into rows
(``rows_from_trajectory``: failed calls dropped, missing ids refused), in episode order, so the last
output is the last trained call: the reader's answer when the reader is trained (``overwrite``), the
last memory update otherwise.

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

from typing import TYPE_CHECKING, Any

from memsearch.integrations.verl.credit import CreditRecord
from memsearch.records.events import EventKind
from memsearch.records.trajectory import Trajectory
from memsearch.train.grpo.batch import rows_from_trajectory
from memsearch.train.grpo.failures import is_failed
from memsearch.train.grpo.state_credit import call_branches, call_reward, memory_calls
from memsearch.train.rows import trained_calls

if TYPE_CHECKING:
    from memsearch.train.config import CreditSettings


def session_outputs(trajectory: Trajectory, role: str, credit: CreditSettings | None = None,
                    gold: set[str] | None = None, session: str | None = None
                    ) -> tuple[list[dict[str, Any]], list[CreditRecord]]:
    """The rows of ``trajectory`` as verl output fields, in episode order, with each row's credit
    record (``credit.CreditRecord``; ``session``: verl's ``{uid}_{session_id}``, when known).

    ``share`` / ``split``: one row per trained call. ``state`` (``credit.mode``, with the task's
    ``gold`` supporting facts): one row per branch of each memory call, each with its per-call
    reward. Under split and state a failed trajectory (``train.grpo.failures``) gives no row, as
    memsearch's trainer leaves its rows out; under share verl's own GRPO keeps them.
    """
    mode = credit.mode if credit is not None else "share"
    std_scale = credit.std_scale if credit is not None else False
    if mode != "share" and is_failed(trajectory):
        return [], []
    if credit is not None and credit.mode == "state":
        if gold is None:
            raise ValueError(f"task {trajectory.task_id}: state credit needs the task's supporting facts")
        outputs, parts = [], []
        for call in memory_calls(trajectory):
            for branch, chosen in call_branches(call)[0]:
                ids = list(branch.completion_ids or ())
                outputs.append({"prompt_ids": list(call.prompt_ids or ()), "response_ids": ids,
                                "response_mask": [1] * len(ids), "response_logprobs": list(branch.logprobs or ())})
                parts.append((call.step, chosen, call_reward(branch, call, gold, credit.state_reward)))
        records = [CreditRecord("state", i, len(outputs), std_scale, session, call=step, continued=chosen,
                                call_reward=reward, global_weight=credit.global_weight)
                   for i, (step, chosen, reward) in enumerate(parts)]
    else:
        rows, _failed = rows_from_trajectory(trajectory, role, index=0, group_index=0)
        outputs = [{"prompt_ids": list(r.prompt_ids), "response_ids": list(r.completion_ids),
                    "response_mask": list(r.loss_mask), "response_logprobs": list(r.rollout_logprobs)} for r in rows]
        records = [CreditRecord(mode, i, len(outputs), std_scale, session) for i in range(len(outputs))]
    if outputs and not any(outputs[-1]["response_mask"]):
        raise ValueError(f"task {trajectory.task_id}: the last trained call generated no token; verl would "
                         "read its session's advantage from an all-masked row (advantage 0 for every row)")
    return outputs, records


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

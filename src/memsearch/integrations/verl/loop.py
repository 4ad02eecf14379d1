"""``MemsearchAgentLoop``: memsearch's episode engine as a verl 0.9.1 agent loop (imports verl).

Registered through the agent-loop YAML that ``memsearch verl config --agent-loops FILE`` writes
(``name: memsearch_agent``, ``_target_`` this class, ``train_config`` / ``data`` / ``overrides``
as constructor arguments) and chosen per parquet row by its ``agent_name`` column.

``run`` rolls out the row's task (``extra_info.task_id``) with ``run_episode`` unchanged
(``session.run_session``): the trained role(s) sample on verl's server through
``VerlPolicyBackend``, prompts built with verl's continuous-token builder (the chat template);
every other role keeps its configured backend. It returns one ``AgentLoopOutput`` per trained
call, in episode order (the v1 trainer makes each a row, scores the last, broadcasts reward and
advantage: memsearch's ``credit.mode = "share"``); under ``credit.mode = "state"`` one per branch
of each memory call. None when every trained call failed, or (split, state) when the trajectory
failed (verl logs the empty session). Each output carries the reward summary in
``extra_fields["memsearch"]`` (``compute_score`` reads the last one's), the session's counts
(rows, refused prompts, request errors, invalid actions) in ``extra_fields["memsearch_counts"]``
and its own credit record in ``extra_fields["memsearch_credit"]`` (``credit.CreditRecord``: what
memsearch's verl trainer needs for split and state credit). Labels are read only for state
credit's per-call rewards, on rows of the training folder.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from memsearch.integrations.verl.backend import VerlPolicyBackend
from memsearch.integrations.verl.credit import CREDIT_FIELD
from memsearch.integrations.verl.session import WorkerSetup, run_session, setup_for_row, worker_setup
from memsearch.records.trajectory import Trajectory
from memsearch.train.grpo.failures import is_failed

logger = logging.getLogger(__name__)


class MemsearchAgentLoop(AgentLoopBase):
    """A verl agent loop that runs one memsearch episode per session (module doc).

    Args (besides verl's own): ``train_config``, a memsearch GRPO config (or MemAgent pipeline
    config) path; ``data``, the prepared folder to read when a row's own ``extra_info.data_dir``
    is not on this machine (default: the config's); ``overrides``, ``--set``-style overrides of
    the config.
    """

    def __init__(self, *args: Any, train_config: str, data: str | None = None,
                 overrides: list[str] | tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trajectory: Trajectory | None = None  # the last episode, for rollout records and tests
        self.setup: WorkerSetup | None = None
        self.train_config = str(train_config)
        self.data = None if data is None else str(data)
        self.overrides = tuple(overrides)

    async def _encode(self, messages: list[dict[str, str]]) -> list[int]:
        # the running loop, not the one current when verl built this object
        return await asyncio.get_running_loop().run_in_executor(
            None, lambda: list(self.continuous_token_builder.build_initial_tokens(messages)))

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        """One session: the trained calls of one episode as verl outputs (module doc)."""
        extra = kwargs.get("extra_info") or {}
        task_id = extra.get("task_id")
        if not task_id:
            raise ValueError("the row has no extra_info.task_id: export the data with `memsearch verl export-data`")
        # verl builds a loop per sample: the setup (config, data, index, backends) is cached per process.
        self.setup = setup_for_row(self.train_config, extra, self.data, self.overrides)
        # A row of the folder the config trains on gets the config's credit; a validation row
        # (another folder) one plain episode (session.run_session).
        training = self.setup.fingerprint == worker_setup(self.train_config, self.data, self.overrides).fingerprint
        policy = VerlPolicyBackend(
            self.server_manager, self._encode, lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
            sampling_params, prompt_length=self.rollout_config.prompt_length,
            response_length=self.rollout_config.response_length)
        uid, session_id = kwargs.get("uid"), kwargs.get("session_id")
        session = f"{uid}_{session_id}" if uid is not None and session_id is not None else None
        rollout = await run_session(self.setup, task_id, policy, training=training, session=session)
        self.trajectory = trajectory = rollout.trajectory
        counts = {"rows": len(rollout.outputs), "prompt_overflows": policy.overflows,
                  "request_errors": trajectory.counts.request_errors,
                  "invalid_actions": trajectory.counts.invalid_actions}
        if not rollout.outputs and trajectory.counts.policy_calls:
            logger.warning("task %s (session %s): no row: %s", task_id, session,
                           "the trajectory failed (a request error), left out as memsearch's trainer leaves it out"
                           if is_failed(trajectory) else "every trained call failed")
        # Every output gets the same extra-field keys (verl stores them column-wise); the reward
        # manager reads the last one's. The summary is small and holds no label; the credit record
        # is the row's own (credit.CreditRecord, read by memsearch's verl trainer).
        return [AgentLoopOutput(**fields, num_turns=2, metrics=AgentLoopMetrics(),
                                extra_fields={"memsearch": rollout.summary, "memsearch_counts": dict(counts),
                                              CREDIT_FIELD: record.to_json()})
                for fields, record in zip(rollout.outputs, rollout.records, strict=True)]

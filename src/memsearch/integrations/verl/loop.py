"""``MemsearchAgentLoop``: memsearch's episode engine as a verl 0.9.1 agent loop (imports verl).

Registered through the agent-loop YAML that ``memsearch verl config --agent-loops FILE`` writes
(``name: memsearch_agent``, ``_target_`` this class, ``train_config`` / ``data`` / ``overrides``
as constructor arguments) and chosen per parquet row by its ``agent_name`` column.

``run`` rolls out the row's task (``extra_info.task_id``) with ``run_episode`` unchanged
(``session.run_session``): the trained role(s) sample on verl's server through
``VerlPolicyBackend``, prompts built with verl's continuous-token builder (the chat template);
every other role keeps its configured backend. It returns one ``AgentLoopOutput`` per trained
call, in episode order (the v1 trainer makes each a row, scores the last, broadcasts reward and
advantage: memsearch's ``credit.mode = "share"``); none when every trained call failed (verl logs the
empty session). Each output carries the reward summary in ``extra_fields["memsearch"]``
(``compute_score`` reads the last one's; no label is read here) and the session's counts
(rows, refused prompts, request errors, invalid actions) in ``extra_fields["memsearch_counts"]``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from memsearch.integrations.verl.backend import VerlPolicyBackend
from memsearch.integrations.verl.session import WorkerSetup, run_session, setup_for_row
from memsearch.records.trajectory import Trajectory


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
        policy = VerlPolicyBackend(
            self.server_manager, self._encode, lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
            sampling_params, prompt_length=self.rollout_config.prompt_length,
            response_length=self.rollout_config.response_length)
        trajectory, outputs, summary = await run_session(self.setup, task_id, policy)
        self.trajectory = trajectory
        counts = {"rows": len(outputs), "prompt_overflows": policy.overflows,
                  "request_errors": trajectory.counts.request_errors,
                  "invalid_actions": trajectory.counts.invalid_actions}
        # Every output gets the same extra-field keys (verl stores them column-wise); the reward
        # manager reads the last one's. The summary is small and holds no label.
        return [AgentLoopOutput(**fields, num_turns=2, metrics=AgentLoopMetrics(),
                                extra_fields={"memsearch": summary, "memsearch_counts": dict(counts)})
                for fields in outputs]

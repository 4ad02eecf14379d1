"""memsearch on upstream verl (0.9.1): the episode engine as a verl agent loop, no fork (docs/verl.md).

- ``outputs``: trajectory -> the rows verl trains on (pure; no verl import);
- ``backend``: ``VerlPolicyBackend``, a ``PolicyBackend`` over verl's ``server_manager.generate``;
- ``loop``: ``MemsearchAgentLoop``, verl's ``AgentLoopBase`` running ``run_episode`` unchanged
  (imports verl; load it only where verl is installed);
- ``reward``: ``compute_score`` for ``reward.custom_reward_function`` (memsearch's reward);
- ``data``: ``memsearch verl export-data`` (the parquet verl reads);
- ``config``: ``memsearch verl config`` (Hydra overrides; unmappable options refused).

Only ``loop`` imports verl, so everything else runs (and is tested) in the main environment.
"""

AGENT_NAME = "memsearch_agent"

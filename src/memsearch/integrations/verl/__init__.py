"""memsearch on upstream verl (0.9.1): the episode engine as a verl agent loop, no fork (docs/verl.md).

- ``outputs``: trajectory -> the rows verl trains on (pure; no verl import);
- ``backend``: ``VerlPolicyBackend``, a ``PolicyBackend`` over verl's ``server_manager.generate``;
- ``loop``: ``MemsearchAgentLoop``, verl's ``AgentLoopBase`` running ``run_episode`` unchanged
  (imports verl; load it only where verl is installed);
- ``credit``: split and state credit's per-row records and advantages (pure);
- ``trainer``: ``MemsearchTrainer``, verl's sync v1 trainer with that credit, registered as
  ``memsearch`` on import (imports verl);
- ``reward``: ``compute_score`` for ``reward.custom_reward_function`` (memsearch's reward);
- ``data``: ``memsearch verl export-data`` (the parquet verl reads);
- ``config``: ``memsearch verl config`` (Hydra overrides; unmappable options refused).

Only ``loop`` and ``trainer`` import verl, so everything else runs (and is tested) in the main environment.
"""

AGENT_NAME = "memsearch_agent"
TRAINER_NAME = "memsearch"  # trainer.v1.trainer_mode of split and state credit
TRAINER_MODULE = "memsearch.integrations.verl.trainer"  # imported into verl's processes to register it

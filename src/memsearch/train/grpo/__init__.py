"""Multi-turn GRPO: the trainer (``trainer``), the batch it builds from rollouts (rewards, credit,
dynamic sampling, failed trajectories, the decision view) and the update (loss, shared-prompt
scoring, step records, the collapse guard)."""

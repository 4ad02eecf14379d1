"""Training (docs/design.md §7), in two rooms over shared infrastructure: ``train.sft`` (the
export-sft rows, which of them train, LoRA SFT) and ``train.grpo`` (multi-turn GRPO: batch,
credit, update, logs); here the configs, the row both consume, the policy and its checkpoints,
ranks, log-probs, the memory plan and the ``launch`` entry point."""

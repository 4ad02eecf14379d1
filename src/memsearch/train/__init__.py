"""Training: SFT data export from teacher trajectories, rows, advantages and losses (docs/design.md §7)."""

"""Training: SFT data export from teacher trajectories, rows, advantages and losses (DESIGN §7)."""

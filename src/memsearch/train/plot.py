"""The reward curve of a training run as a PNG (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

from memsearch.errors import InputValueError
from memsearch.train.log import read_log


def plot_rewards(log_path: str | Path, png: str | Path, title: str | None = None) -> Path:
    """Mean reward per step with a ±1 std band (and the invalid-action rate on a second axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for r in read_log(Path(log_path)) if "reward_mean" in r]
    if not records:
        raise InputValueError(f"{log_path}: no step records with reward_mean")
    steps = [r["step"] for r in records]
    mean = [r["reward_mean"] for r in records]
    std = [r["reward_std"] for r in records]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot(steps, mean, marker="o", label="reward (mean over rollouts)")
    ax.fill_between(
        steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2, label="±1 std"
    )
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    if any("invalid_rate" in r for r in records):
        ax2 = ax.twinx()
        ax2.plot(
            steps, [r.get("invalid_rate", 0.0) for r in records], color="tab:red", linestyle="--", label="invalid rate"
        )
        ax2.set_ylabel("invalid-action rate", color="tab:red")
        ax2.set_ylim(0, 1)
    ax.set_title(title or str(Path(log_path).parent.name))
    ax.legend(loc="upper left")
    fig.tight_layout()
    png = Path(png)
    fig.savefig(png)
    plt.close(fig)
    return png

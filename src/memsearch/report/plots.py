"""Static PNG plots (matplotlib, headless) for ``docs/results``: the reward curve of each
training log and the headline metrics of each run with their bootstrap 95 % CI."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_metrics(runs: dict[str, dict[str, Any]], png: Path, keys: tuple[str, ...] = ("em", "f1")) -> Path:
    """Bars per run (a matrix gives one per group) for ``keys``, with the report's CIs as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(runs)
    fig, ax = plt.subplots(figsize=(max(4, 1.4 * len(names)), 3.5), dpi=120)
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        means = [runs[n]["header"]["metrics"].get(key) or 0.0 for n in names]
        cis = [runs[n]["header"]["ci"].get(key) or [m, m] for n, m in zip(names, means)]
        err = [[m - c[0] for m, c in zip(means, cis)], [c[1] - m for m, c in zip(means, cis)]]
        ax.bar([x + i * width for x in range(len(names))], means, width, yerr=err, capsize=3, label=key)
    ax.set_xticks([x + width * (len(keys) - 1) / 2 for x in range(len(names))], names)
    ax.set_ylim(0, 1)
    ax.legend()
    ax.set_title("mean with 95% bootstrap CI")
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return png


def write_plots(
    paths: list[Path], data_dir: Path | None, out_dir: Path, train_logs: list[Path] | None = None
) -> list[Path]:
    """``metrics.png`` for the runs (when any) and ``reward-<log folder>.png`` per training log."""
    from memsearch.train.plot import plot_rewards

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if paths:
        from memsearch.report.payload import build_payload

        payload = build_payload([Path(p) for p in paths], Path(data_dir))
        written.append(plot_metrics(payload["runs"], out_dir / "metrics.png"))
    for log in train_logs or []:
        written.append(plot_rewards(log, out_dir / f"reward-{Path(log).parent.name or 'log'}.png"))
    return written

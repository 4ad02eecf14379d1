"""Static PNG plots (matplotlib, headless) for ``docs/results``: the reward curve of each
training log and the headline metrics of each run with their bootstrap 95 % CI."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable


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
    paths: list[Path], data_dir: Path | None, out_dir: Path, train_logs: list[Path] | None = None,
    force: bool = False,
) -> list[Path]:
    """``metrics.png`` for the runs (when any) and ``reward-<log folder>.png`` per training log.

    An existing ``out_dir`` is refused unless ``force`` (then only these files in it are
    replaced; a symlink as ``out_dir``, or the file system root, is refused even then), and so are
    two logs whose plots would take one name; each PNG is written whole and renamed into place,
    so a symlink of that name is replaced, never written through."""
    from memsearch.errors import InputError
    from memsearch.eval.run_folder import replacing
    from memsearch.train.plot import curve_records, plot_rewards

    out_dir = Path(out_dir)
    if out_dir.is_symlink():  # --force or not: the plots go into the folder named, never through a link
        raise InputError(f"{out_dir}: --out is a symlink to {os.readlink(out_dir)}; name the folder itself")
    if out_dir.exists() and not force:
        raise InputError(
            f"{out_dir}: output folder already exists; pass --force to replace its plots, or choose a new folder"
        )
    if out_dir.resolve() == Path(out_dir.resolve().anchor):
        raise InputError(f"{out_dir}: --out is the file system root; choose a folder of its own for the plots")
    # file name -> how to draw it; every input is read before the folder is made
    draw: dict[str, Callable[[Path], Any]] = {}
    if paths:
        from memsearch.report.payload import build_payload

        runs = build_payload([Path(p) for p in paths], Path(data_dir))["runs"]
        draw["metrics.png"] = functools.partial(plot_metrics, runs)
    logs: dict[str, Path] = {}
    for log in map(Path, train_logs or []):
        name = f"reward-{log.parent.name or 'log'}.png"
        if name in logs:
            raise InputError(f"{log}: its plot {name} would replace the one of {logs[name]} (both logs are in a "
                             f"folder named {log.parent.name!r}); plot them into two --out folders")
        logs[name] = log
        draw[name] = functools.partial(plot_rewards, log, records=curve_records(log))
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, plot in draw.items():
        with replacing(out_dir / name) as tmp:
            plot(tmp)
    return [out_dir / name for name in draw]

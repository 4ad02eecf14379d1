"""``memsearch demo``: the four-group matrix on real HotpotQA dev questions with the embedded
model on a CPU (or with the ``rules`` backend in seconds).

It prepares the shipped dev sample, runs groups A-D under identical budgets
(``configs/demo.toml``, or ``configs/rules.toml`` for ``--backend rules``) on the first
``limit`` questions, prints the table and says where everything was written.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

DEMO_CONFIGS = {"hf": "demo.toml", "rules": "rules.toml"}


def fresh_run_dir(prefix: str) -> Path:
    """``runs/<prefix>-<timestamp>``, made unique if a folder of that name exists."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path("runs") / f"{prefix}-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = Path("runs") / f"{prefix}-{stamp}-{n}"
    return path


def report_command(run: Path, data: Path) -> str:
    """The line eval, matrix and the demo end with: how to write and open the run's report."""
    return f"report: memsearch report view {run} --data {data} --out {Path(run) / 'report.html'}"


def run_demo(backend: str = "hf", limit: int = 4, out: Path | None = None, echo: Callable[[str], None] = print,
             show_progress: bool = True) -> dict:
    from memsearch.config import load_config
    from memsearch.data.dataset import save_dataset
    from memsearch.data.hotpot import convert_hotpot
    from memsearch.errors import InputError
    from memsearch.eval.matrix import run_matrix
    from memsearch.samples import HOTPOT_DEV, config_path, samples_dir

    if backend not in DEMO_CONFIGS:
        raise InputError(f"--backend {backend!r}: expected one of {', '.join(DEMO_CONFIGS)}")
    out = Path(out) if out is not None else fresh_run_dir("demo")
    if out.exists():
        raise InputError(f"{out}: output folder already exists; choose a new folder (nothing was written)")
    started = time.perf_counter()
    data_dir = out / "data" / "hotpot-dev"
    save_dataset(convert_hotpot(samples_dir() / HOTPOT_DEV, split="dev"), data_dir)
    cfg_file = config_path(DEMO_CONFIGS[backend])
    config = load_config(cfg_file, [f"limit={limit}"])
    echo(f"demo: groups A-D on the first {limit} real HotpotQA dev questions, backend {backend} ({cfg_file.name}), "
         f"tokenizer {config.tokenizer}, budgets {config.budgets.model_dump()}")
    result = run_matrix(config, data_dir, out / "matrix", show_progress=show_progress)
    echo(result["table"])
    seconds = time.perf_counter() - started
    echo(f"done in {seconds:.0f}s. Per-group trajectories, metrics and summaries: {out / 'matrix'}/<group>/; "
         f"table: {out / 'matrix' / 'matrix.md'}")
    from memsearch.report.html import write_report

    # The demo writes its report itself (a second or so): the end of the demo is a file to open.
    report = write_report([out / "matrix"], data_dir, out / "report.html")
    echo(f"report (open in a browser, works offline): {report}")
    if not result["usable_for_comparison"]:
        echo("NOT USABLE FOR COMPARISON: some group has failed tasks or request errors (see its summary.json)")
    result["seconds"] = seconds
    result["out"] = str(out)
    return result

"""``memsearch demo``: the four-group matrix on real HotpotQA dev questions with the embedded
model on a CPU (or with the ``rules`` backend in seconds).

It prepares the shipped dev sample, runs groups A-D under identical budgets
(``configs/demo.toml``, or ``configs/rules.toml`` for ``--backend rules``) on the first
``limit`` questions, prints the table and says where everything was written.

With the hf backend it also runs two rows beside B, with the same budgets, reader and questions:
``B-rules``, group B with its memory written by the rules heuristic (the hand-written policy a
trained one must beat), and ``B-trained``, group B with its memory written by the shipped trained
memory-policy adapter (``models/memory-policy-cpu``, or ``--adapter`` /
``MEMSEARCH_MEMORY_POLICY_ADAPTER``; schema mode, as it was trained), in ``OUT/matrix/B-rules`` and
``OUT/matrix/B-trained``. Both rows use the memory action format the adapter was trained in (its
fingerprint's provenance; ``assets.adapter.trained_memory_format``), so trained and hand-written
policies are compared in one format. A missing or changed adapter is refused before anything runs. The rules
demo has neither (its B is the rules memory; the adapter is a LoRA on the embedded model).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from pathlib import Path

DEMO_CONFIGS = {"hf": "demo.toml", "rules": "rules.toml"}
TRAINED_GROUP = "B-trained"
RULES_GROUP = "B-rules"


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
    """The line eval, matrix and the demo end with: how to write and open the run's report. Each
    path is shell-quoted, so the line pasted into a shell runs that command and nothing else."""
    return "report: " + shlex.join(
        ["memsearch", "report", "view", str(run), "--data", str(data), "--out", str(Path(run) / "report.html")]
    )


def trained_group_config(config, adapter: Path, memory_format: str = "text"):
    """Group B of ``config`` with its memory written by ``adapter`` (a LoRA on the memory model,
    decoding in schema mode as the memory-policy pipeline trains it) in the action format it was
    trained in; nothing else changes."""
    from memsearch.config import group_config

    b = group_config(config, "B")
    memory = b.backends.memory.replaced(adapter=str(Path(adapter).resolve()), schema_mode=True)
    return _with_memory(b, memory, memory_format)


def rules_group_config(config, memory_format: str = "text"):
    """Group B of ``config`` with its memory written by the rules heuristic in ``memory_format``
    (the trained row's, so the two policies differ only in who decides); nothing else changes."""
    from memsearch.config import group_config

    b = group_config(config, "B")
    return _with_memory(b, b.backends.memory.replaced(kind="rules", adapter=None, schema_mode=False), memory_format)


def _with_memory(b, memory, memory_format: str):
    """Run config ``b`` with ``memory`` as its memory backend, in ``memory_format``, checked as a
    file's would be (``pipelines.config.updated``)."""
    from memsearch.pipelines.config import updated

    return updated(b, backends=updated(b.backends, memory=memory), agent=updated(b.agent, memory_format=memory_format))


def _add_b_rows(config, result: dict, data_dir: Path, matrix_dir: Path, adapter: Path, fingerprint: dict,
                memory_format: str, show_progress: bool) -> dict:
    """Run ``B-rules`` and ``B-trained`` (both in ``memory_format``) into ``matrix_dir`` and rewrite ``matrix.json`` /
    ``matrix.md`` with their rows and pairs (so the report and the table show them beside A-D)."""
    from memsearch.eval.matrix import check_comparable, compare, render_table
    from memsearch.eval.runner import run_eval
    from memsearch.io import write_json
    from memsearch.records.run_summary import MatrixGroup

    rows = {RULES_GROUP: rules_group_config(config, memory_format),
            TRAINED_GROUP: trained_group_config(config, adapter, memory_format)}
    check_comparable({"B": config, **rows})
    groups = {name: MatrixGroup.from_json(entry) for name, entry in result["groups"].items()}
    for name, row_config in rows.items():
        groups[name] = run_eval(row_config, data_dir, matrix_dir / name, group=name,
                                show_progress=show_progress).group_entry()
    pairs = compare(matrix_dir, list(groups), config.matrix.bootstrap_resamples)
    result = {**{k: v for k, v in result.items() if k != "table"},
              "groups": {name: g.to_json() for name, g in groups.items()}, "pairs": pairs,
              "usable_for_comparison": all(g.usable_for_comparison for g in groups.values()),
              "trained_adapter": {"path": str(Path(adapter).resolve()), "files": fingerprint["files"],
                                  "base_model": fingerprint.get("base_model")}}
    table = render_table(groups, pairs)
    write_json(matrix_dir / "matrix.json", result)
    (matrix_dir / "matrix.md").write_text(table, encoding="utf-8")
    return {**result, "table": table}


def run_demo(backend: str = "hf", limit: int = 4, out: Path | None = None, echo: Callable[[str], None] = print,
             show_progress: bool = True, adapter: Path | None = None, overrides: list[str] | None = None) -> dict:
    """The demo (module docstring). ``adapter``: the trained row's adapter folder (default: the
    shipped one, ``memsearch.assets.adapter.shipped_adapter_dir``); ``overrides``: ``--set``-style
    overrides of the demo config (e.g. ``matrix.groups=["B"]`` for a quick check)."""
    from memsearch.assets.adapter import shipped_adapter_dir, trained_memory_format, verify_adapter
    from memsearch.assets.samples import HOTPOT_DEV, config_path, samples_dir
    from memsearch.config import load_config
    from memsearch.data.converters import source_converter
    from memsearch.data.dataset import save_dataset
    from memsearch.errors import InputError
    from memsearch.eval.matrix import run_matrix

    if backend not in DEMO_CONFIGS:
        raise InputError(f"--backend {backend!r}: expected one of {', '.join(DEMO_CONFIGS)}")
    out = Path(out) if out is not None else fresh_run_dir("demo")
    if out.exists():
        raise InputError(f"{out}: output folder already exists; choose a new folder (nothing was written)")
    cfg_file = config_path(DEMO_CONFIGS[backend])
    config = load_config(cfg_file, [f"limit={limit}", *(overrides or [])])
    fingerprint = None
    if backend == "hf":
        # Checked before anything is written or run: a missing or changed adapter fails here, by path.
        adapter = Path(adapter) if adapter is not None else shipped_adapter_dir()
        fingerprint = verify_adapter(adapter, base_model=config.backends.memory.model, required=True)
        trained_format = trained_memory_format(fingerprint) or "text"
    started = time.perf_counter()
    data_dir = out / "data" / "hotpot-dev"
    save_dataset(source_converter("hotpot").convert(samples_dir() / HOTPOT_DEV, split="dev"), data_dir)
    groups = "A-D" if list(config.matrix.groups) == ["A", "B", "C", "D"] else ", ".join(config.matrix.groups)
    echo(
        f"demo: groups {groups} on the first {limit} real HotpotQA dev questions, backend {backend} ({cfg_file.name}), "
        f"tokenizer {config.tokenizer}, budgets {config.budgets.model_dump()}"
    )
    if fingerprint is not None:
        echo(
            f"{TRAINED_GROUP}: group B with its memory written by the trained memory-policy adapter {adapter} "
            f"(schema mode, {trained_format} memory format as it was trained; run here under the "
            f"demo's budgets); {RULES_GROUP}: group B with the rules heuristic's memory in the same format, the policy "
            "it must beat"
        )
    else:
        echo(
            f"{TRAINED_GROUP}: not run with --backend {backend}: the trained adapter is a LoRA on the embedded model "
            "(run the demo with --backend hf to see it)"
        )
    result = run_matrix(config, data_dir, out / "matrix", show_progress=show_progress)
    if fingerprint is not None:
        result = _add_b_rows(config, result, data_dir, out / "matrix", adapter, fingerprint, trained_format,
                             show_progress)
    echo(result["table"])
    seconds = time.perf_counter() - started
    echo(
        f"done in {seconds:.0f}s. Per-group trajectories, metrics and summaries: {out / 'matrix'}/<group>/; "
        f"table: {out / 'matrix' / 'matrix.md'}"
    )
    from memsearch.report.html import write_report

    # The demo writes its report itself (a second or so): the end of the demo is a file to open.
    report = write_report([out / "matrix"], data_dir, out / "report.html")
    echo(f"report (open in a browser, works offline): {report}")
    if not result["usable_for_comparison"]:
        echo("NOT USABLE FOR COMPARISON: some group has failed tasks or request errors (see its summary.json)")
    result["seconds"] = seconds
    result["out"] = str(out)
    return result

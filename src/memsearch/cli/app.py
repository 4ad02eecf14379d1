"""memsearch: data, retrieval and memory for budgeted multi-hop QA agents.

Every command imports what it needs inside its body, so ``memsearch --help`` stays instant.
Bad input ends with ``error: <file:line: field: problem>`` lines and a non-zero exit status,
never a traceback.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(help=__doc__.split("\n\n")[0], no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
index_app = typer.Typer(help="Build and inspect retrieval indexes.", no_args_is_help=True)
app.add_typer(index_app, name="index")
train_app = typer.Typer(help="Train policies: LoRA SFT and multi-turn GRPO (torchrun for several devices).", no_args_is_help=True)
app.add_typer(train_app, name="train")
pipeline_app = typer.Typer(help="End-to-end pipelines: prepare, train, merge, evaluate, report (resumable).", no_args_is_help=True)
app.add_typer(pipeline_app, name="pipeline")
report_app = typer.Typer(help="Browse runs in a self-contained HTML report; write the static plots.", no_args_is_help=True)
app.add_typer(report_app, name="report")
verl_app = typer.Typer(help="Scale out on upstream verl: export the parquet, print the Hydra overrides (docs/verl.md).",
                       no_args_is_help=True)
app.add_typer(verl_app, name="verl")
from memsearch.cli.retrieval import retrieval_app  # noqa: E402 - typer only; commands import lazily

app.add_typer(retrieval_app, name="retrieval")


def _friendly(fn):
    """Turn ``InputError`` (and missing files) into ``error:`` lines and exit status 2, and
    ``StorageError`` (a failed write: disk full, permissions) into one line and status 4."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from memsearch.errors import InputError, StorageError

        try:
            return fn(*args, **kwargs)
        except (InputError, FileNotFoundError, ValueError) as exc:
            for line in str(exc).splitlines():
                typer.echo(f"error: {line}", err=True)
            raise typer.Exit(2) from None
        except StorageError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(EXIT_STORAGE) from None

    return wrapper


Limit = Annotated[Optional[int], typer.Option(help="Take only the first N examples, in source order.")]


def _prepare(convert, input: Path, out: Path, split: str, limit: int | None) -> None:
    from memsearch.data.dataset import save_dataset
    from memsearch.data.source import check_split

    check_split(input, split)
    dataset = convert(input, split=split, limit=limit)
    save_dataset(dataset, out)
    typer.echo(f"wrote {out}: {len(dataset.tasks)} tasks, {len(dataset.documents)} documents ({dataset.manifest['kind']} {split})")


@app.command("prepare-hotpot")
@_friendly
def prepare_hotpot(
    input: Annotated[Path, typer.Option(help="HotpotQA file: JSON list, JSON lines, or the Hugging Face layout.")],
    out: Annotated[Path, typer.Option(help="New output folder (must not exist).")],
    split: Annotated[str, typer.Option(help="train or dev (required): recorded in the manifest, which keeps dev data out of training.")],
    limit: Limit = None,
) -> None:
    """Convert HotpotQA into corpus.jsonl, tasks.jsonl, labels.jsonl and manifest.json."""
    from memsearch.data.hotpot import convert_hotpot

    _prepare(convert_hotpot, input, out, split, limit)


@app.command("prepare-musique")
@_friendly
def prepare_musique(
    input: Annotated[Path, typer.Option(help="MuSiQue-Ans file: JSON list or JSON lines.")],
    out: Annotated[Path, typer.Option(help="New output folder (must not exist).")],
    split: Annotated[str, typer.Option(help="train or dev (required): recorded in the manifest, which keeps dev data out of training.")],
    limit: Limit = None,
) -> None:
    """Convert MuSiQue-Ans into the same three-file layout (paragraph-level evidence)."""
    from memsearch.data.musique import convert_musique

    _prepare(convert_musique, input, out, split, limit)


@app.command("prepare-ruler")
@_friendly
def prepare_ruler(
    input: Annotated[Path, typer.Option(help="A prepared dev folder (from prepare-hotpot --split dev).")],
    docs: Annotated[str, typer.Option(help="Comma-separated numbers of documents per context.")],
    out: Annotated[Path, typer.Option(help="New output folder; one docs{N} subfolder per N.")],
    seed: Annotated[int, typer.Option(help="Seed for sampling and shuffling documents.")] = 42,
    limit: Limit = None,
    tokenizer: Annotated[str, typer.Option(help="Tokenizer for the context-length stats: embedded, lexical, none, or a folder.")] = "embedded",
) -> None:
    """RULER-HQA-style long contexts: each question's own paragraphs hidden among N-own others."""
    from memsearch.data.ruler import prepare_ruler as build
    from memsearch.tokenizer import load_tokenizer

    try:
        numbers = [int(x) for x in docs.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--docs {docs!r}: expected comma-separated integers, e.g. 50,200,800") from None
    tok = None if tokenizer == "none" else load_tokenizer(tokenizer)
    manifests = build(input, out, numbers, seed=seed, limit=limit, tokenizer=tok)
    for n, m in manifests.items():
        stats = m.get("context_tokens")
        length = f", context tokens mean {stats['mean']} (min {stats['min']}, max {stats['max']}, {stats['tokenizer']})" if stats else ""
        typer.echo(f"{out / f'docs{n}'}: {m['counts']['tasks']} tasks, {m['counts']['documents']} documents{length}")


@app.command("validate-data")
@_friendly
def validate_data(
    data: Annotated[Path, typer.Option(help="A prepared data folder.")],
    against: Annotated[Optional[Path], typer.Option(help="Another prepared folder that must share no task id or question.")] = None,
) -> None:
    """Check schemas, ids, references, supporting facts, label leakage, hashes and split overlap."""
    from memsearch.data.validate import validate_data as check

    problems = check(data, against)
    for problem in problems:
        typer.echo(str(problem), err=True)
    if problems:
        typer.echo(f"{len(problems)} problem(s) in {data}", err=True)
        raise typer.Exit(1)
    typer.echo(f"{data}: valid" + (f", no overlap with {against}" if against else ""))


@index_app.command("build")
@_friendly
def index_build(
    data: Annotated[Path, typer.Option(help="A prepared data folder (its corpus.jsonl is indexed).")],
    out: Annotated[Path, typer.Option(help="New index folder (must not exist).")],
) -> None:
    """Build a BM25 (bm25s) index over a prepared corpus."""
    import time

    from memsearch.data.dataset import load_dataset
    from memsearch.retrieval import BM25Retriever

    start = time.perf_counter()
    retriever = BM25Retriever.build(load_dataset(data).documents, show_progress=True)
    retriever.save(out)
    typer.echo(f"wrote {out}: {len(retriever)} documents in {time.perf_counter() - start:.1f}s")


@app.command("search")
@_friendly
def search(
    query: Annotated[str, typer.Argument(help="Query text.")],
    index: Annotated[Path, typer.Option(help="An index folder from `memsearch index build`.")],
    k: Annotated[int, typer.Option("-k", help="Number of passages.")] = 5,
    data: Annotated[Optional[Path], typer.Option(help="With --task: the prepared folder holding the task.")] = None,
    task: Annotated[Optional[str], typer.Option(help="Restrict to this task's candidate documents (scope 'candidates').")] = None,
    method: Annotated[Optional[str], typer.Option(help="bm25, dense or hybrid (a dense folder serves all three); default: the folder's own.")] = None,
) -> None:
    """Search an index (BM25 or dense folder) and print passages with their evidence ids."""
    from memsearch.retrieval.index import open_index

    candidates = None
    if task is not None:
        if data is None:
            raise ValueError("--task needs --data, the prepared folder that holds the task")
        from memsearch.data.dataset import load_dataset

        found = [t for t in load_dataset(data).tasks if t.id == task]
        if not found:
            raise ValueError(f"--task {task!r}: not in {data}/tasks.jsonl")
        candidates = found[0].doc_ids
    retriever = open_index(index, method)
    for passage in retriever.search(query, k=k, candidates=candidates):
        typer.echo(f"#{passage.rank + 1}  {passage.doc_id}  {passage.title}  (score {passage.score:.2f})")
        for eid, sentence in passage.sentences:
            typer.echo(f"    [{eid}] {sentence.strip()}")


Overrides = Annotated[Optional[list[str]], typer.Option("--set", help="Override a config field: key=value (repeatable).")]
ConfigFile = Annotated[Path, typer.Option("--config", help="TOML run config, e.g. configs/rules.toml.")]
DataDir = Annotated[Path, typer.Option("--data", help="A prepared data folder.")]


def _run_config(path: Path, overrides: list[str] | None, limit: int | None, matrix: bool = False):
    """The resolved run config: file (a run config or a pipeline config), then ``--set``
    overrides, then ``--limit``. Prints a notice for each table the run uses that the config
    leaves to defaults."""
    from memsearch.config import apply_overrides, defaulted_sections
    from memsearch.errors import InputError
    from memsearch.pipelines.config import load_run_config, run_config_tables

    # `--limit 0` must not mean "no limit": on a paid API that is every question of the folder.
    if limit is not None and limit < 1:
        raise InputError(f"--limit {limit}: expected a positive number of tasks")
    overrides = list(overrides or []) + ([f"limit={limit}"] if limit is not None else [])
    config = load_run_config(path, overrides)
    tables = apply_overrides(run_config_tables(path), overrides)
    for section in defaulted_sections(tables, uses_controller=matrix or config.agent.controller == "policy"):
        what = "that role runs the default backend (kind = 'rules')" if section.startswith("backends.") else "it takes the defaults"
        typer.echo(f"notice: {path} has no [{section}] table: {what}", err=True)
    return config


# Exit status of `eval` / `matrix` when the run finished but is not a result (tasks missing or
# failed): distinct from 1 (a crash) and 2 (bad input), so `memsearch eval ... && next` stops.
EXIT_INCOMPLETE = 3
# A write failed (disk full, read-only, permissions): the saved tasks are safe; --resume continues.
EXIT_STORAGE = 4


@app.command("eval")
@_friendly
def eval_cmd(
    config: ConfigFile,
    data: DataDir,
    out: Annotated[Path, typer.Option(help="New run folder (or the one to --resume).")],
    limit: Limit = None,
    resume: Annotated[bool, typer.Option(help="Finish a crashed run in OUT: missing tasks only.")] = False,
    set_: Overrides = None,
) -> None:
    """Run one agent over a data folder: trajectories, per-task metrics, summary."""
    from memsearch.eval.runner import run_eval

    summary = run_eval(_run_config(config, set_, limit), data, out, resume=resume)
    m = summary["metrics"]
    typer.echo(f"{out}: {summary['tasks']['scored']}/{summary['tasks']['expected']} tasks, F1 {m['f1']:.3f}, EM {m['em']:.3f}, "
               f"invalid-action rate {m['invalid_action_rate'] or 0:.3f}, request errors {summary['request_errors']}")
    if summary["note"]:
        typer.echo(summary["note"], err=True)
    typer.echo(report_hint(out, data))
    if not summary["complete"]:
        raise typer.Exit(EXIT_INCOMPLETE)


@app.command("matrix")
@_friendly
def matrix_cmd(
    config: ConfigFile,
    data: DataDir,
    out: Annotated[Path, typer.Option(help="New folder: one subfolder per group plus matrix.json / matrix.md.")],
    limit: Limit = None,
    resume: Annotated[bool, typer.Option(help="Finish the groups of a crashed matrix in OUT.")] = False,
    set_: Overrides = None,
) -> None:
    """Groups A-D (memory x controller) under identical budgets, with paired bootstrap CIs."""
    from memsearch.eval.matrix import run_matrix

    result = run_matrix(_run_config(config, set_, limit, matrix=True), data, out, resume=resume)
    typer.echo(result["table"])
    if not result["usable_for_comparison"]:
        typer.echo("NOT USABLE FOR COMPARISON: some group has failed tasks or request errors (see its summary.json)", err=True)
    typer.echo(report_hint(out, data))
    incomplete = [g for g, s in result["groups"].items() if not s["complete"]]
    if incomplete:
        typer.echo(f"INCOMPLETE: group(s) {', '.join(incomplete)} have missing or failed tasks; not a result", err=True)
        raise typer.Exit(EXIT_INCOMPLETE)


@app.command("export-sft")
@_friendly
def export_sft_cmd(
    trajectories: Annotated[Path, typer.Option(help="trajectories.jsonl of an eval run (config.json must sit next to it).")],
    metrics: Annotated[Path, typer.Option(help="metrics.jsonl written with those trajectories.")],
    role: Annotated[str, typer.Option(help="Policy role to export: memory, controller or reader.")],
    out: Annotated[Path, typer.Option(help="New JSON-lines file (must not exist).")],
    min_f1: Annotated[Optional[float], typer.Option(help="Keep only tasks whose metrics row has f1 >= this.")] = None,
) -> None:
    """Chat-format SFT rows (messages, completion) from the valid policy calls of one role."""
    from memsearch.train.export import export_sft

    for line in export_sft(trajectories, metrics, role, out, min_f1=min_f1).lines():
        typer.echo(line)


TrainOut = Annotated[Path, typer.Option("--out", help="New run folder (or the one to --resume).")]
TrainResume = Annotated[bool, typer.Option(help="Continue the run in OUT from its newest complete checkpoint, exactly.")]


def _train(kind: str, config: Path, out: Path, resume: bool, adapter: Path | None, overrides: list[str] | None) -> None:
    """Load the trainer config (file, --set, --adapter) and run ``memsearch.train.<kind>``."""
    import importlib
    import json

    from memsearch.config import load_config
    from memsearch.train.config import GRPOConfig, SFTConfig

    extra = list(overrides or []) + ([f"adapter={json.dumps(str(adapter))}"] if adapter else [])
    cfg = load_config(config, extra, model={"sft": SFTConfig, "grpo": GRPOConfig}[kind])
    train = getattr(importlib.import_module(f"memsearch.train.{kind}"), f"train_{kind}")
    summary = train(cfg, out, resume=resume, echo=typer.echo)
    if "adapter" in summary:
        typer.echo(f"adapter: {summary['adapter']}")


@train_app.command("sft")
@_friendly
def train_sft_cmd(
    config: Annotated[Path, typer.Option("--config", help="TOML SFT config, e.g. configs/train/sft_cpu.toml.")],
    out: TrainOut,
    resume: TrainResume = False,
    adapter: Annotated[Optional[Path], typer.Option(help="Start from this LoRA adapter (weights only).")] = None,
    set_: Overrides = None,
) -> None:
    """LoRA SFT on completion tokens of `export-sft` data; checkpoints, periodic engine eval."""
    _train("sft", config, out, resume, adapter, set_)


@train_app.command("grpo")
@_friendly
def train_grpo_cmd(
    config: Annotated[Path, typer.Option("--config", help="TOML GRPO config, e.g. configs/train/grpo_cpu.toml.")],
    out: TrainOut,
    resume: TrainResume = False,
    adapter: Annotated[Optional[Path], typer.Option(help="Start from this LoRA adapter, e.g. an SFT run (weights only).")] = None,
    set_: Overrides = None,
) -> None:
    """Multi-turn GRPO through the episode engine (role memory, controller or overwrite)."""
    _train("grpo", config, out, resume, adapter, set_)


@pipeline_app.command("memagent")
@_friendly
def pipeline_memagent_cmd(
    config: Annotated[Path, typer.Option("--config", help="Pipeline config, e.g. configs/memagent.toml.")],
    out: Annotated[Path, typer.Option("--out", help="Pipeline folder: created, or continued (finished stages are skipped).")],
    set_: Overrides = None,
) -> None:
    """MemAgent: RULER-HQA sets, GRPO (overwrite role), merge, base vs trained at every N, report."""
    from memsearch.config import load_config
    from memsearch.pipelines.config import MemAgentPipeline
    from memsearch.pipelines.memagent.pipeline import run_memagent_pipeline

    run_memagent_pipeline(load_config(config, set_, model=MemAgentPipeline), out, echo=typer.echo)


@pipeline_app.command("memory-policy")
@_friendly
def pipeline_memory_policy_cmd(
    config: Annotated[Path, typer.Option("--config", help="Pipeline config, e.g. configs/memory_policy_cpu.toml.")],
    out: Annotated[Path, typer.Option("--out", help="Pipeline folder: created, or continued (finished stages are skipped).")],
    set_: Overrides = None,
) -> None:
    """Memory policy: teacher + SFT, GRPO stage 1, merge, optional stage 2 (controller), A-D on held-out dev, report."""
    from memsearch.config import load_config
    from memsearch.pipelines.memory_policy.pipeline import run_memory_policy_pipeline
    from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline

    run_memory_policy_pipeline(load_config(config, set_, model=MemoryPolicyPipeline), out, echo=typer.echo)


@app.command("merge-adapter")
@_friendly
def merge_adapter_cmd(
    model: Annotated[str, typer.Option(help="Base model: 'embedded' or a local Hugging Face folder.")],
    adapter: Annotated[Path, typer.Option(help="LoRA adapter folder (e.g. RUN/adapter).")],
    out: Annotated[Path, typer.Option(help="New folder for the merged Hugging Face checkpoint.")],
    dtype: Annotated[str, typer.Option(help="Saved weights dtype: float32, bfloat16, float16.")] = "float32",
) -> None:
    """Merge a LoRA adapter into its base: a plain checkpoint for the hf backend, transformers serve or vLLM."""
    from memsearch.train.merge import merge_adapter

    typer.echo(f"merged model: {merge_adapter(model, adapter, out, dtype)}")


@app.command("demo")
@_friendly
def demo(
    backend: Annotated[str, typer.Option(help="hf (the embedded model, CPU) or rules (seconds).")] = "hf",
    limit: Annotated[int, typer.Option(help="Number of dev questions (about 45 s each on a 2-core CPU).")] = 4,
    out: Annotated[Optional[Path], typer.Option(help="New output folder (default: a fresh runs/demo-* folder).")] = None,
    adapter: Annotated[Optional[Path], typer.Option(
        help="hf: the trained memory-policy adapter of the B-trained row (default: models/memory-policy-cpu, "
             "or MEMSEARCH_MEMORY_POLICY_ADAPTER); must match its fingerprint.json.")] = None,
) -> None:
    """The four-group matrix (A-D) on real HotpotQA questions with the embedded model, plus B-trained
    (group B with the shipped trained memory-policy adapter)."""
    from memsearch.pipelines.demo import run_demo

    run_demo(backend=backend, limit=limit, out=out, echo=typer.echo, adapter=adapter)


@app.command("walkthrough")
@_friendly
def walkthrough(
    out: Annotated[Optional[Path], typer.Option(help="New output folder (default: a fresh runs/walkthrough-* folder).")] = None,
) -> None:
    """The walk-through on the shipped samples: prepare, validate, index, search, long contexts."""
    from memsearch.pipelines.walkthrough import run_walkthrough

    run_walkthrough(out, echo=typer.echo)


def report_hint(run: Path, data: Path) -> str:
    """The command that writes (and names) the HTML report of a run or matrix folder."""
    from memsearch.pipelines.demo import report_command

    return report_command(run, data)


RunPaths = Annotated[list[Path], typer.Argument(help="A run folder or a matrix folder; a second run folder turns on compare mode.")]
ReportData = Annotated[Path, typer.Option("--data", help="The data folder the run(s) were made on (its fingerprint must match run.json).")]
TrainLogs = Annotated[Optional[list[Path]], typer.Option("--train-log", help="A train_log.jsonl (repeatable: several seeds form a band).")]


@report_app.command("view")
@_friendly
def report_view(
    runs: RunPaths,
    data: ReportData,
    out: Annotated[Path, typer.Option("--out", help="The HTML file to write.")],
    train_log: TrainLogs = None,
) -> None:
    """One self-contained HTML file: run header, task table, episodes, compare mode, training curves."""
    from memsearch.report.html import write_report

    if len(runs) > 2:
        raise ValueError(f"expected RUN [RUN_B], got {len(runs)} runs")
    path = write_report(runs, data, out, train_log)
    typer.echo(f"report: {path} ({path.stat().st_size / 1e6:.2f} MB); open it in a browser (file://{path.resolve()})")


@report_app.command("plots")
@_friendly
def report_plots(
    out: Annotated[Path, typer.Option("--out", help="Folder for the PNG files.")],
    runs: Annotated[Optional[list[Path]], typer.Argument(help="Run or matrix folders (optional).")] = None,
    data: Annotated[Optional[Path], typer.Option("--data", help="With runs: the data folder they were made on.")] = None,
    train_log: TrainLogs = None,
) -> None:
    """Static PNG plots (matplotlib) for docs/results: metrics with CIs per run, reward curves."""
    from memsearch.report.plots import write_plots

    if runs and data is None:
        raise ValueError("runs need --data, the data folder they were made on")
    for path in write_plots(runs or [], data, out, train_log):
        typer.echo(f"wrote {path}")


@verl_app.command("export-data")
@_friendly
def verl_export_data_cmd(
    data: DataDir,
    out: Annotated[Path, typer.Option("--out", help="The parquet file to write (data.train_files / val_files).")],
    role: Annotated[Optional[str], typer.Option(help="Record the trained role (memory, controller, overwrite); the "
                                                     "loop refuses a config that trains another.")] = None,
) -> None:
    """The parquet verl reads: the question as prompt, labels only in reward_model, no documents."""
    from memsearch.integrations.verl.data import export_parquet
    from memsearch.train.rows import TRAINED_CALL_ROLES

    if role is not None and role not in TRAINED_CALL_ROLES:
        raise ValueError(f"--role {role!r}: expected one of {', '.join(TRAINED_CALL_ROLES)}")
    typer.echo(f"wrote {out}: {export_parquet(data, out, role)} rows")


@verl_app.command("config")
@_friendly
def verl_config_cmd(
    config: Annotated[Path, typer.Option("--config", help="GRPO config (configs/train/*.toml) or a MemAgent pipeline config.")],
    train_files: Annotated[str, typer.Option("--train-files", help="The train parquet (export-data).")] = "train.parquet",
    val_files: Annotated[Optional[str], typer.Option("--val-files", help="The validation parquet.")] = None,
    data: Annotated[Optional[Path], typer.Option("--data", help="The prepared train folder the parquet came from.")] = None,
    agent_loops: Annotated[Path, typer.Option("--agent-loops", help="Write the agent-loop YAML here.")] = Path("agent_loops.yaml"),
    gpus: Annotated[int, typer.Option(help="GPUs per node.")] = 8,
    nodes: Annotated[int, typer.Option(help="Nodes.")] = 1,
    set_: Overrides = None,
) -> None:
    """verl Hydra overrides for a memsearch GRPO config (one per line); refuses options verl cannot run."""
    from memsearch.integrations.verl.config import agent_loop_yaml, load_grpo_config, verl_overrides

    cfg = load_grpo_config(config, set_, str(data) if data else None)
    overrides, notes = verl_overrides(cfg, str(agent_loops.resolve()), train_files, val_files, gpus, nodes)
    # Ray workers may start elsewhere: the YAML names the config and data by absolute path.
    agent_loops.parent.mkdir(parents=True, exist_ok=True)
    agent_loops.write_text(agent_loop_yaml(str(config.resolve()), str(Path(cfg.data).resolve()), set_), encoding="utf-8")
    for note in notes:
        typer.echo(f"# differs from memsearch's trainer: {note}", err=True)
    typer.echo("\n".join(overrides))


def main() -> None:  # pragma: no cover - console entry for `python -m memsearch`
    app(prog_name="memsearch")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

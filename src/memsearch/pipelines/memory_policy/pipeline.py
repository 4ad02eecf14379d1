"""``memsearch pipeline memory-policy``: the memory-policy track end to end, resumable stage by stage.

    memsearch pipeline memory-policy --config configs/memory_policy_cpu.toml --out runs/mp

Stages and folders under ``OUT`` (each stage's fingerprinted record is ``<folder>.stage.json``
beside its folder; ``pipeline.stages`` explains skip / resume / refuse):

1. ``prepare/{train,dev,val}``: HotpotQA train, the held-out dev questions (``data.dev_questions``,
   the first N of the dev file) and, with ``data.val_questions``, the validation split GRPO's
   periodic evaluation reads (the next N); any question shared by two of them is refused;
2. ``teacher/``: an eval run of ``[teacher]`` (the oracle by default) as memory backend on train,
   then ``teacher/sft.jsonl`` (``export-sft --role memory``);
3. per seed, ``seed-N/sft/``: LoRA SFT on the teacher rows;
4. ``seed-N/grpo1/``: GRPO stage 1 (memory role) from the SFT adapter, or from the base model
   with ``grpo_start = "base"`` (a cold start: stages 2 and 3 are skipped);
5. ``seed-N/merged1/``: stage 1 merged into the base (a plain Hugging Face folder);
6. ``seed-N/grpo2/`` + ``seed-N/merged2/`` (``stage2.enabled``): GRPO of the controller with the
   merged stage-1 model frozen as memory backend, in process or over HTTP (``stage2.memory_serving``:
   ``transformers serve`` launched on ``merged1`` for the stage, or a server the user runs;
   ``memory_policy.serving``; with ``stage1_serving = "http"`` one server per seed answers the held-out grpo
   row, stage 2 and B/D). With ``stage2.start = "sft"`` it starts from ``seed-N/sft2/``, LoRA SFT
   of the controller on ``teacher2/sft.jsonl`` (a train run with ``stage2.teacher`` as the policy
   controller, ``export-sft --role controller``);
7. ``seed-N/matrix/{A,B,C,D}``: the A-D matrix on the held-out dev questions; A/C summarize with
   the untrained base (``backends.baseline_memory``), B/D with stage 1, C/D with the stage-2
   controller (the base controller when stage 2 is off);
8. ``report.md`` / ``report.json`` / ``curves.png`` (``pipeline.mp_report``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from memsearch.config import config_json
from memsearch.errors import IncompleteResult, InputError
from memsearch.io import sha256_file
from memsearch.pipelines.bookkeeping import record_invocation, source_sha256
from memsearch.pipelines.eval_stage import eval_run
from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline
from memsearch.pipelines.merge_stage import merge_stage
from memsearch.pipelines.stage_record import Stage, folder_sha256, run_folder
from memsearch.pipelines.trainer_stages import grpo_stage, sft_stage
from memsearch.pipelines.unfinished import leave_open, raise_if_unfinished
from memsearch.records.run_summary import RunSummary
from memsearch.records.train_step import read_train_log

# ``serve_stage1(seed, merged1)``: a context manager that serves a seed's stage-1 folder and yields
# (API root, served name) while the held-out grpo row, stage 2 and the matrix run against it.
# (seed, merged stage-1 folder, stage-1 adapter folder) -> (API root, served name) while it serves.
Stage1Server = Callable[[int, Path, Path], AbstractContextManager[tuple[str, str]]]


PREPARED_FILES = ("corpus.jsonl", "tasks.jsonl", "labels.jsonl", "manifest.json")


def prepare_stage(cfg: MemoryPolicyPipeline, out: Path, echo=print) -> dict[str, Any]:
    """Prepared train and held-out dev folders; refuses a question shared by both, and more
    questions asked (``data.train_questions``, ``dev_questions``, ``val_questions``) than the
    files hold, before anything is written (``_check_counts``).

    The finished stage records the SHA-256 of every prepared file, and a re-run checks them
    before anything else runs (``_check_prepared``; a record of before, without them: each file's
    presence). A missing or changed file is refused, not rebuilt, though the prepare is a pure
    function of its fingerprinted inputs: the stages after it (the teacher run, the matrices)
    were made from those files and are skipped when done, so a rebuild would hide that something
    changed the run folder and overwrite whatever was edited there on purpose. The message says
    how to rebuild (delete ``prepare/`` and ``prepare.stage.json``; the same command then writes
    the same bytes again)."""
    from memsearch.data.dataset import save_dataset
    from memsearch.data.validate import validate_data

    folder = out / "prepare"
    stage = Stage(
        folder,
        "prepare",
        {
            "data": config_json(cfg.data),
            "train_sha256": source_sha256(cfg.data.train),
            "dev_sha256": source_sha256(cfg.data.dev),
        },
        out / "prepare.stage.json",
    )
    paths = {"train": folder / "train", "dev": folder / "dev", "val": folder / "val"}
    if stage.done():
        _check_prepared(stage, paths, ["train", "dev", *(["val"] if cfg.data.val_questions else [])])
        echo(f"prepare: done ({folder})")
    else:
        splits = _splits(cfg, paths)
        _check_counts(cfg, splits)
        # The leak check runs before anything is written: a refused config must leave no record or
        # folder behind, which would refuse the corrected config as "made from different inputs".
        leaks = _shared_questions(splits, {"train": cfg.data.train, "dev": cfg.data.dev, "val": cfg.data.dev})
        if leaks:
            raise InputError("\n".join(leaks[:20]) + f"\n{len(leaks)} problem(s) between train and dev: the "
                             "held-out questions must never be trained on")
        stage.start()
        # save_dataset writes each folder atomically: after a crash the finished one is kept.
        for name, dataset in splits.items():
            if not paths[name].exists():
                save_dataset(dataset, paths[name])
        problems = validate_data(paths["train"], paths["dev"])
        if cfg.data.val_questions:
            problems += validate_data(paths["train"], paths["val"])
        if problems:
            raise InputError(
                "\n".join(str(p) for p in problems[:20]) + f"\n{len(problems)} problem(s) between train and "
                "dev: the held-out questions must never be trained on"
            )
        stage.finish({"train_dev_overlap": 0, "sha256": {
            name: {file: sha256_file(paths[name] / file) for file in PREPARED_FILES} for name in splits}})
    return {**paths, "fingerprint": stage.fingerprint}


def _check_counts(cfg: MemoryPolicyPipeline, splits: dict[str, Any]) -> None:
    """``InputError`` when a split holds fewer questions than its setting asks (the converter
    stops at the file's end, which cut the split short without a word): the setting, the number
    asked and the number the file holds (for the validation split, what is left after the
    held-out questions)."""
    data, problems = cfg.data, []
    held = len(splits["train"].tasks)
    if data.train_questions is not None and held < data.train_questions:
        problems.append(f"data.train_questions = {data.train_questions}: {data.train} holds {held} questions; set "
                        f"data.train_questions to at most {held} (or leave it unset: all of them)")
    dev = len(splits["dev"].tasks)
    val = len(splits["val"].tasks) if "val" in splits else 0
    if dev < data.dev_questions:
        also = (f" (and data.val_questions = {data.val_questions} asks for that many more after them)"
                if data.val_questions else "")
        problems.append(f"data.dev_questions = {data.dev_questions}: {data.dev} holds {dev} questions{also}; set "
                        f"data.dev_questions to at most {dev} (the held-out questions are the first N of data.dev)")
    elif data.val_questions and val < data.val_questions:
        problems.append(f"data.val_questions = {data.val_questions}: {data.dev} holds {dev + val} questions, {val} "
                        f"after the {dev} held-out ones (data.dev_questions); set data.val_questions to at most "
                        f"{val}, or data.dev_questions lower")
    if problems:
        raise InputError("\n".join(problems))


def _check_prepared(stage: Stage, paths: dict[str, Path], names: list[str]) -> None:
    """Refuse a finished prepare whose files (of the splits ``names``) are missing or changed since
    it recorded them (a record without hashes, from before: missing ones only), naming each file."""
    recorded = (stage.record().get("outputs") or {}).get("sha256")
    names = list(recorded) if recorded else names
    problems = []
    for name in names:
        for file in PREPARED_FILES:
            path = paths[name] / file
            if not path.is_file():
                problems.append(f"{path}: missing")
            elif recorded is not None and (got := sha256_file(path)) != recorded[name][file]:
                problems.append(f"{path}: SHA-256 {got}, recorded {recorded[name][file]}: changed")
    if problems:
        raise InputError("\n".join(problems) + f"\nprepare: {len(problems)} prepared file(s) missing or changed since "
                         f"the stage finished; the later stages were made from them. Delete {stage.folder} and "
                         f"{stage.record_path}, then run the same command: it prepares them again (the same inputs "
                         "give the same bytes)")


def validation_split(cfg: MemoryPolicyPipeline):
    """The ``data.val_questions`` dev questions that follow the held-out ones (file order), with
    the documents of the whole converted slice (a superset of what their tasks use)."""
    from memsearch.data.dataset import Dataset

    n = cfg.data.dev_questions
    full = cfg.data.convert(cfg.data.dev, "dev", n + cfg.data.val_questions)
    manifest = {**full.manifest, "options": {"offset": n, "limit": cfg.data.val_questions}}
    return Dataset(full.documents, full.tasks[n:], full.labels[n:], manifest)


def _splits(cfg: MemoryPolicyPipeline, paths: dict[str, Path]) -> dict[str, Any]:
    """Each split's dataset: read back when its folder was saved (a resumed prepare), else
    converted in memory and not yet written."""
    from memsearch.data.dataset import load_dataset

    build = {"train": lambda: cfg.data.convert(cfg.data.train, "train", cfg.data.train_questions),
             "dev": lambda: cfg.data.convert(cfg.data.dev, "dev", cfg.data.dev_questions)}
    if cfg.data.val_questions:
        build["val"] = lambda: validation_split(cfg)
    return {name: load_dataset(paths[name]) if paths[name].exists() else make() for name, make in build.items()}


def _shared_questions(splits: dict[str, Any], sources: dict[str, str]) -> list[str]:
    """A line per question (same id, or the same question text up to case and punctuation) that
    two of the splits share, naming both splits and their source files."""
    from memsearch.data.validate import normalize_question

    names, lines = list(splits), []
    for i, first in enumerate(names):
        for other in names[i + 1:]:
            ids = {t.id for t in splits[other].tasks}
            questions = {normalize_question(t.question) for t in splits[other].tasks}
            lines += [f"question {t.id} of {first} ({sources[first]}) is also in {other} ({sources[other]})"
                      for t in splits[first].tasks if t.id in ids or normalize_question(t.question) in questions]
    return lines


def teacher_stage(cfg: MemoryPolicyPipeline, out: Path, paths: dict[str, Any], echo=print) -> tuple[Path, str]:
    """Teacher trajectories on train and their memory-role SFT rows; returns (rows file, fingerprint)."""
    folder = out / "teacher"
    rows, rows_fp = _teacher_rows(out, folder, cfg.teacher_config(), "memory", paths, echo)
    if cfg.teacher_rows.other_noop_share is None:
        return rows, rows_fp
    return select_stage(cfg, folder, rows, rows_fp, paths, echo)


def controller_teacher_stage(
    cfg: MemoryPolicyPipeline, out: Path, paths: dict[str, Any], echo=print
) -> tuple[Path, str]:
    """``teacher2``: teacher trajectories on train with the policy controller (``stage2.start =
    'sft'``) and their controller-role SFT rows, every one (a controller row is one short
    decision); returns (rows file, fingerprint)."""
    return _teacher_rows(out, out / "teacher2", cfg.controller_teacher_config(), "controller", paths, echo)


def _teacher_rows(out: Path, folder: Path, run_config, role: str, paths: dict[str, Any], echo) -> tuple[Path, str]:
    """A teacher run on train into ``folder/run`` and its ``role`` SFT rows (``folder/sft.jsonl``)."""
    from memsearch.train.sft.export import export_sft

    run = folder / "run"
    summary = eval_run(
        run, folder / "run.stage.json", run_config, paths["train"], {"prepare": paths["fingerprint"]}, echo
    )
    if not summary.complete:
        raise IncompleteResult(f"{run}: the teacher run has failed or missing tasks ({summary.note}); not "
                               "training on it\nrun the same command again: it retries only those tasks")
    if not summary.usable_for_comparison:
        raise InputError(f"{run}: the teacher run had request errors or calls cut by the server's context "
                         f"({summary.note}); not training on it")
    rows = folder / "sft.jsonl"
    stage = Stage(
        folder / "export",
        "export-sft",
        {"trajectories_sha256": sha256_file(run / "trajectories.jsonl")},
        folder / "export.stage.json",
    )
    if not stage.done():
        stage.start()
        rows.unlink(missing_ok=True)  # a crash mid-export leaves a partial file; export_sft wants a new one
        report = export_sft(run / "trajectories.jsonl", run / "metrics.jsonl", role, rows)
        stage.finish({"rows": str(rows.relative_to(out)), "rows_sha256": sha256_file(rows), "report": report.lines()})
        echo("\n".join(report.lines()))
    elif sha256_file(rows) != stage.record()["outputs"]["rows_sha256"]:
        raise InputError(
            f"{rows}: changed since export; delete {folder / 'export'} and {folder / 'export.stage.json'} to redo it"
        )
    return rows, stage.fingerprint


def select_stage(
    cfg: MemoryPolicyPipeline, folder: Path, rows: Path, rows_fp: str, paths: dict[str, Any], echo=print
) -> tuple[Path, str]:
    """``teacher/selected.jsonl``: the rows SFT trains on (``train.sft.row_selection``)."""
    from memsearch.data.dataset import load_dataset
    from memsearch.train.sft.row_selection import describe, select_memory_rows

    selected = folder / "selected.jsonl"
    stage = Stage(
        folder / "select",
        "select-rows",
        {"rows": rows_fp, **config_json(cfg.teacher_rows)},
        folder / "select.stage.json",
    )
    if not stage.done():
        stage.start()
        selected.unlink(missing_ok=True)
        report = select_memory_rows(
            rows,
            load_dataset(paths["train"]).labels_by_id(),
            selected,
            cfg.teacher_rows.other_noop_share,
            cfg.teacher_rows.seed,
        )
        stage.finish(
            {"rows": str(selected.relative_to(folder.parent)), "rows_sha256": sha256_file(selected), "report": report}
        )
        echo(describe(report))
    elif sha256_file(selected) != stage.record()["outputs"]["rows_sha256"]:
        raise InputError(
            f"{selected}: changed since selection; delete it and {folder / 'select.stage.json'} to redo it"
        )
    return selected, stage.fingerprint


def train_stage1(
    cfg: MemoryPolicyPipeline,
    out: Path,
    seed: int,
    paths: dict[str, Any],
    rows: Path | None,
    rows_fp: str | None,
    echo=print,
) -> tuple[Path | None, Path, dict[str, Any]]:
    """One seed's SFT (unless ``grpo_start = 'base'``) and GRPO stage 1; returns (SFT adapter or
    None, stage-1 adapter, the start's fingerprint for the stages downstream)."""
    root = out / f"seed-{seed}"
    val = str(paths["val"]) if cfg.data.val_questions else None
    if cfg.grpo_start == "sft":
        sft = sft_stage(
            root / "sft", root / "sft.stage.json", cfg.sft_config([str(rows)], seed), {"rows": rows_fp}, echo
        )
        start = {"sft_sha256": folder_sha256(sft)}
    else:  # cold start: stage 1 from the base model, no SFT (grpo_start = "base")
        sft, start = None, {"start": "base"}
        echo(f"seed {seed} sft: skipped (grpo_start = 'base': GRPO stage 1 starts from the base model)")
    stage1 = grpo_stage(
        root / "grpo1",
        root / "grpo1.stage.json",
        cfg.grpo_config(str(paths["train"]), seed, str(sft) if sft else None, val),
        {"prepare": paths["fingerprint"], **start},
        echo,
        on_collapse=cfg.on_collapse,
    )
    return sft, stage1, start


def seed_stages(
    cfg: MemoryPolicyPipeline,
    out: Path,
    seed: int,
    paths: dict[str, Any],
    trained: tuple[Path | None, Path, dict[str, Any]],
    echo=print,
    controller_rows: tuple[Path, str] | None = None,
    serve_stage1: Stage1Server | None = None,
) -> dict[str, Any]:
    """What follows one seed's stage 1 (``trained``: what ``train_stage1`` returned for it): merge,
    held-out rows, optional stage 2 (from the controller's SFT on ``controller_rows`` when
    ``stage2.start = 'sft'``) and the matrix, under ``OUT/seed-N``. With ``stage1_serving =
    'http'`` the last three run against the seed's stage-1 server (``stage1_server``)."""
    root = out / f"seed-{seed}"
    merged1, fp1 = merge_stage(root / "merged1", root / "merged1.stage.json", cfg.model, trained[1],
                               cfg.merge_dtype, echo)
    with stage1_server(cfg, root, seed, merged1, serve_stage1, echo, adapter1=trained[1]) as served:
        return _after_merge(cfg, root, seed, paths, echo, trained=trained, merged=(merged1, fp1),
                            controller_rows=controller_rows, served=served)


@contextmanager
def stage1_server(cfg: MemoryPolicyPipeline, root: Path, seed: int, merged1: Path,
                  serve_stage1: Stage1Server | None = None, echo=print,
                  adapter1: Path | None = None) -> Iterator[tuple[str, str] | None]:
    """The seed's stage-1 server while the stages after the merge run (``stage1_serving =
    'http'``): ``serve_stage1``'s when given (``memsearch experiment run`` deploys its own, the
    merged folder or the adapter ``adapter1`` on a server that serves adapters), else
    the user's (``stage2.memory_url``, checked to list ``memory_model``), else ``transformers serve``
    launched on ``stage2.serve_port``; yields (API root, served name), or None in process."""
    from memsearch.pipelines.memory_policy import serving

    s2 = cfg.stage2
    if cfg.stage1_serving == "in_process":
        yield None
    elif serve_stage1 is not None:
        with serve_stage1(seed, merged1, adapter1 or merged1) as served:
            yield served
    elif s2.memory_url:
        with serving.user_server(s2.memory_url, s2.memory_model) as url:
            yield url, s2.memory_model
    else:
        gpus = cfg.devices.visible("stage1") if "stage1" in cfg.devices.services else None
        with serving.launched_server(merged1, s2.serve_port, root / "stage1_server.log", s2.serve_start_timeout_s,
                                     s2.serve_args, echo, gpus) as url:
            yield url, str(merged1)


def _after_merge(cfg: MemoryPolicyPipeline, root: Path, seed: int, paths: dict[str, Any], echo, *,
                 trained: tuple[Path | None, Path, dict[str, Any]], merged: tuple[Path, str],
                 controller_rows: tuple[Path, str] | None, served: tuple[str, str] | None) -> dict[str, Any]:
    """The stages of one seed after its stage-1 merge (``seed_stages``): ``trained`` is what
    ``train_stage1`` returned, ``merged`` the merged folder and its fingerprint."""
    from memsearch.pipelines.memory_policy import heldout

    train = str(paths["train"])
    val = str(paths["val"]) if cfg.data.val_questions else None
    sft, _, start = trained
    merged1, fp1 = merged
    heldout_rows = heldout.run_seed(cfg, root, paths, sft, merged1, {**start, "stage1": fp1}, echo, served)
    controller, fp2, sft2 = None, None, None
    if cfg.stage2.enabled:
        upstream2 = {"prepare": paths["fingerprint"], "stage1": fp1}
        if controller_rows is not None:
            sft2 = sft_stage(
                root / "sft2",
                root / "sft2.stage.json",
                cfg.stage2_sft_config([str(controller_rows[0])], seed),
                {"rows": controller_rows[1]},
                echo,
            )
            upstream2["sft2_sha256"] = folder_sha256(sft2)
        stage2 = stage2_stage(cfg, root, train, seed, merged1, val, upstream2, echo, adapter=sft2, served=served)
        merged2, fp2 = merge_stage(
            root / "merged2", root / "merged2.stage.json", cfg.model, stage2, cfg.merge_dtype, echo
        )
        controller = str(merged2)
    base = {
        "seed": seed,
        "root": root,
        "heldout": heldout_rows,
        "stage2": cfg.stage2.enabled,
        "logs": {
            **({"sft": root / "sft" / "train_log.jsonl"} if sft else {}),
            "grpo1": root / "grpo1" / "train_log.jsonl",
            **({"sft2": root / "sft2" / "train_log.jsonl"} if sft2 else {}),
            **({"grpo2": root / "grpo2" / "train_log.jsonl"} if cfg.stage2.enabled else {}),
        },
    }
    if cfg.matrix_seeds is not None and seed not in cfg.matrix_seeds:
        return {**base, "matrix": None}
    matrix_cfg = cfg.matrix_config(str(merged1), controller, served)
    matrix = matrix_stage(root / "matrix", root / "matrix.stage.json", matrix_cfg, paths,
                          {"stage1": fp1, "stage2": fp2}, f"seed {seed} matrix", echo)
    return {**base, "matrix": matrix}


def matrix_stage(folder: Path, record: Path, matrix_cfg, paths: dict[str, Any], upstream: dict[str, Any],
                 label: str, echo=print) -> dict[str, Any]:
    """A fingerprinted A-D matrix (``matrix_cfg``) on the held-out dev questions into ``folder``
    (resumed after a crash); returns its ``matrix.json``. A group with failed or missing tasks
    leaves the stage unfinished: the next run resumes it (``pipelines.eval_stage.eval_run``)."""
    from memsearch.eval.matrix import run_matrix

    stage = Stage(
        folder,
        "matrix",
        {"run_config": config_json(matrix_cfg), "prepare": paths["fingerprint"], **upstream},
        record,
    )
    if stage.done():
        echo(f"{label}: done")
        return json.loads((folder / "matrix.json").read_text())
    resume = stage.started() and folder.exists()
    stage.start()
    echo(f"{label}: {'resuming' if resume else 'running'} A-D on {paths['dev']}")
    matrix = run_matrix(matrix_cfg, paths["dev"], folder, resume=resume, show_progress=False)
    incomplete = {g: s for g, s in matrix["groups"].items() if not s["complete"]}
    if incomplete:
        leave_open(stage)
        echo(f"{label}: INCOMPLETE, group(s) {', '.join(incomplete)} have failed or missing tasks; the same command "
             "retries them")
    else:
        stage.finish({"matrix": f"{folder.name}/matrix.json"})
    return matrix


def _launched_port(cfg: MemoryPolicyPipeline) -> int:
    """The launched memory server's port: ``stage2.serve_port``, else a free one (where it answers
    is no input of the stage: a resume may use another, ``config.backend.ADDRESS_KEYS``)."""
    from memsearch.pipelines.memory_policy.serving import free_port

    return cfg.stage2.serve_port if cfg.stage2.serve_port is not None else free_port()


def stage2_stage(
    cfg: MemoryPolicyPipeline,
    root: Path,
    train: str,
    seed: int,
    merged1: Path,
    val: str | None,
    upstream: dict[str, Any],
    echo=print,
    adapter: Path | None = None,
    served: tuple[str, str] | None = None,
) -> Path:
    """``seed-N/grpo2``: GRPO of the controller (from ``adapter``, the controller's SFT adapter, or
    a fresh LoRA) with ``merged1`` frozen as memory backend, in process or over HTTP
    (``stage2.memory_serving``). Over HTTP the stage record also names the server
    (``inputs.memory_server``: how it was served and its model name; its URL is no input); the server is started
    (launched) or checked (user-run) only while the stage trains, unless the seed's stage-1 server
    (``served``: API root, served name; ``stage1_serving = 'http'``) already answers."""
    from functools import partial

    from memsearch.pipelines.memory_policy import serving

    record = root / "grpo2.stage.json"
    s2 = cfg.stage2
    start = str(adapter) if adapter is not None else None
    if served:
        grpo = cfg.stage2_config(train, seed, str(merged1), val, adapter=start, served=served)
        server = {"serving": "stage1_serving", "base_url": served[0], "model": served[1]}
        return grpo_stage(root / "grpo2", record, grpo, {**upstream, "memory_server": server}, echo,
                          on_collapse=cfg.on_collapse)
    if s2.memory_serving == "in_process":
        return grpo_stage(
            root / "grpo2", record, cfg.stage2_config(train, seed, str(merged1), val, adapter=start), upstream, echo,
            on_collapse=cfg.on_collapse,
        )
    if s2.memory_url:
        around = partial(serving.user_server, s2.memory_url, s2.memory_model)
        server = {"serving": "user", "base_url": s2.memory_url, "model": s2.memory_model}
        grpo = cfg.stage2_config(train, seed, str(merged1), val, adapter=start)
    else:
        port = _launched_port(cfg)
        url = f"http://127.0.0.1:{port}/v1"
        around = partial(
            serving.launched_server,
            merged1,
            port,
            root / "grpo2.memory_server.log",
            s2.serve_start_timeout_s,
            s2.serve_args,
            echo,
            cfg.devices.visible("stage1") if "stage1" in cfg.devices.services else None,
        )
        server = {"serving": "transformers serve", "base_url": url, "model": str(merged1), "args": s2.serve_args}
        grpo = cfg.stage2_config(train, seed, str(merged1), val, launched_url=url, adapter=start)
    return grpo_stage(root / "grpo2", record, grpo, {**upstream, "memory_server": server}, echo, around,
                      on_collapse=cfg.on_collapse)


def run_validation_only(cfg: MemoryPolicyPipeline, out: str | Path, echo=print) -> dict[str, Any]:
    """A pilot that never reads a held-out number: prepare, the teacher, and each seed's SFT and GRPO
    stage 1 (periodic evaluation on the validation split only). No held-out row, merge, matrix or
    report is run, so a recipe can be chosen on validation and pre-registered before any held-out
    figure of it exists; the same ``OUT`` later continues into the full pipeline, skipping these
    stages when the recipe is unchanged. Returns, per seed, the stage-1 validation evaluations."""
    if not cfg.data.val_questions or not cfg.grpo.eval.every:
        raise InputError(
            "a validation-only run reads GRPO's periodic evaluation: set data.val_questions > 0 and grpo.eval.every"
        )
    out = record_invocation(out, cfg)
    with run_folder(out):
        paths = prepare_stage(cfg, out, echo)
        rows, rows_fp = teacher_stage(cfg, out, paths, echo) if cfg.grpo_start == "sft" else (None, None)
        evals = {}
        for seed in cfg.seeds:
            _, adapter, _ = train_stage1(cfg, out, seed, paths, rows, rows_fp, echo)
            stage1 = adapter.parent  # the run folder: train_log.jsonl and eval/ beside the adapter
            log = stage1 / "train_log.jsonl"
            steps = read_train_log(log) if log.exists() else []
            evals[seed] = [step.evaluation_json() for step in steps if step.evaluated]
            for r in evals[seed]:
                summary = stage1 / "eval" / f"step-{r['step']:06d}" / "summary.json"
                if summary.exists():  # the op counts of the validation rows (collapse shows here first)
                    r["memory_ops"] = dict(RunSummary.read(summary).memory_ops)
                echo(f"seed {seed} grpo1 validation at step {r['step']}: "
                     + " ".join(f"{k[5:]}={'n/a' if v is None else f'{v:.4f}'}"  # None: no memory kept
                                for k, v in sorted(r.items()) if k.startswith("eval_") and k != "eval_ops")
                     + f" ops={r.get('memory_ops', {})}")
    echo("validation only: no held-out row was run (drop --validation-only to continue into the full pipeline)")
    return evals


def run_memory_policy_pipeline(cfg: MemoryPolicyPipeline, out: str | Path, echo=print) -> dict[str, Any]:
    """Run every stage of every seed (skipping finished ones); returns the report (also ``OUT/report.json``)."""
    out = record_invocation(out, cfg)
    with run_folder(out):
        paths = prepare_stage(cfg, out, echo)
        shared, seeds = run_stages(cfg, out, paths, echo)
    report = write_report(cfg, out, shared, seeds, echo)
    raise_if_unfinished(out)
    return report


def run_stages(cfg: MemoryPolicyPipeline, out: Path, paths: dict[str, Any], echo=print,
               serve_stage1: Stage1Server | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every stage after ``prepare`` (``paths``: what it returned), inside ``run_folder(out)``:
    teacher, shared held-out rows, each seed's training, merge, held-out rows, stage 2 and
    matrix (``serve_stage1``: see ``seed_stages``); returns (shared held-out rows, per-seed results)."""
    from memsearch.pipelines.memory_policy import heldout

    # A cold start (grpo_start = "base") trains no SFT, so it needs no teacher rows either.
    rows, rows_fp = teacher_stage(cfg, out, paths, echo) if cfg.grpo_start == "sft" else (None, None)
    shared = heldout.run_shared(cfg, out, paths, echo)
    controller_rows = controller_teacher_stage(cfg, out, paths, echo) if cfg.stage2.start == "sft" else None
    seeds = []
    for seed in cfg.seeds:
        trained = train_stage1(cfg, out, seed, paths, rows, rows_fp, echo)
        seeds.append(seed_stages(cfg, out, seed, paths, trained, echo, controller_rows, serve_stage1))
    return shared, seeds


def write_report(cfg: MemoryPolicyPipeline, out: Path, shared: dict[str, Any], seeds: list[dict[str, Any]],
                 echo=print) -> dict[str, Any]:
    """The held-out comparison (``heldout/summary.json``) and ``report.md`` / ``report.json``."""
    from memsearch.pipelines.memory_policy import heldout
    from memsearch.pipelines.memory_policy.report import write_mp_report

    comparison = heldout.compare(cfg, shared, {s["seed"]: s["heldout"] for s in seeds})
    heldout.write_summary(out, comparison)
    report = write_mp_report(cfg, out, seeds, comparison)
    echo(report["table"])
    echo(f"report: {out / 'report.md'}")
    return report

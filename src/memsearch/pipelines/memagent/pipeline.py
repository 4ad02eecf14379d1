"""``memsearch pipeline memagent``: the MemAgent track end to end, resumable stage by stage.

    memsearch pipeline memagent --config configs/memagent.toml --out runs/memagent

Stages and folders under ``OUT`` (see ``stages`` for the fingerprinted records):

Each stage's record is ``OUT/<stage>.stage.json`` (``eval/<checkpoint>/docs{N}.stage.json``).

1. ``prepare/``: ``dev/`` (HotpotQA dev), ``ruler/docs{N}`` (RULER-HQA-style sets, one per N),
   ``train/`` (HotpotQA train; ``train-long/docs{M}`` when ``data.train_docs`` is set);
2. ``train/``: GRPO with ``role = "memagent"`` (every memory update and the final answer are
   trained with one trajectory reward); a re-run resumes from the newest checkpoint;
3. ``rewards.md`` + ``reward_curve.png``: the per-step reward summary of the training log;
4. ``merged/``: the final adapter merged into the base (a plain Hugging Face checkpoint);
5. ``eval/{base,trained}/docs{N}/``: ``run_eval`` of each model on each set, the *same* run
   config but for the model folder (``MemAgentPipeline.eval_config``); a re-run resumes;
   ``eval/{base,trained}/hotpotqa/``: the same on plain HotpotQA dev (each question's own
   paragraphs, the first ``data.questions`` of ``prepare/dev``), scored by boxed exact match;
6. ``report.md`` / ``report.json``: base vs trained on every set (sub_em, em, f1, boxed_em,
   truncation, request errors, usable or not), each difference with a paired bootstrap CI, and
   a verdict per acceptance criterion (``pipeline.report``).

A stage whose record matches its inputs is skipped; one made from other inputs is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memsearch.config import config_json
from memsearch.errors import InputError
from memsearch.pipelines.bookkeeping import record_invocation, source_sha256
from memsearch.pipelines.eval_stage import eval_run
from memsearch.pipelines.memagent.config import MemAgentPipeline
from memsearch.pipelines.memagent.report import HOTPOT_SET
from memsearch.pipelines.merge_stage import merge_stage as merge_stages
from memsearch.pipelines.stage_record import Stage, run_folder
from memsearch.pipelines.trainer_stages import grpo_stage
from memsearch.pipelines.unfinished import raise_if_unfinished

CHECKPOINTS = ("base", "trained")


def prepare_stage(cfg: MemAgentPipeline, out: Path, echo=print) -> dict[str, Any]:
    """Prepared dev, RULER-style dev sets at every N, and the train set. Returns folder paths."""
    from memsearch.data.dataset import load_dataset, save_dataset
    from memsearch.data.ruler import BUILDER_VERSION, prepare_ruler
    from memsearch.data.validate import validate_data
    from memsearch.tokenizer import load_tokenizer

    folder = out / "prepare"
    tokenizer = load_tokenizer(cfg.episode.tokenizer)
    inputs = {"data": config_json(cfg.data), "dev_sha256": source_sha256(cfg.data.dev),
              "train_sha256": source_sha256(cfg.data.train), "builder": BUILDER_VERSION, "tokenizer": tokenizer.name}
    stage = Stage(folder, "prepare", inputs, out / "prepare.stage.json")
    paths = {"dev": folder / "dev", "train": folder / "train",
             "sets": {n: folder / "ruler" / f"docs{n}" for n in cfg.data.docs}}
    train_long = folder / "train-long" / f"docs{cfg.data.train_docs}" if cfg.data.train_docs else None
    if stage.done():
        echo(f"prepare: done ({folder})")
    else:
        stage.start()
        # Each folder below is written atomically, so after a crash the finished ones are kept.
        if not paths["dev"].exists():
            save_dataset(cfg.data.convert(cfg.data.dev, "dev"), paths["dev"])
        if not (folder / "ruler").exists():
            prepare_ruler(paths["dev"], folder / "ruler", cfg.data.docs, seed=cfg.data.seed, limit=cfg.data.questions,
                          tokenizer=tokenizer)
        if not paths["train"].exists():
            save_dataset(cfg.data.convert(cfg.data.train, "train", cfg.data.train_questions), paths["train"])
        if train_long is not None and not train_long.parent.exists():
            prepare_ruler(
                paths["train"],
                train_long.parent,
                [cfg.data.train_docs],
                seed=cfg.data.seed,
                tokenizer=tokenizer,
                allow_train=True,
            )
        # Train must share no question with dev (the evaluation sets are built from dev).
        problems = validate_data(paths["train"], paths["dev"])
        if problems:
            raise InputError(
                "\n".join(str(p) for p in problems[:20]) + f"\n{len(problems)} problem(s) between train and dev"
            )
        stage.finish(
            {"sets": {str(n): str(p.relative_to(folder)) for n, p in paths["sets"].items()}, "train_dev_overlap": 0}
        )
        for p in paths["sets"].values():
            built = load_dataset(p)
            echo(
                f"prepare: {p}: {len(built.tasks)} questions, context tokens mean "
                f"{(built.manifest.get('context_tokens') or {}).get('mean')}"
            )
    paths["train_data"] = train_long or paths["train"]
    paths["fingerprint"] = stage.fingerprint
    return paths


def train_stage(cfg: MemAgentPipeline, out: Path, train_data: Path, upstream: str, echo=print) -> Path:
    """GRPO (role memagent) into ``OUT/train``; returns the final adapter folder."""
    return grpo_stage(
        out / "train", out / "train.stage.json", cfg.grpo_config(str(train_data)), {"prepare": upstream}, echo
    )


def reward_summary(train_dir: Path, out: Path) -> dict[str, Any]:
    """``rewards.md`` (one row per step) and ``reward_curve.png`` from the training log."""
    from memsearch.records.train_step import read_train_log
    from memsearch.train.plot import plot_rewards

    steps = [step for step in read_train_log(train_dir / "train_log.jsonl") if step.trained]
    cols = (
        "step",
        "reward_mean",
        "reward_std",
        "zero_variance_groups",
        "rows_consumed",
        "rows_per_trajectory",
        "invalid_rate",
        "kl",
        "grad_norm",
        "step_s",
    )
    lines = [
        "# Training reward per step",
        "",
        f"From `{train_dir.name}/train_log.jsonl`: the reward of each rollout is "
        "the trajectory reward (train.reward.metric), identical for all of its rows.",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for step in steps:
        lines.append("| " + " | ".join(_fmt(getattr(step, c)) for c in cols) + " |")
    (out / "rewards.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if steps:
        plot_rewards(train_dir / "train_log.jsonl", out / "reward_curve.png", title="MemAgent GRPO reward")
    return {
        "steps": len(steps),
        "first": steps[0].reward_mean if steps else None,
        "last": steps[-1].reward_mean if steps else None,
        "curve": [round(step.reward_mean, 4) for step in steps],
        # steps where every group had one reward for all its rollouts: advantage 0, no policy gradient
        "no_signal_steps": sum(1 for step in steps if step.zero_variance_groups == step.groups),
        "grad_norm_max": max((step.grad_norm for step in steps), default=None),
    }


def merge_stage(cfg: MemAgentPipeline, out: Path, adapter: Path, echo=print) -> tuple[Path, str]:
    """The trained adapter merged into the base; returns (folder, stage fingerprint)."""
    dtype = cfg.grpo_config("-").dtype  # the trained weights' dtype (bfloat16 on a GPU keeps a 7B merge at 15 GB)
    return merge_stages(out / "merged", out / "merge.stage.json", cfg.model, adapter, dtype, echo)


def eval_stage(
    cfg: MemAgentPipeline,
    out: Path,
    checkpoint: str,
    model: str,
    model_fingerprint: str,
    set_name: str,
    data: Path,
    echo=print,
    limit: int | None = None,
) -> dict[str, Any]:
    """One evaluation: ``checkpoint`` (base or trained) on one set (``docs{N}`` or ``hotpotqa``),
    its first ``limit`` questions when given (``pipelines.eval_stage.eval_run``). Returns its summary."""
    folder = out / "eval" / checkpoint / set_name
    return eval_run(folder, folder.parent / f"{set_name}.stage.json", cfg.eval_config(model, limit=limit), data,
                    {"model": model_fingerprint}, echo, label=f"eval {checkpoint} {set_name}",
                    group=f"{checkpoint}-{set_name}", show_progress=True)


def run_memagent_pipeline(cfg: MemAgentPipeline, out: str | Path, echo=print) -> dict[str, Any]:
    """Run every stage (skipping finished ones); returns the report (also ``OUT/report.json``)."""
    import os

    from memsearch.pipelines.memagent.report import write_report

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise InputError(
            "the pipeline runs as one process (its stages write shared folders); for several GPUs run the "
            "training stage with torchrun: see docs/memagent.md"
        )
    out = record_invocation(out, cfg)
    with run_folder(out):
        paths = prepare_stage(cfg, out, echo)
        adapter = train_stage(cfg, out, paths["train_data"], paths["fingerprint"], echo)
        rewards = reward_summary(out / "train", out)
        merged, merged_fp = merge_stage(cfg, out, adapter, echo)
        models = {"base": (cfg.model, f"base:{cfg.model}"), "trained": (str(merged), merged_fp)}
        # Every set by its eval folder name: RULER-HQA-style docs{N}, then plain HotpotQA dev (the
        # recipe's second acceptance set: boxed exact match on the question's own paragraphs).
        sets = {f"docs{n}": (data, None) for n, data in paths["sets"].items()}
        sets[HOTPOT_SET] = (paths["dev"], cfg.data.questions)
        summaries: dict[str, dict[str, dict[str, Any]]] = {c: {} for c in CHECKPOINTS}
        for set_name, (data, limit) in sets.items():
            for checkpoint in CHECKPOINTS:
                model, fp = models[checkpoint]
                summaries[checkpoint][set_name] = eval_stage(
                    cfg, out, checkpoint, model, fp, set_name, data, echo, limit=limit
                )
    report = write_report(cfg, out, summaries, rewards)
    echo(report["table"])
    echo(report["deltas_table"])
    for verdict in report["verdicts"]:
        echo(verdict["line"])
    echo(f"report: {out / 'report.md'}")
    raise_if_unfinished(out)
    return report


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)

"""``memsearch pipeline memagent`` end to end on a tiny real Llama (random weights, the embedded
tokenizer) and the shipped HotpotQA samples: every stage runs for real (prepare, GRPO with the
memagent role, merge, eval of base and trained at two N, report); a re-run skips every stage,
a crashed eval resumes with only its missing task, and changed inputs are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.config import RunConfig, load_config
from memsearch.errors import InputError
from memsearch.io import sha256_file
from memsearch.pipelines.config import load_run_config
from memsearch.pipelines.memagent.config import MemAgentPipeline
from memsearch.pipelines.memagent.pipeline import run_memagent_pipeline

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MEMAGENT = ROOT / "configs" / "memagent.toml"
DOCS = (10, 20)


def tiny_settings(model: Path, *extra: str) -> list[str]:
    samples = ROOT / "data" / "samples" / "hotpotqa"
    return [
        f"model={json.dumps(str(model))}",
        f"data.dev={json.dumps(str(samples / 'dev_distractor_sample.json'))}",
        f"data.train={json.dumps(str(samples / 'train_sample.json'))}",
        f"data.docs={list(DOCS)}",
        "data.questions=2",
        "data.train_questions=4",
        "data.train_docs=12",
        "episode.budgets.chunk_tokens=256",
        "episode.budgets.max_chunks=3",
        "episode.budgets.memory_tokens=32",
        "episode.budgets.policy_tokens=16",
        "episode.budgets.answer_tokens=8",
        "grpo.steps=2",
        "grpo.rollout.tasks_per_step=1",
        "grpo.rollout.group_size=2",
        'grpo.dtype="float32"',
        "grpo.update.micro_batch_tokens=2048",
        "grpo.checkpoint_every=1",
        "grpo.optim.lr=1e-3",
        *extra,
    ]


def pipeline_config(model: Path, *extra: str) -> MemAgentPipeline:
    return load_config(MEMAGENT, tiny_settings(model, *extra), model=MemAgentPipeline)


@pytest.fixture(scope="module")
def finished(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline") / "memagent"
    lines: list[str] = []
    report = run_memagent_pipeline(pipeline_config(tiny_model_dir), out, echo=lines.append)
    return out, report, lines


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_every_stage_ran_and_the_report_compares_base_and_trained_at_every_n(finished):
    out, report, _ = finished
    sets = [f"docs{n}" for n in DOCS] + ["hotpotqa"]
    assert [(r["set"], r["checkpoint"]) for r in report["rows"]] == [(s, c) for s in sets for c in ("base", "trained")]
    for row in report["rows"]:
        summary = json.loads((out / "eval" / row["checkpoint"] / row["set"] / "summary.json").read_text())
        metrics = jsonl(out / "eval" / row["checkpoint"] / row["set"] / "metrics.jsonl")
        assert row["questions"] == row["expected"] == len(metrics) == 2
        assert row["sub_em"] == pytest.approx(sum(m["sub_em"] for m in metrics) / 2)
        assert all(m["answer_format"] == "boxed" for m in metrics)
        if row["set"] == "hotpotqa":
            continue
        # 10 and 20 documents are far more than 3 chunks of 256 tokens: every question is cut, and says so
        assert row["tasks_cut_by_chunk_limit"] == 2 and row["read_whole_context"] is False
        assert row["chunks_cut"] == sum(m["chunks_cut"] for m in metrics) > 0
        assert summary["truncation"]["disclosure"].startswith("TRUNCATED")
    text = (out / "report.md").read_text()
    assert "TRUNCATED" in text and "did not read the whole context" in text and "| N=20 | trained |" in text
    assert "contained in the prediction or the prediction in the gold answer" in text
    assert (out / "reward_curve.png").stat().st_size > 1000


def test_plain_hotpotqa_is_evaluated_and_every_criterion_gets_a_verdict(finished, tiny_model_dir):
    """The recipe's second acceptance set: plain HotpotQA dev (the first data.questions of
    prepare/dev, each question's own paragraphs), base and trained, same config but the model.
    Base and trained are the same weights here (no learning signal), so every paired difference
    is exactly 0 with a [0, 0] interval and every criterion FAILs; all four runs are usable."""
    out, report, lines = finished
    configs = {c: json.loads((out / "eval" / c / "hotpotqa" / "config.json").read_text()) for c in ("base", "trained")}
    assert configs["base"]["limit"] == configs["trained"]["limit"] == 2
    assert configs["base"]["backends"]["reader"]["model"] == str(tiny_model_dir)
    run = json.loads((out / "eval" / "base" / "hotpotqa" / "run.json").read_text())
    assert run["data"]["manifest_sha256"] == sha256_file(out / "prepare" / "dev" / "manifest.json")
    assert run["data"]["kind"] == "hotpotqa" and run["data"]["split"] == "dev"
    assert set(report["deltas"]) == {"docs10", "docs20", "hotpotqa"}
    for by_metric in report["deltas"].values():
        for d in by_metric.values():
            assert (d["diff"], d["ci_low"], d["ci_high"], d["n"]) == (0.0, 0.0, 0.0, 2)
    assert [v["criterion"] for v in report["verdicts"]] == [
        "trained > base on sub_em at RULER-HQA N=10",
        "trained > base on sub_em at RULER-HQA N=20",
        "trained > base on boxed_em at plain HotpotQA",
    ]
    assert {v["status"] for v in report["verdicts"]} == {"FAIL"} and report["overall"] == "NOT ACCEPTED"
    assert (
        "FAIL: trained > base on boxed_em at plain HotpotQA: Δ +0.000, 95% CI [+0.000, +0.000] (includes 0), n=2"
        in lines
    )
    text = (out / "report.md").read_text()
    assert "## Acceptance criteria" in text and "Overall: NOT ACCEPTED" in text
    assert "| HotpotQA | +0.000 [+0.000, +0.000] |" in text


def test_training_used_the_overwrite_role_and_kept_the_row_contract(finished):
    out, report, _ = finished
    log = jsonl(out / "train" / "train_log.jsonl")
    assert [r["step"] for r in log] == [1, 2] and report["rewards"]["steps"] == 2
    for record in log:
        assert record["rows_generated"] == record["rows_converted"] == record["rows_consumed"]
        assert record["rows_per_trajectory"] == 4  # 3 chunk updates (max_chunks) + the final answer
    config = json.loads((out / "train" / "config.json").read_text())
    assert config["role"] == "memagent" and config["credit"]["mode"] == "split" and config["loss"]["kl_coef"] == 0.001
    assert config["rollout"]["group_size"] == 2 and Path(config["data"]).parts[-2:] == ("train-long", "docs12")
    assert json.loads((out / "prepare" / "train-long" / "docs12" / "manifest.json").read_text())["split"] == "train"
    step_rows = [line for line in (out / "rewards.md").read_text().splitlines() if line[:3] in ("| 1", "| 2")]
    assert [line.split(" | ")[0] for line in step_rows] == ["| 1", "| 2"]


def test_base_and_trained_are_evaluated_by_the_identical_code_path(finished, tiny_model_dir):
    """Same run config but for the model folder; same prompts, tokenizer, budgets and evaluator;
    the first memory call of a question sees the identical prompt under both models."""
    out, _, _ = finished
    for n in DOCS:
        base, trained = (
            json.loads((out / "eval" / c / f"docs{n}" / "config.json").read_text()) for c in ("base", "trained")
        )
        for cfg, model in ((base, str(tiny_model_dir)), (trained, str(out / "merged"))):
            assert cfg["backends"]["memory"]["model"] == cfg["backends"]["reader"]["model"] == model
            cfg["backends"]["memory"]["model"] = cfg["backends"]["reader"]["model"] = "M"
        assert base == trained
        sb, st = (json.loads((out / "eval" / c / f"docs{n}" / "summary.json").read_text()) for c in ("base", "trained"))
        for key in (
            "prompt_version",
            "tokenizer",
            "budgets",
            "evaluator_version",
            "engine_version",
            "sampling",
            "data",
        ):
            assert sb[key] == st[key], key
        first = {
            c: {
                t["task_id"]: next(e for e in t["events"] if e["type"] == "policy_call")["messages"]
                for t in jsonl(out / "eval" / c / f"docs{n}" / "trajectories.jsonl")
            }
            for c in ("base", "trained")
        }
        assert first["base"] == first["trained"]
        assert "No memory yet." in next(iter(first["base"].values()))[1]["content"]  # the recipe's initial memory


def test_without_reward_signal_the_trained_model_is_the_base(finished, tiny_model_dir):
    """A random tiny model never answers right: every group has zero reward variance, so every
    advantage is 0, the LoRA B matrices stay 0 and the merged model equals the base exactly (the
    comparison then shows no difference, as it must)."""
    from safetensors.torch import load_file

    out, _, _ = finished
    log = jsonl(out / "train" / "train_log.jsonl")
    assert all(r["zero_variance_groups"] == r["groups"] and r["grad_norm"] == 0.0 for r in log)
    assert "NO LEARNING SIGNAL: in all 2 steps" in (out / "report.md").read_text()
    base, merged = (
        load_file(str(tiny_model_dir / "model.safetensors")),
        load_file(str(out / "merged" / "model.safetensors")),
    )
    assert base.keys() == merged.keys() and all((base[k] == merged[k]).all() for k in base)


def test_rerun_skips_every_stage_and_a_crashed_eval_resumes_only_its_missing_task(finished, tiny_model_dir):
    out, _, _ = finished
    traj = out / "eval" / "trained" / "docs20" / "trajectories.jsonl"
    before = {
        p: p.stat().st_mtime_ns
        for p in (out / "train" / "adapter" / "adapter_model.safetensors", out / "merged" / "model.safetensors", traj)
    }
    lines: list[str] = []
    run_memagent_pipeline(pipeline_config(tiny_model_dir), out, echo=lines.append)
    assert sum(line.endswith(": done") or ": done (" in line for line in lines) == 3 + 2 * (len(DOCS) + 1)
    assert {p: p.stat().st_mtime_ns for p in before} == before
    # a crash in the middle of that eval: one trajectory on disk, no summary, record incomplete
    kept = traj.read_text().splitlines()[0]
    traj.write_text(kept + "\n")
    (traj.parent / "summary.json").unlink()
    record_path = traj.parent.parent / "docs20.stage.json"
    record_path.write_text(json.dumps({**json.loads(record_path.read_text()), "complete": False}))
    lines.clear()
    run_memagent_pipeline(pipeline_config(tiny_model_dir), out, echo=lines.append)
    assert "eval trained docs20: resuming" in lines
    rows = traj.read_text().splitlines()
    assert len(rows) == 2 and rows[0] == kept
    summary = json.loads((traj.parent / "summary.json").read_text())
    assert summary["timing"]["resumed_tasks"] == 1 and summary["timing"]["episodes_run"] == 1 and summary["complete"]
    invocations = jsonl(out / "invocations.jsonl")  # each run's resolved config, appended, none overwritten
    assert len(invocations) == 3 and invocations[0]["config"] == invocations[2]["config"]


def test_changed_inputs_are_refused_not_mixed(finished, tiny_model_dir):
    out, _, _ = finished
    record = (out / "train.stage.json").read_text()
    with pytest.raises(InputError, match=r"stage 'train' was made from different inputs \(changed: grpo.steps\)"):
        run_memagent_pipeline(pipeline_config(tiny_model_dir, "grpo.steps=3"), out, echo=lambda m: None)
    with pytest.raises(InputError, match=r"stage 'prepare' was made from different inputs \(changed: data.questions\)"):
        run_memagent_pipeline(pipeline_config(tiny_model_dir, "data.questions=3"), out, echo=lambda m: None)
    assert (out / "train.stage.json").read_text() == record


def test_a_changed_adapter_is_caught_before_it_is_merged_or_evaluated(finished, tiny_model_dir):
    """(Runs last on the shared folder: it damages it.)"""
    out, _, _ = finished
    weights = out / "train" / "adapter" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\1" * 8)  # (its tail is zeros: B starts at 0)
    with pytest.raises(InputError, match="adapter: missing or changed since training finished"):
        run_memagent_pipeline(pipeline_config(tiny_model_dir), out, echo=lambda m: None)


def test_recipe_config_holds_the_memagent_settings():
    cfg = load_config(MEMAGENT, model=MemAgentPipeline)
    b = cfg.episode.budgets
    assert (b.chunk_tokens, b.memory_tokens, b.answer_tokens, b.max_chunks) == (2048, 1024, 256, 64)
    grpo = cfg.grpo_config("train-folder")
    assert (grpo.role, grpo.rollout.group_size, grpo.optim.lr, grpo.loss.kl_coef, grpo.credit.mode) == (
        "memagent",
        8,
        1e-6,
        0.001,
        "split",
    )
    assert grpo.reward.metric == "boxed_em"
    share = load_config(MEMAGENT, ['grpo.credit.mode="share"'], model=MemAgentPipeline).grpo_config("x")
    assert share.credit.mode == "share"
    p = cfg.episode.prompts
    assert p.initial_memory and "{chunk}" in p.overwrite_update and "\\boxed{{answer}}" in p.overwrite_final
    # `memsearch eval run --config configs/memagent.toml` runs the recipe's agent: the [episode] tables
    run = load_run_config(MEMAGENT, ["budgets.max_chunks=3"])
    assert isinstance(run, RunConfig) and run.budgets.max_chunks == 3 and run.tokenizer == "embedded"
    assert run.backends.reader.kind == "hf" and run.prompts == cfg.episode.prompts


@pytest.mark.parametrize(
    "setting, message",
    [
        ('episode.agent.memory="summary"', "needs evidence 'stream', memory 'overwrite'"),
        ('episode.tokenizer="lexical"', "budgets must be counted with the model's own tokenizer"),
        ('grpo.role="memory"', "grpo: role set by the pipeline itself"),
        ("grpo.rollout.group_sise=8", "grpo.rollout.group_sise: unknown field"),
        ("grpo.rollout.group_size=1", "grpo.rollout.group_size: Input should be greater than or equal to 2"),
        # the earlier table name and flat key, over the recipe's [grpo.rollout]: one setting given twice
        ("train.group_size=4", "grpo.group_size: group_size and rollout.group_size are one setting"),
        (
            'episode.prompts.overwrite_final="{question} only"',
            "overwrite_final: uses {question} but must use exactly {memory}, {question}",
        ),
    ],
)
def test_bad_pipeline_configs_say_which_field(setting, message):
    with pytest.raises(InputError) as info:
        load_config(MEMAGENT, [setting], model=MemAgentPipeline)
    assert message in str(info.value)


def test_cli_reports_config_errors_without_a_traceback(tmp_path):
    from typer.testing import CliRunner

    from memsearch.cli.app import app

    result = CliRunner().invoke(
        app,
        [
            "pipeline",
            "memagent",
            "--config",
            str(MEMAGENT),
            "--out",
            str(tmp_path / "p"),
            "--set",
            "grpo.rollout.group_sise=8",
        ],
    )
    assert result.exit_code == 2
    assert "error: " in result.output and "grpo.rollout.group_sise: unknown field" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "p").exists()


def test_refuses_to_run_under_torchrun(monkeypatch, tiny_model_dir, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(InputError, match="runs as one process"):
        run_memagent_pipeline(pipeline_config(tiny_model_dir), tmp_path / "p", echo=lambda m: None)
    assert not (tmp_path / "p").exists()


def test_train_questions_that_are_also_dev_questions_are_refused(tiny_model_dir, tmp_path):
    dev = ROOT / "data" / "samples" / "hotpotqa" / "dev_distractor_sample.json"
    cfg = pipeline_config(tiny_model_dir, f"data.train={json.dumps(str(dev))}")
    with pytest.raises(InputError) as info:
        run_memagent_pipeline(cfg, tmp_path / "p", echo=lambda m: None)
    assert "problem(s) between train and dev" in str(info.value) and "question" in str(info.value)
    assert not json.loads((tmp_path / "p" / "prepare.stage.json").read_text())["complete"]


def test_the_merge_stage_refuses_a_merged_model_changed_after_it_finished(tiny_model_dir, tmp_path):
    from memsearch.pipelines.memagent.pipeline import merge_stage
    from memsearch.pipelines.stage_record import folder_sha256
    from memsearch.train.config import LoraSettings
    from memsearch.train.policy import load_policy, save_adapter

    policy, _, _ = load_policy(str(tiny_model_dir), None, LoraSettings(r=2, target_modules=["q_proj"]), device="cpu")
    save_adapter(policy, tmp_path / "adapter")
    cfg = pipeline_config(tiny_model_dir)
    merged, _ = merge_stage(cfg, tmp_path, tmp_path / "adapter", echo=lambda m: None)
    record = json.loads((tmp_path / "merge.stage.json").read_text())
    assert record["outputs"]["merged_sha256"] == folder_sha256(merged)
    weights = merged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(InputError, match="merged: missing or changed since the merge finished"):
        merge_stage(cfg, tmp_path, tmp_path / "adapter", echo=lambda m: None)

"""``memsearch pipeline memory-policy`` end to end on a tiny real Llama (random weights, the
embedded tokenizer) and the shipped HotpotQA samples: prepare, oracle teacher + export-sft, SFT,
GRPO stage 1, merge, stage 2 (controller GRPO with stage 1 frozen), the A-D matrix on held-out
dev and the report all run for real; a re-run skips every stage, a crashed stage resumes,
changed inputs and train/dev overlap are refused, and a stage-1 checkpoint never writes the
memory of A/C."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from memsearch.errors import InputError
from memsearch.pipelines.memory_policy.pipeline import run_memory_policy_pipeline

pytestmark = pytest.mark.slow

SAMPLES = Path(__file__).resolve().parents[2] / "data" / "samples" / "hotpotqa"


# Stage 2 on, from the controller's SFT on the oracle controller's rows, and a validation split of
# 2 questions that GRPO evaluates on at its end. (Stage 2 from a fresh LoRA: test_memory_policy_http.py.)
ON = ("stage2.enabled=true", 'stage2.start="sft"', "data.val_questions=2")


def record(path: Path) -> dict:
    return json.loads(path.read_text())


def outputs_snapshot(out: Path) -> dict[str, float]:
    return {
        str(p.relative_to(out)): p.stat().st_mtime_ns
        for p in out.rglob("*")
        if p.is_file() and p.name != "invocations.jsonl"
    }


@pytest.fixture(scope="module")
def with_stage2(tiny_model_dir, tmp_path_factory, mp_config):
    out = tmp_path_factory.mktemp("mp") / "on"
    lines: list[str] = []
    report = run_memory_policy_pipeline(mp_config(*ON), out, echo=lines.append)
    return out, report, lines


def test_every_stage_runs_with_stage2_and_the_report_equals_the_metrics_files(with_stage2, tiny_model_dir):
    out, report, _ = with_stage2
    seed = out / "seed-7"
    for stage in ("sft", "grpo1", "merged1", "sft2", "grpo2", "merged2", "matrix"):
        assert record(seed / f"{stage}.stage.json")["complete"] is True, stage
    assert (out / "teacher" / "sft.jsonl").read_text().count("\n") > 0
    # Stage 2 starts from the controller's SFT on every controller call of the teacher run on train
    # (oracle controller: SEARCH a gold title the memory lacks, then FINISH).
    from memsearch.pipelines.stage_record import folder_sha256
    from memsearch.text.actions import parse_controller

    teacher2 = record(out / "teacher2" / "run" / "config.json")
    assert (teacher2["agent"]["controller"], teacher2["backends"]["controller"]["kind"]) == ("policy", "oracle")
    rows = [json.loads(x) for x in (out / "teacher2" / "sft.jsonl").read_text().splitlines()]
    calls = [
        e
        for x in (out / "teacher2" / "run" / "trajectories.jsonl").read_text().splitlines()
        for e in json.loads(x)["events"]
        if e.get("type") == "policy_call" and e["role"] == "controller"
    ]
    assert len(rows) == len(calls) > 3 and {r["role"] for r in rows} == {"controller"}
    kinds = [parse_controller(r["completion"]).kind for r in rows]
    assert "search" in kinds and set(kinds) <= {"search", "finish"}  # every row a readable decision
    sft2 = record(seed / "sft2" / "config.json")
    assert (sft2["role"], sft2["data"]) == ("controller", [str(out / "teacher2" / "sft.jsonl")])
    assert record(seed / "grpo2" / "config.json")["adapter"] == str(seed / "sft2" / "adapter")
    assert record(seed / "grpo2.stage.json")["inputs"]["sft2_sha256"] == folder_sha256(seed / "sft2" / "adapter")
    # The validation split is the 2 dev questions after the 3 held-out ones, and only GRPO reads it.
    from memsearch.data.dataset import load_dataset

    held_out = [t.id for t in load_dataset(out / "prepare" / "dev").tasks]
    val = [t.id for t in load_dataset(out / "prepare" / "val").tasks]
    dev_file = [r["_id"] for r in json.loads((SAMPLES / "dev_distractor_sample.json").read_text())[:5]]
    assert (held_out, val) == (dev_file[:3], dev_file[3:])
    for stage in ("grpo1", "grpo2"):
        last = [json.loads(x) for x in (seed / stage / "train_log.jsonl").read_text().splitlines()][-1]
        assert "eval_f1" in last and record(seed / stage / "config.json")["eval"]["data"] == str(
            out / "prepare" / "val"
        )
    assert (seed / "merged1" / "config.json").is_file() and (seed / "merged2" / "config.json").is_file()
    (section,) = report["seeds"]
    for row in section["rows"]:
        metrics = [
            json.loads(line) for line in (seed / "matrix" / row["group"] / "metrics.jsonl").read_text().splitlines()
        ]
        assert row["questions"] == len(metrics) == 3
        for key in ("f1", "memory_support_recall"):
            values = [m[key] for m in metrics if m.get(key) is not None]
            expected = sum(values) / len(values) if values else None
            assert row[key] == (pytest.approx(expected) if expected is not None else None), (row["group"], key)
    diff = next(d for d in section["diffs"] if d["pair"] == "B-A" and d["metric"] == "f1")
    b = [json.loads(x)["f1"] for x in (seed / "matrix" / "B" / "metrics.jsonl").read_text().splitlines()]
    a = [json.loads(x)["f1"] for x in (seed / "matrix" / "A" / "metrics.jsonl").read_text().splitlines()]
    assert diff["n"] == 3 and diff["diff"] == pytest.approx(sum(b) / 3 - sum(a) / 3)
    text = (out / "report.md").read_text()
    assert (
        "Stage 2 (controller GRPO): on: C/D use the stage-2 controller, trained from the seed's SFT of the controller"
        in text
    )
    assert "| B-A | f1 |" in text
    # Stage 2 trained C's controller and stage 1 B/D's memory: both caveats are said, once.
    assert text.count("- C is a cross-ablation: a controller trained with decision (memory-policy) memory") == 1
    assert text.count("- Trained policies: teacher rows selected by their answers") == 1
    assert (out / "curves.png").stat().st_size > 1000


def test_heldout_comparison_of_memory_policies_equals_the_metrics_files(with_stage2, tiny_model_dir):
    """base / rules run once, sft / grpo per seed, on the held-out questions with the same episode;
    summary.json's means and paired differences are those of the runs' metrics files."""
    out, report, _ = with_stage2
    runs = {
        "base": out / "heldout" / "base",
        "rules": out / "heldout" / "rules",
        "sft": out / "seed-7" / "heldout" / "sft",
        "grpo": out / "seed-7" / "heldout" / "grpo",
    }
    configs = {p: record(r / "config.json") for p, r in runs.items()}
    memory = {p: c["backends"]["memory"] for p, c in configs.items()}
    assert memory["rules"]["kind"] == "rules"
    assert (memory["base"]["model"], memory["base"]["adapter"], memory["base"]["schema_mode"]) == (
        str(tiny_model_dir),
        None,
        True,
    )
    assert memory["sft"]["adapter"] == str(out / "seed-7" / "sft" / "adapter") and memory["sft"]["model"] == str(
        tiny_model_dir
    )
    assert memory["grpo"]["model"] == str(out / "seed-7" / "merged1") and memory["sft"]["schema_mode"] is True
    for c in configs.values():  # everything but the memory backend is the same episode
        assert {k: v for k, v in c.items() if k != "backends"} == {
            k: v for k, v in configs["base"].items() if k != "backends"
        }
        assert c["backends"]["reader"] == configs["base"]["backends"]["reader"]
    summary = record(out / "heldout" / "summary.json")
    per_task = {
        p: {m["task_id"]: m for m in map(json.loads, (r / "metrics.jsonl").read_text().splitlines())}
        for p, r in runs.items()
    }
    for policy, rows in per_task.items():
        row = summary["policies"]["shared" if policy in ("base", "rules") else "seeds"]
        row = row[policy] if policy in ("base", "rules") else row["7"][policy]
        assert row["f1"] == pytest.approx(sum(m["f1"] for m in rows.values()) / 3)
        calls = sum(
            1
            for line in (runs[policy] / "trajectories.jsonl").read_text().splitlines()
            for e in json.loads(line)["events"]
            if e.get("type") == "policy_call" and e["role"] == "memory"
        )
        assert row["memory_calls"]["calls"] == calls > 0
    d = summary["per_seed"]["7"]["grpo-rules"]["memory_support_recall"]
    expected = (
        sum(
            per_task["grpo"][t]["memory_support_recall"] - per_task["rules"][t]["memory_support_recall"]
            for t in per_task["rules"]
        )
        / 3
    )
    assert d["n"] == 3 and d["diff"] == pytest.approx(expected)
    # the comparison only: whether a result clears a bar is its study's verdict (studies/)
    assert "bar" not in summary and summary["reward"]["memory_recall"] == 1.0
    assert "bar" not in record(out / "report.json")["heldout"] and "Bar (" not in (out / "report.md").read_text()
    text = (out / "report.md").read_text()
    assert (
        "## Memory policies on the held-out questions (group B)" in text
        and "| grpo-rules | memory_support_recall |" in text
    )
    # the SFT rows are the selection: every op row and unfit NOOP, a share of the other NOOP rows
    sel = record(out / "teacher" / "select.stage.json")["outputs"]["report"]
    assert sel["kept"]["op"] == sel["read"]["op"] and sel["kept"]["other_noop"] == round(
        0.2 * sel["read"]["other_noop"]
    )
    assert record(out / "seed-7" / "sft" / "config.json")["data"] == [str(out / "teacher" / "selected.jsonl")]


def test_stage1_weights_never_reach_a_or_c(with_stage2, tiny_model_dir):
    """A/C summarize with the untrained base; B/D with the merged stage-1 folder; C/D's
    controller is the merged stage-2 folder (checked in each group's run.json)."""
    out, _, _ = with_stage2
    matrix = out / "seed-7" / "matrix"
    summaries = {g: record(matrix / g / "summary.json") for g in "ABCD"}
    models = {g: record(matrix / g / "run.json")["models"]["memory"] for g in "ABCD"}
    configs = {g: record(matrix / g / "config.json") for g in "ABCD"}
    for g in "AC":
        assert summaries[g]["memory_backend"]["model"] == str(tiny_model_dir)
        assert summaries[g]["memory_backend"]["adapter"] is None
        assert "merged" not in json.dumps(configs[g]["backends"]["memory"])
    for g in "BD":
        assert summaries[g]["memory_backend"]["model"] == str(out / "seed-7" / "merged1")
    # By content, too: A and C ran the base weights, B and D the stage-1 weights, which differ.
    assert models["A"] == models["C"] and models["B"] == models["D"] and models["A"] != models["B"]
    for g in "CD":
        assert configs[g]["backends"]["controller"]["model"] == str(out / "seed-7" / "merged2")


def test_rerun_skips_every_stage_and_leaves_outputs_untouched(with_stage2, mp_config):
    out, report, _ = with_stage2
    before = outputs_snapshot(out)
    lines: list[str] = []
    again = run_memory_policy_pipeline(mp_config(*ON), out, echo=lines.append)
    after = outputs_snapshot(out)
    changed = sorted(
        k
        for k in before
        if before[k] != after.get(k) and not k.startswith("report") and k not in ("curves.png", "heldout/summary.json")
    )
    assert changed == [] and set(after) == set(before)
    assert "prepare: done" in "\n".join(lines) and "grpo2: done (" in "\n".join(lines)
    assert again["seeds"][0]["rows"] == report["seeds"][0]["rows"]


def test_changed_inputs_are_refused_naming_the_fields(with_stage2, mp_config):
    out, _, _ = with_stage2
    with pytest.raises(InputError, match=r"grpo1.*changed: grpo\.optim\.lr"):
        run_memory_policy_pipeline(mp_config(*ON, "grpo.optim.lr=1e-3"), out, echo=lambda _: None)
    with pytest.raises(InputError, match=r"changed: data\.dev_questions"):
        run_memory_policy_pipeline(mp_config(*ON, "data.dev_questions=4"), out, echo=lambda _: None)


def test_without_stage2_crashed_stages_resume_and_the_report_says_base_controller(tiny_model_dir, tmp_path, mp_config):
    out = tmp_path / "off"
    run_memory_policy_pipeline(mp_config(), out, echo=lambda _: None)
    seed = out / "seed-7"
    assert not (seed / "grpo2").exists()
    assert "**skipped**: C/D use the untrained base controller" in (out / "report.md").read_text()
    assert record(seed / "matrix" / "C" / "config.json")["backends"]["controller"]["model"] == str(tiny_model_dir)
    # A crash during group D: its folder and the comparison are gone, the stage record is incomplete.
    shutil.rmtree(seed / "matrix" / "D")
    (seed / "matrix" / "matrix.json").unlink()
    stage = record(seed / "matrix.stage.json")
    (seed / "matrix.stage.json").write_text(json.dumps({**stage, "complete": False}))
    a_before = (seed / "matrix" / "A" / "trajectories.jsonl").read_bytes()
    lines: list[str] = []
    report = run_memory_policy_pipeline(mp_config(), out, echo=lines.append)
    assert any("matrix: resuming" in line for line in lines)
    # The finished groups are resumed (no episode rerun), only D runs again.
    assert (seed / "matrix" / "A" / "trajectories.jsonl").read_bytes() == a_before
    assert [r["questions"] for r in report["seeds"][0]["rows"]] == [3, 3, 3, 3]
    # A crash of GRPO stage 1 after its last checkpoint, before the final adapter was saved: the
    # trainer resumes from the checkpoint and writes the same adapter, so the merge and the
    # matrix downstream are still valid and skipped.
    adapter = (seed / "grpo1" / "adapter" / "adapter_model.safetensors").read_bytes()
    shutil.rmtree(seed / "grpo1" / "adapter")
    stage = record(seed / "grpo1.stage.json")
    (seed / "grpo1.stage.json").write_text(json.dumps({**stage, "complete": False}))
    lines = []
    run_memory_policy_pipeline(mp_config(), out, echo=lines.append)
    assert any(line.startswith("grpo1: GRPO role=memory") and line.endswith("(resuming)") for line in lines)
    assert (seed / "grpo1" / "adapter" / "adapter_model.safetensors").read_bytes() == adapter
    assert "merge: done" in "\n".join(lines) and "seed 7 matrix: done" in "\n".join(lines)


def test_a_seed_outside_matrix_seeds_gets_the_heldout_comparison_but_no_matrix(tmp_path, mp_config):
    report = run_memory_policy_pipeline(mp_config("matrix_seeds=[]"), tmp_path / "o", echo=lambda _: None)
    seed = tmp_path / "o" / "seed-7"
    assert not (seed / "matrix").exists() and report["seeds"] == []
    assert record(seed / "heldout" / "grpo.stage.json")["complete"] is True
    assert list(record(tmp_path / "o" / "heldout" / "summary.json")["per_seed"]) == ["7"]
    assert "the A-D matrix" not in (tmp_path / "o" / "report.md").read_text()


def test_train_dev_overlap_is_refused(tmp_path, mp_config):
    """A train file holding a dev question: prepare stops before any training."""
    dev = json.loads((SAMPLES / "dev_distractor_sample.json").read_text())
    train = json.loads((SAMPLES / "train_sample.json").read_text())[:2] + dev[:1]
    path = tmp_path / "train.json"
    path.write_text(json.dumps(train))
    with pytest.raises(InputError, match="held-out questions must never be trained on"):
        run_memory_policy_pipeline(
            mp_config(f"data.train={json.dumps(str(path))}"), tmp_path / "o", echo=lambda _: None
        )
    assert not (tmp_path / "o" / "teacher").exists()


def test_owned_fields_are_refused(mp_config):
    with pytest.raises(Exception, match="grpo: eval.data set by the pipeline"):
        mp_config('grpo.eval.data="x"', "data.val_questions=2")
    with pytest.raises(Exception, match="grpo.eval.every needs data.val_questions > 0"):
        mp_config("grpo.eval.every=1")
    with pytest.raises(Exception, match="sft: eval set by the pipeline"):
        mp_config("sft.eval.every=1")
    with pytest.raises(Exception, match="grpo.rollout.schema_mode: set the pipeline's top-level schema_mode"):
        mp_config("grpo.rollout.schema_mode=true")
    with pytest.raises(Exception, match="stage2.start = 'sft' needs stage2.enabled = true"):
        mp_config('stage2.start="sft"')
    with pytest.raises(Exception, match="stage2.sft: only used with stage2.start = 'sft'"):
        mp_config("stage2.enabled=true", "stage2.sft.epochs=2.0")
    with pytest.raises(Exception, match="stage2.sft: role set by the pipeline"):
        mp_config("stage2.enabled=true", 'stage2.start="sft"', 'stage2.sft.role="memory"')


def test_cold_start_trains_stage1_from_the_base_without_teacher_or_sft(tmp_path, mp_config):
    """grpo_start = "base" (the cold-start control's one change): no teacher, export or SFT stage;
    GRPO stage 1 starts from a fresh adapter on the base model in schema mode; the held-out
    comparison has base, rules and grpo, and every difference that needs sft is left out."""
    out = tmp_path / "cold"
    lines: list[str] = []
    cfg = mp_config('grpo_start="base"', "matrix_seeds=[]")
    report = run_memory_policy_pipeline(cfg, out, echo=lines.append)
    seed = out / "seed-7"
    assert not (out / "teacher").exists() and not (seed / "sft").exists() and not (seed / "heldout" / "sft").exists()
    assert "seed 7 sft: skipped (grpo_start = 'base'" in "\n".join(lines)
    grpo1 = record(seed / "grpo1" / "config.json")
    assert grpo1["adapter"] is None and grpo1["rollout"]["schema_mode"] is True
    assert record(seed / "grpo1.stage.json")["complete"] is True and (seed / "merged1" / "config.json").is_file()
    summary = record(out / "heldout" / "summary.json")
    assert summary["grpo_start"] == "base" and summary["not_run"] == ["sft"]
    assert set(summary["policies"]["seeds"]["7"]) == {"grpo"}
    assert set(summary["per_seed"]["7"]) == {"grpo-rules", "grpo-base"}
    assert set(summary["over_seeds"]) == {"grpo-rules"}
    # The grpo row is the merged stage-1 model's run on the 3 held-out questions, read from its files.
    row = summary["policies"]["seeds"]["7"]["grpo"]
    metrics = [json.loads(x) for x in (seed / "heldout" / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert row["questions"] == len(metrics) == 3
    assert record(seed / "heldout" / "grpo" / "config.json")["backends"]["memory"]["model"] == str(seed / "merged1")
    diff = summary["per_seed"]["7"]["grpo-rules"]["f1"]
    rules = [json.loads(x)["f1"] for x in (out / "heldout" / "rules" / "metrics.jsonl").read_text().splitlines()]
    assert diff["n"] == 3 and diff["diff"] == pytest.approx(sum(m["f1"] for m in metrics) / 3 - sum(rules) / 3)
    text = (out / "report.md").read_text()
    assert "**the base model** (cold start" in text and "not run: sft" in text
    assert "| sft |" not in text and "| grpo |" in text and "| grpo-sft |" not in text
    assert report["seeds"] == [] and (out / "curves.png").stat().st_size > 1000
    # A re-run skips every stage.
    lines = []
    run_memory_policy_pipeline(cfg, out, echo=lines.append)
    assert "grpo1: done (" in "\n".join(lines) and not (out / "teacher").exists()


def test_validation_only_runs_no_heldout_row_and_the_full_run_continues_from_it(tmp_path, mp_config):
    """A pilot reads only the validation split; the full run later reuses its SFT and stage 1."""
    from memsearch.io import sha256_file
    from memsearch.pipelines.memory_policy.pipeline import run_validation_only

    settings = ("data.val_questions=2", "grpo.eval.every=1", "grpo.eval.at_start=true", "grpo.eval.limit=2")
    out = tmp_path / "pilot"
    lines: list[str] = []
    evals = run_validation_only(mp_config(*settings), out, echo=lines.append)
    seed = out / "seed-7"
    assert (seed / "sft" / "adapter").is_dir() and (seed / "grpo1" / "adapter").is_dir()
    # Nothing that reads the held-out questions ran: no held-out rows, merge, matrix or report.
    assert not (out / "heldout").exists() and not (seed / "heldout").exists()
    assert not (seed / "merged1").exists() and not (seed / "matrix").exists() and not (out / "report.md").exists()
    assert [r["step"] for r in evals[7]] == [0, 1]  # the SFT start, then the end of stage 1
    log = [json.loads(line) for line in (seed / "grpo1" / "train_log.jsonl").read_text().splitlines()]
    for r in evals[7]:
        logged = next(x for x in log if x["step"] == r["step"] and "eval_f1" in x)
        assert r["eval_memory_support_recall"] == logged["eval_memory_support_recall"]
        summary = record(seed / "grpo1" / "eval" / f"step-{r['step']:06d}" / "summary.json")
        assert r["memory_ops"] == summary["memory_ops"] and summary["tasks"]["scored"] == 2
        assert summary["data"]["manifest_sha256"] == sha256_file(out / "prepare" / "val" / "manifest.json")
    assert sum("grpo1 validation at step" in line for line in lines) == 2
    assert lines[-1].startswith("validation only: no held-out row was run")
    sft_adapter = (seed / "sft" / "adapter" / "adapter_model.safetensors").read_bytes()
    # The same folder continues into the full pipeline: SFT and stage 1 are skipped, not retrained.
    lines = []
    run_memory_policy_pipeline(mp_config(*settings), out, echo=lines.append)
    assert "sft: done" in "\n".join(lines) and "grpo1: done" in "\n".join(lines)
    assert (seed / "sft" / "adapter" / "adapter_model.safetensors").read_bytes() == sft_adapter
    assert (out / "report.md").exists() and (seed / "heldout").is_dir()


def test_validation_only_needs_a_validation_split(tmp_path, mp_config):
    from memsearch.pipelines.memory_policy.pipeline import run_validation_only

    with pytest.raises(InputError, match="set data.val_questions > 0 and grpo.eval.every"):
        run_validation_only(mp_config(), tmp_path / "o", echo=lambda _: None)
    assert not (tmp_path / "o").exists()


def test_a_refused_overlap_leaves_nothing_that_blocks_the_corrected_run(tmp_path, mp_config):
    """The leak check runs before the prepare stage writes anything: before, it ran after
    prepare/ and its record were written, and the corrected config was then refused as
    'made from different inputs'."""
    from memsearch.pipelines.memory_policy.pipeline import prepare_stage

    dev = json.loads((SAMPLES / "dev_distractor_sample.json").read_text())
    train = json.loads((SAMPLES / "train_sample.json").read_text())[:2] + dev[:1]
    leaky, clean = tmp_path / "leaky.json", tmp_path / "clean.json"
    leaky.write_text(json.dumps(train))
    clean.write_text(json.dumps(train[:2]))
    out = tmp_path / "o"
    out.mkdir()
    with pytest.raises(InputError, match="held-out questions must never be trained on") as exc:
        prepare_stage(mp_config(f"data.train={json.dumps(str(leaky))}"), out, echo=lambda _: None)
    assert list(out.iterdir()) == []
    assert f"question {dev[0]['_id']} of train ({leaky}) is also in dev" in str(exc.value)
    # (2 questions: asking the config's 3 of it is refused since issue 62)
    paths = prepare_stage(mp_config(f"data.train={json.dumps(str(clean))}", "data.train_questions=2"), out,
                          echo=lambda _: None)
    assert record(out / "prepare.stage.json")["complete"] is True and paths["train"].is_dir()


def test_the_extractive_format_runs_through_every_stage_of_the_track(tmp_path, mp_config):
    """``episode.agent.memory_format = "extractive"``: the teacher's SFT rows name evidence ids,
    SFT and GRPO train on those prompts, GRPO samples one op per call under the per-call
    constraint, and every held-out row (base, rules, sft, grpo) runs the same extractive episode."""
    out = tmp_path / "x"
    # 40 policy tokens: an extractive op is ~20 (the tiny config's 12 would leave the teacher only NOOP)
    run_memory_policy_pipeline(mp_config('episode.agent.memory_format="extractive"', "matrix_seeds=[]",
                                         "data.train_questions=4", "episode.budgets.policy_tokens=40"),
                               out, echo=lambda _: None)
    rows = [json.loads(x) for x in (out / "teacher" / "selected.jsonl").read_text().splitlines()]
    assert rows and all(r["role"] == "memory" for r in rows)
    ops = [op for r in rows for op in json.loads(r["completion"])["ops"]]
    adds = [op for op in ops if op["op"] == "ADD" and op.get("kind", "fact") == "fact"]
    assert adds and all(op["sources"] and "text" not in op for op in adds)  # ids, not prose
    assert all("you choose sentences by their evidence ids" in r["messages"][-1]["content"] for r in rows)
    seed = out / "seed-7"
    rolled = [json.loads(x) for p in sorted((seed / "grpo1" / "rollouts").glob("*.jsonl"))
              for x in p.read_text().splitlines()]
    calls = [e for tr in rolled for e in tr["events"] if e.get("type") == "policy_call" and e["role"] == "memory"]
    assert calls and all(e["constraint_id"].startswith("memory-extract-v1:") for e in calls)
    for e in calls:  # one op per call, the schema's spelling
        assert len(json.loads(e["text"])["ops"]) == 1
    for run in (out / "heldout" / "base", out / "heldout" / "rules", seed / "heldout" / "sft",
                seed / "heldout" / "grpo"):
        assert record(run / "config.json")["agent"]["memory_format"] == "extractive", run
    summary = record(out / "heldout" / "summary.json")
    assert summary["policies"]["seeds"]["7"]["grpo"]["memory_calls"]["calls"] > 0

"""Evaluation discipline of a run summary (the MemAgent reproduction's acceptance rules): it
records what makes two runs comparable (data SHA-256, evaluator / prompt / engine versions,
tokenizer, sampling, chunk and memory limits, sample and error counts), reports em, f1, sub_em
and boxed_em, says how many samples the chunk limit cut and never lets a cut run pass for one
that read the whole context, and marks runs with missing samples unusable.

Request errors making a run unusable are covered in test_runner.py (server faults) and
tests/engine/test_memagent_contract.py (a failed reader request).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.config import load_config
from memsearch.data.dataset import load_dataset
from memsearch.data.ruler import prepare_ruler
from memsearch.engine.episode import ENGINE_VERSION
from memsearch.engine.prompts import PROMPT_VERSION, prompt_version
from memsearch.eval.runner import EVALUATOR_VERSION, run_eval, summarize
from memsearch.io import iter_jsonl, sha256_file
from memsearch.pipelines.config import load_run_config
from memsearch.records.metrics_row import read_metrics

ROOT = Path(__file__).resolve().parents[2]
MEMAGENT = ROOT / "configs" / "memagent.toml"
RULES = ROOT / "configs" / "rules.toml"
N_TASKS = 3


@pytest.fixture(scope="module")
def docs50(hotpot_dev_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ruler") / "ruler"
    prepare_ruler(hotpot_dev_dir, out, [50], limit=N_TASKS, tokenizer=None, show_progress=False)
    return out / "docs50"


def memagent(*extra: str):
    """The MemAgent design on the rules backend (no model), lexical tokenizer."""
    return load_run_config(
        MEMAGENT,
        [
            'tokenizer="lexical"',
            *[f'backends.{r}.kind="rules"' for r in ("memory", "controller", "reader")],
            "budgets.chunk_tokens=1024",
            *extra,
        ],
    )


def test_summary_records_what_a_comparison_needs(docs50, tmp_path):
    config = memagent("budgets.max_chunks=64")
    summary = run_eval(config, docs50, tmp_path / "run", show_progress=False)
    assert summary.to_json() == json.loads((tmp_path / "run" / "summary.json").read_text())
    manifest = json.loads((docs50 / "manifest.json").read_text())
    data = summary.data
    assert data["manifest_sha256"] == sha256_file(docs50 / "manifest.json")
    assert data["files"] == {
        name: sha256_file(docs50 / name) for name in ("corpus.jsonl", "tasks.jsonl", "labels.jsonl")
    }
    assert summary.data_build == {
        "builder": "ruler-hqa-1",
        "num_docs": 50,
        "seed": 42,
        "pool_size": manifest["pool_size"],
        "context_sha256": manifest["context_sha256"],
        "counts": manifest["counts"],
    }
    # the recipe sets its own wording: the prompt version carries its hash
    assert (summary.evaluator_version, summary.prompt_version, summary.engine_version) == (
        EVALUATOR_VERSION,
        prompt_version(config.prompts.model_dump()),
        ENGINE_VERSION,
    )
    assert summary.prompt_version.startswith(PROMPT_VERSION + "+custom-")
    assert summary.tokenizer == "lexical-v1"
    assert summary.sampling == {
        r: getattr(config.backends, r).sampling.model_dump() for r in ("memory", "controller", "reader")
    }
    budgets = summary.budgets
    assert (budgets["chunk_tokens"], budgets["max_chunks"], budgets["memory_tokens"], budgets["answer_tokens"]) == (
        1024,
        64,
        1024,
        256,
    )
    assert summary.tasks.to_json() == {"expected": N_TASKS, "scored": N_TASKS, "failed": 0, "failed_ids": [],
                                       "retried": 0, "failed_attempts": 0}
    assert summary.context_truncated == {"calls": 0, "tasks": 0, "by_role": {}}
    assert summary.request_errors == 0
    assert all(isinstance(summary.metrics[k], float) for k in ("em", "f1", "sub_em", "boxed_em"))
    assert all(summary.metric_counts[k] == N_TASKS for k in ("em", "f1", "sub_em", "boxed_em"))
    assert summary.truncation | {"memory_truncations": None} == {
        "max_chunks": 64,
        "tasks_cut_by_chunk_limit": 0,
        "chunks_cut": 0,
        "read_whole_context": True,
        "disclosure": None,
        "memory_truncations": None,
    }
    assert summary.complete and summary.usable_for_comparison and summary.note is None
    assert summary.timing["episodes_cpu_s"] >= 0 and summary.timing["episodes_wall_s"] > 0


def test_a_run_cut_by_max_chunks_says_it_did_not_read_the_whole_context(docs50, tmp_path):
    summary = run_eval(memagent("budgets.max_chunks=2"), docs50, tmp_path / "run", show_progress=False)
    rows = [row for _, row in iter_jsonl(tmp_path / "run" / "metrics.jsonl")]
    cut = sum(r["chunks_cut"] for r in rows)
    assert all(r["chunks"] == 2 and r["truncated_by_chunk_limit"] for r in rows) and cut >= N_TASKS
    trunc = summary.truncation
    assert (trunc["tasks_cut_by_chunk_limit"], trunc["chunks_cut"], trunc["read_whole_context"]) == (
        N_TASKS,
        cut,
        False,
    )
    assert trunc["disclosure"] == (
        f"TRUNCATED: {N_TASKS} of {N_TASKS} task(s) were cut by max_chunks=2 ({cut} chunk(s) "
        "never read); this run did not read the whole context"
    )
    assert summary.note == trunc["disclosure"]
    # A cut is a budget (identical for every run compared), not a failure: still comparable.
    assert summary.complete and summary.usable_for_comparison


def test_missing_samples_make_the_run_unusable(docs50, tmp_path):
    config = memagent()
    full = run_eval(config, docs50, tmp_path / "run", show_progress=False)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    run_info = json.loads((tmp_path / "run" / "run.json").read_text())
    summary = summarize(config, run_info, rows[:-1], N_TASKS, {})
    assert full.usable_for_comparison and not summary.usable_for_comparison and not summary.complete
    assert summary.note == (
        "INCOMPLETE: 1 task(s) missing, 0 failed (a failed task scores 0 in every answer metric); not a result"
    )
    assert summary.truncation["read_whole_context"] is False  # a missing task is not known to have read anything
    assert summary.tasks.to_json() == {"expected": N_TASKS, "scored": N_TASKS - 1, "failed": 0, "failed_ids": [],
                                       "retried": 0, "failed_attempts": 0}


def test_search_runs_have_no_long_context_to_read(hotpot_dev_dir, tmp_path):
    summary = run_eval(load_config(RULES, ["limit=2"]), hotpot_dev_dir, tmp_path / "run", show_progress=False)
    assert summary.truncation | {"memory_truncations": None} == {
        "max_chunks": None,
        "tasks_cut_by_chunk_limit": 0,
        "chunks_cut": 0,
        "read_whole_context": None,
        "disclosure": None,
        "memory_truncations": None,
    }
    assert summary.data_build == {"counts": load_dataset(hotpot_dev_dir).manifest["counts"]}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_trajectory_holding_a_non_finite_number_is_written_as_a_failed_task_in_strict_json(bad):
    # Whatever backend let a NaN through (the OpenAI backend refuses one), the line stays strict JSON.
    from memsearch.eval.runner import _trajectory_line
    from memsearch.records.trajectory import Trajectory

    traj = {"task_id": "t1", "group": "B", "question": "q?", "prediction": "x", "status": "ok",
            "events": [{"type": "policy_call", "logprobs": [-0.5, bad]}], "counts": {"searches": 1}}
    line = _trajectory_line(Trajectory.from_json(traj))
    record = json.loads(line, parse_constant=lambda name: pytest.fail(f"bare {name}"))
    assert line.endswith("\n") and record == {
        "task_id": "t1", "group": "B", "question": "q?", "prediction": None, "status": "error", "counts": {},
        "events": [], "error": f"trajectory not writable as strict JSON (events.0.logprobs.1 is {bad!r}); task marked "
        "failed",
    }

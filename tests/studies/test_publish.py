"""studies.memory_policy.publish (module and command): a memory-policy pipeline run's record copied
into a results folder, read from a real run of the tiny pipeline (tests/pipelines/conftest.py)."""

from __future__ import annotations

import gzip

import pytest
from studies.memory_policy import publish
from studies.memory_policy.publish import publish_results

from memsearch.errors import InputError
from memsearch.eval.run_diff import matrix_minus_control
from memsearch.pipelines.memory_policy.pipeline import run_memory_policy_pipeline

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory, mp_config):
    """The smallest pipeline run with a held-out comparison and a matrix (stage 2 off)."""
    out = tmp_path_factory.mktemp("mp") / "run"
    run_memory_policy_pipeline(mp_config(), out, echo=lambda _: None)
    return out


def test_publish_copies_what_a_reader_checks_claims_with(pipeline_run, tmp_path):
    out = pipeline_run
    written = publish_results(out, tmp_path / "results")
    names = {str(p.relative_to(tmp_path / "results")) for p in written}
    assert {
        "report.md",
        "curves.png",
        "summary.json",
        "invocations.jsonl",
        "seed-7/grpo1/train_log.jsonl",
        "seed-7/heldout/grpo/metrics.jsonl.gz",
        "heldout/rules/metrics.jsonl.gz",
        "seed-7/matrix/B/metrics.jsonl.gz",
    } <= names
    results = tmp_path / "results"
    assert (results / "summary.json").read_bytes() == (out / "heldout" / "summary.json").read_bytes()
    packed = results / "seed-7" / "matrix" / "B" / "metrics.jsonl.gz"
    assert gzip.decompress(packed.read_bytes()) == (out / "seed-7" / "matrix" / "B" / "metrics.jsonl").read_bytes()
    # The published metrics answer the same paired comparison as the run's own.
    groups = sorted(p.name for p in (out / "seed-7" / "matrix").iterdir() if (p / "metrics.jsonl").is_file())
    assert matrix_minus_control(results / "seed-7" / "matrix", results / "seed-7" / "matrix", groups,
                                resamples=50) == matrix_minus_control(out / "seed-7" / "matrix",
                                                                      out / "seed-7" / "matrix", groups, resamples=50)
    assert not any(p.name in ("trajectories.jsonl", "adapter_model.safetensors", "config.json")
                   or p.name.endswith(".stage.json") for p in written)
    # Publishing again gives the same bytes (gzip without a timestamp).
    again = publish_results(out, tmp_path / "again")
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in written]
    with pytest.raises(InputError, match="summary.json: missing"):
        publish_results(tmp_path / "nothing", tmp_path / "r2")


def test_the_command_publishes_and_refuses_a_run_without_a_comparison(pipeline_run, tmp_path, capsys):
    out = pipeline_run
    assert publish.main([str(out), str(tmp_path / "results")]) == 0
    assert "files written under" in capsys.readouterr().out and (tmp_path / "results" / "summary.json").is_file()
    assert publish.main([str(tmp_path / "nothing"), str(tmp_path / "r2")]) == 2
    assert "summary.json: missing" in capsys.readouterr().err and publish.main([str(out)]) == 2


def test_publish_copies_the_record_of_a_stage_the_collapse_guard_stopped(tmp_path):
    run = tmp_path / "run"
    (run / "heldout").mkdir(parents=True)
    (run / "heldout" / "summary.json").write_text("{}")
    for seed in ("seed-1", "seed-2"):
        (run / seed / "grpo1").mkdir(parents=True)
        (run / seed / "grpo1" / "train_log.jsonl").write_text('{"step": 1}\n')
    stop = '{"step": 8, "reason": "ADD took more than 95% of the greedy evaluation\'s ops"}'
    (run / "seed-2" / "grpo1" / "collapse.json").write_text(stop)
    written = publish_results(run, tmp_path / "results")
    names = sorted(str(p.relative_to(tmp_path / "results")) for p in written)
    assert names == ["seed-1/grpo1/train_log.jsonl", "seed-2/grpo1/collapse.json", "seed-2/grpo1/train_log.jsonl",
                     "summary.json"]
    assert (tmp_path / "results" / "seed-2" / "grpo1" / "collapse.json").read_text() == stop

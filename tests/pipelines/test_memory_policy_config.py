"""Settings of the memory-policy pipeline config that would be silently ignored are refused at
load, naming the file (or the `--set`) and the key: a matrix seed that is not trained, and an
[episode.matrix] table (the pipeline sets the A-D matrix itself)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memsearch.config import load_config
from memsearch.errors import InputError
from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline

ROOT = Path(__file__).resolve().parents[2]
MP = ROOT / "configs" / "memory_policy_cpu.toml"


def _edited(tmp_path: Path, old: str, new: str) -> Path:
    text = MP.read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / MP.name
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


def _problem(path: Path | None, *overrides: str) -> str:
    with pytest.raises(InputError) as info:
        load_config(path or MP, list(overrides), model=MemoryPolicyPipeline)
    return str(info.value)


def test_a_matrix_seed_that_is_not_trained_is_refused_naming_the_key(tmp_path):
    path = _edited(tmp_path, "matrix_seeds = [1]", "matrix_seeds = [1, 4]")
    assert _problem(path).startswith(f"{path}: matrix_seeds: [4] not in seeds [1, 2, 3]: expected seeds that are "
                                     "trained")
    assert _problem(None, "matrix_seeds=[0]").startswith("--set matrix_seeds=[0]: matrix_seeds: [0] not in seeds")
    # a session that trains another seed alone says whether its seed gets the matrix
    assert _problem(None, "seeds=[2]").startswith(f"{MP}: matrix_seeds: [1] not in seeds [2]")
    assert load_config(MP, ["seeds=[2]", "matrix_seeds=[]"], model=MemoryPolicyPipeline).matrix_seeds == []
    assert load_config(MP, ["seeds=[2]", "matrix_seeds=[2]"], model=MemoryPolicyPipeline).matrix_seeds == [2]


@pytest.mark.parametrize("table", ['[episode.matrix.overrides.B.backends.memory]\nadapter = "x"',
                                   '[episode.matrix]\ngroups = ["A", "B"]'])
def test_an_episode_matrix_table_is_refused_since_the_pipeline_sets_the_matrix(tmp_path, table):
    path = _edited(tmp_path, "[teacher]", f"{table}\n\n[teacher]")
    assert _problem(path).startswith(f"{path}: episode.matrix: the pipeline runs the A-D matrix itself")


def test_every_problem_of_a_pipeline_config_is_reported_in_one_run():
    # Checks across fields run together (config.config_check): one refusal names them all.
    problem = _problem(None, "seeds=[1,1]", "matrix_seeds=[5]", 'grpo_start="base"', "schema_mode=false",
                       "grpo.steps=0", "sft.epochs=-1", 'episode.agent.controller="policy"')
    for key in ("episode.agent:", "matrix_seeds:", "seeds: [1, 1]: expected distinct seeds", "grpo_start:",
                "sft.epochs:", "grpo.steps:"):
        assert key in problem, (key, problem)


def test_a_trainer_table_is_typed_at_load_and_recorded_as_written():
    # A bad value in a table names its key path at load, even in stage 2's table while stage 2 is
    # off (it used to be checked only when the stage's config was built).
    assert _problem(None, "grpo.optim.lr=2.0").startswith(
        "--set grpo.optim.lr=2.0: grpo.optim.lr: Input should be less than or equal to 1")
    assert _problem(None, "stage2.grpo.optim.lr=-1").startswith(
        "--set stage2.grpo.optim.lr=-1: stage2.grpo.optim.lr: Input should be greater than 0")
    assert "grpo: model, eval.data set by the pipeline itself; remove them" in _problem(
        None, 'grpo.model="x"', 'grpo.eval.data="x"')
    cfg = load_config(MP, ["grpo.optim.lr=3e-6", "grpo.credit.invalid_decision_credit=false"],
                      model=MemoryPolicyPipeline)
    assert cfg.grpo.optim.lr == 3e-6 and cfg.grpo.optim.warmup_steps == 0 and cfg.grpo.reward.metric == "f1"
    # The record keeps what the file and --set wrote, not every default (as when tables were dicts).
    written = load_config(MP, [], model=MemoryPolicyPipeline).model_dump(mode="json")["grpo"]
    dumped = cfg.model_dump(mode="json")["grpo"]
    assert dumped == {**written, "optim": {**written.get("optim", {}), "lr": 3e-6},
                      "credit": {**written.get("credit", {}), "invalid_decision_credit": "none"}}
    assert cfg.grpo_config("t", 1, None).credit.invalid_decision_credit == "none"


def test_stage2_sft_is_the_sft_table_with_stage2s_keys_over_it_key_by_key():
    cfg = load_config(MP, ["stage2.enabled=true", 'stage2.start="sft"', "sft.optim.lr=1e-4", "sft.max_tokens=512",
                           "stage2.sft.optim.warmup_steps=2"], model=MemoryPolicyPipeline)
    first, second = cfg.sft_config(["r"], 1), cfg.stage2_sft_config(["r"], 1)
    assert (first.optim.lr, first.optim.warmup_steps, first.max_tokens) == (1e-4, 0, 512)
    # [stage2.sft]'s optim table replaces [sft]'s whole: lr back at its default, [sft]'s max_tokens kept
    assert (second.optim.lr, second.optim.warmup_steps, second.max_tokens, second.role) == (1e-5, 2, 512, "controller")


def test_a_backend_the_pipeline_composes_is_checked_like_one_written_in_a_file():
    # The base backend takes the episode memory backend's other settings: an openai-only one
    # would reach an hf backend, refused at load naming where it was set.
    served = ['episode.backends.memory.kind="openai"', 'episode.backends.memory.base_url="http://127.0.0.1:9/v1"']
    assert load_config(MP, served, model=MemoryPolicyPipeline).base_backend().kind == "hf"
    assert _problem(None, *served, "episode.backends.memory.extra_body={top_k=1}").startswith(
        "--set episode.backends.memory.extra_body={top_k=1}: episode.backends.memory.extra_body: read by kind "
        "'openai' only (an HTTP server); kind is 'hf'")

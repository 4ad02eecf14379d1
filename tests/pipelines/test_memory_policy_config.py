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

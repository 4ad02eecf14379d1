"""Config errors through the real CLI: a value of the wrong type (a bool for an int) given with
`--set` is refused with exit status 2 and a message naming the key and the flag, before anything is
written; every config error names its source (the `--set` or the file), the full key path and what
was expected, also for a file that is not UTF-8 and a trainer's episode_config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memsearch.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
CASES = [
    (["train", "grpo"], ROOT / "configs" / "train" / "grpo_cpu.toml", "steps=true", "steps"),
    (["train", "sft"], ROOT / "configs" / "train" / "sft_cpu.toml", "checkpoint_every=true", "checkpoint_every"),
    (["pipeline", "memagent"], ROOT / "configs" / "memagent.toml", "data.train_docs=true", "data.train_docs"),
    (["pipeline", "memory-policy"], ROOT / "configs" / "memory_policy_cpu.toml", "data.dev_questions=true",
     "data.dev_questions"),
    (["train", "grpo"], ROOT / "configs" / "train" / "grpo_cpu.toml", 'rollout.temperature="1.0"',
     "rollout.temperature"),
]


@pytest.mark.parametrize("command, config, override, key", CASES, ids=[f"{' '.join(c[0])}:{c[2]}" for c in CASES])
def test_a_wrong_type_given_with_set_exits_2_naming_the_key_and_writes_nothing(tmp_path, command, config, override,
                                                                              key):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [*command, "--config", str(config), "--out", str(out), "--set", override])
    assert result.exit_code == 2, result.output
    assert f"--set {override}" in result.output and key in result.output, result.output
    assert "valid" in result.output  # pydantic's 'Input should be a valid integer / number'
    assert not out.exists() and list(tmp_path.iterdir()) == []


# Every config error names its source: the `--set` that wrote the key (also one that adds a key the
# config has no table for, and one inside a pipeline's trainer table, validated as a trainer
# config), or the file; then the full key path and what was expected; never pydantic's ': : Value error'.
MP, MEMAGENT, GRPO = (ROOT / "configs" / name for name in ("memory_policy_cpu.toml", "memagent.toml",
                                                           "train/grpo_cpu.toml"))
SOURCES = [
    (["eval", "run", "--data", "nodata"], ROOT / "configs" / "rules.toml", "nosuch.key=1", "nosuch: unknown field"),
    (["train", "grpo"], GRPO, "nosuch.deep=1", "nosuch: unknown field"),
    (["train", "grpo"], GRPO, 'role="controller"', "role: 'controller' needs episode.agent.controller = 'policy'"),
    (["pipeline", "memory-policy"], MP, "grpo.nosuch=1", "grpo.nosuch: unknown field"),
    (["pipeline", "memory-policy"], MP, "sft.lora.r=0", "sft.lora.r: Input should be greater than or equal to 1"),
    (["pipeline", "memory-policy"], MP, "grpo.steps=true", "grpo.steps: Input should be a valid integer"),
    (["pipeline", "memory-policy"], MP, "seeds=[1, 1]", "seeds: [1, 1]: expected distinct seeds"),
    (["pipeline", "memagent"], MEMAGENT, "grpo.nosuch=1", "grpo.nosuch: unknown field"),
    (["pipeline", "memagent"], MEMAGENT, "data.docs=[1]", "data.docs: [1]: expected distinct numbers of documents"),
]


def _cli(*args):
    """The CLI run in process (exit status and stderr as a shell sees them)."""
    return CliRunner().invoke(app, [str(arg) for arg in args])


@pytest.mark.parametrize("command, config, override, problem", SOURCES,
                         ids=[f"{' '.join(c[0][:2])}:{c[2]}" for c in SOURCES])
def test_a_problem_a_set_caused_is_blamed_on_that_set_with_its_full_key_path(tmp_path, command, config, override,
                                                                             problem):
    run = _cli(*command, "--config", config, "--out", tmp_path / "out", "--set", override)
    assert run.exit_code == 2, run.stderr
    assert run.stderr.startswith(f"error: --set {override}: {problem}"), run.stderr
    assert ": : " not in run.stderr and "Value error" not in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "out").exists()


def _edited(tmp_path: Path, config: Path, old: str, new: str) -> Path:
    text = config.read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / config.name
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


@pytest.mark.parametrize("command, config, old, new, problem", [
    (["pipeline", "memory-policy"], MP, "[grpo]", "[grpo]\nnosuch = 1", "grpo.nosuch: unknown field"),
    (["pipeline", "memory-policy"], MP, "[sft.lora]\nr = 16", "[sft.lora]\nr = 0",
     "sft.lora.r: Input should be greater than or equal to 1"),
    (["pipeline", "memory-policy"], MP, 'controller = "fixed"', 'controller = "policy"',
     "episode.agent: the memory-policy pipeline trains decision memory on a fixed plan"),
    (["pipeline", "memagent"], MEMAGENT, "[grpo]\nsteps", "[grpo]\nrole = \"memory\"\nsteps",
     "grpo: role set by the pipeline itself"),
])
def test_a_problem_in_the_file_names_the_file_and_the_full_key_path(tmp_path, command, config, old, new, problem):
    path = _edited(tmp_path, config, old, new)
    run = _cli(*command, "--config", path, "--out", tmp_path / "out")
    assert run.exit_code == 2, run.stderr
    assert run.stderr.startswith(f"error: {path}: {problem}"), run.stderr
    assert ": : " not in run.stderr and "Value error" not in run.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", [["eval", "run", "--data", "nodata"], ["train", "grpo"],
                                     ["pipeline", "memory-policy"]])
def test_a_config_file_that_is_not_utf8_names_the_file(tmp_path, command):
    path = tmp_path / "latin1.toml"
    path.write_bytes('tokenizer = "café"\n'.encode("latin-1"))
    run = _cli(*command, "--config", path, "--out", tmp_path / "out")
    assert run.exit_code == 2, run.stderr
    assert run.stderr == f"error: {path}: not UTF-8 text (byte 0xe9 at offset 16); save the file as UTF-8\n"


@pytest.mark.parametrize("content, problem", [
    ('tokenizer = "café"\n'.encode("latin-1"), "not UTF-8 text (byte 0xe9 at offset 16)"),
    (b"[budgets\n", "invalid TOML"),
])
def test_an_unreadable_episode_config_of_a_trainer_names_that_file(tmp_path, content, problem):
    episode = tmp_path / "episode.toml"
    episode.write_bytes(content)
    run = _cli("train", "grpo", "--config", GRPO, "--out", tmp_path / "out",
               "--set", f"episode_config={json.dumps(str(episode))}")
    assert run.exit_code == 2, run.stderr
    assert run.stderr.startswith(f"error: {episode}: {problem}"), run.stderr


def test_a_check_of_the_whole_config_names_its_source_without_an_empty_key(tmp_path):
    """A validator of the whole config (no key to name) reads `file: what`, not `file: : Value error, what`."""
    from pydantic import model_validator

    from memsearch.config import StrictConfig, load_config
    from memsearch.errors import InputError

    class Pair(StrictConfig):
        low: int = 0
        high: int = 1

        @model_validator(mode="after")
        def _ordered(self):
            if self.low >= self.high:
                raise ValueError(f"low {self.low} >= high {self.high}: expected low < high")
            return self

    path = tmp_path / "pair.toml"
    path.write_text("low = 3\nhigh = 2\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_config(path, model=Pair)
    assert str(info.value) == f"{path}: low 3 >= high 2: expected low < high"
    with pytest.raises(InputError) as info:
        load_config(path, ["nosuch=1"], model=Pair)
    assert str(info.value) == "--set nosuch=1: nosuch: unknown field"

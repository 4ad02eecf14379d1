"""`--set` through the real CLI: a value of the wrong type (a bool for an int) is refused with
exit status 2 and a message naming the key and the flag, before anything is written."""

from __future__ import annotations

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
    (["train", "grpo"], ROOT / "configs" / "train" / "grpo_cpu.toml", 'temperature="1.0"', "temperature"),
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

"""A run folder whose config.json holds the flat backend form of earlier versions (every kind's
keys in every role's table) still resumes: the saved config is compared as it reads now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.config import legacy_backend_dump, load_config
from memsearch.errors import InputError
from memsearch.eval.runner import run_eval

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "configs" / "rules.toml"
FLAT_RULES = json.loads((ROOT / "tests" / "config" / "flat_backend_dumps.json").read_text())["rules"]["flat_dump"]


def _interrupted(out: Path, cfg, hotpot_dev_dir: Path, flat: dict) -> dict:
    """A finished run made to look like an interrupted one of an earlier version: its last
    trajectory gone, its config.json's backend tables in ``flat``."""
    straight = run_eval(cfg, hotpot_dev_dir, out, show_progress=False)
    lines = (out / "trajectories.jsonl").read_text().splitlines(keepends=True)
    (out / "trajectories.jsonl").write_text("".join(lines[:-1]))
    saved = json.loads((out / "config.json").read_text())
    roles = ("memory", "controller", "reader")
    assert all(legacy_backend_dump(saved["backends"][role]) == FLAT_RULES for role in roles)
    saved["backends"].update({role: flat for role in roles})
    (out / "config.json").write_text(json.dumps(saved, indent=2))
    return straight


def test_a_folder_with_a_flat_config_json_resumes(hotpot_dev_dir, tmp_path):
    cfg = load_config(RULES, ["limit=3"])
    straight = _interrupted(tmp_path / "run", cfg, hotpot_dev_dir, FLAT_RULES)
    resumed = run_eval(cfg, hotpot_dev_dir, tmp_path / "run", resume=True, show_progress=False)
    assert resumed.complete and resumed.tasks == straight.tasks
    for metric in ("em", "f1", "memory_support_recall", "retrieval_support_recall"):
        assert resumed.metrics[metric] == straight.metrics[metric]
    assert len((tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()) == 3


@pytest.mark.parametrize("changed", [{"max_retries": 3}, {"sampling": {"temperature": 0.0, "top_p": 1.0, "seed": 1}}])
def test_a_flat_config_json_of_another_run_is_still_refused(hotpot_dev_dir, tmp_path, changed):
    # A key of another kind at a value the flat form wrote only when set, or a setting the
    # kind reads, makes it another run.
    cfg = load_config(RULES, ["limit=2"])
    _interrupted(tmp_path / "run", cfg, hotpot_dev_dir, {**FLAT_RULES, **changed})
    with pytest.raises(InputError, match="config differs from the run being resumed"):
        run_eval(cfg, hotpot_dev_dir, tmp_path / "run", resume=True, show_progress=False)

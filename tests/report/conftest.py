"""Real runs for the report tests: the rules matrix (A-D) and a second single run on the shared
40-question data folder, made once per session (a few seconds)."""

from __future__ import annotations

import pytest

from memsearch.assets.samples import config_path
from memsearch.config import load_config
from memsearch.eval.matrix import run_matrix
from memsearch.eval.runner import run_eval


@pytest.fixture(scope="session")
def rules_matrix(hotpot_dev_dir, tmp_path_factory):
    """A finished rules matrix folder (groups A-D) on the shared data folder."""
    out = tmp_path_factory.mktemp("report") / "matrix"
    run_matrix(load_config(config_path("rules.toml"), ["matrix.bootstrap_resamples=200"]), hotpot_dev_dir, out,
               show_progress=False)
    return out


@pytest.fixture(scope="session")
def short_memory_run(hotpot_dev_dir, tmp_path_factory):
    """Group B's agent with a tiny memory budget: it answers fewer questions right than group B,
    so comparing B with it has regressions (and possibly improvements) to find."""
    out = tmp_path_factory.mktemp("report") / "short-memory"
    cfg = load_config(config_path("rules.toml"), ["budgets.memory_tokens=40"])
    run_eval(cfg, hotpot_dev_dir, out, show_progress=False)
    return out

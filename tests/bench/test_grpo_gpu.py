"""bench/grpo_gpu.py's CPU path (``--device cpu --shape tiny``): the whole script runs and its
RESULT line carries every field, with positive numbers where a side ran."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from memsearch.assets.samples import repository_root

_REPO = repository_root()

FIELDS = ("ours_rollout_tok_s", "ours_update_tok_s", "ours_peak_mem_gib",
          "trl_rollout_tok_s", "trl_update_tok_s", "trl_peak_mem_gib")


@pytest.mark.slow
def test_tiny_cpu_run_prints_a_full_result_line():
    try:
        import trl  # noqa: F401  (the dev group has it; without it the TRL fields are n/a)

        have_trl = True
    except ImportError:
        have_trl = False
    done = subprocess.run([sys.executable, str(_REPO / "bench" / "grpo_gpu.py"), "--device", "cpu", "--shape", "tiny"],
                          capture_output=True, text=True, timeout=600, cwd=_REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT "), last
    got = dict(item.split("=", 1) for item in last.split()[1:])
    assert got["shape"] == "tiny" and got["device"] == "cpu" and got["steps"] == "2"
    assert got["vocab"] == "49152"  # the embedded SmolLM2 tokenizer
    for field in FIELDS:
        if field.startswith("trl_") and not have_trl:
            assert got[field] == "n/a"
        else:
            assert float(got[field]) > 0, (field, last)
    assert "TRL skipped" not in done.stdout if have_trl else "TRL skipped" in done.stdout

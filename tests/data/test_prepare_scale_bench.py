"""bench/prepare_scale.py runs end to end on small arrays and prints its RESULT line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_prepare_scale_bench_prints_its_result():
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "prepare_scale.py"), "--small", "30", "--large", "300"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "300 tasks" in run.stdout and "30 tasks" in run.stdout
    last = run.stdout.strip().splitlines()[-1]
    pattern = r"RESULT records_ratio=10 time_ratio=[\d.]+ peak_rss_mb=\d+ cpu_ratio=[\d.]+ large_s=\d+"
    assert re.fullmatch(pattern, last), last

"""The reliability suite's ledger: every scenario test records what it ran and what it found
(runs, tasks lost, tasks duplicated, wrong exit codes, files touched outside the run folder;
a test that fails any other check
counts under "failed tests") here, and ``conftest.py`` prints the table
at the end of the session:

    uv run pytest tests/reliability -q -s

The counts are measured from the run folders and exit statuses by the tests themselves (they
record first, then assert that every count is zero), so the table is what happened, not a
restatement of which tests passed. Also holds the run-folder checks the scenarios share.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "configs" / "rules.toml"
API = ROOT / "configs" / "api.toml"
EXE = Path(sys.executable).parent / "memsearch"
ROLES = ("memory", "controller", "reader")
# Backends configs/api.toml serves over HTTP: the call roles and the matrix's A/C memory.
SERVED = (*ROLES, "baseline_memory")
# What legitimately differs between an interrupted-and-resumed run and an uninterrupted one:
# wall/CPU time, and transport statistics (attempts and retries depend on where a run was cut).
VOLATILE_SUMMARY_KEYS = ("timing", "backend_stats")


@dataclass
class Row:
    runs: int = 0
    lost: int = 0
    duplicated: int = 0
    wrong_exit: int = 0
    outside: int = 0  # files created, changed or removed outside the run's own folder
    failed_tests: int = 0
    seconds: float = 0.0


class Ledger:
    def __init__(self) -> None:
        self.rows: OrderedDict[str, Row] = OrderedDict()
        self.started = time.perf_counter()
        self.by_test: dict[str, set[str]] = {}
        self.current: str | None = None

    def test_failed(self, nodeid: str) -> None:
        """A test that recorded into some scenarios failed one of its other checks (records
        differ from the uninterrupted run, a folder was left behind, ...): count it there."""
        for scenario in self.by_test.get(nodeid, ()):
            self.rows[scenario].failed_tests += 1

    def record(self, scenario: str, *, runs: int = 1, lost: int = 0, duplicated: int = 0, wrong_exit: int = 0,
               outside: int = 0, seconds: float = 0.0, failed_tests: int = 0) -> None:
        """Add one scenario's counts. ``failed_tests``: a check of the scenario that failed, for a
        test outside tests/reliability (there the hook counts a failed test by itself)."""
        row = self.rows.setdefault(scenario, Row())
        if self.current is not None:
            self.by_test.setdefault(self.current, set()).add(scenario)
        row.runs += runs
        row.lost += lost
        row.duplicated += duplicated
        row.wrong_exit += wrong_exit
        row.outside += outside
        row.seconds += seconds
        row.failed_tests += failed_tests

    def dump(self) -> dict[str, dict[str, float]]:
        """The rows as plain data: a pytest-xdist worker hands them to the controller."""
        return {name: vars(row) for name, row in self.rows.items()}

    def merge(self, rows: dict[str, dict[str, float]]) -> None:
        """Add a worker's ``dump()`` to this ledger (the controller prints the sum)."""
        for name, counts in rows.items():
            row = self.rows.setdefault(name, Row())
            for key, value in counts.items():
                setattr(row, key, getattr(row, key) + value)

    def table(self) -> str:
        head = ("scenario", "runs", "tasks lost", "tasks duplicated", "wrong exit codes",
                "files touched outside the run folder", "failed tests")
        rows = [*self.rows.items(), ("TOTAL", self._total())]
        body = [
            (name, str(r.runs), str(r.lost), str(r.duplicated), str(r.wrong_exit), str(r.outside), str(r.failed_tests))
            for name, r in rows
        ]
        widths = [max(len(row[i]) for row in (head, *body)) for i in range(len(head))]
        def fmt(row):
            return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"

        lines = [fmt(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(fmt, body)]
        return "\n".join(lines)

    def _total(self) -> Row:
        t = Row()
        for r in self.rows.values():
            t.runs += r.runs
            t.lost += r.lost
            t.duplicated += r.duplicated
            t.wrong_exit += r.wrong_exit
            t.outside += r.outside
            t.failed_tests += r.failed_tests
        return t

    def result_line(self) -> str:
        t = self._total()
        ok = t.lost == t.duplicated == t.wrong_exit == t.outside == t.failed_tests == 0
        return (
            f"RESULT reliability scenarios={len(self.rows)} runs={t.runs} tasks_lost={t.lost} "
            f"tasks_duplicated={t.duplicated} wrong_exit_codes={t.wrong_exit} outside_writes={t.outside} "
            f"failed_tests={t.failed_tests} "
            f"wall_s={time.perf_counter() - self.started:.1f} {'OK' if ok else 'FAIL'}"
        )


LEDGER = Ledger()


# ----------------------------------------------------------------------------- run folders


def tree_state(root: Path, exclude: tuple[Path, ...] = ()) -> dict[str, tuple[int, int, int]]:
    """(size, mtime_ns, mode) of every path under ``root`` except those under ``exclude``
    (symlinks not followed): compare two states with ``changed_paths``."""
    state = {}
    skip = [p.resolve() for p in exclude]
    for path in [root, *root.rglob("*")]:
        if any(path.resolve() == s or s in path.resolve().parents for s in skip):
            continue
        st = path.lstat()
        state[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return state


def changed_paths(before: dict[str, tuple[int, int, int]], after: dict[str, tuple[int, int, int]]) -> list[str]:
    """Paths created, removed or changed between two ``tree_state`` snapshots."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def raw_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of a JSON-lines file, duplicates kept (a reader that keeps the
    last line per id would hide a duplicate)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def lost_and_duplicated(folder: Path, expected_ids: list[str]) -> tuple[int, int]:
    """Tasks missing from, and lines repeated in, trajectories.jsonl and metrics.jsonl: each
    expected task must have exactly one line in each (a task in neither counts once)."""
    lost, duplicated = 0, 0
    files = [[t["task_id"] for t in raw_lines(folder / name)] for name in ("trajectories.jsonl", "metrics.jsonl")]
    for tid in expected_ids:
        counts = [ids.count(tid) for ids in files]
        lost += 1 if min(counts) == 0 else 0
        duplicated += sum(max(c - 1, 0) for c in counts)
    duplicated += sum(1 for ids in files for tid in ids if tid not in set(expected_ids))
    return lost, duplicated


def comparable_summary(path: Path) -> dict[str, Any]:
    """summary.json without timing and transport statistics, and with the loopback server's
    port (each test server gets a fresh one) replaced."""
    summary = json.loads(re.sub(r"http://127\.0\.0\.1:\d+", "http://127.0.0.1:PORT", path.read_text(encoding="utf-8")))
    for key in VOLATILE_SUMMARY_KEYS:
        summary.pop(key, None)
    summary["metrics"].pop("latency_s", None)
    return summary


def comparable_metrics(path: Path) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "latency_s"} for r in raw_lines(path)]


def without_wallclock(obj: Any) -> Any:
    """``obj`` without wall-clock fields (``*latency*``, ``*_s``, ``timing``) and with the
    loopback server's port replaced."""
    if isinstance(obj, dict):
        return {
            k: without_wallclock(v)
            for k, v in obj.items()
            if "latency" not in k and not k.endswith("_s") and k != "timing"
        }
    if isinstance(obj, list):
        return [without_wallclock(v) for v in obj]
    if isinstance(obj, str):
        return re.sub(r"http://127\.0\.0\.1:\d+", "http://127.0.0.1:PORT", obj)
    return obj


def comparable_trajectories(path: Path) -> dict[str, Any]:
    """Trajectories by task id without wall-clock fields (order follows completion, not tasks)."""
    return {t["task_id"]: without_wallclock(t) for t in raw_lines(path)}


def task_ids(data_dir: Path, limit: int) -> list[str]:
    return [t["id"] for t in raw_lines(data_dir / "tasks.jsonl")][:limit]


def api_sets(url: str, *extra: str) -> list[str]:
    return ['tokenizer="lexical"', *[f'backends.{r}.base_url="{url}"' for r in SERVED], *extra]


def cli_args(
    command: str, config: Path, data: Path, out: Path, limit: int, sets: list[str], resume: bool = False
) -> list[str]:
    """The command line of ``command``: "eval" (`memsearch eval run`) or "matrix" (`memsearch eval matrix`)."""
    verb = {"eval": "run", "matrix": "matrix"}[command]
    args = [
        str(EXE),
        "eval",
        verb,
        "--config",
        str(config),
        "--data",
        str(data),
        "--out",
        str(out),
        "--limit",
        str(limit),
    ]
    for s in sets:
        args += ["--set", s]
    return args + (["--resume"] if resume else [])


def run_cli(args: list[str], timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=full_env, check=False)

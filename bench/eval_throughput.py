"""Eval throughput against a fast model server: does concurrency deliver the ideal speed-up?

A local OpenAI-compatible server (``python -m memsearch.testing.agent_server``, its own
process, real HTTP on loopback) answers every call with a valid action after a fixed 200 ms
delay. We run 200 real HotpotQA dev tasks of group D (decision memory + policy controller) at
concurrency 1 and 64 and compare the time of the episode phase with the ideal: each episode
is a chain of sequential calls, and episodes are handed to ``c`` slots in task order, so the
ideal is the makespan of that schedule with zero overhead (delay x calls per chain; with 200
tasks of 4 calls at c=64 that is ceil(200/64) = 4 waves x 4 x 0.2 s = 3.2 s).

Target: achieved >= 0.8 of ideal at concurrency 64. Run: uv run python bench/eval_throughput.py
"""

from __future__ import annotations

import heapq
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from memsearch.assets.samples import HOTPOT_DEV, config_path, samples_dir
from memsearch.config import load_config
from memsearch.data.dataset import save_dataset
from memsearch.data.hotpot import convert_hotpot
from memsearch.eval.runner import run_eval
from memsearch.io import iter_jsonl

TASKS, DELAY_S = 200, 0.2


def ideal_makespan(chains: list[int], slots: int, delay: float) -> float:
    """Finish time of chains handed in order to the first free of ``slots`` workers."""
    free = [0.0] * min(slots, len(chains))
    for calls in chains:
        start = heapq.heappop(free)
        heapq.heappush(free, start + calls * delay)
    return max(free)


def start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "memsearch.testing.agent_server", "--port", str(port),
                             "--delay-ms", str(DELAY_S * 1000)], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(100):
        try:
            urllib.request.urlopen(urllib.request.Request(f"{url}/chat/completions", data=b"{}"), timeout=2)
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("agent server did not start")


def run(concurrency: int, data: Path, work: Path, url: str) -> tuple[float, list[int]]:
    overrides = [f"limit={TASKS}", 'tokenizer="lexical"', f"concurrency={concurrency}",
                 'agent.memory="decision"', 'agent.controller="policy"']
    for role in ("memory", "controller", "reader"):
        overrides += [f'backends.{role}.base_url="{url}"', f"backends.{role}.max_concurrency={concurrency}"]
    out = work / f"c{concurrency}"
    summary = run_eval(load_config(config_path("api.toml"), overrides), data, out, group="D", show_progress=False)
    assert summary.complete and summary.request_errors == 0, summary.note
    by_id = {t["task_id"]: t["counts"]["policy_calls"] for _, t in iter_jsonl(out / "trajectories.jsonl")}
    chains = [by_id[t["id"]] for _, t in iter_jsonl(data / "tasks.jsonl")][:TASKS]
    return summary.timing["episodes_wall_s"], chains


def main() -> None:
    proc, url = start_server()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            data = work / "dev"
            save_dataset(convert_hotpot(samples_dir() / HOTPOT_DEV, split="dev", limit=TASKS), data)
            results = {}
            for c in (1, 64):
                print(f"running {TASKS} tasks at concurrency {c} ...", flush=True)
                wall, chains = run(c, data, work, url)
                ideal = ideal_makespan(chains, c, DELAY_S)
                results[c] = {"wall_s": wall, "ideal_s": ideal, "tasks_per_s": TASKS / wall}
                print(
                    f"concurrency {c:>2}: {sum(chains)} calls (chain {min(chains)}-{max(chains)}), episodes "
                    f"{wall:.2f}s, "
                    f"ideal {ideal:.2f}s, {TASKS / wall:.2f} tasks/s, fraction of ideal {ideal / wall:.3f}",
                    flush=True,
                )
    finally:
        proc.terminate()
        proc.wait()
    print(json.dumps({"speedup_64_vs_1": round(results[1]["wall_s"] / results[64]["wall_s"], 2)}))
    fraction = results[64]["ideal_s"] / results[64]["wall_s"]
    print(f"RESULT ideal_fraction={fraction:.3f} tasks_per_s={results[64]['tasks_per_s']:.2f}")


if __name__ == "__main__":
    main()

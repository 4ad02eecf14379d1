"""Eval throughput against a fast model server: does concurrency deliver the ideal speed-up?

A local OpenAI-compatible server (memsearch.testing.agent_server, real HTTP on loopback)
answers every call with a valid action after a fixed 200 ms delay. We run 200 real HotpotQA dev
tasks of group D (decision memory + policy controller) at concurrency 1 and 64 and compare the
time of the episode phase with the ideal: each episode is a chain of sequential calls, so

    ideal(c) = delay * max(longest chain, total calls / c)

Target: achieved >= 0.8 of ideal at concurrency 64. Run: uv run python bench/eval_throughput.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from memsearch.config import load_config
from memsearch.data.dataset import save_dataset
from memsearch.data.hotpot import convert_hotpot
from memsearch.eval.runner import run_eval
from memsearch.io import iter_jsonl
from memsearch.samples import HOTPOT_DEV, config_path, samples_dir
from memsearch.testing.agent_server import AgentServer

TASKS, DELAY_S = 200, 0.2


def run(concurrency: int, data: Path, work: Path, url: str) -> tuple[float, list[int]]:
    overrides = [f"limit={TASKS}", 'tokenizer="lexical"', f"concurrency={concurrency}",
                 'agent.memory="decision"', 'agent.controller="policy"']
    for role in ("memory", "controller", "reader"):
        overrides += [f'backends.{role}.base_url="{url}"', f"backends.{role}.max_concurrency={concurrency}"]
    out = work / f"c{concurrency}"
    summary = run_eval(load_config(config_path("api.toml"), overrides), data, out, group="D", show_progress=True)
    assert summary["complete"] and summary["request_errors"] == 0, summary["note"]
    chains = [t["counts"]["policy_calls"] for _, t in iter_jsonl(out / "trajectories.jsonl")]
    return summary["timing"]["episodes_wall_s"], chains


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, AgentServer(delay_s=DELAY_S) as server:
        work = Path(tmp)
        data = work / "dev"
        save_dataset(convert_hotpot(samples_dir() / HOTPOT_DEV, split="dev", limit=TASKS), data)
        results = {}
        for c in (1, 64):
            wall, chains = run(c, data, work, server.base_url)
            ideal = DELAY_S * max(max(chains), sum(chains) / c)
            results[c] = {"wall_s": wall, "ideal_s": ideal, "tasks_per_s": TASKS / wall, "calls": sum(chains)}
            print(f"concurrency {c:>2}: {TASKS} tasks, {sum(chains)} calls (chain {min(chains)}-{max(chains)}), "
                  f"episodes {wall:.2f}s, ideal {ideal:.2f}s, {TASKS / wall:.2f} tasks/s, fraction of ideal {ideal / wall:.3f}")
        print(f"server saw at most {server.max_in_flight} requests in flight")
        speedup = results[1]["wall_s"] / results[64]["wall_s"]
        print(json.dumps({"speedup_64_vs_1": round(speedup, 2)}))
        fraction = results[64]["ideal_s"] / results[64]["wall_s"]
        print(f"RESULT ideal_fraction={fraction:.3f} tasks_per_s={results[64]['tasks_per_s']:.2f}")


if __name__ == "__main__":
    main()

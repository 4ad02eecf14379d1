"""MemAgent's recurrent memory has linear cost: time grows with the chunks read, memory does not.

The agent of ``configs/memagent.toml`` (evidence "stream", memory "overwrite", controller
"exhaust") reads RULER-HQA-style contexts chunk by chunk: every chunk is one call whose prompt
is the question + the bounded memory + one chunk, so the cost per chunk should not depend on
how long the context is, and nothing held in memory should grow with it.

What it does:

1. builds RULER-HQA-style sets at N = 50, 200, 800 documents (``memsearch.data.ruler``, seed
   42) from the shipped HotpotQA dev sample (all 1000 examples as the distractor pool);
2. runs each (backend, N) as its own ``python -m memsearch.cli.app eval run`` child process (the eval
   code path: ``run_eval`` -> ``run_episode``), one after another, and reads that child's peak
   RSS from ``os.wait4`` (so every N starts fresh and nothing of one case lingers in the next);
3. per case reports: chunks read and chunks cut by ``max_chunks`` (from the run's metrics and
   summary), tokens read, wall time and CPU time of the episode phase (the summary's
   ``episodes_wall_s`` / ``episodes_cpu_s``: model loading excluded), CPU seconds per chunk,
   and the child's peak RSS.

Time ratios use CPU seconds of the episode phase (all threads of the child). The machine this
was written on has 2 cores shared with other people's jobs: in one full run the wall time of a
single embedded-model chunk ranged from 31 to 95 s as their load came and went, while CPU
seconds per chunk stayed within 10%. Wall times are printed too (``wall_s``, ``wall_ratio``).

Two backends, every role on the same backend, tokenizer "embedded" (so chunk counts agree):

- ``rules``: the first 5 questions (``--questions``) with the recipe's budgets: chunk 2048,
  memory 1024, policy 1024, answer 256 tokens. Its memory starts empty and grows by a few
  sentences per chunk up to the 1024-token cap, and a chunk's cost grows with it (tokenizing
  the prompt: ~22 ms per chunk with an empty memory, ~37 ms with 900 tokens), so cost per
  chunk rises with N until the memory is full and is bounded after that.
- ``hf``: the embedded SmolLM2-135M-Instruct on the CPU, the first question
  (``--hf-questions``), chunk 2048 as the recipe, and small outputs so decoding does not
  dominate: memory 128 tokens, at most 32 tokens written per memory call and 32 for the answer
  (``--memory-tokens``, ``--policy-tokens``, ``--answer-tokens``). Greedy decoding.

``max_chunks`` is 128 (``--max-chunks``) so nothing is cut at N = 800 (~122K tokens = 60
chunks); the table prints the count cut either way. Episodes run one at a time (concurrency
1), so time and memory are those of one episode. Answer quality (sub_em) is printed as a
sanity check only: with 32-token memories the small model is not being evaluated here.

Cost: the hf run is prefill-bound and NOT a few minutes. Each chunk is a ~2.2K-token prompt
(~10-15 s on an idle 2-core CPU at 150-220 prompt tokens/s, ~40 CPU s with both threads), and
the three sizes read 4 + 16 + 59 chunks: ~20 min on an idle 2-core CPU, 76 min measured while
other jobs shared it. No setting that keeps 2048-token chunks and reads the whole 800-document
context (~120K tokens) with the model is much shorter. ``--backends rules`` alone takes about a
minute; ``--hf-docs`` runs the model on fewer sizes (RESULT then prints n/a for a missing one).

Target: CPU seconds per chunk flat (time ratio 800/200 close to the chunk ratio 800/200, ~4)
and peak memory flat (ratio 800/50 close to 1). The last line is for the hf run:

    RESULT time_ratio_800_200=<x> chunk_ratio_800_200=<y> peak_mem_ratio_800_50=<z>

Run: uv run python bench/memagent_scaling.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memsearch.assets.samples import HOTPOT_DEV, config_path, samples_dir
from memsearch.data.dataset import save_dataset
from memsearch.data.hotpot import convert_hotpot
from memsearch.data.ruler import prepare_ruler
from memsearch.io import iter_jsonl

ROLES = ("memory", "controller", "reader")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default="rules,hf", help="comma-separated, run in this order (default rules,hf)")
    p.add_argument("--docs", default="50,200,800", help="documents per context for the rules run")
    p.add_argument("--hf-docs", default=None, help="documents per context for the hf run (default: --docs)")
    p.add_argument("--questions", type=int, default=5, help="questions in the rules run")
    p.add_argument("--hf-questions", type=int, default=1, help="questions in the hf run")
    p.add_argument("--chunk-tokens", type=int, default=2048, help="tokens per chunk (both runs; the recipe's 2048)")
    p.add_argument(
        "--max-chunks", type=int, default=128, help="chunks read at most (both runs); the rest is counted as cut"
    )
    p.add_argument(
        "--memory-tokens", type=int, default=128, help="hf run: memory limit (the rules run keeps the recipe's 1024)"
    )
    p.add_argument("--policy-tokens", type=int, default=32, help="hf run: tokens written per memory call")
    p.add_argument("--answer-tokens", type=int, default=32, help="hf run: tokens of the final answer")
    p.add_argument("--keep", type=Path, default=None, help="keep the data and run folders here (a new folder)")
    return p.parse_args()


def sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def cases(args: argparse.Namespace) -> list[tuple[str, int, int, list[str]]]:
    """(backend, N, questions, ``--set`` overrides of configs/memagent.toml) in run order."""
    common = [f"budgets.chunk_tokens={args.chunk_tokens}", f"budgets.max_chunks={args.max_chunks}", "concurrency=1"]
    plans = {
        "rules": (sizes(args.docs), args.questions, [f'backends.{r}.kind="rules"' for r in ROLES]),
        "hf": (
            sizes(args.hf_docs or args.docs),
            args.hf_questions,
            [
                f"budgets.memory_tokens={args.memory_tokens}",
                f"budgets.policy_tokens={args.policy_tokens}",
                f"budgets.answer_tokens={args.answer_tokens}",
            ],
        ),
    }
    out = []
    for backend in args.backends.split(","):
        if backend not in plans:
            raise SystemExit(f"--backends: unknown backend {backend!r}; expected rules and/or hf")
        docs, questions, extra = plans[backend]
        out += [(backend, n, questions, common + extra) for n in docs]
    return out


def run_case(data: Path, out: Path, questions: int, overrides: list[str]) -> dict:
    """One ``memsearch eval`` in a fresh child; its own peak RSS via ``wait4`` (not the max
    over all children that ``RUSAGE_CHILDREN`` gives)."""
    cmd = [
        sys.executable,
        "-m",
        "memsearch.cli.app",
        "eval",
        "run",
        "--config",
        str(config_path("memagent.toml")),
        "--data",
        str(data),
        "--out",
        str(out),
        "--limit",
        str(questions),
    ]
    for item in overrides:
        cmd += ["--set", item]
    log = out.with_suffix(".log")
    started = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; Popen must not wait again
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    if not summary["complete"] or summary["request_errors"]:
        raise SystemExit(f"{out}: {summary['note']} ({summary['request_errors']} request errors)")
    rows = [row for _, row in iter_jsonl(out / "metrics.jsonl")]
    trajectories = [t for _, t in iter_jsonl(out / "trajectories.jsonl")]
    read = [sum(e["tokens"] for e in t["events"] if e["type"] == "chunk") for t in trajectories]
    # One memory call per chunk; its median latency is robust to bursts of load from other processes.
    latencies = [
        e["latency_s"]
        for t in trajectories
        for e in t["events"]
        if e["type"] == "policy_call" and e["role"] == "memory"
    ]
    chunks = sum(r["chunks"] for r in rows)
    timing = summary["timing"]
    return {
        "chunks": chunks,
        "chunks_cut": summary["truncation"]["chunks_cut"],
        "read_whole_context": summary["truncation"]["read_whole_context"],
        "tokens_read_per_question": sum(read) / len(read),
        "wall_s": timing["episodes_wall_s"],
        "cpu_s": timing["episodes_cpu_s"],
        "cpu_s_per_chunk": timing["episodes_cpu_s"] / chunks,
        "median_chunk_call_s": statistics.median(latencies),
        "process_s": time.perf_counter() - started,
        "process_cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,  # Linux reports KiB
        "sub_em": summary["metrics"]["sub_em"],
    }


COLUMNS = (  # header, width, format of one result
    ("backend", 7, None),
    ("N", 4, None),
    ("tok/q", 7, lambda r: f"{r['tokens_read_per_question']:.0f}"),
    ("chunks", 6, lambda r: r["chunks"]),
    ("cut", 4, lambda r: r["chunks_cut"]),
    ("whole", 5, lambda r: r["read_whole_context"]),
    ("wall_s", 8, lambda r: f"{r['wall_s']:.2f}"),
    ("med_call", 8, lambda r: f"{r['median_chunk_call_s']:.3f}"),
    ("cpu_s", 8, lambda r: f"{r['cpu_s']:.2f}"),
    ("cpu/chunk", 9, lambda r: f"{r['cpu_s_per_chunk']:.3f}"),
    ("peak_MiB", 8, lambda r: f"{r['peak_rss_mib']:.0f}"),
    ("sub_em", 6, lambda r: f"{r['sub_em']:.2f}"),
)


def print_table(results: dict[str, dict[int, dict]]) -> None:
    print(" ".join(f"{h:>{w}}" for h, w, _ in COLUMNS))
    for backend, by_n in results.items():
        for n, r in by_n.items():
            cells = [backend, n] + [fmt(r) for _, _, fmt in COLUMNS[2:]]
            print(" ".join(f"{str(c):>{w}}" for c, (_, w, _) in zip(cells, COLUMNS)))
    print(
        "tok/q: context tokens read per question; cut: chunks cut by max_chunks; whole: the summary's "
        "read_whole_context;\n"
        "wall_s / cpu_s: wall and CPU seconds of the episode phase (model loading excluded); med_call: median wall\n"
        "seconds of one memory call (one chunk); peak_MiB: the child process's peak RSS"
    )


def ratio(results: dict[int, dict], key: str, a: int, b: int) -> str:
    if a not in results or b not in results:
        return "n/a"
    return f"{results[a][key] / results[b][key]:.2f}"


def main() -> None:
    args = parse_args()
    plan = cases(args)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=args.keep is None)
        all_docs = sorted({n for _, n, _, _ in plan})
        print(f"preparing RULER-HQA-style sets N={all_docs} from the shipped HotpotQA dev sample ...", flush=True)
        save_dataset(convert_hotpot(samples_dir() / HOTPOT_DEV, split="dev"), work / "dev")
        prepare_ruler(
            work / "dev",
            work / "ruler",
            all_docs,
            seed=42,
            limit=max(q for _, _, q, _ in plan),
            tokenizer=None,
            show_progress=False,
        )
        results: dict[str, dict[int, dict]] = {}
        for backend, n, questions, overrides in plan:
            print(
                f"{backend} N={n}: {questions} question(s), " + " ".join(o for o in overrides if "kind" not in o),
                flush=True,
            )
            res = run_case(work / "ruler" / f"docs{n}", work / f"{backend}-docs{n}", questions, overrides)
            results.setdefault(backend, {})[n] = res
            print(
                f"  {res['chunks']} chunks in {res['wall_s']:.1f}s wall, {res['cpu_s']:.1f}s CPU "
                f"({res['cpu_s_per_chunk']:.3f} CPU s/chunk), peak RSS {res['peak_rss_mib']:.0f} MiB; "
                f"whole process {res['process_s']:.1f}s wall / {res['process_cpu_s']:.1f}s CPU",
                flush=True,
            )

    print()
    print_table(results)
    lines = {}
    for backend, by_n in results.items():
        lines[backend] = (
            f"time_ratio_800_200={ratio(by_n, 'cpu_s', 800, 200)} "
            f"chunk_ratio_800_200={ratio(by_n, 'chunks', 800, 200)} "
            f"peak_mem_ratio_800_50={ratio(by_n, 'peak_rss_mib', 800, 50)}"
        )
        print(
            f"{backend}: {lines[backend]} cpu_per_chunk_ratio_800_200={ratio(by_n, 'cpu_s_per_chunk', 800, 200)} "
            f"wall_ratio_800_200={ratio(by_n, 'wall_s', 800, 200)} "
            f"median_call_wall_ratio_800_200={ratio(by_n, 'median_chunk_call_s', 800, 200)}"
        )
    print("(time_ratio: CPU seconds of the episode phase; wall_ratio: the same in wall seconds)")
    final = "hf" if "hf" in lines else next(iter(lines))
    if final != "hf":
        print(f"(no hf run: the RESULT line is the {final} run's)")
    print(f"RESULT {lines[final]}")


if __name__ == "__main__":
    main()

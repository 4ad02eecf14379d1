"""Benchmark: dynamic batching in the ``hf`` backend (embedded SmolLM2-135M-Instruct).

    uv run python bench/hf_batching.py

Workload: 16 agent-like reader prompts built from the shipped HotpotQA dev sample: for each of
the first questions whose prompt lands in 300-500 tokens, the question with 2-3 of its context
paragraphs (the supporting ones first), asking for a short answer, formatted with the model's
chat template. Each call generates exactly 64 new tokens, greedy: the backend is built with
``ignore_eos=True`` (EOS does not end a row), so every way of running does the same work.

Three ways, same backend, same prompts:
  (a) sequential: the 16 ``generate`` calls one after another;
  (b) dynamic:    16 concurrent ``generate`` calls (asyncio.gather), batched by the backend;
  (c) static:     one batched generation over the 16 prompts, calling the backend's batched
                  decoder directly (``generate_sync``; no queue, no event loop) -- the best this
                  model does on this machine.
Throughput = generated tokens / wall time of the whole phase (prefill included); each phase
also prints this process's CPU time per wall second and the host's load average, because other
processes on a shared machine slow phases down unevenly. The greedy
completions of the three ways are compared too. Targets: dynamic >= 2x sequential and >= 0.8x
static. Uses torch's default thread count. The last line is machine-readable:

    RESULT batch_speedup=<dynamic/sequential> static_fraction=<dynamic/static>
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import time
from pathlib import Path

import torch

from memsearch.backends.base import GenerationRequest, SamplingParams
from memsearch.backends.hf.backend import HFBackend

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "samples" / "hotpotqa" / "dev_distractor_sample.json"
N_PROMPTS = 16
NEW_TOKENS = 64
MIN_TOKENS, MAX_TOKENS = 300, 500
SYSTEM = (
    "You answer multi-hop questions using only the evidence given. "
    "Reply with a short answer: a few words, no explanation."
)


def build_prompts(backend: HFBackend) -> list[tuple[tuple[dict[str, str], ...], int]]:
    """(messages, prompt token count) for the first N_PROMPTS questions that fit the token range."""
    rows = json.loads(SAMPLE.read_text())
    prompts = []
    for row in rows:
        paragraphs = {title: "".join(sentences) for title, sentences in row["context"]}
        gold = list(dict.fromkeys(title for title, _ in row["supporting_facts"]))
        others = [title for title in paragraphs if title not in gold]
        for extra in (0, 1):
            titles = gold[:2] + others[:extra]
            evidence = "\n".join(f"[{i + 1}] {t}: {paragraphs[t]}" for i, t in enumerate(titles))
            messages = (
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Evidence:\n{evidence}\n\nQuestion: {row['question']}\nShort answer:"},
            )
            n = len(backend.prompt_ids(GenerationRequest(role="reader", messages=messages)))
            if MIN_TOKENS <= n <= MAX_TOKENS:
                prompts.append((messages, n))
                break
            if n > MAX_TOKENS:
                break
        if len(prompts) == N_PROMPTS:
            return prompts
    raise SystemExit(f"only {len(prompts)} prompts in {MIN_TOKENS}-{MAX_TOKENS} tokens")


def requests_for(prompts) -> list[GenerationRequest]:
    sampling = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
    return [GenerationRequest(role="reader", messages=m, sampling=sampling) for m, _ in prompts]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Phase:
    """Wall time, this process's CPU time and the host's load around one phase. Other
    processes on the machine slow a phase down; cpu/wall and the load show when that happened."""

    def __enter__(self):
        self.load0, self.cpu0, self.t0 = os.getloadavg()[0], cpu_seconds(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self.cpu = cpu_seconds() - self.cpu0
        self.load1 = os.getloadavg()[0]

    def describe(self) -> str:
        return (
            f"cpu/wall {self.cpu / self.seconds:.2f} of {os.cpu_count()} cores;"
            f" host load {self.load0:.1f} -> {self.load1:.1f}"
        )


def report(label: str, results, phase: Phase, before: dict, after: dict) -> float:
    seconds = phase.seconds
    tokens = sum(len(r.completion_ids or ()) for r in results)
    errors = [r.error for r in results if not r.ok]
    assert not errors, errors
    assert all(len(r.completion_ids) == NEW_TOKENS for r in results), "every call must make exactly 64 tokens"
    delta = {k: after[k] - before[k] for k in ("prefills", "decode_steps", "rows_decoded", "prefill_s", "decode_s")}
    mean_rows = delta["rows_decoded"] / delta["decode_steps"] if delta["decode_steps"] else 0.0
    print(
        f"  {label:<10} {tokens} tokens in {seconds:7.1f} s = {tokens / seconds:6.1f} tok/s"
        f"  (prefill {delta['prefill_s']:.1f} s in {delta['prefills']} passes; decode {delta['decode_s']:.1f} s,"
        f" {delta['decode_steps']} steps, {mean_rows:.1f} rows/step)",
        flush=True,
    )
    print(f"  {'':<10} {phase.describe()}", flush=True)
    return tokens / seconds


async def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    t0 = time.perf_counter()
    backend = HFBackend("embedded", max_batch_size=N_PROMPTS, ignore_eos=True)
    print(f"model loaded in {time.perf_counter() - t0:.1f} s on {backend.decoder.device}", flush=True)
    prompts = build_prompts(backend)
    lengths = [n for _, n in prompts]
    print(
        f"{len(prompts)} prompts, {min(lengths)}-{max(lengths)} tokens (mean {sum(lengths) / len(lengths):.0f}), "
        f"{NEW_TOKENS} new tokens each",
        flush=True,
    )
    reqs = requests_for(prompts)

    warm = GenerationRequest(
        role="reader", messages=({"role": "user", "content": "Hi"},), sampling=SamplingParams(max_tokens=4)
    )
    await backend.generate([warm])

    print("(a) sequential: one call at a time", flush=True)
    before = backend.stats()
    seq = []
    with Phase() as phase:
        for i, req in enumerate(reqs):
            seq += await backend.generate([req])
            print(f"    call {i + 1}/{len(reqs)} done at {time.perf_counter() - phase.t0:.1f} s", flush=True)
    seq_tps = report("sequential", seq, phase, before, backend.stats())

    print("(b) dynamic: 16 concurrent calls", flush=True)
    before = backend.stats()
    with Phase() as phase:
        dyn = [r for rs in await asyncio.gather(*(backend.generate([req]) for req in reqs)) for r in rs]
    dyn_tps = report("dynamic", dyn, phase, before, backend.stats())

    print("(c) static: one batched generation", flush=True)
    before = backend.stats()
    with Phase() as phase:
        sta = backend.generate_sync(reqs)
    sta_tps = report("static", sta, phase, before, backend.stats())

    same_dyn = sum(a.completion_ids == b.completion_ids for a, b in zip(seq, dyn, strict=True))
    same_sta = sum(a.completion_ids == b.completion_ids for a, b in zip(seq, sta, strict=True))
    print(f"identical greedy completions vs sequential: dynamic {same_dyn}/16, static {same_sta}/16")
    print(f"example answer: {seq[0].text[:80]!r}")
    await backend.aclose()
    speedup, fraction = dyn_tps / seq_tps, dyn_tps / sta_tps
    print(f"dynamic/sequential = {speedup:.2f}x (target >= 2), dynamic/static = {fraction:.2f} (target >= 0.8)")
    print(f"RESULT batch_speedup={speedup:.2f} static_fraction={fraction:.2f}")


if __name__ == "__main__":
    asyncio.run(main())

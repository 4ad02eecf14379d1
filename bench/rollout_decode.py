"""Benchmark: how GRPO rollouts decode (docs/results/grpo_speed.md): the PEFT policy vs its merged
copy (``train.policy.MergedSampler``), each prompt prefilled once for its branches or not, and
a decode batch of 16 vs 32 rows, on the same requests in one run.

    OMP_NUM_THREADS=2 uv run python bench/rollout_decode.py      # about 4 minutes on 2 idle cores

Workload: the shipped memory-policy adapter (``models/memory-policy-cpu``) on the embedded model,
float32; 8 agent-like prompts of 300-500 tokens from the HotpotQA dev sample
(``bench/hf_batching.py``'s builder), each sampled 4 ways (a state group: T = 1, a seed each,
schema mode, at most 48 tokens), all 32 requests given at once (``generate_sync``). Each way runs
twice in turn (ABCD ABCD); the second round is reported (the first warms caches). Completions
are seeded per row, so the ways differ only where float round-off (a merged weight, another
batch) flips a token near a sampling boundary; the bench counts the completions equal to peft's.

    RESULT peft_s=... merged_s=... merged_shared_s=... merged_shared_32_s=...
           merged_decode_speedup=... shared_prefill_speedup=... batch32_decode_speedup=...
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    import torch
    from hf_batching import build_prompts

    from memsearch.backends.base import GenerationRequest, SamplingParams
    from memsearch.backends.hf.backend import HFBackend
    from memsearch.memory.action_format import MEMORY_OPS
    from memsearch.train.config import LoraSettings
    from memsearch.train.policy import MergedSampler, load_policy

    policy, tokenizer, _ = load_policy("embedded", str(ROOT / "models" / "memory-policy-cpu"), LoraSettings(), "cpu",
                                       "float32", 1)
    merged = MergedSampler(policy, "embedded", "cpu", "float32")
    merged.refresh()
    probe = HFBackend("embedded", loaded=(merged.model, tokenizer))
    prompts = build_prompts(probe)[:8]
    asyncio.run(probe.aclose())
    requests = [GenerationRequest(role="memory", messages=messages, constraint=MEMORY_OPS,
                                  sampling=SamplingParams(temperature=1.0, max_tokens=48, seed=10 * i + k))
                for i, (messages, _) in enumerate(prompts) for k in range(4)]
    ways = {"peft": (policy, False, 16), "merged": (merged.model, False, 16),
            "merged_shared": (merged.model, True, 16), "merged_shared_32": (merged.model, True, 32)}
    print(f"{len(requests)} requests, {torch.get_num_threads()} threads")
    got, outputs = {}, {}
    for round_ in (1, 2):
        for name, (model, share, rows) in ways.items():
            backend = HFBackend("bench", loaded=(model, tokenizer), max_batch_size=rows, share_prompts=share)
            t0 = time.perf_counter()
            results = backend.generate_sync(requests)
            wall = time.perf_counter() - t0
            stats = backend.stats()
            asyncio.run(backend.aclose())
            outputs[name] = [r.completion_ids for r in results]
            steps = max(1, stats["decode_steps"])
            print(f"round {round_} {name:17s} wall {wall:5.1f}s prefill {stats['prefill_s']:5.1f}s "
                  f"({stats['prefill_tokens']} tokens) decode {stats['decode_s']:5.1f}s "
                  f"({stats['decode_steps']} steps, {stats['mean_rows']:.1f} rows, "
                  f"{1000 * stats['decode_s'] / steps:.0f} ms a step)", flush=True)
            got[name] = (wall, stats["prefill_s"], stats["decode_s"])
    for name in ways:
        same = sum(a == b for a, b in zip(outputs[name], outputs["peft"], strict=True))
        tokens = sum(len(ids) for ids in outputs[name])
        print(f"{name}: {same} of {len(requests)} completions token for token those of peft; {tokens} tokens")
    print("RESULT " + " ".join(f"{name}_s={got[name][0]:.2f}" for name in ways)
          + f" merged_decode_speedup={got['peft'][2] / got['merged'][2]:.2f}"
          + f" shared_prefill_speedup={got['merged'][1] / got['merged_shared'][1]:.2f}"
          + f" batch32_decode_speedup={got['merged_shared'][2] / got['merged_shared_32'][2]:.2f}")


if __name__ == "__main__":
    main()

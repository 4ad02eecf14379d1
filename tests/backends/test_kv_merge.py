"""Requests joining a running batch: the decoder's KV caches are merged layer by layer, each part's
layer freed once it is copied, so a merge holds about one layer more than the caches it joins,
never two copies of them (``BatchDecoder._merge``). Real decoding on a random-init 4-layer Llama;
the merge is watched, not replaced: wrappers record what is alive and call the real code."""

from __future__ import annotations

import time
import weakref

import pytest
import torch

from memsearch.backends.base import GenerationRequest, SamplingParams
from memsearch.backends.hf.decoder import BatchDecoder
from memsearch.backends.hf.jobs import Job
from memsearch.backends.hf.kv_cache import slab_layer_class

LAYERS = 4


@pytest.fixture(scope="module")
def model_and_tokenizer():
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from memsearch.assets.embedded import tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                         pad_token_id=tokenizer.pad_token_id, initializer_range=0.2)
    return LlamaForCausalLM(config).eval(), tokenizer


def job(prompt: list[int], max_new: int) -> Job:
    request = GenerationRequest(role="memory", prompt_ids=tuple(prompt), sampling=SamplingParams(max_tokens=max_new))
    return Job(request=request, prompt_ids=list(prompt), max_new=max_new, t0=time.perf_counter())


def staggered_run(decoder: BatchDecoder, waves: list[list[Job]], every: int = 3) -> dict[int, tuple]:
    """Decode ``waves``: the first at once, each next one ``every`` steps later (joining the running
    batch); ``{id(job): (completion ids, log-probs)}``."""
    results: dict[int, tuple] = {}
    calls = [0]

    def take(n: int) -> list[Job]:
        calls[0] += 1
        k = (calls[0] - 1) // every if (calls[0] - 1) % every == 0 else None
        return waves[k][:n] if k is not None and k < len(waves) else []

    decoder.run(take, lambda j, r: results.__setitem__(id(j), (r.completion_ids, r.logprobs)))
    return results


def test_a_merge_frees_each_layer_of_the_joined_caches_as_soon_as_it_is_copied(model_and_tokenizer, monkeypatch):
    model, tokenizer = model_and_tokenizer
    slab = slab_layer_class()
    merges: list[dict] = []  # per merge: the parts' buffers (weakrefs, bytes) and what was alive at each layer

    real_merge = BatchDecoder._merge
    real_assemble = slab.assemble

    def watched_merge(self, parts):
        buffers = [[(weakref.ref(b), b.untyped_storage().nbytes()) for p in parts
                    for b in (p.cache.layers[i]._k, p.cache.layers[i]._v)] for i in range(LAYERS)]
        merges.append({"buffers": buffers, "before": sum(n for layer in buffers for _, n in layer),
                       "largest_old_layer": max(sum(n for _, n in layer) for layer in buffers),
                       "new": [], "live_during": [], "freed_before": []})
        return real_merge(self, parts)

    def watched_assemble(self, parts, room):
        m = merges[-1]
        i = len(m["new"])
        # layers already copied: every buffer of the parts freed (nothing else holds them)
        m["freed_before"].append(all(ref() is None for layer in m["buffers"][:i] for ref, _ in layer))
        old_alive = sum(n for layer in m["buffers"] for ref, n in layer if ref() is not None)
        out = real_assemble(self, parts, room)
        m["new"].append(self.nbytes())
        m["live_during"].append(old_alive + sum(m["new"]))  # the peak of this layer's copy
        return out

    monkeypatch.setattr(BatchDecoder, "_merge", watched_merge)
    monkeypatch.setattr(slab, "assemble", watched_assemble)
    decoder = BatchDecoder(model, tokenizer, max_batch_size=8, share_prompts=False)
    waves = [[job([11 + k, 300, 301, 302, 303 + k], 14) for k in range(3)],
             [job([500, 501 + k, 9], 10) for k in range(2)],
             [job(list(range(40, 52)), 6)]]
    staggered_run(decoder, waves)
    assert decoder.stats["batches"] == 1  # every later wave joined the running batch ...
    assert len(merges) == 2  # ... through a merge
    for m in merges:
        assert len(m["new"]) == LAYERS
        assert m["freed_before"] == [True] * LAYERS
        assert all(ref() is None for layer in m["buffers"] for ref, _ in layer)
        # The merge's peak: the merged cache (room for the remaining steps included) plus one layer
        # of the joined caches; holding both whole caches would be before + sum(new).
        assert max(m["live_during"]) <= sum(m["new"]) + m["largest_old_layer"], m
        assert m["before"] > 2 * m["largest_old_layer"]  # so the bound above does tell the two apart


def test_joining_a_running_batch_gives_each_row_what_a_closed_batch_gives(model_and_tokenizer):
    """The merge copies the KV values it frees: greedy rows that join later decode the same tokens
    as when every row starts together (log-probs to float round-off of another padding)."""
    model, tokenizer = model_and_tokenizer
    prompts = [([7, 8, 9, 10, 11], 12), ([300, 301], 9), ([20, 21, 22, 23, 24, 25, 26, 27], 7), ([44], 5)]
    waves = [[job(p, n) for p, n in prompts[:2]], [job(*prompts[2])], [job(*prompts[3])]]
    joined = staggered_run(BatchDecoder(model, tokenizer, max_batch_size=8, share_prompts=False), waves, every=2)
    closed_jobs = [job(p, n) for p, n in prompts]
    closed = staggered_run(BatchDecoder(model, tokenizer, max_batch_size=8, share_prompts=False), [closed_jobs])
    got = [joined[id(j)] for wave in waves for j in wave]
    want = [closed[id(j)] for j in closed_jobs]
    for (ids, lps), (ref_ids, ref_lps) in zip(got, want, strict=True):
        assert ids == ref_ids
        assert lps == pytest.approx(ref_lps, abs=1e-5)

"""The ``hf`` backend with the real embedded model (SmolLM2-135M-Instruct, float32 on CPU).

Tolerance for log-probs: 1e-4 (absolute, nats). The backend computes them from a KV-cached,
left-padded, batched decode; the reference is one unpadded full forward pass over
prompt + completion. In float32 the two differ by ~1e-5 at most.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from memsearch.backends.base import GenerationRequest, PolicyBackend, SamplingParams

LOGPROB_TOL = 1e-4

QUESTIONS = [
    "What is the capital of France?",
    "Name a primary color.",
    "Who wrote the play Romeo and Juliet? Answer with the name only.",
    (
        "Scott Derrickson (born July 16, 1966) is an American director. Ed Wood was an American filmmaker. "
        "Were Scott Derrickson and Ed Wood of the same nationality? Answer yes or no."
    ),
    "2+2=?",
    "Give one word that rhymes with cat.",
    (
        "The Eiffel Tower is in Paris. The Colosseum is in Rome. The Parthenon is in Athens. "
        "Big Ben is in London. Which city has the Colosseum?"
    ),
    "Is the sun a star?",
]


def ask(question: str, **sampling) -> GenerationRequest:
    return GenerationRequest(
        role="reader",
        messages=({"role": "user", "content": question},),
        sampling=SamplingParams(**sampling),
    )


def run(coro):
    return asyncio.run(coro)


async def gather(backend, requests):
    """Each request as its own concurrent ``generate`` call (like concurrent episodes)."""
    results = await asyncio.gather(*(backend.generate([r]) for r in requests))
    return [r for (r,) in results]


def reference_logprobs(backend, prompt_ids, completion_ids, temperature=1.0, top_p=1.0) -> list[float]:
    """Log-probs of ``completion_ids`` from one full forward pass (no cache, no padding)."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.inference_mode():
        logits = backend.model(input_ids=ids).logits[0].float()
    logits = logits[len(prompt_ids) - 1 : -1] / temperature
    if top_p < 1.0:
        probs = torch.softmax(logits, dim=-1)
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = before >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(1, torch.tensor(completion_ids)[:, None])[:, 0].tolist()


@pytest.fixture(scope="module")
def backend():
    from memsearch.backends.hf.backend import HFBackend

    b = HFBackend("embedded", device="cpu", max_batch_size=16)
    yield b
    run(b.aclose())


@pytest.fixture(scope="module")
def greedy_runs(backend):
    """The 8 questions greedily, one call at a time and as 8 concurrent calls."""
    requests = [ask(q, max_tokens=12) for q in QUESTIONS]

    async def both():
        alone = [(await backend.generate([r]))[0] for r in requests]
        before = backend.stats()
        together = await gather(backend, requests)
        return alone, together, before, backend.stats()

    return requests, *run(both())


def test_is_a_policy_backend(backend):
    assert isinstance(backend, PolicyBackend)
    assert backend.name == "hf"


@pytest.mark.slow
def test_model_dir_is_the_gguf_model():
    """The cached conversion loads as a plain HF folder and gives the GGUF model's logits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memsearch.assets.embedded import gguf_path, load_gguf_model, model_dir

    folder = model_dir()
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in folder.iterdir()
    }
    converted = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    assert converted.dtype == torch.float32
    assert getattr(converted, "hf_quantizer", None) is None
    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = tok.apply_chat_template([{"role": "user", "content": QUESTIONS[3]}], add_generation_prompt=True)
    ids = torch.tensor([ids["input_ids"] if hasattr(ids, "keys") else ids])
    original = load_gguf_model(gguf_path())
    with torch.inference_mode():
        a = converted(input_ids=ids).logits
        b = original(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-5, rtol=0), (a - b).abs().max()
    assert a[0, -1].argmax() == b[0, -1].argmax()


@pytest.mark.slow
def test_greedy_is_the_same_alone_and_in_a_batch(greedy_runs):
    _, alone, together, _, _ = greedy_runs
    lengths = {len(r.prompt_ids) for r in alone}
    assert len(lengths) >= 6  # different lengths: left padding is exercised
    for a, b in zip(alone, together, strict=True):
        assert a.ok and b.ok, (a.error, b.error)
        assert a.completion_ids == b.completion_ids
        assert a.text == b.text
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < LOGPROB_TOL
    assert "Paris" in alone[0].text


@pytest.mark.slow
def test_greedy_is_deterministic(backend, greedy_runs):
    requests, alone, _, _, _ = greedy_runs
    again = run(backend.generate([requests[2]]))[0]
    assert again.completion_ids == alone[2].completion_ids
    assert again.logprobs == pytest.approx(alone[2].logprobs, abs=LOGPROB_TOL)


@pytest.mark.slow
def test_batch_of_8_ran_as_one_decode_loop(greedy_runs):
    _, _, together, before, after = greedy_runs
    assert after["batches"] - before["batches"] == 1
    assert after["prefills"] - before["prefills"] < len(QUESTIONS)
    steps = after["decode_steps"] - before["decode_steps"]
    assert steps <= max(len(r.completion_ids) for r in together)  # one step serves all rows


@pytest.mark.slow
def test_logprobs_match_one_full_forward_pass(backend, greedy_runs):
    _, alone, together, _, _ = greedy_runs
    for result in (alone[3], together[3], together[6]):
        ref = reference_logprobs(backend, result.prompt_ids, result.completion_ids)
        assert len(result.logprobs) == len(result.completion_ids)
        assert result.logprobs == pytest.approx(ref, abs=LOGPROB_TOL)
        assert all(lp <= 0 for lp in result.logprobs)


@pytest.mark.slow
def test_sampled_logprobs_are_under_the_sampling_distribution(backend):
    req = ask(QUESTIONS[1], temperature=0.7, top_p=0.9, seed=3, max_tokens=10)
    result = run(backend.generate([req]))[0]
    assert result.ok
    ref = reference_logprobs(backend, result.prompt_ids, result.completion_ids, temperature=0.7, top_p=0.9)
    assert result.logprobs == pytest.approx(ref, abs=LOGPROB_TOL)
    t1 = reference_logprobs(backend, result.prompt_ids, result.completion_ids)
    assert result.logprobs != pytest.approx(t1, abs=LOGPROB_TOL)  # not the T=1 distribution


@pytest.mark.slow
def test_seeded_sampling_is_reproducible(backend):
    req = ask("Write a sentence about the sea.", temperature=1.0, seed=1234, max_tokens=10)
    other = ask("Tell me a joke.", temperature=0.8, top_p=0.95, seed=7, max_tokens=10)

    async def go():
        first = (await backend.generate([req]))[0]
        second, _ = await gather(backend, [req, other])  # same seed, now inside a batch
        reseeded = (
            await backend.generate([ask("Write a sentence about the sea.", temperature=1.0, seed=99, max_tokens=10)])
        )[0]
        return first, second, reseeded

    first, second, reseeded = run(go())
    assert first.completion_ids == second.completion_ids
    assert first.text == second.text
    assert reseeded.completion_ids != first.completion_ids


@pytest.mark.slow
def test_a_late_request_joins_the_running_batch(backend, greedy_runs):
    """Continuous batching: a call made while another is decoding is prefilled, merged into the
    running batch (its cache left-padded to the other's length) and gives the same greedy tokens."""
    requests, alone, _, _, _ = greedy_runs
    story = ask("Write a long story about a dragon.", max_tokens=30)
    story_alone = run(backend.generate([story]))[0]

    async def go():
        before = backend.stats()
        first = asyncio.create_task(backend.generate([story]))
        while backend.stats()["decode_steps"] < before["decode_steps"] + 3:
            await asyncio.sleep(0.005)
        (late,) = await backend.generate([requests[0]])
        assert not first.done()  # the late call finished first: it did not wait for the batch
        (early,) = await first
        return early, late, before, backend.stats()

    early, late, before, after = run(go())
    assert after["batches"] - before["batches"] == 1
    assert after["rows_decoded"] - before["rows_decoded"] > after["decode_steps"] - before["decode_steps"]
    assert early.completion_ids == story_alone.completion_ids
    assert late.completion_ids == alone[0].completion_ids
    assert late.logprobs == pytest.approx(alone[0].logprobs, abs=LOGPROB_TOL)
    assert early.logprobs == pytest.approx(story_alone.logprobs, abs=LOGPROB_TOL)


def test_max_tokens_gives_length(backend):
    result = run(backend.generate([ask("Write a long story about a dragon.", max_tokens=5)]))[0]
    assert result.ok
    assert result.finish_reason == "length"
    assert len(result.completion_ids) == 5 == len(result.logprobs)
    assert result.usage.completion_tokens == 5
    assert result.usage.prompt_tokens == len(result.prompt_ids)
    assert result.usage.source == "reported"
    assert result.latency_s > 0
    assert result.text == backend.tokenizer.decode(list(result.completion_ids))


def test_a_completion_the_context_cuts_is_context_truncated(tiny_model_dir):
    """A prompt 8 tokens short of the model's context with max_tokens 32: the context ends the
    completion (length, 8 tokens) and the result says so; max_tokens alone ending one does not."""
    from memsearch.backends.hf.backend import HFBackend

    tiny = HFBackend(str(tiny_model_dir), device="cpu", max_batch_size=2)
    try:
        context = tiny.decoder.context
        ids = tuple([tiny.tokenizer.convert_tokens_to_ids("a")] * (context - 8))
        def ask_ids(prompt, max_tokens):
            sampling = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=1)
            return run(tiny.generate([GenerationRequest(role="reader", prompt_ids=prompt, sampling=sampling)]))[0]

        cut, whole = ask_ids(ids, 32), ask_ids(ids[:64], 4)
    finally:
        run(tiny.aclose())
    assert (cut.finish_reason, len(cut.completion_ids), cut.context_truncated) == ("length", 8, True)
    if whole.finish_reason == "length":
        assert not whole.context_truncated


def test_eos_gives_stop(backend):
    result = run(backend.generate([ask(QUESTIONS[0], max_tokens=40)]))[0]
    assert result.finish_reason == "stop"
    assert result.completion_ids[-1] in backend.decoder.eos_ids
    assert backend.tokenizer.decode([result.completion_ids[-1]]) == "<|im_end|>"
    assert "<|im_end|>" not in result.text
    assert "Paris" in result.text


def test_stop_string(backend):
    result = run(backend.generate([ask(QUESTIONS[0], max_tokens=40, stop=("Paris",))]))[0]
    assert result.finish_reason == "stop"
    assert "Paris" not in result.text
    assert "Paris" in backend.tokenizer.decode(list(result.completion_ids))  # ids are kept raw
    assert result.text.startswith("The capital of France")


def test_prompt_ids_and_messages_agree(backend):
    by_messages = ask(QUESTIONS[4], max_tokens=6)
    ids = backend.prompt_ids(by_messages)
    assert ids[0] == backend.tokenizer.convert_tokens_to_ids("<|im_start|>")
    by_ids = GenerationRequest(role="reader", prompt_ids=tuple(ids), sampling=SamplingParams(max_tokens=6))
    a, b = run(backend.generate([by_messages, by_ids]))
    assert a.prompt_ids == b.prompt_ids == tuple(ids)
    assert a.completion_ids == b.completion_ids


def test_bad_requests_come_back_as_errors(backend):
    too_long = GenerationRequest(role="reader", prompt_ids=(1,) * 9000, sampling=SamplingParams(max_tokens=4))
    empty = GenerationRequest(role="reader")
    good = ask(QUESTIONS[4], max_tokens=3)
    before = dict(backend.completed)
    results = run(backend.generate([too_long, empty, good]))
    assert [r.finish_reason for r in results[:2]] == ["error", "error"]
    assert "context" in results[0].error
    assert results[1].error
    assert results[2].ok and len(results[2].completion_ids) == 3
    # completions are counted by role where they are produced (GRPO's rows generated); errors are not
    assert backend.completed["reader"] - before.get("reader", 0) == 1
    assert sum(backend.completed.values()) - sum(before.values()) == 1


def test_a_failing_forward_pass_fails_its_rows_only(backend, monkeypatch):
    real = backend.decoder._forward
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the first decode step after the prefill
            raise RuntimeError("boom")
        return real(*args, **kwargs)

    monkeypatch.setattr(backend.decoder, "_forward", flaky)
    (failed,) = run(backend.generate([ask(QUESTIONS[4], max_tokens=5)]))
    assert failed.finish_reason == "error"
    assert "boom" in failed.error
    monkeypatch.undo()
    (fine,) = run(backend.generate([ask(QUESTIONS[4], max_tokens=3)]))
    assert fine.ok and len(fine.completion_ids) == 3


@pytest.mark.slow
def test_concurrent_calls_share_forward_passes(backend):
    requests = [ask(QUESTIONS[i % len(QUESTIONS)] + " " * (i // len(QUESTIONS)), max_tokens=4) for i in range(16)]
    before = backend.stats()
    results = run(gather(backend, requests))
    after = backend.stats()
    assert all(r.ok and len(r.completion_ids) == 4 for r in results)
    passes = (after["prefills"] - before["prefills"]) + (after["decode_steps"] - before["decode_steps"])
    assert after["batches"] - before["batches"] < 16
    assert passes < 16 * 4  # one-call-at-a-time would need a prefill + 3 steps per call
    assert after["max_rows"] == 16


@pytest.mark.slow
def test_lora_adapter_is_applied(tmp_path):
    """A saved PEFT LoRA adapter changes the model, and the backend decodes with it exactly as
    the adapted model's own greedy generation does."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from memsearch.assets.embedded import model_dir
    from memsearch.backends.hf.backend import HFBackend

    base = AutoModelForCausalLM.from_pretrained(str(model_dir()))
    torch.manual_seed(0)
    lora = LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    adapted = get_peft_model(base, lora)
    adapted.save_pretrained(str(tmp_path / "adapter"))
    backend = HFBackend("embedded", adapter=str(tmp_path / "adapter"), device="cpu")
    plain = HFBackend("embedded", device="cpu")
    request = ask("Name a colour.", max_tokens=6)
    (with_adapter,) = run(backend.generate([request]))
    (without,) = run(plain.generate([request]))
    ids = torch.tensor([list(with_adapter.prompt_ids)])
    with torch.no_grad():
        expected = adapted.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False
        )
    assert list(with_adapter.completion_ids) == expected[0, ids.shape[1] :].tolist()
    assert with_adapter.completion_ids != without.completion_ids
    run(backend.aclose())
    run(plain.aclose())


def test_closed_backend_returns_errors():
    from memsearch.backends.hf.backend import HFBackend

    b = HFBackend("embedded", device="cpu")

    async def go():
        await b.aclose()
        return await b.generate([ask("Hi", max_tokens=2)])

    (result,) = run(go())
    assert result.finish_reason == "error"


def _branches(question: str, seeds, **sampling) -> list[GenerationRequest]:
    """The requests of one state group: one prompt, a seed each."""
    return [ask(question, temperature=1.0, seed=s, **sampling) for s in seeds]


@pytest.mark.slow
def test_shared_prompts_are_prefilled_once_and_sample_as_alone(backend):
    """Four requests with one prompt (a GRPO state group) and one other: one prefill row for the
    four, and every row's tokens and log-probs those of a backend that prefills each alone."""
    from memsearch.backends.hf.backend import HFBackend

    requests = _branches(QUESTIONS[3], (1, 2, 3, 4), max_tokens=12) + [ask(QUESTIONS[6], temperature=1.0, seed=5,
                                                                           max_tokens=12)]
    unshared = HFBackend("embedded", device="cpu", max_batch_size=16, share_prompts=False)
    try:
        reference = unshared.generate_sync(requests)
    finally:
        run(unshared.aclose())
    before = backend.stats()
    shared = backend.generate_sync(requests)
    after = backend.stats()
    lengths = [len(r.prompt_ids) for r in shared]
    assert after["prompt_tokens"] - before["prompt_tokens"] == sum(lengths)
    assert after["prefill_tokens"] - before["prefill_tokens"] == lengths[0] + lengths[4]  # the shared one once
    for got, ref in zip(shared, reference, strict=True):
        assert got.ok and got.completion_ids == ref.completion_ids
        assert got.logprobs == pytest.approx(ref.logprobs, abs=LOGPROB_TOL)
    assert len({r.completion_ids for r in shared[:4]}) > 1  # their own seeds: the branches differ


@pytest.mark.slow
def test_a_prompt_stored_in_the_run_serves_requests_that_join_later():
    """Batch of 2: the other two branches join when rows finish, from the run's prompt store (no
    second prefill); the store is empty once the run ends (the weights may change before the next)."""
    from memsearch.backends.hf.backend import HFBackend

    requests = _branches(QUESTIONS[0], (11, 12, 13, 14), max_tokens=6)
    b = HFBackend("embedded", device="cpu", max_batch_size=2)
    ref = HFBackend("embedded", device="cpu", max_batch_size=2, share_prompts=False)
    try:
        got = b.generate_sync(requests)
        want = ref.generate_sync(requests)
        stats = b.stats()
        assert stats["prefill_tokens"] == len(got[0].prompt_ids)  # one prefill for four requests
        assert stats["prefills"] == 1 and ref.stats()["prefills"] == 2
        assert len(b.decoder._prompts) == 0
        for g, w in zip(got, want, strict=True):
            assert g.completion_ids == w.completion_ids
            assert g.logprobs == pytest.approx(w.logprobs, abs=LOGPROB_TOL)
    finally:
        run(b.aclose())
        run(ref.aclose())


def test_prompt_store_keeps_the_newest_prompts_within_its_token_bound():
    from memsearch.backends.hf.kv_cache import PromptStore

    store = PromptStore(max_tokens=10)
    kv = [(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2))]
    store.put((1, 2, 3, 4), kv, torch.zeros(3))
    store.put((5, 6, 7, 8), kv, torch.zeros(3))
    assert (1, 2, 3, 4) in store
    store[(1, 2, 3, 4)]  # used: the other one is now the oldest
    store.put((9, 9, 9, 9), kv, torch.zeros(3))
    assert (5, 6, 7, 8) not in store and (1, 2, 3, 4) in store and store.tokens == 8
    store.put(tuple(range(11)), kv, torch.zeros(3))  # longer than the bound: not kept
    assert len(store) == 2
    store.clear()
    assert len(store) == 0 and store.tokens == 0


def test_a_paused_decoder_serves_nothing_until_the_weights_are_changed(tiny_model_dir):
    """``decoder.paused()`` (held while GRPO copies new weights into its sampler) keeps a request
    waiting; once released it is served by the new weights, not from a prompt stored before."""
    import threading

    from memsearch.backends.hf.backend import HFBackend

    b = HFBackend(str(tiny_model_dir), device="cpu", max_batch_size=4)
    try:
        request = ask(QUESTIONS[0], temperature=1.0, seed=3, max_tokens=6)
        first = b.generate_sync([request])[0]
        got = {}
        with b.decoder.paused():
            waiting = threading.Thread(target=lambda: got.update(result=b.generate_sync([request])[0]))
            waiting.start()
            waiting.join(timeout=1.0)
            assert waiting.is_alive() and not got  # held while the weights change
            with torch.no_grad():
                for p in b.model.parameters():
                    p.mul_(1.5)
        waiting.join(timeout=60)
        result = got["result"]
        assert result.ok and result.prompt_ids == first.prompt_ids
        want = reference_logprobs(b, result.prompt_ids, result.completion_ids)
        assert result.logprobs == pytest.approx(want, abs=LOGPROB_TOL)
        old = first.logprobs[0]
        assert abs(want[0] - old) > 1e-3 or result.completion_ids[0] != first.completion_ids[0]
    finally:
        run(b.aclose())

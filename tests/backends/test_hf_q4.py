"""The ``hf`` backend's ``q4`` weights (``memsearch.backends.hf.q4``) on the real embedded model
and its shipped GGUF file: the blocks are the float32 model's weights, the q4 forward computes
the float32 model's logits up to bfloat16 round-off, and a row's logits do not depend on the
rows it is batched with (bit for bit, which float32 does not promise)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from memsearch.backends.base import GenerationRequest, SamplingParams
from memsearch.errors import InputValueError

QUESTIONS = [
    "What is the capital of France?",
    "Name a primary color.",
    "Who wrote the play Romeo and Juliet? Answer with the name only.",
    "Scott Derrickson (born July 16, 1966) is an American director. Ed Wood was an American filmmaker. "
    "Were Scott Derrickson and Ed Wood of the same nationality? Answer yes or no.",
    "2+2=?",
    "The Eiffel Tower is in Paris. The Colosseum is in Rome. The Parthenon is in Athens. "
    "Big Ben is in London. Which city has the Colosseum?",
]


def ask(question: str, max_tokens: int = 16) -> GenerationRequest:
    return GenerationRequest(role="reader", messages=({"role": "user", "content": question},),
                             sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens))


@pytest.fixture(scope="module")
def q4():
    from memsearch.backends.hf.backend import HFBackend

    backend = HFBackend(weights="q4", max_batch_size=16)
    yield backend
    asyncio.run(backend.aclose())


def test_the_blocks_are_the_float32_models_weights(q4):
    """Every decoder-layer matrix of the shipped file, dequantized, is the float32 model's weight
    exactly, rows in transformers' order (q and k are stored permuted in GGUF)."""
    from memsearch.assets.embedded import gguf_path
    from memsearch.backends.hf.q4 import read_q4_blocks

    blocks = read_q4_blocks(gguf_path(), q4.model.config)
    assert len(blocks) == q4.model.config.num_hidden_layers == 30
    for layer, found in zip(q4.model.model.layers, blocks, strict=True):
        for name, block in found.items():
            weight = layer.get_submodule(name).weight
            assert block.q.min() >= 0 and block.q.max() <= 15
            assert torch.equal(block.dequantized(), weight), name


def _full_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def test_q4_logits_are_the_float32_logits_up_to_bfloat16_round_off(q4):
    """A prefill and a decode step of the q4 forward against one float32 forward of the same ids:
    the same top token, and logits within the round-off of bfloat16 weights and matmul inputs
    (measured here: at most 0.29-0.33 apart, of logits spanning 32-40; cosine 0.99998-0.99999)."""
    from transformers import DynamicCache

    from memsearch.backends.hf.kv_cache import slab_layer_class

    decoder = q4.decoder
    ids = q4.prompt_ids(ask(QUESTIONS[3]))
    cache = DynamicCache(config=q4.model.config)
    cache.layers = [slab_layer_class()() for _ in cache.layers]
    with torch.inference_mode():  # a prefill of all but the last id, then the last as a decode step
        prefix = torch.tensor([ids[:-1]])
        mask = torch.ones_like(prefix, dtype=torch.bool)
        prefilled = decoder._forward(prefix, mask, torch.arange(len(ids) - 1)[None], cache)[0]
        step_mask = torch.ones((1, len(ids)), dtype=torch.bool)
        stepped = decoder._forward(torch.tensor([[ids[-1]]]), step_mask, torch.tensor([[len(ids) - 1]]), cache)[0]
    for got, reference in ((prefilled, _full_logits(q4.model, ids[:-1])), (stepped, _full_logits(q4.model, ids))):
        assert got.argmax() == reference.argmax()
        assert (got - reference).abs().max() < 1.0, (got - reference).abs().max()
        assert torch.nn.functional.cosine_similarity(got, reference, dim=0) > 0.9998
        assert (got - reference).abs().max() > 0  # it is another engine, not the float32 path


@pytest.mark.slow
def test_a_rows_tokens_do_not_depend_on_its_batch(q4):
    """Alone, as concurrent calls of different lengths (left padding), and joining a running
    batch: the same completion ids (the logits are the same bit for bit) and log-probs equal up
    to the log-softmax's own round-off (torch splits its sums by batch size: 1e-7 seen)."""
    requests = [ask(q) for q in QUESTIONS]
    assert len({len(q4.prompt_ids(r)) for r in requests}) >= 5  # left padding is exercised

    async def runs():
        alone = [(await q4.generate([r]))[0] for r in requests]
        together = [r for (r,) in await asyncio.gather(*(q4.generate([r]) for r in requests))]
        before = q4.stats()["decode_steps"]
        first = asyncio.create_task(q4.generate([ask("Write a long story about a dragon.", 30)]))
        while q4.stats()["decode_steps"] < before + 3:
            await asyncio.sleep(0.005)
        late = [r for (r,) in await asyncio.gather(*(q4.generate([r]) for r in requests[:3]))]
        await first
        return alone, together, late

    alone, together, late = asyncio.run(runs())
    for a, b in [*zip(alone, together, strict=True), *zip(alone, late, strict=False)]:
        assert a.ok and b.ok, (a.error, b.error)
        assert a.completion_ids == b.completion_ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-6)
    assert all(a.completion_ids for a in alone)


def test_q4_refuses_what_it_cannot_run(tiny_model_dir):
    from memsearch.backends.hf.backend import HFBackend
    from memsearch.config.backend import HFSettings

    for kwargs in ({"model": str(tiny_model_dir)}, {"adapter": str(tiny_model_dir)}, {"dtype": "bfloat16"},
                   {"device": "cuda"}):
        with pytest.raises(InputValueError, match="weights = 'q4' runs the embedded model's own GGUF blocks"):
            HFBackend(weights="q4", **kwargs)
    with pytest.raises(InputValueError, match="hf weights 'q8': expected one of float32, q4"):
        HFBackend(weights="q8")
    with pytest.raises(ValueError, match="weights: 'q4' runs the embedded model's own GGUF blocks.*adapter 'a'"):
        HFSettings(weights="q4", adapter="a")


def test_weights_are_recorded_only_off_their_default():
    """float32 dumps and identities are those of earlier versions (stage fingerprints unmoved,
    old runs resume); q4 is in both, so it never resumes or matches a float32 record."""
    from memsearch.config.backend import HFSettings

    reference, q4 = HFSettings(), HFSettings(weights="q4")
    assert "weights" not in reference.model_dump(mode="json")
    assert reference.recorded_identity() == {"model": "embedded", "adapter": None, "base_url": None}
    assert q4.model_dump(mode="json")["weights"] == "q4"
    assert q4.recorded_identity()["weights"] == "q4"
    assert HFSettings.model_validate(q4.model_dump(mode="json")) == q4


def test_a_matrix_names_q4_weights_beside_the_model():
    from memsearch.config.backend import HFSettings
    from memsearch.records.run_summary import MemoryBackendIdentity

    def label(settings: HFSettings) -> str:
        return MemoryBackendIdentity.from_json(settings.recorded_identity() | {"kind": "hf"}).label

    assert label(HFSettings(weights="q4")) == "hf:embedded/q4"
    assert label(HFSettings()) == "hf:embedded"


def test_a_run_records_q4_weights_in_its_model_identity():
    """run.json's model identity names the engine of a q4 role; float32 roles keep the form
    earlier runs recorded, so they still resume."""
    from pathlib import Path

    from memsearch.config import load_config
    from memsearch.eval.run_folder import model_identity

    demo = Path(__file__).resolve().parents[2] / "configs" / "demo.toml"
    identity = model_identity(load_config(demo, ['backends.reader.weights="q4"']))
    assert identity["reader"]["weights"] == "q4"
    assert "weights" not in identity["memory"] and "weights" not in identity["controller"]

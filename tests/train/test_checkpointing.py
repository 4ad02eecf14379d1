"""Gradient checkpointing of the policy's decoder layers (``train.checkpointing``): the same
gradients, far fewer bytes saved for backward, active in eval mode under grad, inactive for
rollouts and no-grad scoring."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from memsearch.train.checkpointing import decoder_layers, enable_checkpointing, is_checkpointed
from memsearch.train.config import LoraSettings
from memsearch.train.grpo.batch import Batch
from memsearch.train.grpo.loss import policy_loss
from memsearch.train.grpo.shared_prompt import shared_completion_logprobs
from memsearch.train.logprobs import completion_logprobs
from memsearch.train.rows import Row


def make_row(prompt: list[int], completion: list[int], advantage: float) -> Row:
    return Row(prompt_ids=prompt, completion_ids=completion, rollout_logprobs=[0.0] * len(completion),
               loss_mask=[1] * len(completion), trajectory=0, group_index=0, role="memory", step=0, advantage=advantage)


def rows_of(vocab: int, prompt_len: int, completion_len: int) -> list[Row]:
    """Three rows: two branches of one prompt (the shared-prompt scorer packs them) and another prompt."""
    gen = torch.Generator().manual_seed(7)

    def ids(n):
        return torch.randint(10, vocab, (n,), generator=gen).tolist()

    shared = ids(prompt_len)
    return [make_row(shared, ids(completion_len), 1.0), make_row(shared, ids(completion_len - 3), -0.5),
            make_row(ids(prompt_len - 5), ids(completion_len), 0.25)]


def losses(policy, rows, pad_id, both: bool = True):
    """GRPO's clipped policy loss with a KL term (rows scored one by one, the default); with
    ``both``, plus SFT's completion NLL over the shared-prompt scorer (``share_prompts``)."""
    scored = completion_logprobs(policy, rows, pad_id, temperature=0.7)
    old = scored.logprobs.detach() - 0.05  # ratios off 1: some tokens clipped
    adv = torch.tensor([r.advantage for r in rows])
    loss, _ = policy_loss(scored.logprobs, old, adv, scored.mask, torch.ones(len(rows)), 0.2, 0.28, old + 0.1, 0.1)
    if both:
        shared = shared_completion_logprobs(policy, rows, pad_id)
        loss = loss - (shared.logprobs * shared.mask).sum()
    return loss


def backward_measured(policy, rows, pad_id, both: bool = True):
    """``(gradients by name, bytes saved for backward, bytes of them inside decoder layers)``: one
    backward of ``losses``; saved tensors counted with ``saved_tensors_hooks``, each storage once,
    the weights (parameters) apart since they are no activation."""
    weights = {p.untyped_storage().data_ptr() for p in policy.parameters()}
    saved: dict[int, int] = {}
    in_layers: set[int] = set()
    depth = [0]
    layers = decoder_layers(policy)
    hooks = [h for layer in layers for h in (
        layer.register_forward_pre_hook(lambda *_: depth.__setitem__(0, depth[0] + 1)),
        layer.register_forward_hook(lambda *_: depth.__setitem__(0, depth[0] - 1)))]

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights and storage.data_ptr() not in saved:
            saved[storage.data_ptr()] = storage.nbytes()
            if depth[0]:
                in_layers.add(storage.data_ptr())
        return t

    policy.zero_grad(set_to_none=True)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = losses(policy, rows, pad_id, both)
    finally:
        for h in hooks:
            h.remove()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad}
    return grads, sum(saved.values()), sum(saved[k] for k in in_layers)


def nonzero_b(policy, seed: int = 0) -> None:
    """LoRA B matrices start at 0 (no gradient reaches A): set them to small seeded values."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)


@pytest.mark.slow
def test_embedded_model_same_gradients_and_a_fraction_of_the_saved_bytes():
    """The embedded SmolLM2-135M (30 layers, float32, CPU), in eval mode as the GRPO update runs it
    (``disable_dropout``): checkpointing changes no gradient and keeps ~1/10 of the bytes."""
    from memsearch.train.policy import load_policy

    policy, tokenizer, _ = load_policy("embedded", None, LoraSettings(r=4, alpha=8), device="cpu", seed=0)
    nonzero_b(policy)
    rows = rows_of(len(tokenizer), prompt_len=48, completion_len=12)
    assert not policy.training
    plain, plain_bytes, plain_layer_bytes = backward_measured(policy, rows, tokenizer.pad_token_id, both=False)
    assert enable_checkpointing(policy) == 30
    ckpt, ckpt_bytes, ckpt_layer_bytes = backward_measured(policy, rows, tokenizer.pad_token_id, both=False)
    assert plain.keys() == ckpt.keys() and len(plain) == 30 * 7 * 2  # A and B of every projection
    assert all(bool(g.abs().sum() > 0) for g in plain.values())
    worst = max(float((plain[n] - ckpt[n]).abs().max()) for n in plain)
    assert worst <= 1e-6, worst
    # Measured: 12.5x fewer bytes in all (229.8 -> 18.5 MiB; 14.8x at 330 + 40 tokens a row), 18.8x
    # inside the decoder layers, which keep their inputs only; the rest is the embedding and logits.
    # The gradients were bit-identical (max abs difference 0.0).
    assert plain_bytes / ckpt_bytes > 10, (plain_bytes, ckpt_bytes, plain_layer_bytes, ckpt_layer_bytes)
    assert plain_layer_bytes / ckpt_layer_bytes > 15, (plain_layer_bytes, ckpt_layer_bytes)


def test_checkpointing_acts_under_grad_in_eval_mode_and_nowhere_else(tiny_model_dir, nonzero_lora):
    """Tiny Llama: the policy ``load_policy`` returns (eval mode) keeps its gradients and saves fewer
    bytes once checkpointed; without grad nothing changes (decoding with a KV cache included); a
    KV cache under grad is refused, since the recomputation would write it twice."""
    from memsearch.backends.base import GenerationRequest, SamplingParams
    from memsearch.backends.hf.decoder import BatchDecoder
    from memsearch.backends.hf.jobs import Job

    policy, tokenizer = nonzero_lora(tiny_model_dir, seed=4)
    rows = rows_of(len(tokenizer), prompt_len=20, completion_len=8)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def decode():
        jobs = [Job(GenerationRequest("memory", prompt_ids=tuple(r.prompt_ids), sampling=SamplingParams(max_tokens=6)),
                    list(r.prompt_ids), 6, 0.0) for r in rows]
        results = BatchDecoder(policy, tokenizer, share_prompts=False).generate(jobs)
        return [(r.completion_ids, r.logprobs) for r in results]

    decoded = decode()
    with torch.no_grad():
        scored = completion_logprobs(policy, rows, pad).logprobs
    plain, _, plain_layer_bytes = backward_measured(policy, rows, pad)
    assert enable_checkpointing(policy) == 2 and enable_checkpointing(policy) == 2  # idempotent
    assert is_checkpointed(policy) and not policy.training
    ckpt, _, ckpt_layer_bytes = backward_measured(policy, rows, pad)
    assert all(torch.allclose(plain[n], ckpt[n], rtol=0, atol=1e-6) for n in plain)
    assert ckpt_layer_bytes < plain_layer_bytes / 4, (plain_layer_bytes, ckpt_layer_bytes)
    assert decode() == decoded
    with torch.no_grad():
        assert torch.equal(completion_logprobs(policy, rows, pad).logprobs, scored)
    ids = torch.tensor([rows[0].prompt_ids])
    with torch.no_grad():
        policy(input_ids=ids, use_cache=True)  # no grad: a cache is fine
    with pytest.raises(RuntimeError, match="use_cache=False"):
        policy(input_ids=ids, use_cache=True)


def test_load_policy_checkpoints_when_asked(tiny_model_dir):
    from memsearch.train.policy import load_policy

    lora = LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"])
    policy, _, note = load_policy(str(tiny_model_dir), None, lora, device="cpu", gradient_checkpointing=True)
    assert is_checkpointed(policy) and "gradient checkpointing" in note
    policy, _, note = load_policy(str(tiny_model_dir), None, lora, device="cpu")
    assert not is_checkpointed(policy) and "checkpointing" not in note


def test_a_model_without_decoder_layers_is_refused():
    with pytest.raises(ValueError, match="set gradient_checkpointing = false"):
        enable_checkpointing(torch.nn.Sequential(torch.nn.Linear(2, 2)))



@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_a_checkpointed_grpo_update_is_the_same_update(tiny_model_dir, tiny_adapter_dir, dropout):
    """Two GRPO updates (2 epochs x 2 mini-batches, KL to the starting adapter) with and without
    checkpointing leave the same weights; with LoRA dropout trained in train mode too (the
    recomputation replays the dropout masks: non-reentrant checkpoints restore the RNG state)."""
    from tests.train.grpo.test_update import config, make_rows

    from memsearch.train.distributed import Dist
    from memsearch.train.grpo.trainer import update
    from memsearch.train.policy import load_policy, make_optimizer, trainable_named_parameters

    cfg = config(epochs=2, mini_batches_per_step=2, kl_coef=0.1, disable_dropout=dropout == 0.0,
                 lora=LoraSettings(r=4, alpha=8, dropout=dropout, target_modules=["q_proj", "v_proj"]))
    trained = []
    for checkpointing in (False, True):
        policy, tokenizer, _ = load_policy(str(tiny_model_dir), str(tiny_adapter_dir), cfg.lora, device="cpu",
                                           keep_reference=True, gradient_checkpointing=checkpointing)
        optimizer, _ = make_optimizer(policy, cfg.optim, 8)
        torch.manual_seed(11)
        for _ in range(2):
            update(policy, optimizer, Batch(rows=make_rows(len(tokenizer))), cfg, Dist(), tokenizer.eos_token_id)
        trained.append({n: p.detach().clone() for n, p in trainable_named_parameters(policy)})
    plain, ckpt = trained
    start = load_file(str(tiny_adapter_dir / "adapter_model.safetensors"))
    assert plain.keys() == ckpt.keys()
    assert all(torch.allclose(plain[n], ckpt[n], rtol=0, atol=1e-6) for n in plain)
    assert max(float((plain[n] - start[n.replace(".default", "")]).abs().max()) for n in plain) > 1e-3  # it trained


def test_a_checkpointed_sft_run_trains_the_same_adapter(tiny_model_dir, short_sft_rows, short_sft_config, tmp_path):
    """SFT (6 steps from a fresh LoRA) ends with the same adapter with checkpointing on or off."""
    from memsearch.train.sft.trainer import train_sft

    for checkpointing in (False, True):
        train_sft(short_sft_config(tiny_model_dir, short_sft_rows, gradient_checkpointing=checkpointing),
                  tmp_path / f"sft-{checkpointing}", echo=lambda _: None)
    plain = load_file(str(tmp_path / "sft-False" / "adapter" / "adapter_model.safetensors"))
    ckpt = load_file(str(tmp_path / "sft-True" / "adapter" / "adapter_model.safetensors"))
    assert plain.keys() == ckpt.keys()
    assert all(torch.allclose(plain[k], ckpt[k], rtol=0, atol=1e-6) for k in plain)
    assert any(float(plain[k].abs().max()) > 0 for k in plain if "lora_B" in k)  # B left 0: it trained

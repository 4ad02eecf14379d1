"""The ``q4`` weights of the ``hf`` backend: the embedded model's own 4-bit blocks, run by PyTorch.

Why
    One decoded token of a small model on a CPU is bound by memory bandwidth: the float32 model
    reads 538 MB of weights per token, while the GGUF file it was converted from holds 98 MB.
    The shipped file stores every decoder-layer matrix as Q4_1 blocks (32 weights: a float16
    scale ``d`` and minimum ``m``, 4-bit ``q``; weight = ``d * q + m``) and the output head as
    Q8_0, so its float32 conversion is exactly those blocks dequantized (``tests`` check 0
    difference). ``q4`` runs the blocks themselves through PyTorch's int4 CPU kernel
    (``aten._weight_int4pack_mm_for_cpu``) instead: about a fifth of the bytes per token.

What changes in the numbers (against ``float32``, the reference)
    - decode (one position a row): the block scales and zero points are held in bfloat16 (the
      kernel's form; ``m + 8 d`` as the zero point, since the kernel computes
      ``(q - 8) * scale + zero``); prefill (several positions a row): oneDNN's bfloat16 GEMM on
      the dequantized weights rounded to bfloat16, twice the int4 kernel's speed there; the
      output head is the float32 head rounded to bfloat16. Relative weight error at most 2**-9;
    - the inputs of those matmuls are rounded to bfloat16; products accumulate in float32;
    - norms, rotary embedding, attention, the residual stream and the KV cache stay float32.
    Greedy answers agree with float32 on most prompts, not all (docs/results/decode_speed.md);
    it is another engine, so runs record it (``HFSettings.weights``) and never mix it with float32.

How
    ``Q4Forward`` is a decoder forward of its own for the Llama architecture (the embedded
    model's): q/k/v and gate/up as one matmul each, a rotary table computed once. ``BatchDecoder``
    calls it in place of the transformers forward, with the same in-place KV cache, so batching,
    shared prompts and constraints work as before.

Batch invariance
    A row's logits are the same bit for bit alone or in any batch (left padding, joining a
    running batch; tested): each row attends over its own real columns with an SDPA call of its
    own, and the int4 kernel and the bfloat16 GEMM (for two or more rows) give a row the same sums
    whatever the others. Without it, float32 round-off that masking and padding put into the
    attention flipped bfloat16 roundings downstream: 3 of 16 greedy completions changed with the
    batch. (float32 promises no such thing; its differences are just too small to flip a token.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memsearch.errors import InputValueError

GROUP = 32  # weights per Q4_1 block
_Q4_1_BLOCK_BYTES = 20  # float16 d, float16 m, 16 bytes of nibbles
# GGUF tensor name part -> (transformers module path inside a decoder layer)
_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def q4_available() -> str | None:
    """None when this PyTorch has the int4 CPU kernel, else why not."""
    ops = torch.ops.aten
    if not (hasattr(ops, "_weight_int4pack_mm_for_cpu") and hasattr(ops, "_convert_weight_to_int4pack_for_cpu")):
        return f"torch {torch.__version__} has no int4 CPU kernel (aten._weight_int4pack_mm_for_cpu; torch >= 2.6)"
    return None


@dataclass(frozen=True)
class Q4Block:
    """One matrix as Q4_1 blocks: ``q`` (out, in) int32 in 0..15, ``d`` and ``m`` (out, in / 32) float32."""

    q: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor

    def dequantized(self) -> torch.Tensor:
        """The float32 weights the blocks stand for (``d * q + m``), as the GGUF reader computes them."""
        rows, cols = self.q.shape
        grouped = self.q.float().view(rows, cols // GROUP, GROUP)
        return (grouped * self.d[..., None] + self.m[..., None]).view(rows, cols)


def _rope_rows(rows: int, heads: int) -> torch.Tensor:
    """The row order transformers gives a q or k projection read from GGUF (llama.cpp stores each
    head's rotary halves interleaved; transformers un-permutes them when it converts)."""
    return torch.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(2, 1).reshape(rows)


def read_q4_blocks(gguf_file: str | Path, config: Any) -> list[dict[str, Q4Block]]:
    """Every decoder layer's matrices as Q4_1 blocks, keyed by transformers module path
    (``self_attn.q_proj``...), rows in transformers' order. Refuses a file whose layer matrices
    are not all Q4_1."""
    from gguf import GGMLQuantizationType, GGUFReader

    reader = GGUFReader(str(gguf_file))
    layers: list[dict[str, Q4Block]] = [{} for _ in range(int(config.num_hidden_layers))]
    for tensor in reader.tensors:
        parts = tensor.name.split(".")
        if parts[0] != "blk" or parts[2] not in _LAYER_TENSORS:
            continue
        if tensor.tensor_type != GGMLQuantizationType.Q4_1:
            raise InputValueError(f"{gguf_file}: {tensor.name} is {tensor.tensor_type.name}, not Q4_1: "
                                  "hf weights = 'q4' runs Q4_1 blocks only")
        cols, rows = (int(n) for n in tensor.shape)  # GGUF lists the inner dimension first
        blocks = np.asarray(tensor.data).view(np.uint8).reshape(rows * cols // GROUP, _Q4_1_BLOCK_BYTES)
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32).reshape(rows, cols // GROUP)
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32).reshape(rows, cols // GROUP)
        nibbles = blocks[:, 4:]  # element i of a block in the low nibble of byte i, element 16 + i in the high one
        q = np.concatenate([nibbles & 0xF, nibbles >> 4], axis=1).reshape(rows, cols).astype(np.int32)
        block = Q4Block(torch.from_numpy(q), torch.from_numpy(d), torch.from_numpy(m))
        name = _LAYER_TENSORS[parts[2]]
        if name in ("self_attn.q_proj", "self_attn.k_proj"):
            heads = config.num_attention_heads if name == "self_attn.q_proj" else config.num_key_value_heads
            order = _rope_rows(rows, int(heads))
            block = Q4Block(block.q[order], block.d[order], block.m[order])
        layers[int(parts[1])][name] = block
    missing = [(i, n) for i, layer in enumerate(layers) for n in _LAYER_TENSORS.values() if n not in layer]
    if missing:
        raise InputValueError(f"{gguf_file}: no Q4_1 tensor for layer {missing[0][0]} {missing[0][1]}")
    return layers


class Q4Matmul:
    """``x @ W.T`` for a matrix held as Q4_1 blocks (several matrices stacked by rows): one decoded
    position a row through the int4 kernel on the packed blocks (reads a fifth of the bytes);
    a prefill through a bfloat16 GEMM on the dequantized blocks (compute-bound there, and oneDNN's
    bfloat16 GEMM is about twice the int4 kernel's speed). Both give each row the same numbers
    whatever the other rows (module doc); they differ from each other by bfloat16 round-off."""

    def __init__(self, blocks: list[Q4Block]) -> None:
        q = torch.cat([b.q for b in blocks])
        d = torch.cat([b.d for b in blocks])
        m = torch.cat([b.m for b in blocks])
        self.out_features = q.shape[0]
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        # (in / 32, out, 2): per block the kernel's scale and zero point, (q - 8) * d + (m + 8 d) = d q + m
        self.scales_zeros = torch.stack([d, m + 8 * d], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
        self.dense = Q4Block(q, d, m).dequantized().to(torch.bfloat16)

    def __call__(self, x: torch.Tensor, prefill: bool) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        if prefill:  # several positions a row, so never oneDNN's single-row path (whose sums differ)
            out = torch.nn.functional.linear(flat, self.dense)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_zeros)
        return out.view(*x.shape[:-1], self.out_features).float()


SUPPORTED_MODEL_TYPES = frozenset({"llama"})


def q4_problem(model: Any) -> str | None:
    """None when ``Q4Forward`` computes this transformers model's forward, else why not."""
    config = model.config
    rope = getattr(config, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default") if isinstance(rope, dict) else "default"
    problems = [
        (getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES, f"model type {config.model_type!r}"),
        (bool(getattr(config, "attention_bias", False)) or bool(getattr(config, "mlp_bias", False)), "biases"),
        (getattr(config, "hidden_act", "silu") != "silu", f"activation {config.hidden_act!r}"),
        (rope_type != "default", f"rope type {rope_type!r}"),
        (hasattr(model, "peft_config"), "a LoRA adapter"),
        (next(model.parameters()).device.type != "cpu", "a device other than the CPU"),
    ]
    found = [what for bad, what in problems if bad]
    return f"the q4 forward does not support {', '.join(found)}" if found else None


class Q4Forward:
    """The logits of each row's last position, computed with the model's Q4_1 blocks (module doc).

    Called like ``BatchDecoder._forward``: ``input_ids`` (B, T), ``mask`` (B, L) True on real
    cache columns (the T new ones included, last), ``position_ids`` (B, T), ``cache`` a
    ``DynamicCache`` of the decoder's in-place layers; returns (B, vocab) float32.
    """

    def __init__(self, model: Any, blocks: list[dict[str, Q4Block]]) -> None:
        problem = q4_problem(model)
        if problem:
            raise InputValueError(problem)
        config = model.config
        body = model.model
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.hidden = int(config.hidden_size)
        self.eps = float(config.rms_norm_eps)
        self.embed = body.embed_tokens.weight
        self.final_norm = body.norm.weight
        self.head = model.get_output_embeddings().weight.to(torch.bfloat16)
        self.layers = []
        for layer, found in zip(body.layers, blocks, strict=True):
            self.layers.append((
                layer.input_layernorm.weight,
                Q4Matmul([found["self_attn.q_proj"], found["self_attn.k_proj"], found["self_attn.v_proj"]]),
                Q4Matmul([found["self_attn.o_proj"]]),
                layer.post_attention_layernorm.weight,
                Q4Matmul([found["mlp.gate_proj"], found["mlp.up_proj"]]),
                Q4Matmul([found["mlp.down_proj"]]),
            ))
        # The rotary angles of every position, as transformers computes them (its own module).
        positions = torch.arange(int(config.max_position_embeddings))[None]
        cos, sin = body.rotary_emb(self.embed[:1].float(), positions)
        self.cos, self.sin = cos[0].float(), sin[0].float()

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = self.head_dim // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, real: list[int]) -> torch.Tensor:
        """Attention of each row over its own real columns only (``real[b]``: how many, the last
        ones), one SDPA call a row: no padding enters a row's sums, so its numbers are those it
        gets alone (module doc). New positions that are left padding (prefill) get zeros."""
        rows, _, new, _ = q.shape
        width = keys.shape[2]
        nn = torch.nn.functional
        if rows == 1 and real[0] == width:
            return nn.scaled_dot_product_attention(q, keys, values, is_causal=new > 1, enable_gqa=True)
        out = q.new_zeros(q.shape) if new > 1 else None
        parts = []
        for b, n in enumerate(real):
            start, take = width - n, min(new, n)
            a = nn.scaled_dot_product_attention(q[b : b + 1, :, new - take :], keys[b : b + 1, :, start:],
                                                values[b : b + 1, :, start:], is_causal=take > 1, enable_gqa=True)
            if out is None:
                parts.append(a)
            else:
                out[b : b + 1, :, new - take :] = a
        return torch.cat(parts) if out is None else out

    @staticmethod
    def _real_columns(mask: torch.Tensor, new: int) -> list[int]:
        """Each row's count of real cache columns, which must be its last ones (left padding);
        several new positions only over an empty cache (a prefill), as ``BatchDecoder`` calls it."""
        real = mask.sum(1)
        if not bool((mask.flip(1).to(torch.int8).cumprod(1).sum(1) == real).all()):
            raise ValueError("q4 forward: a row's real cache columns are not its last ones (left padding only)")
        if new > 1 and mask.shape[1] != new:
            raise ValueError("q4 forward: several new positions over a non-empty cache (prefill takes a fresh one)")
        return real.tolist()

    def __call__(self, input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
                 cache: Any) -> torch.Tensor:
        rows, new = input_ids.shape
        nn = torch.nn.functional
        x = self.embed[input_ids]
        cos = self.cos[position_ids][:, None]  # (B, 1, T, D)
        sin = self.sin[position_ids][:, None]
        real = self._real_columns(mask, new)
        prefill = new > 1  # a one-token prompt is prefilled like a decode step
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for i, (norm1, qkv, out, norm2, gate_up, down) in enumerate(self.layers):
            h = nn.rms_norm(x, (self.hidden,), norm1, self.eps)
            q, k, v = qkv(h, prefill).split((q_size, kv_size, kv_size), dim=-1)
            q = self._rotate(q.view(rows, new, self.heads, self.head_dim).transpose(1, 2), cos, sin)
            k = self._rotate(k.view(rows, new, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
            v = v.view(rows, new, self.kv_heads, self.head_dim).transpose(1, 2)
            keys, values = cache.layers[i].update(k, v)
            a = self._attend(q, keys, values, real)
            x = x + out(a.transpose(1, 2).reshape(rows, new, q_size), prefill)
            h = nn.rms_norm(x, (self.hidden,), norm2, self.eps)
            g, u = gate_up(h, prefill).chunk(2, dim=-1)
            x = x + down(nn.silu(g) * u, prefill)
        last = nn.rms_norm(x[:, -1], (self.hidden,), self.final_norm, self.eps)
        # (V, H) @ (H, B), as BatchDecoder._forward does for a plain head
        return (self.head @ last.T.to(torch.bfloat16)).T.float()


def embedded_q4_forward(model: Any) -> Q4Forward:
    """``Q4Forward`` over the embedded model's shipped GGUF blocks (``model`` is its float32 load)."""
    from memsearch.assets.embedded import gguf_path

    reason = q4_available()
    if reason:
        raise InputValueError(f"hf weights = 'q4': {reason}")
    return Q4Forward(model, read_q4_blocks(gguf_path(), model.config))

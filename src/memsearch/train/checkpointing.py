"""Activation checkpointing of the trained policy's decoder layers (``gradient_checkpointing``).

Each decoder layer's forward runs inside a *non-reentrant* ``torch.utils.checkpoint``: autograd
keeps the layer's inputs (its hidden states, position embeddings, attention mask) and drops
everything computed inside it (the projections, attention, the MLP's wide intermediates), which
the backward pass recomputes from those inputs, one layer at a time. The gradients are the same
(the same operations on the same inputs; ``tests/train/test_checkpointing.py`` measures the
saved bytes and the largest gradient difference); the forward of every layer runs twice.

Why not transformers' ``gradient_checkpointing_enable``: its layers checkpoint only while
``module.training`` is True, and the GRPO update runs in eval mode (``disable_dropout``, the
default: the log-probs of the function that sampled), so it would never act. Here the rule is
autograd's: a layer checkpoints whenever grad mode is on (the update's forward passes, SFT's
training step) and never under ``torch.no_grad`` / ``torch.inference_mode`` (rollouts, the old
and reference log-probs, evaluation), which keep their speed and their KV cache. A checkpointed
forward must not carry a KV cache (the recomputation would append to it a second time): the
trainers' scoring passes ``use_cache=False``, and a cache under grad mode is refused.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

# The names transformers has given a decoder layer's KV cache argument (5.x: ``cache``).
_CACHE_KWARGS = ("cache", "past_key_values", "past_key_value", "layer_past")


def decoder_layers(model) -> list[torch.nn.Module]:
    """The outermost repeated blocks of ``model`` (under a PEFT wrapper or not) that transformers
    marks as checkpointable (``GradientCheckpointingLayer``: the decoder layers), in order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    found: list[torch.nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():  # pre-order: a block comes before the modules inside it
        if id(module) in inside:
            continue
        if isinstance(module, GradientCheckpointingLayer):
            found.append(module)
            inside.update(id(m) for m in module.modules())
    return found


def enable_checkpointing(model) -> int:
    """Checkpoint every decoder layer of ``model`` while grad mode is on (module doc); returns the
    number of layers. Idempotent. ``ValueError`` for a model without such layers."""
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__}: no decoder layers transformers can checkpoint "
                         "(GradientCheckpointingLayer); set gradient_checkpointing = false")
    for layer in layers:
        if not getattr(layer, "_memsearch_checkpointed", False):
            # An instance attribute: nn.Module.__call__ looks ``forward`` up on the instance first,
            # so module hooks stay outside the checkpoint (they run once, not again on recompute).
            layer.forward = _checkpointed(layer.forward)
            layer._memsearch_checkpointed = True
    return len(layers)


def is_checkpointed(model) -> bool:
    """Whether ``enable_checkpointing`` was applied to ``model``'s decoder layers."""
    layers = decoder_layers(model)
    return bool(layers) and all(getattr(layer, "_memsearch_checkpointed", False) for layer in layers)


def _checkpointed(forward):
    """``forward`` run under a non-reentrant checkpoint when grad mode is on, as is otherwise."""
    from torch.utils.checkpoint import checkpoint

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        if kwargs.get("use_cache") or any(kwargs.get(name) is not None for name in _CACHE_KWARGS):
            raise RuntimeError("a checkpointed decoder layer got a KV cache under grad mode: the backward pass "
                               "would recompute the layer and write the cache twice; call the model with "
                               "use_cache=False when computing gradients")
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run

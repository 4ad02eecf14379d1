"""The in-place KV cache layer used by ``hf_decoder`` (preallocated buffers written in place,
so a decode step does not re-concatenate the cache), and the store of prompt KV caches that
requests with the same prompt share (``PromptStore``)."""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass

import torch


@functools.cache
def slab_layer_class():
    """A ``DynamicLayer`` whose keys/values live in preallocated buffers.

    ``DynamicLayer`` re-concatenates the whole cache at every step (on a 2-core CPU that copy
    was ~25% of a 16-row decode step); this one writes the new column in place. ``keys`` and
    ``values`` are views ``[start:end]`` of the buffers (SDPA reads strided views at the same
    speed). Rows are stacked and left-padded by ``assemble`` (joining a running batch, shared prompts), columns
    nobody attends to any more are dropped with ``drop_left``.
    """
    from transformers.cache_utils import DynamicLayer

    class SlabLayer(DynamicLayer):
        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.device = key_states.device
            self._k: torch.Tensor | None = None
            self._v: torch.Tensor | None = None
            self._start = self._end = 0
            self.is_initialized = True

        def _view(self) -> None:
            self.keys = self._k[:, :, self._start : self._end]
            self.values = self._v[:, :, self._start : self._end]

        def _alloc(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
            t = keys.shape[-2]
            self._k = keys.new_empty((*keys.shape[:2], t + room, keys.shape[-1]))
            self._v = values.new_empty((*values.shape[:2], t + room, values.shape[-1]))
            self._k[:, :, :t].copy_(keys)
            self._v[:, :, :t].copy_(values)
            self._start, self._end = 0, t
            self._view()

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n = key_states.shape[-2]
            if self._k is None:
                self._alloc(key_states, value_states, 0)
                return self.keys, self.values
            if self._end + n > self._k.shape[-2]:  # no room reserved: grow geometrically
                self._alloc(self.keys, self.values, max(n, self._end - self._start) + n)
            self._k[:, :, self._end : self._end + n].copy_(key_states)
            self._v[:, :, self._end : self._end + n].copy_(value_states)
            self._end += n
            self._view()
            return self.keys, self.values

        def reserve(self, room: int) -> None:
            """Make sure ``room`` more columns fit without reallocating."""
            if self._k is not None and self._k.shape[-2] - self._end < room:
                self._alloc(self.keys, self.values, room)

        def drop_left(self, n: int) -> None:
            if self._k is not None and n > 0:
                self._start = min(self._start + n, self._end)
                self._view()

        def assemble(self, parts: list[tuple[torch.Tensor, torch.Tensor, int]], room: int) -> None:
            """Become the batch-wise stack of ``parts`` = [(keys, values, left_pad)] (each
            (rows, heads, length, dim)), each left-padded with zeros to a common length, with
            ``room`` free columns after it. Used to join a running batch and to stack prompt KV
            rows shared between requests (``hf_decoder``, "Shared prompts")."""
            ks, vs, pad0 = parts[0]
            width = ks.shape[-2] + pad0
            rows = sum(k.shape[0] for k, _, _ in parts)
            self.lazy_initialization(ks, vs)
            self._k = ks.new_zeros((rows, ks.shape[1], width + room, ks.shape[-1]))
            self._v = vs.new_zeros((rows, vs.shape[1], width + room, vs.shape[-1]))
            b = 0
            for k, v, pad in parts:
                n = k.shape[0]
                self._k[b : b + n, :, pad:width].copy_(k)
                self._v[b : b + n, :, pad:width].copy_(v)
                b += n
            self._start, self._end = 0, width
            self._view()

        def release(self) -> None:
            """Drop this layer's buffers now (its rows were copied into another cache:
            ``BatchDecoder._merge``), so they are freed before the next layer is built."""
            self._k = self._v = None
            self.keys = self.values = None
            self._start = self._end = 0
            self.is_initialized = False

        def nbytes(self) -> int:
            """Bytes of this layer's key and value buffers (reserved room included)."""
            return sum(b.untyped_storage().nbytes() for b in (self._k, self._v) if b is not None)

        def get_seq_length(self) -> int:
            if not self.is_initialized or self._k is None:
                return 0
            return self._end - self._start

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self._k is not None:
                self._k, self._v = self._k[indices], self._v[indices]
                self._view()

        def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
            self.batch_select_indices(beam_idx.to(self.device))

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self._k is not None:
                self._k = self._k.repeat_interleave(repeats, dim=0)
                self._v = self._v.repeat_interleave(repeats, dim=0)
                self._view()

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove > 0:
                raise ValueError("crop takes a negative number of tokens to remove")
            if self._k is not None and tokens_to_remove:
                self._end = max(self._start, self._end + tokens_to_remove)
                self._view()

        def reset(self) -> None:
            self._k = self._v = None
            self._start = self._end = 0
            super().reset()

    return SlabLayer



@dataclass
class StoredPrompt:
    """One prompt's KV rows (per layer: keys and values, (1, heads, length, dim)) and the
    logits of its last position."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    logits: torch.Tensor
    length: int


class PromptStore:
    """Prompt KV caches kept for reuse inside one decode run, least recently used first out.

    Bounded by ``max_tokens`` prompt tokens in all (0: keeps nothing). The decoder empties it
    when a run ends (``BatchDecoder.run``): the weights may change between runs (the GRPO
    trainer updates its live policy between rollouts), and a KV cache of the old weights must
    never answer a request of the new ones."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max(0, int(max_tokens))
        self._entries: OrderedDict[tuple[int, ...], StoredPrompt] = OrderedDict()
        self.tokens = 0

    def __contains__(self, key: tuple[int, ...]) -> bool:
        return key in self._entries

    def __getitem__(self, key: tuple[int, ...]) -> StoredPrompt:
        self._entries.move_to_end(key)
        return self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, key: tuple[int, ...], layers: list[tuple[torch.Tensor, torch.Tensor]], logits: torch.Tensor) -> None:
        """Keep ``key``'s KV rows (a prompt longer than ``max_tokens`` is not kept)."""
        if len(key) > self.max_tokens or key in self._entries:
            return
        while self._entries and self.tokens + len(key) > self.max_tokens:
            _, old = self._entries.popitem(last=False)
            self.tokens -= old.length
        self._entries[key] = StoredPrompt(layers, logits, len(key))
        self.tokens += len(key)

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = 0

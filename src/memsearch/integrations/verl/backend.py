"""``VerlPolicyBackend``: memsearch's ``PolicyBackend`` over verl's ``server_manager.generate``.

A request's chat messages become prompt ids through the chat template (``encode``: in the agent
loop, verl's continuous-token builder, i.e. the tokenizer's template with
``add_generation_prompt=True`` and ``data.apply_chat_template_kwargs``), the server samples the
completion ids and their log-probs, and the result carries the raw ids (never re-tokenized
text) so training rows are exactly what was sampled.

Budgets are memsearch's: a prompt longer than ``prompt_length`` is *not* sent (verl would
left-truncate it with a warning, cutting off the question); the call comes back as a request
error, which the engine counts (``counts.request_errors``) and training drops, and
``overflows`` counts it here. The completion cap is the engine's ``max_tokens`` for the call
(memory / answer / policy budget), never more than ``response_length``.

Sampling (temperature, top-p, top-k) is verl's (``rollout.*`` or ``val_kwargs``); memsearch's
per-call seeds are not sent: the servers sample with their own streams.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from memsearch.backends.base import GenerationRequest, GenerationResult, Usage

Encode = Callable[[list[dict[str, str]]], Awaitable[list[int]]]


class VerlPolicyBackend:
    """A policy backend that samples through a verl LLM server client (module doc).

    Args:
        server: verl's ``server_manager`` (``LLMServerClient``): ``await generate(request_id,
            prompt_ids=..., sampling_params=...)`` returning ``token_ids``, ``log_probs``, ``stop_reason``.
        encode: chat messages -> prompt ids (the chat template with the generation prompt).
        decode: completion ids -> text (special tokens skipped), what the engine parses.
        sampling_params: verl's sampling parameters for this rollout; ``max_tokens`` is set per call.
        prompt_length: the longest prompt the server may see (``rollout.prompt_length``).
        response_length: the longest completion (``rollout.response_length``).

    ``completed`` counts, per role, the calls answered without error (rows generated);
    ``overflows`` the prompts refused for exceeding ``prompt_length``.
    """

    def __init__(self, server: Any, encode: Encode, decode: Callable[[Sequence[int]], str],
                 sampling_params: dict[str, Any], prompt_length: int, response_length: int, name: str = "verl") -> None:
        self.name = name
        self.server = server
        self.encode = encode
        self.decode = decode
        self.sampling_params = dict(sampling_params)
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.completed: Counter[str] = Counter()
        self.overflows = 0

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Results in request order; a refused or failed call comes back with ``error`` set."""
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, request: GenerationRequest) -> GenerationResult:
        t0 = time.perf_counter()
        prompt = (
            list(request.prompt_ids) if request.prompt_ids is not None else await self.encode(list(request.messages))
        )
        if len(prompt) > self.prompt_length:
            self.overflows += 1
            return _error(
                f"prompt of {len(prompt)} tokens exceeds rollout.prompt_length = {self.prompt_length}; "
                "raise data.max_prompt_length or lower the memsearch budgets",
                prompt,
                t0,
            )
        cap = min(request.sampling.max_tokens, self.response_length)
        params = {**self.sampling_params, "max_tokens": cap}
        try:
            out = await self.server.generate(uuid.uuid4().hex, prompt_ids=prompt, sampling_params=params)
        except Exception as exc:  # a server failure is the engine's request error, not a crash of the batch
            return _error(f"{type(exc).__name__}: {exc}", prompt, t0)
        ids = list(out.token_ids)[:cap]
        if out.stop_reason == "aborted":
            return _error("generation aborted by the server", prompt, t0)
        if not ids:
            # verl reads a session's advantage at the last output's first generated token: an empty
            # completion cannot carry it, so the call is dropped like any failed call.
            return _error("empty completion", prompt, t0)
        logprobs = list(out.log_probs)[:cap] if out.log_probs is not None else None
        if logprobs is not None and len(logprobs) != len(ids):
            return _error(f"{len(ids)} completion ids but {len(logprobs)} log-probs", prompt, t0)
        self.completed[request.role] += 1
        return GenerationResult(
            text=self.decode(ids),
            finish_reason="length" if len(ids) >= cap else "stop",
            completion_ids=tuple(ids),
            logprobs=tuple(float(x) for x in logprobs) if logprobs is not None else None,
            prompt_ids=tuple(prompt),
            usage=Usage(prompt_tokens=len(prompt), completion_tokens=len(ids), source="reported"),
            latency_s=time.perf_counter() - t0,
        )

    async def aclose(self) -> None:
        """Nothing to release: the server belongs to verl."""


def _error(message: str, prompt: list[int], t0: float) -> GenerationResult:
    return GenerationResult(
        text="",
        finish_reason="error",
        prompt_ids=tuple(prompt),
        usage=Usage(prompt_tokens=len(prompt), completion_tokens=0, source="reported"),
        latency_s=time.perf_counter() - t0,
        error=message,
    )

"""A request's row in the ``hf`` decode loop (``Job``: its sampling, output so far, generator,
constraint state and where its result goes), and the result of a request that cannot be served
(``error_result``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from memsearch.backends.base import GenerationRequest, GenerationResult, SamplingParams, Usage


@dataclass(eq=False)
class Job:
    """One request on its way through the decoder."""

    request: GenerationRequest
    prompt_ids: list[int]
    max_new: int
    t0: float
    future: asyncio.Future | None = None
    loop: asyncio.AbstractEventLoop | None = None
    out_ids: list[int] = field(default_factory=list)
    out_lp: list[float] = field(default_factory=list)
    generator: torch.Generator | None = None
    finish: str | None = None
    stop_at: int | None = None  # character offset where a stop string starts
    constraint: Any = None  # a ``TokenConstraint`` (schema mode), and the row's state in it
    cstate: Any = None
    error: str | None = None  # why the row cannot go on (its constraint allows no token)

    @property
    def sampling(self) -> SamplingParams:
        return self.request.sampling

    def cancelled(self) -> bool:
        return self.future is not None and self.future.done()



def error_result(message: str, prompt_ids: Sequence[int] | None = None, t0: float | None = None) -> GenerationResult:
    return GenerationResult(
        text="",
        finish_reason="error",
        prompt_ids=tuple(prompt_ids) if prompt_ids is not None else None,
        usage=Usage(
            prompt_tokens=len(prompt_ids) if prompt_ids is not None else None,
            completion_tokens=0 if prompt_ids is not None else None,
            source="reported" if prompt_ids is not None else "none",
        ),
        latency_s=time.perf_counter() - t0 if t0 is not None else 0.0,
        error=message,
    )

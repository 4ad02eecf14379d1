"""The policy backend protocol: one way to ask any model (or rule set) for a decision.

A backend turns ``GenerationRequest``s into ``GenerationResult``s. Episodes run as asyncio
tasks and each awaits ``generate`` for its own calls; a backend may batch calls from many
episodes (HTTP concurrency for a server, dynamic batching for a local model).

``generate`` never raises because of a failed request: the result carries ``error`` and
``finish_reason == "error"``, so the engine can count request errors and keep the task in the
denominator instead of crashing a whole run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

# Part of the protocol (a request's ``constraint``); defined at the bottom so the memory layer can
# build the memory action format's constraints without importing a backend.
from memsearch.records.observation import Observation
from memsearch.text.constraint import Constraint


@dataclass(frozen=True)
class SamplingParams:
    """How to decode. ``temperature == 0`` means greedy. ``logprobs``: ask for per-token
    log-probs; the engine sets it only for the roles whose log-probs a consumer reads (a
    trainer's rollouts), since a server may pay for them on every token (``engine.episode``)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None
    logprobs: bool = False
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    """One policy call: chat ``messages`` (or raw ``prompt_ids``) plus how to decode."""

    role: str
    messages: tuple[dict[str, str], ...] = ()
    prompt_ids: tuple[int, ...] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    constraint: Constraint | None = None
    # The backend may use this for things it can compute locally (the rules backend reads the
    # structured observation instead of parsing the prompt text). Never holds labels.
    observation: Observation | None = None


@dataclass(frozen=True)
class Usage:
    """Token usage of one call. ``reported`` comes from the service; ``estimated`` from our
    tokenizer. The two are never added together."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    source: Literal["reported", "estimated", "none"] = "none"


@dataclass(frozen=True)
class GenerationResult:
    """What came back: text, raw completion token ids and log-probs when available."""

    text: str
    finish_reason: Literal["stop", "length", "error"] = "stop"
    completion_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    prompt_ids: tuple[int, ...] | None = None
    usage: Usage = field(default_factory=Usage)
    latency_s: float = 0.0
    error: str | None = None
    attempts: int = 1
    # The id of the constraint the tokens were sampled under (schema mode), so training can
    # replay its masks; None when decoding was unconstrained.
    constraint_id: str | None = None
    # The server's context cut the completion: finish_reason "length" with fewer completion
    # tokens than the request's max_tokens (a completion cut at max_tokens is the budget working).
    context_truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


@runtime_checkable
class PolicyBackend(Protocol):
    """Anything that answers policy calls."""

    name: str

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Results in request order; failed calls come back with ``error`` set."""
        ...

    async def aclose(self) -> None:
        """Release connections, threads or models."""
        ...

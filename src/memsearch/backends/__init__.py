"""Policy backends behind one protocol (``base.PolicyBackend``), built by kind from the registry
(``backends.registry``): ``rules``, ``hf``, ``openai``, ``oracle`` and any kind registered there."""

from __future__ import annotations

from collections.abc import Mapping

from memsearch.backends.base import (
    Constraint,
    GenerationRequest,
    GenerationResult,
    PolicyBackend,
    SamplingParams,
    Usage,
)
from memsearch.backends.registry import backend_kinds, make_backend, register_backend, unregister_backend


async def check_served_models(backends: Mapping[str, PolicyBackend]) -> None:
    """Ask each distinct backend that serves a model over HTTP what it serves (``check_model``:
    GET /models, kept as its ``served_identity``); ``InputError`` when a server cannot be reached
    or lists models without the configured one. Called once before a run's first task."""
    for backend in {id(b): b for b in backends.values()}.values():
        if hasattr(backend, "check_model"):
            await backend.check_model()


__all__ = ["Constraint", "GenerationRequest", "GenerationResult", "PolicyBackend", "SamplingParams", "Usage",
           "backend_kinds", "check_served_models", "make_backend", "register_backend", "unregister_backend"]

"""Policy backends behind one protocol (``base.PolicyBackend``): ``rules``, ``hf``, ``openai``."""

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
from memsearch.errors import InputValueError

BACKEND_KINDS = ("rules", "hf", "openai", "oracle")


def make_backend(cfg, tokenizer, dataset=None) -> PolicyBackend:
    """Build the backend a ``BackendConfig`` describes (heavy imports only for the one used).

    ``dataset`` (a loaded ``Dataset``) is needed only by the ``oracle`` teacher, which reads the
    train labels and refuses any other split."""
    if cfg.kind == "rules":
        from memsearch.backends.rules import RulesBackend

        return RulesBackend(tokenizer)
    if cfg.kind == "hf":
        from memsearch.backends.hf.backend import HFBackend

        return HFBackend(model=cfg.model, adapter=cfg.adapter, max_batch_size=cfg.max_concurrency)
    if cfg.kind == "openai":
        from memsearch.backends.openai import OpenAIBackend

        if not cfg.base_url:
            raise InputValueError("backend kind 'openai' needs base_url, e.g. http://127.0.0.1:8000/v1")
        return OpenAIBackend(base_url=cfg.base_url, model=cfg.model, max_concurrency=cfg.max_concurrency,
                             timeout_s=cfg.timeout_s, max_retries=cfg.max_retries, retry_window_s=cfg.retry_window_s,
                             tokenizer=tokenizer, extra_body=cfg.extra_body, schema_style=cfg.schema_style,
                             context_tokens=cfg.context_tokens)
    if cfg.kind == "oracle":
        from memsearch.backends.oracle import OracleBackend

        if dataset is None:
            raise ValueError("backend kind 'oracle' needs the dataset (its train labels)")
        return OracleBackend(dataset, tokenizer, open_items=cfg.open_items)
    raise InputValueError(f"unknown backend kind {cfg.kind!r}: expected one of {', '.join(BACKEND_KINDS)}")


async def check_served_models(backends: Mapping[str, PolicyBackend]) -> None:
    """Ask each distinct backend that serves a model over HTTP what it serves (``check_model``:
    GET /models, kept as its ``served_identity``); ``InputError`` when a server cannot be reached
    or lists models without the configured one. Called once before a run's first task."""
    for backend in {id(b): b for b in backends.values()}.values():
        if hasattr(backend, "check_model"):
            await backend.check_model()


__all__ = ["BACKEND_KINDS", "Constraint", "GenerationRequest", "GenerationResult", "PolicyBackend",
           "SamplingParams", "Usage", "check_served_models", "make_backend"]

"""Backend kinds by name: register one, list them, build the one a role's settings name.

A kind is one factory ``(cfg, tokenizer, dataset) -> PolicyBackend``, its settings model (a
``config.BackendConfig`` subclass with the keys it reads) and what the config checks ask of it
(``memsearch.registry.BackendKind``). The built-in kinds (rules, hf, openai, oracle) are
registered in ``memsearch.registry``, below the config that validates ``kind``, each naming the
``from_config`` of its module, which is imported only when that backend is built (a config check
or ``--help`` loads no torch). A new kind is one module and one call:

    class NoopSettings(BackendConfig):
        kind: Literal["noop"] = Field("noop", description="keeps nothing")
        answer: str = Field("unknown", description="what the reader answers")

    register_backend("noop", lambda cfg, tokenizer, dataset: NoopBackend(cfg.answer), settings=NoopSettings,
                     runs_model=False)

(tests/extension/test_add_backend.py runs such a backend through the engine).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from memsearch.backends.base import PolicyBackend
from memsearch.registry import BACKEND_KINDS, BackendKind, load_factory, register_backend_kind


def register_backend(kind: str, factory: Callable[..., PolicyBackend] | str, *, settings: type | str | None = None,
                     runs_model: bool = True, schema_mode: bool = False) -> BackendKind:
    """Make ``kind`` a backend kind configs may name (``backends.<role>.kind``); ``factory(cfg,
    tokenizer, dataset)`` builds it (a callable or ``"module:attribute"``) from ``cfg``, an
    instance of ``settings`` (its settings model; none: the keys every kind shares).
    ``runs_model`` and ``schema_mode``: ``memsearch.registry.BackendKind``. A kind already
    registered is refused."""
    spec = BackendKind(factory, runs_model=runs_model, schema_mode=schema_mode)
    return register_backend_kind(kind, spec if settings is None else replace(spec, settings=settings))


def unregister_backend(kind: str) -> BackendKind:
    """Remove ``kind`` (a test's teardown, a plugin replacing a kind)."""
    return BACKEND_KINDS.unregister(kind)


def backend_kinds() -> tuple[str, ...]:
    """The registered backend kinds, in registration order."""
    return BACKEND_KINDS.names()


def make_backend(cfg: Any, tokenizer: Any, dataset: Any = None) -> PolicyBackend:
    """Build the backend a role's settings (a ``BackendConfig``) describe with its kind's factory (``InputValueError``
    naming the registered kinds for an unknown one). ``dataset`` (a loaded ``Dataset``) is read
    only by kinds that need it, e.g. the ``oracle`` teacher, which reads the train labels."""
    return load_factory(BACKEND_KINDS.get(cfg.kind).factory)(cfg, tokenizer, dataset)

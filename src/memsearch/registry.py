"""Named extension points: what a config may name as a backend kind or a memory mode, and the
generic ``Registry`` that the dataset converters (``data.converters``) and the metrics
(``eval.metrics``) use as well.

A run config is checked in the foundation layer (``memsearch.config``), below the backends and the
engine that implement kinds and modes (docs/design.md §11). So the entries a config check reads
live here: a name, the properties the checks and the rule-based backends ask about, and a
factory, given as a callable or as ``"module:attribute"``. The layer that builds the thing
(``backends.registry.make_backend``, ``engine.memory_modes.make_memory``) imports a named
factory only when it builds one, so checking a config or ``memsearch --help`` loads no model code.

    from memsearch.registry import BackendKind, register_backend_kind
    register_backend_kind("noop", BackendKind(factory=lambda cfg, tokenizer, dataset: NoopBackend(),
                                              runs_model=False, settings=NoopSettings))
    # configs may now say  [backends.memory] kind = "noop", with the keys NoopSettings declares
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator

from memsearch.errors import InputValueError

T = TypeVar("T")


def either(names: tuple[str, ...] | list[str]) -> str:
    """``'a', 'b' or 'c'``: how an error lists the names it expected."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


class Registry(Generic[T]):
    """Entries by name, in registration order. ``what`` names one entry in messages
    (``"backend kind"``)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> T:
        """Add ``entry`` as ``name``; a name already taken is refused (``ValueError``): two
        components answering to one name would make every run that names it ambiguous."""
        if not isinstance(name, str) or not name or name != name.strip():
            raise ValueError(f"a {self.what} needs a non-empty name without surrounding spaces, got {name!r}")
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is registered already; unregister it first to replace it")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> T:
        """Remove ``name`` and return its entry (a test's teardown, a plugin being replaced)."""
        if name not in self._entries:
            raise KeyError(self.problem(name))
        return self._entries.pop(name)

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        # Over a copy: a loop that registers or unregisters does not break.
        return iter(tuple(self._entries))

    def problem(self, name: object) -> str | None:
        """Why ``name`` is not a registered entry, naming the registered ones; ``None`` if it is."""
        if isinstance(name, str) and name in self._entries:
            return None
        return f"unknown {self.what} {name!r}; registered: {either(self.names()) if self._entries else 'none'}"

    def check(self, name: str) -> str:
        """``name`` if registered, else ``InputValueError`` naming the registered ones (a config
        field's validator: pydantic reports a ``ValueError`` under the field's key)."""
        self.get(name)
        return name

    def get(self, name: str) -> T:
        """The entry of ``name``; ``InputValueError`` (a ``ValueError``) listing the registered
        names when there is none: a config or command-line value names it."""
        problem = self.problem(name)
        if problem:
            raise InputValueError(problem)
        return self._entries[name]


def load_factory(factory: Callable[..., Any] | str) -> Callable[..., Any]:
    """``factory`` itself, or the attribute a ``"package.module:attribute"`` string names (dots
    after the colon walk into it: ``"m:Class.method"``), imported now."""
    if callable(factory):
        return factory
    module, _, attribute = factory.partition(":")
    if not module or not attribute:
        raise ValueError(f"factory {factory!r}: expected a callable or 'package.module:attribute'")
    target: Any = importlib.import_module(module)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


@dataclass(frozen=True)
class BackendKind:
    """A backend kind (``backends.<role>.kind``).

    ``factory(cfg, tokenizer, dataset)`` returns a ``backends.base.PolicyBackend`` for one
    role's settings ``cfg`` (``dataset``: the loaded ``Dataset``, or ``None`` where a caller has
    none). ``settings``: the kind's settings model, a subclass of ``config.BackendConfig`` (or
    ``"module:attribute"``) holding the keys the kind reads, its ``kind`` field a ``Literal`` of
    the name; the default is ``BackendConfig`` itself (the keys every kind shares). ``runs_model``:
    it runs a model (a rule-based kind does not: the record of what produced a run says so, and a
    model setting given it is refused as never read). ``schema_mode``: it can constrain memory
    operations to their JSON schema (``backends.memory.schema_mode``)."""

    factory: Callable[..., Any] | str
    runs_model: bool = True
    schema_mode: bool = False
    settings: type | str = "memsearch.config.backend:BackendConfig"


@dataclass(frozen=True)
class MemoryMode:
    """A memory mode (``agent.memory``).

    ``factory(tokenizer, budget, settings)`` returns the memory strategy of one episode
    (``engine.memory_modes.MemoryStrategy``; ``settings``: ``engine.memory_modes.MemorySettings``).
    ``answer_format``: what the reader is asked for, ``"boxed"`` (a ``\\boxed{}`` answer, scored on
    the box: ``eval.score``) or ``"free"``. ``operations``: the memory policy writes
    ADD / UPDATE / DELETE / NOOP batches to an item store (schema mode, branching, the extractive
    format and the memory role's training rows apply), not free-text notes. ``streams``: usable
    with ``agent.evidence = "stream"``, where every chunk is read."""

    factory: Callable[..., Any] | str
    answer_format: Literal["boxed", "free"] = "free"
    operations: bool = False
    streams: bool = True


BACKEND_KINDS: Registry[BackendKind] = Registry("backend kind")
MEMORY_MODES: Registry[MemoryMode] = Registry("memory mode")


def register_backend_kind(kind: str, spec: BackendKind) -> BackendKind:
    """Make ``kind`` a backend kind configs may name (``backends.registry.register_backend`` is
    the same with the spec's fields as arguments)."""
    return BACKEND_KINDS.register(kind, spec)


def backend_settings(kind: str) -> Any:
    """The settings model of the registered ``kind`` (imported now when named as a string)."""
    return load_factory(BACKEND_KINDS.get(kind).settings)


def register_memory_mode(name: str, spec: MemoryMode) -> MemoryMode:
    """Make ``name`` a memory mode configs may name (``agent.memory``)."""
    return MEMORY_MODES.register(name, spec)


def memory_mode(name: str) -> MemoryMode:
    """The registered memory mode ``name`` (``InputValueError`` listing the registered ones)."""
    return MEMORY_MODES.get(name)


# Config field types: a string that must name a registered entry when the config is validated
# (pydantic reports the registry's error under the field's key).
BackendKindName = Annotated[str, AfterValidator(lambda name: BACKEND_KINDS.check(name))]
MemoryModeName = Annotated[str, AfterValidator(lambda name: MEMORY_MODES.check(name))]


# The built-in kinds and modes: one registration each. Their factories are imported by name when
# a run builds one (module doc), so these lines import nothing.
_SETTINGS = "memsearch.config.backend:"
register_backend_kind("rules", BackendKind("memsearch.backends.rules:from_config", runs_model=False,
                                           settings=_SETTINGS + "RulesSettings"))
register_backend_kind("hf", BackendKind("memsearch.backends.hf.backend:from_config", schema_mode=True,
                                        settings=_SETTINGS + "HFSettings"))
register_backend_kind("openai", BackendKind("memsearch.backends.openai:from_config", schema_mode=True,
                                            settings=_SETTINGS + "OpenAISettings"))
register_backend_kind("oracle", BackendKind("memsearch.backends.oracle:from_config", runs_model=False,
                                            settings=_SETTINGS + "OracleSettings"))

register_memory_mode("summary", MemoryMode("memsearch.engine.memory_modes:summary_memory"))
register_memory_mode("decision", MemoryMode("memsearch.engine.memory_modes:decision_memory", operations=True,
                                            streams=False))
# MemAgent: its reader answers in \boxed{}, and the protocol scores the box only.
register_memory_mode("overwrite", MemoryMode("memsearch.engine.memory_modes:overwrite_memory", answer_format="boxed"))

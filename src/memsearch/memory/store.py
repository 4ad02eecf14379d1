"""The bounded memory of decision mode: items with provenance, validated atomic batches.

A ``Memory`` holds ordered ``MemoryItem``s under a token budget. The policy changes it only
through batches of ops (``ops.py``); ``Memory.apply`` checks every rule on a scratch copy and
commits all or nothing. A rejected batch leaves items *and* the id counter untouched, and the
memory never evicts anything on the policy's behalf: staying within budget is the policy's
decision.

Rendering (what a policy sees, and what the budget is counted on)::

    [m1] (fact; d3:0, d5:2) Paris is the capital of France.
    [m4] (open) Which river flows through the capital?

one line per item in insertion order (an UPDATE keeps the item's place), kind then sources
in parentheses, lines joined by ``\\n`` with no trailing newline. An ``open`` item without
sources renders as ``(open)``. The empty memory renders as ``(empty)``, so a prompt never shows
a blank, and the budget must be large enough to hold that text.

A memory built with ``show_sources=False`` (the no-sources control, ``agent.memory_sources =
"hidden"``) renders every item without its sources (``[m1] (fact) Paris is ...``) and counts its
budget on that rendering, while the items keep their sources: provenance is still recorded and
scored, only the agent no longer sees it.

Stored text is the op's text with white space runs collapsed to single spaces: a newline in
an item would otherwise forge extra ``[m..]`` lines in the rendering.

A memory built with ``max_sources=n`` (``agent.memory_max_sources``) rejects an ADD or UPDATE
citing more than ``n`` distinct evidence ids: one item citing every shown sentence would
otherwise cite the gold ones too (memory support recall, docs/design.md §6).

Run the tests with ``uv run pytest tests/memory -q``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any, Literal

from memsearch.data.records import split_evidence_id
from memsearch.memory.extractive import parse_extractive
from memsearch.memory.ops import KINDS, OP_NAMES, Add, Delete, Kind, Noop, Op, Update, parse_ops
from memsearch.records.causes import InvalidCause, first_cause
from memsearch.tokenizer import Tokenizer

EMPTY_RENDER = "(empty)"
_ID_RE = re.compile(r"m([1-9][0-9]*)")


def normalize_text(text: str) -> str:
    """Item text as stored: white space runs collapsed to one space, ends stripped."""
    return " ".join(text.split())


@dataclass(frozen=True)
class MemoryItem:
    """One memory item: a fact with its evidence, or an open sub-question (``kind="open"``)."""

    id: str
    text: str
    sources: tuple[str, ...] = ()
    kind: Kind = "fact"

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", tuple(self.sources))
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")

    def render(self, show_sources: bool = True) -> str:
        """The item's line, e.g. ``[m1] (fact; d3:0, d5:2) Paris is the capital of France.``
        (``[m1] (fact) Paris is ...`` without ``show_sources``)."""
        tag = f"{self.kind}; {', '.join(self.sources)}" if self.sources and show_sources else self.kind
        return f"[{self.id}] ({tag}) {self.text}"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form."""
        return {"id": self.id, "text": self.text, "sources": list(self.sources), "kind": self.kind}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryItem:
        """Inverse of ``to_dict``."""
        return cls(id=data["id"], text=data["text"], sources=tuple(data.get("sources", ())),
                   kind=data.get("kind", "fact"))


def _zero_counts() -> dict[str, int]:
    return {name: 0 for name in OP_NAMES}


@dataclass(frozen=True)
class ApplyResult:
    """Outcome of one memory action (``Memory.apply`` / ``Memory.apply_text``).

    ``status`` is ``"applied"``, ``"rejected"`` (parsed, but a rule failed) or
    ``"parse_error"`` (no well-formed batch in the text). Only ``"applied"`` is a valid action.
    ``causes`` holds the ``InvalidCause`` of each reason (same order); ``cause`` is the batch's.
    ``executed`` counts ops by type that were actually applied (all zero unless applied);
    ``added_ids`` are the ids given to ADDs, in op order. ``proposed_tokens`` is the size the
    memory would have had after the batch (``None`` on a parse error).
    """

    status: Literal["applied", "rejected", "parse_error"]
    reasons: tuple[str, ...] = ()
    causes: tuple[InvalidCause, ...] = ()
    ops: tuple[Op, ...] | None = None
    executed: dict[str, int] = field(default_factory=_zero_counts)
    added_ids: tuple[str, ...] = ()
    tokens_before: int = 0
    tokens_after: int = 0
    proposed_tokens: int | None = None
    budget_tokens: int = 0

    @property
    def applied(self) -> bool:
        """True when the batch was valid and the memory changed accordingly."""
        return self.status == "applied"

    @property
    def valid(self) -> bool:
        """Alias of ``applied``: a parse error or a rejection is an invalid action."""
        return self.applied

    @property
    def reason(self) -> str | None:
        """All reasons in one line (``None`` when applied), for logs and feedback."""
        return "; ".join(self.reasons) if self.reasons else None

    @property
    def cause(self) -> InvalidCause | None:
        """Why the action is invalid (``trajectory.first_cause`` of ``causes``); ``None`` when applied."""
        return first_cause(self.causes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form, for trajectories."""
        return {
            "status": self.status,
            "valid": self.valid,
            "reasons": list(self.reasons),
            "causes": [str(c) for c in self.causes],
            "ops": None if self.ops is None else [op.to_json() for op in self.ops],
            "executed": dict(self.executed),
            "added_ids": list(self.added_ids),
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "proposed_tokens": self.proposed_tokens,
            "budget_tokens": self.budget_tokens,
        }


def _render(items: Iterable[MemoryItem], show_sources: bool = True) -> str:
    lines = [item.render(show_sources) for item in items]
    return "\n".join(lines) if lines else EMPTY_RENDER


def _dedupe(sources: Iterable[str]) -> tuple[str, ...]:
    # Citing the same sentence twice adds tokens and no provenance; keep the first mention.
    return tuple(dict.fromkeys(sources))


class Memory:
    """Ordered memory items under a token budget, changed only by validated atomic batches.

    The budget is counted with ``tokenizer`` on ``render()``. Ids are ``m1``, ``m2``, ... from
    a counter that only grows, so an id is never reused within an episode, even after DELETE.
    Two memories are equal when their snapshots, budgets and tokenizer names are equal.
    ``show_sources=False`` renders (and counts) items without their sources (module docstring).
    ``max_sources``: the most distinct sources an op may give one item (``None``: no cap).
    """

    def __init__(self, tokenizer: Tokenizer, budget_tokens: int, show_sources: bool = True,
                 max_sources: int | None = None) -> None:
        if max_sources is not None and max_sources < 1:
            raise ValueError(f"max_sources must be at least 1 (or None for no cap), got {max_sources}")
        empty = tokenizer.count(EMPTY_RENDER)
        if budget_tokens < empty:
            raise ValueError(
                f"budget_tokens={budget_tokens} cannot hold even the empty memory "
                f"({EMPTY_RENDER!r} is {empty} tokens with {tokenizer.name})"
            )
        self.tokenizer = tokenizer
        self.budget_tokens = budget_tokens
        self.show_sources = show_sources
        self.max_sources = max_sources
        self._items: tuple[MemoryItem, ...] = ()
        self._next_id = 1
        self._tokens = empty

    # -- reading ---------------------------------------------------------------------------

    @property
    def items(self) -> tuple[MemoryItem, ...]:
        """Items in rendering order."""
        return self._items

    @property
    def next_id(self) -> int:
        """Number the next ADD will get (``m{next_id}``)."""
        return self._next_id

    def get(self, item_id: str) -> MemoryItem | None:
        """The item with this id, or ``None``."""
        return next((item for item in self._items if item.id == item_id), None)

    def __len__(self) -> int:
        return len(self._items)

    def render(self) -> str:
        """The memory exactly as a policy sees it (format in the module docstring)."""
        return _render(self._items, self.show_sources)

    def tokens(self) -> int:
        """Tokens of ``render()`` with this memory's tokenizer (always ``<= budget_tokens``)."""
        return self._tokens

    def remaining_tokens(self) -> int:
        """``budget_tokens - tokens()``: room left, as shown to the policy."""
        return self.budget_tokens - self._tokens

    def snapshot(self) -> dict[str, Any]:
        """Plain JSON-able state: ``{"items": [...], "next_id": n}``."""
        return {"items": [item.to_dict() for item in self._items], "next_id": self._next_id}

    @classmethod
    def from_snapshot(cls, snapshot: dict[str, Any], tokenizer: Tokenizer, budget_tokens: int,
                      show_sources: bool = True, max_sources: int | None = None) -> Memory:
        """Rebuild a memory from ``snapshot()``; raises ``ValueError`` if it is inconsistent
        (duplicate or malformed ids, an id at or above ``next_id``, a fact without sources, an
        item over ``max_sources``, or over budget). Sources cannot be checked against what was
        shown: that is episode state the snapshot does not hold."""
        memory = cls(tokenizer, budget_tokens, show_sources, max_sources)
        items = tuple(MemoryItem.from_dict(d) for d in snapshot["items"])
        next_id = int(snapshot["next_id"])
        seen: set[str] = set()
        for item in items:
            match = _ID_RE.fullmatch(item.id)
            if match is None or int(match.group(1)) >= next_id or item.id in seen:
                raise ValueError(f"snapshot: bad or duplicate id {item.id!r} (next_id={next_id})")
            if item.kind == "fact" and not item.sources:
                raise ValueError(f"snapshot: fact {item.id!r} has no sources")
            if max_sources is not None and len(set(item.sources)) > max_sources:
                raise ValueError(f"snapshot: item {item.id!r} cites {len(set(item.sources))} sources, "
                                 f"over the cap of {max_sources}")
            seen.add(item.id)
        tokens = tokenizer.count(_render(items, show_sources))
        if tokens > budget_tokens:
            raise ValueError(f"snapshot: memory is {tokens} tokens, over the budget of {budget_tokens}")
        memory._items, memory._next_id, memory._tokens = items, next_id, tokens
        return memory

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Memory):
            return NotImplemented
        return (self.snapshot() == other.snapshot() and self.budget_tokens == other.budget_tokens
                and self.tokenizer.name == other.tokenizer.name and self.show_sources == other.show_sources
                and self.max_sources == other.max_sources)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (f"Memory({len(self._items)} items, next_id={self._next_id}, "
                f"{self._tokens}/{self.budget_tokens} tokens, {self.tokenizer.name})")

    # -- changing --------------------------------------------------------------------------

    def apply(self, ops: Iterable[Op], shown_evidence: Set[str]) -> ApplyResult:
        """Validate a batch and apply it atomically; all or nothing, never raises on rules.

        Ops run in order on a scratch copy (so ``DELETE m1`` then ``UPDATE m1`` is invalid).
        Every problem found is reported as ``"op i (NAME): ..."``; if there is any, the memory
        (items and id counter) is left exactly as it was. ``shown_evidence`` is every evidence
        id shown to the agent so far in the episode; only sources an op cites are checked
        against it and against ``max_sources`` (sources an UPDATE keeps were checked when first
        cited).
        """
        ops = tuple(ops)
        for op in ops:
            if not isinstance(op, (Add, Update, Delete, Noop)):
                raise TypeError(f"not a memory op: {op!r}")
        before = self._tokens
        problems: list[tuple[InvalidCause, str]] = []
        items = list(self._items)
        next_id = self._next_id
        deleted_by: dict[str, int] = {}  # id -> index of the op in this batch that deleted it
        added: list[str] = []

        if not ops:
            problems.append((InvalidCause.EMPTY_BATCH, "empty batch (use a single NOOP to change nothing)"))

        def index_of(item_id: str) -> int | None:
            return next((k for k, item in enumerate(items) if item.id == item_id), None)

        def missing(where: str, item_id: str) -> None:
            deleted = f" (deleted by op {deleted_by[item_id]})" if item_id in deleted_by else ""
            problems.append((InvalidCause.UNKNOWN_ID, f"{where}: id {item_id!r} does not exist{deleted}"))

        def check_content(where: str, text: str, sources: tuple[str, ...] | None, kind: str,
                          final_sources: tuple[str, ...]) -> None:
            if not text:
                problems.append((InvalidCause.EMPTY_TEXT, f"{where}: text is empty"))
            if sources is not None and self.max_sources is not None and len(sources) > self.max_sources:
                problems.append((InvalidCause.TOO_MANY_SOURCES, f"{where}: cites {len(sources)} distinct sources, "
                                 f"over the cap of {self.max_sources} per item (agent.memory_max_sources)"))
            for source in sources or ():
                if split_evidence_id(source) is None:
                    problems.append((InvalidCause.NOT_EVIDENCE_ID, f"{where}: source {source!r} is not an evidence "
                                     "id (expected 'doc_id:sentence_index')"))
                elif source not in shown_evidence:
                    problems.append((InvalidCause.UNSHOWN_SOURCE,
                                     f"{where}: source {source!r} was not shown to the agent"))
            if kind == "fact" and not final_sources:
                problems.append((InvalidCause.NO_SOURCE, f"{where}: a fact must cite at least one source"))

        for i, op in enumerate(ops):
            where = f"op {i} ({op.name})"
            if isinstance(op, Noop):
                if len(ops) > 1:
                    problems.append((InvalidCause.NOOP_NOT_ALONE,
                                     f"{where}: NOOP must stand alone, but the batch has {len(ops)} ops"))
            elif isinstance(op, Add):
                text, sources = normalize_text(op.text), _dedupe(op.sources)
                check_content(where, text, sources, op.kind, sources)
                # An invalid ADD still takes its id on the scratch copy so that later ops in
                # the batch are judged against the numbering the policy would have seen.
                item_id = f"m{next_id}"
                next_id += 1
                items.append(MemoryItem(item_id, text, sources, op.kind))
                added.append(item_id)
            elif isinstance(op, Update):
                k = index_of(op.id)
                if k is None:
                    missing(where, op.id)
                    continue
                old = items[k]
                text = normalize_text(op.text)
                sources = old.sources if op.sources is None else _dedupe(op.sources)
                kind = old.kind if op.kind is None else op.kind
                check_content(where, text, None if op.sources is None else sources, kind, sources)
                items[k] = MemoryItem(old.id, text, sources, kind)  # keeps its place
            else:  # Delete
                k = index_of(op.id)
                if k is None:
                    missing(where, op.id)
                    continue
                del items[k]
                deleted_by[op.id] = i

        proposed = self.tokenizer.count(_render(items, self.show_sources))
        if proposed > self.budget_tokens:
            problems.append((InvalidCause.OVER_BUDGET, f"memory after the batch would be {proposed} tokens, "
                             f"over the budget of {self.budget_tokens} tokens"))
        common = dict(ops=ops, tokens_before=before, proposed_tokens=proposed,
                      budget_tokens=self.budget_tokens)
        if problems:
            causes, reasons = zip(*problems, strict=True)
            return ApplyResult("rejected", reasons, causes, tokens_after=before, **common)

        # Commit: the only place the memory changes.
        self._items, self._next_id, self._tokens = tuple(items), next_id, proposed
        executed = _zero_counts()
        for op in ops:
            executed[op.name] += 1
        return ApplyResult("applied", (), executed=executed, added_ids=tuple(added),
                           tokens_after=proposed, **common)

    def apply_text(self, text: str, shown_evidence: Set[str], extract_from: Mapping[str, str] | None = None
                   ) -> ApplyResult:
        """Parse model text (``parse_ops``) and apply the batch. Never raises on model text.
        ``extract_from`` (evidence id -> ``"title\nsentence"`` shown): the text is in the
        extractive format (``memory.extractive``), whose items the memory writes from those.

        A parse failure gives ``status="parse_error"`` with the parser's reason; a parsed
        batch that breaks a rule gives ``status="rejected"``. Both are invalid actions and
        leave the memory unchanged.
        """
        parsed = parse_ops(text) if extract_from is None else parse_extractive(text, extract_from)
        if parsed.ops is None:
            return ApplyResult("parse_error", (f"parse error: {parsed.error}",), (InvalidCause.PARSE,),
                               tokens_before=self._tokens, tokens_after=self._tokens,
                               budget_tokens=self.budget_tokens)
        return self.apply(parsed.ops, shown_evidence)

"""Decision-mode memory: items with provenance, ADD / UPDATE / DELETE / NOOP ops, atomic batches.

    from memsearch.memory import Memory, parse_ops
    from memsearch.tokenizer import load_tokenizer

    memory = Memory(load_tokenizer("lexical"), budget_tokens=200)
    result = memory.apply_text(model_output, shown_evidence={"d3:0", "d5:2"})
    if not result.valid:
        print(result.status, result.reasons)  # an invalid action; memory unchanged
    print(memory.render())

``ops.py`` holds the op values and the tolerant parser; ``store.py`` the items, the memory and
the rules (see docs/design.md §5); ``faithfulness.py`` whether an item's text is supported by
the sentences it cites (which sources memory support recall counts, docs/design.md §6).
"""

from memsearch.memory.ops import (
    KINDS,
    OP_NAMES,
    Add,
    Delete,
    Kind,
    Noop,
    Op,
    ParseResult,
    Update,
    format_ops,
    ops_to_json,
    parse_ops,
)
from memsearch.memory.store import EMPTY_RENDER, ApplyResult, Memory, MemoryItem, normalize_text

__all__ = [
    "KINDS",
    "OP_NAMES",
    "EMPTY_RENDER",
    "Add",
    "ApplyResult",
    "Delete",
    "Kind",
    "Memory",
    "MemoryItem",
    "Noop",
    "Op",
    "ParseResult",
    "Update",
    "format_ops",
    "normalize_text",
    "ops_to_json",
    "parse_ops",
]

"""``Constraint``: the form a policy call's output must take, named by an id.

A value type, not an enforcer: the memory layer builds the memory action format's constraints
(``memory.action_format``), backends enforce them (``backends.hf.constraint`` masks tokens, a
server is sent the schema), and training replays a rollout's masks from the id its row stores.
It sits at the bottom of the package (docs/design.md §11) because all of those layers use it;
``memsearch.backends.base`` re-exports it as part of the policy protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Constraint:
    """An output constraint: a JSON schema, or one of a fixed set of strings.

    ``id`` names the constraint in training rows so the same mask can be replayed.
    """

    id: str
    json_schema: dict[str, Any] | None = None
    choices: tuple[str, ...] | None = None


__all__ = ["Constraint"]

"""What the trained policy decided, per GRPO step: the tokens that choose an operation, and a
histogram of the operations chosen (docs/training.md, "Reading a run").

The token entropy of a whole completion hides a collapse of the decision itself: most of a
memory completion is forced by the ops schema (a NOOP is ~13 tokens, nearly all forced), so a
policy that always writes NOOP can still show a healthy mean entropy. Two views that do not:

- **decision positions** (``decision_positions``): the completion tokens at which the choice is
  made. Memory role: the token that starts each op's name (``"op": "`` *here* ``ADD``...);
  controller role: the token that starts the first ``SEARCH`` / ``FINISH``. The update logs the
  mean entropy at those tokens (``decision_entropy``, under the schema mask in schema mode).
  The overwrite role (MemAgent's free-text memory) has no such token and logs none.
- **op histogram** (``op_histogram``): over the trained memory calls of a step, each applied op
  counts once under its name (a call with two ADDs counts two), and each invalid call once
  under its cause's bucket (``records.causes.CAUSES``): ``invalid_parse`` (not readable as
  ops), ``invalid_budget`` (the batch would overflow the memory budget), ``invalid_rule`` (any
  other rule: unknown id, source not shown, ...). A call whose request failed is a request
  error, not a decision, and is not counted.

``invalid_decision_credit`` (``DecisionRule``) decides whether the deciding tokens of
an invalid row stay in the loss: ``"all"`` (the penalty also lowers the probability of the op
chosen), ``"none"`` (every invalid row's deciding tokens leave the loss: its penalty trains only
what follows the choice) or ``"over_budget"`` (only a batch rejected for overflowing the memory
budget keeps its op tokens, since there the choice to add at all is the error; an item's own
errors, a source never shown or a text cut off, are masked). What each does on the CPU recipe:
docs/results/memory_policy_cpu_v2.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from memsearch.memory.ops import OP_NAMES
from memsearch.records.causes import CAUSES, InvalidCause
from memsearch.records.trajectory import Trajectory

# Where the decision starts in a completion's text, by call role: the match's end (memory) or
# start (controller) is the first character of the chosen name.
_OP_NAME_START = re.compile(r'"op"\s*:\s*"')
_CONTROLLER_CHOICE = re.compile(r"\b(?:SEARCH|FINISH)\b")
INVALID_BUCKETS = ("invalid_parse", "invalid_budget", "invalid_rule")
HISTOGRAM_KEYS = (*OP_NAMES, *INVALID_BUCKETS)


def decision_characters(text: str, role: str) -> list[int]:
    """Character offsets in ``text`` at which a decision of call ``role`` starts (module doc)."""
    if role == "memory":
        return [m.end() for m in _OP_NAME_START.finditer(text)]
    if role == "controller":
        first = _CONTROLLER_CHOICE.search(text)
        return [first.start()] if first else []
    return []


def decision_positions(completion_ids: Sequence[int], tokenizer: Any, role: str) -> list[int]:
    """Indices into ``completion_ids`` of the tokens that choose (the token whose decoded text
    covers a decision's first character)."""
    ids = list(completion_ids)
    if not ids:
        return []
    chars = decision_characters(tokenizer.decode(ids, skip_special_tokens=True), role)
    positions = []
    for offset in chars:
        # The first prefix whose decoded text reaches past ``offset`` ends with the deciding
        # token (binary search: decoded prefix lengths never shrink as tokens are added).
        lo, hi = 0, len(ids) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if len(tokenizer.decode(ids[: mid + 1], skip_special_tokens=True)) > offset:
                hi = mid
            else:
                lo = mid + 1
        if not positions or positions[-1] != lo:
            positions.append(lo)
    return positions


@dataclass(frozen=True)
class DecisionRule:
    """How a GRPO row's deciding tokens are found (``tokenizer``) and whether an invalid row keeps
    them in the loss (``invalid_decision_credit``: module doc); ``train.grpo.batch`` applies it as
    it builds each row."""

    tokenizer: Any
    invalid_decision_credit: str = "all"

    def positions(self, completion_ids: Sequence[int], role: str) -> list[int]:
        """The deciding tokens of a completion of call ``role`` (``decision_positions``)."""
        return decision_positions(completion_ids, self.tokenizer, role)

    def keeps(self, valid: bool, over_budget: bool) -> bool:
        """Whether a row with this verdict keeps its deciding tokens in the loss."""
        if valid or self.invalid_decision_credit == "all":
            return True
        return self.invalid_decision_credit == "over_budget" and over_budget


def histogram_bucket(cause: InvalidCause | str | None) -> str:
    """The histogram bucket of an invalid memory call with this cause (``None``, a call with no
    code: ``invalid_rule``, like an unrecognised reason of an old record)."""
    return CAUSES[InvalidCause(cause) if cause is not None else InvalidCause.OTHER].histogram


def op_histogram(trajectories: Iterable[Trajectory]) -> dict[str, int]:
    """Counts of applied ops by name (``Trajectory.executed``) and of invalid calls by cause, over
    the memory policy calls of ``trajectories``."""
    counts = dict.fromkeys(HISTOGRAM_KEYS, 0)
    for trajectory in trajectories:
        for call in trajectory.policy_calls(("memory",)):
            if call.valid is None:
                continue
            if call.valid is False:
                counts[histogram_bucket(call.invalid_cause)] += 1
                continue
            executed = trajectory.executed(call)
            for name in OP_NAMES:
                counts[name] += int(executed.get(name, 0))
    return counts

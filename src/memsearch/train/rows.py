"""A training row: one policy call of a trained role, as the SFT and GRPO trainers consume it
(docs/design.md §7).

A *row* holds the prompt token ids the model saw, the raw completion ids it sampled (never
re-tokenized text), the rollout log-probs, the loss mask (every completion token; observation and
retrieved text live in the prompt and are never in the loss), the constraint id (schema mode) and
the trajectory / group it belongs to. A row is frozen and complete when built: SFT rows come from
``train.sft.trainer``, GRPO rows (with their advantage and decision tokens) from
``train.grpo.batch``; the per-token loss weight of the aggregation is the update's, not the row's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from memsearch.records.events import PolicyCall
from memsearch.records.trajectory import Role, Trajectory

# What a trainer can train (a config's ``role``), not the role of one call
# (``backends.base.CALL_ROLES``): a trained role covers one or more call roles.
TrainedRole = Literal["memory", "controller", "memagent"]
TRAINED_ROLES: tuple[TrainedRole, ...] = get_args(TrainedRole)
# Earlier names of trained roles, as configs, train logs and verl parquet rows of earlier runs
# spell them: MemAgent's role was named after its memory mode ("overwrite").
EARLIER_ROLE_NAMES: dict[str, TrainedRole] = {"overwrite": "memagent"}


def upgrade_trained_role(name: object) -> object:
    """A trained role's current name for an earlier one; any other value as it is."""
    return EARLIER_ROLE_NAMES.get(name, name) if isinstance(name, str) else name


# Which policy-call roles a trained role covers (MemAgent trains the memory updates and the
# final answer together).
TRAINED_CALL_ROLES: dict[TrainedRole, tuple[Role, ...]] = {
    "memory": ("memory",),
    "controller": ("controller",),
    "memagent": ("memory", "reader"),
}


@dataclass(frozen=True)
class Row:
    """One trainable policy call, complete when built (module doc)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    rollout_logprobs: list[float]
    loss_mask: list[int]
    trajectory: int  # index of the trajectory in this step's batch (on this rank)
    group_index: int  # index of its group (one task's rollouts) in this step; not Trajectory.run_label
    role: str
    step: int  # the call's step inside the episode
    constraint_id: str | None = None
    advantage: float = 0.0
    decision_positions: list[int] = field(default_factory=list)  # completion tokens that choose (train.grpo.decisions)
    valid: bool = True  # the engine accepted the call (state credit: the branch was applied)
    over_budget: bool = False  # invalid because the batch would overflow the memory budget

    @property
    def completion_tokens(self) -> int:
        return sum(self.loss_mask)


def trained_calls(trajectory: Trajectory, role: str) -> list[PolicyCall]:
    """The policy calls of ``trajectory`` that ``role`` trains, in episode order."""
    return trajectory.policy_calls(TRAINED_CALL_ROLES[upgrade_trained_role(role)])

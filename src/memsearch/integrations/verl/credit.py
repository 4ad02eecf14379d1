"""Split and state credit on verl: the per-row records the agent loop writes, and the advantages
memsearch's verl trainer computes from them (pure; no verl import; docs/design.md §7).

verl 0.9.1's GRPO gives every row of a session the session's advantage (memsearch's ``share``),
and a registered advantage estimator sees no session, turn or branch. So the agent loop
(``loop.MemsearchAgentLoop``) writes one ``CreditRecord`` into every output's
``extra_fields["memsearch_credit"]`` (verl stores it per row in the TransferQueue), and
memsearch's trainer (``trainer.MemsearchTrainer``) reads the records back and replaces verl's
advantages with ``row_advantages``: the same arithmetic as memsearch's own trainer, by calling
the functions it uses (``train.grpo.batch.group_advantages``, ``row_advantage``,
``has_baseline``; ``train.grpo.state_credit.state_group_advantages``), never a copy.

A row is keyed ``{uid}_{session_id}_{index}`` by verl (``AgentLoopWorkerTQ``): ``uid`` is the
task's group of ``rollout.n`` sessions, ``index`` the row's place among its session's outputs.

- ``split``: every row of a session gets the session's group advantage / the session's rows. A
  group left with fewer than ``min(2, rollout.n)`` sessions (a failed trajectory returns no row)
  has no baseline: advantage 0 (memsearch's trainer leaves such a group out);
- ``state`` (memory role): a row is one branch of one memory call; the branches of one call form
  a state group; a branch's advantage is its per-call reward (``StateReward``, computed by the
  loop from the train labels) minus its group's mean (optionally over the std), plus
  ``global_weight`` x the session's group advantage (over the task's sessions) on the branch the
  episode continued from. A group of one branch gets 0 (``group_advantages`` of one value).

Padding rows (verl's ``upsample_batch_to_divisible_size`` copies the first row's fields, its
record included, and tags them ``is_padding``) get 0 and join no group. A missing record, a
record that does not match its key, a session whose rows are not all in the batch, or a state
group without exactly one continued branch is a ``CreditRecordError`` naming the row: never a
silent fall back to ``share``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from memsearch.errors import InputValueError
from memsearch.train.grpo.batch import group_advantages, has_baseline, row_advantage
from memsearch.train.grpo.state_credit import state_group_advantages

CREDIT_FIELD = "memsearch_credit"  # the extra_fields key of a row's record
CreditMode = Literal["share", "split", "state"]
CREDIT_MODES = ("share", "split", "state")


class CreditRecordError(InputValueError):
    """A row's credit record is missing or does not fit its batch; the message names the row."""


@dataclass(frozen=True)
class CreditRecord:
    """What one verl row says about its credit (module doc); JSON-able, stored per row by verl."""

    mode: CreditMode
    row: int  # this row's index among its session's outputs (verl's key ends with it)
    rows: int  # the session's outputs
    std_scale: bool  # credit.std_scale of the memsearch config (the trainer checks verl's setting)
    session: str | None = None  # "{uid}_{session_id}" as verl keys it, when the loop was told
    call: int | None = None  # state: the memory call's step (its state group within the session)
    continued: bool | None = None  # state: the episode continued from this branch
    call_reward: float | None = None  # state: the branch's per-call reward (StateReward)
    global_weight: float = 0.0  # state: credit.global_weight

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, key: str, value: Any) -> CreditRecord:
        """The record stored on the row ``key`` (``CreditRecordError`` naming it when absent or
        malformed); a ``CreditRecord`` already read is returned as it is."""
        if isinstance(value, CreditRecord):
            return value
        if not isinstance(value, dict):
            raise CreditRecordError(
                f"row {key}: no extra_fields[{CREDIT_FIELD!r}]; the memsearch trainer needs the records memsearch's "
                "agent loop writes (split / state credit): was the rollout made by another or an older agent loop?")
        try:
            record = cls(**value)
        except TypeError as exc:
            raise CreditRecordError(f"row {key}: extra_fields[{CREDIT_FIELD!r}] = {value!r}: {exc}") from None
        if record.mode not in CREDIT_MODES:
            expected = ", ".join(CREDIT_MODES)
            raise CreditRecordError(f"row {key}: credit mode {record.mode!r}; expected one of {expected}")
        if record.mode == "state" and (record.call is None or record.continued is None or record.call_reward is None):
            raise CreditRecordError(f"row {key}: a state-mode record without call, continued or call_reward: "
                                    f"{value!r}; expected one row per branch of each memory call")
        return record


@dataclass
class CreditResult:
    """The advantages of a batch's rows (one per row, 0 on padding) and what the log shows."""

    advantages: list[float]
    mode: CreditMode
    sessions: int = 0
    groups_without_baseline: int = 0  # split: task groups failures left without a baseline
    state_groups: int = 0
    zero_variance_state_groups: int = 0
    call_rewards: list[float] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """What a step logs of the credit (verl's metrics, ``memsearch/`` keys)."""
        out = {"memsearch/credit_sessions": float(self.sessions),
               "memsearch/groups_without_baseline": float(self.groups_without_baseline)}
        if self.mode == "state":
            out["memsearch/state_groups"] = float(self.state_groups)
            out["memsearch/zero_variance_state_groups"] = float(self.zero_variance_state_groups)
            if self.call_rewards:
                out["memsearch/call_reward_mean"] = sum(self.call_rewards) / len(self.call_rewards)
        return out


def session_of(key: str) -> tuple[str, str, int]:
    """``(uid, session, index)`` of verl's row key ``{uid}_{session_id}_{index}``."""
    parts = key.rsplit("_", 2)
    if len(parts) != 3 or not parts[2].isdigit():
        raise CreditRecordError(f"row {key}: expected verl's key {{uid}}_{{session_id}}_{{index}}")
    return parts[0], f"{parts[0]}_{parts[1]}", int(parts[2])


def batch_mode(keys: Sequence[str], records: Sequence[Any], padding: Sequence[bool]) -> CreditMode:
    """The credit mode every real row of the batch names (``CreditRecordError`` when one has no
    record or the rows disagree)."""
    mode: CreditMode | None = None
    for key, value, pad in zip(keys, records, padding, strict=True):
        if pad:
            continue
        record = CreditRecord.from_row(key, value)
        if mode is not None and record.mode != mode:
            raise CreditRecordError(f"row {key}: credit mode {record.mode!r}, other rows of the batch {mode!r}; "
                                    "every session of a run must come from one memsearch config")
        mode = record.mode
    if mode is None:
        raise CreditRecordError("the batch has no row that is not padding")
    return mode


def row_advantages(keys: Sequence[str], records: Sequence[Any], rewards: Sequence[float], padding: Sequence[bool],
                   *, group_size: int, std_scale: bool) -> CreditResult:
    """Each row's advantage under the batch's credit mode (module doc).

    ``keys``: verl's row keys; ``records``: each row's ``extra_fields["memsearch_credit"]`` (None
    where absent); ``rewards``: each row's session reward (verl copies the session's score to every
    row); ``padding``: verl's ``is_padding`` tags; ``group_size``: ``rollout.n``; ``std_scale``:
    verl's ``algorithm.norm_adv_by_std_in_grpo``, which must equal the records' own.
    """
    parsed = [None if pad else CreditRecord.from_row(key, value)  # each read once
              for key, value, pad in zip(keys, records, padding, strict=True)]
    mode = batch_mode(keys, parsed, padding)
    sessions: dict[str, dict[int, tuple[int, CreditRecord]]] = defaultdict(dict)  # session -> index -> (row, record)
    tasks: dict[str, list[str]] = defaultdict(list)  # uid -> its sessions, in order of first row
    for i, (key, record, pad) in enumerate(zip(keys, parsed, padding, strict=True)):
        if pad or record is None:
            continue
        uid, session, index = session_of(key)
        if record.row != index or (record.session is not None and record.session != session):
            raise CreditRecordError(f"row {key}: its record names row {record.row} of session {record.session}; the "
                                    "record and the row were separated")
        if record.std_scale != std_scale:
            raise CreditRecordError(
                f"row {key}: the memsearch config has credit.std_scale = {record.std_scale}, verl's "
                f"algorithm.norm_adv_by_std_in_grpo = {std_scale}; write the overrides with memsearch verl config")
        if session not in sessions:
            tasks[uid].append(session)
        sessions[session][index] = (i, record)
    result = CreditResult([0.0] * len(keys), mode, sessions=len(sessions))
    reward_of = {s: _session_reward(s, rows, rewards) for s, rows in sessions.items()}
    for uid, members in tasks.items():
        session_adv = dict(zip(members, group_advantages([reward_of[s] for s in members], std_scale), strict=True))
        if mode == "split":
            if not has_baseline(len(members), group_size):
                result.groups_without_baseline += 1
                continue
            for s in members:
                rows = sessions[s]
                for i, _record in rows.values():
                    result.advantages[i] = row_advantage(session_adv[s], "split", len(rows))
        elif mode == "state":
            for s in members:
                _state_session(s, sessions[s], session_adv[s], keys, result)
        else:  # share: verl's own advantages stand; the trainer does not call this
            raise CreditRecordError(f"task {uid}: credit mode 'share' is verl's own GRPO; nothing to replace")
    return result


def _session_reward(session: str, rows: dict[int, tuple[int, CreditRecord]], rewards: Sequence[float]) -> float:
    # Every row must be present (a lost row would change split's division and state's groups) and
    # carry the same score (verl copies the last output's).
    expected = {record.rows for _, record in rows.values()}
    if len(expected) != 1 or set(rows) != set(range(expected.pop())):
        counts = sorted({record.rows for _, record in rows.values()})
        raise CreditRecordError(f"session {session}: rows {sorted(rows)} in the batch, its records say {counts} rows; "
                                "every output of a session must reach the update")
    scores = {rewards[i] for i, _ in rows.values()}
    if max(scores) - min(scores) > 1e-6:
        raise CreditRecordError(f"session {session}: its rows carry different scores {sorted(scores)}; expected "
                                "verl's session score on every row")
    return rewards[rows[max(rows)][0]]


def _state_session(session: str, rows: dict[int, tuple[int, CreditRecord]], session_adv: float,
                   keys: Sequence[str], result: CreditResult) -> None:
    groups: dict[int, list[tuple[int, CreditRecord]]] = defaultdict(list)
    for index in sorted(rows):
        i, record = rows[index]
        if record.mode != "state" or record.call is None:
            raise CreditRecordError(f"row {keys[i]}: expected a state-mode record")
        groups[record.call].append((i, record))
    for call, members in groups.items():
        continued = [bool(r.continued) for _, r in members]
        if sum(continued) != 1:
            raise CreditRecordError(f"session {session}, memory call {call}: {sum(continued)} continued branches "
                                    f"(rows {[keys[i] for i, _ in members]}); expected exactly one")
        scores = [float(r.call_reward or 0.0) for _, r in members]
        weight = members[0][1].global_weight
        advantages = state_group_advantages(scores, continued, session_adv if weight else 0.0,
                                            std_scale=members[0][1].std_scale, global_weight=weight)
        for (i, _), adv in zip(members, advantages, strict=True):
            result.advantages[i] = adv
        result.state_groups += 1
        result.zero_variance_state_groups += int(max(scores) - min(scores) < 1e-12)
        result.call_rewards.extend(scores)

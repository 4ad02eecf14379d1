"""Earlier spellings of the GRPO config's fields, read as the current ones in one place.

``GRPOConfig`` groups the fields that were flat (``clip_low`` is ``loss.clip_low``,
``credit = "state"`` is ``credit.mode``: ``GRPO_GROUPS``), names the two invalid-output penalties
apart (``reward.invalid_call_penalty``, ``credit.state_reward.rejected_batch_penalty``: both were
``invalid_penalty``) and calls the MemAgent role ``memagent`` (it was ``overwrite``, the name of
its memory mode). Published configs, ``--set`` flags and the ``config.json`` of earlier runs say
it the earlier way and must keep meaning the same run, so every reader of raw GRPO fields goes
through ``upgrade_grpo_keys`` (the config's own validator, a pipeline's trainer table).
``flat_grpo_dump`` is the inverse on a dump: what a pipeline stage record of the earlier layout
fingerprinted (``pipelines.stage_versions.version2_dump``).

    upgrade_grpo_keys({"clip_low": 0.1, "credit": "split"})
    # {"loss": {"clip_low": 0.1}, "credit": {"mode": "split"}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from memsearch.config import KeyProblems
from memsearch.train.rows import upgrade_trained_role

# Each group's fields, in the order the flat config declared them. ``credit``'s mode is the
# flat ``credit`` itself (a string there, a table now).
GRPO_GROUPS: dict[str, tuple[str, ...]] = {
    "rollout": ("tasks_per_step", "group_size", "temperature", "top_p", "schema_mode", "max_batch_size"),
    "credit": ("mode", "state_group_size", "state_reward", "global_weight", "invalid_decision_credit", "std_scale"),
    "loss": ("clip_low", "clip_high", "dual_clip", "aggregation", "aggregation_tokens", "kl_coef", "kl_reference"),
    "update": ("epochs", "mini_batches_per_step", "micro_batch_tokens", "share_prompts", "disable_dropout"),
}
# (table, earlier name, current name) of renamed fields inside a table of the grouped config.
RENAMED: tuple[tuple[str, str, str], ...] = (
    ("reward", "invalid_penalty", "invalid_call_penalty"),
    ("credit.state_reward", "invalid_penalty", "rejected_batch_penalty"),
)


def both_spellings(old: str, new: str) -> str:
    """The refusal of one setting given in both spellings. A ``--set`` merges into the file's
    tables before either is read, so which one overrides is unknown: the user gives it once, in
    the spelling of the file it overrides (a published config keeps the earlier one)."""
    return (f"{old} and {new} are one setting, in its earlier and its current spelling; give it once: {new}, or "
            f"{old} where the config file it overrides spells it so")

def merge_disjoint(current: Any, earlier: Mapping[str, Any], where: str, earlier_where: str,
                   problems: list[tuple[str, str]]) -> Any:
    """``earlier`` (a table in an earlier spelling, at key ``earlier_where``; "" for the top)
    merged into ``current`` (the same table in the current spelling, at ``where``: a dict, a
    validated model, or None), key by key down nested tables; a key set in both is a problem
    naming both spellings, appended to ``problems``. A model counts the fields it was given
    (``model_fields_set``), not its defaults."""
    if isinstance(current, BaseModel):
        current = {name: getattr(current, name) for name in current.model_fields_set}
    elif current is None:
        current = {}
    if not isinstance(current, Mapping):
        # a value of the wrong type at `where`: validation names it once the earlier keys are dropped
        given = ", ".join(_at(earlier_where, k) for k in earlier)
        problems.append((where, f"expected a table; the earlier spelling sets {given}"))
        return current
    out = dict(current)
    for key, value in earlier.items():
        below = out.get(key)
        if key not in out:
            out[key] = value
        elif isinstance(value, Mapping) and isinstance(below, Mapping | BaseModel):
            out[key] = merge_disjoint(below, value, _at(where, key), _at(earlier_where, key), problems)
        else:
            old, new = _at(earlier_where, key), _at(where, key)
            problems.append((old, both_spellings(old, new)))
    return out


def _at(table: str, key: str) -> str:
    return f"{table}.{key}" if table else key


def upgrade_grpo_keys(data: Any) -> Any:
    """Raw GRPO fields (TOML tables, ``--set`` keys, a saved ``config.json``) with every earlier
    spelling in the current one (module doc); a field given in both spellings is refused naming
    both (``KeyProblems``). Anything not a dict is returned as it is (validation names it)."""
    if not isinstance(data, Mapping):
        return data
    out, problems = dict(data), []
    if isinstance(out.get("credit"), str):  # the flat credit mode
        out["credit"] = {"mode": out["credit"]}
    for group, fields in GRPO_GROUPS.items():
        moved = {name: out.pop(name) for name in fields if name in out and name != "mode"}
        if moved:
            out[group] = merge_disjoint(out.get(group), moved, group, "", problems)
    if "role" in out:
        out["role"] = upgrade_trained_role(out["role"])
    for table, before, now in RENAMED:
        out = _renamed(out, table, before, now, problems)
    if problems:
        raise KeyProblems(*problems)
    return out


def _renamed(data: dict[str, Any], table: str, before: str, now: str,
             problems: list[tuple[str, str]], at: str = "") -> dict[str, Any]:
    """``data`` with key ``before`` of the raw table at dotted path ``table`` renamed ``now``
    (``at``: the path of ``data`` itself, for the problem's names)."""
    head, _, rest = table.partition(".")
    below, where = data.get(head), _at(at, head)
    if not isinstance(below, Mapping):
        return data
    if rest:
        return {**data, head: _renamed(dict(below), rest, before, now, problems, where)}
    if before not in below:
        return data
    if now in below:
        problems.append((f"{where}.{before}", both_spellings(f"{where}.{before}", f"{where}.{now}")))
        return data
    return {**data, head: {(now if k == before else k): v for k, v in below.items()}}


def flat_grpo_dump(dump: dict[str, Any]) -> dict[str, Any]:
    """A GRPO config's JSON dump in the earlier flat layout (the inverse of ``upgrade_grpo_keys``
    on a full dump): the groups' fields at the top, ``credit`` the mode, both penalties
    ``invalid_penalty``, the MemAgent role ``overwrite``. Any other dict is returned as it is."""
    if not all(isinstance(dump.get(group), dict) for group in GRPO_GROUPS) or "role" not in dump:
        return dump
    out = {k: v for k, v in dump.items() if k not in GRPO_GROUPS}
    for group in GRPO_GROUPS:
        out.update({("credit" if name == "mode" else name): value for name, value in dump[group].items()})
    if out["role"] == "memagent":
        out["role"] = "overwrite"
    out["reward"] = _renamed_back(out.get("reward"), "invalid_call_penalty")
    out["state_reward"] = _renamed_back(out.get("state_reward"), "rejected_batch_penalty")
    return out


def _renamed_back(table: Any, now: str) -> Any:
    return {("invalid_penalty" if k == now else k): v for k, v in table.items()} if isinstance(table, dict) else table

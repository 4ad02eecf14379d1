"""The ``[episode]`` a GRPO config trains in, completed from its raw tables before validation
(``train.config.GRPOConfig``): the run config file ``episode_config`` read in under them, then the
trained memory role's schema mode kept on the episode's memory backend, its one place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from memsearch.config import KeyProblems, merge_tables, read_config_file


def with_episode_config(data: Any) -> Any:
    """Raw GRPO fields with ``episode_config`` (a run config TOML) read in under the ``[episode]``
    tables given beside it (``merge_tables``: the given tables win)."""
    if not isinstance(data, dict) or not data.get("episode_config"):
        return data
    from memsearch.io import file_kind_problem

    path = Path(data["episode_config"])
    if (problem := file_kind_problem(path, "a run config TOML file")) is not None:
        raise KeyProblems(("episode_config", f"{path}: {problem}"))
    base = read_config_file(path)  # an unreadable file is refused naming that file, not this config
    episode = data.get("episode") or {}
    return {**data, "episode": merge_tables(base, episode) if isinstance(episode, dict) else episode}


def schema_mode_on_episode(data: Any) -> Any:
    """Raw GRPO fields with ``rollout.schema_mode`` moved onto the episode's memory backend, which
    keeps the value: into a memory table that leaves it unset, with ``kind = "hf"`` when true (the
    trainer answers those calls with its hf policy, ``grpo.trainer.trained_role_backends``, and a
    run config samples in schema mode only in a local model), or dropped where the episode holds
    the same. Left for ``GRPOConfig._role_fits_episode`` to refuse: true for another role than
    memory, a value the episode contradicts; a memory table (not a validated backend) that sets
    true beside no rollout value gets the default, false, beside it. A controller run's frozen
    memory backend keeps its own mode; a wrong type is refused at ``rollout.schema_mode``."""
    if not isinstance(data, dict):
        return data
    rollout, role = data.get("rollout"), data.get("role", "memory")
    given = _at(rollout, "schema_mode")
    episode = data.get("episode") or {}
    backends = _at(episode, "backends") or {}
    memory = _at(backends, "memory") or {}
    held = _at(memory, "schema_mode")
    tables = all(isinstance(part, dict) for part in (episode, backends, memory))
    if given is None and held is True and tables and isinstance(rollout, dict | None) and role != "controller":
        return {**data, "rollout": {**(rollout or {}), "schema_mode": False}}
    if not isinstance(given, bool) or (given and role != "memory"):
        return data
    rest = (rollout.model_copy(update={"schema_mode": None}) if isinstance(rollout, BaseModel)
            else {k: v for k, v in rollout.items() if k != "schema_mode"})
    if role not in ("memory", "memagent"):
        return {**data, "rollout": rest}
    if held not in (None, given):
        return data
    if not tables:
        return {**data, "rollout": rest}
    memory = {**memory, "schema_mode": given, **({"kind": "hf"} if given else {})}
    return {**data, "rollout": rest, "episode": {**episode, "backends": {**backends, "memory": memory}}}


def _at(node: Any, key: str) -> Any:
    """``node[key]`` of a raw table, ``node.key`` of a validated model, else None."""
    if isinstance(node, dict):
        return node.get(key)
    return getattr(node, key, None) if isinstance(node, BaseModel) else None

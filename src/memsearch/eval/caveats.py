"""What a run's numbers are not: short caveats printed once where results are read (a run's
``summary.json``, ``matrix.json`` / ``matrix.md``, the ``memsearch report`` page).

Only those that apply are said (``caveats``):

- an untrained policy (B, C, D: decision memory and/or a policy controller answered by a base
  model or rules) gives a prompt baseline, not an RL result; a served model memsearch cannot
  trace to training (kind ``openai``) is said to be one unless it was trained;
- group C with a trained controller is a cross-ablation: that controller was trained with
  decision (memory-policy) memory and runs here with summary memory;
- a trained policy's teacher rows selected by answers (or validity) are no content audit of its memory;
- candidate-scope retrieval (each task's own candidate paragraphs) is not open-domain full-wiki.

A backend is *trained* (``backend_trained``) when it loads an adapter or its model is a merged
checkpoint (a folder holding ``memsearch_merge.json``, which ``merge-adapter`` writes).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memsearch.config import config_json
from memsearch.registry import BACKEND_KINDS, MEMORY_MODES

# Where a config's agent calls a policy: role -> whether the agent (a config as JSON) calls one
# there: a memory mode whose policy writes operations, a policy controller.
_POLICY_ROLES = {
    "memory": lambda agent: agent.get("memory") in MEMORY_MODES and MEMORY_MODES.get(agent["memory"]).operations,
    "controller": lambda agent: agent.get("controller") == "policy",
}


def backend_trained(backend: Mapping[str, Any]) -> bool | None:
    """True for a trained policy (an adapter, a merged checkpoint), False for a base model or a
    rule-based backend, None for a served model memsearch cannot trace (module doc)."""
    kind = backend.get("kind")
    if kind in BACKEND_KINDS and not BACKEND_KINDS.get(kind).runs_model:  # rules, oracle
        return False
    if backend.get("adapter"):
        return True
    model = backend.get("model")
    if isinstance(model, str) and model and (Path(model) / "memsearch_merge.json").is_file():
        return True
    return None if backend.get("kind") == "openai" else False


def policy_roles(config: Mapping[str, Any]) -> dict[str, bool | None]:
    """The roles a run's agent asks a policy for, each with ``backend_trained`` of its backend."""
    agent, backends = config["agent"], config["backends"]
    return {role: backend_trained(backends[role]) for role, calls in _POLICY_ROLES.items() if calls(agent)}


def _names(names: list[str]) -> str:
    return ", ".join(names) if names != [""] else "this run"


def caveats(runs: Mapping[str, Mapping[str, Any]], groups: Mapping[str, str] | None = None) -> list[str]:
    """The caveats of runs shown together (module doc): ``runs`` maps a name (a matrix group, or
    ``""`` for one run) to its resolved config as JSON; ``groups`` gives a run's matrix group
    when it is not its name."""
    groups = groups or {name: name for name in runs}
    roles = {name: policy_roles(cfg) for name, cfg in runs.items()}
    baseline = [n for n, r in roles.items() if r and all(t is False for t in r.values())]
    untraced = [n for n, r in roles.items() if None in r.values() and True not in r.values()]
    out = []
    if baseline:
        out.append(f"{_names(baseline)}: no trained policy (base model or rules: no adapter, no merged checkpoint) "
                   "answers the policy calls: prompt baseline(s), not RL results.")
    if untraced:
        out.append(f"{_names(untraced)}: the policy is a served model memsearch cannot trace to training: unless it "
                   "was trained, a prompt baseline, not an RL result.")
    cross = [n for n, r in roles.items() if groups.get(n) == "C" and r.get("controller") is not False]
    if cross:
        named = _names(cross) if cross == ["C"] else f"{_names(cross)} (group C)"
        out.append(f"{named} is a cross-ablation"
                   + ("" if roles[cross[0]]["controller"] else " if its controller was trained")
                   + ": a controller trained with decision (memory-policy) memory, run here with summary memory.")
    if any(True in r.values() for r in roles.values()):
        out.append("Trained policies: teacher rows selected by their answers (export-sft --min-f1) or validity are "
                   "no content audit: a right answer does not show that the memory behind it was true.")
    if any(cfg["agent"].get("evidence") == "search" and cfg["agent"].get("retrieval_scope") == "candidates"
           for cfg in runs.values()):
        out.append("Retrieval is candidate-scope (each task's own candidate paragraphs): not open-domain "
                   "full-wiki retrieval.")
    return out


def run_caveats(config: Any, group: str = "") -> list[str]:
    """``caveats`` of one run (``config``: a ``RunConfig`` or its JSON dict)."""
    data = config if isinstance(config, Mapping) else config_json(config)
    return caveats({group: data})

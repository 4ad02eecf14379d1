"""Earlier versions of stage records (``pipelines.stage_record``), in one place: how each version
dumped a stage's inputs, and the upgrade of a record made from today's inputs to the current
version (``RECORD_VERSION``), so hours of finished training are reused, not refused.

Earlier versions differ in ways that change a fingerprint, not what a stage made:

- version 1's config dumps left ``memory_sources`` and ``open_items`` out at their defaults
  (``VERSION1_OMITTED``), and its records written before ``$OUT`` paths hold raw paths;
- version 2's dumps spell some configs in an earlier form (``VERSION2_FORMS``);
- versions 1-3 fingerprinted where served models answered (``base_url``, and the stage-2 memory
  server's address as ``url``): version 4 leaves addresses out (``config.backend.ADDRESS_KEYS``).

Since version 4 a rename needs no new version: stage inputs are fingerprinted, and recorded, in
the fingerprint form (``fingerprint_form``), version 4's spelling, and a renamed config field adds
its inverse to ``RENAMES_SINCE_VERSION4``. A finished stage then stays finished across the rename.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from memsearch.config.backend import without_addresses
from memsearch.config.flat_form import legacy_backend_form, legacy_pipeline_run_form
from memsearch.io import write_json
from memsearch.train.config_keys import flat_grpo_dump

RECORD_VERSION = 4


def fingerprint(inputs: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of ``inputs``."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# Renames of fields a stage's inputs hold (config dumps), made after record version 4, in the order
# they were made: each a function of one dict of the inputs that returns it as version 4 spelled it
# (any other dict as it is). Empty: no field has been renamed since.
RENAMES_SINCE_VERSION4: list[Callable[[dict[str, Any]], dict[str, Any]]] = []


def fingerprint_form(inputs: Any) -> Any:
    """``inputs`` (or any part of them) in the fingerprint form: version 4's spelling, whatever the
    fields are called today (``RENAMES_SINCE_VERSION4``), so a rename changes no fingerprint."""
    return _walk(inputs, list(RENAMES_SINCE_VERSION4)) if RENAMES_SINCE_VERSION4 else inputs

# Config fields that version 1 left out of every dump while at their default (values of
# memsearch.config's Agent.memory_sources and BackendConfig.open_items): a version-1
# fingerprint of a config dump is the fingerprint of the dump without them.
VERSION1_OMITTED = {"memory_sources": "shown", "open_items": False}


def _version1_omitted(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if not (k in VERSION1_OMITTED and v == VERSION1_OMITTED[k])}


def version1_dump(value: Any) -> Any:
    """``value`` (stage inputs, or any part of them) as version 1 dumped it: without the fields
    of ``VERSION1_OMITTED`` that hold their defaults."""
    return _walk(value, [_version1_omitted])


def _walk(value: Any, forms: list[Callable[[dict[str, Any]], dict[str, Any]]]) -> Any:
    """``value`` with every dict in it passed through ``forms`` in order, outermost first (a
    form's output is walked on: a table it moves is still found)."""
    if isinstance(value, dict):
        for form in forms:
            value = form(value)
        return {k: _walk(v, forms) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, forms) for v in value]
    return value


# The forms of config dumps that version 2 recorded and version 3 writes otherwise, one function
# each (a dict of a dump -> that dict as version 2 dumped it; any other dict as it is): the GRPO
# config's fields flat, its two invalid-output penalties both ``invalid_penalty``, the MemAgent
# role ``overwrite`` (``train.config_keys.flat_grpo_dump``); every backend table flat, with every
# kind's keys (``config.flat_form.legacy_backend_form``).
VERSION2_FORMS: list[Callable[[dict[str, Any]], dict[str, Any]]] = [flat_grpo_dump, legacy_backend_form]

# Which roles of a run config a pipeline had filled its model into, whatever their kind: the
# current dump no longer says (a rules role holds no model), so each is a candidate.
VERSION2_FILLED_ROLES: tuple[tuple[str, ...], ...] = ((), ("memory",), ("reader",), ("memory", "reader"))


def version2_dump(value: Any, filled: tuple[str, ...] = ()) -> Any:
    """``value`` (stage inputs, or any part of them) as version 2 dumped it (``VERSION2_FORMS``),
    with the pipeline's model in the ``filled`` roles of its run configs."""
    return _walk(value, [partial(legacy_pipeline_run_form, roles=filled), *VERSION2_FORMS])


def version2_dumps(value: Any) -> list[Any]:
    """Every way version 2 may have dumped ``value`` (``VERSION2_FILLED_ROLES``)."""
    return [version2_dump(value, roles) for roles in VERSION2_FILLED_ROLES]


def _memory_server_address(value: Any, key: str, earlier_key: str) -> Any:
    """``value`` with the address of a stage's ``memory_server`` (the stage-2 memory server) under
    ``earlier_key`` instead of ``key``: before version 4 it was ``url``, now ``base_url``."""
    if isinstance(value, dict):
        server = value.get("memory_server")
        if isinstance(server, dict) and key in server:
            value = {**value, "memory_server": {(earlier_key if k == key else k): v for k, v in server.items()}}
        return {k: _memory_server_address(v, key, earlier_key) for k, v in value.items()}
    if isinstance(value, list):
        return [_memory_server_address(v, key, earlier_key) for v in value]
    return value


def version3_dump(value: Any) -> Any:
    """``value`` as versions 1 to 3 dumped it: the memory server's address as ``url``."""
    return _memory_server_address(value, "base_url", "url")


def _unaddressed(value: Any) -> Any:
    """``value`` (inputs as any version dumped them) without where a served model answered."""
    return without_addresses(_memory_server_address(value, "url", "base_url"))


# How each earlier record version may have dumped the current inputs (with the addresses those
# versions fingerprinted, ``Stage.addressed_inputs``): its fingerprint is of one.
EARLIER_DUMPS: dict[int, Callable[[Any], list[Any]]] = {
    1: lambda inputs: [version1_dump(dump) for dump in version2_dumps(version3_dump(inputs))],
    2: lambda inputs: version2_dumps(version3_dump(inputs)),
    3: lambda inputs: [version3_dump(inputs)],
}


def fingerprint_aliases(out: Path | None) -> dict[str, str]:
    """Of every upgraded stage record of the run folder: its fingerprint -> the one it had before
    (``fingerprint_before``). A later stage's record of an earlier version names its upstream
    stages by their earlier fingerprints: these map today's back."""
    aliases: dict[str, str] = {}
    for path in Path(out).glob("**/*.stage.json") if out is not None else ():
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("fingerprint_before"), str):
            aliases[record["fingerprint"]] = record["fingerprint_before"]
    return aliases


def _aliased(value: Any, aliases: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _aliased(v, aliases) for k, v in value.items()}
    if isinstance(value, list):
        return [_aliased(v, aliases) for v in value]
    return aliases.get(value, value) if isinstance(value, str) else value


def upgrade_record(stage: Any, record: dict[str, Any], earlier_dumps: Callable[[Any], list[Any]],
                   out: Path | None = None) -> dict[str, Any]:
    """A record of an earlier version of ``stage``, rewritten as the current version when it was
    made from the stage's inputs (one of ``earlier_dumps`` of them has its fingerprint); else the
    refusal naming what changed.

    Earlier versions differ in ways that change a fingerprint, not what a stage made: version 1's
    config dumps left ``memory_sources`` and ``open_items`` out at their defaults
    (``VERSION1_OMITTED``) and its records written before ``$OUT`` paths hold the run folder's raw
    paths; version 2's dumps spell some configs in an earlier form (``VERSION2_FORMS``). Each is
    reproducible from the current inputs, so a finished stage made from the same inputs is
    recognised and reused instead of redone (hours of training): migrated, not refused. The
    rewritten record keeps the old fingerprint as ``fingerprint_before``. What a resumed stage's
    own tool checks (a trainer's or eval run's ``config.json``) is not a stage record: the tool
    reads its own earlier forms (``train.run_folder.check_run_folder``) or refuses the changed
    config dump (delete the stage's folder and record to redo it).

    Records before version 4 fingerprinted where served models answered (``base_url``): one made
    from the same inputs on other ports counts when its own recorded inputs, which its fingerprint
    vouches for, equal a candidate's but for those addresses. Upstream stages upgraded before it
    are named by their earlier fingerprints (``fingerprint_aliases`` of the run folder ``out``)."""
    aliases = fingerprint_aliases(out)
    candidates = [_aliased(dump, aliases) for source in (stage.addressed_inputs, stage.given_inputs)
                  for dump in earlier_dumps(source)]
    recorded = record.get("inputs")
    if record.get("fingerprint") not in {fingerprint(inputs) for inputs in candidates} and not (
            fingerprint(recorded) == record.get("fingerprint")
            and _unaddressed(recorded) in [_unaddressed(c) for c in candidates]):
        stage.refuse(record.get("inputs", {}), candidates[0])
    upgraded = {
        **record,
        "version": RECORD_VERSION,
        "fingerprint": stage.fingerprint,
        "inputs": stage.inputs,
        "fingerprint_before": record["fingerprint"],
    }
    write_json(stage.record_path, upgraded)
    return upgraded

"""The registered protocols of the published results (``studies/protocols.toml``).

A protocol is fixed before its numbers exist: which pipeline config makes the run, which bar
judges it and where the result is published. A study applies the bar registered here and no
other: a bar chosen after the numbers would be a description of them, not a test. An entry
whose ``bar`` is empty registered none (a demonstration or a control, as its README says).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from memsearch.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
PROTOCOLS = Path(__file__).with_name("protocols.toml")
_FIELDS = {"study", "results", "pipeline", "bar", "protocol", "protocol_commit"}


@dataclass(frozen=True)
class Protocol:
    """One published result's registration; paths relative to the repository root."""

    name: str
    study: str
    results: Path
    pipeline: Path
    bar: str | None  # None: no bar was registered before the numbers
    protocol: Path | None
    protocol_commit: str | None


def protocols(path: Path = PROTOCOLS) -> dict[str, Protocol]:
    """Every registered protocol by name, in the file's order."""
    table = tomllib.loads(path.read_text(encoding="utf-8"))
    out = {}
    for name, entry in table.items():
        unknown = set(entry) - _FIELDS
        missing = {"study", "results", "pipeline", "bar"} - set(entry)
        if unknown or missing:
            raise InputError(f"{path} [{name}]: unknown {sorted(unknown)}, missing {sorted(missing)}")
        out[name] = Protocol(name, entry["study"], Path(entry["results"]), Path(entry["pipeline"]),
                             entry["bar"] or None, Path(entry["protocol"]) if "protocol" in entry else None,
                             entry.get("protocol_commit"))
    return out


def registered(folder: str | Path, path: Path = PROTOCOLS) -> Protocol | None:
    """The protocol whose results folder is ``folder`` (absolute, or relative to the working
    directory); None for a folder no protocol names, such as a run folder under runs/."""
    target = Path(folder).resolve()
    return next((p for p in protocols(path).values() if (ROOT / p.results).resolve() == target), None)

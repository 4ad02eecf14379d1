"""The trained memory-policy adapter shipped with the repository (``models/memory-policy-cpu``)
and the fingerprint that pins its files (docs/memory_policy.md, "The shipped adapter").

The folder is found like the shipped configs and samples (``samples.shipped_path``): the
installed package's copy (a wheel carries it as ``memsearch/assets/models/memory-policy-cpu``),
else the source checkout's, unless ``MEMSEARCH_MEMORY_POLICY_ADAPTER`` names another folder.

``fingerprint.json`` beside the adapter files records the SHA-256 of every file of the folder,
the base model the adapter belongs to and a free-form ``provenance`` dict (the pipeline run it
came from). ``verify_adapter`` refuses a folder whose files do not match it; the hf backend
(``backends/hf_model.load_model``) and the run records (``eval/run_folder.model_identity``) call
it for every adapter folder that holds a ``fingerprint.json``, so a changed file is refused
before anything runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from memsearch.assets.samples import shipped_path
from memsearch.errors import InputError
from memsearch.io import sha256_file, write_json

FINGERPRINT = "fingerprint.json"
FORMAT = "memsearch-adapter-fingerprint/1"
ADAPTER_ENV = "MEMSEARCH_MEMORY_POLICY_ADAPTER"
SHIPPED_ADAPTER = "models/memory-policy-cpu"  # its path in the repository (and under memsearch/assets/)


def shipped_adapter_dir() -> Path:
    """``MEMSEARCH_MEMORY_POLICY_ADAPTER`` if set, else the shipped ``models/memory-policy-cpu``
    (package data, or the checkout's folder). Not checked here: ``verify_adapter(path,
    required=True)`` says what is missing."""
    override = os.environ.get(ADAPTER_ENV)
    return Path(override) if override else shipped_path(SHIPPED_ADAPTER)


def _adapter_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name != FINGERPRINT and not p.name.startswith("."))


def write_fingerprint(folder: str | Path, base_model: str, provenance: dict[str, Any]) -> dict[str, Any]:
    """Write ``folder/fingerprint.json`` (SHA-256 of every other file, the base model, the
    caller's ``provenance``) and return it. The folder must be a PEFT adapter folder."""
    folder = Path(folder)
    if not (folder / "adapter_config.json").is_file():
        raise InputError(f"{folder}: not a LoRA adapter folder (no adapter_config.json)")
    record = {"format": FORMAT, "base_model": base_model,
              "files": {p.name: sha256_file(p) for p in _adapter_files(folder)},
              "provenance": provenance}
    write_json(folder / FINGERPRINT, record)
    return record


def read_fingerprint(folder: str | Path) -> dict[str, Any] | None:
    """The folder's ``fingerprint.json``, or ``None`` when it has none."""
    import json

    path = Path(folder) / FINGERPRINT
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc}); re-ship the adapter "
                         "(python -m studies.memory_policy.ship)") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("files"), dict):
        raise InputError(f"{path}: not a memsearch adapter fingerprint "
                         f"(expected format {FORMAT!r} and a 'files' table)")
    return record


def verify_adapter(folder: str | Path, base_model: str | None = None, required: bool = False) -> dict[str, Any] | None:
    """Check every file of an adapter folder against its ``fingerprint.json``; return the record.

    Refuses (``InputError``, naming the file and both hashes) a changed file, a listed file that
    is missing and a file the fingerprint does not list. With ``base_model``, refuses loading an
    adapter recorded for the embedded model onto another base, and the reverse. Without a
    ``fingerprint.json``: ``None``, or with ``required`` an error naming the path."""
    folder = Path(folder)
    if not folder.is_dir():
        shipped_hint = f" (the shipped memory-policy adapter; see docs/memory_policy.md, or set {ADAPTER_ENV})"
        raise InputError(f"{folder}: no such adapter folder" + (shipped_hint if required else ""))
    record = read_fingerprint(folder)
    if record is None:
        if required:
            raise InputError(f"{folder / FINGERPRINT}: missing; a shipped adapter must carry its fingerprint "
                             "(write it with python -m studies.memory_policy.ship)")
        return None
    where = folder / FINGERPRINT
    expected: dict[str, str] = record["files"]
    problems = []
    for name, want in sorted(expected.items()):
        path = folder / name
        if not path.is_file():
            problems.append(f"{path}: listed in {where} (sha256 {want}) but missing")
            continue
        got = sha256_file(path)
        if got != want:
            problems.append(f"{path}: sha256 {got} does not match {where}'s {want}")
    for path in _adapter_files(folder):
        if path.name not in expected:
            problems.append(f"{path}: not listed in {where} (sha256 {sha256_file(path)})")
    if problems:
        raise InputError("\n".join(problems) + f"\nrefusing adapter {folder}: its files are not the ones "
                         "fingerprinted; restore them, or ship the new adapter with "
                         "python -m studies.memory_policy.ship")
    recorded = record.get("base_model")
    if base_model is not None and recorded is not None and (recorded == "embedded") != (str(base_model) == "embedded"):
        raise InputError(f"{where}: the adapter was trained on base model {recorded!r}, not {str(base_model)!r}")
    return record


def trained_memory_format(fingerprint: dict[str, Any] | None) -> str | None:
    """The memory action format (``agent.memory_format``) the adapter was trained in, read from its
    fingerprint's provenance (the pipeline config it came from): an adapter trained to name evidence
    ids writes nonsense when prompted for prose, and the reverse. ``"text"`` when that config names
    none (adapters shipped before the extractive format existed were trained in text); ``None`` when
    the provenance holds no pipeline config (the format is unknown)."""
    provenance = (fingerprint or {}).get("provenance") or {}
    agent = ((provenance.get("config") or {}).get("episode") or {}).get("agent")
    if not isinstance(agent, dict):
        return None
    return agent.get("memory_format", "text")


def check_memory_format(folder: str | Path, fingerprint: dict[str, Any] | None, memory_format: str) -> None:
    """Refuse to run a decision-memory adapter in a format other than the one it was trained in."""
    trained = trained_memory_format(fingerprint)
    if trained is not None and trained != memory_format:
        raise InputError(
            f"{folder}: this memory-policy adapter was trained in the {trained!r} memory format (its {FINGERPRINT}), "
            f"but agent.memory_format is {memory_format!r}; set agent.memory_format = {trained!r} (`--set "
            f"agent.memory_format={trained}`) or use an adapter trained in {memory_format!r}"
        )

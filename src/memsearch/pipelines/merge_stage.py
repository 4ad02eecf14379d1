"""The merge stage: a trained adapter merged into its base model as a plain Hugging Face folder,
fingerprinted by the model, the adapter's hash and the dtype, with the merged folder's hash
recorded and checked when the stage is reused (``pipelines.stage_record``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from memsearch.errors import InputError
from memsearch.pipelines.stage_record import Stage, folder_sha256


def merge_stage(folder: Path, record: Path, model: str, adapter: Path, dtype: str, echo=print) -> tuple[Path, str]:
    """``adapter`` merged into ``model`` as a plain Hugging Face folder; returns (folder, fingerprint)."""
    from memsearch.train.merge import merge_adapter

    stage = Stage(folder, "merge", {"model": model, "adapter_sha256": folder_sha256(adapter), "dtype": dtype}, record)
    if stage.done():
        recorded = (stage.record().get("outputs") or {}).get("merged_sha256")
        if recorded is not None:
            _check_merged(folder, recorded, stage)
            echo(f"merge: done ({folder})")
            return folder, stage.fingerprint
        # An older memsearch recorded no hash, so what the folder holds is unknown (a truncated
        # merge passed as done). The merge is a function of the fingerprinted inputs: redo it.
        echo(f"merge: {stage.record_path} records no hash of {folder} (an older memsearch): merging again")
        shutil.rmtree(folder, ignore_errors=True)
    stage.start()
    if not (folder / "config.json").is_file():  # merge_adapter writes atomically: present = finished
        merge_adapter(model, adapter, folder, dtype=dtype)
    stage.finish({"merged": folder.name, "merged_sha256": folder_sha256(folder)})
    echo(f"merge: {folder}")
    return folder, stage.fingerprint


def _check_merged(folder: Path, recorded: str, stage: Stage) -> None:
    """Refuse a merged folder whose files are not the ones the finished merge recorded."""
    actual = folder_sha256(folder) if folder.is_dir() else None
    if actual != recorded:
        raise InputError(
            f"{folder}: missing or changed since the merge finished (sha256 {actual}, recorded {recorded}); "
            f"delete {folder} and {stage.record_path} to merge again, or choose a new --out"
        )

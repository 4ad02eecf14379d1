"""Files shipped with the repository: the real data samples (``data/samples``) and the
configs (``configs``)."""

from __future__ import annotations

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parents[3]


def samples_dir() -> Path:
    """``MEMSEARCH_SAMPLES`` if set, else ``data/samples`` of the source checkout."""
    override = os.environ.get("MEMSEARCH_SAMPLES")
    path = Path(override) if override else _REPO / "data" / "samples"
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path}: shipped samples not found; run from a clone of the memsearch repository "
            "or set MEMSEARCH_SAMPLES to its data/samples folder"
        )
    return path


def config_path(name: str) -> Path:
    """A config shipped in ``configs/`` (e.g. ``"demo.toml"``)."""
    path = _REPO / "configs" / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: shipped config not found; run from a clone of the memsearch repository")
    return path


HOTPOT_DEV = "hotpotqa/dev_distractor_sample.json"
HOTPOT_TRAIN = "hotpotqa/train_sample.json"
MUSIQUE_DEV = "musique/musique_ans_dev_sample.json"
MUSIQUE_TRAIN = "musique/musique_ans_train_sample.json"

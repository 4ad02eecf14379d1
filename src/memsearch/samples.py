"""Where the real data samples shipped with the repository live (``data/samples``)."""

from __future__ import annotations

import os
from pathlib import Path


def samples_dir() -> Path:
    """``MEMSEARCH_SAMPLES`` if set, else ``data/samples`` of the source checkout."""
    override = os.environ.get("MEMSEARCH_SAMPLES")
    path = Path(override) if override else Path(__file__).resolve().parents[2] / "data" / "samples"
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path}: shipped samples not found; run from a clone of the memsearch repository "
            "or set MEMSEARCH_SAMPLES to its data/samples folder"
        )
    return path


HOTPOT_DEV = "hotpotqa/dev_distractor_sample.json"
HOTPOT_TRAIN = "hotpotqa/train_sample.json"
MUSIQUE_DEV = "musique/musique_ans_dev_sample.json"
MUSIQUE_TRAIN = "musique/musique_ans_train_sample.json"

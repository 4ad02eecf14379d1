"""Shared fixtures: small real prepared data folders built from the shipped samples."""

from __future__ import annotations

import pytest

from memsearch.data.dataset import save_dataset
from memsearch.data.hotpot import convert_hotpot
from memsearch.samples import HOTPOT_DEV, samples_dir


@pytest.fixture(scope="session")
def hotpot_dev_dir(tmp_path_factory):
    """The first 40 real dev questions, prepared (a real data folder, shared by the session)."""
    out = tmp_path_factory.mktemp("data") / "hotpot-dev-40"
    save_dataset(convert_hotpot(samples_dir() / HOTPOT_DEV, split="dev", limit=40), out)
    return out

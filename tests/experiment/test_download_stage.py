"""The experiment's download stage: a source that cannot be reached names the field to set, and
the same --out then continues with a local copy instead of refusing the changed input; a
finished download is still refused when its source changes."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from memsearch.errors import InputError
from memsearch.experiment.config import load_experiment
from memsearch.experiment.stages import download_stage
from memsearch.io import sha256_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "experiment.example.toml"
SAMPLES = ROOT / "data" / "samples" / "hotpotqa"


def _closed_port() -> int:
    with socket.socket() as sock:  # bound, then released: nothing listens there
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cfg(train: str, dev: str):
    return load_experiment(EXAMPLE, [f'data.train="{train}"', f'data.dev="{dev}"'], profile="cpu")


def test_an_unreachable_source_names_its_field_and_a_local_copy_continues_the_same_out(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    dev = str(SAMPLES / "dev_distractor_sample.json")
    unreachable = f"http://127.0.0.1:{_closed_port()}/hotpot_train_v1.1.json"
    lines: list[str] = []
    with pytest.raises(InputError, match=r"^data\.train: .*\(--set data\.train=PATH; the same --out continues\)"):
        download_stage(_cfg(unreachable, dev), tmp_path, echo=lines.append)
    assert json.loads((tmp_path / "download.stage.json").read_text())["complete"] is False

    train = str(SAMPLES / "train_sample.json")
    files = download_stage(_cfg(train, dev), tmp_path, echo=lines.append)
    assert any(line.startswith("download: unfinished, and its inputs changed") for line in lines)
    assert files["train"]["sha256"] == sha256_file(train) and files["dev"]["sha256"] == sha256_file(dev)
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert {n: f["source"] for n, f in manifest["files"].items()} == {"train": train, "dev": dev}

    # Finished: another source is refused, never mixed with what later stages were made from.
    with pytest.raises(InputError, match="stage 'download' was made from different inputs"):
        download_stage(_cfg(str(SAMPLES / "train_extended.json"), dev), tmp_path, echo=lines.append)

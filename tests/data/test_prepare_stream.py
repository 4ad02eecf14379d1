"""Converting straight into a folder (``prepare_hotpot`` / ``prepare_musique``, what `data
prepare-*` runs) writes the same bytes as converting in memory and saving, holds no document
text, and leaves nothing behind (no folder, no parent made for it) when a record is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.data.dataset import DocumentPool, save_dataset
from memsearch.data.hotpot import convert_hotpot, prepare_hotpot
from memsearch.data.musique import convert_musique, prepare_musique
from memsearch.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "data" / "samples"
FILES = ("corpus.jsonl", "tasks.jsonl", "labels.jsonl", "manifest.json")


@pytest.mark.parametrize("convert, prepare, source, split, limit", [
    (convert_hotpot, prepare_hotpot, SAMPLES / "hotpotqa" / "dev_distractor_sample.json", "dev", 300),
    (convert_hotpot, prepare_hotpot, SAMPLES / "hotpotqa" / "train_sample.json", "train", None),
    (convert_musique, prepare_musique, SAMPLES / "musique" / "musique_ans_dev_sample.json", "dev", None),
])
def test_streamed_folder_is_byte_identical_to_the_saved_dataset(tmp_path, convert, prepare, source, split, limit):
    saved, streamed = tmp_path / "saved", tmp_path / "streamed"
    save_dataset(convert(source, split=split, limit=limit), saved)
    manifest = prepare(source, streamed, split=split, limit=limit)
    assert manifest == json.loads((streamed / "manifest.json").read_text())
    for name in FILES:
        assert (streamed / name).read_bytes() == (saved / name).read_bytes(), name


def test_a_streaming_pool_keeps_ids_not_text():
    handed = []
    pool = DocumentPool(on_new=handed.append)
    ids = [pool.add("T", ["a", "b"]), pool.add("T", ["a", "b"]), pool.add("T", ["a b"]), pool.add("T\u0000", ["a"]),
           pool.add("T", ["a\u0000"])]
    assert ids == ["d0", "d0", "d1", "d2", "d3"]
    assert [d.doc_id for d in handed] == ["d0", "d1", "d2", "d3"] and pool.documents == []
    assert all(isinstance(key, bytes) for key in pool._ids)  # digests, never the paragraphs themselves


def test_a_refused_conversion_leaves_no_folder_and_no_parent(tmp_path):
    records = json.loads((SAMPLES / "hotpotqa" / "dev_distractor_sample.json").read_text("utf-8"))[:30]
    records[25]["answer"] = " "
    source = tmp_path / "src.json"
    source.write_text(json.dumps(records), encoding="utf-8")
    out = tmp_path / "a" / "b" / "out"
    with pytest.raises(InputError, match=r"\[25\]\.answer: got ' ': no visible text"):
        prepare_hotpot(source, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.json"]
    (tmp_path / "kept").mkdir()
    with pytest.raises(InputError):
        prepare_hotpot(source, tmp_path / "kept" / "out")
    assert list((tmp_path / "kept").iterdir()) == []  # a parent that was there stays, empty

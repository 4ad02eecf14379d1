"""Stage records: skip when finished with the same inputs, resume when started, refuse when
made from other inputs or when outputs exist without a record."""

from __future__ import annotations

import json

import pytest

from memsearch.errors import InputError
from memsearch.pipeline.stages import Stage, fingerprint, folder_sha256


def test_fingerprint_is_canonical_and_sensitive():
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 1.5})


def test_lifecycle_start_finish_done(tmp_path):
    stage = Stage(tmp_path / "merged", "merge", {"model": "m", "adapter_sha256": "x"}, tmp_path / "merge.stage.json")
    assert not stage.started() and not stage.done()
    stage.start()
    assert stage.started() and not stage.done()
    stage.finish({"merged": "merged"})
    again = Stage(tmp_path / "merged", "merge", {"adapter_sha256": "x", "model": "m"}, tmp_path / "merge.stage.json")
    assert again.done()
    record = json.loads((tmp_path / "merge.stage.json").read_text())
    assert record["complete"] is True and record["inputs"] == {"model": "m", "adapter_sha256": "x"}


def test_other_inputs_are_refused_naming_the_changed_fields(tmp_path):
    Stage(tmp_path / "s", "train", {"grpo": {"steps": 4, "lr": 1e-6}, "prepare": "p"}).start()
    with pytest.raises(InputError) as info:
        Stage(tmp_path / "s", "train", {"grpo": {"steps": 5, "lr": 1e-6}, "prepare": "q"}).done()
    assert "changed: grpo.steps, prepare" in str(info.value) and "delete" in str(info.value)


def test_outputs_without_a_record_are_refused(tmp_path):
    (tmp_path / "merged").mkdir()
    (tmp_path / "merged" / "model.safetensors").write_bytes(b"x")
    with pytest.raises(InputError, match=r"exists but has no record \(stage.json\)"):
        Stage(tmp_path / "merged", "merge", {"a": 1}).done()


def test_folder_sha256_covers_names_and_contents(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "w.bin").write_bytes(b"1")
    first = folder_sha256(tmp_path / "a")
    (tmp_path / "a" / "w.bin").write_bytes(b"2")
    second = folder_sha256(tmp_path / "a")
    (tmp_path / "a" / "w.bin").rename(tmp_path / "a" / "v.bin")
    assert len({first, second, folder_sha256(tmp_path / "a")}) == 3

"""``pipelines.bookkeeping``: what both pipelines record the same way."""

from __future__ import annotations

import hashlib
import json

import pytest

from memsearch.assets.samples import HOTPOT_DEV, samples_dir
from memsearch.config import RunConfig
from memsearch.errors import InputError
from memsearch.pipelines.bookkeeping import record_invocation, source_sha256


def test_source_sha256_of_a_real_file_and_refusal_of_a_missing_one(tmp_path):
    path = samples_dir() / HOTPOT_DEV
    assert source_sha256(str(path)) == hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(InputError, match="no such HotpotQA file"):
        source_sha256(str(tmp_path / "missing.json"))


def test_every_invocation_is_appended_with_its_resolved_config(tmp_path):
    out = tmp_path / "run" / "nested"
    cfg = RunConfig()
    assert record_invocation(out, cfg) == out
    record_invocation(out, cfg.model_copy(update={"limit": 3}))
    lines = [json.loads(line) for line in (out / "invocations.jsonl").read_text().splitlines()]
    assert [line["config"]["limit"] for line in lines] == [cfg.limit, 3]
    assert all(line["config"] == {**cfg.model_dump(mode="json"), "limit": line["config"]["limit"]} for line in lines)
    assert all(line["time"] for line in lines)

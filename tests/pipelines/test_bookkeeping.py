"""``pipelines.bookkeeping``: what both pipelines record the same way."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from memsearch.assets.samples import HOTPOT_DEV, samples_dir
from memsearch.config import RunConfig
from memsearch.errors import InputError
from memsearch.pipelines.bookkeeping import record_invocation, source_sha256

ROOT = Path(__file__).resolve().parents[2]


def test_source_sha256_of_a_real_file_and_refusal_of_a_missing_one(tmp_path):
    path = samples_dir() / HOTPOT_DEV
    assert source_sha256(str(path)) == hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(InputError, match="no such source file"):
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


def _pipeline_config(name: str):
    from memsearch.config import load_config
    from memsearch.pipelines.memagent.config import MemAgentPipeline
    from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline

    model, path = {"memagent": (MemAgentPipeline, "memagent.toml"),
                   "memory-policy": (MemoryPolicyPipeline, "memory_policy_cpu.toml")}[name]
    return load_config(ROOT / "configs" / path, [], model=model)


def _files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_pipeline_writes_only_into_a_folder_it_made(tmp_path):
    """Issue 26 item 2: an existing --out that this pipeline did not make (a model folder, a data
    folder, another pipeline's folder) is refused with nothing written; a new one is created."""
    cfg = _pipeline_config("memory-policy")
    model, empty = tmp_path / "model", tmp_path / "empty"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}\n')
    empty.mkdir()
    other = record_invocation(tmp_path / "memagent", _pipeline_config("memagent"))
    for folder, why in ((model, "not a folder made by `memsearch pipeline memory-policy`"),
                        (empty, "not a folder made by `memsearch pipeline memory-policy`"),
                        (other, "made by `memsearch pipeline memagent`, not `memsearch pipeline memory-policy`")):
        before = _files(folder)
        with pytest.raises(InputError, match=f"^{folder}: {why}"):
            record_invocation(folder, cfg)
        assert _files(folder) == before
    out = record_invocation(tmp_path / "new" / "mp", cfg)
    record_invocation(out, cfg)  # its own folder: continued
    assert len((out / "invocations.jsonl").read_text().splitlines()) == 2


def test_a_pipeline_folder_of_an_earlier_version_or_of_copied_stages_is_its_own(tmp_path):
    """Without a marker, a folder is this pipeline's when its invocations.jsonl records this
    pipeline, or when it holds stage records (a control's folder of stages copied from the recipe's
    run, docs/memory_policy.md "Controls")."""
    cfg = _pipeline_config("memory-policy")
    earlier, other, control = tmp_path / "earlier", tmp_path / "other", tmp_path / "control"
    for folder in (earlier, other):
        folder.mkdir()
        (folder / "invocations.jsonl").write_text(
            json.dumps({"time": "2026-01-01T00:00:00+0000", "config": cfg.model_dump(mode="json")}) + "\n")
    (control / "prepare").mkdir(parents=True)
    (control / "prepare.stage.json").write_text(json.dumps({"version": 2, "stage": "prepare", "fingerprint": "f",
                                                            "inputs": {}, "complete": True}) + "\n")
    for folder in (earlier, control):
        record_invocation(folder, cfg)
        assert (folder / "invocations.jsonl").read_text().count("\n") == (2 if folder == earlier else 1)
    before = _files(other)
    with pytest.raises(InputError, match="not a folder made by `memsearch pipeline memagent`"):
        record_invocation(other, _pipeline_config("memagent"))  # it records the other pipeline
    assert _files(other) == before

"""An adapter saved from byte-identical weights has the same bytes in every process (issue 26):
PEFT wrote ``target_modules`` in set order, which string hashing changes per process, so the
stages' ``adapter_sha256`` (and the merge stage's fingerprint upstream) differed between runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

SAVE = """
import sys
from pathlib import Path
from memsearch.pipelines.stage_record import folder_sha256
from memsearch.train.config import LoraSettings
from memsearch.train.merge import merge_adapter
from memsearch.train.policy import load_policy, save_adapter

model, out = sys.argv[1], Path(sys.argv[2])
policy, _, _ = load_policy(model, None, LoraSettings(r=2), device="cpu", seed=3)  # the 7 default target modules
save_adapter(policy, out / "adapter")
merge_adapter(model, out / "adapter", out / "merged")
print(folder_sha256(out / "adapter"), folder_sha256(out / "merged"))
"""


@pytest.mark.slow  # two fresh processes, each loading torch, PEFT and the tiny model
def test_saved_and_merged_adapters_hash_the_same_under_different_hash_seeds(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    hashes = []
    for seed in ("1", "2"):  # two seeds that order the 7 modules differently
        env = {**os.environ, "PYTHONHASHSEED": seed, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run([sys.executable, "-c", SAVE, str(tiny_model_dir), str(out)], capture_output=True,
                              text=True, env=env, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        hashes.append(proc.stdout.split())
        shutil.rmtree(out)
    assert hashes[0] == hashes[1]


def test_the_same_adapter_merged_from_two_folders_gives_the_same_merged_folder(tiny_model_dir, tiny_adapter_dir,
                                                                                 tmp_path):
    """memsearch_merge.json records the adapter by content, not by where it lay: the merged
    folder's hash (part of later stages' fingerprints) is the same for a copy in another folder,
    and the A/C baseline still traces the merged folder back to its base."""
    import json

    from memsearch.config import load_config
    from memsearch.config.run import group_config
    from memsearch.pipelines.stage_record import folder_sha256
    from memsearch.train.merge import merge_adapter

    merged = []
    for where in ("run-a", "elsewhere/run-b"):
        adapter = shutil.copytree(tiny_adapter_dir, tmp_path / where / "adapter")
        merged.append(merge_adapter(str(tiny_model_dir), adapter, tmp_path / where / "merged1"))
    assert folder_sha256(merged[0]) == folder_sha256(merged[1])
    record = json.loads((merged[0] / "memsearch_merge.json").read_text())
    assert record == {"base": str(tiny_model_dir), "adapter_sha256": folder_sha256(tiny_adapter_dir),
                      "dtype": "float32"}
    cfg = load_config(None, ['backends.memory.kind="hf"', f"backends.memory.model={json.dumps(str(merged[1]))}"])
    assert group_config(cfg, "A").backends.memory.model == str(tiny_model_dir)

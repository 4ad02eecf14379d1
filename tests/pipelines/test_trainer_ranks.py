"""A trainer stage whose layout has several ranks runs its trainer under torchrun as a child
(``memsearch.train.launch``): two gloo ranks on the CPU (``devices.cpu_ranks = 2``) train one
adapter, a collapse-guard stop is still scored at its checkpoint, a failed child is an error
naming the stage, its exit status and the command, and an interrupt leaves no rank running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from tests.train.grpo.test_grpo import CONFIG

from memsearch.assets.samples import HOTPOT_TRAIN, samples_dir
from memsearch.config import load_config
from memsearch.data.dataset import save_dataset
from memsearch.data.hotpot import convert_hotpot
from memsearch.errors import InputError
from memsearch.pipelines.stage_record import folder_sha256
from memsearch.pipelines.trainer_stages import grpo_stage
from memsearch.serving.ownership import child_processes, kill_groups
from memsearch.train.config import GRPOConfig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def train_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "hotpot-train-4"
    save_dataset(convert_hotpot(samples_dir() / HOTPOT_TRAIN, split="train", limit=4), out)
    return out


def two_rank_config(tmp_path, model, data, **extra) -> GRPOConfig:
    """The tiny GRPO run of the trainer's own torchrun test (one task per rank), on 2 CPU ranks."""
    (tmp_path / "grpo.toml").write_text(CONFIG)
    fields = {"model": str(model), "data": str(data), "steps": 1, "devices.cpu_ranks": 2, **extra}
    return load_config(tmp_path / "grpo.toml", [f"{k}={json.dumps(v)}" for k, v in fields.items()], model=GRPOConfig)


def test_two_cpu_ranks_train_one_adapter_under_torchrun(tiny_model_dir, train_data, tmp_path, capfd):
    cfg = two_rank_config(tmp_path, tiny_model_dir, train_data)
    folder, record = tmp_path / "out" / "grpo1", tmp_path / "out" / "grpo1.stage.json"
    lines: list[str] = []
    adapter = grpo_stage(folder, record, cfg, {"start": "test"}, echo=lines.append)
    assert lines == ["grpo1: GRPO role=memory, 1 steps x 2 questions x group 2 on 2 ranks (torchrun)"]
    assert "step 1/1" in capfd.readouterr().out  # the ranks' step lines reach the user
    assert (adapter / "adapter_config.json").is_file()
    assert json.loads((folder / "summary.json").read_text())["world_size"] == 2
    (step,) = [json.loads(x) for x in (folder / "train_log.jsonl").read_text().splitlines()]
    assert step["trajectories"] == 4  # 2 tasks x group 2, one task per rank
    assert sorted(p.name for p in (folder / "rollouts").iterdir()) == ["step-000001.rank0.jsonl",
                                                                       "step-000001.rank1.jsonl"]
    finished = json.loads(record.read_text())
    assert finished["complete"] and finished["outputs"]["adapter_sha256"] == folder_sha256(adapter)
    assert "devices" not in finished["inputs"]["grpo"]  # placement: the same stage on any layout
    # the config the ranks read lies beside the trainer's folder, not in it
    assert GRPOConfig.model_validate_json((tmp_path / "out" / "grpo1.launch.json").read_text()) == cfg
    assert grpo_stage(folder, record, cfg, {"start": "test"}, echo=lines.append) == adapter
    assert lines[-1] == f"grpo1: done ({folder})"  # finished: no rank started again


def test_a_collapse_guard_stop_in_the_ranks_is_scored_at_its_checkpoint(tiny_model_dir, train_data, tmp_path):
    """The tiny random model writes no parsable op: the guard (patience 1) stops at step 1 of 2."""
    cfg = two_rank_config(tmp_path, tiny_model_dir, train_data, steps=2, checkpoint_every=1,
                          **{"collapse_guard.enabled": True, "collapse_guard.patience": 1,
                             "collapse_guard.min_ops": 1})
    folder, record = tmp_path / "out" / "grpo1", tmp_path / "out" / "grpo1.stage.json"
    messages: list[str] = []
    adapter = grpo_stage(folder, record, cfg, {"start": "test"}, echo=messages.append,
                         on_collapse="score_last_checkpoint")
    collapse = json.loads(record.read_text())["outputs"]["collapse"]
    assert (collapse["step"], collapse["checkpoint"]) == (1, "checkpoints/step-000001")
    assert folder_sha256(adapter) == folder_sha256(folder / "checkpoints" / "step-000001" / "adapter")
    assert "scoring checkpoints/step-000001" in messages[-1]


def test_a_failed_child_is_an_error_naming_the_stage_status_and_command(tiny_model_dir, tmp_path):
    cfg = two_rank_config(tmp_path, tiny_model_dir, tmp_path / "no-such-data")
    folder, record = tmp_path / "out" / "grpo1", tmp_path / "out" / "grpo1.stage.json"
    with pytest.raises(InputError) as info:
        grpo_stage(folder, record, cfg, {"start": "test"}, echo=lambda m: None)
    message = str(info.value)
    assert message.startswith("grpo1: the trainer under torchrun exited with status 1 ")
    assert "--nproc_per_node=2 -m memsearch.train.launch grpo" in message
    assert f"{tmp_path / 'out' / 'grpo1.launch.json'} {folder}" in message
    assert not json.loads(record.read_text())["complete"]


# The stage in a process of its own: a SIGINT to this one would reach pytest (and xdist's workers).
INTERRUPTED = """import sys
from pathlib import Path
from memsearch.pipelines.trainer_stages import grpo_stage
from memsearch.train.config import GRPOConfig
cfg = GRPOConfig.model_validate_json(Path(sys.argv[1]).read_text())
try:
    grpo_stage(Path(sys.argv[2]), Path(sys.argv[2] + ".stage.json"), cfg, {"start": "test"})
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_an_interrupt_stops_every_rank(tiny_model_dir, train_data, tmp_path):
    """Ctrl-C while the ranks train: the stage ends (KeyboardInterrupt) once torchrun and both
    ranks (each in a session of its own) are gone."""
    config = tmp_path / "cfg.json"
    config.write_text(two_rank_config(tmp_path, tiny_model_dir, train_data, steps=50).model_dump_json())
    log = tmp_path / "stage.log"
    with open(log, "wb") as fh:
        stage = subprocess.Popen([sys.executable, "-c", INTERRUPTED, str(config), str(tmp_path / "grpo1")],
                                 stdout=fh, stderr=subprocess.STDOUT)
    ranks: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 90
        while len(ranks) < 2 and stage.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            ranks = {r: t for pid in child_processes(stage.pid) for r, t in child_processes(pid).items()}
        assert len(ranks) == 2, log.read_text()[-2000:]
        stage.send_signal(signal.SIGINT)
        assert stage.wait(timeout=90) == 130, log.read_text()[-2000:]
        for pid in ranks:  # reaped by torchrun, or orphaned and reaped by init: gone either way
            deadline = time.monotonic() + 10
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not os.path.exists(f"/proc/{pid}"), f"rank {pid} left running"
    finally:
        if stage.poll() is None:
            stage.kill()
            stage.wait(10)
        kill_groups(ranks)

"""Checkpoints that were damaged after they were written (issue 26): checksums written at save
and verified on resume, the fall-back to the newest intact checkpoint, a run started again from
step 0 when none is left, and checkpoints of an older memsearch (no checksums) loaded unverified.
Real LoRA SFT runs on the tiny Llama with short real SFT rows."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from memsearch.train.log import read_log
from memsearch.train.sft.trainer import train_sft

CHECKSUMS = "checksums.json"  # beside the checkpoint's files: part of its format
STEPS = 6  # 12 rows, 2 per step, one epoch; checkpoints at 2 and 4 when a run stops after step 5


class Crash(Exception):
    pass


def crash_after(step: int, lines: list[str] | None = None):
    def echo(message: str) -> None:
        if lines is not None:
            lines.append(message)
        if message.startswith(f"step {step}/"):
            raise Crash(message)

    return echo


def weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def rows(short_sft_rows):
    return short_sft_rows


@pytest.fixture(scope="module")
def config(short_sft_config):
    return short_sft_config


@pytest.fixture(scope="module")
def reference(tiny_model_dir, rows, config, tmp_path_factory):
    """The uninterrupted run: a resumed run must end with exactly its adapter."""
    out = tmp_path_factory.mktemp("ref") / "run"
    train_sft(config(tiny_model_dir, rows), out, echo=lambda m: None)
    return out


@pytest.fixture(scope="module")
def stopped_once(tiny_model_dir, rows, config, tmp_path_factory):
    out = tmp_path_factory.mktemp("stopped") / "run"
    with pytest.raises(Crash):
        train_sft(config(tiny_model_dir, rows), out, echo=crash_after(5))
    assert [p.name for p in sorted((out / "checkpoints").glob("step-*"))] == ["step-000002", "step-000004"]
    return out


@pytest.fixture
def stopped(stopped_once, tmp_path):
    """A run that stopped after step 5, its checkpoints at steps 2 and 4 (a copy of one such run
    for each test: the folder holds no path of its own)."""
    out = tmp_path / "run"
    shutil.copytree(stopped_once, out)
    return out


def overwrite(path, offset_from_end: int = 64, size: int = 32) -> None:
    """Bytes overwritten in place, the file keeps its size (a bad disk block, a stray write)."""
    data = bytearray(path.read_bytes())
    data[-offset_from_end:-offset_from_end + size] = b"\xff" * size  # 0xffffffff is a NaN float32
    path.write_bytes(bytes(data))


def truncate(path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def assert_same_adapter(out, reference) -> None:
    got, want = weights(out / "adapter"), weights(reference / "adapter")
    assert got.keys() == want.keys()
    for k in got:
        assert torch.isfinite(got[k]).all(), k
        assert torch.equal(got[k], want[k]), k


@pytest.mark.parametrize("damage, file", [
    (overwrite, "adapter/adapter_model.safetensors"),
    (truncate, "adapter/adapter_model.safetensors"),
    (overwrite, "trainer.pt"),
    (truncate, "rng-rank0.pt"),
])
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(
    damage, file, stopped, reference, tiny_model_dir, rows, config
):
    damaged = stopped / "checkpoints" / "step-000004" / file
    damage(damaged)
    lines: list[str] = []
    train_sft(config(tiny_model_dir, rows), stopped, resume=True, echo=lines.append)
    warning = next(line for line in lines if "damaged" in line)
    assert str(damaged) in warning and "\n" not in warning, lines
    assert "step-000002" in warning  # where it continues from
    assert any("resumed at step 2" in line for line in lines), lines
    assert_same_adapter(stopped, reference)
    assert [r["step"] for r in read_log(stopped / "train_log.jsonl")] == list(range(1, STEPS + 1))
    # the damaged folder is kept for inspection, out of the way of the checkpoints the run writes
    assert (stopped / "checkpoints" / "damaged-step-000004" / file).is_file()


def test_no_intact_checkpoint_left_starts_again_from_step_zero(stopped, reference, tiny_model_dir, rows, config):
    """Step 0 is rebuilt from the config (seeded LoRA initialisation), the log and evaluations of
    the lost steps are dropped: the run ends where an uninterrupted one does."""
    for step in ("step-000002", "step-000004"):
        overwrite(stopped / "checkpoints" / step / "adapter" / "adapter_model.safetensors")
    lines: list[str] = []
    train_sft(config(tiny_model_dir, rows), stopped, resume=True, echo=lines.append)
    assert any("no intact checkpoint" in line and "step 0" in line for line in lines), lines
    assert_same_adapter(stopped, reference)
    assert [r["step"] for r in read_log(stopped / "train_log.jsonl")] == list(range(1, STEPS + 1))


def test_a_checkpoint_of_an_older_memsearch_loads_unverified(stopped, reference, tiny_model_dir, rows,
                                                                 config):
    """No checksums file (written before checksums existed): loaded, and said to be unverified."""
    newest = stopped / "checkpoints" / "step-000004"
    (newest / CHECKSUMS).unlink()
    lines: list[str] = []
    train_sft(config(tiny_model_dir, rows), stopped, resume=True, echo=lines.append)
    assert any(str(newest) in line and "unverified" in line for line in lines), lines
    assert any("resumed at step 4" in line for line in lines), lines
    assert_same_adapter(stopped, reference)


def test_a_damaged_checkpoint_of_an_older_memsearch_is_found_by_its_non_finite_weights(
    stopped, reference, tiny_model_dir, rows, config
):
    """Without checksums the bytes cannot be checked, but NaN weights or optimizer state can."""
    for step in ("step-000002", "step-000004"):
        (stopped / "checkpoints" / step / CHECKSUMS).unlink()
    overwrite(stopped / "checkpoints" / "step-000004" / "adapter" / "adapter_model.safetensors")
    lines: list[str] = []
    train_sft(config(tiny_model_dir, rows), stopped, resume=True, echo=lines.append)
    assert any("damaged" in line and "non-finite" in line for line in lines), lines
    assert any("resumed at step 2" in line for line in lines), lines
    assert_same_adapter(stopped, reference)


def test_checksums_are_written_with_the_checkpoint_and_list_every_file(stopped):
    from memsearch.io import sha256_file
    folder = stopped / "checkpoints" / "step-000004"
    listed = json.loads((folder / CHECKSUMS).read_text())["files"]
    on_disk = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                     if p.is_file() and p.name not in (CHECKSUMS, "COMPLETE"))
    assert sorted(listed) == on_disk and "trainer.pt" in listed and "rng-rank0.pt" in listed
    assert all(sha256_file(folder / name) == digest for name, digest in listed.items())


@pytest.mark.slow  # two runs of their own with periodic evaluations
def test_a_periodic_evaluation_of_a_lost_step_is_run_again(tiny_model_dir, rows, config, hotpot_dev_dir,
                                                           tmp_path):
    """Falling back past an evaluated step evaluates it again (its old run folder belonged to the
    lost steps); before, the evaluation refused the existing folder and the resume stopped."""
    from memsearch.assets.samples import config_path

    extra = {"eval_config": str(config_path("rules.toml")), "eval.data": str(hotpot_dev_dir), "eval.limit": 1,
             "eval.every": 4}
    out = tmp_path / "run"
    with pytest.raises(Crash):
        train_sft(config(tiny_model_dir, rows, **extra), out, echo=crash_after(5))
    assert (out / "eval" / "step-000004" / "summary.json").is_file()
    overwrite(out / "checkpoints" / "step-000004" / "trainer.pt")
    lines: list[str] = []
    train_sft(config(tiny_model_dir, rows, **extra), out, resume=True, echo=lines.append)
    assert any("resumed at step 2" in line for line in lines), lines
    log = read_log(out / "train_log.jsonl")
    assert [r["step"] for r in log] == list(range(1, STEPS + 1))
    assert "eval_f1" in log[3] and "eval_f1" in log[-1]
    shutil.rmtree(out)

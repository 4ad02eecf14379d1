"""Stage records: skip when finished with the same inputs, resume when started, refuse when
made from other inputs or when outputs exist without a record."""

from __future__ import annotations

import json

import pytest

from memsearch.errors import InputError
from memsearch.pipelines import stage_versions
from memsearch.pipelines.stage_record import Stage, folder_sha256, run_folder
from memsearch.pipelines.stage_versions import RECORD_VERSION, fingerprint


def _as_version1(path):
    """Rewrite a record as version 1 wrote it: no ``version`` key."""
    record = json.loads(path.read_text())
    del record["version"]
    path.write_text(json.dumps(record))


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


def _renamed_lr(table: dict) -> dict:
    """The inverse of a rename of a trainer table's ``lr`` to ``learning_rate`` (a table that has
    ``steps``), as a rename adds it to ``RENAMES_SINCE_VERSION4``."""
    return {("lr" if k == "learning_rate" else k): v for k, v in table.items()} if "steps" in table else table


def test_a_renamed_config_field_leaves_a_finished_stage_finished(tmp_path, monkeypatch):
    before = {"grpo": {"steps": 4, "lr": 1e-6}, "prepare": "p"}
    stage = Stage(tmp_path / "s", "train", before)
    stage.start()
    stage.finish({"adapter": "adapter"})
    recorded = (tmp_path / "s" / "stage.json").read_text()
    renamed = {"grpo": {"steps": 4, "learning_rate": 1e-6}, "prepare": "p"}
    with pytest.raises(InputError, match=r"changed: grpo\.learning_rate, grpo\.lr"):
        Stage(tmp_path / "s", "train", renamed).done()  # without its inverse, a rename looks like a change
    monkeypatch.setattr(stage_versions, "RENAMES_SINCE_VERSION4", [_renamed_lr])
    after = Stage(tmp_path / "s", "train", renamed)
    assert after.fingerprint == stage.fingerprint and after.done()
    assert (tmp_path / "s" / "stage.json").read_text() == recorded  # reused as it is: no upgrade, no new version
    with pytest.raises(InputError, match=r"changed: grpo\.lr"):  # a changed value is still a change
        Stage(tmp_path / "s", "train", {"grpo": {"steps": 4, "learning_rate": 2e-6}, "prepare": "p"}).done()


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


def _finished_stage(out, inputs):
    with run_folder(out):
        stage = Stage(out / "seed-1" / "sft", "sft", inputs, out / "seed-1" / "sft.stage.json")
        stage.start()
        (out / "seed-1" / "sft").mkdir(parents=True, exist_ok=True)
        stage.finish({"adapter": "adapter"})
    return stage


def test_paths_under_the_run_folder_are_recorded_as_out_so_a_copied_stage_is_reused(tmp_path):
    """A stage's record names its run folder's paths as $OUT: the same stage copied into another
    run folder is done there, and a path outside the run folder still counts."""
    import shutil

    def inputs(out):
        return {"sft": {"data": [str(out / "teacher" / "selected.jsonl")], "model": "embedded",
                        "train": "data/samples/hotpotqa/train_sample.json"}, "rows": "r1"}

    first = tmp_path / "runs" / "mp"
    stage = _finished_stage(first, inputs(first))
    record = json.loads((first / "seed-1" / "sft.stage.json").read_text())
    assert record["inputs"]["sft"]["data"] == ["$OUT/teacher/selected.jsonl"]
    assert str(first) not in (first / "seed-1" / "sft.stage.json").read_text()
    second = tmp_path / "runs" / "control"
    shutil.copytree(first / "seed-1", second / "seed-1")
    with run_folder(second):
        copied = Stage(second / "seed-1" / "sft", "sft", inputs(second), second / "seed-1" / "sft.stage.json")
        assert copied.done() and copied.fingerprint == stage.fingerprint
        other = dict(inputs(second), sft={**inputs(second)["sft"], "train": "data/other.json"})
        with pytest.raises(InputError, match=r"changed: sft.train"):
            Stage(second / "seed-1" / "sft", "sft", other, second / "seed-1" / "sft.stage.json").done()
    # Outside run_folder (a stage used on its own) the path is recorded as given: not reusable elsewhere.
    with pytest.raises(InputError, match=r"changed: sft.data"):
        Stage(second / "seed-1" / "sft", "sft", inputs(second), second / "seed-1" / "sft.stage.json").done()


def test_a_record_with_raw_paths_is_accepted_in_its_own_folder_and_rewritten_portable(tmp_path):
    """Records written before paths were made portable hold the run folder's raw paths: the same
    inputs in the same folder are still done (and the record is rewritten with $OUT), so a finished
    run is not redone; in another folder such a record is refused."""
    out = tmp_path / "mp"
    inputs = {"grpo": {"adapter": str(out / "seed-1" / "sft" / "adapter")}, "prepare": "p"}
    legacy = Stage(out / "seed-1" / "grpo1", "grpo1", inputs, out / "seed-1" / "grpo1.stage.json")  # no run_folder
    legacy.start()
    legacy.finish({"adapter": "adapter"})
    _as_version1(out / "seed-1" / "grpo1.stage.json")
    with run_folder(out):
        stage = Stage(out / "seed-1" / "grpo1", "grpo1", inputs, out / "seed-1" / "grpo1.stage.json")
        assert stage.done()
    record = json.loads((out / "seed-1" / "grpo1.stage.json").read_text())
    assert record["fingerprint"] == stage.fingerprint and record["fingerprint_before"] == legacy.fingerprint
    assert record["inputs"]["grpo"]["adapter"] == "$OUT/seed-1/sft/adapter" and record["complete"] is True
    other = tmp_path / "other"
    (other / "seed-1").mkdir(parents=True)
    old = dict(json.loads((out / "seed-1" / "grpo1.stage.json").read_text()), fingerprint=legacy.fingerprint,
               inputs=inputs)
    (other / "seed-1" / "grpo1.stage.json").write_text(json.dumps(old))
    with run_folder(other), pytest.raises(InputError, match=r"made from different inputs \(changed: grpo.adapter\)"):
        Stage(other / "seed-1" / "grpo1", "grpo1", {"grpo": {"adapter": str(other / "seed-1" / "sft" / "adapter")},
                                                    "prepare": "p"}, other / "seed-1" / "grpo1.stage.json").done()


def test_records_carry_the_record_version(tmp_path):
    stage = Stage(tmp_path / "s", "s", {"a": 1})
    stage.start()
    assert json.loads((tmp_path / "s" / "stage.json").read_text())["version"] == RECORD_VERSION == 4


def test_a_version1_record_that_left_default_control_fields_out_is_upgraded(tmp_path):
    """Version 1 dumps left memory_sources and open_items out at their defaults: a finished stage
    made from the same config is recognised (and its record rewritten as the current version), one made
    from another config is refused naming what changed."""
    from memsearch.config import RunConfig
    from memsearch.pipelines.stage_versions import version2_dump

    run = RunConfig().model_dump(mode="json")
    flat = version2_dump(run)  # the earlier flat backend tables, which version 1 wrote too
    assert flat["agent"]["memory_sources"] == "shown" and flat["backends"]["memory"]["open_items"] is False
    old = json.loads(json.dumps(flat))
    del old["agent"]["memory_sources"]
    for role in ("memory", "controller", "reader"):
        del old["backends"][role]["open_items"]
    record = tmp_path / "eval.stage.json"
    record.write_text(json.dumps({"stage": "eval", "fingerprint": fingerprint({"run_config": old}),
                                  "inputs": {"run_config": old}, "complete": True}))
    stage = Stage(tmp_path / "eval", "eval", {"run_config": run}, record)
    assert stage.done()
    upgraded = json.loads(record.read_text())
    assert upgraded["version"] == RECORD_VERSION and upgraded["fingerprint"] == stage.fingerprint
    assert upgraded["fingerprint_before"] == fingerprint({"run_config": old})
    assert upgraded["inputs"]["run_config"] == run
    hidden = json.loads(json.dumps(run))
    hidden["agent"]["memory_sources"] = "hidden"
    record.write_text(
        json.dumps(
            {
                "stage": "eval",
                "fingerprint": fingerprint({"run_config": old}),
                "inputs": {"run_config": old},
                "complete": True,
            }
        )
    )
    with pytest.raises(InputError, match=r"changed: run_config.agent.memory_sources"):
        Stage(tmp_path / "eval", "eval", {"run_config": hidden}, record).done()


def test_a_record_of_an_unknown_version_is_refused_saying_how_to_redo_it(tmp_path):
    stage = Stage(tmp_path / "s", "s", {"a": 1})
    stage.start()
    path = tmp_path / "s" / "stage.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "version": 99}))
    with pytest.raises(InputError, match=r"stage record version 99, this memsearch reads version 4.*delete .* to redo"):
        stage.done()

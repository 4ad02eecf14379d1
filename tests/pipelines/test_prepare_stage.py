"""The memory-policy pipeline's prepare stage (issue 62): more questions asked than a file holds
are refused before anything is written, naming the setting, the number asked and the number held;
a finished prepare whose files were deleted or changed is refused naming each file, before any
later stage runs, and the command then rebuilds the same bytes; a record of before (no hashes) is
checked for the files' presence."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tests.pipelines.conftest import MP_CONFIG, SAMPLES, mp_settings

from memsearch.config import load_config
from memsearch.errors import InputError
from memsearch.io import sha256_file
from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline
from memsearch.pipelines.memory_policy.pipeline import PREPARED_FILES, prepare_stage

TRAIN = SAMPLES / "train_sample.json"  # 100 questions
DEV = SAMPLES / "dev_distractor_sample.json"  # 1000 questions


def _cfg(*extra: str) -> MemoryPolicyPipeline:
    # The prepare stage reads no model: the embedded one stands in (no tiny model to build).
    return load_config(MP_CONFIG, mp_settings("embedded", *extra), model=MemoryPolicyPipeline)


@pytest.mark.parametrize(("settings", "message"), [
    (["data.train_questions=101"], f"data.train_questions = 101: {TRAIN} holds 100 questions; set "
     "data.train_questions to at most 100 (or leave it unset: all of them)"),
    (["data.dev_questions=5000"], f"data.dev_questions = 5000: {DEV} holds 1000 questions; set data.dev_questions to "
     "at most 1000 (the held-out questions are the first N of data.dev)"),
    (["data.dev_questions=1200", "data.val_questions=20"], f"data.dev_questions = 1200: {DEV} holds 1000 questions "
     "(and data.val_questions = 20 asks for that many more after them); set data.dev_questions to at most 1000 (the "
     "held-out questions are the first N of data.dev)"),
    (["data.dev_questions=990", "data.val_questions=20"], f"data.val_questions = 20: {DEV} holds 1000 questions, 10 "
     "after the 990 held-out ones (data.dev_questions); set data.val_questions to at most 10, or data.dev_questions "
     "lower"),
    (["data.train_questions=400", "data.dev_questions=1001"], f"data.train_questions = 400: {TRAIN} holds 100 "
     f"questions; set data.train_questions to at most 100 (or leave it unset: all of them)\ndata.dev_questions = 1001: "
     f"{DEV} holds 1000 questions; set data.dev_questions to at most 1000 (the held-out questions are the first N of "
     "data.dev)"),
])
def test_more_questions_than_the_file_holds_are_refused_before_anything_is_written(tmp_path, settings, message):
    out = tmp_path / "o"
    out.mkdir()
    with pytest.raises(InputError) as info:
        prepare_stage(_cfg(*settings), out, echo=lambda _: None)
    assert str(info.value) == message
    assert list(out.iterdir()) == []  # no record, no folder: the corrected config is not refused
    paths = prepare_stage(_cfg(), out, echo=lambda _: None)
    assert json.loads((out / "prepare.stage.json").read_text())["complete"] is True
    assert len((paths["dev"] / "tasks.jsonl").read_text().splitlines()) == 3


def test_exactly_what_the_file_holds_is_fine(tmp_path):
    paths = prepare_stage(_cfg("data.train_questions=100", "data.dev_questions=998", "data.val_questions=2"),
                          tmp_path, echo=lambda _: None)
    counts = {n: len((paths[n] / "tasks.jsonl").read_text().splitlines()) for n in ("train", "dev", "val")}
    assert counts == {"train": 100, "dev": 998, "val": 2}


def _damaged(out: Path) -> str:
    return (f"prepare: 1 prepared file(s) missing or changed since the stage finished; the later stages were made "
            f"from them. Delete {out / 'prepare'} and {out / 'prepare.stage.json'}, then run the same command: it "
            "prepares them again (the same inputs give the same bytes)")


def test_a_deleted_or_changed_prepared_file_is_refused_naming_it_and_the_same_command_rebuilds(tmp_path):
    cfg = _cfg("data.val_questions=2")
    out = tmp_path / "o"
    prepare_stage(cfg, out, echo=lambda _: None)
    record = json.loads((out / "prepare.stage.json").read_text())
    hashes = record["outputs"]["sha256"]
    assert sorted(hashes) == ["dev", "train", "val"] and all(sorted(h) == sorted(PREPARED_FILES)
                                                             for h in hashes.values())
    assert hashes["dev"]["tasks.jsonl"] == sha256_file(out / "prepare" / "dev" / "tasks.jsonl")

    tasks = out / "prepare" / "dev" / "tasks.jsonl"
    tasks.unlink()
    lines: list[str] = []
    with pytest.raises(InputError) as info:
        prepare_stage(cfg, out, echo=lines.append)
    assert str(info.value) == f"{tasks}: missing\n" + _damaged(out)
    assert lines == [] and not tasks.exists()  # nothing changed, nothing said to be done

    labels = out / "prepare" / "val" / "labels.jsonl"
    shutil.copy(out / "prepare" / "train" / "labels.jsonl", labels)
    with pytest.raises(InputError) as info:
        prepare_stage(cfg, out, echo=lines.append)
    first, second = str(info.value).splitlines()[:2]
    assert first == f"{tasks}: missing"
    assert second == (f"{labels}: SHA-256 {sha256_file(labels)}, recorded {hashes['val']['labels.jsonl']}: "
                      "changed")
    assert str(info.value).splitlines()[2].startswith("prepare: 2 prepared file(s) missing or changed")

    # What the message says to do: the same command prepares the same bytes again.
    shutil.rmtree(out / "prepare")
    (out / "prepare.stage.json").unlink()
    prepare_stage(cfg, out, echo=lines.append)
    assert json.loads((out / "prepare.stage.json").read_text())["outputs"]["sha256"] == hashes
    prepare_stage(cfg, out, echo=lines.append)
    assert lines[-1] == f"prepare: done ({out / 'prepare'})"


def test_a_record_of_before_without_hashes_is_checked_for_presence(tmp_path):
    cfg = _cfg()
    prepare_stage(cfg, tmp_path, echo=lambda _: None)
    path = tmp_path / "prepare.stage.json"
    record = json.loads(path.read_text())
    record["outputs"] = {"train_dev_overlap": 0}  # as an earlier memsearch finished it
    path.write_text(json.dumps(record))
    corpus = tmp_path / "prepare" / "train" / "corpus.jsonl"
    corpus.write_text(corpus.read_text() + "\n")  # changed: nothing recorded to tell
    prepare_stage(cfg, tmp_path, echo=lambda _: None)
    manifest = tmp_path / "prepare" / "dev" / "manifest.json"
    manifest.unlink()
    with pytest.raises(InputError, match=rf"^{manifest}: missing\nprepare: 1 prepared file\(s\) missing"):
        prepare_stage(cfg, tmp_path, echo=lambda _: None)


def test_data_format_reads_the_files_with_that_converter_and_hotpot_keeps_earlier_fingerprints(tmp_path):
    # data.format = "musique": the prepare stage converts with the registered MuSiQue converter
    musique = Path(__file__).resolve().parents[2] / "data" / "samples" / "musique"
    cfg = _cfg('data.format="musique"', f'data.train="{(musique / "musique_ans_train_sample.json").as_posix()}"',
               f'data.dev="{(musique / "musique_ans_dev_sample.json").as_posix()}"', "data.train_questions=4")
    paths = prepare_stage(cfg, tmp_path / "o", echo=lambda _: None)
    for split in ("train", "dev"):
        manifest = json.loads((paths[split] / "manifest.json").read_text())
        assert (manifest["kind"], manifest["split"]) == ("musique", split)
    record = json.loads((tmp_path / "o" / "prepare.stage.json").read_text())
    assert record["complete"] is True
    # the default (HotpotQA) is left out of the table's dump, which the stage fingerprint hashes:
    # every HotpotQA run folder made before the field existed still resumes
    assert "format" not in _cfg().data.model_dump(mode="json")
    assert cfg.data.model_dump(mode="json")["format"] == "musique"
    with pytest.raises(InputError, match="data.format.*'squad'.*hotpot.*musique"):
        _cfg('data.format="squad"')

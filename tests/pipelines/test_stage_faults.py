"""Stage records under faults (issue 62): where a served model answers is no input of a stage
(a run continued on other ports reuses what it finished, including records version 3 wrote with
the ports in them, and stages downstream of an upgraded one); a damaged record is refused naming
it, before anything is written; an eval with failed tasks leaves its stage open, so the same
command retries exactly those tasks and ends incomplete until they succeed."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from memsearch.config import RunConfig
from memsearch.config.backend import without_addresses
from memsearch.errors import IncompleteResult, InputError
from memsearch.pipelines.eval_stage import eval_run
from memsearch.pipelines.stage_record import Stage, check_stage_records, run_folder
from memsearch.pipelines.stage_versions import RECORD_VERSION, fingerprint
from memsearch.pipelines.unfinished import raise_if_unfinished, unfinished_stages

ROOT = Path(__file__).resolve().parents[2]


def _served_run(port: int) -> dict:
    """A run config whose reader is served at ``port``, dumped as a stage fingerprints it."""
    cfg = RunConfig.model_validate({"backends": {"reader": {"kind": "openai", "model": "smollm2",
                                                            "base_url": f"http://127.0.0.1:{port}/v1"}}})
    return cfg.model_dump(mode="json")


def test_the_port_a_model_is_served_at_is_no_input(tmp_path):
    a = Stage(tmp_path / "run", "run", {"run_config": _served_run(8001)}, tmp_path / "run.stage.json")
    b = Stage(tmp_path / "run", "run", {"run_config": _served_run(9001)}, tmp_path / "run.stage.json")
    assert a.fingerprint == b.fingerprint and "base_url" not in json.dumps(a.inputs)
    a.start()
    a.finish({"summary": "summary.json"})
    assert b.done()
    # Which model is served stays an input.
    other = _served_run(8001)
    other["backends"]["reader"]["model"] = "another-model"
    with pytest.raises(InputError, match=r"changed: run_config\.backends\.reader\.model"):
        Stage(tmp_path / "run", "run", {"run_config": other}, tmp_path / "run.stage.json").done()


def _version3_record(path: Path, inputs: dict, complete: bool = True) -> str:
    """A record as version 3 wrote it: the inputs with their addresses, fingerprinted so."""
    fp = fingerprint(inputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 3, "stage": path.name, "fingerprint": fp, "inputs": inputs,
                                "complete": complete, "outputs": {}}))
    return fp


@pytest.mark.parametrize("port", [8001, 9001])
def test_a_version3_record_with_ports_is_reused_on_the_same_or_another_port(tmp_path, port):
    record = tmp_path / "heldout" / "base.stage.json"
    old = _version3_record(record, {"run_config": _served_run(8001), "prepare": "p"})
    stage = Stage(tmp_path / "heldout" / "base", "base", {"run_config": _served_run(port), "prepare": "p"}, record)
    assert stage.done()
    upgraded = json.loads(record.read_text())
    assert (upgraded["version"], upgraded["fingerprint"], upgraded["fingerprint_before"]) == (
        RECORD_VERSION, stage.fingerprint, old)
    assert "base_url" not in json.dumps(upgraded["inputs"])
    # Another input still refuses it.
    record.write_text(json.dumps({**upgraded, "version": 3, "fingerprint": old,
                                  "inputs": {"run_config": _served_run(8001), "prepare": "p"}}))
    with pytest.raises(InputError, match="changed: prepare"):
        Stage(tmp_path / "heldout" / "base", "base", {"run_config": _served_run(port), "prepare": "q"}, record).done()


def test_a_version3_stage_server_url_and_its_downstream_stage_are_reused_on_another_port(tmp_path):
    """grpo2's record named the stage-1 server's URL as ``memory_server.url``; the matrix after it
    names grpo2 by its version-3 fingerprint. Continued with stage 1 on another port, both count."""
    out = tmp_path / "exp"
    grpo2_old = {"grpo": {"steps": 1, "episode": {"backends": {"memory": {"kind": "openai", "model": "$OUT/m",
                                                                          "base_url": "http://127.0.0.1:8002/v1"}}}},
                 "memory_server": {"serving": "stage1_serving", "url": "http://127.0.0.1:8002/v1", "model": "$OUT/m"}}
    old_fp = _version3_record(out / "seed-1" / "grpo2.stage.json", grpo2_old)
    matrix_old = {"run_config": _served_run(8001), "stage2": old_fp}
    _version3_record(out / "seed-1" / "matrix.stage.json", matrix_old)
    with run_folder(out):
        grpo2 = Stage(out / "seed-1" / "grpo2", "grpo2", {
            "grpo": {"steps": 1, "episode": {"backends": {"memory": {
                "kind": "openai", "model": str(out / "m"), "base_url": "http://127.0.0.1:7002/v1"}}}},
            "memory_server": {"serving": "stage1_serving", "base_url": "http://127.0.0.1:7002/v1",
                              "model": str(out / "m")}}, out / "seed-1" / "grpo2.stage.json")
        assert grpo2.done() and grpo2.fingerprint != old_fp
        matrix = Stage(out / "seed-1" / "matrix", "matrix", {"run_config": _served_run(7001),
                                                             "stage2": grpo2.fingerprint},
                       out / "seed-1" / "matrix.stage.json")
        assert matrix.done()
    assert json.loads((out / "seed-1" / "matrix.stage.json").read_text())["inputs"]["stage2"] == grpo2.fingerprint


def test_trainer_and_eval_resume_checks_ignore_addresses():
    from memsearch.train.config import without_placement

    dump = {"devices": {"train": [0]}, "episode": {"backends": {"reader": {"kind": "openai", "base_url": "x"}}}}
    assert without_placement(dump) == {"episode": {"backends": {"reader": {"kind": "openai"}}}}
    assert without_addresses([{"base_url": 1, "model": 2}]) == [{"model": 2}]


@pytest.mark.parametrize("content", ['{"version": 4, "fingerprint": "ab', "", "[1, 2]", '{"complete": true}'])
def test_a_damaged_stage_record_is_named_before_anything_is_written(tmp_path, content):
    (tmp_path / "seed-1").mkdir()
    record = tmp_path / "seed-1" / "grpo1.stage.json"
    record.write_text(content)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(InputError) as info:
        check_stage_records(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{record}: damaged stage record") and "nothing was changed" in message
    assert "delete it" in message and "the same command then makes it again" in message
    with pytest.raises(InputError, match=f"{record}: damaged stage record.*{tmp_path / 'seed-1' / 'grpo1'}"):
        Stage(tmp_path / "seed-1" / "grpo1", "grpo1", {"a": 1}, record).done()
    assert sorted(p.name for p in tmp_path.rglob("*")) == before and record.read_text() == content


@pytest.fixture(scope="module")
def sample_data(tmp_path_factory):
    """Three real HotpotQA dev questions, converted."""
    from memsearch.data.dataset import save_dataset
    from memsearch.data.hotpot import convert_hotpot

    out = tmp_path_factory.mktemp("data") / "dev"
    save_dataset(convert_hotpot(ROOT / "data" / "samples" / "hotpotqa" / "dev_distractor_sample.json", split="dev",
                                limit=3), out)
    return out


def _reader_at(url: str) -> RunConfig:
    """Rules memory and controller, the reader served at ``url`` (one attempt, short timeout)."""
    return RunConfig.model_validate({
        "backends": {"memory": {"kind": "rules"}, "controller": {"kind": "rules"},
                     "reader": {"kind": "openai", "model": "smollm2", "base_url": url, "max_retries": 0,
                                "timeout_s": 5}}})


@contextmanager
def _agent_server(*args: str):
    """Our scripted OpenAI-compatible server on a free port (``memsearch.testing.agent_server``),
    yielding its API root once it answers; stopped at exit."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "memsearch.testing.agent_server", "--port", str(port),
                               "--delay-ms", "5", "--served-name", "smollm2", *args],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_an_eval_with_failed_tasks_stays_open_and_its_rerun_retries_them(tmp_path, sample_data):
    """First the reader's server answers every completion with HTTP 500 (one attempt each: every
    task fails); the stage is left open and the command ends incomplete. Then a server on another
    port answers: the same stage resumes, retries exactly the failed tasks and finishes."""
    out = tmp_path / "exp"
    folder, record = out / "heldout" / "base", out / "heldout" / "base.stage.json"
    lines: list[str] = []
    with _agent_server("--fault", "500=1", "--max-faults-per-request", "100") as url, run_folder(out):
        summary = eval_run(folder, record, _reader_at(url), sample_data, {"p": 1}, lines.append)
    assert summary.complete is False and summary.tasks.failed == 3
    assert lines[-1] == "base: INCOMPLETE, 3 of 3 tasks failed, 0 missing; the same command retries them"
    assert json.loads(record.read_text())["complete"] is False and unfinished_stages(out) == ["heldout/base"]
    with pytest.raises(IncompleteResult, match=r"1 stage\(s\) have failed or missing tasks.*heldout/base"):
        raise_if_unfinished(out)

    with _agent_server() as url, run_folder(out):
        again = eval_run(folder, record, _reader_at(url), sample_data, {"p": 1}, lines.append)
    assert again.complete is True and (again.tasks.failed, again.tasks.scored, again.tasks.retried) == (0, 3, 3)
    assert json.loads(record.read_text())["complete"] is True and unfinished_stages(out) == []
    raise_if_unfinished(out)  # nothing left: no error


def test_a_stage_an_earlier_invocation_left_open_is_no_failed_task_of_this_one(tmp_path):
    """Only what this process left open with failed tasks ends a command incomplete: a stage
    another invocation started and never finished (interrupted, or a seed no longer run) does not."""
    out = tmp_path / "exp"
    with run_folder(out):
        Stage(out / "seed-2" / "sft", "sft", {"a": 1}, out / "seed-2" / "sft.stage.json").start()
    assert json.loads((out / "seed-2" / "sft.stage.json").read_text())["complete"] is False
    assert unfinished_stages(out) == []
    raise_if_unfinished(out)

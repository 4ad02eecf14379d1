"""``memsearch experiment run`` end to end on this CPU, as a user runs it: the shipped example's CPU
profile (tiny model, 2 questions, one training step per stage), the data "downloaded" from a local
HTTP server serving the shipped samples, the reader and each seed's stage 1 served by real
`transformers serve`. One experiment folder, three invocations of the command:

1. SIGTERM while stage 1 trains: exit 143, every server it started gone, ports free;
2. the same folder with a stage-1 server that cannot start (a failure in a middle stage): exit 2
   with the server's log, the reader stopped, ports free;
3. the same command again: it continues and ends with the records of an uninterrupted run.

Then, on the finished folder (``continued``, issue 62's cases):

4. the command on other ports, ``kill -9``ed once its reader is ready: the reader stops with it;
5. the same command on those ports: every finished stage is reused (a port is no input), exit 0;
6. the baseline matrix deleted (the documented way to redo a stage) and the reader a server that
   refuses every completion (our scripted server, HTTP 400): the run goes on, ends INCOMPLETE
   (exit 3), and the report marks the rows;
7. the same command with a reader that answers: only those tasks run again; exit 0, finished.

The records are what is checked (run.json, the data manifest, stage records, trajectories,
summaries, the report), not that code ran."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tests.support.processes import alive

from memsearch.serving.process import port_in_use

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "experiment.example.toml"
SAMPLES = ROOT / "data" / "samples" / "hotpotqa"
FILES = {"train": "train_sample.json", "dev": "dev_distractor_sample.json"}
RUN_TIMEOUT_S = 420
# The stages of an uninterrupted run of the CPU profile (one seed, stage 2 on), by record name.
STAGES = ["baseline/matrix", "download", "heldout/base", "heldout/rules", "models", "prepare", "seed-1/grpo1",
          "seed-1/grpo2", "seed-1/heldout/grpo", "seed-1/heldout/sft", "seed-1/matrix", "seed-1/merged1",
          "seed-1/merged2", "seed-1/sft", "teacher/export", "teacher/run", "teacher/select"]

pytestmark = pytest.mark.slow
# The reliability table (tests/reliability/report.py, loaded by tests/conftest.py) gets a row per
# fault case of issue 62 run here.
LEDGER = sys.modules["memsearch_reliability_report"].LEDGER


class _Quiet(http.server.SimpleHTTPRequestHandler):
    requests: list[str] = []

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        _Quiet.requests.append(self.path)


@pytest.fixture(scope="module")
def data_url():
    """The shipped samples over HTTP on 127.0.0.1 (what the official URLs are on a node)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(SAMPLES)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _processes_naming(text: str) -> list[int]:
    """Processes whose command line names ``text`` (a server launched on a folder of the run)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _service_pids(run: dict) -> list[int]:
    pids = []
    for entry in run["services"].values():
        pids += [entry["pid"]] if "pid" in entry else [e["pid"] for e in entry.values()]
    return pids


def _left_behind(out: Path, ports: list[int]) -> dict:
    """What a finished invocation left: live service processes, bound ports, servers on its folders."""
    run = json.loads((out / "run.json").read_text())
    pids = _service_pids(run)
    return {"alive": [p for p in pids if alive(p)], "bound": [p for p in ports if port_in_use("127.0.0.1", p)],
            "naming_out": _processes_naming(str(out)), "pids": pids, "run": run}


@pytest.fixture(scope="module")
def experiment(tmp_path_factory, tiny_model_dir, data_url):
    """The three invocations on one folder (module docstring); what each left is read right after it."""
    out = tmp_path_factory.mktemp("experiment") / "exp"
    ports = _free_ports(2)
    command = [sys.executable, "-m", "memsearch.cli.app", "experiment", "run", "--config", str(EXAMPLE),
               "--profile", "cpu", "--out", str(out)]
    tiny = json.dumps(str(tiny_model_dir))
    for setting in (f"models.policy={tiny}", f"models.reader={tiny}", f'data.train="{data_url}/{FILES["train"]}"',
                    f'data.dev="{data_url}/{FILES["dev"]}"', "data.train_questions=2", "data.dev_questions=2",
                    f"services.reader.port={ports[0]}", f"services.stage1.port={ports[1]}"):
        command += ["--set", setting]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    state = {"out": out, "ports": ports, "tiny": tiny_model_dir, "data_url": data_url, "command": command}
    start = time.monotonic()

    # 1. SIGTERM as soon as GRPO stage 1 starts training.
    proc, output = _run_until(command, env, "grpo1: GRPO")
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    state["sigterm"] = {"status": proc.returncode, "output": output + rest, **_left_behind(out, ports)}

    # 2. A stage-1 server that exits at once: the experiment cannot deploy stage 1 for stage 2.
    broken = subprocess.run([*command, "--set", 'services.stage1.command=["{python}", "-c", "raise SystemExit(3)"]'],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    state["failed"] = {"status": broken.returncode, "output": broken.stdout + broken.stderr, **_left_behind(out, ports)}

    # 3. The same command as at first: it continues to the end.
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    state["done"] = {"status": done.returncode, "output": done.stdout + done.stderr, **_left_behind(out, ports)}
    state["wall_s"] = time.monotonic() - start
    print(f"experiment e2e: three invocations in {state['wall_s']:.0f} s")
    return state


def test_sigterm_while_stage_1_trains_stops_every_server(experiment):
    got = experiment["sigterm"]
    assert got["status"] == 128 + signal.SIGTERM, got["output"][-3000:]
    run = got["run"]
    assert run["status"] == "interrupted" and run["attempts"][-1]["status"] == "interrupted"
    assert run["stages"]["seed-1/sft"] is True and run["stages"]["seed-1/grpo1"] is False  # cut in stage 1
    assert list(run["services"]) == ["reader"] and len(got["pids"]) == 1
    assert got["alive"] == [] and got["bound"] == [] and got["naming_out"] == []
    assert "stopped (exit status" in (experiment["out"] / "services" / "reader.log").read_text()


def test_a_stage_1_server_that_cannot_start_fails_with_every_server_stopped(experiment):
    got = experiment["failed"]
    assert got["status"] == 2, got["output"][-3000:]
    # A custom command: the message names what was started, not the engine it stands for.
    started = f"{Path(sys.executable).name} of services.stage1.command exited with status 3"
    assert f"error: {started} before answering /health" in got["output"]
    run = got["run"]
    assert run["status"] == "failed" and started in run["error"]
    # It continued stage 1 (trained and merged), then failed to deploy it: stage 2 never started.
    assert run["stages"]["seed-1/grpo1"] is True and run["stages"]["seed-1/merged1"] is True
    assert "seed-1/grpo2" not in run["stages"] and "seed-1/heldout/grpo" not in run["stages"]
    assert got["alive"] == [] and got["bound"] == [] and got["naming_out"] == []


def test_the_rerun_continues_and_ends_with_the_records_of_an_uninterrupted_run(experiment):
    got, out = experiment["done"], experiment["out"]
    assert got["status"] == 0, got["output"][-3000:]
    run = got["run"]
    assert run["status"] == "finished" and run["error"] is None
    assert [a["status"] for a in run["attempts"]] == ["interrupted", "failed", "finished"]
    assert run["stages"] == {name: True for name in STAGES}
    # GRPO stage 1, cut by the SIGTERM, trained its one step exactly once.
    log = [json.loads(line) for line in (out / "seed-1" / "grpo1" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1]
    # The data: the manifest's SHA-256s are the served files'; fetched once over the three invocations.
    manifest = json.loads((out / "data" / "manifest.json").read_text())["files"]
    for split, name in FILES.items():
        assert manifest[split]["sha256"] == hashlib.sha256((SAMPLES / name).read_bytes()).hexdigest()
        assert manifest[split]["source"] == f"{experiment['data_url']}/{name}" and run["data"][split] == manifest[split]
    assert sorted(_Quiet.requests) == sorted(f"/{name}" for name in FILES.values())
    assert run["models"]["policy"]["path"] == str(experiment["tiny"]) and len(run["models"]["policy"]["sha256"]) == 64
    assert run["devices"] == {"cuda": False, "gpus": [], "note": "no GPU in the layout: CPU run"}
    assert run["memsearch"]["commit"] is None or len(run["memsearch"]["commit"]) == 40
    # The services' identities: what /v1/models listed, under the names requests used.
    merged1 = str(out / "seed-1" / "merged1")
    reader, stage1 = run["services"]["reader"], run["services"]["stage1"]["seed-1"]
    assert (reader["identity"]["id"], reader["served_name"]) == (str(experiment["tiny"]),) * 2
    assert (stage1["identity"]["id"], stage1["served_name"], stage1["engine"]) == (merged1, merged1, "transformers")
    assert reader["url"] == f"http://127.0.0.1:{experiment['ports'][0]}/v1"
    assert stage1["url"] == f"http://127.0.0.1:{experiment['ports'][1]}/v1"
    # A/C summarised by the original model in process, B/D by the deployed stage 1 over HTTP.
    matrix = out / "seed-1" / "matrix"
    backends = {g: json.loads((matrix / g / "summary.json").read_text())["memory_backend"] for g in "ABCD"}
    for group in "AC":
        assert (backends[group]["kind"], backends[group]["model"]) == ("hf", str(experiment["tiny"]))
    for group in "BD":
        assert (backends[group]["kind"], backends[group]["model"], backends[group]["base_url"]) == (
            "openai", merged1, stage1["url"])
    calls = {g: [e for line in (matrix / g / "trajectories.jsonl").read_text().splitlines()
                 for e in json.loads(line)["events"] if e.get("type") == "policy_call" and e["role"] == "memory"]
             for g in "AB"}
    assert calls["A"] and all(c["completion_ids"] for c in calls["A"])  # in process: token ids
    assert calls["B"] and all(c["completion_ids"] is None and c["usage"]["source"] == "reported" and c["error"] is None
                              for c in calls["B"])  # served: text and the server's usage
    # Stage 2 trained against the deployed stage 1, the held-out grpo row ran on it.
    grpo2 = json.loads((out / "seed-1" / "grpo2.stage.json").read_text())["inputs"]["memory_server"]
    assert grpo2 == {"serving": "stage1_serving", "model": "$OUT/seed-1/merged1"}  # its URL is no input
    heldout = json.loads((out / "seed-1" / "heldout" / "grpo" / "summary.json").read_text())["memory_backend"]
    assert (heldout["kind"], heldout["model"]) == ("openai", merged1)
    # The report: the pipeline's, then the experiment's section with the untrained baseline.
    report = (out / "report.md").read_text()
    assert report.startswith("# Memory-policy pipeline") and "## Experiment (`memsearch experiment run`)" in report
    assert manifest["dev"]["sha256"] in report and "### Baseline: the A-D matrix before training" in report
    served = f"the held-out grpo row and B/D: the stage-1 folder served over HTTP on port {experiment['ports'][1]}"
    assert served in report
    baseline = json.loads((out / "baseline" / "matrix" / "matrix.json").read_text())["groups"]
    assert {g["memory_backend"]["model"] for g in baseline.values()} == {str(experiment["tiny"])}
    assert got["alive"] == [] and got["bound"] == [] and got["naming_out"] == []


def _run_until(command: list[str], env: dict, marker: str) -> tuple[subprocess.Popen, str]:
    """Start ``command`` and read its output until a line starts with ``marker``."""
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(RUN_TIMEOUT_S, proc.kill)
    watchdog.start()
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(marker):
            break
    watchdog.cancel()
    return proc, "".join(lines)


def _scripted_reader(*faults: str) -> str:
    """``services.reader.command``: our scripted server listing the reader's name, with ``faults``."""
    return "services.reader.command=" + json.dumps(
        ["{python}", "-m", "memsearch.testing.agent_server", "--port", "{port}", "--delay-ms", "5",
         "--served-name", "{served_name}", *faults])


@pytest.fixture(scope="module")
def continued(experiment):
    """Invocations 4-7 (module docstring) on the finished folder, on two other ports."""
    out = experiment["out"]
    state = {"out": out}
    ports = _free_ports(2)
    command = [*experiment["command"], "--set", f"services.reader.port={ports[0]}",
               "--set", f"services.stage1.port={ports[1]}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    # 4. kill -9 once the reader is ready and recorded (the baseline comes next): its reaper stops it.
    proc, output = _run_until(command, env, "baseline matrix (untrained)")
    proc.kill()
    proc.wait()
    reader = json.loads((out / "run.json").read_text())["services"]["reader"]
    deadline = time.monotonic() + 60
    while (alive(reader["pid"]) or port_in_use("127.0.0.1", ports[0])) and time.monotonic() < deadline:
        time.sleep(0.2)
    state["killed"] = {"output": output, "reader": reader, "alive": alive(reader["pid"]),
                       "bound": port_in_use("127.0.0.1", ports[0]), "run": json.loads((out / "run.json").read_text())}
    LEDGER.record("experiment run: kill -9, a server left serving a minute later", runs=1,
                  failed_tests=int(state["killed"]["alive"] or state["killed"]["bound"]))

    # 5. The same command: every stage reused, though both ports changed since they finished.
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    state["other_ports"] = {"status": done.returncode, "output": done.stdout + done.stderr,
                            **_left_behind(out, ports)}
    LEDGER.record("experiment run: continued on other ports, finished stages redone", runs=1,
                  wrong_exit=int(done.returncode != 0), duplicated=int("GRPO role" in state["other_ports"]["output"]))

    # 6. Redo the baseline with a reader that refuses every completion: failed tasks, exit 3.
    shutil.rmtree(out / "baseline" / "matrix")
    (out / "baseline" / "matrix.stage.json").unlink()
    refused = subprocess.run([*command, "--set", _scripted_reader("--fault", "400=1")], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    state["refused"] = {"status": refused.returncode, "output": refused.stdout + refused.stderr,
                        "report": (out / "report.md").read_text(), **_left_behind(out, ports)}
    LEDGER.record("experiment run: failed tasks, called finished", runs=1, wrong_exit=int(refused.returncode != 3))

    # 7. The same command with a reader that answers: the failed tasks run again.
    answered = subprocess.run([*command, "--set", _scripted_reader()], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=RUN_TIMEOUT_S)
    state["answered"] = {"status": answered.returncode, "output": answered.stdout + answered.stderr,
                         "report": (out / "report.md").read_text(), **_left_behind(out, ports)}
    LEDGER.record("experiment run: failed tasks, called finished", runs=1, wrong_exit=int(answered.returncode != 0))
    return state


def test_kill_9_of_the_command_leaves_no_server_serving(continued):
    got = continued["killed"]
    assert "service reader:" in got["output"] and got["run"]["status"] == "running"
    assert got["alive"] is False and got["bound"] is False


def test_a_run_continued_on_other_ports_reuses_every_finished_stage(continued):
    got = continued["other_ports"]
    assert got["status"] == 0, got["output"][-3000:]
    assert "finished: every stage complete" in got["output"]
    for stage in ("baseline matrix (untrained)", "grpo1", "grpo2", "merge", "sft"):
        assert f"{stage}: done" in got["output"], stage
    assert "GRPO role" not in got["output"] and "resuming" not in got["output"] and "running A-D" not in got["output"]
    run = got["run"]
    assert run["status"] == "finished" and run["stages"] == {name: True for name in STAGES}
    assert got["alive"] == [] and got["bound"] == [] and got["naming_out"] == []


def test_failed_tasks_end_the_run_incomplete_and_the_rerun_retries_only_them(continued):
    got = continued["refused"]
    assert got["status"] == 3, got["output"][-3000:]
    # Every group whose episodes reach the reader fails (the tiny model's D may end before it).
    found = re.search(r"baseline matrix \(untrained\): INCOMPLETE, group\(s\) ([A-D](?:, [A-D])*) have failed or "
                      r"missing tasks; the same command retries them", got["output"])
    assert found, got["output"][:8000]
    failed = found.group(1).split(", ")
    assert {"A", "B"} <= set(failed)
    lines = got["output"].strip().splitlines()
    assert lines[-2:] == ["INCOMPLETE: 1 stage(s) have failed or missing tasks, so the report is not a result: "
                          "baseline/matrix", "INCOMPLETE: run the same command again: it keeps every finished stage "
                          "and task and retries only those tasks"]
    assert not any(line.startswith("finished") for line in lines)
    run = got["run"]
    assert run["status"] == "incomplete" and run["attempts"][-1]["status"] == "incomplete"
    assert run["stages"]["baseline/matrix"] is False and sum(run["stages"].values()) == len(STAGES) - 1
    # The report says so first, and marks each incomplete row of the baseline.
    assert "**INCOMPLETE**: stage(s) baseline/matrix" in got["report"]
    baseline = got["report"][got["report"].index("### Baseline"):]
    assert baseline.count("| INCOMPLETE |") == len(failed)
    assert got["alive"] == [] and got["bound"] == [] and got["naming_out"] == []

    again = continued["answered"]
    assert again["status"] == 0, again["output"][-3000:]
    assert "baseline matrix (untrained): resuming A-D" in again["output"]
    assert again["run"]["status"] == "finished" and again["run"]["stages"] == {name: True for name in STAGES}
    for group in "ABCD":
        summary = json.loads((continued["out"] / "baseline" / "matrix" / group / "summary.json").read_text())
        assert summary["complete"] and summary["tasks"]["failed"] == 0
        # Only the failed tasks ran again: each once more.
        assert summary["tasks"]["retried"] == (summary["tasks"]["expected"] if group in failed else 0), group
    assert "INCOMPLETE" not in again["report"]

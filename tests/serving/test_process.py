"""Model servers as child processes, for real: `transformers serve` on the embedded model folder
is started, checked, and stopped however the work inside ends (an error, SIGTERM); a port in use
is refused before anything starts; a server that cannot start is an error quoting its log."""

from __future__ import annotations

import json
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.processes import alive

from memsearch.errors import InputError
from memsearch.serving import ServiceSpec, process_start_time, running_services, served_identity
from memsearch.serving.process import port_in_use


def _free_port() -> int:
    from memsearch.pipelines.memory_policy.serving import free_port

    return free_port()


def _pids(log: Path) -> list[int]:
    return [int(m) for m in re.findall(r"^=== pid (\d+)$", log.read_text(), flags=re.M)]


@pytest.fixture(scope="module")
def model() -> str:
    from memsearch.assets.embedded import model_dir

    return str(model_dir())


@pytest.mark.slow
def test_a_service_is_ready_with_its_identity_and_stopped_when_the_work_fails(model, tmp_path):
    spec = ServiceSpec(engine="transformers", model=model, port=_free_port(), start_timeout_s=180)
    lines: list[str] = []
    with pytest.raises(RuntimeError, match="stage crashed"):
        with running_services({"reader": spec}, tmp_path / "logs", echo=lines.append) as services:
            reader = services["reader"]
            assert (reader.name, reader.engine, reader.served_name) == ("reader", "transformers", model)
            assert reader.url == f"http://127.0.0.1:{spec.port}/v1"
            # The identity is the server's own /v1/models entry for the name, recorded as written.
            assert reader.identity["id"] == model and reader.identity["object"] == "model"
            assert served_identity(reader.url, model) == reader.identity
            with pytest.raises(InputError, match=r"model 'no-such-model' is not served at .*: its /models lists '"):
                served_identity(reader.url, "no-such-model")
            assert reader.log == tmp_path / "logs" / "reader.log" and _pids(reader.log) == [reader.pid]
            assert alive(reader.pid) and port_in_use("127.0.0.1", spec.port)
            assert reader.started == process_start_time(reader.pid)  # tells it from a later process given its pid
            # A second run asking for the same port is refused, naming it, before it starts anything.
            with pytest.raises(InputError, match=f"port {spec.port} \\(service again\\) is already in use"):
                with running_services({"again": spec}, tmp_path / "logs"):
                    pytest.fail("must not start")
            assert not (tmp_path / "logs" / "again.log").exists()
            raise RuntimeError("stage crashed")
    assert not alive(reader.pid) and not port_in_use("127.0.0.1", spec.port)
    assert lines[0].startswith(f"service reader: transformers serve {model} at {reader.url} (pid {reader.pid}")
    assert reader.log.read_text().splitlines()[-1].endswith(f"stopped (exit status {-signal.SIGTERM})")


# Run as a process of its own: it starts a server, says so, and waits to be signalled.
CHILD = """
import json, sys, time
from pathlib import Path
from memsearch.serving import ServiceSpec, running_services, stop_on_signals
spec = ServiceSpec(engine="transformers", model=sys.argv[1], port=int(sys.argv[2]), start_timeout_s=180)
with stop_on_signals(), running_services({"reader": spec}, Path(sys.argv[3]), echo=lambda _: None) as services:
    print(json.dumps({"pid": services["reader"].pid}), flush=True)
    time.sleep(300)
"""


@pytest.mark.slow
def test_sigterm_to_the_run_stops_its_services_and_frees_their_ports(model, tmp_path):
    port = _free_port()
    child = subprocess.Popen([sys.executable, "-c", CHILD, model, str(port), str(tmp_path)], stdout=subprocess.PIPE,
                             text=True)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 240)
        assert ready, "the child did not report a ready server within 240 s"
        server = json.loads(child.stdout.readline())["pid"]
        assert alive(server)
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    assert not alive(server) and not port_in_use("127.0.0.1", port)
    assert "stopped (exit status" in (tmp_path / "reader.log").read_text().splitlines()[-1]


def test_a_server_that_exits_at_once_is_an_error_with_its_log(tmp_path):
    """A server process that exits before it is ready (here a `command` override, a real process
    that fails at once; `transformers serve` on a folder it cannot load, the same path, is in
    tests/pipelines/test_memory_policy_http.py)."""
    fails = ["{python}", "-c", "import sys; print('loading {model} on port {port}'); print('no weights here'); "
             "sys.exit(3)"]
    spec = ServiceSpec(engine="vllm", model="/m/absent", port=_free_port(), command=fails, start_timeout_s=60)
    with pytest.raises(InputError) as info:
        with running_services({"stage1": spec}, tmp_path, echo=lambda _: None):
            pytest.fail("the server must not be ready")
    log = (tmp_path / "stage1.log").read_text().splitlines()
    assert str(info.value) == (
        f"{Path(sys.executable).name} of services.stage1.command exited with status 3 before answering /health at "
        f"http://127.0.0.1:{spec.port}; the end of its log ({tmp_path / 'stage1.log'}):\n" + "\n".join(log[:-1]))
    assert log[2:] == [f"loading /m/absent on port {spec.port}", "no weights here", log[-1]]
    assert log[-1].endswith("stopped (exit status 3)") and not alive(_pids(tmp_path / "stage1.log")[0])
    # An engine that is not installed: a clear refusal naming the setting to give instead.
    with pytest.raises(InputError, match=r"service reader: \S+ cannot import vllm; set services\.reader\.python .*"
                       r"scripts/vllm/install\.sh .* services\.reader\.command"):
        with running_services({"reader": ServiceSpec(engine="vllm", model="m", port=_free_port())}, tmp_path):
            pytest.fail("vllm is not installed here")

"""Loading an adapter on a running server, against a scripted loopback server answering as vLLM
does (the same against a real vLLM, rank refusal included: tests/serving/test_vllm_lane.py):
the route missing (a vLLM started without runtime adapter loading), a refusal quoted with what
to change, a success, and an unload that never raises while a run unwinds."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from memsearch.errors import InputError
from memsearch.serving.adapters import load_adapter, unload_adapter


@pytest.fixture
def server():
    answers: list[tuple[int, dict | str]] = []
    seen: list[tuple[str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body))
            status, payload = answers.pop(0)
            data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", answers, seen
    httpd.shutdown()
    httpd.server_close()


def test_loading_is_refused_clearly_and_succeeds_when_the_server_takes_it(server, tmp_path):
    url, answers, seen = server
    answers += [(404, {"detail": "Not Found"}),
                # vLLM 0.32's answer, as the lane saw it
                (500, {"error": {"message": "Call to add_lora method failed: Worker failed with error 'LoRA rank "
                                            "128 is greater than max_lora_rank 16.', please check the stack trace "
                                            "above for the root cause", "code": 500}}),
                (200, "Success: LoRA adapter 'stage1-seed1' added successfully.")]
    with pytest.raises(InputError, match=r"does not load adapters at run time .* --enable-lora and the environment "
                       r"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
        load_adapter(url, "stage1-seed1", tmp_path)
    with pytest.raises(InputError, match=r"refused adapter 'stage1-seed1' .*HTTP 500: .*LoRA rank 128 is greater "
                       r"than max_lora_rank 16\..*\); an adapter above the server's --max-lora-rank"):
        load_adapter(url, "stage1-seed1", tmp_path)
    load_adapter(url, "stage1-seed1", tmp_path)
    assert seen[-1] == ("/v1/load_lora_adapter", {"lora_name": "stage1-seed1", "lora_path": str(tmp_path)})


def test_unloading_never_raises(server):
    url, answers, seen = server
    answers.append((404, {"detail": "gone"}))
    unload_adapter(url, "stage1-seed1")
    unload_adapter("http://127.0.0.1:9/v1", "stage1-seed1", timeout_s=2)  # nothing listens there
    assert seen == [("/v1/unload_lora_adapter", {"lora_name": "stage1-seed1"})]

"""OpenAIBackend against a real scripted HTTP server on 127.0.0.1 (real sockets, real HTTP).

The server answers each request with the next scripted ``Action`` (status, body, headers,
delay, or dropping the connection), then with an echo of the last message once the script is
used up. It records every request and the most requests it ever had in flight; GET /models
lists ``models`` (404 while that is None).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from tests.support.processes import generate_and_close

from memsearch.backends.base import (
    Constraint,
    GenerationRequest,
    PolicyBackend,
    SamplingParams,
)
from memsearch.backends.engine_forms import constraint_body
from memsearch.backends.openai import API_KEY_ENV, OpenAIBackend, _env_proxy
from memsearch.tokenizer import LexicalTokenizer

SECRET = "sk-test-SECRET-0123456789abcdef"


# --------------------------------------------------------------------------------- the server


@dataclass
class Action:
    """What the server does with one request."""

    status: int = 200
    body: Any = None  # dict/list -> JSON; bytes -> sent as is; None -> the default echo answer
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    drop: bool = False  # close the connection without answering


def chat_body(text: str, *, usage: bool = True, finish_reason: str = "stop", logprobs: Any = None) -> dict:
    body: dict[str, Any] = {
        "id": "cmpl-1",
        "object": "chat.completion",
        "model": "test-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
                "logprobs": logprobs,
            }
        ],
    }
    if usage:
        body["usage"] = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    return body


class FaultServer:
    """A scripted OpenAI-compatible server on an ephemeral loopback port."""

    def __init__(self, port: int = 0) -> None:
        self.actions: deque[Action] = deque()
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        # GET /models lists these ids (None: answered 404, a server without a model list).
        self.models: list[str] | None = None
        self.owned_by = "test"  # what /models says wrote it: "vllm" makes it read as vLLM
        self.model_gets = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:
                server.model_gets += 1
                found = self.path.endswith("/models") and server.models is not None
                entries = [{"id": m, "object": "model", "owned_by": server.owned_by, "created": 7,
                            "max_model_len": 4096} for m in server.models or []]
                data = json.dumps({"object": "list", "data": entries} if found else {"error": "not found"}).encode()
                self.send_response(200 if found else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                with server.lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    server._handle(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout); nothing to answer
                finally:
                    with server.lock:
                        server.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def script(self, *actions: Action) -> None:
        self.actions.extend(actions)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length", "0"))
        raw = h.rfile.read(length)
        body = json.loads(raw) if raw else None
        with self.lock:
            self.requests.append({"path": h.path, "headers": dict(h.headers), "body": body})
            action = self.actions.popleft() if self.actions else Action()
        if action.delay_s:
            time.sleep(action.delay_s)
        if action.drop:
            h.close_connection = True
            return
        payload = action.body
        if payload is None:
            payload = self._echo(h.path, body)
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        h.send_response(action.status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in action.headers.items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)

    @staticmethod
    def _echo(path: str, body: dict) -> dict:
        if path.endswith("/chat/completions"):
            return chat_body("echo: " + body["messages"][-1]["content"])
        return {
            "object": "text_completion",
            "choices": [{"index": 0, "text": f"echo {len(body['prompt'])} ids", "finish_reason": "length"}],
            "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 3},
        }


@pytest.fixture
def server():
    s = FaultServer()
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                "no_proxy"):
        monkeypatch.delenv(var, raising=False)


def make_backend(server: FaultServer, **kw: Any) -> OpenAIBackend:
    # Tiny backoff so retry tests stay fast.
    options: dict[str, Any] = {"model": "test-model", "max_concurrency": 4, "timeout_s": 2.0, "max_retries": 2}
    options.update(backoff_base_s=0.001, backoff_max_s=0.01)
    options.update(kw)
    return OpenAIBackend(server.base_url, **options)


def chat(text: str = "hello", **kw: Any) -> GenerationRequest:
    return GenerationRequest(role="memory", messages=({"role": "user", "content": text},), **kw)


run = generate_and_close


# ------------------------------------------------------------------------------------- tests


def test_is_a_policy_backend(server):
    assert isinstance(make_backend(server), PolicyBackend)


def test_normal_answer_with_reported_usage(server):
    sampling = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=32, seed=5, stop=("\n\n",))
    [r] = run(make_backend(server), [chat("hi there", sampling=sampling)])
    assert r.ok and r.text == "echo: hi there" and r.finish_reason == "stop"
    assert r.attempts == 1 and r.latency_s > 0
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.source) == (11, 3, "reported")
    assert r.completion_ids is None and r.logprobs is None
    [req] = server.requests
    assert req["path"] == "/v1/chat/completions"
    assert "Authorization" not in req["headers"]
    body = req["body"]
    assert body["model"] == "test-model"
    assert body["messages"] == [{"role": "user", "content": "hi there"}]
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"], body["stop"]) == (
        0.7, 0.9, 32, 5, ["\n\n"],
    )
    assert "logprobs" not in body and "response_format" not in body


def test_results_keep_request_order(server):
    server.script(*[Action(delay_s=d) for d in (0.15, 0.0, 0.1, 0.0, 0.05, 0.0)])
    results = run(make_backend(server, max_concurrency=3), [chat(f"q{i}") for i in range(6)])
    assert [r.text for r in results] == [f"echo: q{i}" for i in range(6)]


def test_500_then_success_is_retried(server):
    server.script(Action(status=500, body={"error": "boom"}))
    backend = make_backend(server)
    [r] = run(backend, [chat()])
    assert r.ok and r.text == "echo: hello" and r.attempts == 2
    assert len(server.requests) == 2
    stats = backend.stats()
    assert stats["retries"] == 1 and stats["failed"] == 0 and stats["succeeded"] == 1
    assert stats["errors"] == {"http_5xx": 1}


def test_429_honours_retry_after(server):
    server.script(Action(status=429, body={"error": "slow down"}, headers={"Retry-After": "0.3"}))
    [r] = run(make_backend(server, backoff_max_s=5.0), [chat()])
    assert r.ok and r.attempts == 2
    assert r.latency_s >= 0.3


def test_retry_after_is_capped_by_backoff_max(server):
    server.script(Action(status=429, body={}, headers={"Retry-After": "100"}))
    [r] = run(make_backend(server, backoff_max_s=0.05), [chat()])
    assert r.ok and r.attempts == 2 and r.latency_s < 2.0


def test_always_500_gives_error_result_without_raising(server):
    server.script(*[Action(status=503, body={"error": "down"})] * 10)
    backend = make_backend(server, max_retries=2)
    [r] = run(backend, [chat()])
    assert not r.ok and r.finish_reason == "error" and r.text == ""
    assert r.attempts == 3 and len(server.requests) == 3
    assert "503" in r.error
    stats = backend.stats()
    assert stats["failed"] == 1 and stats["retries"] == 2 and stats["attempts"] == 3
    assert stats["errors"] == {"http_5xx": 3}


def test_slow_response_times_out_then_errors(server):
    server.script(Action(delay_s=1.0), Action(delay_s=1.0))
    backend = make_backend(server, timeout_s=0.2, max_retries=1)
    [r] = run(backend, [chat()])
    assert r.finish_reason == "error" and r.attempts == 2
    assert "timeout" in r.error
    assert r.latency_s < 0.9
    assert backend.stats()["errors"] == {"timeout": 2}


def test_slow_then_fast_recovers(server):
    server.script(Action(delay_s=1.0))
    [r] = run(make_backend(server, timeout_s=0.2), [chat()])
    assert r.ok and r.attempts == 2


def test_malformed_json_is_retried(server):
    server.script(Action(body=b"{not json"))
    backend = make_backend(server)
    [r] = run(backend, [chat()])
    assert r.ok and r.attempts == 2
    assert backend.stats()["errors"] == {"malformed": 1}


def test_empty_choices_is_retried_then_reported(server):
    server.script(*[Action(body={"choices": []})] * 3)
    [r] = run(make_backend(server, max_retries=2), [chat()])
    assert r.finish_reason == "error" and r.attempts == 3
    assert "choices" in r.error and "200" in r.error


def test_missing_choices_then_success(server):
    server.script(Action(body={"object": "chat.completion"}))
    [r] = run(make_backend(server), [chat()])
    assert r.ok and r.attempts == 2


def test_400_is_not_retried(server):
    server.script(Action(status=400, body={"error": {"message": "bad max_tokens"}}))
    backend = make_backend(server, max_retries=3)
    [r] = run(backend, [chat()])
    assert r.finish_reason == "error" and r.attempts == 1
    assert "400" in r.error and "bad max_tokens" in r.error
    assert len(server.requests) == 1
    assert backend.stats()["errors"] == {"http_4xx": 1}


def test_dropped_connection_is_retried(server):
    server.script(Action(drop=True))
    [r] = run(make_backend(server), [chat()])
    assert r.ok and r.attempts == 2


def test_connection_refused_gives_error_result(server):
    server.stop()
    backend = make_backend(server, max_retries=2)
    [r] = run(backend, [chat()])
    assert r.finish_reason == "error" and r.attempts == 3
    assert "connection" in r.error.lower()
    assert backend.stats()["errors"] == {"connection": 3}


def test_concurrency_is_bounded(server):
    server.script(*[Action(delay_s=0.1)] * 20)
    backend = make_backend(server, max_concurrency=4)
    results = run(backend, [chat(f"q{i}") for i in range(20)])
    assert all(r.ok for r in results)
    assert server.max_in_flight == 4


def test_redirect_is_not_followed_or_retried(server):
    server.script(Action(status=307, body={}, headers={"Location": "/v1/elsewhere"}))
    backend = make_backend(server, max_retries=3)
    [r] = run(backend, [chat()])
    assert r.finish_reason == "error" and r.attempts == 1 and "307" in r.error
    assert [req["path"] for req in server.requests] == ["/v1/chat/completions"]
    assert backend.stats()["errors"] == {"http_other": 1}


def test_netrc_is_not_a_credential_source(server, monkeypatch, tmp_path):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login user password netrc-SECRET\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".netrc").write_text(netrc.read_text())
    (tmp_path / ".netrc").chmod(0o600)
    [r] = run(make_backend(server), [chat()])
    assert r.ok and "Authorization" not in server.requests[0]["headers"]


def test_proxy_from_environment(server, monkeypatch):
    assert _env_proxy("http://10.1.2.3:8000/v1") is None
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("ALL_PROXY", "http://all.example:3128")
    monkeypatch.setenv("NO_PROXY", "skip.example,10.9.9.9")
    assert _env_proxy("http://10.1.2.3:8000/v1") == "http://proxy.example:3128"
    assert _env_proxy("https://api.example/v1") == "http://all.example:3128"
    assert _env_proxy("http://skip.example/v1") is None
    assert _env_proxy("http://10.9.9.9:8000/v1") is None
    # A real request through a proxy: the scripted server plays the proxy for a host that
    # does not exist, and sees the absolute target URL.
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.port}")
    backend = OpenAIBackend("http://model.invalid:9/v1", model="m", timeout_s=2.0, max_retries=0)
    [r] = run(backend, [chat("via proxy")])
    assert r.ok and r.text == "echo: via proxy"
    assert server.requests[0]["path"] == "http://model.invalid:9/v1/chat/completions"


def test_api_key_sent_and_never_leaked(server, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, SECRET)
    server.script(
        Action(),
        Action(status=400, body={"error": f"invalid key {SECRET}"}),
        *[Action(status=500, body={"error": f"key was Bearer {SECRET}"})] * 3,
    )
    backend = make_backend(server, max_retries=2, max_concurrency=1)
    results = run(backend, [chat("a"), chat("b"), chat("c")])
    assert all(req["headers"]["Authorization"] == f"Bearer {SECRET}" for req in server.requests)
    assert results[0].ok
    assert results[1].finish_reason == "error" and "invalid key ***" in results[1].error
    assert results[2].finish_reason == "error"
    for text in (repr(results), repr(backend), str(backend.stats()), repr(vars(backend))):
        assert SECRET not in text


def test_estimated_usage_when_server_reports_none(server):
    server.script(Action(body=chat_body("three word answer", usage=False)))
    tok = LexicalTokenizer()
    [r] = run(make_backend(server, tokenizer=tok), [chat("what is the capital of France ?")])
    assert r.usage.source == "estimated"
    assert r.usage.prompt_tokens == tok.count("what is the capital of France ?")
    assert r.usage.completion_tokens == 3


def test_no_usage_and_no_tokenizer_is_none(server):
    server.script(Action(body=chat_body("x", usage=False)))
    [r] = run(make_backend(server), [chat()])
    assert r.usage.source == "none" and r.usage.prompt_tokens is None


def test_json_schema_constraint_sets_response_format(server):
    schema = {"type": "object", "properties": {"op": {"type": "string"}}, "required": ["op"]}
    server.script(Action(body=chat_body('{"op": "NOOP"}')))
    [r] = run(make_backend(server), [chat(constraint=Constraint(id="memory-op-v1", json_schema=schema))])
    assert r.ok
    assert server.requests[0]["body"]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "memory-op-v1", "schema": schema},
    }


def test_choice_constraint_mapping(server):
    """Choices go as vLLM's structured_outputs (the removed guided_choice is free text there)."""
    c = Constraint(id="yesno", choices=("yes", "no"))
    assert constraint_body(c, "response_format") == {"structured_outputs": {"choice": ["yes", "no"]}}
    assert constraint_body(None, "response_format") == {}
    server.script(Action(body=chat_body("no")))
    [r] = run(make_backend(server, extra_body={"top_k": 20}), [chat(constraint=c)])
    body = server.requests[0]["body"]
    assert r.ok and body["structured_outputs"] == {"choice": ["yes", "no"]} and body["top_k"] == 20


def test_chat_logprobs_and_token_ids_parsed(server):
    logprobs = {
        "content": [
            {"token": "token_id:12", "logprob": -0.5, "bytes": [], "top_logprobs": []},
            {"token": "token_id:7", "logprob": -1.25, "bytes": [], "top_logprobs": []},
        ]
    }
    plain = {"content": [{"token": "Hel", "logprob": -0.1, "top_logprobs": []}]}
    server.script(
        Action(body=chat_body("ab", logprobs=logprobs, finish_reason="length")),
        Action(body=chat_body("Hel", logprobs=plain, finish_reason="tool_calls")),
    )
    reqs = [chat("a", sampling=SamplingParams(logprobs=True)), chat("b", sampling=SamplingParams(logprobs=True))]
    r1, r2 = run(make_backend(server, max_concurrency=1), reqs)
    assert r1.logprobs == (-0.5, -1.25) and r1.completion_ids == (12, 7) and r1.finish_reason == "length"
    assert r2.logprobs == (-0.1,) and r2.completion_ids is None and r2.finish_reason == "stop"
    body = server.requests[0]["body"]
    assert body["logprobs"] is True and body["top_logprobs"] == 0


def test_prompt_ids_use_completions_endpoint(server):
    server.script(
        Action(),
        Action(
            body={
                "choices": [
                    {
                        "text": " ok",
                        "finish_reason": "stop",
                        "token_ids": [5, 6],
                        "logprobs": {"tokens": [" o", "k"], "token_logprobs": [-0.2, -0.3]},
                    }
                ]
            }
        ),
    )
    reqs = [
        GenerationRequest(role="memory", prompt_ids=(1, 2, 3)),
        GenerationRequest(role="memory", prompt_ids=(4,), sampling=SamplingParams(logprobs=True)),
    ]
    r1, r2 = run(make_backend(server, max_concurrency=1, tokenizer=LexicalTokenizer()), reqs)
    assert server.requests[0]["path"] == "/v1/completions"
    assert server.requests[0]["body"]["prompt"] == [1, 2, 3] and "messages" not in server.requests[0]["body"]
    assert server.requests[1]["body"]["logprobs"] == 0
    assert r1.text == "echo 3 ids" and r1.finish_reason == "length" and r1.prompt_ids == (1, 2, 3)
    assert r1.usage.source == "reported" and r1.usage.prompt_tokens == 3
    assert r2.completion_ids == (5, 6) and r2.logprobs == (-0.2, -0.3)
    assert r2.usage == type(r2.usage)(prompt_tokens=1, completion_tokens=2, source="estimated")


def test_empty_request_is_an_error_not_an_exception(server):
    backend = make_backend(server)
    [r] = run(backend, [GenerationRequest(role="memory")])
    assert r.finish_reason == "error" and r.attempts == 0 and not server.requests
    assert backend.stats()["failed"] == 1


def test_backend_survives_a_new_event_loop(server, caplog, recwarn):
    backend = make_backend(server)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        assert asyncio.run(backend.generate([chat("one")]))[0].ok
        assert asyncio.run(backend.generate([chat("two")]))[0].text == "echo: two"
        assert asyncio.run(backend.generate([chat("three")]))[0].ok
        asyncio.run(backend.aclose())
        gc.collect()
    # The sessions of the earlier loops were dropped without "Unclosed ..." reports.
    assert "Unclosed" not in caplog.text
    assert not [w for w in recwarn if "Unclosed" in str(w.message)]


def test_a_completion_that_echoes_the_key_is_stored_scrubbed(server, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, SECRET)
    server.script(Action(body=chat_body(f"sure, your key is {SECRET}")))
    (result,) = run(make_backend(server), [chat("a")])
    assert result.ok and result.text == "sure, your key is ***"


def test_a_short_key_is_not_scrubbed_from_every_message(server, monkeypatch):
    """A 1-character key used to turn every 'e' of every message into '***'."""
    monkeypatch.setenv(API_KEY_ENV, "e")
    server.script(Action(body=chat_body("here we go")), Action(status=400, body={"error": "bad request"}))
    ok, bad = run(make_backend(server, max_concurrency=1), [chat("a"), chat("b")])
    assert ok.text == "here we go"
    assert "request" in bad.error and "***" not in bad.error


def test_lone_surrogates_in_a_completion_are_replaced_at_the_boundary(server):
    """json.loads turns "\\ud800" into a str that cannot be written as UTF-8: the trajectory
    write failed outside any per-task guard and ended the run."""
    server.script(Action(body=b'{"choices": [{"index": 0, "message": {"role": "assistant", '
                               b'"content": "Paris \\ud800 and \\udfff"}, "finish_reason": "stop"}]}'))
    (result,) = run(make_backend(server), [chat("a")])
    assert result.ok and result.text == "Paris \ufffd and \ufffd"
    result.text.encode("utf-8")

"""A server answering 2xx with a body that is not JSON (issue 62), against real HTTP servers on
127.0.0.1: a page that is no API answer at all is retried once, then the request fails quoting its
content type and first characters; a server whose first answers are all not JSON is refused for
every later request at once (with the default retry budget it used to spend 60 s per request,
minutes per task, without a word); the first such body is said at once, in a warning line; a
sporadic bad body (a JSON answer cut short) is retried under the budget as before."""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from http.server import BaseHTTPRequestHandler

import pytest
from tests.support.http import loopback_server
from tests.support.processes import generate_and_close

from memsearch.backends.base import GenerationRequest
from memsearch.backends.openai import API_KEY_ENV, OpenAIBackend
from memsearch.backends.retry_policy import NOT_JSON_LIMIT, describe_body, foreign_body
from memsearch.testing.agent_server import AgentServer

PAGE = b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1></body></html>"
GOOD = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "fine"},
                                "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()


class _Scripted(BaseHTTPRequestHandler):
    """POST answers the server's queued ``(content type, body)`` pairs with status 200, then ``GOOD``."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.posts += 1
        kind, body = self.server.queue.popleft() if self.server.queue else ("application/json", GOOD)
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 - no model list: the model is unverified, requests go on
        self.send_error(404)

    def log_message(self, *args):
        pass


@pytest.fixture
def scripted():
    with loopback_server(_Scripted, queue=deque(), posts=0) as httpd:
        httpd.base_url = f"{httpd.url}/v1"
        yield httpd


def _chat(text: str = "hello") -> GenerationRequest:
    return GenerationRequest(role="memory", messages=({"role": "user", "content": text},))


def _backend(url: str, **kw) -> OpenAIBackend:
    # The defaults a run has (8 retries, a 60 s window, waits from 0.25-0.5 s): what the bound is about.
    return OpenAIBackend(url, model="m", **kw)


def test_foreign_body_tells_a_page_from_a_json_answer_cut_short():
    assert foreign_body(PAGE, "text/html; charset=utf-8") and foreign_body(b"Not Found", None)
    assert foreign_body(b'{"choices": [', "text/plain")  # a type that names no JSON: no API answer
    assert not foreign_body(b'  {"choices": [{"message": {"content": "cut', "application/json")
    assert not foreign_body(b"[1, 2", None)
    assert describe_body(PAGE, "text/html") == ("Content-Type text/html, body starts '<!DOCTYPE html> <html><head>"
                                                "<title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1>"
                                                "</body></html>'")
    assert describe_body(b"", None) == "Content-Type not given, body empty"


def test_a_page_answering_200_fails_the_request_after_one_retry_and_is_said_at_once(scripted, caplog):
    scripted.queue.extend([("text/html; charset=utf-8", PAGE)] * 10)
    backend = _backend(scripted.base_url)
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="memsearch.backends.openai"):
        [first] = generate_and_close(backend, [_chat("one")])
    elapsed = time.perf_counter() - started
    body = describe_body(PAGE, "text/html; charset=utf-8")
    assert first.finish_reason == "error" and first.attempts == 2
    assert first.error == (f"HTTP 200 with a body that is not JSON ({body}): no answer of an OpenAI-compatible API "
                           f"(a proxy or login page, another service on this port?); check base_url "
                           f"{scripted.base_url} (not retried again) [2 attempts, last HTTP status 200]")
    assert elapsed < 3  # one wait of 0.25-0.5 s, never the 60 s window
    # Said at once, once: the first such body is a warning line.
    assert [r.getMessage() for r in caplog.records] == [
        f"openai backend {scripted.base_url}: HTTP 200 with a body that is not JSON ({body}); retried, but a server "
        "that keeps answering so is no OpenAI-compatible API at this base_url: check it"]


def test_a_server_whose_first_answers_are_all_not_json_is_refused_for_every_later_request(scripted, caplog):
    """Four requests at once, every answer a page: the fourth page refuses the server, and every
    request fails within seconds, the later ones without being sent again."""
    scripted.queue.extend([("text/html", PAGE)] * 100)
    backend = _backend(scripted.base_url)
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="memsearch.backends.openai"):
        results = generate_and_close(backend, [_chat(f"q{i}") for i in range(4)])
        later = generate_and_close(backend, [_chat("later")])
    assert time.perf_counter() - started < 5
    assert all(r.finish_reason == "error" for r in [*results, *later])
    assert scripted.posts <= 2 * 4 and later[0].attempts == 0
    assert later[0].error.startswith(
        f"the server at {scripted.base_url} answers with bodies that are not JSON: its first {NOT_JSON_LIMIT} answers "
        f"were (last: HTTP 200, {describe_body(PAGE, 'text/html')}); it is no OpenAI-compatible API at this base_url")
    assert len(caplog.records) == 1


def test_json_cut_short_on_every_answer_is_refused_within_seconds_not_the_retry_window():
    """The fault server's ``bad_json`` on every answer (a JSON body cut short, served as JSON): with
    the default budget each request used to be retried for 60 s; now the server is refused after
    its first answers, and the whole batch ends within seconds."""
    with AgentServer(delay_s=0.0, faults={"bad_json": 1.0}, max_faults_per_request=1000, lifetime_s=60) as server:
        backend = _backend(server.base_url)
        started = time.perf_counter()
        results = generate_and_close(backend, [_chat(f"q{i}") for i in range(3)])
        elapsed = time.perf_counter() - started
    assert elapsed < 6, elapsed
    assert all(r.finish_reason == "error" for r in results)
    assert any("answers with bodies that are not JSON" in r.error for r in results)
    assert server.fault_counts["bad_json"] <= NOT_JSON_LIMIT + 3


def test_sporadic_bad_bodies_are_retried_under_the_budget_as_before(scripted):
    cut = ("application/json", b'{"choices": [{"message": {"content": "cut')
    # At the start of a run: three cut bodies in a row (fewer than NOT_JSON_LIMIT), then an answer.
    scripted.queue.extend([cut] * (NOT_JSON_LIMIT - 1))
    backend = _backend(scripted.base_url, backoff_base_s=0.001, backoff_max_s=0.01)
    [r] = generate_and_close(backend, [_chat()])
    assert r.ok and r.attempts == NOT_JSON_LIMIT and r.text == "fine"
    # Once the server has answered JSON: more cut bodies in a row than NOT_JSON_LIMIT are still
    # retried under the budget; one page among good answers is retried once and passes.
    scripted.queue.extend([cut] * 6)
    [r] = generate_and_close(backend, [_chat()])
    assert r.ok and r.attempts == 7
    scripted.queue.append(("text/html", PAGE))
    [r] = generate_and_close(backend, [_chat()])
    assert r.ok and r.attempts == 2


def test_the_quoted_body_never_carries_the_api_key(scripted, monkeypatch, caplog):
    key = "sk-canary-0123456789"
    monkeypatch.setenv(API_KEY_ENV, key)
    scripted.queue.extend([("text/plain", f"proxy says: bad key {key}".encode())] * 2)
    with caplog.at_level(logging.WARNING, logger="memsearch.backends.openai"):
        [r] = generate_and_close(_backend(scripted.base_url), [_chat()])
    assert r.finish_reason == "error" and key not in r.error and "bad key ***" in r.error
    assert key not in caplog.text and "bad key ***" in caplog.text

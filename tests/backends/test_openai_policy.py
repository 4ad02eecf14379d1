"""What the OpenAI backend does with what real servers answer (issue 55), on the scripted loopback
server of ``test_openai`` (real sockets, real HTTP): the retry rule (a 500 stating a request
error is final, a restart within the retry window is bridged, Retry-After on 503), the timeout
counted from when a request is sent, the served model checked against GET /models, context cuts
and overruns, the schema forms and a server that ignores them, what was sent, and log-probs
asked only for the roles a trainer reads. The same against `transformers serve`:
``test_transformers_serve``."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tests.backends.test_openai import Action, FaultServer, chat, chat_body, make_backend, run

from memsearch.backends import check_served_models
from memsearch.backends.base import SamplingParams
from memsearch.backends.retry_policy import backoff_s, request_error, status_retried
from memsearch.backends.schema_check import schema_problem
from memsearch.config import BackendConfig, load_config
from memsearch.errors import InputError
from memsearch.http_client import Backoff
from memsearch.memory.action_format import memory_ops_constraint, memory_ops_schema

ROOT_API = Path(__file__).resolve().parents[2] / "configs" / "api.toml"
OPS = memory_ops_constraint(3)
VALID_OPS = '{"ops": [{"op": "ADD", "text": "Paris is in France", "sources": ["d1:0"], "kind": "fact"}]}'


@pytest.fixture
def server():
    s = FaultServer()
    yield s
    s.stop()


# ------------------------------------------------------------------------------- retry rule

LLAMA_CPP_500 = {"error": {"code": 500, "type": "server_error",
                           "message": "response_format type must be one of \"text\" or \"json_object\", but got: x"}}


@pytest.mark.parametrize(("status", "body", "retried"), [
    (500, {"error": "boom"}, True),
    (500, {"error": {"message": "CUDA out of memory"}}, True),
    (500, LLAMA_CPP_500, False),
    (500, {"error": {"message": "the request exceeds the available context size, try increasing it"}}, False),
    (500, {"detail": "Only one completion choice is allowed"}, False),
    (500, {"error": {"type": "invalid_request_error", "message": "?"}}, False),
    (502, {}, True), (503, {}, True), (504, {}, True), (408, {}, True), (429, {}, True),
    (400, {}, False), (404, {}, False), (422, {}, False), (501, {}, False), (505, {}, False),
])
def test_which_statuses_are_retried(status, body, retried):
    assert status_retried(status, json.dumps(body).encode())[0] is retried


def test_request_error_reads_every_body_shape():
    assert request_error(b"plain text: prompt is too long") == "the message says 'prompt is too long'"
    assert request_error(b'{"detail": {"message": "x", "type": "BadRequestError"}}') == "error type 'badrequesterror'"
    assert request_error(b'[1, 2]') is None and request_error(b"\xff\xfe") is None


def test_a_500_stating_a_request_error_is_not_retried(server):
    server.script(*[Action(status=500, body=LLAMA_CPP_500)] * 3)
    backend = make_backend(server, max_retries=4)
    [r] = run(backend, [chat()])
    assert r.finish_reason == "error" and r.attempts == 1 and len(server.requests) == 1
    assert "not retried: a request error (the message says 'must be')" in r.error
    assert backend.stats()["errors"] == {"http_5xx": 1} and backend.stats()["retries"] == 0


def test_503_retry_after_is_honoured(server):
    server.script(Action(status=503, body={"error": "loading"}, headers={"Retry-After": "0.4"}))
    [r] = run(make_backend(server, backoff_max_s=5.0), [chat()])
    assert r.ok and r.attempts == 2 and r.latency_s >= 0.4


def test_retries_stop_at_the_window(server):
    server.script(*[Action(status=503, body={"error": "down"})] * 200)
    backend = make_backend(server, max_retries=100, retry_window_s=0.4, backoff_base_s=0.02, backoff_max_s=0.05)
    [r] = run(backend, [chat()])
    assert r.finish_reason == "error" and "(the 0.4 s retry window spent)" in r.error
    assert 3 <= r.attempts < 100 and 0.3 <= r.latency_s < 2.0


def test_a_server_restart_within_the_window_is_bridged():
    """The server goes away (connections refused) and comes back on the same port 1.5 s later."""
    first = FaultServer()
    first.stop()
    second: list[FaultServer] = []

    def restart() -> None:
        time.sleep(1.5)
        second.append(FaultServer(first.port))

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        backend = make_backend(first, max_retries=30, retry_window_s=10, backoff_base_s=0.1, backoff_max_s=0.4)
        [r] = run(backend, [chat("after the restart")])
    finally:
        thread.join()
        second[0].stop()
    assert r.ok and r.text == "echo: after the restart" and r.latency_s >= 1.4
    assert backend.stats()["errors"]["connection"] == r.attempts - 1 >= 3


def test_default_backoff_spans_thirty_to_sixty_seconds():
    """8 retries with the defaults wait 30.25-60.5 s in all: a ~30 s restart is always bridged."""
    cfg = BackendConfig.model_validate({"kind": "openai", "base_url": "http://h:1/v1", "model": "m"})
    assert (cfg.max_retries, cfg.retry_window_s, cfg.max_concurrency) == (8, 60.0, 8)
    for seed in range(200):
        backoff = Backoff(0.5, 15.0, seed)
        total = sum(backoff_s(backoff, k, None) for k in range(1, cfg.max_retries + 1))
        assert 30.25 <= total <= 60.5
    assert backoff_s(Backoff(0.5, 15.0), 1, 100.0) == 15.0  # Retry-After capped


def test_the_timeout_starts_when_a_request_is_sent_not_while_it_waits_for_a_slot(server):
    """One slot, 0.5 s timeout, three answers of 0.3 s each: the third waited 0.6 s for the slot."""
    server.script(*[Action(delay_s=0.3)] * 3)
    backend = make_backend(server, max_concurrency=1, timeout_s=0.5, max_retries=0)
    started = time.perf_counter()
    results = run(backend, [chat(f"q{i}") for i in range(3)])
    assert all(r.ok and r.attempts == 1 for r in results), [r.error for r in results]
    assert time.perf_counter() - started >= 0.9 and server.max_in_flight == 1


# ---------------------------------------------------------------------------- served model


def test_check_model_records_the_served_entry(server):
    server.models = ["other", "test-model"]
    backend = make_backend(server)
    identity = asyncio.run(backend.check_model())
    assert identity["verified"] is True and identity["entry"] == {
        "id": "test-model", "object": "model", "owned_by": "test", "created": 7, "max_model_len": 4096}
    assert backend.context_tokens == 4096  # the listed context is used when none is configured
    [r] = run(backend, [chat()])
    assert r.ok and server.model_gets == 1 and backend.stats()["served_identity"] == identity


def test_a_model_the_server_does_not_list_is_refused(server):
    server.models = ["served-a", "served-b"]
    backend = make_backend(server)
    with pytest.raises(InputError, match=r"model 'test-model' is not served at .*/v1: its /models lists 'served-a', "
                                         r"'served-b'; set the backend's model"):
        asyncio.run(backend.check_model())
    # Without the explicit check, the first use checks: nothing is sent, every call fails naming it.
    lazy = make_backend(server)
    results = run(lazy, [chat("a"), chat("b")])
    assert all(r.finish_reason == "error" and "is not served" in r.error and r.attempts == 0 for r in results)
    assert server.requests == [] and lazy.stats()["errors"] == {"refused": 2}


def test_a_server_without_a_model_list_is_recorded_unverified(server):
    backend = make_backend(server)  # models None: GET /models answers 404
    [r] = run(backend, [chat()])
    assert r.ok and backend.served_identity == {
        "base_url": server.base_url, "model": "test-model", "verified": False, "entry": None,
        "note": "GET /models answered HTTP 404: the server lists no models"}
    server.stop()
    with pytest.raises(InputError, match=r"GET /models failed \(ClientConnectorError.*is the server running"):
        asyncio.run(make_backend(server).check_model())


def test_served_entry_is_the_blocking_check_and_reads_models_as_the_backend_does(server):
    # The one check a started or handed-over server passes (serving.served_identity, stage 2's
    # memory server): the entry the backend records, or a refusal naming the setting.
    from memsearch.backends.served_model import served_entry

    server.models = ["other", "test-model"]
    assert served_entry(server.base_url, "test-model") == asyncio.run(make_backend(server).check_model())["entry"]
    with pytest.raises(InputError, match=r"stage2.memory_model 'x' is not served at .*: its /models lists 'other', "
                                         r"'test-model'; fix it"):
        served_entry(server.base_url, "x", setting="stage2.memory_model", remedy="fix it")
    server.models = None  # GET /models answers 404: a server that must prove what it serves cannot
    with pytest.raises(InputError, match=r"GET /models answered HTTP 404: the server lists no models, so it cannot "
                                         r"show it serves model 'test-model'"):
        served_entry(server.base_url, "test-model")
    server.stop()
    with pytest.raises(InputError, match=r"GET /models failed \(URLError.*; start it first"):
        served_entry(server.base_url, "test-model", timeout_s=2, unreachable="start it first")


def test_eval_refuses_an_unserved_model_before_the_run_folder_exists(server, hotpot_dev_dir, tmp_path):
    from memsearch.eval.runner import run_eval

    server.models = ["served-model-x"]
    sets = [f'backends.{r}.base_url="{server.base_url}"' for r in ("memory", "controller", "reader")]
    cfg = load_config(ROOT_API, ["limit=1", 'tokenizer="lexical"', *sets])
    with pytest.raises(InputError, match="model 'served-model' is not served at"):
        run_eval(cfg, hotpot_dev_dir, tmp_path / "run", show_progress=False)
    assert not (tmp_path / "run").exists() and server.requests == []


# ---------------------------------------------------------------------- context and truncation


def test_a_completion_cut_by_the_context_is_marked(server):
    server.script(Action(body=chat_body("cut", finish_reason="length")),  # 3 completion tokens of 32
                  Action(body={**chat_body("full", finish_reason="length"),
                               "usage": {"prompt_tokens": 5, "completion_tokens": 32}}))
    backend = make_backend(server, max_concurrency=1)
    cut, full = run(backend, [chat("a", sampling=SamplingParams(max_tokens=32))] * 2)
    assert (cut.context_truncated, full.context_truncated) == (True, False)
    assert cut.finish_reason == full.finish_reason == "length" and backend.stats()["context_truncated"] == 1


def test_an_answer_past_the_context_fails_and_is_not_retried(server):
    backend = make_backend(server, context_tokens=12, max_retries=3)  # the echo reports 11 + 3 tokens
    [r] = run(backend, [chat()])
    assert r.finish_reason == "error" and r.attempts == 1 and len(server.requests) == 1
    assert "past the server's context: 11 prompt + 3 completion tokens, over its 12" in r.error
    assert backend.stats()["errors"] == {"past_context": 1}


# ---------------------------------------------------------------------------- schema mode


def test_schema_check_is_semantic():
    schema = memory_ops_schema(2)
    assert schema_problem(VALID_OPS, schema) is None
    assert schema_problem('{\n  "ops" : [ {"kind": "fact", "sources": ["a"], "text": "t", "op": "ADD"} ]\n}',
                          schema) is None  # white space and key order are the server's
    assert schema_problem("Hello there!", schema).startswith("not JSON")
    assert schema_problem('{"ops": []}', schema) == "$.ops: 0 items, fewer than minItems 1"
    assert "matches none of the 4 anyOf variants" in schema_problem('{"ops": [{"op": "MOVE"}]}', schema)
    too_many = '{"ops": [{"op": "ADD", "text": "t", "sources": ["a", "b", "c"], "kind": "fact"}]}'
    assert "more than maxItems 2" in schema_problem(too_many, schema)
    assert "key 'extra' is not allowed" in schema_problem('{"ops": [{"op": "NOOP"}], "extra": 1}', schema)


# ------------------------------------------------------------------ what was sent, log-probs


def test_sent_fields_record_sampling_and_extra_body(server):
    backend = make_backend(server, extra_body={"repeat_penalty": 1.0, "top_k": 0})
    reqs = [chat("a", sampling=SamplingParams(temperature=0.5, max_tokens=16, seed=3)),
            chat("b", sampling=SamplingParams(max_tokens=32, stop=("\n",)), constraint=OPS)]
    run(backend, reqs)
    assert all(r["body"]["repeat_penalty"] == 1.0 and r["body"]["top_k"] == 0 for r in server.requests)
    assert backend.sent_fields() == {
        "requests": 2, "values": {"max_tokens": [16, 32], "temperature": [0.0, 0.5], "top_p": [1.0]},
        "requests_with": {"repeat_penalty": 2, "response_format": 1, "seed": 1, "stop": 1, "top_k": 2},
        "extra_body": {"repeat_penalty": 1.0, "top_k": 0}, "schema_style": "auto: response_format"}
    assert backend.stats()["sent"] == backend.sent_fields() and backend.stats()["completion_ids"] == "unavailable"


def test_backend_config_openai_fields():
    base = {"kind": "openai", "base_url": "http://h:1/v1", "model": "m"}
    cfg = BackendConfig.model_validate({**base, "extra_body": {"top_k": 20}, "schema_style": "llama_cpp",
                                        "context_tokens": 4096, "schema_mode": True})
    from memsearch.backends import make_backend as build

    backend = build(cfg, None)
    assert (backend.extra_body, backend.schema_style, backend.context_tokens, backend.retry_window_s) == (
        {"top_k": 20}, "llama_cpp", 4096, 60.0)
    problems = {
        "extra_body": "read by kind 'openai' only", "schema_style": "read by kind 'openai' only",
        "context_tokens": "read by kind 'openai' only"}
    for field, message in problems.items():
        value = {"extra_body": {"a": 1}, "schema_style": "guided_json", "context_tokens": 8}[field]
        with pytest.raises(ValueError, match=f"{field}: {message}"):
            BackendConfig.model_validate({"kind": "hf", field: value})
    with pytest.raises(ValueError, match=r"schema_style: 'guided_json': vLLM removed guided_json in 0\.12 and answers "
                       r"it with free text \(HTTP 200\); use schema_style = 'auto'"):
        BackendConfig.model_validate({**base, "schema_style": "guided_json"})
    with pytest.raises(ValueError, match=r"schema_style: 'grammar'; expected one of auto, response_format"):
        BackendConfig.model_validate({**base, "schema_style": "grammar"})
    with pytest.raises(ValueError, match=r"extra_body.seed: set by memsearch \(the backend's \[sampling\] table\)"):
        BackendConfig.model_validate({**base, "extra_body": {"seed": 1}})
    import datetime

    with pytest.raises(ValueError, match="extra_body: not JSON"):
        BackendConfig.model_validate({**base, "extra_body": {"when": datetime.date(2026, 1, 1)}})
    # schema mode over HTTP is a run setting now; the rules backend still cannot constrain.
    cfg = load_config(ROOT_API, ["backends.memory.schema_mode=true"])
    assert cfg.backends.memory.schema_mode is True
    with pytest.raises(InputError, match="schema_mode = true needs backends.memory.kind = 'hf'"):
        load_config(None, ["backends.memory.schema_mode=true"])


def test_log_probs_are_asked_only_for_the_roles_a_trainer_reads(server, hotpot_dev_dir):
    from memsearch.data.dataset import load_dataset
    from memsearch.engine.environment import build_shared, close_environment
    from memsearch.engine.episode import run_episode

    sets = [f'backends.{r}.base_url="{server.base_url}"' for r in ("memory", "controller", "reader")]
    cfg = load_config(ROOT_API, ['tokenizer="lexical"', "budgets.max_searches=1", *sets])
    dataset = load_dataset(hotpot_dev_dir)
    task = dataset.tasks[0]

    async def episode(answered_by: dict[str, Any]) -> None:
        shared = build_shared(cfg, dataset, leave_out=set(answered_by))
        env = shared.environment(cfg, "t", answered_by=answered_by)
        try:
            await run_episode(task, env)
        finally:
            await close_environment(env)

    asyncio.run(episode({}))  # an eval: nobody reads log-probs
    assert server.requests and not any("logprobs" in r["body"] for r in server.requests)
    server.requests.clear()
    asyncio.run(episode({"memory": make_backend(server)}))  # a trainer answers (and reads) the memory role
    memory = ["Reply with one JSON object only" in r["body"]["messages"][-1]["content"] for r in server.requests]
    assert any(memory) and not all(memory)
    assert [r["body"].get("logprobs") is True for r in server.requests] == memory


def test_check_served_models_checks_each_backend_once(server):
    server.models = ["test-model"]
    backend = make_backend(server)
    asyncio.run(check_served_models({"memory": backend, "controller": backend, "reader": backend}))
    assert server.model_gets == 1 and backend.served_identity["verified"] is True

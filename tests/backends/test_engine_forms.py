"""Schema forms and token ids per engine, on the scripted loopback server of ``test_openai``
(real sockets, real HTTP) made to read as each engine through its /models ``owned_by``: the
form each engine is sent, a form it is known to drop refused before the first request, schema
mode refused on an engine that constrains nothing, an unknown engine's answers checked (a cut
answer as the start of an allowed one), and token ids asked of vLLM and SGLang and read in both
engines' shapes. The same against a real vLLM: tests/serving/test_vllm_lane.py."""

from __future__ import annotations

import asyncio

import pytest
from tests.backends.test_openai import Action, FaultServer, chat, chat_body, make_backend, run

from memsearch.backends.engine_forms import constraint_body, engine_of, resolved_style, style_refusal
from memsearch.backends.schema_check import cut_problem
from memsearch.errors import InputError
from memsearch.memory.action_format import memory_ops_constraint
from memsearch.memory.extractive_constraint import extractive_ops_constraint
from memsearch.text.constraint import Constraint

OPS = memory_ops_constraint(3)
EXTRACT = extractive_ops_constraint([["d1:0"], ["d2:1"]], {}, [], 0)
VALID_OPS = '{"ops": [{"op": "ADD", "text": "Paris is in France", "sources": ["d1:0"], "kind": "fact"}]}'


@pytest.fixture
def server():
    s = FaultServer()
    s.models = ["test-model"]
    yield s
    s.stop()


def test_each_form_and_what_auto_sends_to_each_engine():
    schema = OPS.json_schema
    assert constraint_body(OPS, "response_format")["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "memory-ops-v2-sources3", "schema": schema}}
    assert constraint_body(OPS, "structured_outputs") == {"structured_outputs": {"json": schema}}
    assert constraint_body(OPS, "json_object_schema") == {"response_format": {"type": "json_object", "schema": schema}}
    assert constraint_body(OPS, "llama_cpp") == {"json_schema": schema}
    odd = Constraint(id='memory-extract-v1:{"add":[["d:1"]]}' + "x" * 80, json_schema={"type": "object"})
    name = constraint_body(odd, "response_format")["response_format"]["json_schema"]["name"]
    assert name == "memory-extract-v1___add_____d_1____" + "x" * 29
    with pytest.raises(ValueError, match="unknown schema style 'grammar'"):
        constraint_body(OPS, "grammar")
    auto = {e: resolved_style("auto", e) for e in ("vllm", "sglang", "llama.cpp", "llama-server", "transformers",
                                                    "other")}
    assert auto == {"vllm": "response_format", "sglang": "response_format", "llama.cpp": "json_object_schema",
                    "llama-server": "llama_cpp", "transformers": None, "other": "response_format"}
    assert resolved_style("llama_cpp", "vllm") is None and resolved_style("structured_outputs", "vllm")
    assert "ignores schema_style 'llama_cpp' (it honours response_format, structured_outputs)" in \
        style_refusal("llama_cpp", "vllm")
    assert "constrains no output" in style_refusal("auto", "transformers")
    owners = {o: engine_of({"entry": {"owned_by": o}}) for o in ("vllm", "sglang", "me", "llamacpp", "Qwen", None)}
    assert owners == {"vllm": "vllm", "sglang": "sglang", "me": "llama.cpp", "llamacpp": "llama-server",
                      "Qwen": "other", None: "other"}


def test_vllm_is_sent_its_form_and_asked_for_token_ids(server):
    server.owned_by = "vllm"
    answer = chat_body(VALID_OPS)
    answer["choices"][0]["token_ids"] = [5, 6, 7]
    answer["prompt_token_ids"] = [1, 2]
    server.script(Action(body=answer))
    backend = make_backend(server, schema_mode=True)
    [r] = run(backend, [chat(constraint=OPS)])
    body = server.requests[0]["body"]
    assert r.ok and r.completion_ids == (5, 6, 7) and r.prompt_ids == (1, 2)
    assert body["return_token_ids"] is True and body["response_format"]["type"] == "json_schema"
    stats = backend.stats()
    assert stats["engine"] == "vllm" and stats["completion_ids"] == "returned"
    assert stats["sent"]["schema_style"] == "auto: response_format"


def test_sglang_token_ids_are_read_per_choice_and_the_user_can_turn_them_off(server):
    server.owned_by = "sglang"
    answer = chat_body("hi")
    answer["choices"][0].update(token_ids=[9], prompt_token_ids=[3, 4])
    server.script(Action(body=answer), Action(body=chat_body("hi")))
    [r] = run(make_backend(server), [chat()])
    assert (r.completion_ids, r.prompt_ids) == ((9,), (3, 4))
    run(make_backend(server, extra_body={"return_token_ids": False}), [chat()])
    assert server.requests[1]["body"]["return_token_ids"] is False


def test_an_unknown_engine_is_asked_nothing_engine_specific(server):
    server.script(Action(body=chat_body("hi")))
    run(make_backend(server), [chat()])
    assert "return_token_ids" not in server.requests[0]["body"]


def test_a_form_the_engine_drops_is_refused_before_any_request(server):
    server.owned_by = "vllm"
    backend = make_backend(server, schema_style="llama_cpp", schema_mode=True)
    with pytest.raises(InputError, match=r"\(test-model\): the vllm server ignores schema_style 'llama_cpp'"):
        asyncio.run(backend.check_model())
    [r] = run(backend, [chat(constraint=OPS)])
    assert not r.ok and "ignores schema_style 'llama_cpp'" in r.error and server.requests == []


def test_schema_mode_on_transformers_serve_is_refused_before_any_request(server):
    backend = make_backend(server, engine="transformers", schema_mode=True)
    with pytest.raises(InputError, match="the transformers server constrains no output"):
        asyncio.run(backend.check_model())
    # Without schema mode the same server is fine; a constrained request alone is refused unsent.
    free = make_backend(server, engine="transformers")
    server.script(Action(body=chat_body("hi")))
    ok, refused = run(free, [chat(), chat(constraint=OPS)])
    assert ok.ok and not refused.ok and "constrains no output" in refused.error and len(server.requests) == 1


def test_a_server_that_ignores_the_schema_is_stopped_after_three_answers(server):
    """An unknown engine that answers free text: each answer is a failed request, never a
    decision, and after the first three every request fails unsent, naming the form."""
    backend = make_backend(server, max_concurrency=1)
    results = run(backend, [chat(f"q{i}", constraint=OPS) for i in range(5)])
    assert not any(r.ok for r in results)
    assert "breaks its response_format schema constraint (not JSON" in results[0].error
    assert "(other) ignored the response_format schema constraint: its first 3" in results[2].error
    assert "set engine and schema_style to the server's" in results[4].error
    assert len(server.requests) == 3
    stats = backend.stats()
    assert stats["schema_ignored"] == 3 and stats["errors"] == {"schema_ignored": 3, "refused": 2}


def test_answers_cut_at_the_token_limit_are_judged_as_starts(server):
    """Free text cut by max_tokens (how vLLM answers a dropped form) is caught like any other;
    a constrained answer cut inside the schema is the schema not ending: allowed, counted."""
    assert cut_problem('{\n  "ops": [ {"op": "ADD", "sour', EXTRACT.json_schema) is None
    assert cut_problem('```json\n{"name": "Mara"', EXTRACT.json_schema).startswith("cut answer leaves the schema")
    cut_free = chat_body('```json\n{\n    "name": "Mara",', finish_reason="length")
    cut_inside = chat_body('{"ops":[{"op":"ADD","sources":["d1:0"]', finish_reason="length")
    server.script(Action(body=cut_inside), Action(body=cut_free), Action(body=chat_body(VALID_OPS)))
    backend = make_backend(server, max_concurrency=1)
    inside, free = run(backend, [chat(constraint=EXTRACT), chat(constraint=EXTRACT)])
    assert inside.ok and inside.finish_reason == "length"
    assert not free.ok and "breaks its response_format schema constraint (cut answer leaves" in free.error
    stats = backend.stats()
    assert (stats["schema_unfinished"], stats["schema_ignored"]) == (1, 1)


def test_a_constraining_server_is_never_stopped_by_a_later_bad_answer(server):
    server.script(Action(body=chat_body(VALID_OPS)), *[Action(body=chat_body("free text"))] * 4)
    backend = make_backend(server, max_concurrency=1)
    results = run(backend, [chat(f"q{i}", constraint=OPS) for i in range(5)])
    assert results[0].ok and not any(r.ok for r in results[1:]) and len(server.requests) == 5
    assert backend.stats()["errors"] == {"schema_ignored": 4}

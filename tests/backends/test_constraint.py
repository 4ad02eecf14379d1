"""Schema mode: the memory-ops JSON constraint, its token masks and their replay, constrained
decoding with the real embedded model (SmolLM2-135M-Instruct, float32 on CPU) and the engine
plumbing.

Tolerance for log-probs: 1e-4 (absolute, nats), as in ``test_hf.py``: the backend's masked,
KV-cached, batched decode against one unpadded full forward pass with the replayed masks.
(The unconstrained version of that check is ``test_hf.py``'s; a plain row rides along here
only to show that masking other rows of its batch leaves it alone.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from memsearch.backends.base import Constraint, GenerationRequest, SamplingParams
from memsearch.backends.hf.constraint import Automaton, compile_constraint, token_texts
from memsearch.config import MEMORY_MAX_SOURCES, RunConfig
from memsearch.engine import prompts
from memsearch.memory.action_format import MEMORY_OPS, MEMORY_OPS_V1, constraint_by_id, memory_ops_constraint
from memsearch.memory.ops import parse_ops

LOGPROB_TOL = 1e-4
RULES = Path(__file__).resolve().parents[2] / "configs" / "rules.toml"

VALID_OPS = [
    '{"ops": [{"op": "ADD", "text": "Paris is in France", "sources": ["d7:2"], "kind": "fact"}]}',
    '{"ops":[{"op":"NOOP"}]}',
    '{"ops": [{"op": "UPDATE", "id": "m3", "text": "a \\"quoted\\" caf\\u00e9", "sources": ["d7:2", "d2:0"]}, '
    '{"op": "DELETE", "id": "m1"}]}',
    '{"ops": [{"op": "UPDATE", "id": "m3", "text": "Who directed it?", "kind": "open"}]}',
    '{\n"ops": [ {"op": "ADD", "text": "café 中文", "sources": [], "kind": "open"} ]\n}',
]
INVALID_OPS = {
    '{"ops": []}': "no op",
    '{"ops": [{"op": "ADD", "text": "a"}]}': "ADD without sources and kind",
    '{"ops": [{"op": "ADD", "text": "", "sources": [], "kind": "fact"}]}': "empty text",
    '{"ops": [{"text": "a", "op": "ADD", "sources": [], "kind": "fact"}]}': "keys out of order",
    '{"ops": [{"op": "MOVE"}]}': "unknown op",
    '{"ops": [{"op": "NOOP", "id": "m1"}]}': "a key NOOP does not have",
    '{"ops": [{"op": "ADD", "text": "a", "sources": ["d1:0"], "kind": "facts"}]}': "kind outside the enum",
    '{"ops": [{"op": "DELETE", "id": "m\n1"}]}': "raw control character in a string",
    '{"ops": [{"op": "DELETE", "id": "m\\x1"}]}': "bad escape",
    '{"ops": [{"op": "NOOP"},]}': "trailing comma",
    '{"ops":  [{"op": "NOOP"}]}': "two spaces in one gap",
    '{"ops": [{"op": "NOOP"}]} ': "white space after the value",
    '{"ops": [{"op": "NOOP"}]}{': "anything after the value",
    '{"ops": [{"op": "NOOP"}], "note": "x"}': "an undeclared key",
}


def run(coro):
    return asyncio.run(coro)


# --------------------------------------------------------------------------- the automaton
def test_automaton_accepts_valid_ops_char_by_char():
    auto = Automaton(MEMORY_OPS)
    for text in VALID_OPS:
        assert parse_ops(text).ok, text  # the schema never accepts what the parser refuses
        state = auto.start()
        for i, ch in enumerate(text):
            assert not auto.complete(state), text[:i]
            state = auto.step(state, ch)
            assert state, f"rejected at char {i} of {text!r}"
        assert auto.complete(state), text


@pytest.mark.parametrize("text", list(INVALID_OPS), ids=list(INVALID_OPS.values()))
def test_automaton_rejects_invalid_ops(text):
    assert not Automaton(MEMORY_OPS).accepts(text)


def test_other_schema_features_and_choices():
    bounded = Automaton(Constraint("s", json_schema={"type": "array", "maxItems": 2,
                                                     "items": {"type": "string", "maxLength": 3}}))
    assert [
        bounded.accepts(t) for t in ('["abc"]', '["abcd"]', '["a", "b"]', '["a","b","c"]', "[]", '["\\u0041bc"]')
    ] == [True, False, True, False, True, True]
    scalars = Automaton(
        Constraint("b", json_schema={"anyOf": [{"type": "boolean"}, {"type": "null"}, {"enum": [1, "x"]}]})
    )
    assert [scalars.accepts(t) for t in ("true", "null", "1", '"x"', "tru", '"y"')] == [
        True,
        True,
        True,
        True,
        False,
        False,
    ]
    choice = Automaton(Constraint("c", choices=("yes", "yes sir", "no")))
    assert [choice.accepts(t) for t in ("yes", "yes sir", "no", "ye", "yes s", "nope", " no")] == [
        True,
        True,
        True,
        False,
        False,
        False,
        False,
    ]
    assert choice.prefix_ok("yes s") and not choice.prefix_ok("nope")


def test_unsupported_schemas_and_unknown_ids_are_clear_errors():
    with pytest.raises(ValueError, match="unsupported JSON-schema keyword 'pattern'"):
        Automaton(Constraint("p", json_schema={"type": "string", "pattern": "a+"}))
    with pytest.raises(ValueError, match="unsupported schema type 'number'"):
        Automaton(Constraint("n", json_schema={"type": "number"}))
    with pytest.raises(ValueError, match="valid ids: memory-ops-v1, memory-ops-v2-sources3"):
        constraint_by_id("memory-op-v1")
    with pytest.raises(ValueError, match="unknown constraint id 'memory-ops-v2-sources0'"):
        constraint_by_id("memory-ops-v2-sources0")
    assert constraint_by_id("memory-ops-v1") is MEMORY_OPS_V1
    assert constraint_by_id("memory-ops-v2-sources3") is MEMORY_OPS is memory_ops_constraint(3)


# ------------------------------------------------------------------ the sources cap (maxItems)
def _add(n: int) -> str:
    sources = ", ".join(f'"d1:{i}"' for i in range(n))
    return f'{{"ops": [{{"op": "ADD", "text": "a", "sources": [{sources}], "kind": "fact"}}]}}'


def test_the_default_constraint_caps_sources_per_item_at_the_config_default():
    assert MEMORY_MAX_SOURCES == RunConfig().agent.memory_max_sources == 3
    assert MEMORY_OPS.id == "memory-ops-v2-sources3"
    auto = Automaton(MEMORY_OPS)
    assert [auto.accepts(_add(n)) for n in range(6)] == [True, True, True, True, False, False]
    update = '{"ops": [{"op": "UPDATE", "id": "m1", "text": "a", "sources": ["d1:0", "d1:1", "d1:2", "d1:3"]}]}'
    assert not auto.accepts(update) and auto.accepts(update.replace(', "d1:3"', ""))
    # After three sources the array may only close: no comma, so no fourth source.
    three = _add(3).split("]")[0]
    assert auto.prefix_ok(three + "]") and not auto.prefix_ok(three + ",") and not auto.prefix_ok(three + " ,")
    # Another cap is another constraint (its id names it); v1, uncapped, still replays old rows.
    five = constraint_by_id("memory-ops-v2-sources5")
    assert Automaton(five).accepts(_add(5)) and not Automaton(five).accepts(_add(6))
    assert Automaton(MEMORY_OPS_V1).accepts(_add(40))
    assert parse_ops(_add(4)).ok  # the parser does not count: the store rejects it (tests/memory)


# ------------------------------------------------------------------------- token masks
@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from memsearch.assets.embedded import model_dir

    return AutoTokenizer.from_pretrained(str(model_dir()))


REPLAYED = (
    '{"ops": [{"op": "ADD", "text": "Scott Derrickson is an American director, born 1966.", "sources": ["d3:0", '
    '"d3:1"], '
    '"kind": "fact"}, {"op": "UPDATE", "id": "m1", "text": "café \\"x\\"", "sources": ["d2:0"]}, {"op": "DELETE", '
    '"id": "m2"}]}'
)


def test_masks_replay_a_tokenized_output(tokenizer):
    tc = compile_constraint(MEMORY_OPS, tokenizer)
    assert tc is compile_constraint(MEMORY_OPS, tokenizer)  # cached
    eos = tokenizer.eos_token_id
    ids = tokenizer(REPLAYED, add_special_tokens=False)["input_ids"] + [eos]
    texts = token_texts(tokenizer)
    assert "".join(texts[i] for i in ids[:-1]) == REPLAYED  # byte-level decoding of each token
    masks = tc.masks_for(ids)
    assert masks.shape == (len(ids), tc.vocab_size) == (len(ids), len(tokenizer)) and masks.dtype == torch.bool
    assert all(bool(masks[p, t]) for p, t in enumerate(ids))  # every token allowed where it stands
    assert masks[:, eos].nonzero()[:, 0].tolist() == [len(ids) - 1]  # EOS only once complete ...
    assert int(masks[-1].sum()) == 1  # ... and then alone
    assert not masks[:, [i for i in tokenizer.all_special_ids if i != eos]].any()
    early = tokenizer('{"ops": [{"op"', add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match=f"token {eos} is not allowed here \\(completion position {len(early)}\\)"):
        tc.masks_for(early + [eos])  # EOS before the value is complete
    with pytest.raises(ValueError, match="not allowed"):
        tc.masks_for(tokenizer('{"ops": [}', add_special_tokens=False)["input_ids"])


def test_masks_refuse_a_source_past_the_cap(tokenizer):
    """Schema mode with the real embedded tokenizer: after the third source no token may open a
    fourth (every token starting with a comma is masked), so a 4-source ADD cannot be sampled."""
    tc = compile_constraint(MEMORY_OPS, tokenizer)
    texts = token_texts(tokenizer)
    commas = [i for i, t in enumerate(texts) if t is not None and t.lstrip().startswith(",")]
    assert len(commas) > 10  # ",", " ,", ',"', ... : the tokens that could continue a list
    two, three = (tc.automaton.walk(_add(n).split("]")[0]) for n in (2, 3))
    assert tc.allowed(two)[texts.index(",")] and not tc.allowed(three)[commas].any()
    assert tc.allowed(three)[texts.index("]")]  # the list may close
    # Inside the third source's string: '"' may close it, '",' (close and go on) may not.
    in_second, in_third = (tc.automaton.walk(_add(n).split("]")[0][:-1]) for n in (2, 3))
    assert tc.allowed(in_second)[texts.index('",')] and not tc.allowed(in_third)[texts.index('",')]
    assert tc.allowed(in_third)[texts.index('"')]
    eos = tokenizer.eos_token_id
    ok = tokenizer(_add(3), add_special_tokens=False)["input_ids"] + [eos]
    assert tc.masks_for(ok).shape[0] == len(ok)
    over = tokenizer(_add(4), add_special_tokens=False)["input_ids"] + [eos]
    with pytest.raises(ValueError, match="is not allowed here"):
        tc.masks_for(over)
    compile_constraint(MEMORY_OPS_V1, tokenizer).masks_for(over)  # uncapped v1 allows it


def test_masks_equal_a_brute_force_walk_of_every_token(tokenizer):
    """The trie walk, the alphabet shortcut and the in-string fast path change nothing: each
    mask equals walking every vocabulary token through the automaton on its own."""
    tc = compile_constraint(MEMORY_OPS, tokenizer)
    auto, texts = tc.automaton, token_texts(tokenizer)
    prefixes = [
        "",
        '{"ops": [{"op": "',
        '{"ops": [{"op": "ADD", "text": "Scott',
        '{"ops": [{"op": "ADD", "text": "a\\',
        '{"ops": [{"op": "ADD", "text": "a", "sources": ["d1:0"]',
        '{"ops": [{"op": "DELETE", "id": "m1"}',
        '{"ops": [{"op": "NOOP"}]}',
    ]
    for prefix in prefixes:
        state = auto.walk(prefix)
        assert state, prefix
        brute = torch.tensor([t is not None and bool(auto.walk(t, state)) for t in texts])
        brute[tokenizer.eos_token_id] = auto.complete(state)
        assert torch.equal(tc.allowed(state), brute), prefix


# -------------------------------------------------------------------- decoding (real model)
@pytest.fixture(scope="module")
def backend():
    from memsearch.backends.hf.backend import HFBackend

    b = HFBackend("embedded", device="cpu", max_batch_size=8)
    yield b
    run(b.aclose())


def memory_prompt():
    return prompts.memory_decision(
        "Were Scott Derrickson and Ed Wood of the same nationality?",
        "(empty)",
        "[d1:0] Scott Derrickson (born July 16, 1966) is an American director.\n"
        "[d2:0] Edward Davis Wood Jr. was an American filmmaker.",
        200,
    )


def reference_logprobs(backend, result, temperature: float, masks: torch.Tensor | None) -> list[float]:
    """Log-probs of the completion from one full forward pass (fp32, no cache, no padding),
    masked with the replayed masks (``None``: unmasked)."""
    ids = torch.tensor([list(result.prompt_ids) + list(result.completion_ids)])
    with torch.inference_mode():
        logits = backend.model(input_ids=ids).logits[0].float()
    logits = logits[len(result.prompt_ids) - 1 : -1] / temperature
    if masks is not None:
        allowed = torch.zeros_like(logits, dtype=torch.bool)
        allowed[:, : masks.shape[1]] = masks
        logits = logits.masked_fill(~allowed, float("-inf"))
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(1, torch.tensor(result.completion_ids)[:, None])[:, 0].tolist()


@pytest.mark.slow
def test_constrained_sampling_gives_ops_json_and_replayable_logprobs(backend):
    messages = memory_prompt()
    settings = [(1.0, 0), (1.0, 1), (0.0, None), (0.7, 2)]  # (temperature, seed)
    requests = [
        GenerationRequest(
            role="memory",
            messages=messages,
            constraint=MEMORY_OPS,
            sampling=SamplingParams(temperature=t, seed=s, max_tokens=120),
        )
        for t, s in settings
    ]
    plain = GenerationRequest(role="memory", messages=messages, sampling=SamplingParams(max_tokens=16))

    async def concurrently():
        return [r for (r,) in await asyncio.gather(*(backend.generate([r]) for r in [*requests, plain]))]

    *results, unconstrained = run(concurrently())
    tc = compile_constraint(MEMORY_OPS, backend.tokenizer)
    eos = backend.tokenizer.eos_token_id
    for (temperature, _), result in zip(settings, results, strict=True):
        assert result.ok and result.constraint_id == MEMORY_OPS.id
        ids = list(result.completion_ids)
        if result.finish_reason == "stop":
            assert ids[-1] == eos and eos not in ids[:-1]
            assert tc.automaton.accepts(result.text) and parse_ops(result.text).ok, result.text
            json.loads(result.text)
        else:
            assert result.finish_reason == "length" and len(ids) == 120
            assert tc.automaton.prefix_ok(result.text), result.text
        masks = tc.masks_for(ids)
        ref = reference_logprobs(backend, result, temperature or 1.0, masks)
        assert result.logprobs == pytest.approx(ref, abs=LOGPROB_TOL)
        if result.finish_reason == "stop":
            assert result.logprobs[-1] == pytest.approx(0.0, abs=LOGPROB_TOL)  # EOS was the only choice
    assert any(r.finish_reason == "stop" for r in results)
    assert unconstrained.constraint_id is None
    assert unconstrained.logprobs == pytest.approx(
        reference_logprobs(backend, unconstrained, 1.0, None), abs=LOGPROB_TOL
    )


@pytest.mark.slow
def test_choices_decode_and_bad_constraints_fail_their_request(backend):
    yes_no = Constraint("yes-no", choices=("yes", "no"))
    question = ({"role": "user", "content": "Is Paris in France? Answer yes or no."},)
    good, bad = backend.generate_sync(
        [
            GenerationRequest(
                role="reader", messages=question, constraint=yes_no, sampling=SamplingParams(max_tokens=8)
            ),
            GenerationRequest(
                role="reader", messages=question, constraint=Constraint("n", json_schema={"type": "number"})
            ),
        ]
    )
    assert good.finish_reason == "stop" and good.text in ("yes", "no") and good.constraint_id == "yes-no"
    assert bad.finish_reason == "error" and "unsupported schema type 'number'" in bad.error


# --------------------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def rules_env(hotpot_dev_dir):
    from memsearch.config import load_config
    from memsearch.data.dataset import load_dataset
    from memsearch.eval.runner import build_environment

    dataset = load_dataset(hotpot_dev_dir)
    cfg = load_config(
        RULES,
        [
            "budgets.max_searches=1",
            "budgets.passages_per_search=1",
            "budgets.evidence_tokens=64",
            "budgets.policy_tokens=80",
        ],
    )
    return build_environment(cfg, dataset), dataset.tasks[0]


def with_memory(env, **memory):
    data = env.config.model_dump(mode="json")
    data["backends"]["memory"].update(memory)
    return dataclasses.replace(env, config=type(env.config).model_validate(data))


def test_schema_mode_needs_an_hf_memory_backend(rules_env):
    from memsearch.engine.episode import run_episode

    env, task = rules_env
    traj = run(run_episode(task, env))
    assert [call.constraint_id for call in traj.policy_calls()] == [None, None]
    with pytest.raises(ValueError, match="backends.memory.schema_mode.*kind = 'hf'"):
        run(run_episode(task, with_memory(env, schema_mode=True)))


@pytest.mark.slow
def test_schema_mode_episode_records_the_constraint(rules_env, backend):
    from memsearch.engine.episode import run_episode

    env, task = rules_env
    env = with_memory(env, kind="hf", schema_mode=True)
    env = dataclasses.replace(env, backends={**env.backends, "memory": backend})  # rules controller and reader
    traj = run(run_episode(task, env))
    calls = traj.policy_calls()
    assert [(e.role, e.constraint_id) for e in calls] == [("memory", "memory-ops-v2-sources3"), ("reader", None)]
    memory = calls[0]
    assert memory.finish_reason == "stop", memory.text
    assert isinstance(json.loads(memory.text), dict) and parse_ops(memory.text).ok
    assert compile_constraint(MEMORY_OPS, backend.tokenizer).masks_for(memory.completion_ids).shape[0] == len(
        memory.completion_ids
    )

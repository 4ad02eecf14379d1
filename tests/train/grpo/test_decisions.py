"""The decision view of a GRPO step (``train.grpo.decisions``): the tokens that choose an op, found in
real token ids of the embedded tokenizer; the entropy the update logs at exactly those tokens; the
op histogram with invalid calls by cause."""

from __future__ import annotations

import pytest
import torch

from memsearch.records.trajectory import ENGINE_VERSION, Trajectory
from memsearch.train.grpo.batch import Batch, grpo_row
from memsearch.train.grpo.decisions import (
    DecisionRule,
    decision_characters,
    decision_positions,
    histogram_bucket,
    op_histogram,
)

OPS = ('{"ops": [{"op": "ADD", "text": "Paris is in France", "sources": ["d1:0"], "kind": "fact"}, '
       '{"op":"NOOP"}]}')


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from memsearch.assets.embedded import tokenizer_dir

    return AutoTokenizer.from_pretrained(str(tokenizer_dir()))


def row(tokenizer, prompt, text, k, *, advantage=0.0, valid=True, over_budget=False, credit="all"):
    """A complete GRPO row of ``text`` (trajectory ``k``) as the trainer builds it."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return grpo_row(prompt_ids=prompt, completion_ids=ids, logprobs=[0.0] * len(ids), trajectory=k, group_index=0,
                    role="memory", step=0, constraint_id=None, valid=valid, over_budget=over_budget,
                    advantage=advantage, decisions=DecisionRule(tokenizer, credit))


def test_decision_characters_by_role():
    assert [OPS[c:c + 4] for c in decision_characters(OPS, "memory")] == ["ADD\"", "NOOP"]
    assert decision_characters("I will SEARCH: capital of France, then FINISH", "controller") == [7]
    assert decision_characters("RESEARCH more", "controller") == []  # a word containing SEARCH is no choice
    assert decision_characters("any memory text", "overwrite") == []
    assert decision_characters('{"ops": [', "memory") == []  # cut before the op name: no decision


def test_decision_positions_are_the_tokens_that_start_each_op_name(tokenizer):
    ids = tokenizer.encode(OPS, add_special_tokens=False)
    positions = decision_positions(ids, tokenizer, "memory")
    assert len(positions) == 2
    for pos, name in zip(positions, ("ADD", "NOOP"), strict=True):
        before = tokenizer.decode(ids[:pos])
        through = tokenizer.decode(ids[: pos + 1])
        # the token at ``pos`` is the one whose text covers the op name's first letter
        assert before.endswith('"') and not before.endswith(f'"{name[0]}')
        assert through[len(before):].lstrip('"').startswith(name[0])
    assert decision_positions([], tokenizer, "memory") == []


def test_invalid_causes_and_the_op_histogram():
    def call(step, valid, executed=None, reason=None, role="memory", cause=None):
        """A policy call and, for a judged memory call, its step's memory event (the ops it executed)."""
        events = [{"type": "policy_call", "role": role, "step": step, "valid": valid, "invalid_reason": reason,
                   "invalid_cause": cause}]
        if role == "memory" and valid is not None:
            events.append({"type": "memory", "step": step, "valid": valid, "reason": reason, "cause": cause,
                           "executed": executed or {}})
        return events

    calls = [
        call(0, True, {"ADD": 2, "UPDATE": 0, "DELETE": 1, "NOOP": 0}),
        call(1, True, {"ADD": 0, "UPDATE": 0, "DELETE": 0, "NOOP": 1}),
        call(2, False, reason="parse error: no JSON object found", cause="parse"),
        call(3, False, reason="memory after the batch would be 90 tokens, over the budget of 64 tokens",
             cause="over_budget"),
        call(4, False, reason="op 0 (ADD): source 'd9:9' was not shown to the agent", cause="unshown_source"),
        call(5, None, reason="request failed: timeout", cause="request_failed"),  # a request error, not a decision
        call(0, True, {"NOOP": 1}, role="controller"),  # not a memory call
    ]
    events = [e for c in calls for e in c]
    current = Trajectory.from_json({"task_id": "q", "engine_version": ENGINE_VERSION, "events": events})
    assert op_histogram([current]) == {"ADD": 2, "UPDATE": 0, "DELETE": 1, "NOOP": 1, "invalid_parse": 1,
                                       "invalid_budget": 1, "invalid_rule": 1}
    assert op_histogram([current, current])["ADD"] == 4  # summed over trajectories
    assert histogram_bucket(None) == "invalid_rule"
    # The codes are read, never the reasons: an old record (no codes) is upgraded as it is read.
    legacy = [{k: v for k, v in e.items() if k not in ("invalid_cause", "cause")} for e in events]
    assert op_histogram([Trajectory.from_json({"task_id": "q", "events": legacy})]) == op_histogram([current])


def test_the_update_logs_the_entropy_at_the_decision_tokens_only(tiny_model_dir, tiny_adapter_dir, tokenizer):
    """``decision_entropy`` is the mean entropy at the deciding tokens, recomputed here from the
    same forward pass, and not the mean at the tokens next to them."""
    from memsearch.train.config import GRPOConfig, LoraSettings, OptimSettings
    from memsearch.train.distributed import Dist
    from memsearch.train.grpo.trainer import update
    from memsearch.train.logprobs import completion_logprobs
    from memsearch.train.policy import load_policy

    prompt = tokenizer.encode("Decide the memory ops.", add_special_tokens=False)
    texts = [OPS, '{"ops": [{"op": "NOOP"}]}']
    rows = [row(tokenizer, prompt, t, k, advantage=a) for k, (t, a) in enumerate(zip(texts, (0.5, -0.5), strict=True))]
    assert [len(r.decision_positions) for r in rows] == [2, 1]
    cfg = GRPOConfig(data="unused", lora=LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
                     optim=OptimSettings(lr=1e-2, max_grad_norm=None))
    policy, _, _ = load_policy(str(tiny_model_dir), str(tiny_adapter_dir), cfg.lora, device="cpu")
    with torch.no_grad():
        scored = completion_logprobs(policy, rows, tokenizer.eos_token_id, with_entropy=True)
    c_max = scored.entropy.shape[1]
    expected = [float(scored.entropy[k, c_max - len(r.completion_ids) + p])
                for k, r in enumerate(rows) for p in r.decision_positions]
    stats = update(policy, torch.optim.SGD(policy.parameters(), lr=0.0), Batch(rows=rows), cfg, Dist(),
                   tokenizer.eos_token_id)
    neighbours = [float(scored.entropy[k, c_max - len(r.completion_ids) + p + 1])
                  for k, r in enumerate(rows) for p in r.decision_positions]
    assert stats.decision_entropy == pytest.approx(sum(expected) / 3, rel=1e-6)
    assert stats.decision_entropy != pytest.approx(sum(neighbours) / 3, rel=1e-5)  # the check can tell them apart


def test_invalid_rows_lose_their_deciding_tokens_only(tiny_model_dir, tiny_adapter_dir, tokenizer):
    """``invalid_decision_credit = false``: the op-choosing tokens of invalid rows leave the loss
    (every other token stays), and the logged decision entropy is the mean over the valid rows'
    deciding tokens, not diluted by the masked ones."""
    from memsearch.train.config import GRPOConfig, LoraSettings, OptimSettings
    from memsearch.train.distributed import Dist
    from memsearch.train.grpo.trainer import update
    from memsearch.train.logprobs import completion_logprobs
    from memsearch.train.policy import load_policy

    prompt = tokenizer.encode("Decide the memory ops.", add_special_tokens=False)
    texts = [OPS, OPS, '{"ops": [{"op": "NOOP"}]}']
    rows = [row(tokenizer, prompt, t, k, advantage=a, valid=v, credit="none")
            for k, (t, a, v) in enumerate(zip(texts, (0.5, -0.5, 0.2), (True, False, False), strict=True))]
    assert Batch(rows=rows).masked_decision_tokens == 3  # two op names in the invalid ADD row, one in the invalid NOOP
    assert [len(r.decision_positions) for r in rows] == [2, 2, 1]  # found in invalid rows too
    for r in rows:
        expected = [1] * len(r.completion_ids)
        for p in ([] if r.valid else r.decision_positions):
            expected[p] = 0
        assert r.loss_mask == expected
    assert rows[0].completion_tokens == len(rows[0].completion_ids)
    assert rows[1].completion_tokens == len(rows[1].completion_ids) - 2
    kept = [row(tokenizer, prompt, t, k, valid=False, credit="all") for k, t in enumerate(texts)]
    assert Batch(rows=kept).masked_decision_tokens == 0  # credit "all": an invalid row keeps them

    cfg = GRPOConfig(data="unused", lora=LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
                     optim=OptimSettings(lr=1e-2, max_grad_norm=None), invalid_decision_credit=False)
    policy, _, _ = load_policy(str(tiny_model_dir), str(tiny_adapter_dir), cfg.lora, device="cpu")
    with torch.no_grad():
        scored = completion_logprobs(policy, rows[:1], tokenizer.eos_token_id, with_entropy=True)
    c_max = scored.entropy.shape[1]
    valid_only = [float(scored.entropy[0, c_max - len(rows[0].completion_ids) + p]) for p in rows[0].decision_positions]
    stats = update(policy, torch.optim.SGD(policy.parameters(), lr=0.0), Batch(rows=rows), cfg, Dist(),
                   tokenizer.eos_token_id)
    assert stats.decision_entropy == pytest.approx(sum(valid_only) / 2, rel=1e-5)


@pytest.mark.parametrize("setting, expected", [(True, "all"), (False, "none"), ("over_budget", "over_budget")])
def test_invalid_decision_credit_reads_the_old_booleans(setting, expected):
    from memsearch.train.config import GRPOConfig

    grouped = GRPOConfig(data="unused", credit={"invalid_decision_credit": setting})
    flat = GRPOConfig(data="unused", invalid_decision_credit=setting)  # the earlier spelling
    assert grouped.credit.invalid_decision_credit == flat.credit.invalid_decision_credit == expected


def test_over_budget_rows_keep_their_deciding_tokens_when_asked(tokenizer):
    """``invalid_decision_credit = "over_budget"``: an item error (cut off, unshown source) loses
    its op tokens, an over-budget batch keeps them (the choice to add is its error)."""
    prompt = tokenizer.encode("Decide the memory ops.", add_special_tokens=False)
    n = len(tokenizer.encode(OPS, add_special_tokens=False))
    flags = [(False, True), (False, False), (True, False)]  # (valid, over_budget)
    rows = [row(tokenizer, prompt, OPS, k, valid=v, over_budget=o, credit="over_budget")
            for k, (v, o) in enumerate(flags)]
    assert Batch(rows=rows).masked_decision_tokens == 2  # the item error's two op names only
    assert [r.completion_tokens for r in rows] == [n, n - 2, n]
    rows = [row(tokenizer, prompt, OPS, k, valid=v, over_budget=o, credit="none") for k, (v, o) in enumerate(flags)]
    assert Batch(rows=rows).masked_decision_tokens == 4  # without the exception the over-budget row loses its two too
    assert [r.completion_tokens for r in rows] == [n - 2, n - 2, n]


def test_a_row_is_frozen_once_built(tokenizer):
    """Nothing finishes a row after ``grpo_row``: its fields cannot be reassigned."""
    import dataclasses

    r = row(tokenizer, tokenizer.encode("Decide.", add_special_tokens=False), OPS, 0, advantage=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.advantage = 1.0  # type: ignore[misc]

"""Adding a backend kind: one class answering the ``PolicyBackend`` protocol, its settings model
(the keys it reads), one ``register_backend`` call. Configs may then name the kind and set its
keys, and a real eval runs through it.

The kind here abstains: every memory call keeps nothing (NOOP), every reader call answers its
``answer`` setting ("unknown" unless set) and cites nothing. Through the real engine and scorer
on real dev questions that must give a run with no invalid action, an empty memory and zero on
every answer metric, while the retrieval (the fixed plan, no model) is the rules run's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from memsearch.backends import (
    GenerationRequest,
    GenerationResult,
    Usage,
    backend_kinds,
    make_backend,
    register_backend,
    unregister_backend,
)
from memsearch.config import BackendConfig, load_config
from memsearch.errors import InputError
from memsearch.eval.runner import run_eval
from memsearch.tokenizer import LexicalTokenizer

RULES = Path(__file__).resolve().parents[2] / "configs" / "rules.toml"
ROLES = ("memory", "controller", "reader")


class AbstainSettings(BackendConfig):
    """The abstain kind's keys: the common ones and what its reader answers."""

    kind: Literal["abstain"] = Field("abstain", description="abstain: keeps nothing, answers `answer`")
    answer: str = Field("unknown", description="What every reader call answers")


class AbstainBackend:
    """Keeps nothing, asks nothing, knows nothing."""

    name = "abstain"

    def __init__(self, answer: str = "unknown") -> None:
        self.answer = answer

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        answers = {"memory": '{"ops": [{"op": "NOOP"}]}', "controller": "FINISH",
                   "reader": f"Answer: {self.answer}\nEvidence:"}
        return [GenerationResult(answers[r.role], usage=Usage(source="none")) for r in requests]

    async def aclose(self) -> None:
        return None


@pytest.fixture
def abstain():
    register_backend("abstain", lambda cfg, tokenizer, dataset: AbstainBackend(cfg.answer), settings=AbstainSettings,
                     runs_model=False)
    yield "abstain"
    unregister_backend("abstain")


def _abstaining(*extra: str):
    return load_config(RULES, [*(f'backends.{role}.kind="abstain"' for role in ROLES), "limit=6", *extra])


def test_a_registered_backend_runs_a_real_eval(abstain, hotpot_dev_dir, tmp_path):
    assert backend_kinds() == ("rules", "hf", "openai", "oracle", "abstain")
    assert isinstance(make_backend(_abstaining().backends.reader, LexicalTokenizer()), AbstainBackend)
    summary = run_eval(_abstaining(), hotpot_dev_dir, tmp_path / "abstain", show_progress=False)
    rules = run_eval(load_config(RULES, ["limit=6"]), hotpot_dev_dir, tmp_path / "rules", show_progress=False)
    metrics = summary.metrics
    assert summary.tasks.scored == 6 and summary.complete
    assert summary.config["backends"]["memory"] == {
        "kind": "abstain", "sampling": {"temperature": 0.0, "top_p": 1.0, "seed": 0}, "schema_mode": False,
        "answer": "unknown"}
    assert summary.memory_backend.to_json() | {"served_identity": None} == {
        "kind": "abstain", "model": "embedded", "adapter": None, "base_url": None, "name": "abstain",
        "served_identity": None}
    # 3 searches, a NOOP after each, then the reader: 4 valid calls per task, nothing kept.
    assert metrics["policy_calls"] == 4.0 and metrics["invalid_actions"] == 0.0
    assert summary.memory_ops == {"ops_ADD": 0, "ops_DELETE": 0, "ops_NOOP": 18, "ops_UPDATE": 0}
    assert metrics["memory_support_recall"] == 0.0
    assert metrics["em"] == metrics["f1"] == metrics["citation_precision"] == 0.0
    assert metrics["retrieval_support_recall"] == rules.metrics["retrieval_support_recall"] > 0.8
    trajectories = [json.loads(line) for line in (tmp_path / "abstain" / "trajectories.jsonl").read_text().splitlines()]
    assert {t["prediction"] for t in trajectories} == {"unknown"}


def test_the_kind_reads_its_own_keys_and_refuses_the_others(abstain, tmp_path, hotpot_dev_dir):
    cfg = _abstaining('backends.reader.answer="Paris"')
    assert isinstance(cfg.backends.reader, AbstainSettings) and cfg.backends.reader.answer == "Paris"
    assert cfg.backends.memory.answer == "unknown"
    summary = run_eval(_abstaining('backends.reader.answer="Paris"', "limit=2"), hotpot_dev_dir, tmp_path / "paris",
                       show_progress=False)
    trajectories = (tmp_path / "paris" / "trajectories.jsonl").read_text().splitlines()
    assert summary.tasks.scored == 2 and {json.loads(t)["prediction"] for t in trajectories} == {"Paris"}
    # Its key is no other kind's, and theirs are not its: each refusal names the key, its kind and this one.
    with pytest.raises(InputError, match=r"backends\.reader\.answer: read by kind 'abstain' only; kind is 'rules'"):
        load_config(RULES, ['backends.reader.answer="Paris"'])
    with pytest.raises(InputError, match="kind 'abstain' runs no model, so model is never read; remove it, or "
                       "set kind = 'hf' or 'openai'"):
        _abstaining('backends.reader.model="no/such/folder"')
    with pytest.raises(InputError, match=r"backends\.reader\.timeout_s: read by kind 'openai' only \(an HTTP "
                       r"server\); kind is 'abstain'"):
        _abstaining("backends.reader.timeout_s=5")
    # It cannot constrain memory operations.
    with pytest.raises(InputError, match="schema_mode = true needs backends.memory.kind = 'hf' or 'openai'"):
        _abstaining("backends.memory.schema_mode=true")
    with pytest.raises(ValueError, match="backend kind 'abstain' is registered already"):
        register_backend("abstain", lambda cfg, tokenizer, dataset: AbstainBackend())


def test_an_unregistered_kind_is_refused_naming_the_registered_ones():
    assert "abstain" not in backend_kinds()  # the fixture's teardown took it away
    with pytest.raises(InputError) as info:
        _abstaining()
    assert ("backends.memory.kind: unknown backend kind 'abstain'; registered: 'rules', 'hf', 'openai' or "
            "'oracle'") in str(info.value)

"""``engine.environment``: the one builder of a run's shared parts (evaluation, GRPO and verl
use it), on real HotpotQA dev questions with the real BM25 retriever and rules backends."""

from __future__ import annotations

import asyncio

from memsearch.backends.rules import RulesBackend
from memsearch.config import RunConfig
from memsearch.data.dataset import load_dataset
from memsearch.engine.environment import build_shared, close_backends, close_environment
from memsearch.engine.episode import Environment, run_episode
from memsearch.records.trajectory import CALL_ROLES
from memsearch.retrieval import BM25Retriever


def search_config(**backends) -> RunConfig:
    """Search evidence over BM25, every role on the rules backend unless ``backends`` says."""
    return RunConfig.model_validate({"tokenizer": "lexical", "agent": {"evidence": "search"},
                                     "retrieval": {"method": "bm25"}, "backends": backends})


class Closing:
    """A real backend that counts its ``aclose`` calls."""

    def __init__(self, backend):
        self.backend, self.closed, self.name = backend, 0, backend.name

    async def generate(self, requests):
        return await self.backend.generate(requests)

    async def aclose(self):
        self.closed += 1


def test_builds_tokenizer_retriever_and_one_backend_per_distinct_config(hotpot_dev_dir):
    dataset = load_dataset(hotpot_dev_dir)
    shared = build_shared(search_config(), dataset)
    assert shared.tokenizer.name == "lexical-v1"
    assert isinstance(shared.retriever, BM25Retriever)
    assert shared.documents == dataset.documents_by_id()
    # Roles whose configs differ only in sampling share one backend, so one local model serves them.
    assert list(shared.backends) == list(CALL_ROLES)
    assert isinstance(shared.backends["memory"], RulesBackend)
    assert len({id(b) for b in shared.backends.values()}) == 1
    task = dataset.tasks[0]
    passages = shared.retriever.search(task.question, k=3, candidates=task.doc_ids)
    assert passages and all(p.doc_id in task.doc_ids for p in passages)

    env = shared.environment(search_config(), group="A")
    assert isinstance(env, Environment) and env.group == "A" and env.retriever is shared.retriever
    traj = asyncio.run(run_episode(task, env))
    assert traj.status == "ok" and traj.counts.searches > 0


def test_sampling_alone_does_not_split_a_backend_but_another_setting_does(hotpot_dev_dir):
    dataset = load_dataset(hotpot_dev_dir)
    shared = build_shared(search_config(reader={"sampling": {"temperature": 0.7}}), dataset)
    assert shared.backends["reader"] is shared.backends["memory"]
    shared = build_shared(search_config(reader={"schema_mode": True}), dataset)  # a setting rules has besides sampling
    assert shared.backends["reader"] is not shared.backends["memory"]
    assert shared.backends["controller"] is shared.backends["memory"]


def test_left_out_roles_are_answered_by_the_caller_and_closed_once(hotpot_dev_dir):
    dataset = load_dataset(hotpot_dev_dir)
    config = search_config()
    shared = build_shared(config, dataset, leave_out=("memory",))
    assert "memory" not in shared.backends and set(shared.backends) == {"controller", "reader"}
    policy = Closing(RulesBackend(shared.tokenizer))
    env = shared.environment(config, "grpo", answered_by={"memory": policy})
    assert list(env.backends) == list(CALL_ROLES)
    assert env.backends["memory"] is policy and env.backends["reader"] is shared.backends["reader"]
    traj = asyncio.run(run_episode(dataset.tasks[1], env))
    assert traj.policy_calls(["memory"])

    both = {"memory": policy, "reader": policy}  # one backend in two roles is closed once
    asyncio.run(close_backends(both))
    assert policy.closed == 1
    asyncio.run(close_environment(env))
    assert policy.closed == 2

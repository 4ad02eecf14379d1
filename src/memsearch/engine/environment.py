"""What the episodes of one run share, built in one place for evaluation, GRPO and verl.

    shared = build_shared(config, dataset)                     # `memsearch eval`
    env = shared.environment(config, group="A")
    ...
    await close_environment(env)

    shared = build_shared(episode, dataset, leave_out={"memory"})   # a trainer answers "memory"
    env = shared.environment(config_k, "grpo", answered_by={"memory": policy_backend})

``build_shared`` builds, in this order, the budget tokenizer (``config.tokenizer``), the retriever
of the ``[retrieval]`` table when the agent searches (BM25 / dense / hybrid in process, a built
index, or the retrieval service at ``retrieval.url``) and one backend per distinct backend config
of the roles not left out: roles whose configs differ only in sampling share one backend, so one
local model serves them all. The documents by id come with them.

The caller owns what was built. ``close_environment`` closes an environment's backends (each
shared one once) and then its retriever's connection pool (the retrieval service's client is the
only retriever that holds one); ``close_backends`` closes backends alone. A backend passed in
through ``answered_by`` belongs to whoever passed it: it is closed with the environment only when
that caller closes the environment.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from memsearch.backends.base import PolicyBackend
from memsearch.config import RunConfig
from memsearch.data.dataset import Dataset
from memsearch.data.records import Document
from memsearch.engine.episode import Environment
from memsearch.records.trajectory import CALL_ROLES
from memsearch.retrieval import Retriever
from memsearch.tokenizer import Tokenizer


@dataclass
class SharedParts:
    """The tokenizer, documents, retriever and backends every episode of a run uses."""

    tokenizer: Tokenizer  # counts the budgets
    documents: dict[str, Document]
    retriever: Retriever | None
    backends: dict[str, PolicyBackend]  # by call role, in ``CALL_ROLES`` order; left-out roles absent

    def environment(
        self, config: RunConfig, group: str = "", answered_by: Mapping[str, PolicyBackend] | None = None,
        branches: int = 1,
    ) -> Environment:
        """An ``Environment`` for ``config``; ``answered_by`` gives the roles that were left out
        (e.g. the trained roles, answered by the live policy: the only roles whose calls ask for
        log-probs); ``branches`` > 1 draws that many completions at every memory call (GRPO's
        state groups, ``train.grpo.state_credit``)."""
        backends = self.backends_with(answered_by or {})
        return Environment(config, self.tokenizer, self.documents, backends, self.retriever, group, branches,
                           logprob_roles=frozenset(answered_by or ()))

    def backends_with(self, answered_by: Mapping[str, PolicyBackend]) -> dict[str, PolicyBackend]:
        """Every call role's backend, in ``CALL_ROLES`` order: ``answered_by``'s where it gives
        one, else the one built here."""
        return {role: answered_by[role] if role in answered_by else self.backends[role] for role in CALL_ROLES}


def build_shared(config: RunConfig, dataset: Dataset, leave_out: Collection[str] = ()) -> SharedParts:
    """Build the shared parts of ``config``'s episodes over ``dataset``; no backend is built for
    the roles in ``leave_out`` (the caller answers them)."""
    from memsearch.backends import make_backend
    from memsearch.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(config.tokenizer)
    retriever = None
    if config.agent.evidence == "search":
        from memsearch.retrieval.index import make_retriever

        retriever = make_retriever(config.retrieval, dataset.documents)
    by_config: dict[str, Any] = {}
    backends = {}
    for role in CALL_ROLES:
        if role in leave_out:
            continue
        cfg = getattr(config.backends, role)
        key = json.dumps(cfg.model_dump(mode="json", exclude={"sampling"}), sort_keys=True)
        if key not in by_config:
            by_config[key] = make_backend(cfg, tokenizer, dataset)
        backends[role] = by_config[key]
    return SharedParts(tokenizer, dataset.documents_by_id(), retriever, backends)


async def close_backends(backends: Mapping[str, PolicyBackend]) -> None:
    """Close each distinct backend once (roles may share one), in role order."""
    for backend in {id(b): b for b in backends.values()}.values():
        await backend.aclose()


async def close_environment(env: Environment) -> None:
    """Close the environment's backends, then its retriever's connection pool if it has one."""
    await close_backends(env.backends)
    if hasattr(env.retriever, "aclose"):
        await env.retriever.aclose()

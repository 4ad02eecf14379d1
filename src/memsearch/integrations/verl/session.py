"""One verl session = one memsearch episode: what a worker shares, and how one task is rolled out.

verl builds an agent loop *per sample*, so everything expensive (the GRPO config, the prepared
data folder, the retriever of the episode's [retrieval] table, the untrained roles' backends,
the budget tokenizer) is built once per worker process by ``worker_setup`` (cached by its
arguments) and shared by every session.

``run_session`` runs ``memsearch.engine.episode.run_episode`` unchanged: the trained role(s)
(``train.rows.TRAINED_CALL_ROLES``) answer through the given policy backend (verl's server), the
others keep their configured backends (rules, a frozen model over HTTP, the local hf model),
with the same episode config the reference trainer rolls out with.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memsearch.config import RunConfig
from memsearch.data.records import Task
from memsearch.engine.episode import Environment, run_episode
from memsearch.integrations.verl.outputs import reward_summary, session_outputs
from memsearch.train.config import GRPOConfig
from memsearch.train.rows import TRAINED_CALL_ROLES

ROLES = ("memory", "controller", "reader")


@dataclass
class WorkerSetup:
    """What every session of one worker process shares."""

    cfg: GRPOConfig
    episode: RunConfig  # the episode config of the rollouts (trained roles marked hf, as the trainer does)
    tasks: dict[str, Task]
    documents: dict[str, Any]
    retriever: Any
    tokenizer: Any  # counts the budgets (episode.tokenizer)
    backends: dict[str, Any]  # the untrained roles' backends
    fingerprint: str  # SHA-256 of the data folder's manifest (the parquet's extra_info.dataset_sha256)


@functools.lru_cache(maxsize=4)
def worker_setup(train_config: str, data: str | None = None, overrides: tuple[str, ...] = ()) -> WorkerSetup:
    """Load the GRPO config and its data once per process (``data`` overrides the config's folder)."""
    from memsearch.backends import make_backend
    from memsearch.data.dataset import load_dataset
    from memsearch.integrations.verl.config import load_grpo_config
    from memsearch.io import sha256_file
    from memsearch.tokenizer import load_tokenizer
    from memsearch.train.grpo import trained_role_backends

    cfg = load_grpo_config(Path(train_config), list(overrides), data)
    dataset = load_dataset(cfg.data)
    episode = RunConfig.model_validate(trained_role_backends(cfg, cfg.episode.model_dump(mode="json")))
    tokenizer = load_tokenizer(episode.tokenizer)
    retriever = None
    if episode.agent.evidence == "search":
        from memsearch.retrieval.index import make_retriever

        # The episode's [retrieval] table, as in `memsearch eval` and GRPO: BM25/dense/hybrid in
        # process, a built index, or the shared service (`retrieval.url`), which lets hundreds of
        # rollout workers on many nodes search one index.
        retriever = make_retriever(episode.retrieval, dataset.documents)
    trained = set(TRAINED_CALL_ROLES[cfg.role])
    shared: dict[str, Any] = {}
    backends: dict[str, Any] = {}
    for role in ROLES:
        if role in trained:
            continue
        bcfg = getattr(episode.backends, role)
        key = json.dumps(bcfg.model_dump(mode="json", exclude={"sampling"}), sort_keys=True)
        if key not in shared:  # roles with the same backend config share one backend (one local model)
            shared[key] = make_backend(bcfg, tokenizer, dataset)
        backends[role] = shared[key]
    return WorkerSetup(cfg, episode, {t.id: t for t in dataset.tasks}, dataset.documents_by_id(), retriever,
                       tokenizer, backends, sha256_file(Path(cfg.data) / "manifest.json"))


def setup_for_row(train_config: str, extra_info: dict[str, Any], data: str | None = None,
                  overrides: tuple[str, ...] = ()) -> WorkerSetup:
    """The setup of a parquet row: its own data folder (``extra_info.data_dir``, when it exists
    here; else ``data``), checked against the row's fingerprint, so train and validation files
    exported from different folders both work and a moved or rebuilt folder is refused."""
    folder = extra_info.get("data_dir")
    if not folder or not Path(folder).is_dir():
        folder = data
    setup = worker_setup(train_config, folder, overrides)
    expected = extra_info.get("dataset_sha256")
    if expected and expected != setup.fingerprint:
        raise ValueError(f"task {extra_info.get('task_id')}: the parquet was exported from another data folder than "
                         f"{setup.cfg.data} (manifest SHA-256 differs); export it again or give that folder")
    if extra_info.get("role") and extra_info["role"] != setup.cfg.role:
        raise ValueError(f"task {extra_info.get('task_id')}: the parquet was exported for role {extra_info['role']!r}, "
                         f"the config trains {setup.cfg.role!r}")
    return setup


async def run_session(setup: WorkerSetup, task_id: str, policy: Any) -> tuple[dict[str, Any], list[dict[str, Any]],
                                                                                dict[str, Any]]:
    """Roll out one task: ``(trajectory, outputs in episode order, reward summary)``.

    ``policy`` answers the trained role(s); the outputs are ``outputs.session_outputs``.
    """
    task = setup.tasks.get(task_id)
    if task is None:
        raise KeyError(
            f"task {task_id!r} is not in the data folder {setup.cfg.data}: export the parquet from the same folder"
        )
    backends = dict(setup.backends)
    for role in TRAINED_CALL_ROLES[setup.cfg.role]:
        backends[role] = policy
    env = Environment(setup.episode, setup.tokenizer, setup.documents, backends, setup.retriever, group="verl")
    trajectory = await run_episode(task, env)
    return trajectory, session_outputs(trajectory, setup.cfg.role), reward_summary(trajectory, setup.cfg.role)

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memsearch.config import RunConfig
from memsearch.data.records import Task
from memsearch.engine.environment import SharedParts
from memsearch.engine.episode import run_episode
from memsearch.integrations.verl.outputs import reward_summary, session_outputs
from memsearch.records.trajectory import Trajectory
from memsearch.train.config import GRPOConfig
from memsearch.train.rows import TRAINED_CALL_ROLES, upgrade_trained_role


@dataclass
class WorkerSetup:
    """What every session of one worker process shares. Nothing here is closed: it lives as long
    as the worker process."""

    cfg: GRPOConfig
    episode: RunConfig  # the episode config of the rollouts (trained roles marked hf, as the trainer does)
    tasks: dict[str, Task]
    shared: SharedParts  # budget tokenizer, documents, retriever, and the untrained roles' backends
    fingerprint: str  # SHA-256 of the data folder's manifest (the parquet's extra_info.dataset_sha256)

    @property
    def backends(self) -> dict[str, Any]:
        """The untrained roles' backends (each session adds the policy for the trained ones)."""
        return self.shared.backends


@functools.lru_cache(maxsize=4)
def worker_setup(train_config: str, data: str | None = None, overrides: tuple[str, ...] = ()) -> WorkerSetup:
    """Load the GRPO config and its data once per process (``data`` overrides the config's folder)."""
    from memsearch.data.dataset import load_dataset
    from memsearch.engine.environment import build_shared
    from memsearch.integrations.verl.config import load_grpo_config
    from memsearch.io import sha256_file
    from memsearch.train.grpo.trainer import trained_role_backends

    cfg = load_grpo_config(Path(train_config), list(overrides), data)
    dataset = load_dataset(cfg.data)
    episode = trained_role_backends(cfg)
    # The episode's [retrieval] table, as in `memsearch eval` and GRPO; the shared service
    # (`retrieval.url`) lets hundreds of rollout workers on many nodes search one index.
    shared = build_shared(episode, dataset, leave_out=TRAINED_CALL_ROLES[cfg.role])
    return WorkerSetup(cfg, episode, {t.id: t for t in dataset.tasks}, shared,
                       sha256_file(Path(cfg.data) / "manifest.json"))


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
    # a parquet exported before the MemAgent role was renamed says "overwrite" (train.rows.EARLIER_ROLE_NAMES)
    if extra_info.get("role") and upgrade_trained_role(extra_info["role"]) != setup.cfg.role:
        raise ValueError(f"task {extra_info.get('task_id')}: the parquet was exported for role {extra_info['role']!r}, "
                         f"the config trains {setup.cfg.role!r}")
    return setup


async def run_session(setup: WorkerSetup, task_id: str, policy: Any) -> tuple[Trajectory, list[dict[str, Any]],
                                                                                dict[str, Any]]:
    """Roll out one task: ``(trajectory, outputs in episode order, reward summary)``.

    ``policy`` answers the trained role(s); the outputs are ``outputs.session_outputs``.
    """
    task = setup.tasks.get(task_id)
    if task is None:
        raise KeyError(
            f"task {task_id!r} is not in the data folder {setup.cfg.data}: export the parquet from the same folder"
        )
    trained = {role: policy for role in TRAINED_CALL_ROLES[setup.cfg.role]}
    env = setup.shared.environment(setup.episode, group="verl", answered_by=trained)
    trajectory = await run_episode(task, env)
    return trajectory, session_outputs(trajectory, setup.cfg.role), reward_summary(trajectory, setup.cfg.role)

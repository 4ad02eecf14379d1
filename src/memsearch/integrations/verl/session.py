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
from memsearch.data.records import Label, Task
from memsearch.engine.environment import SharedParts
from memsearch.engine.episode import run_episode
from memsearch.integrations.verl.credit import CreditRecord
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
    labels: dict[str, Label]  # read only for state credit's per-call reward, on the training folder's rows
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
    return WorkerSetup(cfg, episode, {t.id: t for t in dataset.tasks}, dataset.labels_by_id(), shared,
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


async def run_session(setup: WorkerSetup, task_id: str, policy: Any, *, training: bool = True,
                      session: str | None = None) -> SessionRollout:
    """Roll out one task (``policy`` answers the trained role(s)).

    ``training``: the row comes from the folder the config trains on. Only such a row is rolled
    out with the config's credit: under ``credit.mode = "state"`` its memory calls branch
    (``state_group_size`` completions each) and its labels give the per-call rewards; a
    validation row is one plain episode (verl only scores it). ``session``: verl's
    ``{uid}_{session_id}``, written into the rows' credit records.
    """
    task = setup.tasks.get(task_id)
    if task is None:
        raise KeyError(
            f"task {task_id!r} is not in the data folder {setup.cfg.data}: export the parquet from the same folder"
        )
    credit = setup.cfg.credit if training else None
    state = credit is not None and credit.mode == "state"
    trained = {role: policy for role in TRAINED_CALL_ROLES[setup.cfg.role]}
    env = setup.shared.environment(setup.episode, group="verl", answered_by=trained,
                                   branches=credit.state_group_size if state else 1)
    trajectory = await run_episode(task, env)
    gold = set(setup.labels[task_id].supporting_facts) if state else None
    outputs, records = session_outputs(trajectory, setup.cfg.role, credit, gold, session)
    return SessionRollout(trajectory, outputs, records, reward_summary(trajectory, setup.cfg.role))


@dataclass(frozen=True)
class SessionRollout:
    """One session: its trajectory, its rows as verl output fields (``outputs.session_outputs``),
    each row's credit record, and the reward summary ``compute_score`` reads."""

    trajectory: Trajectory
    outputs: list[dict[str, Any]]
    records: list[CreditRecord]
    summary: dict[str, Any]

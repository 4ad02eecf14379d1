"""The trainers' periodic evaluation, answered by the model the trainer already holds.

Built from the run config, the evaluation's ``hf`` backends would load a second copy of the base
model (and merge the adapter into it) on rank 0 every ``eval.every`` steps, beside the policy on
its GPU. Here the trained roles are answered by ``hf`` backends built on
the loaded ``(model, tokenizer)`` (``HFBackend(loaded=...)``): the live policy in eval mode (it
holds exactly the adapter the checkpoint saved at that step), or the GRPO trainer's merged copy
of it refreshed to the same weights (``policy.MergedSampler``: ``W + scale * B @ A``, the very
product ``memsearch eval`` computes when it merges the saved adapter). Decoding is greedy and
runs in inference mode (``BatchDecoder.run``), so nothing of it enters autograd, and gradient
checkpointing (grad mode only) stays out of it.

The records are those ``memsearch eval`` writes for the saved adapter: the config still names
the role's ``model`` and ``adapter`` (``config.json``; ``run.json`` fingerprints the adapter's
files), only no second model is loaded. One difference, stated: the live model keeps the
trainer's ``dtype``, where ``memsearch eval`` loads ``"auto"`` (bfloat16 on a GPU); on a CPU both
are float32, and ``tests/train/test_live_eval.py`` checks the metrics are equal.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from memsearch.config import RunConfig
from memsearch.records.run_summary import RunSummary


def live_backends(config: RunConfig, roles: Collection[str], model, tokenizer) -> dict[str, Any]:
    """One ``hf`` backend on ``(model, tokenizer)`` answering ``roles`` and every other call role
    whose backend config equals one of theirs up to sampling (``engine.environment.build_shared``
    gives such roles one backend: they are the same model). One backend, not one per config: a
    model decodes in one batcher (as GRPO's rollouts do), never from two threads at once. Its
    batch holds the largest ``max_concurrency`` of those roles."""
    from memsearch.backends.hf.backend import HFBackend
    from memsearch.records.trajectory import CALL_ROLES

    def key(role: str) -> str:
        return json.dumps(getattr(config.backends, role).model_dump(mode="json", exclude={"sampling"}), sort_keys=True)

    for role in roles:
        if getattr(config.backends, role).kind != "hf":
            raise ValueError(f"backends.{role}.kind is {getattr(config.backends, role).kind!r}; the trained "
                             "role's backend is 'hf'")
    trained = {key(role) for role in roles}
    answered = [role for role in CALL_ROLES if key(role) in trained]
    first = getattr(config.backends, answered[0])
    backend = HFBackend(model=first.model, adapter=first.adapter, loaded=(model, tokenizer),
                        max_batch_size=max(getattr(config.backends, role).max_concurrency for role in answered))
    return dict.fromkeys(answered, backend)


def evaluate_live(config: RunConfig, roles: Collection[str], model, tokenizer, data: str | Path,
                  out: Path) -> RunSummary:
    """``run_eval(config, data, out)`` with ``roles`` answered by ``model`` (module doc); returns
    the summary. The device's cached blocks are released afterwards."""
    import asyncio

    from memsearch.engine.environment import close_backends
    from memsearch.eval.runner import run_eval
    from memsearch.train.policy import release_cached_memory

    backends = live_backends(config, roles, model, tokenizer)
    try:
        return run_eval(config, data, out, show_progress=False, answered_by=backends)
    finally:
        asyncio.run(close_backends(backends))  # closed by the run already, unless it refused to start
        release_cached_memory(model)

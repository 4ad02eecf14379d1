"""Paired bootstrap comparison of two groups scored on the same tasks.

    from memsearch.eval.bootstrap import paired_bootstrap

    result = paired_bootstrap(f1_group_a, f1_group_b, n_resamples=10_000, seed=0)
    print(f"{result['diff']:+.3f} [{result['ci_low']:+.3f}, {result['ci_high']:+.3f}]")

``a[i]`` and ``b[i]`` must be the same task's metric under the two groups. Each resample draws
task indices with replacement and takes the mean of the per-task differences, so variation
shared by both groups (an easy or a hard task) cancels: a constant improvement has a zero-width
interval. Tasks where a metric is ``None`` must be dropped from both groups by the caller
before calling; ``None`` and NaN are refused here rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memsearch.config import MAX_BOOTSTRAP_RESAMPLES

# Resampled indices held in memory at once (int64): bounds memory for large question sets.
_MAX_CELLS_PER_CHUNK = 2_000_000


def _as_array(values: Sequence[float], name: str) -> Any:
    import numpy as np

    if isinstance(values, str):
        raise TypeError(f"{name} must be a sequence of numbers, not a string")
    items = list(values)
    for i, value in enumerate(items):
        if value is None:
            raise ValueError(
                f"{name}[{i}] is None: drop that task from both groups before a paired comparison"
            )
    try:
        array = np.asarray(items, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must hold only numbers: {exc}") from None
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        raise ValueError(f"{name}[{int(bad[0])}] is {array[bad[0]]}: every value must be finite")
    return array


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Mean difference ``mean(a) - mean(b)`` with a paired percentile bootstrap interval.

    Returns ``mean_a``, ``mean_b``, ``diff``, ``ci_low``, ``ci_high`` (percentiles
    ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` of the resampled mean differences),
    ``n`` (tasks), ``p_value`` (two-sided), and the ``n_resamples``, ``confidence`` and ``seed``
    used. The p-value tests "no difference" by centring the bootstrap distribution on 0:
    ``(1 + #{|d*_b - diff| >= |diff|}) / (1 + n_resamples)``; it is never 0 and is 1 when
    ``diff`` is 0. With a single task there is no variability to resample and ``p_value`` is
    ``None``.

    Deterministic for a given ``seed``: indices come from ``numpy.random.default_rng(seed)``.
    Raises ``ValueError`` for empty input, unequal lengths, non-finite / ``None`` values, or
    more than ``memsearch.config.MAX_BOOTSTRAP_RESAMPLES`` resamples (the bound a config is
    checked against at load).
    """
    import numpy as np

    x = _as_array(a, "a")
    y = _as_array(b, "b")
    if x.size != y.size:
        raise ValueError(
            f"paired bootstrap needs one value per task in each group: len(a)={x.size}, len(b)={y.size}"
        )
    if x.size == 0:
        raise ValueError("paired bootstrap needs at least one task; both groups are empty")
    whole = isinstance(n_resamples, int) and not isinstance(n_resamples, bool)
    if not whole or not 1 <= n_resamples <= MAX_BOOTSTRAP_RESAMPLES:
        raise ValueError(f"n_resamples must be an integer from 1 to {MAX_BOOTSTRAP_RESAMPLES:,}, got {n_resamples!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")

    n = int(x.size)
    differences = x - y
    diff = float(differences.mean())

    rng = np.random.default_rng(seed)
    boot = np.empty(n_resamples, dtype=np.float64)
    rows_per_chunk = max(1, _MAX_CELLS_PER_CHUNK // n)
    for start in range(0, n_resamples, rows_per_chunk):
        stop = min(start + rows_per_chunk, n_resamples)
        indices = rng.integers(0, n, size=(stop - start, n))
        boot[start:stop] = differences[indices].mean(axis=1)

    alpha = 1.0 - confidence
    ci_low, ci_high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])

    p_value: float | None = None
    if n > 1:
        extreme = int(np.count_nonzero(np.abs(boot - diff) >= abs(diff)))
        p_value = (1 + extreme) / (1 + n_resamples)

    return {
        "mean_a": float(x.mean()),
        "mean_b": float(y.mean()),
        "diff": diff,
        "ci_low": float(ci_low),
        "ci_high": float(ci_high),
        "n": n,
        "p_value": p_value,
        "n_resamples": n_resamples,
        "confidence": confidence,
        "seed": seed,
    }


__all__ = ["paired_bootstrap"]

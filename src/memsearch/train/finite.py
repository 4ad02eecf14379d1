"""Stop a trainer at the first non-finite loss, gradient norm or weight.

One NaN spreads to every weight at the next optimizer step; training on would write NaN
checkpoints and a NaN final adapter that the pipelines merge, evaluate and report as a result.
The checks run where the value first exists: the loss and the gradient norm before the
optimizer step, the weights right after it, so no checkpoint or adapter holds a non-finite
value. Every rank sees the same summed loss, the same all-reduced gradients and so the same
weights: all ranks stop at the same step.
"""

from __future__ import annotations

import math

import torch

from memsearch.errors import InputError

_ADVICE = "lower optim.lr, set optim.max_grad_norm, or check the data"


class NonFiniteError(InputError):
    """Training produced a NaN or infinite value; the message names the step and the value. An
    ``InputError`` (the CLI exits with status 2): the remedy is a change to the recipe."""


def require_finite(step: int, name: str, value: float, applied: bool = False) -> None:
    """``NonFiniteError`` unless ``value`` (``name`` at optimizer step ``step``) is finite;
    called before the step is applied (``applied``: after, but before it is saved)."""
    if not math.isfinite(value):
        when = "saved" if applied else "applied or saved"
        raise NonFiniteError(f"step {step}: {name} is {value}, expected a finite number; training stopped before "
                             f"this step was {when} (the checkpoints hold finite weights): {_ADVICE}")


def require_finite_weights(step: int, named: list[tuple[str, torch.Tensor]]) -> None:
    """``NonFiniteError`` naming the first trainable weight that is not finite after optimizer
    step ``step`` (one device synchronisation when all are finite)."""
    if not named or bool(torch.stack([torch.isfinite(p).all() for _, p in named]).all()):
        return
    name = next(n for n, p in named if not bool(torch.isfinite(p).all()))
    raise NonFiniteError(f"step {step}: weight {name} is not finite after the optimizer step (the gradient was); "
                         f"training stopped before this step was saved (the checkpoints hold finite weights): "
                         f"{_ADVICE}")

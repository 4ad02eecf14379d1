"""How the ``hf`` backend's decode loop (``hf_decoder``) chooses each row's next token.

Decoding
    ``temperature == 0``: greedy (argmax). Otherwise the logits are divided by the temperature,
    restricted to the top-p nucleus (the smallest set of most likely tokens whose probability
    reaches ``top_p``; at least one token), renormalized, and one token is drawn by inverse-CDF
    sampling with one uniform number per step from the row's own ``torch.Generator``
    (``row_generator``): seeded with ``seed`` when given (reproducible, whatever else is in the
    batch, up to float round-off in the logits), otherwise from a backend-wide seeded stream.

    The log-prob returned with a token is that of the distribution it was drawn from:
    ``log_softmax(logits / T)`` on the nucleus for sampled rows, the unmodified model
    distribution (T = 1) for greedy rows.

Constraints (schema mode, ``memsearch.backends.hf.constraint``)
    A constrained row keeps its automaton state on its ``Job``; before each token the logits it
    forbids are set to -inf *before* temperature and top-p, so it draws from (and reports
    log-probs under) the distribution renormalized on the allowed tokens; greedy rows take the
    best allowed token, log-prob over the allowed tokens at T = 1. EOS comes only when the JSON
    is complete, and then alone; the row stops there (even with ``ignore_eos``). Training
    replays the masks with ``TokenConstraint.masks_for(completion_ids)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def row_generator(seed: int | None, stream: torch.Generator) -> torch.Generator:
    """A row's own generator: seeded with ``seed``, or with a number drawn from ``stream``."""
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,), generator=stream))
    return torch.Generator(device="cpu").manual_seed(int(seed))


def choose_tokens(logits: torch.Tensor, jobs: Sequence[Any]) -> tuple[list[int], list[float]]:
    """One token per row of ``logits`` (rows, V) and its log-prob (module doc). ``jobs`` are the
    decoder's rows (``sampling``, ``generator``, ``constraint`` and ``cstate``); a constrained
    row whose constraint allows no token gets ``error`` set (the decoder then fails it)."""
    if any(j.constraint is not None for j in jobs):  # schema mode: -inf on forbidden tokens
        logits = logits.clone()
        for i, job in enumerate(jobs):
            if job.constraint is not None and not job.constraint.mask_logits(logits[i], job.cstate):
                job.error = f"constraint {job.constraint.id!r} allows no token here"
    n = logits.shape[0]
    temps = [float(j.sampling.temperature) for j in jobs]
    greedy = [i for i in range(n) if temps[i] <= 0]
    sampled = [i for i in range(n) if temps[i] > 0]
    tokens = [0] * n
    lps = [0.0] * n
    if greedy:
        g = torch.tensor(greedy, device=logits.device) if len(greedy) < n else None
        lg = logits if g is None else logits[g]
        logp = torch.log_softmax(lg, dim=-1)
        best = lg.argmax(dim=-1)
        best_lp = logp.gather(1, best[:, None])[:, 0]
        for k, (tok, lp) in enumerate(zip(best.tolist(), best_lp.tolist(), strict=True)):
            tokens[greedy[k]] = tok
            lps[greedy[k]] = lp
    if sampled:
        s = torch.tensor(sampled, device=logits.device)
        t = torch.tensor([temps[i] for i in sampled], device=logits.device, dtype=logits.dtype)
        scaled = logits[s] / t[:, None]
        top_p = torch.tensor([float(jobs[i].sampling.top_p) for i in sampled], device=logits.device)
        if bool((top_p < 1).any()):
            top_p = torch.where(top_p >= 1, torch.full_like(top_p, float("inf")), top_p)
            sorted_logits, order = scaled.sort(dim=-1, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            before = probs.cumsum(dim=-1) - probs  # mass of the strictly more likely tokens
            drop = before >= top_p[:, None]
            drop[:, 0] = False
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            scaled = torch.full_like(scaled, float("-inf")).scatter(1, order, sorted_logits)
        logp = torch.log_softmax(scaled, dim=-1)
        cdf = logp.exp().cumsum(dim=-1)
        u = torch.cat([torch.rand(1, generator=jobs[i].generator) for i in sampled]).to(logits.device)
        u = u * cdf[:, -1]
        pick = torch.searchsorted(cdf, u[:, None], right=True)[:, 0]
        pick = torch.minimum(pick, torch.tensor(cdf.shape[1] - 1, device=logits.device))
        # never land on a token outside the nucleus (possible only through round-off)
        bad = torch.isinf(logp.gather(1, pick[:, None])[:, 0])
        if bool(bad.any()):
            pick = torch.where(bad, logp.argmax(dim=-1), pick)
        pick_lp = logp.gather(1, pick[:, None])[:, 0]
        for k, (tok, lp) in enumerate(zip(pick.tolist(), pick_lp.tolist(), strict=True)):
            tokens[sampled[k]] = tok
            lps[sampled[k]] = lp
    return tokens, lps

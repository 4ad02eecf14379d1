"""The batched decode loop behind the ``hf`` backend (``BatchDecoder``).

Batching
    Episodes run as asyncio tasks and each awaits ``generate``. Every request goes into one
    inbox; a single worker task wakes when something arrives, waits at most ``batch_wait_ms``
    for more (unless ``max_batch_size`` are already waiting), and runs the decode loop in a
    worker thread (``run_in_executor`` on one dedicated thread, like ``asyncio.to_thread``),
    so the event loop keeps serving other episodes while the model computes. Each request's
    future is resolved the moment its row finishes.

    The decode loop is our own (``BatchDecoder``; KV cache, one forward pass per step):

    - prefill: new rows, sorted by length, are left-padded to a common length (attention mask
      + position ids that start at 0 on each row's first real token) and run through the
      model in as few passes as keep padding under ``prefill_pad_waste``; only the last
      position's logits are computed; they give each row's first token;
    - decode: one forward pass per step over all active rows (one new token each); the KV
      cache lives in preallocated buffers, written in place (no per-step re-concatenation);
    - continuous batching (lite): a finished row leaves the batch at once (its KV rows are
      dropped), and requests that arrive while a batch is decoding join it at the next step
      boundary (prefilled, then their KV cache is left-padded and stacked with the running
      one), up to ``max_batch_size`` rows. 16 concurrent calls thus run as one decode loop.
      (Models whose cache is not a plain full-attention cache, e.g. sliding-window layers,
      decode in closed batches: new rows wait for the running batch to end.)

    Shared prompts (``share_prompts``, on by default): requests with the same prompt ids (the
    branches of one GRPO state group, the first calls of one task's rollouts) are prefilled as
    one row whose KV cache and last logits every one of them copies; each then samples on its
    own (its own seed). A prompt prefilled earlier in the same run is not prefilled again while
    ``PromptStore`` still holds it (``prompt_store_tokens``, least recently used out), so branches
    that join a full batch later reuse it too. The store is emptied when a run ends, since the
    weights may change between runs. The rows' logits are those of a fresh prefill up to float
    round-off (another batch, other padding), so sampled tokens and log-probs do not change.
    ``stats()["prefill_tokens"]`` counts the prompt tokens actually computed.

    Sampling parameters are applied per row, so requests with different temperature, top-p,
    seed, max_tokens or stop strings share a batch.

Decoding
    How a token is chosen (greedy, temperature, top-p, seeds, schema masks): ``hf.sampling``.

    A row stops at an end-of-sequence token (``<|im_end|>`` for the embedded model: the
    tokenizer's EOS and the generation config's ``eos_token_id``) or when its text contains one
    of ``stop`` -> ``finish_reason="stop"``; or after ``max_tokens`` tokens (also capped by the
    model context) -> ``"length"``.

What a result holds
    - ``completion_ids``: the raw sampled token ids, never re-tokenized; they include the EOS
      token when the row stopped on one, and the token(s) that completed a stop string.
    - ``text``: the decoded completion without a final EOS token, cut just before the first
      stop string when one matched (the stop string itself is not included).
    - ``logprobs[i]``: natural log of the probability of ``completion_ids[i]`` under the
      distribution it was actually drawn from, given the prompt and the earlier completion
      tokens: for sampled requests ``log_softmax(logits / T)`` restricted to the top-p nucleus
      and renormalized; for greedy requests the unmodified model distribution
      ``log_softmax(logits)`` (T = 1). Always returned (computing them is free), whatever
      ``SamplingParams.logprobs`` says. Constrained rows: ``hf.sampling``.
    - ``constraint_id``: the request's constraint id when it had one, else ``None``.
    - ``prompt_ids``: the ids the model saw (chat template applied with
      ``add_generation_prompt=True``, or the given ``prompt_ids``).
    - ``usage``: exact token counts (``source="reported"``: our own tokenizer, our own model).
    - ``latency_s``: from the ``generate`` call to this row's completion (queueing included).

    A request that cannot be served (no prompt, a prompt that does not fit the model context, a
    failing forward pass) comes back with ``error`` set and ``finish_reason="error"``;
    ``generate`` itself does not raise for it.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from memsearch.backends.base import GenerationResult, Usage
from memsearch.backends.hf.jobs import Job, error_result
from memsearch.backends.hf.kv_cache import PromptStore, StoredPrompt, slab_layer_class
from memsearch.backends.hf.model import plain_head
from memsearch.backends.hf.sampling import choose_tokens, row_generator

log = logging.getLogger(__name__)



@dataclass(eq=False)
class _Batch:
    """Rows decoding together: their KV cache, the (B, T) mask of real cache columns, the
    position id and the token each row feeds next."""

    rows: list[Job]
    cache: Any
    mask: torch.Tensor
    positions: torch.Tensor
    last: torch.Tensor


class BatchDecoder:
    """Synchronous batched decoding with a KV cache (runs in a worker thread).

    ``run(take, done)`` keeps a batch of up to ``max_batch_size`` rows decoding: before each step
    it calls ``take(free_slots)`` for new jobs (non-blocking), and calls ``done(job, result)``
    for each row as soon as it finishes. It returns when no row is left and ``take`` gives
    nothing. ``generate(jobs)`` is the static form: all jobs in one batch, results in order.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        max_batch_size: int = 16,
        max_prefill_tokens: int = 16384,
        prefill_pad_waste: float = 0.1,
        ignore_eos: bool = False,
        seed: int = 0,
        share_prompts: bool = True,
        prompt_store_tokens: int = 8192,
        forward: Callable[..., torch.Tensor] | None = None,
    ) -> None:
        """``forward``: computes the last position's logits in place of the model's own forward
        (``hf.q4.Q4Forward``), with the same arguments as ``_forward``; the model still supplies
        the config, the cache layout and the tokens that end a row."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.prefill_pad_waste = prefill_pad_waste
        self.ignore_eos = ignore_eos
        self.share_prompts = share_prompts
        self.device = next(model.parameters()).device
        config = model.config
        self.context = int(getattr(config, "max_position_embeddings", 0) or 0) or 1 << 30
        eos: set[int] = set()
        for source in (getattr(model, "generation_config", None), config):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if value is not None:
                eos.update([value] if isinstance(value, int) else value)
        if tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        self.eos_ids = frozenset(eos)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos) if eos else 0
        self.pad_id = int(pad)
        self._seed_stream = torch.Generator(device="cpu").manual_seed(seed)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        params = inspect.signature(type(base).forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        # Models whose logits are exactly ``lm_head(decoder(x))`` (no bias, scaling or
        # soft-capping): run the decoder and the head ourselves (see ``_forward``).
        self._body = None
        self._head_weight = None
        self._own_forward = forward
        parts = None if hasattr(model, "peft_config") else plain_head(model)
        if parts is not None and self._cache_kw in inspect.signature(type(parts[0]).forward).parameters:
            self._body, self._head_weight = parts[0], parts[1].weight
        # Plain full-attention caches can be stacked and padded (rows join a running batch);
        # others (sliding-window, linear-attention layers) decode in closed batches.
        layers = DynamicCache(config=config).layers
        self._mergeable = bool(layers) and all(type(layer) is DynamicLayer for layer in layers)
        # Prompt KV caches of this run, for requests that come later with the same prompt (only
        # where caches can be stacked; emptied when the run ends: ``run``).
        self._prompts = PromptStore(prompt_store_tokens if share_prompts and self._mergeable else 0)
        self._lock = threading.Lock()
        # The event loop encodes prompts while the worker thread decodes completions; the Rust
        # tokenizer can refuse concurrent use ("Already borrowed"), so both take this lock.
        self.tok_lock = threading.Lock()
        self.abort = threading.Event()  # set to fail the rows in flight and leave ``run``
        self.stats = {
            "requests": 0,
            "batches": 0,  # batches formed on an idle decoder (rows joining a running batch don't count)
            "prefills": 0,  # batched prefill forward passes
            "decode_steps": 0,  # batched one-token forward passes
            "rows_decoded": 0,  # sum of rows over decode steps
            "max_rows": 0,  # most rows in one forward pass
            "prompt_tokens": 0,  # prompt tokens of the requests admitted
            "prefill_tokens": 0,  # prompt tokens run through the model (shared prompts count once)
            "completion_tokens": 0,
            "errors": 0,
            "prefill_s": 0.0,  # wall time in prefill passes (incl. sampling the first token)
            "decode_s": 0.0,  # wall time in decode steps (incl. sampling)
            # of prefill_s + decode_s: choosing tokens (schema masks, sampling) and advancing
            # each row's constraint state, i.e. everything but the model's forward pass
            "pick_s": 0.0,
        }

    # ----------------------------------------------------------------- public
    def generate(self, jobs: Sequence[Job]) -> list[GenerationResult]:
        """Static batch: all ``jobs`` together (in chunks of ``max_batch_size``), results in order."""
        pending = list(jobs)
        results: dict[int, GenerationResult] = {}
        index = {id(j): i for i, j in enumerate(jobs)}

        def take(n: int) -> list[Job]:
            got, pending[:] = pending[:n], pending[n:]
            return got

        def done(job: Job, result: GenerationResult) -> None:
            results[index[id(job)]] = result

        self.run(take, done)
        return [
            results.get(i) or error_result("not generated (backend closed)", job.prompt_ids, job.t0)
            for i, job in enumerate(jobs)
        ]

    @contextmanager
    def paused(self):
        """No decode run is in progress, nor starts, inside this block: where the caller changes
        the model's weights (``train.policy.MergedSampler.refresh``). Runs hold the same lock and
        empty their prompt store when they end, so no stored KV cache outlives the weights it was
        computed with, however the threads are scheduled."""
        with self._lock:
            yield

    def run(self, take: Callable[[int], list[Job]], done: Callable[[Job, GenerationResult], None]) -> None:
        with self._lock, torch.inference_mode():
            try:
                self._run(take, done)
            finally:  # the weights may change before the next run: no stored prompt outlives this one
                self._prompts.clear()

    # ------------------------------------------------------------ the loop
    def _run(self, take, done) -> None:
        state: _Batch | None = None
        live: list[Job] = []  # taken in this run and not finished yet
        while True:
            if self.abort.is_set():
                for job in live:
                    if job.finish is None:
                        self._finish_error(job, "backend closed", done)
                return
            try:
                if state is None:
                    new = self._take_into(take, live, self.max_batch_size)
                    if not new:
                        return
                    state = self._admit(None, new, done)
                state = self._tick(state, take, done, live)
            except Exception as exc:  # noqa: BLE001  # a failing pass fails the rows in flight, not the backend
                for job in live:
                    if job.finish is None:
                        self._finish_error(job, f"generation failed: {type(exc).__name__}: {exc}", done)
                state = None
            live[:] = [job for job in live if job.finish is None and not job.cancelled()]
            if state is None:
                for job in live:  # cannot happen: every row is in the batch or finished
                    self._finish_error(job, "internal error: row lost", done)
                live.clear()

    def _take_into(self, take, live: list[Job], n: int) -> list[Job]:
        new = take(n) if n > 0 else []
        live.extend(new)
        return new

    def _admit(self, state: _Batch | None, new: list[Job], done) -> _Batch | None:
        """Prefill ``new`` jobs and stack them under the running batch."""
        if state is None or not state.rows:
            self.stats["batches"] += 1
        self.stats["requests"] += len(new)
        parts = self._prefill_all(new, done)
        if state is not None and state.rows:
            parts.insert(0, state)
        if not parts:
            return None
        state = parts[0] if len(parts) == 1 else self._merge(parts)
        if self._mergeable:
            self._reserve(state)
        return state

    def _tick(self, state: _Batch | None, take, done, live: list[Job]) -> _Batch | None:
        """Admit waiting jobs if there is room, then one decode step for every row."""
        active = len(state.rows) if state else 0
        # Join a running batch only if its cache can be merged; otherwise wait for it to end.
        room = self.max_batch_size - active if (active == 0 or self._mergeable) else 0
        new = self._take_into(take, live, room)
        if new:
            state = self._admit(state, new, done)
        if state is None or not state.rows:
            return None
        rows = state.rows
        t_step = time.perf_counter()
        state.mask = torch.cat([state.mask, state.mask.new_ones((len(rows), 1))], dim=1)
        logits = self._forward(state.last[:, None], state.mask, state.positions[:, None], state.cache)
        self.stats["decode_steps"] += 1
        self.stats["rows_decoded"] += len(rows)
        self.stats["max_rows"] = max(self.stats["max_rows"], len(rows))
        state.positions = state.positions + 1
        t_pick = time.perf_counter()
        tokens, lps = choose_tokens(logits, rows)
        keep = self._advance(rows, tokens, lps, done)
        self.stats["pick_s"] += time.perf_counter() - t_pick
        state.last = torch.tensor(tokens, device=self.device)
        state = self._select(state, keep)
        self.stats["decode_s"] += time.perf_counter() - t_step
        return state

    def _forward(self, input_ids, mask, position_ids, cache) -> torch.Tensor:
        """Logits (float32) of the last position of each row."""
        if self._own_forward is not None:
            return self._own_forward(input_ids, mask, position_ids, cache)
        if self._body is not None:
            out = self._body(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=position_ids,
                use_cache=True,
                **{self._cache_kw: cache},
            )
            hidden = out.last_hidden_state[:, -1, :]
            # (V, H) @ (H, B): for a few rows this is 2-4x faster on CPU than F.linear's (B, H) @ (H, V)^T
            return (self._head_weight @ hidden.T).T.float()
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: cache},
        )
        return out.logits[:, -1, :].float()

    def _new_cache(self):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        if self._mergeable:
            cache.layers = [slab_layer_class()() for _ in cache.layers]
        return cache

    def _prefill_all(self, jobs: list[Job], done) -> list[_Batch]:
        """Prefill new jobs: sorted by length, in chunks that keep padding waste small and the
        padded size under ``max_prefill_tokens`` (one chunk when caches cannot be merged). With
        ``share_prompts``, jobs with the same prompt ids are one prefill row, and a prompt whose
        KV cache this run already holds is not prefilled again (module doc, "Shared prompts")."""
        live = sorted((j for j in jobs if not j.cancelled()), key=lambda j: len(j.prompt_ids))
        groups: dict[tuple[int, ...], list[Job]] = {}
        for job in live:
            groups.setdefault(tuple(job.prompt_ids) if self.share_prompts else (id(job),), []).append(job)
        stored = [(self._prompts[key], members) for key, members in groups.items() if key in self._prompts]
        fresh = [members for key, members in groups.items() if key not in self._prompts]
        parts = []
        for chunk in self._chunks(fresh):
            t_part = time.perf_counter()
            try:
                state = self._prefill(chunk, done)
            except Exception as exc:  # noqa: BLE001
                for job in (j for members in chunk for j in members):
                    if job.finish is None:
                        self._finish_error(job, f"prefill failed: {type(exc).__name__}: {exc}", done)
                continue
            finally:
                self.stats["prefill_s"] += time.perf_counter() - t_part
            if state is not None and state.rows:
                parts.append(state)
        if stored:  # no forward pass, but the first tokens are chosen here: counted as prefill
            t_part = time.perf_counter()
            try:
                state = self._from_stored(stored, done)
            except Exception as exc:  # noqa: BLE001
                state = None
                for job in (j for _, members in stored for j in members):
                    if job.finish is None:
                        self._finish_error(job, f"prefill failed: {type(exc).__name__}: {exc}", done)
            finally:
                self.stats["prefill_s"] += time.perf_counter() - t_part
            if state is not None and state.rows:
                parts.append(state)
        return parts

    def _chunks(self, groups: list[list[Job]]) -> list[list[list[Job]]]:
        """Prompt groups (sorted by prompt length) cut into prefill passes (``_prefill_all``)."""
        chunks: list[list[list[Job]]] = []
        chunk: list[list[Job]] = []
        real = 0
        for members in groups:
            n = len(members[0].prompt_ids)  # the longest so far: groups come sorted
            padded = n * (len(chunk) + 1)
            if (
                chunk
                and self._mergeable
                and (padded > self.max_prefill_tokens or padded > (1 + self.prefill_pad_waste) * (real + n))
            ):
                chunks.append(chunk)
                chunk, real = [], 0
            chunk.append(members)
            real += n
        if chunk:
            chunks.append(chunk)
        return chunks

    def _prefill(self, groups: list[list[Job]], done) -> _Batch | None:
        """One prefill pass over the first job of each group (the jobs of a group share their
        prompt ids); every job of a group gets a copy of its KV rows and first-token logits."""
        reps = [members[0] for members in groups]
        length = max(len(j.prompt_ids) for j in reps)
        ids = torch.full((len(reps), length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(reps), length), dtype=torch.bool)
        for i, job in enumerate(reps):
            n = len(job.prompt_ids)
            ids[i, length - n :] = torch.tensor(job.prompt_ids, dtype=torch.long)
            mask[i, length - n :] = True
        ids, mask = ids.to(self.device), mask.to(self.device)
        position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
        cache = self._new_cache()
        logits = self._forward(ids, mask, position_ids, cache)
        self.stats["prefills"] += 1
        self.stats["max_rows"] = max(self.stats["max_rows"], len(reps))
        self.stats["prefill_tokens"] += sum(len(j.prompt_ids) for j in reps)
        if self.share_prompts and self._mergeable:
            for i, job in enumerate(reps):
                n = len(job.prompt_ids)
                self._prompts.put(tuple(job.prompt_ids), [(layer.keys[i : i + 1, :, length - n :].clone(),
                                                           layer.values[i : i + 1, :, length - n :].clone())
                                                          for layer in cache.layers], logits[i].clone())
        jobs = [job for members in groups for job in members]
        if len(jobs) > len(reps):  # the other jobs of a group: copies of its row
            idx = torch.tensor([i for i, members in enumerate(groups) for _ in members], device=self.device)
            cache.batch_select_indices(idx)
            logits, mask, position_ids = logits[idx], mask[idx], position_ids[idx]
        return self._start_rows(jobs, cache, mask, position_ids[:, -1] + 1, logits, done)

    def _from_stored(self, stored: list[tuple[StoredPrompt, list[Job]]], done) -> _Batch | None:
        """Rows for jobs whose prompt KV cache this run already holds (no forward pass)."""
        jobs = [job for _, members in stored for job in members]
        lengths = [entry.length for entry, members in stored for _ in members]
        width = max(lengths)
        cache = self._new_cache()
        for i, layer in enumerate(cache.layers):
            layer.assemble([(*entry.layers[i], width - entry.length) for entry, members in stored for _ in members], 0)
        mask = torch.zeros((len(jobs), width), dtype=torch.bool, device=self.device)
        for r, n in enumerate(lengths):
            mask[r, width - n :] = True
        logits = torch.stack([entry.logits for entry, members in stored for _ in members])
        positions = torch.tensor(lengths, device=self.device)
        return self._start_rows(jobs, cache, mask, positions, logits, done)

    def _start_rows(self, jobs: list[Job], cache, mask: torch.Tensor, positions: torch.Tensor, logits: torch.Tensor,
                    done) -> _Batch | None:
        """Sample each job's first token from its prompt's last logits; the batch of the rows that go on."""
        for job in jobs:
            self._init_generator(job)
        self.stats["prompt_tokens"] += sum(len(j.prompt_ids) for j in jobs)
        t_pick = time.perf_counter()
        tokens, lps = choose_tokens(logits, jobs)
        keep = self._advance(jobs, tokens, lps, done)
        self.stats["pick_s"] += time.perf_counter() - t_pick
        state = _Batch(rows=list(jobs), cache=cache, mask=mask, positions=positions,
                       last=torch.tensor(tokens, device=self.device))
        return self._select(state, keep)

    # ------------------------------------------------------- cache surgery
    def _headroom(self, rows: Sequence[Job]) -> int:
        return max(j.max_new - len(j.out_ids) for j in rows) + 1

    def _reserve(self, state: _Batch) -> None:
        """Room in the KV buffers for every step the batch may still take (no regrowth)."""
        for layer in state.cache.layers:
            layer.reserve(self._headroom(state.rows))

    def _select(self, state: _Batch, keep: list[int]) -> _Batch | None:
        """Keep rows ``keep`` (finished rows leave the batch) and drop cache columns nobody needs."""
        if not keep:
            return None
        if len(keep) < len(state.rows):
            idx = torch.tensor(keep, device=self.device)
            state.cache.batch_select_indices(idx)
            state.rows = [state.rows[i] for i in keep]
            state.mask, state.positions, state.last = state.mask[idx], state.positions[idx], state.last[idx]
            used = state.mask.any(dim=0)
            first = int(used.to(torch.int8).argmax())
            if first > 0 and self._mergeable:
                for layer in state.cache.layers:
                    layer.drop_left(first)
                state.mask = state.mask[:, first:]
        return state

    def _merge(self, parts: list[_Batch]) -> _Batch:
        """One batch from several: rows stacked, each part's cache left-padded to a common length.

        Consumes the parts' caches layer by layer: once layer i is assembled, the parts' layer i
        buffers are released, so the merge holds one layer more than the caches it joins, not a
        second copy of them (at ``max_batch_size`` rows of a 7B model the cache is tens of GiB)."""
        width = max(p.mask.shape[1] for p in parts)
        rows = [j for p in parts for j in p.rows]
        cache = self._new_cache()
        room = self._headroom(rows)
        for i, layer in enumerate(cache.layers):
            layer.assemble([(p.cache.layers[i].keys, p.cache.layers[i].values, width - p.mask.shape[1]) for p in parts],
                           room)
            for p in parts:
                p.cache.layers[i].release()
        mask = torch.zeros((len(rows), width), dtype=torch.bool, device=self.device)
        b = 0
        for p in parts:
            mask[b : b + len(p.rows), width - p.mask.shape[1] :] = p.mask
            b += len(p.rows)
        return _Batch(
            rows=rows,
            cache=cache,
            mask=mask,
            positions=torch.cat([p.positions for p in parts]),
            last=torch.cat([p.last for p in parts]),
        )

    # ------------------------------------------------------------ sampling
    def _init_generator(self, job: Job) -> None:
        job.generator = row_generator(job.sampling.seed, self._seed_stream)

    def _advance(self, jobs: Sequence[Job], tokens: list[int], lps: list[float], done) -> list[int]:
        """Append each row's token, finish rows that are done; return indices of rows that go on."""
        keep = []
        for i, job in enumerate(jobs):
            job.out_ids.append(tokens[i])
            job.out_lp.append(lps[i])
            if job.cancelled():
                continue
            if job.constraint is not None and job.error is None:
                try:
                    job.cstate = job.constraint.advance(job.cstate, tokens[i])
                except ValueError as exc:  # (only if round-off let a forbidden token through)
                    job.error = str(exc)
            if job.error is not None:
                self._finish_error(job, job.error, done)
                continue
            eos = tokens[i] in self.eos_ids and (not self.ignore_eos or job.constraint is not None)
            if eos or (job.sampling.stop and self._hit_stop(job)):
                job.finish = "stop"
            elif len(job.out_ids) >= job.max_new:
                job.finish = "length"
            if job.finish is None:
                keep.append(i)
            else:
                self._finish(job, done)
        return keep

    def _hit_stop(self, job: Job) -> bool:
        with self.tok_lock:
            text = self.tokenizer.decode(job.out_ids, skip_special_tokens=False)
        hits = [text.find(s) for s in job.sampling.stop if s]
        hits = [h for h in hits if h >= 0]
        if hits:
            job.stop_at = min(hits)
            return True
        return False

    def _finish(self, job: Job, done) -> None:
        ids = job.out_ids
        eos_end = job.finish == "stop" and ids and ids[-1] in self.eos_ids
        body = ids[:-1] if eos_end and (not self.ignore_eos or job.constraint is not None) else ids
        with self.tok_lock:
            text = self.tokenizer.decode(body, skip_special_tokens=False)
        if job.stop_at is not None:
            text = text[: job.stop_at]
        self.stats["completion_tokens"] += len(ids)
        result = GenerationResult(
            text=text,
            finish_reason=job.finish,  # type: ignore[arg-type]
            completion_ids=tuple(ids),
            logprobs=tuple(job.out_lp),
            prompt_ids=tuple(job.prompt_ids),
            usage=Usage(prompt_tokens=len(job.prompt_ids), completion_tokens=len(ids), source="reported"),
            latency_s=time.perf_counter() - job.t0,
            constraint_id=job.constraint.id if job.constraint is not None else None,
            # The model's context, not max_tokens, ended it (``max_new`` was cut to what fit).
            context_truncated=job.finish == "length" and job.max_new < int(job.request.sampling.max_tokens),
        )
        done(job, result)

    def _finish_error(self, job: Job, message: str, done) -> None:
        self.stats["errors"] += 1
        job.finish = "error"
        done(job, error_result(message, job.prompt_ids, job.t0))


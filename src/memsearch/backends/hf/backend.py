"""The ``hf`` policy backend: a local ``transformers`` causal LM with dynamic batching.

Usage::

    backend = HFBackend()                      # the embedded SmolLM2-135M-Instruct, CPU/GPU auto
    [result] = await backend.generate([GenerationRequest(role="reader", messages=(...,))])
    await backend.aclose()

How requests are batched and decoded, and what a result holds: ``hf_decoder``.

Also
    ``generate_sync(requests)`` runs one static batch in the calling thread (no queue);
    ``stats()`` counts batches, prefill passes, decode steps, rows per step and wall times.

Constrained decoding (schema mode)
    A request's ``constraint`` (JSON schema or choices) is compiled against the tokenizer once
    (``memsearch.backends.hf.constraint.compile_constraint``, cached) and enforced token by token:
    the row samples from the distribution renormalized on the allowed tokens, its log-probs
    are under that distribution, and ``GenerationResult.constraint_id`` names the constraint so
    training replays the same masks. A constraint that cannot be compiled (an unsupported
    schema keyword) makes that request an error result.

Not supported
    ``observation`` is ignored.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import queue
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memsearch.backends.base import GenerationRequest, GenerationResult, Usage
from memsearch.backends.hf.decoder import BatchDecoder
from memsearch.backends.hf.jobs import Job, error_result
from memsearch.config.backend import HF_WEIGHTS as WEIGHTS
from memsearch.config.backend import HFSettings
from memsearch.errors import InputValueError

log = logging.getLogger(__name__)


class HFBackend:
    """A local ``transformers`` model behind the ``PolicyBackend`` protocol (see module doc).

    Args:
        model: ``"embedded"`` (SmolLM2-135M-Instruct, converted once from the shipped GGUF and
            cached) or a local Hugging Face model folder.
        adapter: a local PEFT LoRA adapter folder (needs ``peft``), merged into the weights
            unless ``merge_adapter=False``.
        device: ``"auto"`` (CUDA if available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        dtype: ``"auto"`` (float32 on CPU, bfloat16 on a GPU), or ``"float32"``, ``"bfloat16"``...
        max_batch_size: most rows decoded together.
        batch_wait_ms: how long the worker waits for more requests before starting a batch.
        max_prefill_tokens: bound on padded tokens in one prefill forward pass (memory).
        prefill_pad_waste: new rows are prefilled together (sorted by length) while padding adds
            at most this fraction of extra tokens; longer/shorter ones get their own pass.
        ignore_eos: keep generating past EOS until ``max_tokens`` (benchmarks only).
        seed: seeds the stream that unseeded sampled requests draw from.
        name: the backend's name in records.
        share_prompts: requests with the same prompt ids share one prefill (their KV cache is
            copied), also across admissions while ``prompt_store_tokens`` prompt tokens fit in
            the decode run's prompt store (``hf_decoder``, "Shared prompts"). Exact up to float
            round-off; off only to measure it.
        weights: ``"float32"`` (the reference) or ``"q4"``: the embedded model's own 4-bit GGUF
            blocks on PyTorch's int4 CPU kernel, several times faster to decode one stream and
            not the same numbers (``hf.q4``); CPU only, no adapter.
        loaded: ``(model, tokenizer)`` already in memory (e.g. the trainer's LoRA policy, whose
            weights change between rollouts): used as is; ``model`` is then only a label.

    ``completed`` counts, per request role, the results returned without an error (each one a
    completion, possibly empty): the GRPO trainer's count of rows *generated*, taken where the
    calls are answered rather than re-read from the trajectories (the row-count contract).
    """

    def __init__(
        self,
        model: str | Path = "embedded",
        adapter: str | Path | None = None,
        device: str = "auto",
        dtype: str | None = "auto",
        max_batch_size: int = 16,
        batch_wait_ms: float = 5.0,
        max_prefill_tokens: int = 16384,
        prefill_pad_waste: float = 0.1,
        ignore_eos: bool = False,
        merge_adapter: bool = True,
        seed: int = 0,
        name: str = "hf",
        share_prompts: bool = True,
        prompt_store_tokens: int = 8192,
        loaded: tuple[Any, Any] | None = None,
        weights: str = "float32",
    ) -> None:
        from memsearch.backends.hf.model import load_model

        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if weights not in WEIGHTS:
            raise InputValueError(f"hf weights {weights!r}: expected one of {', '.join(WEIGHTS)}")
        if weights == "q4" and (str(model) != "embedded" or adapter is not None or loaded is not None
                                or dtype not in (None, "auto", "float32") or str(device) not in ("auto", "cpu")):
            raise InputValueError(
                "hf weights = 'q4' runs the embedded model's own GGUF blocks on the CPU: it needs model = 'embedded', "
                f"no adapter, float32 and device cpu (got model {str(model)!r}, adapter {adapter!r}, dtype {dtype!r}, "
                f"device {str(device)!r}); use weights = 'float32' for anything else")
        self.weights = weights
        self.name = name
        if loaded is not None:  # a model someone else holds (the trainer's live policy): shared, not copied
            self.model, self.tokenizer = loaded
            self.model_path = Path(str(model))
        else:
            self.model, self.tokenizer, self.model_path = load_model(
                model, adapter=adapter, device="cpu" if weights == "q4" else device, dtype=dtype,
                merge_adapter=merge_adapter,
            )
        forward = None
        if weights == "q4":
            from memsearch.backends.hf.q4 import embedded_q4_forward

            forward = embedded_q4_forward(self.model)
        self.model_spec = str(model)
        self.adapter = str(adapter) if adapter is not None else None
        self.max_batch_size = max_batch_size
        self.batch_wait_s = max(0.0, batch_wait_ms) / 1000.0
        self.decoder = BatchDecoder(
            self.model,
            self.tokenizer,
            max_batch_size=max_batch_size,
            max_prefill_tokens=max_prefill_tokens,
            prefill_pad_waste=prefill_pad_waste,
            ignore_eos=ignore_eos,
            seed=seed,
            share_prompts=share_prompts,
            prompt_store_tokens=prompt_store_tokens,
            forward=forward,
        )
        self._inbox: queue.Queue[Job] = queue.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        # One dedicated thread runs every decode loop: torch's intra-op (OpenMP) thread team
        # belongs to the calling thread, so hopping between pool threads would start new teams.
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"{name}-decode")
        self._closed = False
        self.completed: collections.Counter[str] = collections.Counter()

    # ------------------------------------------------------------ requests
    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """The token ids the model sees for ``request``."""
        if request.prompt_ids is not None:
            return [int(t) for t in request.prompt_ids]
        if not request.messages:
            raise ValueError("request has neither messages nor prompt_ids")
        with self.decoder.tok_lock:
            text = self.tokenizer.apply_chat_template(
                [dict(m) for m in request.messages], add_generation_prompt=True, tokenize=False
            )
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _job(self, request: GenerationRequest, t0: float) -> Job:
        ids = self.prompt_ids(request)
        if not ids:
            raise ValueError("empty prompt")
        context = self.decoder.context
        if len(ids) >= context:
            raise ValueError(f"prompt has {len(ids)} tokens; the model context is {context} tokens")
        vocab = int(self.model.config.vocab_size)
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"prompt_ids outside the vocabulary [0, {vocab})")
        constraint = None
        if request.constraint is not None:
            from memsearch.backends.hf.constraint import compile_constraint

            with self.decoder.tok_lock:  # the first compile reads the whole vocabulary (~1 s)
                constraint = compile_constraint(request.constraint, self.tokenizer)
        return Job(
            request=request, prompt_ids=ids, max_new=min(int(request.sampling.max_tokens), context - len(ids)), t0=t0,
            constraint=constraint, cstate=constraint.start() if constraint is not None else None,
        )

    def generate_sync(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """All ``requests`` as one static batch, in this thread (no queue, no event loop)."""
        t0 = time.perf_counter()
        if self._closed:
            return [error_result("backend is closed", t0=t0) for _ in requests]
        results, admitted = self._admit(requests, t0)
        for (i, _), res in zip(admitted, self.decoder.generate([job for _, job in admitted]), strict=True):
            results[i] = res
        return self._count(requests, results)  # type: ignore[arg-type]

    def _count(self, requests: Sequence[GenerationRequest], results: list[GenerationResult]) -> list[GenerationResult]:
        """Count the completions handed back (``completed``), by role."""
        for req, res in zip(requests, results, strict=True):
            if res.ok:
                self.completed[req.role] += 1
        return results

    def _admit(
        self, requests: Sequence[GenerationRequest], t0: float
    ) -> tuple[list[GenerationResult | None], list[tuple[int, Job]]]:
        """Results already known (bad requests, nothing to generate) and the jobs to decode,
        with their positions in ``requests``."""
        results: list[GenerationResult | None] = [None] * len(requests)
        admitted: list[tuple[int, Job]] = []
        for i, req in enumerate(requests):
            try:
                job = self._job(req, t0)
            except Exception as exc:  # noqa: BLE001 - a bad request becomes an error result
                results[i] = error_result(str(exc), t0=t0)
                continue
            if job.max_new <= 0:
                results[i] = self._empty(job)
                continue
            admitted.append((i, job))
        return results, admitted

    def _empty(self, job: Job) -> GenerationResult:
        return GenerationResult(
            text="",
            finish_reason="length",
            completion_ids=(),
            logprobs=(),
            prompt_ids=tuple(job.prompt_ids),
            usage=Usage(prompt_tokens=len(job.prompt_ids), completion_tokens=0, source="reported"),
            latency_s=time.perf_counter() - job.t0,
        )

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        t0 = time.perf_counter()
        if self._closed:
            return [error_result("backend is closed", t0=t0) for _ in requests]
        loop = asyncio.get_running_loop()
        self._ensure_worker(loop)
        results, waiting = self._admit(requests, t0)
        for _, job in waiting:
            job.loop, job.future = loop, loop.create_future()
            self._inbox.put(job)
        if waiting:
            assert self._wake is not None
            self._wake.set()
            try:
                done = await asyncio.gather(*(job.future for _, job in waiting), return_exceptions=True)
            except asyncio.CancelledError:
                for _, job in waiting:
                    job.future.cancel()
                raise
            for (i, job), res in zip(waiting, done, strict=True):
                if isinstance(res, BaseException):
                    res = error_result(f"{type(res).__name__}: {res}", job.prompt_ids, t0)
                results[i] = res
        return self._count(requests, results)  # type: ignore[arg-type]

    # -------------------------------------------------------------- worker
    def _ensure_worker(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is loop and self._worker is not None and not self._worker.done():
            return
        self._loop = loop
        self._wake = asyncio.Event()
        self._worker = loop.create_task(self._work(), name=f"{self.name}-batcher")

    def _take(self, n: int) -> list[Job]:
        got: list[Job] = []
        if self._closed:
            return got
        while len(got) < n:
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                break
            if not job.cancelled():
                got.append(job)
        return got

    @staticmethod
    def _resolve(job: Job, result: GenerationResult) -> None:
        def set_result() -> None:
            if not job.future.done():
                job.future.set_result(result)

        try:
            job.loop.call_soon_threadsafe(set_result)
        except RuntimeError:  # that event loop is closed: nobody is waiting any more
            pass

    async def _work(self) -> None:
        assert self._wake is not None
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            if self._inbox.empty():
                continue
            if self._inbox.qsize() < self.max_batch_size and self.batch_wait_s > 0:
                deadline = time.perf_counter() + self.batch_wait_s
                while self._inbox.qsize() < self.max_batch_size and (left := deadline - time.perf_counter()) > 0:
                    await asyncio.sleep(min(left, 0.001))
            try:
                await asyncio.get_running_loop().run_in_executor(
                    self._executor, self.decoder.run, self._take, self._resolve
                )
            except Exception:
                log.exception("hf backend: decode loop failed")

    def stats(self) -> dict[str, Any]:
        """Counters since the backend was made: ``requests``; ``batches`` (batches formed on an
        idle decoder; requests joining a running batch don't add one); ``prefills`` and
        ``decode_steps`` (batched forward passes); ``rows_decoded`` (rows summed over decode
        steps) and ``mean_rows``; ``max_rows`` (most rows in one pass); ``prompt_tokens``,
        ``completion_tokens``, ``errors``; ``prefill_s``/``decode_s`` (wall time) and ``pick_s``,
        their part spent choosing tokens (schema masks, sampling, constraint state);
        ``prefill_tokens``, the prompt tokens run through the model (``prompt_tokens`` less
        those of shared prompts)."""
        s = dict(self.decoder.stats)
        s["mean_rows"] = s["rows_decoded"] / s["decode_steps"] if s["decode_steps"] else 0.0
        return s

    async def aclose(self) -> None:
        """Stop the worker; requests still queued or decoding come back with an error."""
        self._closed = True
        self.decoder.abort.set()
        worker = self._worker
        if worker is not None and not worker.done():
            if self._loop is asyncio.get_running_loop():
                assert self._wake is not None
                self._wake.set()
                try:
                    await asyncio.wait_for(worker, timeout=60)
                except (TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001
                    worker.cancel()
            else:
                worker.cancel()
        # whatever is still queued gets an error result instead of hanging
        while True:
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                break
            self._resolve(job, error_result("backend closed", job.prompt_ids, job.t0))
        self._worker = None
        self._executor.shutdown(wait=False)


__all__ = ["BatchDecoder", "HFBackend"]


def from_config(cfg: HFSettings, tokenizer, dataset=None) -> HFBackend:
    """The ``hf`` kind's factory (``memsearch.registry``): a local transformers model, loaded on first use."""
    return HFBackend(model=cfg.model, adapter=cfg.adapter, max_batch_size=cfg.max_concurrency, weights=cfg.weights)

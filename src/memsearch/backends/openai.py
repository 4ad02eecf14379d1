"""Policy backend for any OpenAI-compatible server: vLLM, SGLang, llama.cpp, `transformers serve`, hosted APIs.

    backend = OpenAIBackend("http://127.0.0.1:8000/v1", model="Qwen/Qwen3-8B", max_concurrency=8)
    await backend.check_model()     # the served identity, or InputError when the server lists another model
    results = await backend.generate(requests)
    print(backend.stats())          # request errors and retries, what was sent, for the run summary
    await backend.aclose()

Chat requests go to ``{base_url}/chat/completions``; requests that carry ``prompt_ids`` instead
of messages go to ``{base_url}/completions`` with the token ids as ``prompt``.

The API key is read only from the environment variable ``MEMSEARCH_API_KEY`` (sent as
``Authorization: Bearer ...``), at request time. It is never a constructor argument, never kept
on the instance, and scrubbed (when it has at least 8 characters) from every error string we
produce and from every completion we return. Completion text has lone surrogates (a JSON
``"\\ud800"`` escape) replaced by U+FFFD, so a trajectory holding it can always be written.

Failures never raise out of ``generate``: a request that fails comes back with ``error`` set and
``finish_reason == "error"``, and is counted in ``stats()``. What is retried, for how long and
how often is ``retry_policy``'s rule (docs/design.md §4); a body (or completion) larger than the
request can legitimately return is read no further and not retried (``response_limits``). The
timeout of an attempt runs from when it holds one of the ``max_concurrency`` slots, so time
queued behind this client's own requests does not count (time queued inside the server does).

What the server is checked for, where it can be told:

- the model name against ``GET /models`` (``check_model``; else on first use): a listed model
  that is not ours refuses every request (``served_model``);
- the context: a call whose reported prompt + completion tokens exceed ``context_tokens`` (or
  the ``max_model_len`` the server lists) failed, not retried, since some servers (`transformers
  serve`) answer a 200 past the model's context; a completion the context cut short
  (``finish_reason`` "length" below ``max_tokens``) is marked ``context_truncated``;
- the engine (``engine``, else what its ``/models`` entry names, ``backends.engine_forms``): the
  schema form it honours is sent (``schema_style = "auto"``), a form it is known to drop is
  refused before the first request, and so is schema mode on an engine that constrains nothing;
  vLLM and SGLang are asked for the completion's token ids (``return_token_ids``);
- schema mode: each constrained answer is checked against its schema (``schema_check``; one cut
  at the token limit as the start of an allowed answer). An answer outside it is a failed request,
  never a decision; when the first ``SCHEMA_IGNORED_LIMIT`` all are, the server ignores the form
  and every later request fails naming it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from memsearch.backends.base import (
    Constraint,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)
from memsearch.backends.engine_forms import (
    DEAD_SCHEMA_STYLES,
    ENGINES,
    SCHEMA_STYLES,
    TOKEN_IDS_FIELD,
    constraint_body,
    engine_of,
    resolved_style,
    style_refusal,
)
from memsearch.backends.openai_answer import API_KEY_ENV, Malformed, NotJson, parse_answer, scrub, scrubbed, snippet
from memsearch.backends.response_limits import OversizedResponse, describe_limit, read_bounded, response_byte_limit
from memsearch.backends.retry_policy import (
    FOREIGN_BODY_RETRIES,
    RETRY_AFTER_STATUSES,
    NotJsonAnswers,
    backoff_s,
    foreign_body,
    retry_after_s,
    status_retried,
)
from memsearch.backends.schema_check import cut_problem, schema_problem
from memsearch.backends.served_model import identity_from_models, listed_context, unverified
from memsearch.config.backend import OpenAISettings
from memsearch.errors import InputError
from memsearch.http_client import Backoff, LoopSession
from memsearch.tokenizer import Tokenizer

# Constrained answers that fail their schema, all of the first ones, before the server is taken
# to ignore the constraint (a constraining server never answers one: a finished answer satisfies
# the schema, an answer cut at the token limit is the start of one).
SCHEMA_IGNORED_LIMIT = 3
# The model list is small; a body past this is no model list.
MODELS_BODY_BYTES = 8 << 20
# An attempt at GET /models waits at most this long (or the request timeout if shorter).
MODELS_TIMEOUT_S = 30.0

log = logging.getLogger(__name__)

# Body fields whose distinct values ``sent_fields`` records (the rest are counted per request).
_SENT_VALUES = ("temperature", "top_p", "max_tokens")
_NOT_RECORDED = ("model", "messages", "prompt")


def _aiohttp():
    # Imported lazily so `memsearch --help` stays instant (and, via ``OpenAIBackend.__init__``,
    # before the event loop starts, so no episode waits on the import).
    import aiohttp

    return aiohttp


def constraint_problem(text: str, constraint: Constraint, cut: bool = False) -> str | None:
    """Why ``text`` is not an answer ``constraint`` allows, else ``None``; ``cut``: the answer
    ran to the token limit, so it need only be the start of an allowed one."""
    if constraint.json_schema is not None:
        return (cut_problem if cut else schema_problem)(text, constraint.json_schema)
    if constraint.choices is not None:
        if cut and not any(choice.startswith(text) for choice in constraint.choices):
            return f"cut answer {text[:80]!r} starts none of the {len(constraint.choices)} choices"
        if not cut and text not in constraint.choices:
            return f"{text[:80]!r} is none of the {len(constraint.choices)} choices"
    return None


class _NotRetried(Exception):
    """A 2xx answer that is a deterministic failure (past the context): not retried."""


class OpenAIBackend:
    """Answers policy calls through an OpenAI-compatible HTTP server.

    Args:
        base_url: API root including the version, e.g. ``"http://127.0.0.1:8000/v1"``.
        model: model name sent in every request, checked against the server's ``/models``.
        max_concurrency: most requests in flight at once, shared by every episode using this
            instance; also the HTTP connection-pool size.
        timeout_s: wall-clock limit of one attempt (connect + send + full response), counted
            from when the attempt holds a concurrency slot.
        max_retries: retries after the first attempt, at most.
        retry_window_s: no retry starts later than this many seconds after the request's first
            failure (with the backoff defaults, ``max_retries`` = 8 retries span 30-60 s).
        backoff_base_s: first retry waits 1/2 to 1 times this; the step doubles every retry.
        backoff_max_s: cap on any wait, including a server's ``Retry-After``.
        tokenizer: used only to estimate usage when the server reports none
            (``Usage(source="estimated")``); estimates are never mixed with reported numbers.
        extra_body: server-specific fields merged into every request body last (they win), e.g.
            ``{"top_k": 20}`` for vLLM.
        engine: the server's engine (``engine_forms.ENGINES``); ``"auto"``: what its ``/models``
            entry names (``owned_by``), ``"other"`` when it names none memsearch knows.
        schema_style: how a JSON-schema constraint is sent (``engine_forms.constraint_body``);
            ``"auto"``: the engine's own form. A form the engine is known to drop is refused.
        schema_mode: requests will carry constraints, so an engine that constrains nothing is
            refused by ``check_model`` (before the run) rather than at the first answer.
        context_tokens: the server's context; ``None``: the ``max_model_len`` its ``/models``
            entry states, if any (see the module doc).
        seed: seeds the backoff jitter (not the model).
    """

    name = "openai"

    # Keyword settings with defaults, one per knob. They match BatchDecoder's constructor
    # (backends.hf.decoder) in shape only: an HTTP client's pool, timeouts and retries share no
    # logic with a local decoder's batch limits, so there is nothing to fold.
    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        max_concurrency: int = 8,
        timeout_s: float = 120.0,
        max_retries: int = 8,
        retry_window_s: float = 60.0,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 15.0,
        tokenizer: Tokenizer | None = None,
        extra_body: dict[str, Any] | None = None,
        engine: str = "auto",
        schema_style: str = "auto",
        schema_mode: bool = False,
        context_tokens: int | None = None,
        seed: int | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if timeout_s <= 0 or retry_window_s < 0:
            raise ValueError(f"timeout_s must be > 0 and retry_window_s >= 0, got {timeout_s}, {retry_window_s}")
        if schema_style in DEAD_SCHEMA_STYLES:
            raise ValueError(f"schema_style {schema_style!r}: {DEAD_SCHEMA_STYLES[schema_style]}")
        if schema_style not in SCHEMA_STYLES:
            raise ValueError(f"unknown schema_style {schema_style!r}; valid: {', '.join(SCHEMA_STYLES)}")
        if engine != "auto" and engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; valid: auto, {', '.join(ENGINES)}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.retry_window_s = retry_window_s
        self.tokenizer = tokenizer
        self.extra_body = dict(extra_body or {})
        self.configured_engine = engine
        self.schema_style = schema_style
        self.schema_mode = schema_mode
        # What the server is (configured, else read from /models at the check) and so what is
        # sent: the schema form, and the field that asks for token ids. Until the check: unknown.
        self.engine = engine if engine != "auto" else "other"
        self._style: str | None = resolved_style(schema_style, self.engine)
        self.context_tokens = context_tokens
        # What GET /models says about our model (``served_model``); None until checked.
        self.served_identity: dict[str, Any] | None = None
        self._backoff = Backoff(backoff_base_s, backoff_max_s, seed)
        # The HTTP library costs hundreds of ms to import: pay that here, at setup, rather
        # than inside the event loop on the first request while every episode waits.
        _aiohttp()
        # Not trust_env: it reads ~/.netrc (a second credential source) and looks the proxy up in
        # a worker thread on every request; the proxy is resolved once per pool instead.
        self._pool = LoopSession(max_concurrency, proxy=lambda: _env_proxy(self.base_url))
        self._counts: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._sent_values: defaultdict[str, set] = defaultdict(set)
        self._sent_with: Counter[str] = Counter()
        # Set when every request must fail without being sent: the model is not served, or the
        # server ignores the schema constraint.
        self._refusal: str | None = None
        self._schema_answers_ok = False  # a constrained answer has satisfied its schema
        self._schema_bad_start = 0  # constrained answers failing their schema before one satisfied it
        self._not_json = NotJsonAnswers(self.base_url, lambda line: log.warning(scrub(line)))
        self._check: tuple[Any, Any] | None = None  # (event loop, its GET /models task)

    def __repr__(self) -> str:
        return (
            f"OpenAIBackend(base_url={self.base_url!r}, model={self.model!r}, "
            f"max_concurrency={self.max_concurrency}, timeout_s={self.timeout_s}, max_retries={self.max_retries}, "
            f"retry_window_s={self.retry_window_s})"
        )

    # ----------------------------------------------------------------------------- public API

    async def check_model(self) -> dict[str, Any]:
        """Ask ``GET {base_url}/models`` once and keep the answer as ``served_identity``
        (returned): ``InputError`` when the server cannot be reached or lists models without
        ours (every later request then fails unsent). A server with no model list is recorded
        as unverified."""
        aiohttp = _aiohttp()
        try:
            # A session of its own, closed here: the caller's event loop may end right after.
            async with aiohttp.ClientSession(proxy=_env_proxy(self.base_url)) as session:
                return await self._fetch_identity(session)
        except (TimeoutError, OSError, OversizedResponse, aiohttp.ClientError) as exc:
            raise InputError(f"{self.base_url}: GET /models failed ({type(exc).__name__}: {scrub(str(exc))}); "
                             "is the server running and base_url right?") from None

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Results in request order; calls run concurrently up to ``max_concurrency``."""
        if self.served_identity is None and self._refusal is None:
            await self._check_once()
        return list(await asyncio.gather(*(self._generate_one(r) for r in requests)))

    def stats(self) -> dict[str, Any]:
        """Counters since construction: ``requests``, ``succeeded``, ``failed``, ``attempts``,
        ``retries``, ``errors`` (failed attempts by kind: ``http_429``, ``http_5xx``, ``http_4xx``,
        ``http_other``, ``timeout``, ``connection``, ``malformed``, ``oversized``,
        ``past_context``, ``refused``, ``internal``), ``context_truncated``, ``schema_ignored``
        (constrained answers the constraint does not allow, cut ones included) and
        ``schema_unfinished`` (constrained answers cut at the token limit that were still
        allowed: the schema did not end within it), ``completion_ids`` (whether the server
        returned token ids: ``"returned"``, ``"unavailable"`` or ``"partial: k of n"``),
        ``engine``, ``sent`` (``sent_fields``) and ``served_identity``."""
        keys = ("requests", "succeeded", "failed", "attempts", "retries", "context_truncated", "schema_ignored",
                "schema_unfinished")
        ok, with_ids = self._counts["succeeded"], self._counts["with_ids"]
        ids = "unavailable" if not with_ids else ("returned" if with_ids == ok else f"partial: {with_ids} of {ok}")
        return {**{k: self._counts[k] for k in keys}, "errors": dict(self._errors), "completion_ids": ids,
                "engine": self.engine, "sent": self.sent_fields(), "served_identity": self.served_identity}

    def sent_fields(self) -> dict[str, Any]:
        """What the request bodies carried besides model and prompt: the distinct values of
        ``temperature``, ``top_p`` and ``max_tokens``, how many requests carried each other
        field (``seed``, ``stop``, ``logprobs``, the constraint's field, ``extra_body``'s), and
        ``extra_body`` itself: the sampling a run really asked the server for."""
        return {
            "requests": self._counts["requests_sent"],
            "values": {k: _sorted(v) for k, v in sorted(self._sent_values.items())},
            "requests_with": dict(sorted(self._sent_with.items())),
            "extra_body": scrubbed(self.extra_body),
            "schema_style": self.schema_style if self._style is None else f"{self.schema_style}: {self._style}",
        }

    async def aclose(self) -> None:
        """Close the connection pool (a later request opens a new one)."""
        await self._pool.aclose()

    # ------------------------------------------------------------------------- request body

    def build_body(self, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        """The endpoint path and JSON body for ``request``."""
        s: SamplingParams = request.sampling
        body: dict[str, Any] = {"model": self.model}
        if request.prompt_ids is not None:
            path = "/completions"
            body["prompt"] = list(request.prompt_ids)
        else:
            path = "/chat/completions"
            body["messages"] = [dict(m) for m in request.messages]
        body.update(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens)
        if s.seed is not None:
            body["seed"] = s.seed
        if s.stop:
            body["stop"] = list(s.stop)
        if s.logprobs:
            if path == "/chat/completions":
                body.update(logprobs=True, top_logprobs=0)
            else:
                body["logprobs"] = 0  # legacy completions: number of top alternatives
        if request.constraint is not None and self._style is not None:
            body.update(constraint_body(request.constraint, self._style))
        if (ids_field := TOKEN_IDS_FIELD.get(self.engine)) is not None:
            body[ids_field] = True  # the completion's ids, recorded as the trainer reads them
        body.update(self.extra_body)
        return path, body

    # ------------------------------------------------------------------------------ internals

    async def _fetch_identity(self, session: Any = None) -> dict[str, Any]:
        session = session if session is not None else self._pool.get()[0]
        async with asyncio.timeout(min(self.timeout_s, MODELS_TIMEOUT_S)):
            async with session.get(self.base_url + "/models", headers=self._headers(),
                                   allow_redirects=False) as response:
                status = response.status
                raw = await read_bounded(response, MODELS_BODY_BYTES, f"the {MODELS_BODY_BYTES:,}-byte cap of a "
                                         "model list")
        try:
            identity = identity_from_models(raw, status, self.base_url, self.model)
        except InputError as exc:
            self._refusal = scrub(str(exc))
            raise InputError(self._refusal) from None
        self.served_identity = scrubbed(identity)
        if self.context_tokens is None:
            self.context_tokens = listed_context(identity)
        self._learn_engine(identity)
        return self.served_identity

    def _learn_engine(self, identity: dict[str, Any]) -> None:
        """Take the engine from the served identity (unless configured) and with it the schema
        form; with ``schema_mode``, an engine that drops the form is refused here, before the run."""
        if self.configured_engine == "auto":
            self.engine = engine_of(identity)
        self._style = resolved_style(self.schema_style, self.engine)
        if self.schema_mode and self._style is None:
            self._refusal = scrub(f"{self.base_url} ({self.model}): {style_refusal(self.schema_style, self.engine)}")
            raise InputError(self._refusal)

    async def _check_once(self) -> None:
        """The model check on first use, when ``check_model`` was not called: one GET per
        backend (one task however many episodes start together). A server that cannot be
        reached then is recorded as unverified; its requests meet the retry policy."""
        loop = asyncio.get_running_loop()
        if self._check is None or self._check[0] is not loop:
            self._check = (loop, loop.create_task(self._fetch_identity()))
        try:
            await asyncio.shield(self._check[1])
        except InputError:
            pass  # kept in _refusal: every request fails naming it
        except Exception as exc:  # noqa: BLE001 - unreachable or odd: not checked, said so
            if self.served_identity is None:
                why = f"GET /models failed at first use ({type(exc).__name__}: {scrub(str(exc))})"
                self.served_identity = unverified(self.base_url, self.model, why)

    def _note_sent(self, body: dict[str, Any]) -> None:
        self._counts["requests_sent"] += 1
        for key, value in body.items():
            if key in _SENT_VALUES:
                self._sent_values[key].add(value)
            elif key not in _NOT_RECORDED:
                self._sent_with[key] += 1

    async def _generate_one(self, request: GenerationRequest) -> GenerationResult:
        self._counts["requests"] += 1
        if self._refusal is not None:
            self._errors["refused"] += 1
            return self._failure(self._refusal, 0, time.perf_counter(), None, request)
        if request.constraint is not None and self._style is None:
            self._errors["refused"] += 1
            return self._failure(style_refusal(self.schema_style, self.engine), 0, time.perf_counter(), None, request)
        if request.prompt_ids is None and not request.messages:
            self._counts["failed"] += 1
            self._errors["internal"] += 1
            return GenerationResult(
                text="", finish_reason="error", error="request has neither messages nor prompt_ids", attempts=0
            )
        try:
            path, body = self.build_body(request)
            # Compact UTF-8 JSON; NaN/inf are not JSON and fail here, before any attempt.
            payload = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
            limit = response_byte_limit(body, len(payload))
            session, semaphore = self._pool.get()
        except Exception as exc:  # noqa: BLE001 - generate never raises for a request
            self._counts["failed"] += 1
            self._errors["internal"] += 1
            return GenerationResult(
                text="", finish_reason="error", error=scrub(f"internal: {type(exc).__name__}: {exc}"), attempts=0
            )
        aiohttp = _aiohttp()
        url = self.base_url + path
        attempts = 0
        last_status: int | None = None
        reason = ""
        retry_after: float | None = None
        start = time.perf_counter()
        first_failure: float | None = None
        foreign = 0  # this request's 2xx answers that were no API answer at all
        while True:
            if attempts > 0:
                if self._refusal is not None:  # decided since this request's last attempt
                    self._errors["refused"] += 1
                    return self._failure(self._refusal, attempts, start, last_status, request)
                wait = backoff_s(self._backoff, attempts, retry_after)
                if attempts > self.max_retries or time.perf_counter() + wait - first_failure > self.retry_window_s:
                    spent = (f"{self.max_retries} retries" if attempts > self.max_retries
                             else f"the {self.retry_window_s:g} s retry window")
                    return self._failure(f"{reason} ({spent} spent)", attempts, start, last_status, request)
                self._counts["retries"] += 1
                await asyncio.sleep(wait)
            retry_after = None
            kind = ""
            try:
                # The timeout starts once a slot is held: our own queue is not the server's slowness.
                async with semaphore:
                    if self._refusal is not None:  # decided while this request waited
                        self._errors["refused"] += 1
                        return self._failure(self._refusal, attempts, start, last_status, request)
                    attempts += 1
                    self._counts["attempts"] += 1
                    if attempts == 1:
                        self._note_sent(body)
                    async with asyncio.timeout(self.timeout_s):
                        async with session.post(
                            url, data=payload, headers=self._headers(), allow_redirects=False
                        ) as response:
                            code = last_status = response.status
                            retry_header = response.headers.get("Retry-After")
                            content_type = response.headers.get("Content-Type")
                            raw = await read_bounded(response, limit, describe_limit(body, limit))
                if 200 <= code < 300:
                    return self._success(request, raw, body, attempts, start)
                reason = f"HTTP {code}: {snippet(raw)}"
                retried, why = status_retried(code, raw)
                kind = "http_429" if code == 429 else "http_5xx" if code >= 500 else (
                    "http_4xx" if code >= 400 else "http_other")
                if not retried:
                    self._errors[kind] += 1
                    return self._failure(f"{reason} ({why})", attempts, start, last_status, request)
                if code in RETRY_AFTER_STATUSES:
                    retry_after = retry_after_s(retry_header)
            except NotJson as exc:
                kind, reason = "malformed", f"malformed response: {exc}"
                if (refusal := self._not_json.note(code, raw, content_type)) and self._refusal is None:
                    self._refusal = scrub(refusal)
                if foreign_body(raw, content_type):
                    foreign += 1
                    if foreign > FOREIGN_BODY_RETRIES:
                        self._errors[kind] += 1
                        return self._failure(self._not_json.foreign_failure(code, raw, content_type), attempts,
                                             start, last_status, request)
            except Malformed as exc:
                self._not_json.json_answered = True
                kind, reason = "malformed", f"malformed response: {exc}"
            except _NotRetried as exc:
                self._errors["past_context"] += 1
                return self._failure(f"{exc} (not retried)", attempts, start, last_status, request)
            except OversizedResponse as exc:
                # A server that ignores max_tokens will do so again: not retried.
                self._errors["oversized"] += 1
                return self._failure(f"response too large: {exc} (not retried)", attempts, start, last_status,
                                     request)
            except TimeoutError:
                kind, reason = "timeout", f"timeout after {self.timeout_s:g}s"
            except (aiohttp.ClientError, OSError) as exc:
                kind, reason = "connection", f"connection error: {type(exc).__name__}: {exc}"
            except Exception as exc:  # noqa: BLE001 - a bug must not crash a whole run
                self._errors["internal"] += 1
                return self._failure(f"internal: {type(exc).__name__}: {exc}", attempts, start, last_status, request)
            self._errors[kind] += 1
            if first_failure is None:
                first_failure = time.perf_counter()

    def _success(self, request: GenerationRequest, raw: bytes, body: dict[str, Any], attempts: int,
                 start: float) -> GenerationResult:
        """The result of a 2xx answer, judged against the context and the constraint."""
        result = parse_answer(request, raw, body, self.tokenizer)
        self._not_json.json_answered = True
        self._check_context(result)
        if request.constraint is not None:
            cut = result.finish_reason == "length"
            problem = constraint_problem(result.text, request.constraint, cut=cut)
            self._judge_schema(problem, cut)
            if problem is not None:
                # An answer outside its constraint is the server's failure, never a decision.
                self._errors["schema_ignored"] += 1
                why = self._refusal or (f"the server's answer breaks its {self._style} schema constraint ({problem}); "
                                        "not used")
                return self._failure(why, attempts, start, None, request)
        self._counts["succeeded"] += 1
        self._counts["with_ids"] += result.completion_ids is not None
        self._counts["context_truncated"] += result.context_truncated
        return replace(result, latency_s=time.perf_counter() - start, attempts=attempts)

    def _check_context(self, result: GenerationResult) -> None:
        """``_NotRetried`` when the call's reported tokens exceed the server's context."""
        context, usage = self.context_tokens, result.usage
        if context is None or usage.source != "reported" or usage.prompt_tokens is None:
            return
        used = usage.prompt_tokens + (usage.completion_tokens or 0)
        if used > context:
            raise _NotRetried(
                f"past the server's context: {usage.prompt_tokens} prompt + {usage.completion_tokens or 0} completion "
                f"tokens, over its {context} (context_tokens, or the max_model_len its /models lists); the answer is "
                "not used: give the server a longer context or lower the budgets")

    def _judge_schema(self, problem: str | None, cut: bool) -> None:
        """Count a constrained answer that fails its constraint (``cut``: ran to the token limit,
        judged as a start); when the first ``SCHEMA_IGNORED_LIMIT`` all did, the server ignores
        the constraint's form and every later request fails naming it."""
        if problem is None:
            if cut:
                self._counts["schema_unfinished"] += 1  # honoured so far; proves nothing more
            else:
                self._schema_answers_ok = True
            return
        self._counts["schema_ignored"] += 1
        if self._schema_answers_ok:
            return
        self._schema_bad_start += 1
        if self._schema_bad_start >= SCHEMA_IGNORED_LIMIT and self._refusal is None:
            self._refusal = scrub(
                f"the server at {self.base_url} ({self.engine}) ignored the {self._style} schema constraint: its "
                f"first {self._schema_bad_start} constrained answers are not allowed by their schema "
                f"(last: {problem}); "
                "set engine and schema_style to the server's (docs/server.md: schema forms per engine), or use a "
                "server that constrains output (vLLM, SGLang)")

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(API_KEY_ENV)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _failure(
        self, reason: str, attempts: int, start: float, last_status: int | None, request: GenerationRequest
    ) -> GenerationResult:
        self._counts["failed"] += 1
        status = f", last HTTP status {last_status}" if last_status is not None else ""
        error = scrub(f"{reason} [{attempts} attempt{'s' if attempts != 1 else ''}{status}]")
        return GenerationResult(
            text="",
            finish_reason="error",
            prompt_ids=request.prompt_ids,
            latency_s=time.perf_counter() - start,
            error=error,
            attempts=attempts,
        )

def _sorted(values: set) -> list:
    """Distinct sent values in order (by their text when an ``extra_body`` mixed in other types)."""
    try:
        return sorted(values)
    except TypeError:
        return sorted(values, key=repr)


def _env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTP(S)_PROXY``, ``ALL_PROXY``, honouring
    ``NO_PROXY``), as httpx and requests pick it."""
    import urllib.request
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    if not parts.hostname or urllib.request.proxy_bypass_environment(parts.hostname, proxies):
        return None
    return proxies.get(parts.scheme) or proxies.get("all")


def from_config(cfg: OpenAISettings, tokenizer: Tokenizer, dataset=None) -> OpenAIBackend:
    """The ``openai`` kind's factory (``memsearch.registry``): an OpenAI-compatible HTTP server."""
    from memsearch.errors import InputValueError

    if not cfg.base_url:
        raise InputValueError("backend kind 'openai' needs base_url, e.g. http://127.0.0.1:8000/v1")
    return OpenAIBackend(base_url=cfg.base_url, model=cfg.model, max_concurrency=cfg.max_concurrency,
                         timeout_s=cfg.timeout_s, max_retries=cfg.max_retries, retry_window_s=cfg.retry_window_s,
                         tokenizer=tokenizer, extra_body=cfg.extra_body, engine=cfg.engine,
                         schema_style=cfg.schema_style, schema_mode=cfg.schema_mode,
                         context_tokens=cfg.context_tokens)

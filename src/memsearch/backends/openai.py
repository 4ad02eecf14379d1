"""Policy backend for any OpenAI-compatible server: vLLM, SGLang, `transformers serve`, hosted APIs.

    backend = OpenAIBackend("http://127.0.0.1:8000/v1", model="Qwen/Qwen3-8B", max_concurrency=32)
    results = await backend.generate(requests)
    print(backend.stats())          # request errors and retries, for the run summary
    await backend.aclose()

Chat requests go to ``{base_url}/chat/completions``; requests that carry ``prompt_ids`` instead
of messages go to ``{base_url}/completions`` with the token ids as ``prompt``.

The API key is read only from the environment variable ``MEMSEARCH_API_KEY`` (sent as
``Authorization: Bearer ...``), at request time. It is never a constructor argument, never kept
on the instance, and scrubbed (when it has at least 8 characters) from every error string we
produce and from every completion we return. Completion text has lone surrogates (a JSON
``"\\ud800"`` escape) replaced by U+FFFD, so a trajectory holding it can always be written.

Failures never raise out of ``generate``: 429, 5xx, connection errors, timeouts and malformed
bodies are retried with exponential backoff and full jitter (``Retry-After`` honoured on 429);
other 4xx are not retried. A request that still fails comes back with ``error`` set and
``finish_reason == "error"``, and is counted in ``stats()``. A body (or completion) larger than
the request can legitimately return is read no further and not retried (``response_limits``).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

from memsearch.backends.base import (
    Constraint,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    Usage,
)
from memsearch.backends.response_limits import (
    OversizedResponse,
    check_completion,
    describe_limit,
    read_bounded,
    response_byte_limit,
)
from memsearch.io import Backoff, LoopSession
from memsearch.text.safe_text import replace_lone_surrogates
from memsearch.tokenizer import Tokenizer

API_KEY_ENV = "MEMSEARCH_API_KEY"

ChoiceStyle = Literal["guided", "structured_outputs"]

# vLLM returns token strings in logprobs; with ``return_tokens_as_token_ids`` they read
# "token_id:123", which is the only way to get completion ids from its chat endpoint.
_TOKEN_ID_RE = re.compile(r"^token_id:(-?\d+)$")
_SNIPPET_CHARS = 200


def _aiohttp():
    # Imported lazily so `memsearch --help` stays instant (and, via ``OpenAIBackend.__init__``,
    # before the event loop starts, so no episode waits on the import).
    import aiohttp

    return aiohttp


def constraint_body(constraint: Constraint | None, choice_style: ChoiceStyle = "guided") -> dict[str, Any]:
    """Request-body fields that enforce ``constraint`` on an OpenAI-compatible server.

    - ``json_schema`` -> ``response_format = {"type": "json_schema", "json_schema": {"name":
      constraint.id, "schema": schema}}``: the OpenAI structured-output field, understood by
      hosted APIs, vLLM and SGLang on both endpoints.
    - ``choices`` -> ``guided_choice = [...]`` (vLLM's extra parameter, ``choice_style="guided"``)
      or ``structured_outputs = {"choice": [...]}`` (newer vLLM, ``"structured_outputs"``).
      Hosted APIs have no choice constraint; use a JSON schema with an ``enum`` there.
    """
    if constraint is None:
        return {}
    body: dict[str, Any] = {}
    if constraint.json_schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": constraint.id, "schema": constraint.json_schema},
        }
    if constraint.choices is not None:
        if choice_style == "guided":
            body["guided_choice"] = list(constraint.choices)
        elif choice_style == "structured_outputs":
            body["structured_outputs"] = {"choice": list(constraint.choices)}
        else:
            raise ValueError(f"unknown choice_style {choice_style!r}; valid: 'guided', 'structured_outputs'")
    return body


# Shorter keys are not scrubbed: replacing a 1-character "key" would mangle every message, and
# no real API key is that short.
MIN_SCRUBBED_KEY_CHARS = 8


def _scrub(text: str) -> str:
    """``text`` with the API key (if one of at least 8 characters is set) replaced, for anything
    we log, return or store, completions included (a server may echo the key back)."""
    key = os.environ.get(API_KEY_ENV)
    if key and len(key) >= MIN_SCRUBBED_KEY_CHARS:
        text = text.replace(key, "***")
    return text


def _snippet(raw: bytes) -> str:
    text = raw[:_SNIPPET_CHARS].decode("utf-8", errors="replace").strip()
    return " ".join(text.split())


def _retry_after_s(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (the HTTP-date form is ignored)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


class _Malformed(Exception):
    """A 2xx response whose body is not a usable completion (retried)."""


class OpenAIBackend:
    """Answers policy calls through an OpenAI-compatible HTTP server.

    Args:
        base_url: API root including the version, e.g. ``"http://127.0.0.1:8000/v1"``.
        model: model name sent in every request.
        max_concurrency: most requests in flight at once, shared by every episode using this
            instance; also the HTTP connection-pool size.
        timeout_s: wall-clock limit of one attempt (connect + send + full response).
        max_retries: retries after the first attempt, so at most ``max_retries + 1`` attempts.
        backoff_base_s: first retry waits up to this long; doubles with every retry (full jitter).
        backoff_max_s: cap on any wait, including a server's ``Retry-After``.
        tokenizer: used only to estimate usage when the server reports none
            (``Usage(source="estimated")``); estimates are never mixed with reported numbers.
        extra_body: server-specific fields merged into every request body last (they win), e.g.
            ``{"top_k": 20, "return_tokens_as_token_ids": True}`` for vLLM.
        choice_style: how a ``choices`` constraint is sent (see ``constraint_body``).
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
        max_concurrency: int = 16,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        tokenizer: Tokenizer | None = None,
        extra_body: dict[str, Any] | None = None,
        choice_style: ChoiceStyle = "guided",
        seed: int | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if choice_style not in ("guided", "structured_outputs"):
            raise ValueError(f"unknown choice_style {choice_style!r}; valid: 'guided', 'structured_outputs'")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.tokenizer = tokenizer
        self.extra_body = dict(extra_body or {})
        self.choice_style = choice_style
        self._backoff = Backoff(backoff_base_s, backoff_max_s, seed)
        # The HTTP library costs hundreds of ms to import: pay that here, at setup, rather
        # than inside the event loop on the first request while every episode waits.
        _aiohttp()
        # Not trust_env: it reads ~/.netrc (a second credential source) and looks the proxy up in
        # a worker thread on every request; the proxy is resolved once per pool instead.
        self._pool = LoopSession(max_concurrency, proxy=lambda: _env_proxy(self.base_url))
        self._counts: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()

    def __repr__(self) -> str:
        return (
            f"OpenAIBackend(base_url={self.base_url!r}, model={self.model!r}, "
            f"max_concurrency={self.max_concurrency}, timeout_s={self.timeout_s}, max_retries={self.max_retries})"
        )

    # ----------------------------------------------------------------------------- public API

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Results in request order; calls run concurrently up to ``max_concurrency``."""
        return list(await asyncio.gather(*(self._generate_one(r) for r in requests)))

    def stats(self) -> dict[str, Any]:
        """Counters since construction: ``requests``, ``succeeded``, ``failed``, ``attempts``,
        ``retries``, and ``errors`` (failed attempts by kind: ``http_429``, ``http_5xx``,
        ``http_4xx``, ``http_other``, ``timeout``, ``connection``, ``malformed``, ``oversized``,
        ``internal``)."""
        keys = ("requests", "succeeded", "failed", "attempts", "retries")
        return {**{k: self._counts[k] for k in keys}, "errors": dict(self._errors)}

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
        body.update(constraint_body(request.constraint, self.choice_style))
        body.update(self.extra_body)
        return path, body

    # ------------------------------------------------------------------------------ internals

    def _backoff_s(self, retry: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self._backoff.max_s)
        return self._backoff.delay_s(retry)

    async def _generate_one(self, request: GenerationRequest) -> GenerationResult:
        self._counts["requests"] += 1
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
                text="", finish_reason="error", error=_scrub(f"internal: {type(exc).__name__}: {exc}"), attempts=0
            )
        aiohttp = _aiohttp()
        url = self.base_url + path
        attempts = 0
        last_status: int | None = None
        reason = ""
        retry_after: float | None = None
        start = time.perf_counter()
        while True:
            if attempts > 0:
                self._counts["retries"] += 1
                await asyncio.sleep(self._backoff_s(attempts, retry_after))
            attempts += 1
            self._counts["attempts"] += 1
            retry_after = None
            kind = ""
            try:
                async with semaphore:
                    async with asyncio.timeout(self.timeout_s):
                        async with session.post(
                            url, data=payload, headers=self._headers(), allow_redirects=False
                        ) as response:
                            code = last_status = response.status
                            retry_header = response.headers.get("Retry-After")
                            raw = await read_bounded(response, limit, describe_limit(body, limit))
                if 200 <= code < 300:
                    result = self._parse(request, raw, body)
                    self._counts["succeeded"] += 1
                    return replace(result, latency_s=time.perf_counter() - start, attempts=attempts)
                reason = f"HTTP {code}: {_snippet(raw)}"
                if code == 429:
                    kind = "http_429"
                    retry_after = _retry_after_s(retry_header)
                elif code >= 500:
                    kind = "http_5xx"
                else:
                    self._errors["http_4xx" if code >= 400 else "http_other"] += 1
                    return self._failure(reason + " (not retried)", attempts, start, last_status, request)
            except _Malformed as exc:
                kind, reason = "malformed", f"malformed response: {exc}"
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
            if attempts > self.max_retries:
                return self._failure(reason, attempts, start, last_status, request)

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
        error = _scrub(f"{reason} [{attempts} attempt{'s' if attempts != 1 else ''}{status}]")
        return GenerationResult(
            text="",
            finish_reason="error",
            prompt_ids=request.prompt_ids,
            latency_s=time.perf_counter() - start,
            error=error,
            attempts=attempts,
        )

    def _parse(self, request: GenerationRequest, raw: bytes, body: dict[str, Any]) -> GenerationResult:
        """A result from a 2xx body to the request ``body``; raises ``_Malformed`` for anything
        unusable and ``OversizedResponse`` for a completion longer than ``body`` asked for."""
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise _Malformed(f"invalid JSON body: {_snippet(raw)!r}") from None
        if not isinstance(data, dict):
            raise _Malformed("body is not a JSON object")
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            raise _Malformed("missing or empty 'choices'")
        choice = choices[0]
        if not isinstance(choice, dict):
            raise _Malformed("choices[0] is not an object")
        chat = request.prompt_ids is None
        if chat:
            message = choice.get("message")
            if not isinstance(message, dict):
                raise _Malformed("choices[0] has no 'message'")
            text = message.get("content") or ""
        else:
            if "text" not in choice:
                raise _Malformed("choices[0] has no 'text'")
            text = choice.get("text") or ""
        if not isinstance(text, str):
            raise _Malformed("completion text is not a string")

        usage = data.get("usage")
        reported = usage.get("completion_tokens") if isinstance(usage, dict) else None
        check_completion(text, reported if isinstance(reported, int) else None, body)
        # The completion is stored in the trajectory: no lone surrogates (unwritable as UTF-8)
        # and never the API key, even when the server echoes it.
        text = _scrub(replace_lone_surrogates(text))
        finish_reason = "length" if choice.get("finish_reason") == "length" else "stop"
        tokens, logprobs = _logprobs(choice.get("logprobs"), chat)
        ids = _token_ids(choice.get("token_ids")) or _ids_from_tokens(tokens)
        prompt_ids = request.prompt_ids
        if prompt_ids is None:
            prompt_ids = _token_ids(data.get("prompt_token_ids"))
        return GenerationResult(
            text=text,
            finish_reason=finish_reason,
            completion_ids=ids,
            logprobs=logprobs,
            prompt_ids=prompt_ids,
            usage=self._usage(data.get("usage"), request, text, ids),
        )

    def _usage(
        self, reported: Any, request: GenerationRequest, text: str, ids: tuple[int, ...] | None
    ) -> Usage:
        if isinstance(reported, dict):
            prompt, completion = reported.get("prompt_tokens"), reported.get("completion_tokens")
            if isinstance(prompt, int) or isinstance(completion, int):
                return Usage(
                    prompt_tokens=prompt if isinstance(prompt, int) else None,
                    completion_tokens=completion if isinstance(completion, int) else None,
                    source="reported",
                )
        if self.tokenizer is None:
            return Usage()
        # An estimate: chat-template tokens are not counted.
        if request.prompt_ids is not None:
            prompt_tokens = len(request.prompt_ids)
        else:
            prompt_tokens = sum(self.tokenizer.count(m.get("content") or "") for m in request.messages)
        completion_tokens = len(ids) if ids is not None else self.tokenizer.count(text)
        return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, source="estimated")


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


def _logprobs(block: Any, chat: bool) -> tuple[list[str] | None, tuple[float, ...] | None]:
    """Sampled-token strings and log-probs from a choice's ``logprobs`` (chat or legacy form)."""
    if not isinstance(block, dict):
        return None, None
    if chat:
        content = block.get("content")
        if not isinstance(content, list):
            return None, None
        tokens = [e.get("token") if isinstance(e, dict) else None for e in content]
        values = [e.get("logprob") if isinstance(e, dict) else None for e in content]
    else:
        tokens = block.get("tokens")
        values = block.get("token_logprobs")
        if not isinstance(values, list):
            return None, None
        if not isinstance(tokens, list):
            tokens = [None] * len(values)
    if not all(isinstance(v, (int, float)) for v in values):
        return None, None
    # A NaN or infinite log-prob (JSON's NaN/Infinity, which Python's parser accepts) is no
    # probability: training on it poisons the update, and no record file may hold it.
    bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
    if bad is not None:
        raise _Malformed(f"log-prob of token {bad} is {values[bad]!r}; expected a finite number")
    return tokens, tuple(float(v) for v in values)


def _token_ids(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and all(isinstance(i, int) for i in value):
        return tuple(value)
    return None


def _ids_from_tokens(tokens: list[Any] | None) -> tuple[int, ...] | None:
    """Ids when every token string reads ``token_id:N`` (vLLM ``return_tokens_as_token_ids``)."""
    if not tokens:
        return None
    ids = []
    for token in tokens:
        match = _TOKEN_ID_RE.match(token) if isinstance(token, str) else None
        if match is None:
            return None
        ids.append(int(match.group(1)))
    return tuple(ids)

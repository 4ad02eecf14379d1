"""Which failed HTTP attempts of the OpenAI backend are retried, and how long to wait.

Real servers answer deterministic request errors with 500 as well as 400 (llama.cpp: an
unsupported ``response_format``, a token-id prompt, a prompt past the context size); retrying
those only multiplies the failure. The rule (docs/design.md §4):

- retried: connection errors, timeouts, a malformed 2xx body, and HTTP ``RETRIED_STATUSES``
  (408, 429, 500, 502, 503, 504), except a 500 whose body states a request error
  (``request_error``: an error ``type`` of ``REQUEST_ERROR_TYPES`` or a message holding one of
  ``REQUEST_ERROR_MARKERS``);
- not retried: every other status (4xx, 501, 505, ...), a 500 stating a request error, a body
  larger than the request can return (``response_limits``);
- a 2xx body that is not JSON: a JSON answer cut short (it starts as JSON and says it is) is
  retried like a dropped connection; a body that is no API answer at all (``foreign_body``: an
  HTML page, plain text: a proxy or login page, another service on the port) is retried at most
  ``FOREIGN_BODY_RETRIES`` time(s), then the request fails quoting it (``describe_body``). A
  server whose first ``NOT_JSON_LIMIT`` answers are all not JSON (none was) is taken to be no
  OpenAI-compatible API: every later request fails at once naming it, instead of each spending
  the retry window (minutes per task). openai-python never retries a 2xx body it cannot read
  (its retries go by status and connection; the body raises a ``JSONDecodeError``, or
  ``APIResponseValidationError`` under strict validation); one retry here bridges a proxy's page
  shown for a moment.

A retried request waits with exponential backoff and "equal jitter" (``backoff_s``: half the
step fixed, half random, so a run of retries spans a known minimum time), or as long as the
server's ``Retry-After`` says on a 429 or 503 (capped); it stops after ``max_retries`` retries or
once ``retry_window_s`` has passed since its first failure, whichever comes first
(``OpenAIBackend``).
"""

from __future__ import annotations

import json
from typing import Any

from memsearch.http_client import Backoff

RETRIED_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# Retries of one request after 2xx bodies that are no API answer at all (``foreign_body``).
FOREIGN_BODY_RETRIES = 1
# A server's first answers all not JSON, this many: it is no OpenAI-compatible API (module doc); one
# more than the reliability suite's most faults in a row for one request, so such a streak at the
# start of a run still gets through.
NOT_JSON_LIMIT = 4
# How much of such a body a message quotes.
BODY_CHARS = 120
# Statuses whose Retry-After header is honoured.
RETRY_AFTER_STATUSES = frozenset({429, 503})

# ``error.type`` values servers give a bad request (OpenAI / vLLM / SGLang / llama.cpp spellings).
REQUEST_ERROR_TYPES = frozenset({
    "invalid_request_error", "badrequesterror", "bad_request", "not_supported_error", "exceed_context_size_error",
    "not_found_error", "notfounderror", "validation_error",
})
# Phrases of a 500's message that state a request error (lower case). Seen in the wild: llama.cpp's
# `"response_format" must be one of ...`, `the request exceeds the available context size`,
# `Only one completion choice is allowed`; vLLM's `This model's maximum context length is ...`.
REQUEST_ERROR_MARKERS = (
    "context size", "context length", "context window", "maximum context", "prompt is too long",
    "input is too long", "unsupported", "not supported", "must be", "is required", "invalid", "not allowed",
    "only one completion choice",
)


def error_object(raw: bytes) -> tuple[str, str]:
    """``(type, message)`` of an error body (``{"error": {...}}``, ``{"error": "..."}``,
    FastAPI's ``{"detail": ...}`` or plain text), as written; empty strings where absent."""
    try:
        data: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return "", raw[:2000].decode("utf-8", errors="replace")
    if not isinstance(data, dict):
        return "", str(data)[:2000]
    error = data.get("error", data.get("detail", data))
    if isinstance(error, dict):
        kind = error.get("type") or error.get("code") or ""
        message = error.get("message") or error.get("detail") or ""
        return str(kind), str(message)[:2000]
    return "", str(error)[:2000]


def _error_object(raw: bytes) -> tuple[str, str]:
    """``error_object`` lower-cased, for matching types and markers."""
    kind, message = error_object(raw)
    return kind.lower(), message.lower()


def request_error(raw: bytes) -> str | None:
    """What in an error body states a request error (its type or a marker phrase), else ``None``."""
    kind, message = _error_object(raw)
    if kind in REQUEST_ERROR_TYPES:
        return f"error type {kind!r}"
    marker = next((m for m in REQUEST_ERROR_MARKERS if m in message), None)
    return f"the message says {marker!r}" if marker else None


def status_retried(status: int, raw: bytes) -> tuple[bool, str]:
    """Whether an attempt that got HTTP ``status`` with body ``raw`` is retried, and why not."""
    if status not in RETRIED_STATUSES:
        return False, "not retried: a deterministic answer"
    if status == 500 and (why := request_error(raw)):
        return False, f"not retried: a request error ({why})"
    return True, ""


def foreign_body(raw: bytes, content_type: str | None) -> bool:
    """Whether a 2xx body that is not JSON is no API answer at all, rather than a JSON answer cut
    short: its Content-Type names no JSON, or it does not start as a JSON object or array does."""
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind and "json" not in kind:
        return True
    return raw.lstrip()[:1] not in (b"{", b"[")


def describe_body(raw: bytes, content_type: str | None) -> str:
    """A body for a message: its content type and its first ``BODY_CHARS`` characters, on one line."""
    text = " ".join(raw[:BODY_CHARS * 4].decode("utf-8", errors="replace").split())[:BODY_CHARS]
    return f"Content-Type {content_type or 'not given'}, body " + (f"starts {text!r}" if text else "empty")


class NotJsonAnswers:
    """A server's 2xx bodies that were not JSON (module doc): the first is said at once (a warning
    line, ``warn``), and once its first ``NOT_JSON_LIMIT`` answers all were, ``refusal`` says why
    every later request fails at once."""

    def __init__(self, base_url: str, warn) -> None:
        self.base_url, self.warn = base_url, warn
        self.json_answered = False  # a 2xx body was JSON: the server speaks the API's format
        self.at_start = 0  # bodies that were not JSON before one was
        self.said = False

    def note(self, code: int, raw: bytes, content_type: str | None) -> str | None:
        """One more such body; returns the refusal of every later request, once it is decided."""
        body = describe_body(raw, content_type)
        if not self.said:
            self.said = True
            self.warn(f"openai backend {self.base_url}: HTTP {code} with a body that is not JSON ({body}); retried, "
                      "but a server that keeps answering so is no OpenAI-compatible API at this base_url: check it")
        if self.json_answered:
            return None
        self.at_start += 1
        if self.at_start < NOT_JSON_LIMIT:
            return None
        return (f"the server at {self.base_url} answers with bodies that are not JSON: its first {self.at_start} "
                f"answers were (last: HTTP {code}, {body}); it is no OpenAI-compatible API at this base_url (a proxy "
                "or login page, another service on this port?): check base_url and the server")

    def foreign_failure(self, code: int, raw: bytes, content_type: str | None) -> str:
        """Why a request fails after ``FOREIGN_BODY_RETRIES`` bodies that are no API answer."""
        return (f"HTTP {code} with a body that is not JSON ({describe_body(raw, content_type)}): no answer of an "
                f"OpenAI-compatible API (a proxy or login page, another service on this port?); check base_url "
                f"{self.base_url} (not retried again)")


def retry_after_s(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (the HTTP-date form is ignored)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def backoff_s(backoff: Backoff, retry: int, retry_after: float | None) -> float:
    """The wait before retry number ``retry`` (1-based): ``Retry-After`` when the server gave one,
    else equal jitter, uniform in [step / 2, step] with step = min(max_s, base_s * 2**(retry-1));
    always at most ``backoff.max_s``."""
    if retry_after is not None:
        return min(retry_after, backoff.max_s)
    step = min(backoff.max_s, backoff.base_s * 2 ** (retry - 1))
    return step / 2 + backoff.delay_s(retry) / 2  # delay_s is uniform in [0, step]

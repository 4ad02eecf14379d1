"""How large an OpenAI-compatible server's answer may be, and reading it within that bound.

A misbehaving server (or a proxy in front of it) may answer a 64-token request with 30 MB of
text, or with a 1 MB gzip body that inflates to 1 GiB; read whole, either lands in memory and
then in ``trajectories.jsonl``. So ``OpenAIBackend`` (``backends/openai.py``) reads every body
through ``read_bounded``, which stops at ``response_byte_limit(body)``: what the request can
legitimately return, derived from the request itself, with a generous factor and a floor so a
real server's answer is never refused:

- ``FLOOR_BYTES`` (1 MiB) for the envelope, ids, usage and any server-specific fields;
- per completion token asked (``max_tokens`` x ``n`` choices): ``TEXT_BYTES_PER_TOKEN`` (a token is
  a few characters; JSON-escaped non-ASCII is six bytes a character, plus its id), and
  ``LOGPROB_BYTES_PER_ENTRY`` for each log-prob entry asked (the sampled token and each top
  alternative);
- ``ECHO_BYTES_PER_REQUEST_BYTE`` per byte of the request body, for what a server echoes of the
  prompt (``prompt_token_ids``, prompt log-probs).

The bound is on the decoded (inflated) bytes and on the compressed ones (``memsearch.http_client``).
A completion's text is bounded too, by the tokens asked (``check_completion``): at most
``MAX_CHARS_PER_TOKEN`` characters a token, and, where the server reports usage, no more
completion tokens than asked. Either failure is an ``OversizedResponse``: the request's errored
result names the bound, and nothing of the body is kept.
"""

from __future__ import annotations

from typing import Any

from memsearch.http_client import BodyTooLarge, read_bounded

__all__ = ["OversizedResponse", "asked_tokens", "check_completion", "describe_limit", "read_bounded",
           "response_byte_limit"]

FLOOR_BYTES = 1 << 20
TEXT_BYTES_PER_TOKEN = 256
LOGPROB_BYTES_PER_ENTRY = 512
ECHO_BYTES_PER_REQUEST_BYTE = 32
# The longest tokens of common vocabularies (runs of spaces or dashes) are well under this.
MAX_CHARS_PER_TOKEN = 256
# Asked for when a request names no token limit (never, from memsearch's own requests).
UNBOUNDED_MAX_TOKENS = 32_768


# A body or completion larger than its request can legitimately return (not retried).
OversizedResponse = BodyTooLarge


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def asked_tokens(body: dict[str, Any]) -> int:
    """The completion tokens ``body`` asks for, one choice."""
    return _int(body.get("max_tokens", body.get("max_completion_tokens")), UNBOUNDED_MAX_TOKENS)


def response_byte_limit(body: dict[str, Any], request_bytes: int) -> int:
    """The most bytes (decoded) an answer to ``body`` may have; see the module doc."""
    choices = max(1, _int(body.get("n"), 1))
    per_token = TEXT_BYTES_PER_TOKEN
    logprobs = body.get("logprobs")
    if logprobs is True:  # chat: the sampled token's entry plus ``top_logprobs`` alternatives
        per_token += LOGPROB_BYTES_PER_ENTRY * (1 + _int(body.get("top_logprobs"), 0))
    elif isinstance(logprobs, int) and not isinstance(logprobs, bool):  # legacy: number of alternatives
        per_token += LOGPROB_BYTES_PER_ENTRY * (1 + _int(logprobs, 0))
    return FLOOR_BYTES + choices * asked_tokens(body) * per_token + ECHO_BYTES_PER_REQUEST_BYTE * request_bytes


def describe_limit(body: dict[str, Any], limit: int) -> str:
    logprobs = "yes" if body.get("logprobs") not in (None, False) else "no"
    return (f"the {limit:,}-byte cap for this request (max_tokens={asked_tokens(body)}, "
            f"n={max(1, _int(body.get('n'), 1))}, logprobs: {logprobs})")


def check_completion(text: str, completion_tokens: int | None, body: dict[str, Any]) -> None:
    """``OversizedResponse`` when ``text`` (or the server's reported ``completion_tokens``) is
    more than the tokens ``body`` asked for allow."""
    asked = asked_tokens(body)
    choices = max(1, _int(body.get("n"), 1))
    if completion_tokens is not None and completion_tokens > asked * choices:
        raise OversizedResponse(f"the server reports {completion_tokens:,} completion tokens, more than the "
                                f"{asked * choices:,} asked (max_tokens={asked}, n={choices})")
    most_chars = asked * MAX_CHARS_PER_TOKEN
    if len(text) > most_chars:
        raise OversizedResponse(f"the completion has {len(text):,} characters, more than max_tokens={asked} "
                                f"tokens can hold (at most {MAX_CHARS_PER_TOKEN} characters a token)")

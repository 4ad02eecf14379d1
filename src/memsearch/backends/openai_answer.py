"""Reading an OpenAI-compatible server's answer into a ``GenerationResult`` (``OpenAIBackend``'s
parser), and keeping the API key out of everything read: the text, usage, log-probs and token
ids of a chat or legacy completion, each checked, so a body that is not a usable completion is a
``Malformed`` answer (retried) and one larger than the request asked for an ``OversizedResponse``.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

from memsearch.backends.base import GenerationRequest, GenerationResult, Usage
from memsearch.backends.response_limits import asked_tokens, check_completion
from memsearch.text.safe_text import replace_lone_surrogates
from memsearch.tokenizer import Tokenizer

API_KEY_ENV = "MEMSEARCH_API_KEY"

# vLLM returns token strings in logprobs; with ``return_tokens_as_token_ids`` they read
# "token_id:123", which is the only way to get completion ids from its chat endpoint.
_TOKEN_ID_RE = re.compile(r"^token_id:(-?\d+)$")
_SNIPPET_CHARS = 200


# Shorter keys are not scrubbed: replacing a 1-character "key" would mangle every message, and
# no real API key is that short.
MIN_SCRUBBED_KEY_CHARS = 8


def scrub(text: str) -> str:
    """``text`` with the API key (if one of at least 8 characters is set) replaced, for anything
    we log, return or store, completions included (a server may echo the key back)."""
    key = os.environ.get(API_KEY_ENV)
    if key and len(key) >= MIN_SCRUBBED_KEY_CHARS:
        text = text.replace(key, "***")
    return text


def scrubbed(value: Any) -> Any:
    """A JSON value with the API key scrubbed from every string in it (server-given records)."""
    return json.loads(scrub(json.dumps(value, ensure_ascii=False)))


def snippet(raw: bytes) -> str:
    """The start of a body on one line, for an error message."""
    text = raw[:_SNIPPET_CHARS].decode("utf-8", errors="replace").strip()
    return " ".join(text.split())


class Malformed(Exception):
    """A 2xx response whose body is not a usable completion (retried)."""


class NotJson(Malformed):
    """A 2xx response whose body is not JSON at all (``retry_policy``: how often it is retried)."""


def parse_answer(request: GenerationRequest, raw: bytes, body: dict[str, Any],
                 tokenizer: Tokenizer | None) -> GenerationResult:
    """A result from a 2xx body to the request ``body``; raises ``Malformed`` for anything
    unusable and ``OversizedResponse`` for a completion longer than ``body`` asked for."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise NotJson(f"invalid JSON body: {snippet(raw)!r}") from None
    if not isinstance(data, dict):
        raise Malformed("body is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise Malformed("missing or empty 'choices'")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise Malformed("choices[0] is not an object")
    chat = request.prompt_ids is None
    if chat:
        message = choice.get("message")
        if not isinstance(message, dict):
            raise Malformed("choices[0] has no 'message'")
        text = message.get("content") or ""
    else:
        if "text" not in choice:
            raise Malformed("choices[0] has no 'text'")
        text = choice.get("text") or ""
    if not isinstance(text, str):
        raise Malformed("completion text is not a string")

    usage = data.get("usage")
    reported = usage.get("completion_tokens") if isinstance(usage, dict) else None
    check_completion(text, reported if isinstance(reported, int) else None, body)
    # The completion is stored in the trajectory: no lone surrogates (unwritable as UTF-8)
    # and never the API key, even when the server echoes it.
    text = scrub(replace_lone_surrogates(text))
    finish_reason = "length" if choice.get("finish_reason") == "length" else "stop"
    tokens, logprobs = _logprobs(choice.get("logprobs"), chat)
    # Completion ids: vLLM and SGLang ``token_ids`` per choice (asked with ``return_token_ids``),
    # SGLang's ``response_token_ids`` in some versions, vLLM's "token_id:N" log-prob tokens.
    ids = (_token_ids(choice.get("token_ids")) or _token_ids(choice.get("response_token_ids"))
           or _ids_from_tokens(tokens))
    prompt_ids = request.prompt_ids
    if prompt_ids is None:  # vLLM: top level; SGLang: per choice
        prompt_ids = _token_ids(data.get("prompt_token_ids")) or _token_ids(choice.get("prompt_token_ids"))
    # Cut short by the context, not by max_tokens: fewer tokens than asked (counted by the
    # server or by the ids it returned; unknown counts are not guessed).
    given = reported if isinstance(reported, int) else (len(ids) if ids is not None else None)
    return GenerationResult(
        text=text,
        finish_reason=finish_reason,
        completion_ids=ids,
        logprobs=logprobs,
        prompt_ids=prompt_ids,
        usage=_usage(data.get("usage"), request, text, ids, tokenizer),
        context_truncated=finish_reason == "length" and given is not None and given < asked_tokens(body),
    )


def _usage(reported: Any, request: GenerationRequest, text: str, ids: tuple[int, ...] | None,
           tokenizer: Tokenizer | None) -> Usage:
    if isinstance(reported, dict):
        prompt, completion = reported.get("prompt_tokens"), reported.get("completion_tokens")
        if isinstance(prompt, int) or isinstance(completion, int):
            return Usage(
                prompt_tokens=prompt if isinstance(prompt, int) else None,
                completion_tokens=completion if isinstance(completion, int) else None,
                source="reported",
            )
    if tokenizer is None:
        return Usage()
    # An estimate: chat-template tokens are not counted.
    if request.prompt_ids is not None:
        prompt_tokens = len(request.prompt_ids)
    else:
        prompt_tokens = sum(tokenizer.count(m.get("content") or "") for m in request.messages)
    completion_tokens = len(ids) if ids is not None else tokenizer.count(text)
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, source="estimated")


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
        raise Malformed(f"log-prob of token {bad} is {values[bad]!r}; expected a finite number")
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

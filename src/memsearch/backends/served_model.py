"""What an OpenAI-compatible server says it serves: its ``GET {base_url}/models`` answer, read into
the identity a run records and checked against the configured model name.

``served_entry`` is the one blocking check (a server a run starts or a stage hands over must
list the model); the ``openai`` backend reads the same answer without blocking.

A server that lists models must list the configured one: a request for ``no-such-model`` may
still get a 200 (llama.cpp answers any name with its one model), so the check is the only place
a wrong name shows. A server without a model list (``/models`` not found, not a list) cannot be
checked: the identity says so (``verified: false``) and the run goes on. The identity is the
listed entry as the server gives it (``id``, ``owned_by``, ``created`` and any extra field, e.g.
vLLM's ``max_model_len`` and ``root``, llama.cpp's ``meta``).
"""

from __future__ import annotations

import json
from typing import Any

from memsearch.errors import InputError

# Most ids quoted in an error; a hub-backed server may list hundreds.
_QUOTED_IDS = 20
# Context-length fields of a /models entry: vLLM and SGLang (max_model_len), LM Studio and
# hosted routers (context_length).
CONTEXT_FIELDS = ("max_model_len", "context_length")
DEFAULT_REMEDY = ("set the backend's model to the served name (vLLM and SGLang: --served-model-name; transformers "
                  "serve: the model folder or hub id it was started with)")


def unverified(base_url: str, model: str, why: str) -> dict[str, Any]:
    """The identity of a served model that could not be checked, saying why."""
    return {"base_url": base_url, "model": model, "verified": False, "entry": None, "note": why}


def identity_from_models(raw: bytes, status: int, base_url: str, model: str, setting: str = "model",
                         remedy: str = DEFAULT_REMEDY) -> dict[str, Any]:
    """The served identity from a ``/models`` answer (``status``, body ``raw``); ``InputError``
    when the server lists models and ``model`` is not one of them (the message names ``setting``,
    the configured key, and says ``remedy``)."""
    if not 200 <= status < 300:
        return unverified(base_url, model, f"GET /models answered HTTP {status}: the server lists no models")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return unverified(base_url, model, "GET /models answered a body that is not JSON")
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        return unverified(base_url, model, "GET /models answered no list of models ('data')")
    entries = [e for e in entries if isinstance(e, dict)]
    by_id = {entry.get("id"): entry for entry in entries}
    if model in by_id:
        entry = by_id[model]
        identity = {"base_url": base_url, "model": model, "verified": True, "entry": entry, "note": None}
        # An adapter (vLLM, SGLang: --lora-modules) names the model it runs on as its parent:
        # that entry is the rest of what answers, and states the context.
        parent = entry.get("parent")
        if isinstance(parent, str) and parent != model and isinstance(by_id.get(parent), dict):
            identity["base_entry"] = by_id[parent]
        return identity
    ids = [str(e.get("id")) for e in entries]
    shown = ", ".join(repr(i) for i in ids[:_QUOTED_IDS]) + (f" and {len(ids) - _QUOTED_IDS} more"
                                                            if len(ids) > _QUOTED_IDS else "")
    raise InputError(f"{setting} {model!r} is not served at {base_url}: its /models lists {shown}; {remedy}")


def served_entry(url: str, model: str, timeout_s: float = 10.0, *, setting: str = "model",
                 remedy: str = DEFAULT_REMEDY, unreachable: str = "is the server running?") -> dict[str, Any]:
    """The ``{url}/models`` entry of ``model`` (``url``: the API root, ``.../v1``), for a server that
    must prove what it serves (one a run started, or a stage hands over): read as
    ``identity_from_models`` reads it, and an ``InputError`` when the server does not answer
    (``unreachable`` says what to do), lists no models, or lists others (``setting``, ``remedy``)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=timeout_s) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, b""
    except (OSError, ValueError) as exc:
        raise InputError(f"{url}: GET /models failed ({type(exc).__name__}: {exc}); {unreachable}") from None
    identity = identity_from_models(raw, status, url, model, setting, remedy)
    if not identity["verified"]:
        raise InputError(f"{url}: {identity['note']}, so it cannot show it serves {setting} {model!r}; {remedy}")
    return identity["entry"]


def listed_context(identity: dict[str, Any] | None) -> int | None:
    """The context length (tokens) the server's /models entry states, else ``None``."""
    for key in ("entry", "base_entry"):  # an adapter's own entry, else its base model's
        entry = (identity or {}).get(key) or {}
        for name in CONTEXT_FIELDS:
            value = entry.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None

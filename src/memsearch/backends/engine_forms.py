"""What each OpenAI-compatible engine accepts beyond the OpenAI API: the one place of these facts.

Engines differ in the request fields that constrain output and return token ids, and an engine
answers a field it does not know with HTTP 200 and free text (vLLM since 0.12 for the removed
``guided_*`` fields; only its log says so). So the OpenAI backend sends only a form the engine is
known to honour, refuses a configured form the engine is known to drop before the first request,
and checks every constrained answer where the engine is unknown (``backends.openai``).

Engines, as ``GET /models`` names them (``owned_by``) or as configured (``engine``):

===============  ============================  ===================================================
engine           ``owned_by``                  schema forms honoured (first: what ``auto`` sends)
===============  ============================  ===================================================
``vllm``         ``vllm``                      ``response_format``, ``structured_outputs``
``sglang``       ``sglang``                    ``response_format``
``llama.cpp``    ``me`` (llama-cpp-python)     ``json_object_schema``
``llama-server`` ``llamacpp`` (llama.cpp's)    ``llama_cpp``, ``response_format``
``transformers`` (any other)                   none: `transformers serve` ignores every form
===============  ============================  ===================================================

Read in the engines' sources: vLLM 0.32 (``entrypoints/serve/engine/protocol.py``: the removed
``guided_*`` fields are extra fields, ignored; ``response_format`` json_schema and
``structured_outputs.json`` constrain, checked here against a running server), SGLang
(``entrypoints/openai/protocol.py``: ``response_format``; ``return_token_ids`` with ``token_ids``
and ``prompt_token_ids`` per choice), llama-cpp-python's server (``response_format = {"type":
"json_object", "schema": ...}``), llama.cpp's ``llama-server`` (top-level ``json_schema``).
Only vLLM ran here; the rest is as read.
"""

from __future__ import annotations

import re
from typing import Any

from memsearch.config.backend import DEAD_SCHEMA_STYLES, ENGINES, SCHEMA_STYLES
from memsearch.text.constraint import Constraint

__all__ = ["DEAD_SCHEMA_STYLES", "ENGINES", "HONOURED", "SCHEMA_STYLES", "TOKEN_IDS_FIELD", "constraint_body",
           "engine_of", "resolved_style", "style_refusal"]

# ``owned_by`` of a /models entry -> the engine that wrote it.
_OWNERS: dict[str, str] = {"vllm": "vllm", "sglang": "sglang", "me": "llama.cpp", "llamacpp": "llama-server"}

# The schema forms each engine honours, the one ``auto`` picks first. ``other``: unknown, so the
# OpenAI form is sent and each answer checked (``backends.openai``).
HONOURED: dict[str, tuple[str, ...]] = {
    "vllm": ("response_format", "structured_outputs"),
    "sglang": ("response_format",),
    "llama.cpp": ("json_object_schema",),
    "llama-server": ("llama_cpp", "response_format"),
    "transformers": (),
    "other": ("response_format", "structured_outputs", "json_object_schema", "llama_cpp"),
}

# Engines that return completion (and prompt) token ids when asked with this field.
TOKEN_IDS_FIELD: dict[str, str] = {"vllm": "return_token_ids", "sglang": "return_token_ids"}

# OpenAI's json_schema "name": letters, digits, '_' and '-', at most 64 characters.
_SCHEMA_NAME_RE = re.compile(r"[^A-Za-z0-9_-]")


def engine_of(identity: dict[str, Any] | None) -> str:
    """The engine a served identity's /models entry names (``owned_by``), else ``"other"``.
    `transformers serve` writes the model's organisation there, so it reads as ``"other"``."""
    entry = (identity or {}).get("entry") or {}
    return _OWNERS.get(str(entry.get("owned_by")), "other")


def resolved_style(schema_style: str, engine: str) -> str | None:
    """The form to send to ``engine`` for ``schema_style``; ``None`` when the engine honours
    none (`transformers serve`)."""
    honoured = HONOURED[engine]
    if schema_style == "auto":
        return honoured[0] if honoured else None
    return schema_style if schema_style in honoured else None


def style_refusal(schema_style: str, engine: str) -> str | None:
    """Why ``schema_style`` cannot constrain ``engine``'s output, else ``None``."""
    if resolved_style(schema_style, engine) is not None:
        return None
    honoured = HONOURED[engine]
    if not honoured:
        return (f"the {engine} server constrains no output (it answers every schema form with free text); "
                "serve the model with vLLM or SGLang, or set schema_mode = false for this role")
    return (f"the {engine} server ignores schema_style {schema_style!r} (it honours {', '.join(honoured)}); "
            "set schema_style = 'auto'")


def constraint_body(constraint: Constraint | None, style: str) -> dict[str, Any]:
    """Request-body fields that enforce ``constraint`` in form ``style`` (a resolved style):

    - ``response_format``: ``{"type": "json_schema", "json_schema": {"name": ..., "schema": ...}}``
      (OpenAI's structured output; vLLM, SGLang, llama-server);
    - ``structured_outputs``: ``{"json": schema}`` (vLLM's own field);
    - ``json_object_schema``: ``response_format = {"type": "json_object", "schema": ...}``
      (llama-cpp-python's server);
    - ``llama_cpp``: top-level ``json_schema = schema`` (llama.cpp's llama-server).

    A ``choices`` constraint is sent as vLLM's ``structured_outputs = {"choice": [...]}``, the one
    engine with a choice form; elsewhere use a JSON schema with an ``enum``."""
    if constraint is None:
        return {}
    if constraint.choices is not None:
        return {"structured_outputs": {"choice": list(constraint.choices)}}
    schema = constraint.json_schema
    if style == "response_format":
        name = _SCHEMA_NAME_RE.sub("_", constraint.id)[:64] or "schema"
        return {"response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}}
    if style == "structured_outputs":
        return {"structured_outputs": {"json": schema}}
    if style == "json_object_schema":
        return {"response_format": {"type": "json_object", "schema": schema}}
    if style == "llama_cpp":
        return {"json_schema": schema}
    raise ValueError(f"unknown schema style {style!r}; valid: {', '.join(SCHEMA_STYLES[1:])}")

"""The settings of one role's backend (``RunConfig.backends.<role>``): which kind answers its
calls and what that kind reads. Kept beside ``memsearch.config`` (which re-exports
``BackendConfig`` and ``Sampling``); ``kind`` is any kind registered in ``memsearch.registry``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from memsearch.config.strict import KeyProblems, StrictConfig, config_check
from memsearch.registry import BACKEND_KINDS, BackendKindName


class Sampling(StrictConfig):
    """Decoding parameters of a backend."""

    temperature: float = Field(0.0, ge=0.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass")
    seed: int | None = Field(0, description="Sampling seed (per request it is combined with the task id)")


# Requests in flight of an openai backend unless set (``BackendConfig.max_concurrency``).
OPENAI_MAX_CONCURRENCY = 8
# Request-body fields memsearch sets itself, which ``extra_body`` may not replace, and where to set each.
_OWNED_BODY_FIELDS = {
    **dict.fromkeys(("model", "messages", "prompt", "stream", "n"), "the request itself"),
    **dict.fromkeys(("temperature", "top_p", "seed"), "the backend's [sampling] table"),
    **dict.fromkeys(("max_tokens", "max_completion_tokens"), "the budgets"),
    **dict.fromkeys(("stop",), "the engine"),
    **dict.fromkeys(("logprobs", "top_logprobs"), "asked only where a trainer reads them"),
    **dict.fromkeys(("response_format", "guided_json", "json_schema", "guided_choice", "structured_outputs"),
                    "schema_mode and schema_style"),
}


class BackendConfig(StrictConfig):
    """Which backend answers one role's calls."""

    kind: BackendKindName = Field(
        "rules",
        description="rules | hf (local transformers) | openai (HTTP server) | oracle (gold teacher from train labels), "
        "or a kind registered with backends.registry.register_backend",
    )
    model: str = Field("embedded", description="hf: 'embedded' or a local model folder; openai: the served model name")
    adapter: str | None = Field(None, description="hf: a LoRA adapter folder")
    base_url: str | None = Field(
        None, description="openai: e.g. http://127.0.0.1:8000/v1 (key only from MEMSEARCH_API_KEY)"
    )
    max_concurrency: int = Field(
        16, ge=1,
        description=f"openai: requests in flight (default {OPENAI_MAX_CONCURRENCY}: a server that answers one request "
        "at a time queues the rest, and their timeout runs while they queue there); hf: largest dynamic batch "
        "(default 16)",
    )
    timeout_s: float = Field(
        120.0, gt=0,
        description="openai: limit of one attempt (connect, send, whole answer), counted from when it holds one of "
        "the max_concurrency slots: waiting for a slot is not timed, waiting inside the server is",
    )
    max_retries: int = Field(
        8, ge=0,
        description="openai: retries of a request at most; retried: connection errors, timeouts, malformed answers, "
        "HTTP 408, 429, 502, 503, 504 and a 500 whose body states no request error; never a 4xx or a 500 naming a "
        "request error (context size, unsupported field): docs/design.md §4",
    )
    retry_window_s: float = Field(
        60.0, ge=0,
        description="openai: no retry starts later than this many seconds after the request's first failure. The "
        "waits double from 0.25-0.5 s to 7.5-15 s (or the server's Retry-After on 429/503, at most 15 s), so the "
        "default 8 retries span 30-60 s: a server restart within that is bridged",
    )
    extra_body: dict[str, Any] | None = Field(
        None,
        description="openai: engine-specific fields added to every request body, recorded in summary.json "
        "(backend_stats: sent). Servers apply their own defaults to what a request does not name: llama-cpp-python's "
        "server repeat_penalty 1.1, top_k 40, min_p 0.05 (neutralise: {repeat_penalty = 1.0, top_k = 0, min_p = "
        "0.0}); vLLM the model's generation_config.json (start it with --generation-config vllm, or send "
        "repetition_penalty = 1.0). vLLM token ids: {return_tokens_as_token_ids = true}. Fields memsearch sets "
        "(model, messages, sampling, max_tokens, log-probs, the schema) are refused here",
    )
    schema_style: Literal["response_format", "guided_json", "llama_cpp"] = Field(
        "response_format",
        description="openai, schema_mode: how the JSON schema is sent: response_format (OpenAI json_schema form: "
        "vLLM >= 0.6, SGLang, OpenAI), guided_json (older vLLM), llama_cpp (llama.cpp server's top-level "
        "json_schema). Answers are checked against the schema; a server whose first 3 constrained answers all "
        "fail it ignored the form, and every later request fails naming it",
    )
    context_tokens: int | None = Field(
        None, ge=1,
        description="openai: the server's context in tokens; a call whose reported prompt + completion tokens "
        "exceed it fails (not retried: `transformers serve` answers 200 past the model's context). Unset: the "
        "max_model_len the server's /models lists (vLLM, SGLang), else unchecked",
    )
    sampling: Sampling = Field(default_factory=Sampling, description="Decoding parameters")
    schema_mode: bool = Field(
        False,
        description="hf: sample memory operations (decision mode) from the distribution renormalized on the "
        "tokens the memory-ops JSON schema allows; the mask is recorded so training replays it. openai: the server "
        "constrains them (schema_style); nothing replayable is recorded",
    )

    @model_validator(mode="before")
    @classmethod
    def _openai_concurrency(cls, data: Any) -> Any:
        # One field, two defaults: an HTTP client's slots are not a local decoder's batch.
        if isinstance(data, dict) and data.get("kind") == "openai" and "max_concurrency" not in data:
            return {**data, "max_concurrency": OPENAI_MAX_CONCURRENCY}
        return data
    open_items: bool = Field(
        False,
        description="oracle (decision memory): also write open sub-questions (kind 'open') from the train "
        "labels, each citing the shown evidence it was inferred from, and DELETE one once it is resolved. HotpotQA: "
        "'Find: <title>' for a gold paragraph the question does not name and no evidence of it was shown yet, once a "
        "shown gold sentence names that title (the bridge entity); MuSiQue: the next decomposition sub-question whose "
        "earlier answers ('#1', ...) a shown gold paragraph holds, with those answers filled in. Facts come first: an "
        "open item is written only if it still fits the memory budget (the open-items control, docs/memory_policy.md)",
    )

    @config_check
    def _oracle_only(self, context: dict[str, Any]) -> None:
        if self.open_items and self.kind != "oracle":
            raise KeyProblems((
                "open_items", f"open_items is an option of the oracle teacher (it reads labels); kind is {self.kind!r}"
            ))

    @config_check
    def _openai_fields(self, context: dict[str, Any]) -> None:
        given = [name for name, default in (("extra_body", None), ("schema_style", "response_format"),
                                            ("context_tokens", None)) if getattr(self, name) != default]
        if self.kind != "openai":
            if given:
                raise KeyProblems(*[(name, f"read by kind 'openai' only (an HTTP server); kind is {self.kind!r}: "
                                     "remove it") for name in given])
            return
        problems = []
        for key in sorted(set(self.extra_body or {}) & set(_OWNED_BODY_FIELDS)):
            problems.append((f"extra_body.{key}", f"set by memsearch ({_OWNED_BODY_FIELDS[key]}); remove it here"))
        try:
            json.dumps(self.extra_body, allow_nan=False)
        except (TypeError, ValueError) as exc:
            problems.append(("extra_body", f"not JSON ({exc}); use strings, numbers, booleans, arrays and tables"))
        if problems:
            raise KeyProblems(*problems)

    @config_check
    def _read_by_the_kind(self, context: dict[str, Any]) -> None:
        # rules and oracle run no model: a value they never read is a config meant for another
        # kind, refused rather than ignored. The model a pipeline fills into every role
        # (``pipelines.config.episode_table``: 'embedded' or its local model folder) is let be.
        if BACKEND_KINDS.get(self.kind).runs_model:
            return
        problems = [(name, f"kind {self.kind!r} runs no model, so {name} is never read; remove it, or set kind = "
                     f"'{'hf' if name == 'adapter' else 'openai'}'")
                    for name in ("adapter", "base_url") if getattr(self, name) is not None]
        if self.model != "embedded" and not Path(self.model).is_dir():
            problems.append(("model", f"kind {self.kind!r} runs no model, so model is never read, and {self.model!r} "
                             "is no local folder either; remove it, or set kind = 'hf' or 'openai'"))
        if problems:
            raise KeyProblems(*problems)

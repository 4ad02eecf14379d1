"""The settings of one role's backend (``RunConfig.backends.<role>``): which kind answers its
calls and what that kind reads. ``BackendConfig`` holds what every kind shares (``kind``,
``sampling``, ``schema_mode``); each kind has a settings model of its own with only the keys it
reads (``RulesSettings``, ``OracleSettings``, ``HFSettings``, ``OpenAISettings``, or the model a
kind registered in ``memsearch.registry`` names). A field typed ``BackendConfig`` holds the model
its ``kind`` picks, validated by it and dumped with its keys. Kept beside ``memsearch.config``,
which re-exports these names.

A key of another kind is refused naming it, its kind and the configured kind. A config.json of
an earlier version holds every kind's keys: how that flat form is read is ``config.flat_form``.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal, get_args

from pydantic import (
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    ValidationInfo,
    model_serializer,
    model_validator,
)
from pydantic_core import core_schema

from memsearch.config.flat_form import FLAT_FIELDS, filled_model, flat_default, unset_in_flat_form
from memsearch.config.strict import KeyProblems, StrictConfig, config_check, validation_problems, without_default
from memsearch.registry import BACKEND_KINDS, BackendKindName, backend_settings, either


class Sampling(StrictConfig):
    """Decoding parameters of a backend."""

    temperature: float = Field(0.0, ge=0.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass")
    seed: int | None = Field(0, description="Sampling seed (per request it is combined with the task id)")


# The engines an openai backend knows (``backends.engine_forms``: what each honours), the schema
# forms it can send, and forms no current engine honours, refused with what to use instead.
ENGINES: tuple[str, ...] = ("vllm", "sglang", "llama.cpp", "llama-server", "transformers", "other")
SCHEMA_STYLES: tuple[str, ...] = ("auto", "response_format", "structured_outputs", "json_object_schema", "llama_cpp")
DEAD_SCHEMA_STYLES: dict[str, str] = {
    "guided_json": "vLLM removed guided_json in 0.12 and answers it with free text (HTTP 200); use "
                   "schema_style = 'auto' (or 'response_format' / 'structured_outputs')",
}

# Requests in flight of an openai backend unless set (``OpenAISettings.max_concurrency``).
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


# The keys that name what a kind runs: a kind that runs no model reads none of them.
_MODEL_KEYS = ("model", "adapter", "base_url")


class BackendConfig(StrictConfig):
    """Which backend answers one role's calls: what every kind shares. As a field's type it
    holds the settings model of its ``kind`` (``memsearch.registry.BackendKind.settings``); a
    kind registered without one is configured by these keys alone."""

    # Words a refusal adds after the kind's name ("read by kind 'openai' only (an HTTP server)").
    described: ClassVar[str] = ""
    # Marks the base (not inherited through ``vars``): a field of this type holds any kind's model.
    _holds_any_kind: ClassVar[bool] = True

    kind: BackendKindName = Field(
        "rules",
        description="rules | hf (local transformers) | openai (HTTP server) | oracle (gold teacher from train labels), "
        "or a kind registered with backends.registry.register_backend",
    )
    sampling: Sampling = Field(default_factory=Sampling, description="Decoding parameters")
    schema_mode: bool = Field(
        False,
        description="hf: sample memory operations (decision mode) from the distribution renormalized on the "
        "tokens the memory-ops JSON schema allows; the mask is recorded so training replays it. openai: the server "
        "constrains them (schema_style); nothing replayable is recorded",
    )

    def __init__(self, **data: Any) -> None:
        # Validation picks the class by kind; a constructor cannot: it is the class it was called on.
        kind = data.get("kind", type(self).model_fields["kind"].default)
        if isinstance(kind, str) and kind in BACKEND_KINDS and (model := backend_settings(kind)) is not type(self):
            raise TypeError(f"{type(self).__name__}(kind={kind!r}): kind {kind!r} is configured by "
                            f"{model.__name__}; build that, or BackendConfig.model_validate({{'kind': {kind!r}, ...}})")
        super().__init__(**data)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        schema = handler(source)
        if "_holds_any_kind" in vars(source):
            # A field typed BackendConfig holds a kind's model: dump it with that model's keys,
            # not with the base's (pydantic's SerializeAsAny, for every such field).
            inner = schema
            while inner["type"] == "definitions":
                inner = inner["schema"]
            inner["serialization"] = core_schema.simple_ser_schema("any")
        return schema

    @model_validator(mode="wrap")
    @classmethod
    def _the_kinds_settings(cls, data: Any, handler: ModelWrapValidatorHandler[Any], info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return handler(data)
        kind = data.get("kind", cls.model_fields["kind"].default)
        if problem := BACKEND_KINDS.problem(kind):
            raise KeyProblems(("kind", problem))
        model = backend_settings(kind)
        if not (isinstance(model, type) and issubclass(model, BackendConfig)):
            raise KeyProblems(("kind", f"kind {kind!r} is registered with settings {model!r}, which is no "
                                       "BackendConfig model"))
        kept, problems = {}, []
        for key, value in data.items():
            if key in model.model_fields:
                kept[key] = value
            elif owners := [k for k in BACKEND_KINDS if key in backend_settings(k).model_fields]:
                if not (unset_in_flat_form(key, value) or filled_model(key, value, data)):
                    problems.append((key, _not_read(key, kind, owners)))
            elif not (key in dict(FLAT_FIELDS) and unset_in_flat_form(key, value)):
                kept[key] = value  # no kind's key: refused as an unknown field
        try:
            settings = handler(kept) if model is cls else model.model_validate(kept, context=info.context)
        except ValidationError as exc:
            problems += validation_problems(exc)
        if problems:
            raise KeyProblems(*problems)
        return settings

    def replaced(self, **update: Any) -> BackendConfig:
        """These settings with ``update`` (validated values) applied. A copy, not validated again,
        where the kind stays and has every updated key (a trainer does this per rollout); else the
        settings of the kind ``update`` names, validated from these (a key that kind lacks is
        dropped at its unset value and refused otherwise, as in a file). A kind that runs no model
        takes none of ``_MODEL_KEYS`` from these: they name what the kind replaced ran."""
        kind = update.get("kind", self.kind)
        if kind == self.kind and set(update) <= set(type(self).model_fields):
            return self.model_copy(update=update)
        runs_none = kind != self.kind and BACKEND_KINDS.problem(kind) is None and not BACKEND_KINDS.get(kind).runs_model
        kept = {key: value for key, value in self if not (runs_none and key in _MODEL_KEYS)}
        return BackendConfig.model_validate({**kept, **update})

    def recorded_identity(self) -> dict[str, Any]:
        """``model``, ``adapter`` and ``base_url`` as a summary records which backend wrote the
        memory. A kind without them records what the flat form held unset ('embedded', ``None``),
        so every summary keeps one form."""
        return {"model": flat_default(self.kind, "model"), "adapter": None, "base_url": None}


def _not_read(key: str, kind: str, owners: list[str]) -> str:
    if key in _MODEL_KEYS and not BACKEND_KINDS.get(kind).runs_model:
        return f"kind {kind!r} runs no model, so {key} is never read; remove it, or set kind = {either(owners)}"
    described = backend_settings(owners[0]).described if len(owners) == 1 else ""
    return f"read by kind {either(owners)} only{f' ({described})' if described else ''}; kind is {kind!r}: remove it"


class RulesSettings(BackendConfig):
    """The ``rules`` kind: deterministic rule-based policies; no model, nothing of its own."""

    described: ClassVar[str] = "rule-based"
    kind: Literal["rules"] = Field("rules", description="rules: deterministic rule-based policies")


class OracleSettings(BackendConfig):
    """The ``oracle`` kind: the gold teacher, which reads the train labels."""

    described: ClassVar[str] = "the gold teacher: it reads labels"
    kind: Literal["oracle"] = Field("oracle", description="oracle: the gold teacher from the train labels")
    open_items: bool = Field(
        False,
        description="oracle (decision memory): also write open sub-questions (kind 'open') from the train "
        "labels, each citing the shown evidence it was inferred from, and DELETE one once it is resolved. HotpotQA: "
        "'Find: <title>' for a gold paragraph the question does not name and no evidence of it was shown yet, once a "
        "shown gold sentence names that title (the bridge entity); MuSiQue: the next decomposition sub-question whose "
        "earlier answers ('#1', ...) a shown gold paragraph holds, with those answers filled in. Facts come first: an "
        "open item is written only if it still fits the memory budget (the open-items control, docs/memory_policy.md)",
    )


# How the hf kind holds the model's weights (HFSettings.weights, backends.hf.q4).
HFWeights = Literal["float32", "q4"]
HF_WEIGHTS: tuple[str, ...] = get_args(HFWeights)


class HFSettings(BackendConfig):
    """The ``hf`` kind: a local transformers model, optionally with a LoRA adapter."""

    described: ClassVar[str] = "a local transformers model"
    kind: Literal["hf"] = Field("hf", description="hf: a local transformers model")
    model: str = Field("embedded", description="'embedded' (the packaged tiny model) or a local model folder")
    adapter: str | None = Field(None, description="A LoRA adapter folder loaded over the model")
    max_concurrency: int = Field(16, ge=1, description="Largest dynamic batch of the local decoder")
    weights: HFWeights = Field(
        "float32",
        description="float32: the reference; q4: the embedded model's own 4-bit GGUF blocks on PyTorch's int4 CPU "
        "kernel (model = 'embedded', no adapter, CPU), 3-4x faster one-stream decode and other numbers "
        "(docs/results/decode_speed.md). Left out of saved configs at float32, so earlier records match",
    )

    @config_check
    def _q4_runs_the_embedded_blocks(self, context: dict[str, Any]) -> None:
        if self.weights == "q4" and (self.model != "embedded" or self.adapter is not None):
            what = f"adapter {self.adapter!r}" if self.adapter is not None else f"model {self.model!r}"
            raise KeyProblems(("weights", "'q4' runs the embedded model's own GGUF blocks: it needs model = "
                               f"'embedded' and no adapter; use weights = 'float32' with {what}"))

    @model_serializer(mode="wrap")
    def _omit_reference_weights(self, handler):
        # At its default the field is left out of every dump: stage fingerprints and saved
        # configs of float32 runs stay those of the versions before the field existed.
        return without_default(handler(self), "weights", "float32")

    def recorded_identity(self) -> dict[str, Any]:
        """See ``BackendConfig.recorded_identity``; ``weights`` only where it is not float32 (the
        form every earlier summary holds), so q4 results never resume a float32 run."""
        identity = {"model": self.model, "adapter": self.adapter, "base_url": None}
        return identity if self.weights == "float32" else {**identity, "weights": self.weights}


class OpenAISettings(BackendConfig):
    """The ``openai`` kind: an OpenAI-compatible HTTP server (vLLM, SGLang, llama.cpp, ...)."""

    described: ClassVar[str] = "an HTTP server"
    kind: Literal["openai"] = Field("openai", description="openai: an OpenAI-compatible HTTP server")
    model: str = Field("embedded", description="The served model name")
    base_url: str | None = Field(
        None, description="The API root, e.g. http://127.0.0.1:8000/v1 (key only from MEMSEARCH_API_KEY)"
    )
    max_concurrency: int = Field(
        OPENAI_MAX_CONCURRENCY, ge=1,
        description="Requests in flight: a server that answers one request at a time queues the rest, and their "
        "timeout runs while they queue there",
    )
    timeout_s: float = Field(
        120.0, gt=0,
        description="Limit of one attempt (connect, send, whole answer), counted from when it holds one of "
        "the max_concurrency slots: waiting for a slot is not timed, waiting inside the server is",
    )
    max_retries: int = Field(
        8, ge=0,
        description="Retries of a request at most; retried: connection errors, timeouts, malformed answers, "
        "HTTP 408, 429, 502, 503, 504 and a 500 whose body states no request error; never a 4xx or a 500 naming a "
        "request error (context size, unsupported field): docs/design.md §4",
    )
    retry_window_s: float = Field(
        60.0, ge=0,
        description="No retry starts later than this many seconds after the request's first failure. The "
        "waits double from 0.25-0.5 s to 7.5-15 s (or the server's Retry-After on 429/503, at most 15 s), so the "
        "default 8 retries span 30-60 s: a server restart within that is bridged",
    )
    extra_body: dict[str, Any] | None = Field(
        None,
        description="Engine-specific fields added to every request body, recorded in summary.json "
        "(backend_stats: sent). Servers apply their own defaults to what a request does not name: llama-cpp-python's "
        "server repeat_penalty 1.1, top_k 40, min_p 0.05 (neutralise: {repeat_penalty = 1.0, top_k = 0, min_p = "
        "0.0}); vLLM the model's generation_config.json (start it with --generation-config vllm, or send "
        "repetition_penalty = 1.0). Token ids are asked of vLLM and SGLang by default (return_token_ids; "
        "{return_token_ids = false} stops it). Fields memsearch sets (model, messages, sampling, max_tokens, "
        "log-probs, the schema) are refused here",
    )
    engine: Literal["auto", "vllm", "sglang", "llama.cpp", "llama-server", "transformers", "other"] = Field(
        "auto",
        description="The server's engine, which picks the schema form and asks for token ids: auto (what its "
        "/models entry names: owned_by vllm, sglang, me = llama-cpp-python's server, llamacpp = llama.cpp's "
        "llama-server; anything else is other), or one of them (transformers = `transformers serve`)",
    )
    schema_style: str = Field(
        "auto",
        description="schema_mode: how the JSON schema is sent: auto (the engine's own form: vLLM and SGLang "
        "response_format, llama-cpp-python json_object_schema, llama-server llama_cpp), response_format (OpenAI "
        "json_schema), structured_outputs (vLLM's field), json_object_schema (response_format json_object with "
        "a schema), llama_cpp (top-level json_schema). A form the engine is known to drop is refused before the "
        "run, as is schema mode on an engine that constrains nothing (transformers serve); elsewhere each answer "
        "is checked against its schema (a cut one as a start) and a violating answer is a failed request; when "
        "the first 3 all fail, every later request fails naming the form",
    )
    context_tokens: int | None = Field(
        None, ge=1,
        description="The server's context in tokens; a call whose reported prompt + completion tokens "
        "exceed it fails (not retried: `transformers serve` answers 200 past the model's context). Unset: the "
        "max_model_len the server's /models lists (vLLM, SGLang), else unchecked",
    )

    @config_check
    def _request_body(self, context: dict[str, Any]) -> None:
        problems = []
        if self.schema_style in DEAD_SCHEMA_STYLES:
            problems.append(("schema_style", f"{self.schema_style!r}: {DEAD_SCHEMA_STYLES[self.schema_style]}"))
        elif self.schema_style not in SCHEMA_STYLES:
            problems.append(("schema_style", f"{self.schema_style!r}; expected one of {', '.join(SCHEMA_STYLES)}"))
        for key in sorted(set(self.extra_body or {}) & set(_OWNED_BODY_FIELDS)):
            problems.append((f"extra_body.{key}", f"set by memsearch ({_OWNED_BODY_FIELDS[key]}); remove it here"))
        try:
            json.dumps(self.extra_body, allow_nan=False)
        except (TypeError, ValueError) as exc:
            problems.append(("extra_body", f"not JSON ({exc}); use strings, numbers, booleans, arrays and tables"))
        if problems:
            raise KeyProblems(*problems)

    def recorded_identity(self) -> dict[str, Any]:
        """See ``BackendConfig.recorded_identity``."""
        return {"model": self.model, "adapter": None, "base_url": self.base_url}


# Where a served backend answers. A result depends on which model served it (``model``: the
# served name; the run records the server's /v1/models identity beside it), never on the host or
# port it answered at: stage fingerprints and resume checks leave these keys out, so a run
# continued with its servers on other ports reuses what it finished (docs/design.md §10).
ADDRESS_KEYS = ("base_url",)


def without_addresses(value: Any) -> Any:
    """``value`` (a config dump, stage inputs; nested dicts and lists) without ``ADDRESS_KEYS``."""
    if isinstance(value, dict):
        return {k: without_addresses(v) for k, v in value.items() if k not in ADDRESS_KEYS}
    if isinstance(value, list):
        return [without_addresses(v) for v in value]
    return value

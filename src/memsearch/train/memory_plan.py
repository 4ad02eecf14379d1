"""The memory pre-flight of a training step: the per-GPU peak memory of the configured GRPO or SFT
step, estimated from the model's ``config.json`` alone (no weights, data or tokenizer), and a
check that refuses a step the device cannot hold, with the numbers and the fix.

    estimate = estimate_memory(read_model_config(cfg.model), cfg)
    print("\\n".join(estimate.lines()))
    check_memory(estimate, 80 * 2**30, "--gpu-memory 80")   # InputError (exit 2) when it does not fit

``memsearch train grpo|sft --dry-run`` prints it; ``train_grpo`` / ``train_sft`` run
``check_device_memory`` on the device they got, before any weight is loaded.

The peak is ``held + max(update, rollouts)``: what stays on the GPU for the whole run, plus the
larger of a step's two phases, which never overlap (GRPO decodes its rollouts, then trains on them).
b = bytes of a weight (``dtype``), a = 4 (PEFT keeps the adapter of a bf16 base in float32).

Held throughout
    weights: the base's parameters, counted exactly on the ``meta`` device, x b. LoRA: r x (d_in +
    d_out) per targeted linear, x 4 a: parameters, gradients (kept: ``zero_grad(set_to_none=False)``),
    AdamW's two moments. KL reference: a frozen second adapter when ``kl_reference = "start"``
    starts from an adapter (``policy.load_policy``), else nothing (the adapter switched off). Merged
    sampler: a float32 GRPO run samples from a merged copy of the base (``policy.MergedSampler``).
    Frozen backends: the in-process ``hf`` backends of roles GRPO does not train (stage 2's
    merged stage-1 memory), a model each. Periodic evaluation: 0 (see ``EVALUATION_BYTES``).

Update (the largest micro-batch: GRPO ``max(micro_batch_tokens, longest packed row)`` tokens,
SFT ``micro_batch_rows x max_tokens``)
    Saved for backward, per token and decoder layer (h hidden, q = heads x head_dim, I MLP width,
    W the padded row width), read off PyTorch's saved tensors of a Llama/Qwen2 layer (SDPA):
    2 RMSNorms 2 x (4h + 4) (float32 upcast and 1/rms); attention b x (2q + 2q) (query, output,
    and key and value repeated to every head: a padding mask turns SDPA's GQA path off) + 4 x heads
    (log-sum-exp) + b x W (the boolean padding mask, converted per layer); SwiGLU 3 b x I; LoRA per
    targeted projection a x (d_in + r) (each casts its own input to float32; with a float32 base,
    projections that share an input share it). Without checkpointing every layer keeps all of it;
    with non-reentrant checkpointing each layer keeps its input (b x h) and one layer is
    recomputed at a time in backward. Backward working set of one layer: (a + 3b) x I. Logits:
    every token of the micro-batch is counted as scored (an upper bound: ``train.logprobs`` runs
    the head only where a completion token is scored, and an SFT row or a packed GRPO group can be
    nearly all completion), x vocab x 4 bytes x 3 (the log-softmax kept for backward, its gradient
    and the logits' gradient; GRPO's entropy is computed in chunks of
    ``train.logprobs.ENTROPY_CHUNK`` positions, so its temporaries stay small). The update's peak
    is the saved activations plus the larger of the logits and (recomputed layer +) the backward
    working set.

Rollouts (GRPO)
    KV cache: ``max_batch_size`` rows of the longest call, prompt (memory + the largest evidence
    block + ``PROMPT_SLACK_TOKENS``, as ``memsearch verl config`` bounds it) + response (the
    policy or answer budget), x 2 x layers x kv_heads x head_dim x b, plus the decoder's prompt
    store; one copy (a joining batch is merged layer by layer, each part's layer released).
    Prefill working set: ``max_prefill_tokens`` x (b x (3I + 8h) + a x I). Frozen backends: their
    own caches at ``max_concurrency`` rows.

Accuracy, measured on a CPU (``tests/train/test_memory_plan.py``: one real-width layer, bf16
base, float32 LoRA r=64 on all 7 projections, PEFT, saved tensors counted once per storage with
``saved_tensors_hooks``, 2 rows x 192 tokens, one padded): Qwen2.5-7B 327.2 KiB per token per
layer measured and estimated (without padding SDPA keeps 314.9: key/value per KV head, no mask),
Qwen2.5-0.5B 84.7 and 84.7; with checkpointing the layer keeps 7.0 KiB (its input) at 7B. Peak
resident memory of forward + backward, measured once (``/proc`` peak RSS, 1-2 layers of 7B width;
not a test): 334 KiB per extra layer, 7.3 with checkpointing; the backward working set 183 KiB
(estimated 185); logits 11.9 x vocab bytes per scored token with the chunked entropy (19.9 when
the entropy was computed at once), estimated 12. Nothing here has been measured on a GPU (CUDA's
SDPA kernels may keep other tensors); the margin (``MARGIN_BYTES``, ``FRAGMENTATION``) is a
judgement, not a measurement.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memsearch.errors import InputError
from memsearch.records.trajectory import CALL_ROLES
from memsearch.train.config import GRPOConfig, SFTConfig
from memsearch.train.rows import TRAINED_CALL_ROLES

GIB = 2**30
# Kept free beside the estimate: the CUDA context, cuBLAS workspaces and NCCL buffers (~1 GiB
# together on an H100 with torch 2.x), and the caching allocator's fragmentation.
MARGIN_BYTES = int(1.5 * GIB)
FRAGMENTATION = 0.10
# The chat template, question and wording around the budgeted parts of a call (the one bound of a
# call's prompt: ``memsearch verl config`` sizes verl's max_prompt_length with ``call_tokens`` too).
PROMPT_SLACK_TOKENS = 1024
# ``backends.hf.backend.HFBackend`` defaults: one prefill pass and the store of shared prompts.
MAX_PREFILL_TOKENS = 16384
PROMPT_STORE_TOKENS = 8192
# Periodic evaluation decodes with the live policy (``train.live_eval``), so it adds no weights;
# its decode cache comes and goes between steps, as the rollouts' does.
EVALUATION_BYTES = 0
ADAPTER_BYTES = 4  # PEFT autocasts the adapter of a bf16/fp16 base to float32
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "auto": 2}
_SHAPES: dict[str, ModelShape] = {}  # by config.json: the fixes' searches re-estimate one model many times
ATTENTION_INPUT = ("q_proj", "k_proj", "v_proj")
MLP_INPUT = ("gate_proj", "up_proj")


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a causal LM, from its config: sizes, exact parameter count and
    the ``(d_in, d_out, count)`` of its linear layers by module name (``q_proj``...)."""

    model_type: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_positions: int
    params: int
    linears: dict[str, tuple[int, int, int]]

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """Build the model on the ``meta`` device (no memory, no weights) to count it exactly."""
        key = json.dumps(config, sort_keys=True, default=str)
        if key not in _SHAPES:
            _SHAPES[key] = cls._count(config)
        return _SHAPES[key]

    @classmethod
    def _count(cls, config: Mapping[str, Any]) -> ModelShape:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        data = dict(config)
        model_type = data.pop("model_type", None)
        if not model_type:
            raise InputError("config.json has no model_type; expected a transformers causal LM config")
        try:
            hf = AutoConfig.for_model(model_type, **data)
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(hf)
        except (KeyError, ValueError) as exc:  # a model type this transformers does not know as a causal LM
            raise InputError(f"config.json: model_type {model_type!r}: {exc}") from None
        linears: dict[str, list[int]] = {}
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear):
                entry = linears.setdefault(name.rsplit(".", 1)[-1], [module.in_features, module.out_features, 0])
                entry[2] += 1
        heads = hf.num_attention_heads
        return cls(
            model_type=model_type, layers=hf.num_hidden_layers, hidden=hf.hidden_size,
            intermediate=getattr(hf, "intermediate_size", None) or 4 * hf.hidden_size, heads=heads,
            kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
            head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads, vocab=hf.vocab_size,
            max_positions=int(getattr(hf, "max_position_embeddings", 0) or 1 << 30),
            params=sum(p.numel() for p in model.parameters()),  # tied weights are one parameter
            linears={k: tuple(v) for k, v in linears.items()},
        )

    def kv_bytes_per_token(self, weight_bytes: int) -> int:
        """KV cache of one token over every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * weight_bytes


def layer_saved_bytes(shape: ModelShape, weight_bytes: int, r: int, targets: list[str], mask_width: int,
                      checkpointing: bool = False) -> int:
    """Bytes one decoder layer keeps for backward per token (module doc): with checkpointing its
    input only; ``mask_width`` 0 when no padding mask reaches the layer's attention."""
    b, a, h = weight_bytes, ADAPTER_BYTES, shape.hidden
    if checkpointing:
        return b * h
    q = shape.heads * shape.head_dim
    kv = q if mask_width else shape.kv_heads * shape.head_dim  # SDPA's GQA path only without a mask
    norms = 2 * (4 * h + 4)
    attention = b * (2 * q + 2 * kv) + 4 * shape.heads + b * mask_width
    mlp = 3 * b * shape.intermediate
    inputs = {"q_proj": h, "k_proj": h, "v_proj": h, "o_proj": q, "gate_proj": h, "up_proj": h,
              "down_proj": shape.intermediate}
    chosen = [t for t in dict.fromkeys(targets) if t in shape.linears]
    lora = sum(a * (inputs.get(t, shape.linears[t][0]) + r) for t in chosen)
    if a == b:  # no float32 cast: projections reading one tensor save it once, o_proj's is SDPA's output
        for group in (ATTENTION_INPUT, MLP_INPUT):
            lora -= a * h * max(0, sum(t in chosen for t in group) - 1)
        lora -= a * q if "o_proj" in chosen else 0
    return norms + attention + mlp + lora


@dataclass(frozen=True)
class Part:
    """One line of the estimate: ``phase`` is held (whole run), update or rollouts."""

    name: str
    phase: str
    bytes: int
    detail: str = ""


@dataclass
class MemoryEstimate:
    """Per-GPU peak of one configured step, in bytes (module doc). ``total_bytes`` is the
    configured setting's; ``with_checkpointing`` / ``without_checkpointing`` both settings'."""

    parts: list[Part]
    gradient_checkpointing: bool
    with_checkpointing: int
    without_checkpointing: int
    summary: str
    model_config: dict[str, Any] = field(repr=False, default_factory=dict)
    config: Any = field(repr=False, default=None)
    backend_configs: dict[str, dict[str, Any]] = field(repr=False, default_factory=dict)

    def phase_bytes(self, phase: str) -> int:
        """Sum of the parts of one phase."""
        return sum(p.bytes for p in self.parts if p.phase == phase)

    @property
    def total_bytes(self) -> int:
        return self.phase_bytes("held") + max(self.phase_bytes("update"), self.phase_bytes("rollouts"))

    def lines(self) -> list[str]:
        """The estimate per GPU in GiB, part by part, then the peak with and without checkpointing."""
        out = [self.summary]
        titles = {"held": "held throughout", "update": "update (largest micro-batch)", "rollouts": "rollouts"}
        for phase, title in titles.items():
            parts = [p for p in self.parts if p.phase == phase]
            if not parts:
                continue
            out.append(f"  {title}: {gib(self.phase_bytes(phase))}")
            out += [f"    {p.name:<22} {gib(p.bytes):>10}" + (f"  {p.detail}" if p.detail else "") for p in parts]
        held, update, roll = (self.phase_bytes(k) for k in titles)
        out.append(f"  peak per GPU: {gib(self.total_bytes)} = held {gib(held)} + max(update {gib(update)}, "
                   f"rollouts {gib(roll)}); needs {gib(needed_bytes(self.total_bytes))} with the margin "
                   f"({gib(MARGIN_BYTES)} + {FRAGMENTATION:.0%})")
        out.append(f"  gradient_checkpointing = true: {gib(self.with_checkpointing)}; "
                   f"false: {gib(self.without_checkpointing)}")
        return out


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def needed_bytes(total: int) -> int:
    """Device memory a step of ``total`` estimated bytes needs: the estimate plus the margin."""
    return int(total * (1 + FRAGMENTATION)) + MARGIN_BYTES


def read_model_config(model: str) -> dict[str, Any]:
    """The ``config.json`` of ``"embedded"`` or of a local model folder (nothing else is read)."""
    if model == "embedded":
        from memsearch.assets.embedded import model_dir

        path = model_dir() / "config.json"
    else:
        path = Path(model) / "config.json"
    if not path.is_file():
        raise InputError(f"{model}: no config.json; the memory pre-flight reads the model's config.json from a "
                         "local Hugging Face folder (or 'embedded'), e.g. configs/model_shapes/qwen2.5-7b-instruct")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None


def weight_bytes(dtype: str) -> int:
    """Bytes per weight of ``dtype``; "auto" is bfloat16 (a GPU's)."""
    if dtype not in DTYPE_BYTES:
        raise InputError(f"dtype: {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def call_tokens(cfg: GRPOConfig) -> tuple[int, int]:
    """``(prompt, response)`` tokens of the longest call of the episode (module doc)."""
    b = cfg.episode.budgets
    evidence = b.chunk_tokens if cfg.episode.agent.evidence == "stream" else b.evidence_tokens
    return b.memory_tokens + evidence + PROMPT_SLACK_TOKENS, max(b.policy_tokens, b.answer_tokens)


def _lora(cfg: GRPOConfig | SFTConfig) -> tuple[int, list[str]]:
    """``(r, target_modules)`` of the trained adapter: the starting adapter's own when it exists."""
    if cfg.adapter and (Path(cfg.adapter) / "adapter_config.json").is_file():
        saved = json.loads((Path(cfg.adapter) / "adapter_config.json").read_text(encoding="utf-8"))
        targets = saved.get("target_modules") or cfg.lora.target_modules
        return int(saved.get("r", cfg.lora.r)), [targets] if isinstance(targets, str) else list(targets)
    return cfg.lora.r, list(cfg.lora.target_modules)


def _frozen_backends(cfg: GRPOConfig) -> list[Any]:
    """The distinct in-process hf backends of the roles GRPO does not train."""
    trained = set(TRAINED_CALL_ROLES[cfg.role])
    found: dict[str, Any] = {}
    for role in CALL_ROLES:  # as engine.environment.build_shared builds them
        backend = getattr(cfg.episode.backends, role)
        if role not in trained and backend.kind == "hf":
            found.setdefault(json.dumps(backend.model_dump(mode="json", exclude={"sampling"}), sort_keys=True), backend)
    return list(found.values())


def frozen_backend_models(cfg: GRPOConfig | SFTConfig) -> list[str]:
    """The models of the frozen in-process backends (whose config.json a caller may read)."""
    return [b.model for b in _frozen_backends(cfg)] if isinstance(cfg, GRPOConfig) else []


def estimate_memory(model_config: Mapping[str, Any], cfg: GRPOConfig | SFTConfig,
                    backend_configs: Mapping[str, Mapping[str, Any]] | None = None) -> MemoryEstimate:
    """The per-GPU peak of ``cfg``'s step on the model of ``model_config`` (its config.json).
    ``backend_configs``: config.json of frozen backends' models by model name; one missing is
    taken to have the trained model's shape (a merged checkpoint of it)."""
    shape = ModelShape.from_config(model_config)
    shapes = {name: ModelShape.from_config(c) for name, c in (backend_configs or {}).items()}
    both = {ckpt: _parts(shape, cfg, ckpt, shapes) for ckpt in (True, False)}
    totals = {ckpt: _total(parts) for ckpt, parts in both.items()}
    b = weight_bytes(cfg.dtype)
    if isinstance(cfg, GRPOConfig):
        batch = f"GRPO micro-batch {_update_tokens(shape, cfg)[0]} tokens"
    else:
        batch = f"SFT micro-batch {cfg.micro_batch_rows} x {cfg.max_tokens} tokens"
    summary = (f"memory pre-flight: {shape.model_type}, {shape.params / 1e9:.2f} B parameters, {b * 8}-bit weights, "
               f"{batch}, gradient_checkpointing = {str(cfg.gradient_checkpointing).lower()}")
    return MemoryEstimate(both[cfg.gradient_checkpointing], cfg.gradient_checkpointing, totals[True], totals[False],
                          summary, dict(model_config), cfg, {k: dict(v) for k, v in (backend_configs or {}).items()})


def _total(parts: list[Part]) -> int:
    def phase(name: str) -> int:
        return sum(p.bytes for p in parts if p.phase == name)

    return phase("held") + max(phase("update"), phase("rollouts"))


def _update_tokens(shape: ModelShape, cfg: GRPOConfig | SFTConfig) -> tuple[int, int, bool]:
    """``(tokens, row width, float mask)`` of the largest micro-batch."""
    if isinstance(cfg, SFTConfig):
        return cfg.micro_batch_rows * cfg.max_tokens, cfg.max_tokens, False
    prompt, response = call_tokens(cfg)
    width = prompt + response
    if cfg.update.share_prompts:  # a prompt once, then every completion that shares it (train.grpo.shared_prompt)
        branches = cfg.credit.state_group_size if cfg.credit.mode == "state" else 0
        width = prompt + response * max(cfg.rollout.group_size, branches)
    return max(cfg.update.micro_batch_tokens, width), width, cfg.update.share_prompts


def _parts(shape: ModelShape, cfg: GRPOConfig | SFTConfig, ckpt: bool,
           shapes: Mapping[str, ModelShape]) -> list[Part]:
    b, a = weight_bytes(cfg.dtype), ADAPTER_BYTES
    r, targets = _lora(cfg)
    lora_params = sum(r * (d_in + d_out) * n for name, (d_in, d_out, n) in shape.linears.items()
                      if name in set(targets))
    grpo = isinstance(cfg, GRPOConfig)
    parts = [
        Part("weights", "held", shape.params * b, f"{shape.params / 1e9:.2f} B x {b} bytes"),
        Part("LoRA + grads + AdamW", "held", lora_params * a * 4, f"r={r}, {lora_params / 1e6:.1f} M float32 x 4"),
    ]
    if grpo and cfg.loss.kl_coef > 0 and cfg.loss.kl_reference == "start" and cfg.adapter:
        parts.append(Part("KL reference adapter", "held", lora_params * a, "frozen copy of the starting adapter"))
    if grpo and b == 4:
        parts.append(Part("merged sampler", "held", shape.params * b, "float32 copy rollouts sample from"))
    parts.append(Part("evaluation", "held", EVALUATION_BYTES, "reuses the policy"))
    tokens, width, float_mask = _update_tokens(shape, cfg)
    per_layer = layer_saved_bytes(shape, b, r, targets, 0 if float_mask else width)
    kept = layer_saved_bytes(shape, b, r, targets, 0 if float_mask else width, checkpointing=ckpt)
    # final norm (float32 input and 1/rms) and the mask made once per forward (bool, or float when packed)
    model_level = (4 * shape.hidden + 4) + (b if float_mask else 1) * width
    parts.append(Part("activations", "update", tokens * (shape.layers * kept + model_level),
                      f"{shape.layers} layers x {kept / 1024:.1f} KiB x {tokens} tokens"
                      + (" (layer inputs)" if ckpt else "")))
    working = tokens * ((per_layer if ckpt else 0) + (a + 3 * b) * shape.intermediate)
    logits = tokens * shape.vocab * 4 * 3 + (tokens * shape.vocab if grpo and cfg.schema_mode else 0)
    # the logits are freed before the layers' backward begins: the larger of the two is the peak
    logits_detail = f"{tokens} scored tokens x {shape.vocab} x 4 bytes x 3"
    working_detail = "one recomputed layer + its backward" if ckpt else "one layer's backward"
    if logits >= working:
        parts.append(Part("logits", "update", logits, f"{logits_detail} (> {working_detail}: {gib(working)})"))
    else:
        parts.append(Part("backward working set", "update", working, f"{working_detail} (> logits: {gib(logits)})"))
    if grpo:
        parts += _rollout_parts(shape, cfg, b, shapes)
    return parts


def _rollout_parts(shape: ModelShape, cfg: GRPOConfig, b: int, shapes: Mapping[str, ModelShape]) -> list[Part]:
    prompt, response = call_tokens(cfg)
    longest = min(prompt + response, shape.max_positions)
    rows = cfg.rollout.max_batch_size
    parts = [
        Part("KV cache", "rollouts", (rows * longest + PROMPT_STORE_TOKENS) * shape.kv_bytes_per_token(b),
             f"max_batch_size {rows} x {longest} tokens x {shape.kv_bytes_per_token(b) // 1024} KiB"),
        Part("prefill", "rollouts", MAX_PREFILL_TOKENS * (b * (3 * shape.intermediate + 8 * shape.hidden)
                                                          + (ADAPTER_BYTES * shape.intermediate if b != 4 else 0)),
             f"{MAX_PREFILL_TOKENS} tokens in one pass"),
    ]
    for backend in _frozen_backends(cfg):
        other = shapes.get(backend.model, shape)
        parts.append(Part(f"frozen {Path(backend.model).name}", "held", other.params * 2, "in-process hf backend"))
        parts.append(Part("its KV cache", "rollouts",
                          backend.max_concurrency * min(prompt + response, other.max_positions)
                          * other.kv_bytes_per_token(2), f"max_concurrency {backend.max_concurrency}"))
    return parts


def fits(estimate: MemoryEstimate, device_bytes: int) -> bool:
    """Whether the estimate plus the margin fits ``device_bytes``."""
    return needed_bytes(estimate.total_bytes) <= device_bytes


def check_memory(estimate: MemoryEstimate, device_bytes: int, where: str) -> None:
    """``InputError`` (exit 2) when ``estimate`` plus the margin does not fit ``device_bytes``:
    the numbers per part and the settings that would fit."""
    if fits(estimate, device_bytes):
        return
    parts = ", ".join(f"{p.name} {gib(p.bytes)}" for p in estimate.parts if p.bytes)
    fixes = _fixes(estimate, device_bytes)
    raise InputError(
        f"{where}: the step needs about {gib(needed_bytes(estimate.total_bytes))} per GPU (estimated peak "
        f"{gib(estimate.total_bytes)} + {gib(MARGIN_BYTES)} + {FRAGMENTATION:.0%} kept free), the device has "
        f"{gib(device_bytes)}\n"
        f"estimate: {parts}\n"
        + (f"fix: {'; or '.join(fixes)}" if fixes else
           "fix: none of micro-batch, checkpointing or max_batch_size fits it: use a GPU with more memory, a "
           "smaller model or a smaller lora.r")
    )


def _redo(estimate: MemoryEstimate, **changes: Any) -> MemoryEstimate:
    """``estimate`` again with fields of its config changed (a GRPO field by its name in its group)."""
    from memsearch.train.config_keys import GRPO_GROUPS

    cfg, update = estimate.config, {}
    for key, value in changes.items():
        group = next((g for g, names in GRPO_GROUPS.items() if key in names), None)
        if group is None or not isinstance(cfg, GRPOConfig):
            update[key] = value
        else:
            update[group] = update.get(group, getattr(cfg, group)).model_copy(update={key: value})
    return estimate_memory(estimate.model_config, cfg.model_copy(update=update), estimate.backend_configs)


def _largest(estimate: MemoryEstimate, device_bytes: int, key: str, low: int, high: int, **fixed: Any) -> int | None:
    """The largest value of ``key`` in [low, high) that fits (every part grows with it), or None."""
    if high <= low or not fits(_redo(estimate, **{key: low}, **fixed), device_bytes):
        return None
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(_redo(estimate, **{key: mid}, **fixed), device_bytes) else (low, mid)
    return low


def _round(tokens: int) -> int:
    """A suggested micro-batch: a multiple of 256 tokens below the largest that fits."""
    return tokens // 256 * 256 if tokens >= 256 else tokens


def _fixes(estimate: MemoryEstimate, device_bytes: int) -> list[str]:
    """Settings that make the step fit, one change at a time, then together."""
    cfg = estimate.config
    ckpt = cfg.gradient_checkpointing
    fixes = []
    if not ckpt and fits(_redo(estimate, gradient_checkpointing=True), device_bytes):
        fixes.append(f"set gradient_checkpointing = true ({gib(estimate.with_checkpointing)})")
    if isinstance(cfg, SFTConfig):
        rows = _largest(estimate, device_bytes, "micro_batch_rows", 1, cfg.micro_batch_rows)
        if rows:
            accumulation = math.ceil(cfg.micro_batch_rows * cfg.grad_accumulation / rows)
            fixes.append(f"lower micro_batch_rows to {rows} (and raise grad_accumulation to {accumulation} to keep "
                         "the rows per step)")
        elif not ckpt and (rows := _largest(estimate, device_bytes, "micro_batch_rows", 1, cfg.micro_batch_rows + 1,
                                            gradient_checkpointing=True)):
            fixes.append(f"set gradient_checkpointing = true and micro_batch_rows = {rows}")
        return fixes
    tokens = _largest(estimate, device_bytes, "micro_batch_tokens", 64, cfg.update.micro_batch_tokens)
    if tokens:
        fixes.append(f"lower update.micro_batch_tokens to {_round(tokens)}")
    elif not ckpt and (tokens := _largest(estimate, device_bytes, "micro_batch_tokens", 64,
                                          cfg.update.micro_batch_tokens + 1, gradient_checkpointing=True)):
        fixes.append(f"set gradient_checkpointing = true and lower update.micro_batch_tokens to {_round(tokens)}")
    rows = _largest(estimate, device_bytes, "max_batch_size", 1, cfg.rollout.max_batch_size)
    if rows:
        fixes.append(f"lower rollout.max_batch_size to {rows} (rows decoded together)")
    if not fixes:
        together = {"gradient_checkpointing": True, "micro_batch_tokens": 64}
        rows = _largest(estimate, device_bytes, "max_batch_size", 1, cfg.rollout.max_batch_size + 1, **together)
        if rows:
            tokens = _largest(estimate, device_bytes, "micro_batch_tokens", 64, cfg.update.micro_batch_tokens + 1,
                              gradient_checkpointing=True, max_batch_size=rows) or 64
            fixes.append(f"set gradient_checkpointing = true, update.micro_batch_tokens = {_round(tokens)} "
                         f"and rollout.max_batch_size = {rows}")
    return fixes


def estimate_for_run(cfg: GRPOConfig | SFTConfig) -> MemoryEstimate:
    """The estimate of ``cfg`` with every config.json it reads: the model's and the frozen
    backends' that are local folders (the others are taken to have the model's shape)."""
    backends = {}
    for model in frozen_backend_models(cfg):
        if model != cfg.model and (model == "embedded" or (Path(model) / "config.json").is_file()):
            backends[model] = read_model_config(model)
    return estimate_memory(read_model_config(cfg.model), cfg, backends)


def check_device_memory(cfg: GRPOConfig | SFTConfig, device: str, dist=None, echo=None) -> MemoryEstimate | None:
    """The real run's pre-flight, before any weight loads: on a CUDA ``device``, refuse (on every
    rank, when any rank's device is short) a step whose estimate does not fit the device's free
    memory. Nothing on a CPU."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    estimate = estimate_for_run(cfg)
    free, total = torch.cuda.mem_get_info(dev)
    short = not fits(estimate, free)
    if dist is not None and dist.all_max([float(short)])[0] and not short:
        raise InputError(f"{device}: another rank's GPU cannot hold the estimated {gib(estimate.total_bytes)} "
                         "(its error says why)")
    check_memory(estimate, free, f"{device} ({gib(free)} free of {gib(total)})")
    if echo is not None:
        echo(f"memory pre-flight: estimated peak {gib(estimate.total_bytes)} per GPU, {gib(free)} free on {device}")
    return estimate


__all__ = ["GIB", "MemoryEstimate", "ModelShape", "Part", "check_device_memory", "check_memory", "estimate_for_run",
           "estimate_memory", "fits", "layer_saved_bytes", "read_model_config"]

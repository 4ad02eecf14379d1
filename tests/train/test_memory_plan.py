"""The memory pre-flight (``train.memory_plan``) against what PyTorch actually keeps.

The activation term is checked on one real-width decoder layer (random init, bf16 base, float32
LoRA r=64 on all 7 projections through PEFT): the bytes autograd saves for backward, counted once
per storage with ``saved_tensors_hooks``, must be within 15 % of the estimate, with and without
non-reentrant checkpointing. The shipped GPU recipes must pass the check at the Qwen2.5-7B shape
for an 80 GB GPU, built the way the pipelines build their trainer configs.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from memsearch.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
SHAPES = ROOT / "configs" / "model_shapes"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
H100_BYTES = int(79.6 * 2**30)  # what torch reports for an 80 GB H100


def shape_config(name: str) -> dict:
    return json.loads((SHAPES / name / "config.json").read_text())


def measure_layer(config: dict, dtype: str, checkpointing: bool, rows: int = 2, width: int = 192,
                  pad: int = 30) -> float:
    """Bytes one decoder layer saves for backward per (padded) token: a one-layer model of the
    real width (a small vocabulary: the layer does not see it), the trainer's left padding and
    position ids, parameters and the tensors every layer shares (rotary tables, the model's mask)
    left out, each storage counted once."""
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.utils.checkpoint import checkpoint
    from transformers import AutoConfig, AutoModelForCausalLM

    data = dict(config, num_hidden_layers=1, vocab_size=512)
    hf = AutoConfig.for_model(data.pop("model_type"), **data)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    model = get_peft_model(model, LoraConfig(r=64, lora_alpha=128, target_modules=TARGETS, task_type="CAUSAL_LM"))
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
    model.enable_input_require_grads()  # a middle layer's input requires grad: its first norm saves too
    layer = model.get_base_model().model.layers[0]
    if checkpointing:
        plain = layer.forward
        layer.forward = lambda *a, **k: checkpoint(plain, *a, use_reentrant=False, **k)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    shared: set[int] = set()
    saved: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr not in shared:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)

    def enter(module, args, kwargs):
        for value in list(args[1:]) + list(kwargs.values()):
            for t in value if isinstance(value, tuple) else (value,):
                if isinstance(t, torch.Tensor):
                    shared.add(t.untyped_storage().data_ptr())
        hooks.__enter__()

    layer.register_forward_pre_hook(enter, with_kwargs=True)
    layer.register_forward_hook(lambda *_: hooks.__exit__(None, None, None))
    ids = torch.randint(0, 512, (rows, width))
    attention = torch.ones(rows, width, dtype=torch.long)
    attention[0, :pad] = 0
    model.train()
    model.get_base_model().model(input_ids=ids, attention_mask=attention,
                                 position_ids=(attention.cumsum(-1) - 1).clamp(min=0), use_cache=False)
    return sum(saved.values()) / (rows * width)


def estimated(config: dict, dtype: str, checkpointing: bool, mask_width: int) -> int:
    from memsearch.train.memory_plan import DTYPE_BYTES, ModelShape, layer_saved_bytes

    return layer_saved_bytes(ModelShape.from_config(config), DTYPE_BYTES[dtype], 64, TARGETS, mask_width,
                             checkpointing=checkpointing)


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("name,dtype", [
    ("qwen2.5-0.5b-instruct", "bfloat16"),
    ("qwen2.5-0.5b-instruct", "float32"),  # no float32 cast: projections that share an input share it
    pytest.param("qwen2.5-7b-instruct", "bfloat16", marks=pytest.mark.slow),
])
def test_layer_activations_match_the_saved_tensors(name, dtype, checkpointing):
    config = shape_config(name)
    measured = measure_layer(config, dtype, checkpointing)
    estimate = estimated(config, dtype, checkpointing, mask_width=192)
    assert abs(estimate - measured) <= 0.15 * measured, (name, dtype, checkpointing, measured, estimate)
    if checkpointing:  # the layer keeps its input only: a few % of what it keeps without checkpointing
        assert measured < 0.05 * estimated(config, dtype, False, mask_width=192)


def test_without_padding_sdpa_keeps_key_and_value_per_kv_head():
    # One unpadded row: no mask reaches SDPA, which then takes its GQA path (no repeated key/value).
    config = shape_config("qwen2.5-0.5b-instruct")
    measured = measure_layer(config, "bfloat16", False, rows=1, width=256, pad=0)
    assert abs(estimated(config, "bfloat16", False, mask_width=0) - measured) <= 0.15 * measured
    assert estimated(config, "bfloat16", False, mask_width=0) < estimated(config, "bfloat16", False, mask_width=256)


def test_parameters_lora_and_kv_cache_are_those_of_the_real_model(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from memsearch.train.config import LoraSettings
    from memsearch.train.memory_plan import ModelShape, read_model_config
    from memsearch.train.policy import load_policy, trainable_parameters

    shape = ModelShape.from_config(read_model_config(str(tiny_model_dir)))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    assert shape.params == sum(p.numel() for p in model.parameters())
    policy, _, _ = load_policy(str(tiny_model_dir), None, LoraSettings(r=8, target_modules=TARGETS), "cpu")
    lora = sum(8 * (d_in + d_out) * n for name, (d_in, d_out, n) in shape.linears.items() if name in TARGETS)
    assert lora == sum(p.numel() for p in trainable_parameters(policy))
    with torch.no_grad():
        out = model(input_ids=torch.ones(3, 17, dtype=torch.long), use_cache=True)
    cache = sum(layer.keys.nbytes + layer.values.nbytes for layer in out.past_key_values.layers)
    assert cache == 3 * 17 * shape.kv_bytes_per_token(4)


def grpo_gpu(*overrides: str):
    from memsearch.config import load_config
    from memsearch.train.config import GRPOConfig

    model = json.dumps(str(SHAPES / "qwen2.5-7b-instruct"))
    return load_config(ROOT / "configs/train/grpo_gpu.toml", [f"model={model}", *overrides], model=GRPOConfig)


def test_refuses_qwen_7b_at_16384_tokens_without_checkpointing_with_a_fix_that_fits():
    from memsearch.train.memory_plan import check_memory, estimate_memory, read_model_config

    cfg = grpo_gpu("update.micro_batch_tokens=16384", "gradient_checkpointing=false")
    estimate = estimate_memory(read_model_config(cfg.model), cfg)
    parts = {p.name: p.bytes for p in estimate.parts}
    assert parts["activations"] > 100 * 2**30  # 28 layers x ~330 KiB x 16,384 tokens
    assert estimate.with_checkpointing < estimate.without_checkpointing == estimate.total_bytes
    with pytest.raises(InputError) as refused:
        check_memory(estimate, H100_BYTES, "an H100")
    message = str(refused.value)
    assert "gradient_checkpointing = true" in message and "micro_batch_tokens" in message
    tokens = int(re.search(r"lower update\.micro_batch_tokens to (\d+)", message).group(1))

    def tokens_of(n):
        return cfg.model_copy(update={"update": cfg.update.model_copy(update={"micro_batch_tokens": n})})

    smaller = tokens_of(tokens)
    check_memory(estimate_memory(read_model_config(cfg.model), smaller), H100_BYTES, "an H100")  # the fix fits
    with pytest.raises(InputError):  # and it is the largest multiple of 256 that does
        check_memory(estimate_memory(read_model_config(cfg.model), tokens_of(tokens + 256)), H100_BYTES, "an H100")


def test_sft_fix_keeps_the_rows_per_step():
    from memsearch.config import load_config
    from memsearch.train.config import SFTConfig
    from memsearch.train.memory_plan import check_memory, estimate_memory, read_model_config

    model = json.dumps(str(SHAPES / "qwen2.5-7b-instruct"))
    cfg = load_config(None, [f"model={model}", 'data=["rows.jsonl"]', "dtype=\"bfloat16\"", "micro_batch_rows=8",
                             "grad_accumulation=4", "max_tokens=4096", "lora.r=64"], model=SFTConfig)
    estimate = estimate_memory(read_model_config(cfg.model), cfg)
    with pytest.raises(InputError) as refused:
        check_memory(estimate, H100_BYTES, "an H100")
    found = re.search(r"lower micro_batch_rows to (\d+) \(and raise grad_accumulation to (\d+)", str(refused.value))
    rows, accumulation = int(found.group(1)), int(found.group(2))
    assert rows * accumulation >= 32 and rows * (accumulation - 1) < 32
    check_memory(estimate_memory(read_model_config(cfg.model), cfg.model_copy(update={"micro_batch_rows": rows})),
                 H100_BYTES, "an H100")


@pytest.fixture(scope="module")
def qwen_7b_folder(tmp_path_factory):
    """The Qwen2.5-7B shape as a model folder a pipeline accepts: its config.json beside a real
    tokenizer (the embedded one: the pipelines check that the model folder has one)."""
    from memsearch.assets.embedded import tokenizer_dir

    folder = tmp_path_factory.mktemp("shapes") / "qwen2.5-7b-instruct"
    shutil.copytree(tokenizer_dir(), folder)
    shutil.copy(SHAPES / "qwen2.5-7b-instruct" / "config.json", folder / "config.json")
    return folder


def shipped_gpu_configs(model: Path) -> dict:
    """Every trainer config the shipped GPU recipes run, at ``model``'s shape."""
    from memsearch.config import load_config
    from memsearch.pipelines.memagent.config import MemAgentPipeline
    from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline

    at = [f"model={json.dumps(str(model))}"]
    policy = load_config(ROOT / "configs/memory_policy_gpu.toml", at, model=MemoryPolicyPipeline)
    memagent = load_config(ROOT / "configs/memagent.toml", at, model=MemAgentPipeline)
    return {
        "train/grpo_gpu.toml": grpo_gpu(*at),
        "memory_policy_gpu.toml [sft]": policy.sft_config(["rows.jsonl"], seed=1),
        "memory_policy_gpu.toml [grpo]": policy.grpo_config("train", seed=1, adapter=None),
        "memory_policy_gpu.toml [stage2.grpo]": policy.stage2_config("train", seed=1, stage1="runs/stage1/merged"),
        "memagent.toml [train]": memagent.grpo_config("train"),
    }


@pytest.mark.slow
def test_every_shipped_gpu_config_fits_an_80_gb_gpu_at_the_7b_shape(qwen_7b_folder):
    from memsearch.train.memory_plan import check_memory, estimate_for_run

    for name, cfg in shipped_gpu_configs(qwen_7b_folder).items():
        estimate = estimate_for_run(cfg)
        assert estimate.parts[0].bytes == 7_615_616_512 * 2, name  # bf16 weights of Qwen2.5-7B's parameters
        check_memory(estimate, H100_BYTES, name)


def test_stage2_counts_its_frozen_memory_model(qwen_7b_folder):
    from memsearch.train.memory_plan import estimate_for_run

    configs = shipped_gpu_configs(qwen_7b_folder)
    stage1 = {p.name: p for p in estimate_for_run(configs["memory_policy_gpu.toml [grpo]"]).parts}
    stage2 = {p.name: p for p in estimate_for_run(configs["memory_policy_gpu.toml [stage2.grpo]"]).parts}
    assert "frozen merged" not in stage1 and stage2["frozen merged"].bytes == stage2["weights"].bytes
    assert stage2["its KV cache"].phase == "rollouts" and stage2["its KV cache"].bytes > 0


def test_no_check_on_a_cpu():
    from memsearch.train.memory_plan import check_device_memory

    assert check_device_memory(grpo_gpu(), "cpu") is None


def test_the_longest_call_is_bounded_as_the_verl_lane_bounds_it():
    # verl's max_prompt_length / max_response_length are the pre-flight's longest call (one bound).
    from memsearch.integrations.verl.config import budgets
    from memsearch.train.memory_plan import call_tokens

    stream = ('role="overwrite"', 'episode.agent.evidence="stream"', 'episode.agent.memory="overwrite"',
              'episode.agent.controller="exhaust"', "episode.budgets.chunk_tokens=3000")
    for cfg in (grpo_gpu(), grpo_gpu(*stream)):
        assert call_tokens(cfg) == budgets(cfg)
    assert call_tokens(grpo_gpu(*stream))[0] > call_tokens(grpo_gpu())[0]  # a chunk, not a search's passages

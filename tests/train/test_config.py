"""GRPO config: one source of truth for schema mode (rollouts and periodic evaluation sample the
memory role the same way), the MemAgent recipe's training settings, and the files it names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from memsearch.config import load_config
from memsearch.train.config import GRPOConfig
from memsearch.train.grpo.trainer import trained_role_backends

ROOT = Path(__file__).resolve().parents[2]


def test_schema_mode_has_one_source_of_truth():
    cfg = GRPOConfig(data="x", rollout={"schema_mode": True})
    assert cfg.episode.backends.memory.schema_mode is True  # the episode (used by periodic eval) follows
    run = trained_role_backends(cfg)
    assert run.backends.memory.schema_mode is True and run.backends.memory.kind == "hf"
    assert GRPOConfig(data="x").episode.backends.memory.schema_mode is False


@pytest.mark.parametrize("top, episode", [(True, False), (False, True), (None, True)])
def test_schema_mode_disagreement_is_refused(top, episode):
    fields = {"data": "x", "episode": {"backends": {"memory": {"kind": "hf", "schema_mode": episode}}}}
    if top is not None:
        fields["rollout"] = {"schema_mode": top}
    with pytest.raises(ValidationError, match="schema_mode .* disagree"):
        GRPOConfig.model_validate(fields)


def test_schema_mode_of_an_untrained_memory_backend_is_its_own():
    """Stage 2 trains the controller; a frozen memory model may sample under the schema."""
    cfg = GRPOConfig(data="x", role="controller", episode={"agent": {"controller": "policy"},
                                                           "backends": {"memory": {"kind": "hf", "schema_mode": True}}})
    assert cfg.schema_mode is False and cfg.episode.backends.memory.schema_mode is True


def test_dual_clip_bound_is_above_one_or_off():
    assert GRPOConfig(data="x").loss.dual_clip == 3.0
    off = GRPOConfig(data="x", loss={"dual_clip": 0})
    assert off.loss.dual_clip == 0 and off == GRPOConfig(data="x", dual_clip=0)  # the flat spelling too
    with pytest.raises(ValidationError, match="dual-clip bound must be > 1"):
        GRPOConfig(data="x", loss={"dual_clip": 0.5})


def test_memagent_recipe_trains_like_the_reference():
    from memsearch.pipelines.memagent.config import MemAgentPipeline

    cfg = load_config(ROOT / "configs" / "memagent.toml", [], model=MemAgentPipeline).grpo_config("x")
    assert cfg.update.mini_batches_per_step == 16  # MemAgent: train_batch_size / ppo_mini_batch_size = 128 / 8
    assert (cfg.credit.mode, cfg.loss.aggregation) == ("split", "sequence")  # VIME's mem_agent pairing
    assert cfg.optim.lr == 1e-6 and cfg.loss.kl_coef == 0.001 and cfg.loss.clip_low == cfg.loss.clip_high == 0.2
    assert cfg.optim.warmup_steps == 20 * cfg.update.mini_batches_per_step  # verl warms up over 20 rollout steps


def test_files_named_by_the_shipped_configs_exist():
    shipped = [*(ROOT / "configs").rglob("*.toml"), *(ROOT / "studies").rglob("*.toml")]
    for toml in sorted(shipped):
        # A repository path: configs/... or studies/.../configs/... (never the tail of a longer path).
        text = toml.read_text(encoding="utf-8")
        for name in re.findall(r"(?<![\w/.-])(?:studies/[\w./-]*/)?configs/[\w./-]+\.toml", text):
            assert (ROOT / name).is_file(), f"{toml.relative_to(ROOT)} names {name}, which does not exist"


@pytest.mark.parametrize("model", ["sft", "grpo"])
@pytest.mark.parametrize("setting, field", [
    ("optim.lr=inf", "optim.lr"),
    ("optim.lr=nan", "optim.lr"),
    ("optim.lr=-0.001", "optim.lr"),
    ("optim.lr=1e30", "optim.lr"),  # finite, but a typo: AdamW moves weights ~lr per step
    ("optim.lr=2", "optim.lr"),
    ("optim.betas=[1.0, 0.999]", "optim.betas"),
    ("optim.betas=[0.9, -0.1]", "optim.betas"),
    ("optim.betas=[0.9, inf]", "optim.betas"),
    ("optim.weight_decay=-0.01", "optim.weight_decay"),
    ("optim.weight_decay=inf", "optim.weight_decay"),
    ("optim.max_grad_norm=inf", "optim.max_grad_norm"),
    ("lora.alpha=inf", "lora.alpha"),
    ("dist_timeout_s=nan", "dist_timeout_s"),
])
def test_absurd_optimiser_and_trainer_numbers_are_refused_at_load_naming_the_field(model, setting, field):
    """Before, lr = inf trained to an all-NaN adapter with exit 0 and bad betas failed inside
    torch after the run folder was made; now the config is refused with the field's path."""
    from memsearch.errors import InputError
    from memsearch.train.config import SFTConfig

    cls, base = {"sft": (SFTConfig, ['data=["x"]']), "grpo": (GRPOConfig, ['data="x"'])}[model]
    with pytest.raises(InputError) as exc:
        load_config(None, [*base, setting], model=cls)
    lines = str(exc.value).splitlines()
    assert len(lines) == 1 and f"--set {setting}: {field}" in lines[0], lines


def test_grpo_fields_beyond_the_optimiser_refuse_non_finite_numbers():
    from memsearch.errors import InputError

    for setting in ("reward.search_cost=inf", "loss.kl_coef=nan", "loss.clip_high=inf", "rollout.temperature=inf",
                    "kl_coef=nan"):  # the flat spelling of earlier configs too
        with pytest.raises(InputError, match="finite"):
            load_config(None, ['data="x"', setting], model=GRPOConfig)


def test_rollouts_and_evaluation_sample_the_trained_role_from_the_trainers_own_fields(monkeypatch):
    from memsearch.config import RunConfig, Sampling

    cfg = GRPOConfig(data="x", rollout={"schema_mode": True, "temperature": 0.7, "top_p": 0.9})
    # Built from the validated episode by copies: nothing is validated again per rollout.
    monkeypatch.setattr(RunConfig, "model_validate", lambda *a, **k: pytest.fail("validated again"))
    seeded = Sampling(temperature=0.7, top_p=0.9, seed=11)
    rollout = trained_role_backends(cfg, sampling=seeded)
    memory = rollout.backends.memory
    assert (memory.kind, memory.schema_mode, memory.sampling) == ("hf", True, seeded)
    assert rollout.backends.reader == cfg.episode.backends.reader
    evaluation = trained_role_backends(cfg, Path("run/adapter"), limit=3)
    assert (evaluation.backends.memory.adapter, evaluation.backends.memory.sampling.temperature) == ("run/adapter", 0.0)
    assert evaluation.limit == 3 and cfg.episode.limit is None and cfg.episode.backends.memory.adapter is None

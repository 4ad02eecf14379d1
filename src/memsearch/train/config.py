"""Typed configs of the trainers (``memsearch train sft`` / ``memsearch train grpo``), from TOML.

Every field is documented where it is declared; the resolved config is saved in the run folder
(``config.json``) and ``--resume`` refuses a different one. A pipeline's trainer table (its
``[grpo]``, ``[sft]``...) is a model of the same fields but those the pipeline sets
(``trainer_table``).

    cfg = load_config("configs/train/grpo_cpu.toml", overrides=["steps=4"], model=GRPOConfig)
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)

from memsearch.config import KeyProblems, RunConfig, StrictConfig
from memsearch.devices import DeviceLayout
from memsearch.records.trajectory import Role
from memsearch.registry import memory_mode
from memsearch.train.config_keys import upgrade_grpo_keys
from memsearch.train.rows import TrainedRole
from memsearch.train.trained_episode import schema_mode_on_episode, with_episode_config


def _list_as_tuple(value: Any) -> Any:
    # TOML and JSON (a saved config.json) have arrays, no tuples: a list of the right length is
    # the tuple; its items are still validated strictly (no "0.9" strings, no bools).
    return tuple(value) if isinstance(value, list) else value


FloatPair = Annotated[tuple[float, float], BeforeValidator(_list_as_tuple)]


def _credit_from_bool(value: Any) -> Any:
    # It was a bool before over_budget existed: older configs and commands say true / false.
    return {True: "all", False: "none"}.get(value, value) if isinstance(value, bool) else value


# Declared on the type, not as a validator of GRPOConfig, so a pipeline's GRPO table reads it too.
InvalidDecisionCredit = Annotated[Literal["all", "over_budget", "none"], BeforeValidator(_credit_from_bool)]


class TrainSettings(StrictConfig):
    """The base of every trainer config table: a number that is NaN or infinite is refused at
    load, naming its field (``lr = inf`` used to train to an all-NaN adapter with exit 0; no
    setting of a trainer means "unbounded" by inf)."""

    model_config = ConfigDict(allow_inf_nan=False)


class LoraSettings(TrainSettings):
    """The LoRA adapter that is trained (PEFT). Ignored when starting from an existing adapter,
    whose own settings then apply (the trainer says so)."""

    r: int = Field(16, ge=1, description="Rank of the update matrices")
    alpha: float = Field(32.0, gt=0, description="Scaling numerator (scale = alpha / r)")
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="LoRA dropout; 0 keeps rollout and training log-probs identical"
    )
    target_modules: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1,
        description="Module names that get an adapter (Llama/Qwen/SmolLM naming)",
    )


class OptimSettings(TrainSettings):
    """AdamW with warm-up and a decay schedule."""

    # le=1: AdamW moves every weight by about lr per step, so lr > 1 is a typo (1e5 for 1e-5) that
    # would throw a LoRA adapter out of range on its first step
    lr: float = Field(1e-5, gt=0, le=1.0, description="Peak learning rate (at most 1)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    betas: FloatPair = Field((0.9, 0.999), description="AdamW betas")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up from 0 to lr over this many optimizer steps")
    schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Decay after warm-up (to 0 at the last step)"
    )
    max_grad_norm: float | None = Field(1.0, gt=0, description="Clip the global gradient norm (None = no clipping)")

    @field_validator("betas")
    @classmethod
    def _betas_in_unit_interval(cls, betas: tuple[float, float]) -> tuple[float, float]:
        # AdamW's own check runs only once the run folder exists; 1 would never forget a gradient
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"got {list(betas)}, expected two numbers in [0, 1), e.g. [0.9, 0.999]")
        return betas


class EvalSettings(TrainSettings):
    """Periodic evaluation through the episode engine (the same code path as `memsearch eval`)."""

    data: str | None = Field(None, description="A prepared dev folder; None = no periodic evaluation")
    limit: int = Field(20, ge=1, description="First N dev tasks")
    every: int = Field(0, ge=0, description="Evaluate every N optimizer steps (0 = only at the end)")
    at_start: bool = Field(False, description="Also evaluate the starting weights before step 1")
    wait_s: float = Field(
        3600.0,
        gt=0,
        description="torchrun: rank 0 evaluates alone while the other ranks wait for it at an explicit "
        "barrier, at most this many seconds (then the run fails saying so); raise it for long evaluations",
    )


class RewardSettings(TrainSettings):
    """Trajectory reward: answer metric minus penalties, one number per trajectory
    (``train.reward``)::

        metric - invalid_call_penalty x invalid calls / calls of the trained role(s)
               - citation_penalty x invalid citations / citations of the answer
               - search_cost x searches
               + memory_recall x memory support recall (train labels)

    The defaults are the project's reward: F1, invalid actions and invalid citations penalised,
    searches free (search cost is an ablation). The MemAgent recipe sets both penalties to 0
    (boxed exact match alone)."""

    metric: Literal["f1", "em", "sub_em", "boxed_em"] = Field(
        "f1",
        description="Answer metric against the train label, as the evaluation scores it (boxed_em: the last "
        "\\boxed{} of the reader's text; the others: the parsed prediction); a failed episode scores 0",
    )
    invalid_call_penalty: float = Field(
        0.5,
        ge=0,
        description="Subtracted x (invalid calls / calls) of the trained role(s): calls whose output the "
        "engine rejected (unparsable or rejected memory operations, unreadable controller decisions, no answer); "
        "reward.invalid_penalty reads as it",
    )
    citation_penalty: float = Field(
        0.5,
        ge=0,
        description="Subtracted x (invalid citations / citations) of the final answer: evidence ids the "
        "reader cites that the episode never showed (the trajectory's invalid_citations); an answer citing nothing "
        "is not penalised",
    )
    search_cost: float = Field(
        0.0, ge=0, description="Subtracted per search the episode made (ablation of search cost)"
    )
    memory_recall: float = Field(
        0.0,
        ge=0,
        description="Added x memory support recall of the final memory (share of the train label's "
        "supporting facts whose evidence ids the memory cites): a label-based term for the memory role where the "
        "answer metric barely moves with memory quality (small readers); 0 = answer metric only",
    )


class CollapseGuardSettings(TrainSettings):
    """Stop a GRPO run that has collapsed into one decision (``train.collapse``): for ``patience``
    consecutive steps a decision entropy below ``min_decision_entropy``, or one op (or one invalid
    cause) over ``max_op_share`` of the memory calls' ops."""

    enabled: bool = Field(False, description="Check every step and stop with collapse.json when it trips")
    min_decision_entropy: float = Field(
        0.05, ge=0, description="Nats at the tokens that choose an op (train.decisions), mean over the step")
    max_op_share: float = Field(
        0.95, gt=0, le=1, description="Share of a step's ops and invalid calls one bucket may hold (ADD, NOOP, ...)")
    patience: int = Field(3, ge=1, description="Consecutive collapsed steps before the run stops")
    min_ops: int = Field(4, ge=1, description="Steps with fewer ops and invalid calls are not judged on shares")
    max_eval_op_share: float | None = Field(
        None, gt=0, le=1, description="Also stop when one op holds more than this share of the periodic greedy "
        "evaluation's ops (eval_ops) for eval_patience evaluations in a row; None: evaluations are not judged")
    eval_patience: int = Field(2, ge=1, description="Consecutive one-op evaluations before the run stops")


class StateReward(TrainSettings):
    """The per-call reward of ``credit.mode = "state"`` (``train.grpo.state_credit``): label shaping from the
    train labels, so each run's config states the reward it used. G = the question's gold facts."""

    gold_gain: float = Field(1.0, ge=0, description="x (gold ids kept by faithful items after - before) / |G|")
    junk_penalty: float = Field(0.5, ge=0, description="x (non-gold ids newly cited) / |G|, subtracted")
    overflow_penalty: float = Field(
        0.5, ge=0, description="A batch over the memory budget: x (0.5 + 0.5 x min(1, tokens over / budget)), "
        "subtracted")
    rejected_batch_penalty: float = Field(
        0.5, ge=0, description="Any other rejected or unreadable batch, subtracted (flat, once per call); "
        "state_reward.invalid_penalty reads as it")


class DynamicSamplingSettings(TrainSettings):
    """DAPO's dynamic sampling (``train.dynamic_sampling``): groups whose rewards are all equal are
    dropped and other tasks rolled out in their place."""

    enabled: bool = Field(False, description="Drop zero-variance groups and sample replacements")
    max_extra_rounds: int = Field(
        2, ge=0, description="Extra rollout rounds per step at most; the step trains on fewer groups when they run "
        "out (0: drop only)")


class RolloutSettings(TrainSettings):
    """How a GRPO step samples (``[rollout]``): the tasks, the group of rollouts per task and the
    trained role's sampling, which periodic evaluation shares (schema mode)."""

    tasks_per_step: int = Field(4, ge=1, description="Tasks per step over all ranks (each rank rolls out its share)")
    group_size: int = Field(4, ge=2, description="Rollouts per task (the GRPO group)")
    temperature: float = Field(
        1.0, gt=0, description="Sampling temperature of the trained role (full distribution at 1)"
    )
    top_p: float = Field(
        1.0, gt=0, le=1.0, description="Nucleus of the trained role; < 1 makes recomputed log-probs differ"
    )
    schema_mode: bool | None = Field(
        None,
        description="Memory role: sample under the ops JSON schema; the mask is replayed in the loss. A spelling of "
        "episode.backends.memory.schema_mode, where the config keeps it for rollouts and periodic evaluation "
        "(GRPOConfig.schema_mode): moved there at load (kind = 'hf' when true); a config where the two disagree is "
        "refused. Dumped here as that value",
    )
    max_batch_size: int = Field(16, ge=1, description="Rollout decoder: most rows decoded together")


class CreditSettings(TrainSettings):
    """Which rows get which advantage (``[credit]``): the trajectory's group advantage shared or
    split over its rows, or per-call state groups (``train.grpo.state_credit``)."""

    mode: Literal["share", "split", "state"] = Field(
        "share", description="share: every row gets the trajectory's advantage; split: advantage / rows; state: "
        "state groups, each memory call branched state_group_size times from the same state, each branch's "
        "advantage from its per-call reward (train.grpo.state_credit; memory role)")
    state_group_size: int = Field(4, ge=2, description="mode = 'state': completions drawn at every memory call")
    state_reward: StateReward = Field(default_factory=StateReward, description="mode = 'state': per-call reward")
    global_weight: float = Field(
        0.0, ge=0, description="mode = 'state': the continued branch also gets this x its trajectory's group "
        "advantage (0: local credit only)")
    invalid_decision_credit: InvalidDecisionCredit = Field(
        "all", description="Which invalid calls' op-choosing tokens (train.grpo.decisions) get gradient: all; none "
        "(their penalty trains only what follows the choice: the item's length, its sources); over_budget (only the "
        "batches rejected for overflowing the memory budget, where choosing to add is the error). true / false "
        "read as all / none (train.grpo.decisions.mask_invalid_decisions)")
    std_scale: bool = Field(False, description="Divide advantages by the group's standard deviation")


class LossSettings(TrainSettings):
    """The clipped policy-gradient loss (``[loss]``, ``train.grpo.loss``): ratio clips, how token
    losses are aggregated, the KL penalty."""

    clip_low: float = Field(0.2, ge=0, description="Ratio clip below: 1 - clip_low")
    clip_high: float = Field(0.2, ge=0, description="Ratio clip above: 1 + clip_high")
    dual_clip: float = Field(
        3.0,
        ge=0.0,
        description="Dual-clip bound c > 1 (verl's clip_ratio_c): a negative-advantage token's loss is at "
        "most -A*c. Acts only once the ratio departs from 1 (mini-batches, epochs > 1); 0 disables it",
    )
    aggregation: Literal["trajectory", "token", "sequence", "constant"] = Field(
        "trajectory",
        description="trajectory: each trajectory normalized by its generated tokens; token: token mean; "
        "sequence: row mean; constant: every token weighted 1 / aggregation_tokens, divided by the trajectories "
        "(Dr. GRPO: no length bias between short and long trajectories; train.grpo.loss)",
    )
    aggregation_tokens: int = Field(
        256, ge=1, description="L of aggregation = 'constant' (Dr. GRPO's constant normaliser): scales the loss, "
        "not its direction; e.g. the longest trajectory's generated tokens")
    kl_coef: float = Field(0.0, ge=0, description="k3 KL penalty to the reference (kl_reference)")
    kl_reference: Literal["start", "base"] = Field(
        "start",
        description="KL reference: 'start' = the weights training starts from (a frozen copy of `adapter` when "
        "given, else the base); 'base' = the base model with the adapter disabled, even after an SFT adapter",
    )

    @field_validator("dual_clip")
    @classmethod
    def _dual_clip_above_one(cls, value: float) -> float:
        # Between 0 and 1 the bound would cut below the clipped loss itself: a typo for 3, or for 0 (off)
        if 0 < value <= 1:
            raise ValueError(f"{value}: the dual-clip bound must be > 1 (or 0 to disable it)")
        return value


class UpdateSettings(TrainSettings):
    """How a step's rollouts update the weights (``[update]``, ``train.grpo.update``): passes,
    mini-batches, micro-batches and dropout."""

    epochs: int = Field(
        1, ge=1, description="Passes over each rollout batch (old log-probs taken once, before the first)"
    )
    mini_batches_per_step: int = Field(
        1,
        ge=1,
        description="Mini-batches per rollout batch, one optimizer step each per epoch (whole trajectories, "
        "split in order on each rank); old log-probs are taken before the first, so later mini-batches are off-policy "
        "and the clip acts. 1 = one full-batch step (the ratio is exactly 1)",
    )
    micro_batch_tokens: int = Field(
        1024,
        ge=64,
        description="Padded tokens per forward/backward micro-batch: bounds activation memory; gradients "
        "accumulate exactly, so it changes memory and speed, not the update (raise it on a GPU)",
    )
    share_prompts: bool = Field(
        False, description="Score the rows that share a prompt (a state group, the first calls of a task's "
        "rollouts) as one packed sequence with the prompt once (train.grpo.shared_prompt): same numbers, less "
        "compute")
    disable_dropout: bool = Field(
        True,
        description="Train with dropout off (as TRL's disable_dropout): the update then differentiates the "
        "function the rollouts sampled from (they always run without dropout), so the first pass has ratio 1 even "
        "with lora.dropout > 0. Old and reference log-probs are always taken without dropout",
    )


# Trainer fields that say where and how frugally a run computes, not what it computes: the same
# updates up to float round-off with any value. They are saved in config.json like every field but
# left out of what must match on --resume and of a pipeline stage's fingerprint, so a run may
# continue on another node's GPUs, and the records of runs made before these fields existed still
# resume and still match their stages. ``max_failed_share`` (GRPO) only says when a run stops for
# a service's faults: a resume may raise it once the service is back (train.failures).
PLACEMENT_FIELDS = ("devices", "gradient_checkpointing", "max_failed_share")


def without_placement(dump: dict[str, Any]) -> dict[str, Any]:
    """A trainer config's JSON dump without ``PLACEMENT_FIELDS`` and without where served models
    answer (``config.backend.without_addresses``): what a run computes."""
    from memsearch.config.backend import without_addresses

    return without_addresses({k: v for k, v in dump.items() if k not in PLACEMENT_FIELDS})


class TrainerConfig(TrainSettings):
    """Settings both trainers (``GRPOConfig``, ``SFTConfig``) have, with the same meaning."""

    @classmethod
    def upgrade_keys(cls, data: Any) -> Any:
        """Raw fields (a TOML table, a saved ``config.json``) with earlier spellings of this
        trainer's fields in the current ones; a trainer that renamed none takes them as they are."""
        return data

    lora: LoraSettings = Field(default_factory=LoraSettings, description="LoRA settings")
    eval: EvalSettings = Field(default_factory=EvalSettings, description="Periodic evaluation")
    keep_checkpoints: int = Field(2, ge=1, description="Newest checkpoints kept (older ones are deleted)")
    device: str = Field("auto", description="auto | cpu | cuda (torchrun: one GPU per local rank)")
    dtype: str = Field("float32", description="Weights dtype of the trained model (float32 on CPU)")
    dist_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="torchrun: process-group timeout, the longest one rank waits in a collective for the "
        "others (GRPO: e.g. for the slowest rank's rollouts) before the run fails; NCCL's own default is 600 s",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Non-reentrant activation checkpointing of the decoder layers whenever gradients are computed "
        "(train.checkpointing): each layer's activations are recomputed in the backward pass instead of kept; the "
        "same gradients, 12-15x fewer saved bytes for 1.4x the update time on SmolLM2 on a CPU (Qwen2.5-7B shape: "
        "327 -> 7 KiB a token a layer). On in the GPU recipes; `--dry-run` shows the estimate with and without",
    )
    devices: DeviceLayout = Field(
        default_factory=DeviceLayout,
        description="GPUs of the trainer and of the servers beside it (memsearch.devices); empty = whatever "
        "CUDA_VISIBLE_DEVICES and torchrun give",
    )


class GRPOConfig(TrainerConfig):
    """``memsearch train grpo``: multi-turn GRPO through the episode engine (docs/design.md §7)."""

    role: TrainedRole = Field(
        "memory",
        description="Trained decisions: memory (stage 1), controller (stage 2), "
        "memagent (MemAgent: every overwrite of the memory + the final answer); 'overwrite' reads as memagent",
    )
    model: str = Field("embedded", description="'embedded' or a local Hugging Face model folder (the base of the LoRA)")
    adapter: str | None = Field(None, description="Start from this LoRA adapter (e.g. an SFT run): weights only")
    data: str = Field(..., description="Prepared train folder (manifest split must be 'train')")
    episode_config: str | None = Field(
        None,
        description="Run config (TOML) the episode starts from, e.g. the eval config of the group being trained, "
        "so training and evaluation share budgets; [episode] tables given here are applied on top",
    )
    episode: RunConfig = Field(
        default_factory=RunConfig, description="Agent design, budgets and the backends of the untrained roles"
    )
    steps: int = Field(20, ge=1, description="Optimizer steps (one rollout batch each)")
    rollout: RolloutSettings = Field(default_factory=RolloutSettings, description="Sampling of a step's rollouts")
    credit: CreditSettings = Field(default_factory=CreditSettings, description="Advantages of the rows")
    loss: LossSettings = Field(default_factory=LossSettings, description="Clipped policy-gradient loss")
    update: UpdateSettings = Field(default_factory=UpdateSettings, description="Passes and batches of an update")
    reward: RewardSettings = Field(default_factory=RewardSettings, description="Reward of a trajectory")
    dynamic_sampling: DynamicSamplingSettings = Field(
        default_factory=DynamicSamplingSettings, description="Drop zero-variance groups (train.dynamic_sampling)")
    collapse_guard: CollapseGuardSettings = Field(
        default_factory=CollapseGuardSettings, description="Stop when the decision collapses (train.collapse)")
    max_failed_share: float = Field(
        0.25, ge=0.0, le=1.0, description="Stop (exit 2, before the step's update) when more than this share of a "
        "step's trajectories had a failed request: a server fault, not the policy's doing. Failed trajectories are "
        "never trained on nor group members for the advantages (train.failures); 1 never stops")
    optim: OptimSettings = Field(default_factory=OptimSettings, description="Optimizer and schedule")
    seed: int = Field(0, description="Seeds task order, sampling and initialization")
    checkpoint_every: int = Field(5, ge=1, description="Save a resumable checkpoint every N steps (and at the end)")
    save_rollouts: bool = Field(True, description="Write every step's trajectories to rollouts/")

    @classmethod
    def upgrade_keys(cls, data: Any) -> Any:
        """Raw fields with every earlier spelling in the current one (``train.config_keys``)."""
        return upgrade_grpo_keys(data)

    @model_validator(mode="before")
    @classmethod
    def _episode_as_trained(cls, data: Any) -> Any:
        # Raw [episode] tables are completed before they are validated, in this order: the run
        # config file `episode_config` under them, then the trained memory role's schema mode;
        # earlier spellings of the fields are read first, so both work on the current ones.
        return schema_mode_on_episode(with_episode_config(upgrade_grpo_keys(data)))

    @property
    def schema_mode(self) -> bool:
        """Whether the trained memory role samples under the ops JSON schema (rollouts, periodic
        evaluation, the loss's replayed mask): the episode memory backend's ``schema_mode``, the
        one place the config keeps it (``rollout.schema_mode`` is read into it)."""
        return self.role == "memory" and self.episode.backends.memory.schema_mode

    @model_serializer(mode="wrap")
    def _dump_schema_mode(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Recorded configs and stage fingerprints keep it where it always was: rollout.schema_mode
        data = handler(self)
        if isinstance(data, dict) and isinstance(data.get("rollout"), dict) and "schema_mode" in data["rollout"]:
            data["rollout"]["schema_mode"] = self.schema_mode
        return data

    @model_validator(mode="after")
    def _role_fits_episode(self) -> GRPOConfig:
        agent = self.episode.agent
        if self.role == "memory" and not memory_mode(agent.memory).operations:
            raise KeyProblems(("role", "'memory' trains memory operations: set episode.agent.memory = 'decision'"))
        if self.role == "controller" and agent.controller != "policy":
            raise KeyProblems(("role", "'controller' needs episode.agent.controller = 'policy'"))
        if self.role == "memagent" and agent.memory != "overwrite":
            raise KeyProblems(("role", "'memagent' needs episode.agent.memory = 'overwrite' (MemAgent)"))
        if self.credit.mode == "state":
            if self.role != "memory":
                raise KeyProblems(("credit.mode", "'state' branches memory calls: it needs role = 'memory'"))
            if self.dynamic_sampling.enabled:
                raise KeyProblems(("dynamic_sampling.enabled", "dynamic_sampling filters trajectory groups; with "
                                   "credit.mode = 'state' the groups are the state groups of each call: set it to "
                                   "false"))
        left = self.rollout.schema_mode  # not moved onto the episode: trained_episode.schema_mode_on_episode
        if left and self.role != "memory":
            raise KeyProblems(("rollout.schema_mode", "applies to the memory role (decision mode) only"))
        episode_mode = self.episode.backends.memory.schema_mode
        if (left is not None or self.role == "memagent") and bool(left) != episode_mode:
            # Rollouts would sample the trained memory calls one way and periodic evaluation (and
            # `memsearch eval` of this episode) the other: the evaluated policy would not be the trained one.
            raise KeyProblems((
                "rollout.schema_mode",
                f"rollout.schema_mode = {str(bool(left)).lower()} and episode.backends.memory.schema_mode = "
                f"{str(episode_mode).lower()} disagree: training and evaluation must sample the memory role "
                "the same way; set rollout.schema_mode (the episode follows it) and leave the episode's unset",
            ))
        return self


class SFTConfig(TrainerConfig):
    """``memsearch train sft``: LoRA SFT on completion tokens only (data from `export-sft`)."""

    model: str = Field("embedded", description="'embedded' or a local Hugging Face model folder")
    adapter: str | None = Field(None, description="Continue from this LoRA adapter (weights only)")
    data: list[str] = Field(..., description="Chat-format JSONL files from `memsearch export-sft`")
    role: Role = Field(
        "memory", description="Role the adapter serves in periodic evaluation"
    )
    eval_config: str | None = Field(None, description="Run config (TOML) for periodic evaluation through the engine")
    epochs: float = Field(2.0, gt=0, description="Passes over the data (fractions allowed)")
    micro_batch_rows: int = Field(4, ge=1, description="Rows per forward/backward pass")
    grad_accumulation: int = Field(4, ge=1, description="Micro-batches per optimizer step")
    max_tokens: int = Field(
        2048, ge=16, description="Longest prompt + completion; longer rows are refused with their line"
    )
    optim: OptimSettings = Field(
        default_factory=lambda: OptimSettings(lr=2e-4, warmup_steps=5, schedule="cosine"),
        description="Optimizer and schedule",
    )
    seed: int = Field(0, description="Seeds shuffling and initialization")
    checkpoint_every: int = Field(
        50, ge=1, description="Save a resumable checkpoint every N optimizer steps (and at the end)"
    )

    @model_validator(mode="after")
    def _eval_needs_config(self) -> SFTConfig:
        if self.eval.data is not None and self.eval_config is None:
            raise KeyProblems(
                ("eval_config", "eval.data is set: also set eval_config (the run config used for evaluation)")
            )
        return self


# Fields of a trainer config that every pipeline sets itself: what is trained, on which data, in
# which episode, on which GPUs. A pipeline's trainer table never holds them (``trainer_table``).
PIPELINE_FIELDS = ("role", "model", "data", "episode", "episode_config", "devices")


class TrainerTable(TrainSettings):
    """The base of a pipeline's trainer table (``trainer_table``): the fields of a trainer config
    that the pipeline leaves to its user, each validated and documented as the trainer's own, at
    the pipeline config's load. ``OWNED`` (keys) and ``OWNED_EVAL`` (keys of its ``eval`` table)
    are what this pipeline sets itself: they are refused, naming them, not called unknown."""

    OWNED: ClassVar[tuple[str, ...]] = ()
    OWNED_EVAL: ClassVar[tuple[str, ...]] = ()
    TRAINER: ClassVar[type[TrainerConfig]] = TrainerConfig

    @model_validator(mode="before")
    @classmethod
    def _not_the_pipelines(cls, data: Any) -> Any:
        # A table in a published pipeline config may spell the trainer's fields the earlier way
        data = cls.TRAINER.upgrade_keys(data)
        if not isinstance(data, dict):
            return data
        evals = data.get("eval")
        bad = sorted(set(data) & set(cls.OWNED)) + sorted(
            f"eval.{k}" for k in (set(evals) & set(cls.OWNED_EVAL) if isinstance(evals, dict) else ()))
        if bad:
            raise KeyProblems(("", f"{', '.join(bad)} set by the pipeline itself; remove them"))
        return data

    def given(self) -> dict[str, Any]:
        """The fields the table sets, as validated values (models, not dumps): what a pipeline
        puts under the fields it owns to build the trainer config, the trainer's defaults for the rest."""
        return {name: getattr(self, name) for name in self.model_fields_set}


def _as_written(table: TrainerTable) -> dict[str, Any]:
    # A pipeline config's record (invocations.jsonl, pipeline.json) keeps each trainer table as the
    # user wrote it, as it did when tables were plain dicts: the fields set, not every default.
    return table.model_dump(mode="json", exclude_unset=True)


def trainer_table(config: type[TrainerConfig], name: str, module: str, owned: tuple[str, ...],
                  owned_eval: tuple[str, ...] = (), doc: str = "") -> type[TrainerTable]:
    """A pipeline's table of ``config`` (``GRPOConfig`` / ``SFTConfig``): a model of its fields but
    ``PIPELINE_FIELDS`` and ``owned``, with their declarations (types, bounds, defaults,
    descriptions), so ``grpo.optim.lr = 2`` is refused at load as ``grpo.optim.lr``; ``name`` and
    ``module`` (the pipeline config's) are the model's. ``.given()`` feeds the trainer config."""
    skipped = set(PIPELINE_FIELDS) | set(owned)
    fields = {key: (info.annotation, info) for key, info in config.model_fields.items() if key not in skipped}
    table = create_model(name, __base__=TrainerTable, __doc__=doc or TrainerTable.__doc__,
                         __module__=module, **fields)
    table.OWNED, table.OWNED_EVAL = tuple(dict.fromkeys((*PIPELINE_FIELDS, *owned))), tuple(owned_eval)
    table.TRAINER = config
    return table


def as_written(table: type[TrainerTable]) -> Any:
    """The type of a pipeline config field holding ``table``: dumped as written (``_as_written``)."""
    return Annotated[table, PlainSerializer(_as_written)]

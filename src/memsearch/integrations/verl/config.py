"""``memsearch verl config``: a memsearch GRPO config as verl 0.9.1 Hydra overrides.

Every ``GRPOConfig`` option either maps to a verl key, or is reported as a *difference* (it
maps, but verl does something memsearch does not: kept as a note beside the overrides), or is
*refused* with the reason (``VerlMappingError``): verl would silently train something else.

Refused (docs/verl.md has the table):

- ``credit = "split"``: verl copies the last output's reward over the session's earlier ones
  and broadcasts one advantage to every row; splitting it needs a custom trainer (a fork);
- ``aggregation = "trajectory"``: verl's loss aggregations are per token or per row;
- ``schema_mode``: vLLM / SGLang do not replay memsearch's constraint masks in the loss;
- ``model = "embedded"``, ``adapter``, ``kl_reference = "start"`` with an adapter: verl needs a
  Hugging Face folder and takes the base (adapter off) as the KL reference; merge first;
- ``optim.schedule = "linear"``, ``optim.max_grad_norm = None``, ``dual_clip = 0``,
  ``lora.dropout > 0``: verl's FSDP actor has no such setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memsearch.errors import InputValueError
from memsearch.integrations.verl import AGENT_NAME
from memsearch.train.config import GRPOConfig

REWARD_PATH = "pkg://memsearch.integrations.verl.reward"
LOOP_TARGET = "memsearch.integrations.verl.loop.MemsearchAgentLoop"
# Slack for the chat template and the prompt wording around the budgeted parts of a call.
PROMPT_SLACK_TOKENS = 1024


class VerlMappingError(InputValueError):
    """Options of a memsearch config that verl cannot run; ``reasons`` has one line per option."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("not mappable to verl:\n" + "\n".join(f"- {r}" for r in reasons))
        self.reasons = reasons


def load_grpo_config(path: Path, overrides: list[str] | None = None, data: str | None = None) -> GRPOConfig:
    """A ``memsearch train grpo`` config, or the training stage of a MemAgent pipeline config
    (``pipeline = "memagent"``); ``data`` replaces the train folder."""
    from memsearch.config import config_from_tables, read_config_file

    raw = read_config_file(path)
    if raw.get("pipeline") == "memagent":
        from memsearch.pipelines.memagent.config import MemAgentPipeline

        if not data:
            raise InputValueError(f"{path} is a MemAgent pipeline config: give --data, the prepared train folder "
                             "(the pipeline's prepare/train)")
        return config_from_tables(raw, overrides, MemAgentPipeline, str(path)).grpo_config(data)
    extra = [f"data={data}"] if data else []
    return config_from_tables(raw, list(overrides or []) + extra, GRPOConfig, str(path))


def refusals(cfg: GRPOConfig) -> list[str]:
    """The options of ``cfg`` that verl cannot run, each with the reason (module doc)."""
    out = []
    if cfg.credit == "split":
        out.append("credit = 'split': verl broadcasts the session's advantage to every row (that is 'share'); "
                   "set credit = 'share'")
    if cfg.credit == "state":
        out.append("credit = 'state': verl's agent loop returns one session per rollout, not branches of each memory "
                   "call from one state; set credit = 'share'")
    if cfg.aggregation in ("trajectory", "constant"):
        out.append(f"aggregation = {cfg.aggregation!r}: verl aggregates per token (token-mean) or per row "
                   "(seq-mean-token-mean), and its seq-mean-token-sum-norm divides by no count of trajectories; "
                   "set aggregation = 'token' or 'sequence'")
    if cfg.schema_mode:
        out.append("schema_mode = true: vLLM/SGLang rollouts do not record memsearch's constraint masks, and verl's "
                   "loss cannot replay them")
    if cfg.model == "embedded":
        out.append("model = 'embedded': verl loads a Hugging Face folder; export one (docs/verl.md) and set model")
    if cfg.adapter is not None:
        out.append("adapter: verl starts a LoRA from the base; merge the adapter into the base first "
                   "(memsearch train merge) and set model to the merged folder")
    if cfg.optim.schedule == "linear":
        out.append("optim.schedule = 'linear': verl's FSDP optimizer has constant and cosine only")
    if cfg.optim.max_grad_norm is None:
        out.append("optim.max_grad_norm = None: verl always clips the gradient norm (actor.grad_clip)")
    if cfg.dual_clip == 0:
        out.append("dual_clip = 0: verl always applies the dual clip (actor.clip_ratio_c > 1)")
    if cfg.lora.dropout > 0:
        out.append("lora.dropout > 0: verl's LoRA has no dropout setting")
    if cfg.dynamic_sampling.enabled:
        out.append("dynamic_sampling.enabled: map it to verl's algorithm.filter_groups yourself (its metric and "
                   "batch sizing differ); set it to false here")
    if cfg.collapse_guard.enabled:
        out.append("collapse_guard.enabled: verl's trainer logs no decision entropy or op histogram for the guard "
                   "to read; set it to false")
    if cfg.reward.memory_recall:
        out.append(
            "reward.memory_recall > 0: the verl rows carry the gold answers only (reward_model.ground_truth), "
            "not the supporting facts the memory-recall term needs; set it to 0 or train with memsearch train grpo"
        )
    return out


def budgets(cfg: GRPOConfig) -> tuple[int, int]:
    """``(max_prompt_length, max_response_length)`` that fit every call of the episode.

    The prompt: memory budget + the largest evidence block (a chunk, or the passages of one
    search) + ``PROMPT_SLACK_TOKENS`` for the template, question and wording; a call that still
    does not fit is refused and counted by the loop, never truncated. The response: the longest
    completion the engine allows (policy or answer budget).
    """
    b = cfg.episode.budgets
    evidence = b.chunk_tokens if cfg.episode.agent.evidence == "stream" else b.evidence_tokens
    return b.memory_tokens + evidence + PROMPT_SLACK_TOKENS, max(b.policy_tokens, b.answer_tokens)


def verl_overrides(
    cfg: GRPOConfig,
    agent_loops: str,
    train_files: str,
    val_files: str | None = None,
    gpus: int = 8,
    nodes: int = 1,
    rollout: str = "vllm",
) -> tuple[list[str], list[str]]:
    """``(overrides, notes)`` for ``python -m verl.trainer.main_ppo``; raises ``VerlMappingError``.

    ``agent_loops`` is the agent-loop YAML (``agent_loop_yaml``); ``notes`` say where verl
    differs from the reference trainer for this config.
    """
    refused = refusals(cfg)
    if refused:
        raise VerlMappingError(refused)
    prompt_len, response_len = budgets(cfg)
    actor = "actor_rollout_ref.actor"
    agg = {"token": "token-mean", "sequence": "seq-mean-token-mean"}[cfg.aggregation]
    out = [
        "algorithm.adv_estimator=grpo",
        f"algorithm.norm_adv_by_std_in_grpo={cfg.std_scale}",
        "trainer.use_v1=True",  # list outputs (one row per trained call) exist on the v1 trainer only
        f"data.train_files={train_files}",
        f"data.val_files={val_files or train_files}",
        f"data.train_batch_size={cfg.tasks_per_step}",
        f"data.seed={cfg.seed}",  # task order
        f"data.max_prompt_length={prompt_len}",
        f"data.max_response_length={response_len}",
        "data.filter_overlong_prompts=False",  # the parquet prompt is the question only; the loop checks lengths
        f"actor_rollout_ref.model.path={cfg.model}",
        f"actor_rollout_ref.model.lora_rank={cfg.lora.r}",
        f"actor_rollout_ref.model.lora_alpha={cfg.lora.alpha:g}",
        f"actor_rollout_ref.model.target_modules=[{','.join(cfg.lora.target_modules)}]",
        f"actor_rollout_ref.rollout.name={rollout}",
        f"actor_rollout_ref.rollout.n={cfg.group_size}",
        f"actor_rollout_ref.rollout.temperature={cfg.temperature}",
        f"actor_rollout_ref.rollout.top_p={cfg.top_p}",
        "actor_rollout_ref.rollout.calculate_log_probs=True",  # rows carry the rollout log-probs
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loops}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_NAME}",
        f"{actor}.ppo_mini_batch_size={max(1, cfg.tasks_per_step // cfg.mini_batches_per_step)}",
        f"{actor}.ppo_epochs={cfg.epochs}",
        f"{actor}.clip_ratio_low={cfg.clip_low}",
        f"{actor}.clip_ratio_high={cfg.clip_high}",
        f"{actor}.clip_ratio_c={cfg.dual_clip}",
        f"{actor}.loss_agg_mode={agg}",
        f"{actor}.use_kl_loss={cfg.kl_coef > 0}",
        f"{actor}.kl_loss_coef={cfg.kl_coef}",
        f"{actor}.kl_loss_type=low_var_kl",  # k3, memsearch's estimator
        f"{actor}.use_dynamic_bsz=True",
        f"{actor}.ppo_max_token_len_per_gpu={max(cfg.micro_batch_tokens, prompt_len + response_len)}",
        f"{actor}.grad_clip={cfg.optim.max_grad_norm}",
        f"{actor}.optim.lr={cfg.optim.lr}",
        f"{actor}.optim.weight_decay={cfg.optim.weight_decay}",
        f"{actor}.optim.betas=[{cfg.optim.betas[0]},{cfg.optim.betas[1]}]",
        f"{actor}.optim.lr_warmup_steps={cfg.optim.warmup_steps}",
        f"{actor}.optim.lr_scheduler_type={cfg.optim.schedule}",
        f"reward.custom_reward_function.path={REWARD_PATH}",
        "reward.custom_reward_function.name=compute_score",
        f"+reward.custom_reward_function.reward_kwargs.metric={cfg.reward.metric}",
        f"+reward.custom_reward_function.reward_kwargs.invalid_penalty={cfg.reward.invalid_penalty}",
        f"+reward.custom_reward_function.reward_kwargs.citation_penalty={cfg.reward.citation_penalty}",
        f"+reward.custom_reward_function.reward_kwargs.search_cost={cfg.reward.search_cost}",
        f"+reward.custom_reward_function.reward_kwargs.memory_recall={cfg.reward.memory_recall}",
        f"trainer.total_training_steps={cfg.steps}",
        f"trainer.save_freq={cfg.checkpoint_every}",
        f"trainer.max_actor_ckpt_to_keep={cfg.keep_checkpoints}",
        f"trainer.n_gpus_per_node={gpus}",
        f"trainer.nnodes={nodes}",
        "trainer.resume_mode=auto",
    ]
    if val_files is None:  # verl needs val_files; without real ones it must not validate on train
        out += ["trainer.val_before_train=False", "trainer.test_freq=-1"]
    notes = [
        "groups of one session (a failed sibling, or n = 1) get advantage = reward in verl, 0 in memsearch",
        "verl's PPO mini-batch counts rows (ppo_mini_batch_size x n rows, and a session has one row per trained "
        f"call), so a step makes about rows-per-session x {cfg.mini_batches_per_step} optimizer steps",
        "verl's v1 trainer collects sessions in completion order: runs are not bit-reproducible; memsearch's "
        "trainer is the reproducible reference",
        "memsearch's per-call sampling seeds are not sent to the rollout servers",
    ]
    if cfg.eval.data:
        notes.append(
            f"periodic evaluation on {cfg.eval.data}: run `memsearch eval` on merged checkpoints "
            "(docs/verl.md); verl's validation scores the same reward only as a training signal"
        )
    if cfg.kl_coef > 0:
        notes.append("KL reference: the base with the LoRA adapter off (verl's ref_in_actor), as kl_reference = 'base'")
    return out, notes


def agent_loop_yaml(train_config: str, data: str | None = None, overrides: list[str] | None = None) -> str:
    """The agent-loop list verl reads (``agent_loop_config_path``): one memsearch loop; its
    extra keys become the loop's constructor arguments."""
    lines = [f"- name: {AGENT_NAME}", f"  _target_: {LOOP_TARGET}", f"  train_config: {_yaml_str(train_config)}"]
    if data:
        lines.append(f"  data: {_yaml_str(data)}")
    if overrides:
        lines.append("  overrides: [" + ", ".join(_yaml_str(o) for o in overrides) + "]")
    return "\n".join(lines) + "\n"


def _yaml_str(value: Any) -> str:
    import json

    return json.dumps(str(value))  # a JSON string is a valid YAML flow scalar

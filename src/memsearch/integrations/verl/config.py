"""``memsearch verl config``: a memsearch GRPO config as verl 0.9.1 Hydra overrides.

Every ``GRPOConfig`` option either maps to a verl key, or is reported as a *difference* (it
maps, but verl does something memsearch does not: kept as a note beside the overrides), or is
*refused* with the reason (``VerlMappingError``): verl would silently train something else.

``credit.mode = "split"`` and ``"state"`` run on memsearch's trainer registered with verl
(``trainer.MemsearchTrainer``, ``trainer.v1.trainer_mode=memsearch``, its module imported into
verl's processes through the Ray runtime environment): verl's own GRPO is ``share``.

Refused (docs/verl.md has the table):

- ``credit.invalid_decision_credit`` other than ``"all"``: verl's rows have no decision-token mask;
- ``loss.aggregation = "trajectory"``: verl's loss aggregations are per token or per row;
- ``rollout.schema_mode``: vLLM / SGLang do not replay memsearch's constraint masks in the loss;
- ``model = "embedded"``, ``adapter``, ``loss.kl_reference = "start"`` with an adapter: verl needs a
  Hugging Face folder and takes the base (adapter off) as the KL reference; merge first;
- ``optim.schedule = "linear"``, ``optim.max_grad_norm = None``, ``loss.dual_clip = 0``,
  ``lora.dropout > 0``: verl's FSDP actor has no such setting.

Launch settings are checked too (``launch_problems``): a rollout tensor-parallel size that does
not divide the GPUs (verl floors the number of replicas and leaves ranks without one; its own
``validate_config`` passes it), a logger verl does not know. ``trainer.logger`` is ``[console]``
unless more are asked for (verl's default adds wandb, which stops a node without a W&B key).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from memsearch.errors import InputError, InputValueError
from memsearch.integrations.verl import AGENT_NAME, TRAINER_MODULE, TRAINER_NAME
from memsearch.train.config import GRPOConfig

REWARD_PATH = "pkg://memsearch.integrations.verl.reward"
LOOP_TARGET = "memsearch.integrations.verl.loop.MemsearchAgentLoop"
# verl 0.9.1's rollout.tensor_model_parallel_size default (verl/trainer/config/rollout/rollout.yaml),
# written out explicitly so the divisibility check and the run agree.
VERL_ROLLOUT_TP = 2
# The loggers verl 0.9.1's Tracking accepts (verl/utils/tracking.py, supported_backend; the verl
# lane checks this list against it).
VERL_LOGGERS = ("console", "wandb", "mlflow", "swanlab", "vemlp_wandb", "tensorboard", "clearml", "trackio", "file",
                "rl_insight")
# Tasks whose MemAgent contexts are chunked to measure the rows of a session (they are built alike).
ROWS_SAMPLE_TASKS = 64


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
    if cfg.credit.invalid_decision_credit != "all":
        out.append(f"credit.invalid_decision_credit = {cfg.credit.invalid_decision_credit!r}: the verl rows carry no "
                   "decision-token mask (every generated token is in verl's loss); set it to 'all'")
    if cfg.loss.aggregation in ("trajectory", "constant"):
        out.append(f"loss.aggregation = {cfg.loss.aggregation!r}: verl aggregates per token (token-mean) or per row "
                   "(seq-mean-token-mean), and its seq-mean-token-sum-norm divides by no count of trajectories; "
                   "set loss.aggregation = 'token' or 'sequence'")
    if cfg.schema_mode:
        out.append("rollout.schema_mode = true: vLLM/SGLang rollouts do not record memsearch's constraint masks, and "
                   "verl's loss cannot replay them")
    if cfg.model == "embedded":
        out.append("model = 'embedded': verl loads a Hugging Face folder; export one (docs/verl.md) and set model")
    if cfg.adapter is not None:
        out.append("adapter: verl starts a LoRA from the base; merge the adapter into the base first "
                   "(memsearch train merge) and set model to the merged folder")
    if cfg.optim.schedule == "linear":
        out.append("optim.schedule = 'linear': verl's FSDP optimizer has constant and cosine only")
    if cfg.optim.max_grad_norm is None:
        out.append("optim.max_grad_norm = None: verl always clips the gradient norm (actor.grad_clip)")
    if cfg.loss.dual_clip == 0:
        out.append("loss.dual_clip = 0: verl always applies the dual clip (actor.clip_ratio_c > 1)")
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
    """``(max_prompt_length, max_response_length)`` that fit every call of the episode: the
    longest call as the memory pre-flight bounds it (``train.memory_plan.call_tokens``: memory
    budget + the largest evidence block + slack for the template and wording; the longest
    completion). A call that still does not fit is refused and counted by the loop, never truncated."""
    from memsearch.train.memory_plan import call_tokens

    return call_tokens(cfg)


def training_gpus(cfg: GRPOConfig, gpus: int | None) -> int:
    """GPUs per node for verl: the config's ``[devices]`` training GPUs when it has them (another
    ``gpus`` is refused: two sources of truth), else ``gpus`` (default 8)."""
    layout = cfg.devices.train
    if not layout:
        return 8 if gpus is None else gpus
    if gpus is not None and gpus != len(layout):
        raise InputValueError(f"--gpus {gpus}: the config's devices.train {layout} names {len(layout)} training "
                              f"GPU(s); leave --gpus out (it defaults to {len(layout)}) or change the layout")
    return len(layout)


def launch_problems(gpus: int, nodes: int, tensor_parallel: int, loggers: list[str]) -> list[str]:
    """Why verl cannot launch this layout as asked, one line each (empty: it can).

    verl 0.9.1 makes ``n_gpus // (TP x DP x PP)`` rollout replicas, floored
    (``workers/rollout/llm_server.py``), and each takes ``TP`` consecutive ranks
    (``workers/rollout/replica.py``): with 7 GPUs and TP 2 the 7th rank belongs to no replica,
    and a replica may not straddle two nodes."""
    out = []
    total = gpus * nodes
    if gpus < 1 or nodes < 1 or tensor_parallel < 1:
        out.append(f"--gpus {gpus}, --nodes {nodes}, --rollout-tp {tensor_parallel}: expected positive numbers")
    elif not _tp_fits(gpus, nodes, tensor_parallel):
        left = total % tensor_parallel
        why = (f"verl makes {total // tensor_parallel} rollout replica(s) of {tensor_parallel} GPUs and leaves {left} "
               "rank(s) in none" if left else f"a replica of {tensor_parallel} GPUs would span two nodes")
        tps = [t for t in range(1, total + 1) if _tp_fits(gpus, nodes, t)]
        counts = [g for g in range(1, max(8, gpus, tensor_parallel) + 1) if _tp_fits(g, nodes, tensor_parallel)]
        out.append(
            f"--rollout-tp {tensor_parallel} with {gpus} GPU(s) per node x {nodes} node(s): {why}; expected GPUs per "
            f"node x nodes divisible by the rollout TP size, each replica within a node: with {gpus} GPU(s) per node "
            f"use --rollout-tp {', '.join(map(str, tps))}; with --rollout-tp {tensor_parallel} use "
            f"{', '.join(map(str, counts))} GPUs per node (a reader server goes on a GPU of its own in [devices])")
    unknown = [name for name in loggers if name not in VERL_LOGGERS]
    if unknown or not loggers:
        out.append(f"--logger {','.join(loggers)}: expected a comma list of {', '.join(VERL_LOGGERS)}")
    return out


def _tp_fits(gpus: int, nodes: int, tp: int) -> bool:
    # Every rank in a replica, and a replica within one node (or over whole nodes).
    return (gpus * nodes) % tp == 0 and (gpus % tp == 0 if tp <= gpus else tp % gpus == 0)


def rows_per_session(cfg: GRPOConfig, sample: int = ROWS_SAMPLE_TASKS) -> tuple[float, str]:
    """``(rows, where from)``: the expected rows (trained calls) of one session.

    memory / controller: one call per search, ``max_searches`` (state credit: times
    ``state_group_size``, a row per branch). memagent (MemAgent): one memory
    update per chunk read plus the answer; the chunks are counted as the engine cuts them
    (``engine.evidence.chunk_context``, the budget tokenizer, capped at ``max_chunks``) over the
    first ``sample`` tasks of the data folder: training contexts are far shorter than the
    ``max_chunks`` cap, which serves the longest evaluation sets."""
    b = cfg.episode.budgets
    if cfg.role != "memagent" and cfg.credit.mode == "state":
        k = cfg.credit.state_group_size
        return float(b.max_searches * k), (f"max_searches = {b.max_searches}, one memory call per search, "
                                           f"x state_group_size = {k} branches (a row each)")
    if cfg.role != "memagent":
        return float(b.max_searches), f"max_searches = {b.max_searches}, one {cfg.role} call per search"
    from memsearch.data.dataset import load_dataset
    from memsearch.engine.evidence import chunk_context
    from memsearch.tokenizer import load_tokenizer

    try:
        dataset = load_dataset(cfg.data)
        tokenizer = load_tokenizer(cfg.episode.tokenizer)
    except (InputError, FileNotFoundError, OSError) as exc:
        raise InputValueError(f"cannot count the chunks of a session ({exc}); give --rows-per-session N (MemAgent: "
                              "chunks read + 1) to size verl's mini-batch without reading the data") from None
    docs = dataset.documents_by_id()
    tasks = dataset.tasks[:sample]
    if not tasks:
        raise InputValueError(f"{cfg.data}: no tasks to count the chunks of a session in; expected a train folder")
    chunks = [len(chunk_context(t.doc_ids, docs, tokenizer, b.chunk_tokens, b.max_chunks)[1].chunks) for t in tasks]
    mean = sum(chunks) / len(chunks)
    return mean + 1, (f"{mean:.2f} chunks read (of at most {b.max_chunks}) on average over the first {len(tasks)} "
                      f"tasks of {cfg.data}, + 1 answer")


def mini_batch(cfg: GRPOConfig, rows: float, world: int) -> tuple[int, int]:
    """``(ppo_mini_batch_size, optimizer steps per training step)`` so one step makes about
    ``mini_batches_per_step`` optimizer steps per epoch, as memsearch's trainer does.

    verl 0.9.1's v1 trainer takes ``ppo_mini_batch_size x rollout.n`` *rows* per mini-batch
    (``trainer/ppo/v1/trainer_base.py``, ``_update_actor``), pads the step's rows to a multiple
    of it with no-op rows (``_get_required_batch_multiple``, ``ppo/padding_utils.py``), and needs
    it divisible by the data-parallel size (``workers/engine_workers.py``, ``train_mini_batch``).
    A session has one row per trained call, so the size counts tasks x rows per session."""
    n, wanted = cfg.rollout.group_size, cfg.update.mini_batches_per_step
    unit = world // math.gcd(world, n)  # the size x n rows must be a multiple of the DP size
    ideal = cfg.rollout.tasks_per_step * rows / wanted / unit

    def per_epoch(size: int) -> int:  # the step's rows over size x n rows a mini-batch, the last one padded
        return math.ceil(cfg.rollout.tasks_per_step * rows / size - 1e-9)

    # The two multiples of `unit` around the ideal size: the one nearer wanted steps, else the larger.
    size = min({max(1, math.floor(ideal)) * unit, max(1, math.ceil(ideal)) * unit},
               key=lambda s: (abs(per_epoch(s) - wanted), -s))
    return size, per_epoch(size) * cfg.update.epochs


def verl_overrides(
    cfg: GRPOConfig,
    agent_loops: str,
    train_files: str,
    val_files: str | None = None,
    gpus: int = 8,
    nodes: int = 1,
    rollout: str = "vllm",
    tensor_parallel: int = VERL_ROLLOUT_TP,
    loggers: tuple[str, ...] = ("console",),
    rows: float | None = None,
) -> tuple[list[str], list[str]]:
    """``(overrides, notes)`` for ``python -m verl.trainer.main_ppo``; raises ``VerlMappingError``
    (options verl cannot run) or ``InputValueError`` (``launch_problems``).

    ``agent_loops`` is the agent-loop YAML (``agent_loop_yaml``); ``rows`` the expected rows per
    session (default ``rows_per_session``); ``notes`` say how verl runs this config where it
    differs from the reference trainer, and the optimizer steps a training step makes.
    """
    from memsearch.integrations.verl.reward import reward_kwargs

    refused = refusals(cfg)
    if refused:
        raise VerlMappingError(refused)
    problems = launch_problems(gpus, nodes, tensor_parallel, list(loggers))
    if problems:
        raise InputValueError("\n".join(problems))
    rows_source = "--rows-per-session"
    if rows is None:
        rows, rows_source = rows_per_session(cfg)
    size, optimizer_steps = mini_batch(cfg, rows, gpus * nodes)
    prompt_len, response_len = budgets(cfg)
    actor = "actor_rollout_ref.actor"
    agg = {"token": "token-mean", "sequence": "seq-mean-token-mean"}[cfg.loss.aggregation]
    out = [
        "algorithm.adv_estimator=grpo",
        f"algorithm.norm_adv_by_std_in_grpo={cfg.credit.std_scale}",
        "trainer.use_v1=True",  # list outputs (one row per trained call) exist on the v1 trainer only
        f"data.train_files={train_files}",
        f"data.val_files={val_files or train_files}",
        f"data.train_batch_size={cfg.rollout.tasks_per_step}",
        f"data.seed={cfg.seed}",  # task order
        f"data.max_prompt_length={prompt_len}",
        f"data.max_response_length={response_len}",
        "data.filter_overlong_prompts=False",  # the parquet prompt is the question only; the loop checks lengths
        f"actor_rollout_ref.model.path={cfg.model}",
        f"actor_rollout_ref.model.lora_rank={cfg.lora.r}",
        f"actor_rollout_ref.model.lora_alpha={cfg.lora.alpha:g}",
        f"actor_rollout_ref.model.target_modules=[{','.join(cfg.lora.target_modules)}]",
        f"actor_rollout_ref.rollout.name={rollout}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={tensor_parallel}",
        f"actor_rollout_ref.rollout.n={cfg.rollout.group_size}",
        f"actor_rollout_ref.rollout.temperature={cfg.rollout.temperature}",
        f"actor_rollout_ref.rollout.top_p={cfg.rollout.top_p}",
        "actor_rollout_ref.rollout.calculate_log_probs=True",  # rows carry the rollout log-probs
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loops}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_NAME}",
        f"{actor}.ppo_mini_batch_size={size}",
        f"{actor}.ppo_epochs={cfg.update.epochs}",
        f"{actor}.clip_ratio_low={cfg.loss.clip_low}",
        f"{actor}.clip_ratio_high={cfg.loss.clip_high}",
        f"{actor}.clip_ratio_c={cfg.loss.dual_clip}",
        f"{actor}.loss_agg_mode={agg}",
        f"{actor}.use_kl_loss={cfg.loss.kl_coef > 0}",
        f"{actor}.kl_loss_coef={cfg.loss.kl_coef}",
        f"{actor}.kl_loss_type=low_var_kl",  # k3, memsearch's estimator
        f"{actor}.use_dynamic_bsz=True",
        f"{actor}.ppo_max_token_len_per_gpu={max(cfg.update.micro_batch_tokens, prompt_len + response_len)}",
        f"{actor}.grad_clip={cfg.optim.max_grad_norm}",
        f"{actor}.optim.lr={cfg.optim.lr}",
        f"{actor}.optim.weight_decay={cfg.optim.weight_decay}",
        f"{actor}.optim.betas=[{cfg.optim.betas[0]},{cfg.optim.betas[1]}]",
        f"{actor}.optim.lr_warmup_steps={cfg.optim.warmup_steps}",
        f"{actor}.optim.lr_scheduler_type={cfg.optim.schedule}",
        f"reward.custom_reward_function.path={REWARD_PATH}",
        "reward.custom_reward_function.name=compute_score",
        *(f"+reward.custom_reward_function.reward_kwargs.{key}={value}"
          for key, value in reward_kwargs(cfg.reward).items()),  # every RewardSettings term
        f"trainer.total_training_steps={cfg.steps}",
        f"trainer.save_freq={cfg.checkpoint_every}",
        f"trainer.max_actor_ckpt_to_keep={cfg.keep_checkpoints}",
        f"trainer.n_gpus_per_node={gpus}",
        f"trainer.nnodes={nodes}",
        f"trainer.logger=[{','.join(dict.fromkeys(loggers))}]",  # Hydra list syntax; verl's default adds wandb
        "trainer.resume_mode=auto",
    ]
    if cfg.credit.mode != "share":
        # memsearch's trainer (trainer.MemsearchTrainer), registered in every Ray process verl starts
        out += [f"trainer.v1.trainer_mode={TRAINER_NAME}",
                f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES={TRAINER_MODULE}"]
    if val_files is None:  # verl needs val_files; without real ones it must not validate on train
        out += ["trainer.val_before_train=False", "trainer.test_freq=-1"]
    notes = [
        "groups of one session (a failed sibling, or n = 1) get advantage = reward in verl, 0 in memsearch"
        if cfg.credit.mode == "share" else
        f"credit.mode = {cfg.credit.mode!r}: memsearch's trainer (MemsearchTrainer) registered with verl as "
        f"trainer_mode {TRAINER_NAME} ("
        f"its module {TRAINER_MODULE} imported into verl's processes by the Ray runtime environment; it replaces "
        "another VERL_USE_EXTERNAL_MODULES there); a failed trajectory returns no row",
        f"verl's PPO mini-batch counts rows: ppo_mini_batch_size = {size} (x n = {size * cfg.rollout.group_size} "
        f"rows) for about {rows:.2f} rows per session ({rows_source}) makes about {optimizer_steps} optimizer step(s) "
        f"per training step (memsearch's trainer: {cfg.update.mini_batches_per_step * cfg.update.epochs}); fewer rows "
        "pad the last mini-batch with no-op rows",
        "verl's v1 trainer collects sessions in completion order: runs are not bit-reproducible; memsearch's "
        "trainer is the reproducible reference",
        "memsearch's per-call sampling seeds are not sent to the rollout servers",
    ]
    if cfg.credit.mode == "state":
        notes.append(f"state credit: every memory call samples {cfg.credit.state_group_size} branches on verl's "
                     "servers (a row each); the agent loop scores them with the training folder's supporting facts "
                     "(validation rows are not branched)")
    if cfg.eval.data:
        notes.append(
            f"periodic evaluation on {cfg.eval.data}: run `memsearch eval` on merged checkpoints "
            "(docs/verl.md); verl's validation scores the same reward only as a training signal"
        )
    if "wandb" in loggers:
        notes.append("trainer.logger has wandb: the run stops at start-up without WANDB_API_KEY (or `wandb login`)")
    if cfg.devices.train:
        notes.append(f"devices.train: start verl with CUDA_VISIBLE_DEVICES={cfg.devices.visible('train')} "
                     "(memsearch devices --config CONFIG --for train)")
    if cfg.loss.kl_coef > 0:
        notes.append("KL reference: the base with the LoRA adapter off (verl's ref_in_actor), as "
                     "loss.kl_reference = 'base'")
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

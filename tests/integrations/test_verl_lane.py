"""The verl lane: ``MemsearchAgentLoop`` run exactly as verl 0.9.1's CPU tests run agent loops.

Needs the verl environment (``UV_PROJECT_ENVIRONMENT=.venv-verl uv sync --frozen --extra verl
--no-dev``, then ``.venv-verl/bin/pytest -o addopts= -m verl``: no xdist there; ``.ci/run`` does
both); skipped only where verl cannot be imported. The loop is built from the YAML ``memsearch verl config`` writes,
through ``hydra.utils.instantiate`` as verl's ``AgentLoopWorker`` does, with verl's config
wrappers; the LLM server is a scripted fake answering through the embedded model's real
tokenizer (verl's own tests fake it the same way). Reward through verl's naive reward manager
with ``compute_score`` loaded the way verl loads it; advantages through verl's
``compute_advantage_for_multi_trajectories``, compared with memsearch's ``build_batch``.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("verl.experimental.agent_loop.agent_loop", reason="verl is not installed (the verl lane)")

import torch  # noqa: E402
import yaml  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker, DictConfigWrap  # noqa: E402
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.reward import get_custom_reward_fn  # noqa: E402
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from memsearch.data.dataset import load_dataset  # noqa: E402
from memsearch.integrations.verl.config import agent_loop_yaml, load_grpo_config  # noqa: E402
from memsearch.integrations.verl.data import parquet_rows  # noqa: E402
from memsearch.testing.scripted_server import ScriptedServer  # noqa: E402
from memsearch.train.grpo.batch import build_batch  # noqa: E402
from memsearch.train.sft.trainer import chat_prompt_ids  # noqa: E402

pytestmark = [pytest.mark.verl, pytest.mark.slow]

PROMPT_LENGTH = 1024
RESPONSE_LENGTH = 64


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from memsearch.assets.embedded import tokenizer_dir

    return AutoTokenizer.from_pretrained(str(tokenizer_dir()))


def _verl_config(reward_kwargs: dict):
    # The keys verl's own CPU agent-loop tests set, plus the reward function the way
    # `memsearch verl config` names it.
    return OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": PROMPT_LENGTH, "response_length": RESPONSE_LENGTH,
                                          "multi_turn": {"tool_config_path": None}},
                              "model": {"path": "dummy-model", "tokenizer_path": "dummy-model"}},
        "data": {"tool_config_path": None, "apply_chat_template_kwargs": {}},
        "reward": {"custom_reward_function": {"path": "pkg://memsearch.integrations.verl.reward",
                                              "name": "compute_score", "reward_kwargs": reward_kwargs}},
    })


def _loop(config_path, tokenizer, server, verl_cfg):
    # `overrides` reaches the loop as an OmegaConf list, as from verl's YAML
    (entry,) = yaml.safe_load(agent_loop_yaml(str(config_path), None, ["steps=3"]))
    return instantiate(entry, trainer_config=DictConfigWrap(verl_cfg), server_manager=server, tokenizer=tokenizer,
                       processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(verl_cfg.data))


def _rollout(config_path, tokenizer, row, verl_cfg, reader=None):
    """One session and its reward, inside one event loop (verl builds loops and managers in its running loop)."""

    async def session():
        server = ScriptedServer(tokenizer, reader=reader, output_cls=TokenOutput)
        loop = _loop(config_path, tokenizer, server, verl_cfg)
        kwargs = {**row, "raw_prompt": row["prompt"], "index": row["extra_info"]["index"]}
        outputs = await loop.run(sampling_params={"temperature": 1.0, "top_p": 1.0, "logprobs": True}, **kwargs)
        for o in outputs:  # copies: postprocessing adds fields to extra_fields
            await _check_padded(o.model_copy(deep=True), tokenizer, row["prompt"])
        return loop, server, outputs, await _score(outputs, row, tokenizer, verl_cfg)

    return asyncio.run(session())


async def _score(outputs, row, tokenizer, verl_cfg) -> dict:
    # The DataProto verl's AgentLoopWorker._compute_score hands the reward worker for one session.
    n = len(outputs)
    pad = torch.nn.utils.rnn.pad_sequence
    responses = [torch.tensor(o.response_ids) for o in outputs]
    data = DataProto.from_dict(
        tensors={"prompts": pad([torch.tensor(o.prompt_ids) for o in outputs], batch_first=True),
                 "responses": pad(responses, batch_first=True),
                 "attention_mask": pad([torch.ones(len(o.prompt_ids) + len(o.response_ids), dtype=torch.long)
                                        for o in outputs], batch_first=True)},
        non_tensors={**{k: np.array([row[k]] * n, dtype=object) for k in ("data_source", "reward_model")},
                     "extra_info": np.array([dict(row["extra_info"]) for _ in range(n)], dtype=object),
                     "tool_extra_fields": np.array([o.extra_fields for o in outputs], dtype=object),
                     "__num_turns__": np.array([o.num_turns for o in outputs])})
    manager = NaiveRewardManager(verl_cfg, tokenizer, get_custom_reward_fn(verl_cfg))
    return await manager.run_single(data)


class _PostprocessWorker:
    # The parts of AgentLoopWorker its _agent_loop_postprocess uses, as verl's own CPU test
    # builds them (no reward workers, no distillation).
    _compute_multi_modal_inputs = AgentLoopWorker._compute_multi_modal_inputs
    _compute_position_ids = AgentLoopWorker._compute_position_ids
    _get_mm_processor_kwargs = AgentLoopWorker._get_mm_processor_kwargs
    _compute_score = AgentLoopWorker._compute_score
    _compute_teacher_logprobs = AgentLoopWorker._compute_teacher_logprobs
    _pad_token_ids = AgentLoopWorker._pad_token_ids
    distillation_enabled = False

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.rollout_config = OmegaConf.create({"prompt_length": PROMPT_LENGTH, "response_length": RESPONSE_LENGTH})
        self.processor = None
        self.mm_processor_kwargs = {}
        self.reward_loop_worker_handles = None


async def _check_padded(output, tokenizer, raw_prompt):
    # verl pads every row to (prompt_length, response_length) before batching: a longer prompt
    # would give a wider tensor and break the batch; a row fits exactly, its mask and log-probs aligned.
    n_prompt, n_resp = len(output.prompt_ids), len(output.response_ids)
    internal = await AgentLoopWorker._agent_loop_postprocess(_PostprocessWorker(tokenizer), output, validate=False,
                                                             raw_prompt=raw_prompt)
    assert internal.prompt_ids.shape == (1, PROMPT_LENGTH) and internal.response_ids.shape == (1, RESPONSE_LENGTH)
    assert internal.input_ids.shape == (1, PROMPT_LENGTH + RESPONSE_LENGTH)
    assert int(internal.attention_mask.sum()) == n_prompt + n_resp
    assert internal.response_mask[0].tolist() == [1] * n_resp + [0] * (RESPONSE_LENGTH - n_resp)
    assert internal.response_logprobs.shape == (1, RESPONSE_LENGTH)
    assert internal.response_logprobs[0, :n_resp].tolist() == pytest.approx(output.response_logprobs)
    assert internal.prompt_ids[0, PROMPT_LENGTH - n_prompt:].tolist() == output.prompt_ids  # left-padded, whole


def _check_rows(outputs, server, tokenizer):
    assert all(isinstance(o, AgentLoopOutput) for o in outputs)
    assert len(outputs) == len(server.calls)
    for o, (prompt, params, ids) in zip(outputs, server.calls, strict=True):
        assert o.prompt_ids == prompt and len(o.prompt_ids) <= PROMPT_LENGTH
        assert o.response_ids == ids and len(ids) <= min(params["max_tokens"], RESPONSE_LENGTH)
        assert o.response_mask == [1] * len(ids) and len(o.response_logprobs) == len(ids)
    assert sum(outputs[-1].response_mask) >= 1  # verl reads the session's advantage there


def test_memagent_two_chunks_on_verl(verl_case, hotpot_dev_dir, tokenizer):
    path = verl_case("memagent")
    rows = parquet_rows(hotpot_dev_dir)
    labels = load_dataset(hotpot_dev_dir).labels_by_id()
    row = rows[0]
    gold = labels[row["extra_info"]["task_id"]].answers[0]
    verl_cfg = _verl_config({"metric": "boxed_em", "invalid_penalty": 0.0, "citation_penalty": 0.0})
    sessions = []
    for reader in (f"\\boxed{{{gold}}}", "\\boxed{no idea}"):  # one right, one wrong: a group with variance
        loop, server, outputs, scored = _rollout(path, tokenizer, row, verl_cfg, reader)
        # 2 chunks: two memory updates then the boxed answer, the answer last
        roles = [c.role for c in loop.trajectory.policy_calls()]
        assert roles == ["memory", "memory", "reader"]
        assert len(outputs) == 3
        _check_rows(outputs, server, tokenizer)
        assert tokenizer.decode(outputs[-1].response_ids, skip_special_tokens=True) == reader
        # verl's continuous-token builder gives the prompt ids memsearch's trainer builds
        for o, c in zip(outputs, loop.trajectory.policy_calls(), strict=True):
            assert o.prompt_ids == chat_prompt_ids(tokenizer, [dict(m) for m in c.messages])
        assert outputs[-1].extra_fields["memsearch_counts"] == {
            "rows": 3,
            "prompt_overflows": 0,
            "request_errors": 0,
            "invalid_actions": 0,
        }
        sessions.append((loop.trajectory, outputs, scored))
    assert loop.setup.cfg.steps == 3  # the YAML's overrides were applied
    assert [s[2]["reward_score"] for s in sessions] == [1.0, 0.0]
    assert sessions[0][2]["reward_extra_info"] == {"score": 1.0, "metric": 1.0, "answered": 1}
    _check_advantages(sessions, "memagent")


def test_group_b_memory_task_on_verl(verl_case, hotpot_dev_dir, tokenizer):
    path = verl_case("group_b")
    rows = parquet_rows(hotpot_dev_dir)
    verl_cfg = _verl_config({"metric": "f1", "invalid_penalty": 0.5, "citation_penalty": 0.5})
    sessions = []
    for row in rows[1:3]:  # two tasks stand in for two sessions of one group (different rewards)
        loop, server, outputs, scored = _rollout(path, tokenizer, row, verl_cfg)
        assert loop.trajectory.counts.searches == 2 and len(outputs) == 2  # one memory row per search
        _check_rows(outputs, server, tokenizer)
        label = load_dataset(hotpot_dev_dir).labels_by_id()[row["extra_info"]["task_id"]]
        from memsearch.train.grpo.reward import trajectory_reward

        # verl's reward manager gives memsearch's reward of the whole trajectory
        assert scored["reward_score"] == pytest.approx(
            trajectory_reward(loop.trajectory, label, loop.setup.cfg.reward, "memory")
        )
        sessions.append((loop.trajectory, outputs, scored))
    _check_advantages(sessions, "memory")


def _check_advantages(sessions, role):
    # verl's advantages over the sessions' rows (keys {uid}_{session}_{index}, one uid) equal
    # memsearch's build_batch(credit="share") over the same trajectories, std on and off.
    keys, masks, rewards, responses = [], [], [], []
    width = max(len(o.response_ids) for _, outs, _ in sessions for o in outs)
    for s, (_, outs, scored) in enumerate(sessions):
        for i, o in enumerate(outs):
            keys.append(f"g_{s}_{i}")
            responses.append(list(o.response_ids))
            n = len(o.response_ids)
            masks.append([1] * n + [0] * (width - n))
            row_reward = [0.0] * width
            if i == len(outs) - 1:
                row_reward[n - 1] = scored["reward_score"]
            rewards.append(row_reward)
    for std in (True, False):
        data = DataProto.from_dict(
            tensors={
                "response_mask": torch.tensor(masks, dtype=torch.float32),
                "token_level_rewards": torch.tensor(rewards),
            },
            non_tensors={"uid": np.array(["g"] * len(keys), dtype=object)},
        )
        adv = compute_advantage_for_multi_trajectories(
            data, keys, core_algos.AdvantageEstimator.GRPO, norm_adv_by_std_in_grpo=std
        ).batch["advantages"]
        batch = build_batch(
            [[t for t, _, _ in sessions]],
            [[s[2]["reward_score"] for s in sessions]],
            role,
            "share",
            std,
            generated=len(keys),
        )
        assert len(batch.rows) == len(keys)  # one memsearch row per verl output
        for k, row in enumerate(batch.rows):
            assert row.completion_ids == responses[k]  # the same tokens in the same row
            n = sum(masks[k])
            assert adv[k, :n].tolist() == pytest.approx([row.advantage] * n, abs=1e-5)
            assert not adv[k, n:].any()


def _printed_overrides(args) -> list[str]:
    # The overrides exactly as `memsearch verl config` prints them (stdout, one per line).
    from typer.testing import CliRunner

    from memsearch.cli.app import app

    result = CliRunner().invoke(app, ["verl", "config", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def _compose(overrides):
    from pathlib import Path

    import verl
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def _validate(composed):
    # verl's own check, as main_ppo runs it before training. Its vLLM LoRA-rank check imports
    # verl's vLLM rollout package, which cannot import without vLLM (a GPU package, not in this
    # lane): where vLLM is absent the name is sglang, which skips that one check only.
    import importlib.util

    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    if importlib.util.find_spec("vllm") is None:
        composed = composed.copy()
        composed.actor_rollout_ref.rollout.name = "sglang"
    validate_config(composed, use_reference_policy=need_reference_policy(composed), use_critic=need_critic(composed))


def test_shipped_recipes_compose_with_verls_trainer_config_and_pass_its_validate_config(hotpot_dev_dir, tmp_path):
    # Every override `memsearch verl config` prints for the two shipped recipes, given as the
    # scripts give them (scripts/verl/*.sh), names a key of verl's real ppo_trainer config
    # (Hydra's struct mode refuses unknown ones), parses to the intended value, and passes verl's
    # validate_config; trainer.logger holds no wandb.
    from pathlib import Path

    from verl.utils.tracking import Tracking

    from memsearch.assets.embedded import tokenizer_dir
    from memsearch.integrations.verl.config import VERL_LOGGERS, VERL_ROLLOUT_TP, launch_problems

    repo = Path(__file__).resolve().parents[2]
    files = ["--data", hotpot_dev_dir, "--train-files", tmp_path / "train.parquet", "--val-files",
             tmp_path / "dev.parquet", "--agent-loops", tmp_path / "loops.yaml"]
    model = tokenizer_dir()  # a real Hugging Face tokenizer folder: MemAgent counts its chunks with it
    memory = ["--set", f"model={model}", "--set", f"episode.tokenizer={model}", "--set", "loss.aggregation=token"]
    recipes = [  # (config, its --set, the launch options), each as its script gives them
        ("configs/train/grpo_gpu.toml", memory, ["--rollout-tp", 1]),  # its layout: one training GPU
        ("configs/train/grpo_gpu.toml", [*memory, "--set", "devices.train=[0,1,2,3,4,5]", "--set",
                                         "devices.services.reader=[7]"], []),  # an 8-GPU node, verl's TP 2
        ("configs/memagent.toml", ["--set", f"model={model}"], []),  # its split credit: memsearch's trainer
    ]
    default = _compose([])
    # why the logger is written: verl's default adds wandb; the TP written is verl's default
    assert "wandb" in default.trainer.logger
    assert default.actor_rollout_ref.rollout.tensor_model_parallel_size == VERL_ROLLOUT_TP
    assert set(VERL_LOGGERS) == set(Tracking.supported_backend)
    for path, sets, launch in recipes:
        overrides = _printed_overrides(["--config", repo / path, *files, *sets, *launch])
        cfg = load_grpo_config(repo / path, sets[1::2], str(hotpot_dev_dir))
        composed = _compose(overrides)
        assert list(composed.trainer.logger) == ["console"]
        assert composed.algorithm.norm_adv_by_std_in_grpo is cfg.credit.std_scale and composed.trainer.use_v1 is True
        assert composed.trainer.v1.trainer_mode == ("memsearch" if cfg.credit.mode != "share" else "sync")
        rollout, actor = composed.actor_rollout_ref.rollout, composed.actor_rollout_ref.actor
        assert rollout.n == cfg.rollout.group_size
        assert rollout.tensor_model_parallel_size == (launch[1] if launch else VERL_ROLLOUT_TP)
        world = composed.trainer.n_gpus_per_node * composed.trainer.nnodes
        assert composed.trainer.n_gpus_per_node == (len(cfg.devices.train) or 8)
        assert world % rollout.tensor_model_parallel_size == 0
        # verl's engine worker asserts a mini-batch's rows divide among the data-parallel ranks
        assert actor.ppo_mini_batch_size * rollout.n % world == 0
        assert list(composed.actor_rollout_ref.model.target_modules) == cfg.lora.target_modules
        assert actor.use_kl_loss is (cfg.loss.kl_coef > 0)
        # the reward function's keyword for the invalid-call penalty kept its earlier name (reward.compute_score)
        kwargs = {("invalid_call_penalty" if k == "invalid_penalty" else k): v
                  for k, v in composed.reward.custom_reward_function.reward_kwargs.items()}
        assert kwargs == cfg.reward.model_dump()
        assert rollout.prompt_length == composed.data.max_prompt_length
        _validate(composed)
    # verl's validate_config passes 7 GPUs with TP 2 (3 replicas, one rank in none): memsearch refuses it
    seven = composed.copy()
    seven.trainer.n_gpus_per_node = 7
    assert seven.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
    _validate(seven)
    assert launch_problems(7, 1, 2, ["console"])


# ---- split and state credit: memsearch's trainer registered with verl (credit.py, trainer.py) ----


def test_the_module_the_overrides_name_registers_memsearchs_trainer_in_a_fresh_verl_process(credit_case, tmp_path):
    # As verl's task runner finds it: a new process whose environment has the overrides' runtime
    # environment variable imports the module when it imports verl, then get_trainer_cls(name).
    import os
    import subprocess
    import sys

    overrides = _printed_overrides(["--config", credit_case("state", state_group_size=3), "--set",
                                    "model=/models/m", "--train-files", tmp_path / "t.parquet", "--agent-loops",
                                    tmp_path / "loops.yaml"])
    values = dict(o.split("=", 1) for o in overrides)
    name = values["trainer.v1.trainer_mode"]
    module = values["+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES"]
    code = ("import verl\nfrom verl.trainer.ppo.v1 import PPOTrainerSync, get_trainer_cls\n"
            f"cls = get_trainer_cls({name!r})\n"
            "print(cls.__module__, cls.__qualname__, issubclass(cls, PPOTrainerSync))")
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": module}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["memsearch.integrations.verl.trainer", "MemsearchTrainer", "True"]
    # without the module, verl knows no such trainer
    env.pop("VERL_USE_EXTERNAL_MODULES")
    plain = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert plain.returncode != 0 and "Unknown trainer 'memsearch'" in plain.stderr


@pytest.fixture(scope="module")
def transfer_queue():
    """verl's TransferQueue on a local Ray (about 30 s on 2 cores): a controller and two storage
    units, each a Ray actor asking for a CPU, hence the logical CPU count."""
    import ray
    import transfer_queue as tq

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    tq.init()
    yield tq
    tq.close()
    ray.shutdown()


def _tq_worker(tokenizer):
    # The parts of verl's AgentLoopWorkerTQ its _agent_loop_postprocess uses (as _PostprocessWorker).
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    worker = _PostprocessWorker(tokenizer)
    worker.postprocess = AgentLoopWorkerTQ.__ray_metadata__.modified_class._agent_loop_postprocess
    return worker


@pytest.mark.parametrize("mode", ["share", "split", "state"])
def test_registered_trainer_advantages_through_verls_transfer_queue_equal_memsearchs(
        mode, verl_case, credit_case, hotpot_dev_dir, tokenizer, transfer_queue, tmp_path):
    """Two tasks x two sessions of the engine through MemsearchAgentLoop, scored by verl's reward
    manager, put into the TransferQueue by verl's AgentLoopWorkerTQ postprocessing, padded by
    verl's upsample_batch_to_divisible_size, then MemsearchTrainer._compute_advantage (verl's own
    step first) on the config `memsearch verl config` composes: every row's advantage equals
    memsearch's trainer's (build_batch / build_state_batch) to 1e-6; padding rows 0."""
    from tensordict import TensorDict
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from memsearch.integrations.verl.trainer import MemsearchTrainer
    from memsearch.train.grpo.state_credit import build_state_batch

    tq = transfer_queue
    extra = {"state_group_size": 3, "global_weight": 0.5, "std_scale": True} if mode == "state" else {}
    path = credit_case(mode, **extra) if mode != "share" else verl_case("group_b")
    overrides = _printed_overrides(["--config", path, "--set", "model=/models/m", "--train-files",
                                    tmp_path / "t.parquet", "--agent-loops", tmp_path / "loops.yaml", "--rollout-tp", 1,
                                    "--gpus", 1])
    composed = _compose(overrides)
    _validate(composed)
    verl_cfg = _verl_config({"metric": "f1", "invalid_penalty": 0.5, "citation_penalty": 0.5})
    dev = parquet_rows(hotpot_dev_dir)
    rows = [dev[1], dev[5] if mode == "state" else dev[2]]  # task 5's sessions answer differently under state
    worker = _tq_worker(tokenizer)
    partition = "train"  # where verl's postprocessing puts a training session; the uids name the mode
    trajectories, rewards, keys = [], [], []
    for t, row in enumerate(rows):
        group_t, group_r = [], []
        for s in range(2):
            uid = f"{mode}{t}"
            loop, outputs, scored = _session_on_verl(path, tokenizer, row, verl_cfg, uid, s)
            outputs[-1].reward_score = scored["reward_score"]
            outputs[-1].extra_fields["reward_extra_info"] = scored["reward_extra_info"]

            kwargs = {**row, "raw_prompt": row["prompt"], "uid": uid, "session_id": s, "global_steps": 1}
            asyncio.run(worker.postprocess(worker, outputs, False, **kwargs))
            keys += [f"{uid}_{s}_{i}" for i in range(len(outputs))]
            group_t.append(loop.trajectory)
            group_r.append(scored["reward_score"])
        trajectories.append(group_t)
        rewards.append(group_r)
    # a group with variance (state: which scripted variant a branch gets follows the order verl's
    # threads encode the prompts in, so the continued one, and the reward, may change; parity holds)
    assert mode == "state" or any(len(set(r)) > 1 for r in rewards)
    listed = tq.kv_list(partition_id=partition)[partition]
    assert set(keys) <= set(listed)  # every output is a row of verl's store
    batch = upsample_batch_to_divisible_size(KVBatchMeta(keys=keys, tags=[listed[k] for k in keys],
                                                         partition_id=partition), len(keys) + 3,
                                             tokenizer.eos_token_id)
    assert len(batch) == len(keys) + 3 and all(tag.get("is_padding") for tag in batch.tags[len(keys):])

    # the step before the advantage (_compute_old_log_prob): the actor's log-probs of the rows, here
    # the rollout's own (what the actor recomputes when rollout and training weights agree)
    rollout_lp = tq.kv_batch_get(keys=batch.keys, partition_id=partition, select_fields=["rollout_log_probs"])
    tq.kv_batch_put(keys=batch.keys, partition_id=partition,
                    fields=TensorDict({"old_log_probs": rollout_lp["rollout_log_probs"]}, batch_size=len(batch)))
    trainer = MemsearchTrainer(config=composed)  # verl's own constructor: replay buffer, modes
    assert type(trainer.replay_buffer) is ReplayBuffer and trainer.trainer_mode == "sync"
    metrics: dict = {}
    trainer._compute_advantage(batch, metrics)
    got = tq.kv_batch_get(keys=batch.keys, partition_id=partition, select_fields=["advantages", "response_mask"])
    advantages = [a.tolist() for a in got["advantages"].unbind()]
    masks = [m.tolist() for m in got["response_mask"].unbind()]
    tq.kv_clear(batch.keys, partition)

    std = composed.algorithm.norm_adv_by_std_in_grpo
    if mode == "state":
        cfg = load_grpo_config(path, ["model=/models/m"])
        labels = load_dataset(hotpot_dev_dir).labels_by_id()
        reference = build_state_batch(trajectories, rewards, labels, cfg.credit.state_reward, std_scale=std,
                                      global_weight=0.5, generated=len(keys))
        assert metrics["memsearch/state_groups"] == reference.groups == 8
        assert metrics["memsearch/state_groups"] > metrics["memsearch/zero_variance_state_groups"]
    else:
        reference = build_batch(trajectories, rewards, "memory", mode, std, generated=len(keys))
    assert len(reference.rows) == len(keys) == (24 if mode == "state" else 8)
    for k, row in enumerate(reference.rows):
        n = len(row.completion_ids)
        assert masks[k][:n] == [1] * n
        assert advantages[k][:n] == pytest.approx([row.advantage] * n, abs=1e-6), keys[k]
    assert all(not any(a) for a in advantages[len(keys):])  # padding rows
    # not verl's share: split divides each session's advantage by its rows; state varies within a session
    if mode == "split":
        share = build_batch(trajectories, rewards, "memory", "share", std, generated=len(keys)).rows
        assert [row.advantage for row in reference.rows] == pytest.approx([r.advantage / 2 for r in share])
        assert any(abs(r.advantage) > 1e-3 for r in share)
    if mode == "state":
        assert any(advantages[k][0] != pytest.approx(advantages[k + 1][0]) for k in range(len(keys) - 1)
                   if keys[k].rsplit("_", 1)[0] == keys[k + 1].rsplit("_", 1)[0])


def _session_on_verl(config_path, tokenizer, row, verl_cfg, uid, session_id):
    """One session through MemsearchAgentLoop.run as verl's worker calls it (uid and session id in
    its keyword arguments), the memory branches answered by scripted variants; and its score."""

    async def session():
        server = ScriptedServer(tokenizer, output_cls=TokenOutput, memory_variants=3)
        server.memory_requests = session_id  # the sessions of a task reach different memories
        loop = _loop(config_path, tokenizer, server, verl_cfg)
        kwargs = {**row, "raw_prompt": row["prompt"], "index": row["extra_info"]["index"], "uid": uid,
                  "session_id": session_id}
        outputs = await loop.run(sampling_params={"temperature": 1.0, "top_p": 1.0, "logprobs": True}, **kwargs)
        return loop, outputs, await _score(outputs, row, tokenizer, verl_cfg)

    return asyncio.run(session())

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
from memsearch.integrations.verl.config import agent_loop_yaml  # noqa: E402
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
    from memsearch.integrations.verl.config import VERL_LOGGERS, VERL_ROLLOUT_TP, launch_problems, load_grpo_config

    repo = Path(__file__).resolve().parents[2]
    files = ["--data", hotpot_dev_dir, "--train-files", tmp_path / "train.parquet", "--val-files",
             tmp_path / "dev.parquet", "--agent-loops", tmp_path / "loops.yaml"]
    model = tokenizer_dir()  # a real Hugging Face tokenizer folder: MemAgent counts its chunks with it
    memory = ["--set", f"model={model}", "--set", f"episode.tokenizer={model}", "--set", "loss.aggregation=token"]
    recipes = [  # (config, its --set, the launch options), each as its script gives them
        ("configs/train/grpo_gpu.toml", memory, ["--rollout-tp", 1]),  # its layout: one training GPU
        ("configs/train/grpo_gpu.toml", [*memory, "--set", "devices.train=[0,1,2,3,4,5]", "--set",
                                         "devices.services.reader=[7]"], []),  # an 8-GPU node, verl's TP 2
        ("configs/memagent.toml", ["--set", f"model={model}", "--set", "grpo.credit.mode=share"], []),
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

"""The verl integration without verl (main environment): real episodes through ``run_episode``
with the trained role on ``VerlPolicyBackend`` over a scripted server (real tokenizer ids),
outputs, reward, parquet, config mapping and refusals."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from memsearch.integrations.verl.backend import VerlPolicyBackend
from memsearch.integrations.verl.config import (
    VerlMappingError,
    agent_loop_yaml,
    budgets,
    load_grpo_config,
    refusals,
    verl_overrides,
)
from memsearch.integrations.verl.outputs import session_outputs
from memsearch.integrations.verl.reward import compute_score
from memsearch.integrations.verl.session import run_session, worker_setup
from memsearch.records.trajectory import Trajectory
from memsearch.testing.scripted_server import ScriptedServer
from memsearch.train.config import RewardSettings
from memsearch.train.grpo.reward import trajectory_reward
from memsearch.train.sft.trainer import chat_prompt_ids

REPO = Path(__file__).resolve().parents[2]
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    from memsearch.assets.embedded import tokenizer_dir

    return AutoTokenizer.from_pretrained(str(tokenizer_dir()))


def _session(setup, task_id, tokenizer, reader=None, prompt_length=4096, response_length=512, **run):
    server = ScriptedServer(tokenizer, reader=reader)

    async def encode(messages):
        return chat_prompt_ids(tokenizer, messages)  # the reference trainer's prompt ids

    policy = VerlPolicyBackend(server, encode, lambda ids: tokenizer.decode(ids, skip_special_tokens=True), SAMPLING,
                               prompt_length=prompt_length, response_length=response_length)
    rollout = asyncio.run(run_session(setup, task_id, policy, **run))
    return server, policy, rollout.trajectory, rollout.outputs, rollout.summary


def _check_aligned(outputs, server_calls):
    # Every output is exactly one server call: the prompt it saw, the ids it returned, one mask
    # bit and one log-prob per id.
    assert len(outputs) == len(server_calls)
    for out, (prompt, _params, ids) in zip(outputs, server_calls, strict=True):
        assert out["prompt_ids"] == prompt
        assert out["response_ids"] == ids
        assert out["response_mask"] == [1] * len(ids)
        assert out["response_logprobs"] == pytest.approx([-0.01 * (k + 1) for k in range(len(ids))])


def test_memagent_session_outputs_answer_last_and_reward(verl_case, hf_tokenizer, hotpot_dev_dir):
    from memsearch.data.dataset import load_dataset

    setup = worker_setup(str(verl_case("memagent")))
    task = load_dataset(hotpot_dev_dir).tasks[0]
    gold = load_dataset(hotpot_dev_dir).labels_by_id()[task.id].answers[0]
    server, policy, traj, outputs, summary = _session(setup, task.id, hf_tokenizer, reader=f"So \\boxed{{{gold}}}")
    # 2 chunks -> 2 memory updates, then the reader: 3 outputs, the answer last.
    assert traj.counts.chunks == 2
    assert [c.role for c in traj.policy_calls()] == ["memory", "memory", "reader"]
    assert len(outputs) == 3
    _check_aligned(outputs, server.calls)
    assert hf_tokenizer.decode(outputs[-1]["response_ids"], skip_special_tokens=True) == f"So \\boxed{{{gold}}}"
    assert outputs[-1]["response_ids"][-1] == hf_tokenizer.eos_token_id
    # The engine's caps reach the server: policy budget for updates, answer budget for the reader.
    assert [c[1]["max_tokens"] for c in server.calls] == [48, 48, 24]
    assert policy.completed == {"memory": 2, "reader": 1} and policy.overflows == 0
    # The reward through compute_score equals the reference trainer's reward of the trajectory.
    settings = setup.cfg.reward
    got = compute_score("memsearch/hotpotqa", "ignored", [gold], {"memsearch": summary}, **settings.model_dump())
    assert got == {"score": 1.0, "metric": 1.0, "answered": 1}
    assert got["score"] == trajectory_reward(traj, load_dataset(hotpot_dev_dir).labels_by_id()[task.id], settings,
                                             "memagent")
    # The memory-recall term needs supporting facts, which verl rows do not carry: refused, not dropped.
    recall = settings.model_copy(update={"memory_recall": 0.5})
    with pytest.raises(ValueError, match="memory_recall > 0: verl rows carry the gold answers only"):
        compute_score("memsearch/hotpotqa", "ignored", [gold], {"memsearch": summary}, **recall.model_dump())
    # The summary travels in every row: no documents, no memory text (only the evidence ids it cites), no label.
    assert set(summary) == {"task_id", "role", "prediction", "reader_text", "answer_format", "citations",
                            "invalid_citations", "memory_sources", "counts", "events", "status"}
    assert len(json.dumps(summary)) < 2000


def test_group_b_memory_session_untrained_reader_keeps_its_backend(verl_case, hf_tokenizer, hotpot_dev_dir):
    from memsearch.data.dataset import load_dataset

    setup = worker_setup(str(verl_case("group_b")))
    assert setup.backends["reader"].name == "rules" and "memory" not in setup.backends
    dataset = load_dataset(hotpot_dev_dir)
    task = dataset.tasks[1]
    server, policy, traj, outputs, summary = _session(setup, task.id, hf_tokenizer)
    # Two searches, one memory decision each; the reader (rules) is not a row: 2 outputs.
    assert traj.counts.searches == 2
    assert len(outputs) == 2 and policy.completed == {"memory": 2}
    _check_aligned(outputs, server.calls)
    assert all(json.loads(hf_tokenizer.decode(o["response_ids"], skip_special_tokens=True))["ops"] for o in outputs)
    label = dataset.labels_by_id()[task.id]
    got = compute_score(
        "memsearch/hotpotqa", "", label.answers, {"memsearch": summary}, **setup.cfg.reward.model_dump()
    )
    assert got["score"] == pytest.approx(trajectory_reward(traj, label, setup.cfg.reward, "memory"))
    assert got["answered"] == int(traj.prediction is not None)


def test_group_b_session_in_the_extractive_format(verl_case, hf_tokenizer, hotpot_dev_dir):
    """The extractive format (``agent.memory_format``) through verl's loop: the ops name evidence
    ids, the memory writes the items, and the outputs and reward are those of any session."""
    from memsearch.data.dataset import load_dataset

    path = verl_case("group_b")
    extractive = path.with_name("group_b_extractive.toml")
    extractive.write_text(path.read_text() + '[episode.agent]\nmemory_format = "extractive"\n', encoding="utf-8")
    setup = worker_setup(str(extractive))
    assert setup.cfg.episode.agent.memory_format == "extractive"
    dataset = load_dataset(hotpot_dev_dir)
    task = dataset.tasks[1]
    server, policy, traj, outputs, summary = _session(setup, task.id, hf_tokenizer)
    _check_aligned(outputs, server.calls)
    texts = [hf_tokenizer.decode(o["response_ids"], skip_special_tokens=True) for o in outputs]
    assert len(outputs) == 2 and all('"text"' not in t for t in texts)
    calls = traj.policy_calls(["memory"])
    assert all(c.valid for c in calls) and traj.memory_cited
    label = dataset.labels_by_id()[task.id]
    reward = setup.cfg.reward
    got = compute_score("memsearch/hotpotqa", "", label.answers, {"memsearch": summary}, **reward.model_dump())
    assert got["score"] == pytest.approx(trajectory_reward(traj, label, reward, "memory"))


def test_overlong_prompt_is_refused_and_counted_not_truncated(verl_case, hf_tokenizer, hotpot_dev_dir):
    from memsearch.data.dataset import load_dataset

    setup = worker_setup(str(verl_case("memagent")))
    task = load_dataset(hotpot_dev_dir).tasks[0]
    # 200 tokens cannot hold a 256-token chunk plus the prompt: both updates are refused before
    # the server (verl would have cut the question off); the reader's short prompt still fits.
    server, policy, traj, outputs, summary = _session(setup, task.id, hf_tokenizer, prompt_length=200)
    assert len(server.calls) == 1 and policy.overflows == 2 and policy.completed == {"reader": 1}
    assert traj.counts.request_errors == 2 and traj.status == "error"
    errors = [c.error for c in traj.policy_calls() if c.error]  # both memory updates, refused before the server
    assert len(errors) == 2 and all("exceeds rollout.prompt_length = 200" in e for e in errors)
    assert len(outputs) == 1 and len(outputs[0]["prompt_ids"]) <= 200  # the reader's row only, answer last
    got = compute_score(
        "s", "", ["x"], {"memsearch": summary}, metric="boxed_em", invalid_penalty=0.0, citation_penalty=0.0
    )
    assert got == {"score": 0.0, "metric": 0.0, "answered": 1}


def test_outputs_refuse_a_last_call_without_tokens():
    call = {
        "type": "policy_call",
        "role": "reader",
        "step": 0,
        "completion_ids": [],
        "logprobs": [],
        "prompt_ids": [1, 2],
        "error": None,
    }
    with pytest.raises(ValueError, match="generated no token"):
        session_outputs(Trajectory.from_json({"task_id": "t", "status": "ok", "events": [call]}), "memagent")


def test_compute_score_values_and_refusal():
    def summary(**kw):
        base = {
            "task_id": "t",
            "role": "memory",
            "prediction": "Paris",
            "reader_text": "Answer: Paris",
            "answer_format": "free",
            "citations": [],
            "invalid_citations": [],
            "counts": {"searches": 2},
            "events": [{"type": "policy_call", "role": "memory", "valid": True}] * 4,
            "status": "ok",
        }
        return {"memsearch": {**base, **kw}}

    assert compute_score("s", "", ["Paris"], summary())["score"] == 1.0
    # a numpy array (how a parquet list column arrives) works like a list
    import numpy as np

    assert compute_score("s", "", np.array(["paris", "x"]), summary(), metric="em")["score"] == 1.0
    # 1 of 4 memory calls invalid: 1 - 0.5 * 1/4; 1 of 2 citations never shown: - 0.5 * 1/2; 2 searches at 0.1
    events = [{"type": "policy_call", "role": "memory", "valid": v} for v in (True, False, True, True)]
    got = compute_score(
        "s", "", ["Paris"], summary(events=events, citations=["a:0", "b:1"], invalid_citations=["b:1"]), search_cost=0.1
    )
    assert got["score"] == pytest.approx(1.0 - 0.125 - 0.25 - 0.2) and got["metric"] == 1.0
    # F1 of "Paris France" vs "Paris": precision 1/2, recall 1 -> 2/3
    assert compute_score("s", "", ["Paris"], summary(prediction="Paris France"))["score"] == pytest.approx(2 / 3)
    # boxed protocol: no box scores 0 on f1 even when the text has the answer
    assert compute_score("s", "", ["Paris"], summary(answer_format="boxed", reader_text="Paris"))["score"] == 0.0
    assert (
        compute_score(
            "s", "", ["Paris"], summary(answer_format="boxed", reader_text="\\boxed{Paris}"), metric="boxed_em"
        )["score"]
        == 1.0
    )
    assert RewardSettings().metric == "f1"  # the defaults compute_score mirrors
    with pytest.raises(ValueError, match="MemsearchAgentLoop"):
        compute_score("s", "Paris", ["Paris"], {"index": 0})
    # the terms are RewardSettings' (the overrides' spelling or its own); anything else is refused, not dropped
    assert compute_score("s", "", ["Paris"], summary(events=events), invalid_penalty=1.0)["score"] == \
        compute_score("s", "", ["Paris"], summary(events=events), invalid_call_penalty=1.0)["score"] == 0.75
    with pytest.raises(ValueError, match="reward_kwargs.citaton_penalty: not a memsearch reward term; expected one of "
                                         "citation_penalty, invalid_penalty, memory_recall, metric, search_cost"):
        compute_score("s", "", ["Paris"], summary(), citaton_penalty=0.1)
    with pytest.raises(ValueError, match="invalid_call_penalty given twice"):
        compute_score("s", "", ["Paris"], summary(), invalid_penalty=0.1, invalid_call_penalty=0.2)
    with pytest.raises(ValueError, match="reward_kwargs: metric: Input should be 'f1', 'em'"):
        compute_score("s", "", ["Paris"], summary(), metric="bleu")
    # verl's own keywords (a reward-model router) are not terms of ours
    assert compute_score("s", "", ["Paris"], summary(), reward_router_address=None,
                         reward_model_tokenizer=None)["score"] == 1.0


def test_the_overrides_carry_every_reward_term_that_compute_score_reads():
    from memsearch.integrations.verl.reward import reward_kwargs, settings_from_kwargs

    cfg = load_grpo_config(REPO / "configs/train/grpo_gpu.toml", ["loss.aggregation=token", "reward.search_cost=0.05"])
    overrides = dict(o.split("=", 1) for o in verl_overrides(cfg, "l.yaml", "t.parquet")[0])
    prefix = "+reward.custom_reward_function.reward_kwargs."
    given = {k.removeprefix(prefix): v for k, v in overrides.items() if k.startswith(prefix)}
    assert set(given) == set(reward_kwargs(cfg.reward)) and len(given) == len(RewardSettings.model_fields)
    parsed = {k: (v if k == "metric" else float(v)) for k, v in given.items()}  # as Hydra parses them
    assert settings_from_kwargs(parsed) == cfg.reward


def test_export_parquet_schema_labels_only_in_reward_model(tmp_path, hotpot_dev_dir):
    pq = pytest.importorskip("pyarrow.parquet")
    from memsearch.data.dataset import load_dataset
    from memsearch.data.records import LABEL_KEYS
    from memsearch.integrations.verl.data import COLUMNS, export_parquet
    from memsearch.io import sha256_file

    out = tmp_path / "train.parquet"
    assert export_parquet(hotpot_dev_dir, out) == 40
    rows = pq.read_table(out).to_pylist()
    dataset = load_dataset(hotpot_dev_dir)
    labels = dataset.labels_by_id()
    assert len(rows) == 40 and tuple(rows[0]) == COLUMNS
    for i, (row, task) in enumerate(zip(rows, dataset.tasks, strict=True)):
        assert row["prompt"] == [{"role": "user", "content": task.question}]
        assert row["agent_name"] == "memsearch_agent" and row["data_source"] == "memsearch/hotpotqa"
        assert row["reward_model"] == {"style": "rule", "ground_truth": labels[task.id].answers}
        assert row["extra_info"] == {
            "index": i,
            "split": "dev",
            "task_id": task.id,
            "doc_ids": task.doc_ids,
            "data_dir": str(hotpot_dev_dir.resolve()),
            "dataset_sha256": sha256_file(hotpot_dev_dir / "manifest.json"),
        }
        assert not (LABEL_KEYS & set(row["extra_info"])) and not (LABEL_KEYS & set(row))
    # documents stay out: the file is small next to the corpus
    assert out.stat().st_size < (hotpot_dev_dir / "corpus.jsonl").stat().st_size / 4


def test_a_row_reads_its_own_folder_and_a_changed_folder_is_refused(verl_case, hotpot_dev_dir, tmp_path):
    from memsearch.integrations.verl.data import parquet_rows
    from memsearch.integrations.verl.session import setup_for_row

    extra = parquet_rows(hotpot_dev_dir)[0]["extra_info"]
    path = str(verl_case("group_b"))
    assert setup_for_row(path, extra).cfg.data == extra["data_dir"]
    # the row's folder is not on this machine: the loop's `data` argument is read instead
    moved = {**extra, "data_dir": str(tmp_path / "elsewhere")}
    assert setup_for_row(path, moved, data=str(hotpot_dev_dir)).fingerprint == extra["dataset_sha256"]
    with pytest.raises(ValueError, match="another data folder"):
        setup_for_row(path, {**extra, "dataset_sha256": "0" * 64})
    # exported for MemAgent, trained as the memory policy: refused
    with pytest.raises(ValueError, match="role 'overwrite'"):
        setup_for_row(path, parquet_rows(hotpot_dev_dir, role="overwrite")[0]["extra_info"])
    assert setup_for_row(path, parquet_rows(hotpot_dev_dir, role="memory")[0]["extra_info"]).cfg.role == "memory"
    # a parquet exported before the MemAgent role was renamed still fits a MemAgent config
    row = parquet_rows(hotpot_dev_dir, role="overwrite")[0]["extra_info"]
    assert setup_for_row(str(verl_case("memagent")), row).cfg.role == "memagent"


def _overrides(cfg, **launch):
    overrides, notes = verl_overrides(cfg, "loops.yaml", "train.parquet", **launch)
    return dict(o.split("=", 1) for o in overrides), notes


def test_config_maps_the_gpu_recipe_and_refuses_what_verl_cannot_run():
    gpu = REPO / "configs/train/grpo_gpu.toml"
    with pytest.raises(VerlMappingError) as err:
        verl_overrides(load_grpo_config(gpu), "loops.yaml", "train.parquet")
    assert [r.split(":")[0] for r in err.value.reasons] == ["loss.aggregation = 'trajectory'"]
    cfg = load_grpo_config(gpu, ["loss.aggregation=token", "credit.std_scale=true"])
    got, notes = _overrides(cfg)
    expected = {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": "True",
        "trainer.use_v1": "True",
        "data.train_batch_size": "32",
        "actor_rollout_ref.rollout.n": "8",
        "actor_rollout_ref.rollout.temperature": "1.0",
        "actor_rollout_ref.actor.clip_ratio_low": "0.2",
        "actor_rollout_ref.actor.clip_ratio_high": "0.28",
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
        "actor_rollout_ref.actor.use_kl_loss": "True",
        "actor_rollout_ref.actor.kl_loss_coef": "0.001",
        "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
        # 32 tasks x 3 rows (one memory call per search) in one mini-batch: one optimizer step, as memsearch's
        "actor_rollout_ref.actor.ppo_mini_batch_size": "96",
        "actor_rollout_ref.rollout.tensor_model_parallel_size": "2",
        "trainer.logger": "[console]",
        "actor_rollout_ref.model.lora_rank": "64",
        "actor_rollout_ref.model.lora_alpha": "128",
        "actor_rollout_ref.actor.optim.lr": "1e-06",
        "actor_rollout_ref.actor.optim.lr_warmup_steps": "5",
        "actor_rollout_ref.model.path": "/path/to/local/model",
        "trainer.total_training_steps": "200",
        # memory 512 + evidence 512 + 1024 slack; the longest completion is the 512-token policy budget
        "data.max_prompt_length": "2048",
        "data.max_response_length": "512",
        "reward.custom_reward_function.path": "pkg://memsearch.integrations.verl.reward",
        "+reward.custom_reward_function.reward_kwargs.metric": "f1",
        "+reward.custom_reward_function.reward_kwargs.invalid_penalty": "0.5",
        "actor_rollout_ref.rollout.agent.default_agent_loop": "memsearch_agent",
    }
    assert {k: got[k] for k in expected} == expected
    # no validation files: verl must not validate on the train file
    assert got["data.val_files"] == "train.parquet" and got["trainer.test_freq"] == "-1"
    assert "trainer.test_freq" not in dict(o.split("=", 1) for o in verl_overrides(cfg, "l", "t", "v.parquet")[0])
    assert any("advantage = reward" in n for n in notes) and any("memsearch eval" in n for n in notes)
    assert budgets(cfg) == (2048, 512)


def test_config_refusals_each_with_a_reason(tmp_path, hotpot_dev_dir):
    memagent = REPO / "configs/memagent.toml"
    with pytest.raises(ValueError, match="--data"):
        load_grpo_config(memagent)
    cfg = load_grpo_config(memagent, None, str(hotpot_dev_dir))
    # the MemAgent recipe: split credit (memsearch's trainer on verl), the embedded model (refused)
    assert cfg.credit.mode == "split" and [r.split(":")[0] for r in refusals(cfg)] == ["model = 'embedded'"]
    fixed = load_grpo_config(memagent, ["grpo.credit.mode=share", "model=/models/qwen"], str(hotpot_dev_dir))
    with pytest.raises(ValueError, match="cannot count the chunks.*give --rows-per-session"):
        _overrides(fixed)  # the budget tokenizer (the model's) is not here: stated, not guessed
    got, notes = _overrides(fixed, rows=5.0)
    # chunk 2048 + memory 1024 + 1024 slack; policy budget 1024; 16 tasks x 5 rows / 16 mini-batches
    assert got["data.max_prompt_length"] == "4096" and got["data.max_response_length"] == "1024"
    assert got["actor_rollout_ref.actor.ppo_mini_batch_size"] == "5"
    assert any("= 5 (x n = 40 rows)" in n and "about 16 optimizer step(s)" in n for n in notes)
    assert got["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-mean"
    assert got["+reward.custom_reward_function.reward_kwargs.metric"] == "boxed_em"
    cpu = REPO / "configs/train/grpo_cpu.toml"
    bad = load_grpo_config(
        cpu,
        [
            "rollout.schema_mode=true",
            "credit.invalid_decision_credit=none",
            "adapter=runs/sft/adapter",
            "loss.dual_clip=0",
            "lora.dropout=0.1",
            "optim.schedule=linear",
            "reward.memory_recall=1.0",
        ],
    )
    bad = bad.model_copy(update={"optim": bad.optim.model_copy(update={"max_grad_norm": None})})  # no TOML null
    reasons = refusals(bad)
    assert [r.split(" ")[0].rstrip(":") for r in reasons] == [
        "credit.invalid_decision_credit",
        "loss.aggregation",
        "rollout.schema_mode",
        "model",
        "adapter",
        "optim.schedule",
        "optim.max_grad_norm",
        "loss.dual_clip",
        "lora.dropout",
        "reward.memory_recall",
    ]
    assert all(":" in r and len(r.split(":", 1)[1].strip()) > 10 for r in reasons)  # every refusal says why


def test_agent_loop_yaml_names_the_loop_and_its_arguments():
    import yaml

    text = agent_loop_yaml("cfg/train.toml", "data/train", ["steps=3"])
    assert yaml.safe_load(text) == [
        {
            "name": "memsearch_agent",
            "_target_": "memsearch.integrations.verl.loop.MemsearchAgentLoop",
            "train_config": "cfg/train.toml",
            "data": "data/train",
            "overrides": ["steps=3"],
        }
    ]


def test_cli_export_data_and_config(tmp_path, hotpot_dev_dir):
    pytest.importorskip("pyarrow")
    import yaml
    from typer.testing import CliRunner

    from memsearch.cli.app import app

    runner = CliRunner()
    out = tmp_path / "train.parquet"
    result = runner.invoke(app, ["verl", "export-data", "--data", str(hotpot_dev_dir), "--out", str(out)])
    assert result.exit_code == 0 and result.output.strip() == f"wrote {out}: 40 rows"
    bad = runner.invoke(
        app, ["verl", "export-data", "--data", str(hotpot_dev_dir), "--out", str(out), "--role", "reader"]
    )
    assert bad.exit_code == 2 and "--role 'reader'" in bad.output
    gpu = str(REPO / "configs/train/grpo_gpu.toml")
    loops = tmp_path / "loops.yaml"
    refused = runner.invoke(app, ["verl", "config", "--config", gpu, "--agent-loops", str(loops)])
    # refused with the reason as an `error:` line and status 2, nothing written
    assert refused.exit_code == 2 and not loops.exists()
    assert "error: - loss.aggregation = 'trajectory'" in refused.output
    ok = runner.invoke(
        app,
        [
            "verl",
            "config",
            "--config",
            gpu,
            "--set",
            "loss.aggregation=token",
            "--rollout-tp",  # the recipe's layout trains on one GPU (devices.train = [0])
            "1",
            "--data",
            str(hotpot_dev_dir),
            "--train-files",
            str(out),
            "--agent-loops",
            str(loops),
        ],
    )
    assert ok.exit_code == 0, ok.output
    lines = [ln for ln in ok.stdout.splitlines() if not ln.startswith("#")]
    assert "actor_rollout_ref.actor.loss_agg_mode=token-mean" in lines
    assert f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops.resolve()}" in lines
    assert yaml.safe_load(loops.read_text())[0]["overrides"] == ["loss.aggregation=token"]


def _config_cli(*args):
    from typer.testing import CliRunner

    from memsearch.cli.app import app

    return CliRunner().invoke(app, ["verl", "config", *map(str, args)])


def test_cli_refuses_a_rollout_tp_that_leaves_ranks_without_a_replica(verl_case, tmp_path):
    loops = tmp_path / "loops.yaml"  # a config without a [devices] layout: --gpus decides
    base = ["--config", verl_case("group_b"), "--set", "model=/models/qwen", "--agent-loops", loops]
    # GPUS=7 with verl's default TP 2: 3 replicas, the 7th rank in none (verl's validate_config passes it)
    seven = _config_cli(*base, "--gpus", 7)
    assert seven.exit_code == 2 and not loops.exists()
    assert ("error: --rollout-tp 2 with 7 GPU(s) per node x 1 node(s): verl makes 3 rollout replica(s) of 2 GPUs and "
            "leaves 1 rank(s) in none") in seven.output
    assert "with 7 GPU(s) per node use --rollout-tp 1, 7; with --rollout-tp 2 use 2, 4, 6, 8 GPUs per node" in (
        seven.output.replace("\n", " "))
    # a replica may not span two nodes: 6 GPUs x 2 nodes divides by 4, but the second replica would straddle
    spans = _config_cli(*base, "--gpus", 6, "--nodes", 2, "--rollout-tp", 4)
    assert spans.exit_code == 2 and "a replica of 4 GPUs would span two nodes" in spans.output
    ok = _config_cli(*base, "--gpus", 7, "--rollout-tp", 7)
    assert ok.exit_code == 0, ok.output
    lines = ok.stdout.splitlines()
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=7" in lines and "trainer.n_gpus_per_node=7" in lines


def test_cli_logger_is_console_unless_asked(tmp_path):
    from memsearch.integrations.verl.config import VERL_ROLLOUT_TP

    gpu = REPO / "configs/train/grpo_gpu.toml"
    base = ["--config", gpu, "--set", "loss.aggregation=token", "--agent-loops", tmp_path / "loops.yaml", "--gpus", 2,
            "--set", "devices.train=[0,1]", "--set", "devices.services.reader=[2]"]
    plain = _config_cli(*base)
    assert plain.exit_code == 0, plain.output
    assert "trainer.logger=[console]" in plain.stdout.splitlines() and "wandb" not in plain.stdout
    # the CLI's default TP is verl's (written out, so the check and the run agree)
    assert f"actor_rollout_ref.rollout.tensor_model_parallel_size={VERL_ROLLOUT_TP}" in plain.stdout.splitlines()
    more = _config_cli(*base, "--logger", "console,wandb,tensorboard,wandb")
    assert more.exit_code == 0 and "trainer.logger=[console,wandb,tensorboard]" in more.stdout.splitlines()
    assert "# note: trainer.logger has wandb: the run stops at start-up without WANDB_API_KEY" in more.output
    bad = _config_cli(*base, "--logger", "console,wandbb")
    assert bad.exit_code == 2
    assert "error: --logger console,wandbb: expected a comma list of console, wandb" in bad.output


def test_cli_gpus_follow_the_device_layout(tmp_path):
    gpu = REPO / "configs/train/grpo_gpu.toml"
    base = ["--config", gpu, "--set", "loss.aggregation=token", "--agent-loops", tmp_path / "loops.yaml"]
    # the recipe's own layout: one training GPU, so verl's default TP 2 is refused and TP 1 runs
    assert "with 1 GPU(s) per node use --rollout-tp 1;" in _config_cli(*base).output
    assert "trainer.n_gpus_per_node=1" in _config_cli(*base, "--rollout-tp", 1).stdout.splitlines()
    # an 8-GPU node's layout, as scripts/verl/memory_policy_hotpot.sh takes it (SET)
    base += ["--set", "devices.train=[0,1,2,3,4,5]", "--set", "devices.services.reader=[7]"]
    ok = _config_cli(*base)
    assert ok.exit_code == 0, ok.output
    assert "trainer.n_gpus_per_node=6" in ok.stdout.splitlines()
    assert "# note: devices.train: start verl with CUDA_VISIBLE_DEVICES=0,1,2,3,4,5" in ok.output
    other = _config_cli(*base, "--gpus", 8)
    assert other.exit_code == 2
    assert "error: --gpus 8: the config's devices.train [0, 1, 2, 3, 4, 5] names 6 training GPU(s)" in other.output
    # the layout's 6 GPUs with TP 4: refused like --gpus 6 would be
    assert _config_cli(*base, "--rollout-tp", 4).exit_code == 2


def test_mini_batch_counts_the_rows_of_a_session(verl_case, hf_tokenizer, hotpot_dev_dir):
    from memsearch.data.dataset import load_dataset
    from memsearch.integrations.verl.config import mini_batch, rows_per_session

    # MemAgent rows: one update per chunk read + the answer, counted as the engine cuts the contexts;
    # equal to the outputs real sessions make over the same tasks (max_chunks high enough to vary).
    overrides = ("episode.budgets.max_chunks=8", "model=/models/qwen")
    cfg = load_grpo_config(verl_case("memagent"), list(overrides))
    rows, source = rows_per_session(cfg, sample=4)
    setup = worker_setup(str(verl_case("memagent")), None, overrides)
    tasks = load_dataset(hotpot_dev_dir).tasks[:4]
    made = [len(_session(setup, t.id, hf_tokenizer, reader="\\boxed{x}")[3]) for t in tasks]
    assert len(set(made)) > 1 and rows == pytest.approx(sum(made) / 4)
    assert source.startswith(f"{rows - 1:.2f} chunks read (of at most 8) on average over the first 4 tasks")
    # sized for mini_batches_per_step optimizer steps: 16 tasks x 8 sessions x 5 rows in 16 mini-batches of 40 rows
    memagent = load_grpo_config(REPO / "configs/memagent.toml", ["grpo.credit.mode=share"], str(hotpot_dev_dir))
    assert (memagent.rollout.tasks_per_step, memagent.rollout.group_size, memagent.update.mini_batches_per_step) == \
        (16, 8, 16)
    assert mini_batch(memagent, 5.0, 8) == (5, 16)
    # 2.05 rows: 2 tasks a mini-batch (17 steps) is nearer 16 than 3 (11 steps)
    assert mini_batch(memagent, 2.05, 8) == (2, 17)
    # 6 GPUs: size x 8 rows must divide among 6 ranks, so the size is a multiple of 3: 6 (14 steps), not 3 (27)
    assert mini_batch(memagent, 5.0, 6) == (6, 14)
    two_epochs = memagent.model_copy(update={"update": memagent.update.model_copy(update={"epochs": 2})})
    assert mini_batch(two_epochs, 5.0, 8) == (5, 32)

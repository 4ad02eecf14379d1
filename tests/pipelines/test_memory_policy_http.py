"""Stage 2 of ``memsearch pipeline memory-policy`` with the frozen stage-1 model served over HTTP
(``stage2.memory_serving = "http"``), for real on the tiny Llama: the pipeline launches
``transformers serve`` on ``seed-N/merged1``, stage 2's memory calls go to it through the
``openai`` backend, and the server is gone afterwards; a server that cannot start is a clear
error with its log; a user-run server must list the configured model name."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from tests.support.processes import alive

from memsearch.backends.served_model import served_entry
from memsearch.errors import InputError
from memsearch.pipelines.memory_policy import serving
from memsearch.pipelines.memory_policy.pipeline import run_memory_policy_pipeline

# Stage 2 over HTTP with a launched server; free decoding (schema mode is in-process only); no
# A-D matrix (it keeps the in-process backend and is tested in test_memory_policy_pipeline.py).
HTTP = ("stage2.enabled=true", "data.val_questions=2", "schema_mode=false", 'stage2.memory_serving="http"',
        "matrix_seeds=[]")


def _on(model: Path) -> str:
    return f"model={json.dumps(str(model))}"


def _record(path: Path) -> dict:
    return json.loads(path.read_text())


def _memory_calls(path: Path) -> list[dict]:
    return [e for line in path.read_text().splitlines() for e in json.loads(line)["events"]
            if e.get("type") == "policy_call" and e["role"] == "memory"]


def _pids(log: Path) -> list[int]:
    return [int(m) for m in re.findall(r"^=== pid (\d+)$", log.read_text(), flags=re.M)]


@pytest.fixture(scope="module")
def searching_model_dir(tmp_path_factory):
    """A tiny Llama (the embedded tokenizer) that answers every chat prompt with
    ``SEARCH: first name since``: attention and MLP outputs are zero, so the last token alone
    picks the next one, through a chain of one-hot embeddings and a sharp untied head (the last
    prompt token -> SE -> ARCH -> ... -> since -> end). A random controller never searches, and
    memory is only called on new evidence; these three words are in a candidate passage of every
    sample question used here."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from memsearch.assets.embedded import tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "q"}], add_generation_prompt=True, tokenize=True
    )
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    chain = [
        prompt[-1],
        *tokenizer.encode("SEARCH: first name since", add_special_tokens=False),
        tokenizer.eos_token_id,
    ]
    assert len(set(chain)) == len(chain) < 32
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for i, (token, following) in enumerate(zip(chain, chain[1:])):
            model.model.embed_tokens.weight[token, i] = 1.0
            model.lm_head.weight[following, i] = 20.0
    out = tmp_path_factory.mktemp("models") / "searching-llama"
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def http_run(mp_config, searching_model_dir, tmp_path_factory):
    """The pipeline with stage 2 over a launched `transformers serve`; what the tests check is read
    here, before the user-server test reuses the folder."""
    out = tmp_path_factory.mktemp("mp-http") / "out"
    lines: list[str] = []
    run_memory_policy_pipeline(mp_config(_on(searching_model_dir), *HTTP), out, echo=lines.append)
    seed = out / "seed-7"
    log = seed / "grpo2.memory_server.log"
    state = {
        "out": out,
        "lines": lines,
        "log": log.read_text(),
        "pids": _pids(log),
        "alive": [pid for pid in _pids(log) if alive(pid)],
        "record": _record(seed / "grpo2.stage.json"),
        "config": _record(seed / "grpo2" / "config.json"),
        "rollouts": _memory_calls(seed / "grpo2" / "rollouts" / "step-000001.rank0.jsonl"),
        "eval": _memory_calls(seed / "grpo2" / "eval" / "step-000001" / "trajectories.jsonl"),
        "eval_run": _record(seed / "grpo2" / "eval" / "step-000001" / "run.json"),
        "stage1_rollouts": _memory_calls(seed / "grpo1" / "rollouts" / "step-000001.rank0.jsonl"),
    }
    again: list[str] = []
    run_memory_policy_pipeline(mp_config(_on(searching_model_dir), *HTTP), out, echo=again.append)
    state["again"] = again
    return state


@pytest.mark.slow
def test_stage2_memory_calls_go_to_the_launched_transformers_serve_and_it_stops(http_run):
    out, seed = http_run["out"], http_run["out"] / "seed-7"
    merged1 = str(seed / "merged1")
    memory = http_run["config"]["episode"]["backends"]["memory"]
    assert (memory["kind"], memory["model"], memory["schema_mode"]) == ("openai", merged1, False)
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", memory["base_url"])
    # The stage record names the server; the stage-1 fingerprint is an input as in process.
    inputs = http_run["record"]["inputs"]
    assert http_run["record"]["complete"] is True
    # (paths under the run folder are recorded as $OUT: pipelines/stage_record.py; where the server
    # answered is no input: config.backend.ADDRESS_KEYS)
    assert inputs["memory_server"] == {"serving": "transformers serve", "model": "$OUT/seed-7/merged1", "args": []}
    assert inputs["stage1"] == _record(seed / "merged1.stage.json")["fingerprint"]
    # Every memory call of stage 2 (rollouts and periodic evaluation) was answered over HTTP: text
    # only (the served model returns no token ids), usage reported by the server, no error; and the
    # server logged exactly that many chat completions. Stage 1's in-process calls carry ids.
    calls = http_run["rollouts"] + http_run["eval"]
    assert http_run["rollouts"] and http_run["eval"]
    assert all(c["error"] is None and c["completion_ids"] is None and c["usage"]["source"] == "reported" for c in calls)
    assert all(c["completion_ids"] for c in http_run["stage1_rollouts"])
    assert http_run["log"].count('"POST /v1/chat/completions HTTP/1.1" 200') == len(calls)
    assert http_run["eval_run"]["models"]["memory"]["kind"] == "openai"
    # Started once, stopped: no process left, the log says so.
    (pid,) = http_run["pids"]
    assert http_run["alive"] == [] and "stopped (exit status" in http_run["log"].splitlines()[-1]
    assert any(line.startswith("memory server: transformers serve") for line in http_run["lines"])
    # A re-run skips stage 2 without starting a server.
    assert "grpo2: done" in "\n".join(http_run["again"])
    assert not any(line.startswith("memory server:") for line in http_run["again"])
    assert "served over HTTP by `transformers serve`" in (out / "report.md").read_text()


@pytest.mark.slow
def test_a_user_run_server_must_list_the_configured_model_name(http_run, mp_config, searching_model_dir, tmp_path):
    """Stage 2 redone against a server the test runs ("the user"): a wrong served name is refused
    before training, the right one trains over it."""
    out, seed = http_run["out"], http_run["out"] / "seed-7"
    for stage in ("grpo2", "merged2"):
        shutil.rmtree(seed / stage)
        (seed / f"{stage}.stage.json").unlink()
    merged1 = seed / "merged1"
    port = serving.free_port()
    with serving.launched_server(merged1, port, tmp_path / "user.log", echo=lambda _: None) as url:
        user = (_on(searching_model_dir), *HTTP, f'stage2.memory_url="{url}"')
        with pytest.raises(InputError, match=r"stage2.memory_model 'not-served' is not served at"):
            run_memory_policy_pipeline(mp_config(*user, 'stage2.memory_model="not-served"'), out, echo=lambda _: None)
        assert not (seed / "grpo2" / "adapter").exists()
        lines: list[str] = []
        run_memory_policy_pipeline(
            mp_config(*user, f"stage2.memory_model={json.dumps(str(merged1))}"), out, echo=lines.append
        )
    record = _record(seed / "grpo2.stage.json")
    assert record["complete"]
    assert record["inputs"]["memory_server"] == {"serving": "user", "model": "$OUT/seed-7/merged1"}
    calls = _memory_calls(seed / "grpo2" / "rollouts" / "step-000001.rank0.jsonl")
    assert calls and all(c["error"] is None and c["completion_ids"] is None for c in calls)
    assert (tmp_path / "user.log").read_text().count('"POST /v1/chat/completions HTTP/1.1" 200') >= len(calls)
    assert not alive(_pids(tmp_path / "user.log")[0])


@pytest.mark.slow
def test_a_server_that_cannot_start_or_crashes_is_stopped_with_a_clear_error(tiny_model_dir, tmp_path):
    # A folder transformers cannot load: the server exits; the error quotes its log.
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    log = tmp_path / "broken.log"
    with pytest.raises(
        InputError, match=r"(?s)transformers serve exited with status .* the end of its log.*no-such-architecture"
    ):
        with serving.launched_server(broken, serving.free_port(), log, timeout_s=120, echo=lambda _: None):
            pytest.fail("the server must not be ready")
    assert not alive(_pids(log)[0])
    # A server that does not answer /health in time is stopped.
    log = tmp_path / "slow.log"
    with pytest.raises(InputError, match=r"did not answer /health .* within 0\.5 s"):
        with serving.launched_server(tiny_model_dir, serving.free_port(), log, timeout_s=0.5, echo=lambda _: None):
            pytest.fail("the server must not be ready")
    assert not alive(_pids(log)[0]) and "stopped (exit status" in log.read_text()
    # An error while it serves (a crashed stage) stops it too.
    log = tmp_path / "crash.log"
    with pytest.raises(RuntimeError, match="stage crashed"):
        with serving.launched_server(
            tiny_model_dir, serving.free_port(), log, timeout_s=120, echo=lambda _: None
        ) as url:
            assert served_entry(url, str(tiny_model_dir))["id"] == str(tiny_model_dir)
            raise RuntimeError("stage crashed")
    assert not alive(_pids(log)[0]) and "stopped (exit status" in log.read_text()


def test_http_memory_serving_settings_are_checked_at_load(mp_config):
    with pytest.raises(Exception, match="schema_mode = true on the `transformers serve` the pipeline launches: it "
                       "constrains no output"):
        mp_config("stage2.enabled=true", 'stage2.memory_serving="http"', "schema_mode=true")
    # A server you run, or one of an engine that constrains output, keeps schema mode: its
    # backend checks the engine against /models before the run (tests/backends/test_engine_forms.py).
    for served in (['stage2.memory_url="http://h:1/v1"', 'stage2.memory_model="m"'], ['stage2.serve_engine="vllm"']):
        cfg = mp_config("stage2.enabled=true", 'stage2.memory_serving="http"', "schema_mode=true", *served)
        memory = cfg.stage2_config("t", 7, "seed-7/merged1", launched_url="http://h:2/v1").episode.backends.memory
        assert (memory.kind, memory.schema_mode) == ("openai", True)
        assert memory.engine == ("auto" if "memory_url" in served[0] else "vllm")
    with pytest.raises(Exception, match="stage2.memory_url needs stage2.memory_model"):
        mp_config("schema_mode=false", 'stage2.memory_serving="http"', 'stage2.memory_url="http://127.0.0.1:8000/v1"')
    with pytest.raises(Exception, match="stage2.memory_model without stage2.memory_url"):
        mp_config("schema_mode=false", 'stage2.memory_serving="http"', 'stage2.memory_model="m"')
    with pytest.raises(Exception, match="stage2.serve_port: only for the server the pipeline launches"):
        mp_config(
            "schema_mode=false",
            'stage2.memory_serving="http"',
            'stage2.memory_url="http://h:1/v1"',
            'stage2.memory_model="m"',
            "stage2.serve_port=8000",
        )
    with pytest.raises(Exception, match="stage2.memory_url: only used with stage2.memory_serving = 'http'"):
        mp_config('stage2.memory_url="http://h:1/v1"')
    with pytest.raises(Exception, match=r"temperature > 0 is not honoured by it"):
        mp_config(
            "schema_mode=false", 'stage2.memory_serving="http"', "episode.backends.memory.sampling.temperature=0.7"
        )
    cfg = mp_config(
        "stage2.enabled=true",
        "schema_mode=false",
        'stage2.memory_serving="http"',
        'stage2.memory_url="http://h:1/v1"',
        'stage2.memory_model="m"',
    )
    memory = cfg.stage2_config("t", 7, "seed-7/merged1").episode.backends.memory
    assert (memory.kind, memory.base_url, memory.model, memory.schema_mode) == ("openai", "http://h:1/v1", "m", False)
    # The openai backend keeps the episode memory backend's client settings.
    assert memory.max_concurrency == cfg.episode.backends.memory.max_concurrency

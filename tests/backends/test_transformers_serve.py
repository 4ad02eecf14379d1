"""The same eval through the `openai` backend against `transformers serve` (a real OpenAI-
compatible server running the embedded model on loopback) and through the local `hf` backend
gives the same kind of records."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from memsearch.config import load_config
from memsearch.eval.runner import run_eval
from memsearch.io import iter_jsonl

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["limit=2", "budgets.max_searches=1", "budgets.evidence_tokens=96", "budgets.policy_tokens=48",
         "budgets.answer_tokens=16", "budgets.memory_tokens=96", "concurrency=2"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served_model():
    from memsearch.assets.embedded import model_dir

    folder = str(model_dir())
    exe = shutil.which("transformers", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("the `transformers` CLI is missing: `uv sync` installs transformers[serving] in the dev group")
    port = _free_port()
    proc = subprocess.Popen([exe, "serve", folder, "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail("transformers serve exited during start-up")
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1", folder
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _calls(run: Path) -> list[dict]:
    return [e for _, t in iter_jsonl(run / "trajectories.jsonl") for e in t["events"] if e["type"] == "policy_call"]


@pytest.mark.slow
def test_openai_backend_on_transformers_serve_matches_hf_records(served_model, hotpot_dev_dir, tmp_path):
    url, folder = served_model
    demo = ROOT / "configs" / "demo.toml"
    api = [f'backends.{r}.{k}="{v}"' for r in ("memory", "controller", "reader")
           for k, v in (("kind", "openai"), ("base_url", url), ("model", folder))]
    served = run_eval(load_config(demo, SMALL + api), hotpot_dev_dir, tmp_path / "served", show_progress=False)
    local = run_eval(load_config(demo, SMALL), hotpot_dev_dir, tmp_path / "local", show_progress=False)
    for summary in (served, local):
        assert summary["complete"] and summary["request_errors"] == 0
        assert summary["tokenizer"] == "hf:embedded:SmolLM2-135M-Instruct"
    assert served["backends"]["reader"] == "openai" and local["backends"]["reader"] == "hf"
    served_calls, local_calls = _calls(tmp_path / "served"), _calls(tmp_path / "local")
    # Same episodes, same roles in the same order, same record fields.
    assert [(c["role"], c["step"]) for c in served_calls] == [(c["role"], c["step"]) for c in local_calls]
    assert all(set(a) == set(b) for a, b in zip(served_calls, local_calls))
    # Both report usage from the model side (the server's counts; our exact token counts).
    assert all(c["usage"]["source"] == "reported" for c in served_calls + local_calls)
    # What differs, by design: the local backend returns the raw completion token ids and
    # per-token log-probs; this server returns text only.
    assert all(c["completion_ids"] and c["logprobs"] for c in local_calls)
    assert all(c["completion_ids"] is None for c in served_calls)

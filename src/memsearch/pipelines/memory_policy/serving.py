"""The frozen stage-1 model over HTTP for stage 2 of ``memsearch pipeline memory-policy``
(``stage2.memory_serving = "http"``, docs/memory_policy.md).

Two ways, both entered only while stage 2 actually trains (a finished stage starts nothing):

- ``launched_server``: ``transformers serve`` on ``seed-N/merged1`` as a child process on
  127.0.0.1 (offline: ``HF_HUB_OFFLINE=1``), its output appended to a log file; waits (bounded)
  for ``/health`` and for ``/v1/models`` to list the folder, and always stops it afterwards
  (SIGTERM, then SIGKILL), on errors and interrupts too. A start that fails raises
  ``InputError`` with the end of the server's log.
- ``user_server``: a server the user runs (vLLM, ...): refused unless its ``/v1/models`` lists
  the configured served model name. Which weights it serves is the user's responsibility.

    with launched_server(merged1, port, log, timeout_s=300) as url:
        train_grpo(...)   # memory calls go to url through the openai backend
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memsearch.errors import InputError

LOG_TAIL_LINES = 30
STOP_WAIT_S = 30.0


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def served_models(url: str, timeout_s: float = 10.0) -> list[str]:
    """The model ids ``{url}/models`` lists (``url`` is the API root, e.g. ``http://h:p/v1``)."""
    with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=timeout_s) as response:
        data = json.loads(response.read())
    return [m.get("id") for m in data.get("data") or [] if isinstance(m, dict)]


def check_served_model(url: str, name: str, timeout_s: float = 10.0) -> None:
    """Refuse (``InputError``) unless the server at ``url`` answers and lists ``name``."""
    try:
        models = served_models(url, timeout_s)
    except (OSError, ValueError) as exc:
        raise InputError(f"stage2.memory_url {url}: GET /models failed ({type(exc).__name__}: {exc}); start the server "
                         "on seed-N/merged1 first (docs/memory_policy.md)") from None
    if name not in models:
        raise InputError(f"stage2.memory_model {name!r} is not served at {url} (its /models lists {models}); serve "
                         "seed-N/merged1 under that name (vLLM: --served-model-name) or fix stage2.memory_model")


@contextmanager
def user_server(url: str, name: str) -> Iterator[str]:
    """A server the user runs: checked to list ``name``; yields ``url``."""
    check_served_model(url, name)
    yield url


def _tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _serve_command(model: Path, port: int, args: list[str]) -> list[str]:
    exe = Path(sys.executable).parent / "transformers"
    if not exe.is_file():
        raise InputError(f"{exe}: the `transformers` CLI is missing from this environment; `transformers serve` needs "
                         "transformers[serving] (FastAPI, uvicorn), installed by `uv sync`")
    return [str(exe), "serve", str(model), "--host", "127.0.0.1", "--port", str(port), "--log-level", "info", *args]


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's own process group (it was started in a new session), then SIGKILL."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, STOP_WAIT_S), (signal.SIGKILL, STOP_WAIT_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def launched_server(model: Path, port: int, log: Path, timeout_s: float = 300.0, args: list[str] | None = None,
                    echo=print, gpus: str | None = None) -> Iterator[str]:
    """``transformers serve`` on the local folder ``model`` at ``127.0.0.1:port``; yields the API
    root (``http://127.0.0.1:port/v1``) once ``/health`` answers and ``/v1/models`` lists the
    folder; always stops the server on exit. The server's output is appended to ``log``.
    ``gpus``: its ``CUDA_VISIBLE_DEVICES`` (the layout's ``stage1`` service), so it never lands on
    the trainer's GPUs, which this process sees."""
    if not (Path(model) / "config.json").is_file():
        raise InputError(f"{model}: not a Hugging Face model folder (no config.json); nothing to serve")
    command = _serve_command(Path(model), port, list(args or []))
    url = f"http://127.0.0.1:{port}/v1"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # a local folder: never download
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} {' '.join(command)}\n")
        fh.flush()
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        fh.write(f"=== pid {proc.pid}\n")
    try:
        _wait_ready(proc, url, str(model), log, timeout_s)
        echo(f"memory server: transformers serve {model} at {url} (pid {proc.pid}, ready in "
             f"{time.perf_counter() - start:.1f} s; log {log})")
        yield url
    finally:
        _stop(proc)
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} stopped (exit status {proc.returncode})\n")


def _wait_ready(proc: subprocess.Popen, url: str, name: str, log: Path, timeout_s: float) -> None:
    root = url[: -len("/v1")]
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise InputError(f"transformers serve exited with status {proc.returncode} before answering /health at "
                             f"{root}; the end of its log ({log}):\n{_tail(log)}")
        try:
            with urllib.request.urlopen(root + "/health", timeout=2) as response:
                if response.status == 200:
                    break
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            raise InputError(f"transformers serve did not answer /health at {root} within {timeout_s:g} s "
                             f"(stage2.serve_start_timeout_s); the end of its log ({log}):\n{_tail(log)}")
        time.sleep(0.5)
    try:
        models = served_models(url)
    except (OSError, ValueError) as exc:
        raise InputError(f"transformers serve at {url}: GET /models failed ({type(exc).__name__}: {exc}); the end of "
                         f"its log ({log}):\n{_tail(log)}") from None
    if name not in models:
        raise InputError(
            f"transformers serve at {url} lists {models}, not {name!r}; the end of its log ({log}):\n{_tail(log)}"
        )

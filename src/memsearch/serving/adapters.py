"""LoRA adapters put on a running server and taken off again: how `memsearch experiment run`
serves each seed's trained stage 1 on the reader's own server instead of a merged copy on a
server of its own (docs/server.md).

vLLM answers ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` when started with
``--enable-lora`` and the environment ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; an adapter above
its ``--max-lora-rank`` is refused there. Each refusal comes back as an ``InputError`` that names
the server, the adapter and what to change.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from memsearch.backends.retry_policy import error_object
from memsearch.errors import InputError

LOAD_TIMEOUT_S = 300.0  # reading the weights of a large adapter from a slow disk


def _post(url: str, body: dict, timeout_s: float) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _reason(raw: bytes) -> str:
    """The message of an error body on one line (the reading the retry rule uses)."""
    return " ".join(error_object(raw)[1].split())[:500]


def load_adapter(url: str, name: str, folder: str | Path, timeout_s: float = LOAD_TIMEOUT_S) -> None:
    """Serve the adapter in ``folder`` as model ``name`` on the vLLM server whose API root is
    ``url`` (``http://host:port/v1``); ``InputError`` when the server refuses or cannot be reached."""
    try:
        status, raw = _post(f"{url}/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)}, timeout_s)
    except OSError as exc:
        raise InputError(f"vLLM at {url}: loading adapter {name!r} failed ({type(exc).__name__}: {exc}); is the "
                         "server running?") from None
    if status == 404:
        raise InputError(f"vLLM at {url} does not load adapters at run time (POST /v1/load_lora_adapter: 404); "
                         "start it with --enable-lora and the environment VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
    if not 200 <= status < 300:
        raise InputError(f"vLLM at {url} refused adapter {name!r} from {folder} (HTTP {status}: {_reason(raw)}); "
                         "an adapter above the server's --max-lora-rank needs a server started with a larger one, "
                         "one whose modules the model lacks is not this model's")


def unload_adapter(url: str, name: str, timeout_s: float = 60.0) -> None:
    """Stop serving adapter ``name``; a server that is gone or never had it is left as it is
    (this runs while a run unwinds, where a second error would hide the first)."""
    try:
        _post(f"{url}/unload_lora_adapter", {"lora_name": name}, timeout_s)
    except OSError:
        pass

"""Process and backend helpers the server tests share."""

from __future__ import annotations

import asyncio
import os
from typing import Any


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def generate_and_close(backend: Any, requests: list[Any]) -> list[Any]:
    """``backend.generate(requests)`` on a fresh event loop, the backend closed afterwards."""
    async def go():
        try:
            return await backend.generate(requests)
        finally:
            await backend.aclose()

    return asyncio.run(go())

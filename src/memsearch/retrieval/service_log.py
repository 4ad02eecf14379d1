"""Rate-limited log lines for the retrieval service: one misbehaving client must not fill the disk.

At the open-file limit asyncio logged a traceback for every refused accept, 70 MB a minute
(measured); a client repeating one bad request can make aiohttp log the same error as often.
``RepeatLimiter`` lets the first record of a kind through, then at most one a window, with the
count of those dropped meanwhile, so the log of a service under attack stays readable and small.
``install_log_limits`` puts it on the loggers a serving process writes to (``server.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any


class RepeatLimiter(logging.Filter):
    """Lets the first log record of a kind through, then at most one per ``window_s``, saying how
    many like it were dropped meanwhile: at the open-file limit asyncio logged a traceback for each
    refused accept, over 2 MB a second. A kind is the logger, the level, the message's first line
    (its template when it has arguments) and the exception type; ``kinds`` bounds the memory."""

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic, kinds: int = 1000) -> None:
        super().__init__()
        self.window_s, self._clock, self._kinds = window_s, clock, kinds
        self._seen: dict[tuple[Any, ...], list[float]] = {}  # kind -> [last let through, dropped since]

    def filter(self, record: logging.LogRecord) -> bool:
        template = str(record.msg) if record.args else record.getMessage()
        kind = (record.name, record.levelno, template.split("\n", 1)[0][:200],
                record.exc_info[0] if record.exc_info else None)
        now = self._clock()
        seen = self._seen.get(kind)
        if seen is not None and now - seen[0] < self.window_s:
            seen[1] += 1
            return False
        if seen is None and len(self._seen) >= self._kinds:
            self._seen.clear()
        self._seen[kind] = [now, 0]
        if seen is not None and seen[1]:
            dropped = f"({int(seen[1])} more like this in the last {now - seen[0]:.0f} s were not logged)"
            record.msg = f"{record.getMessage()}\n{dropped}"
            record.args = None
        return True


_LIMITER = RepeatLimiter()
LIMITED_LOGGERS = ("asyncio", "aiohttp.server", "aiohttp.web", "aiohttp.access", "aiohttp.internal")


def install_log_limits() -> None:
    """Rate-limit repeated records (``RepeatLimiter``) of the loggers a serving process writes to."""
    for name in LIMITED_LOGGERS:
        logger = logging.getLogger(name)
        if _LIMITER not in logger.filters:
            logger.addFilter(_LIMITER)


"""Reading an HTTP answer no larger than a bound, compressed and inflated.

A misbehaving server (or a proxy in front of it) may answer with far more than was asked: 30 MB
of text for 64 tokens, or a 1 MB gzip body that inflates to 1 GiB. ``read_bounded`` reads an
aiohttp response's decoded body chunk by chunk and stops as soon as it, or its compressed form,
passes the bound: aiohttp (>= 3.14, the floor in ``pyproject.toml``) inflates a compressed body a
bounded piece at a time as it is read, so stopping the read also stops the inflation. Used by the
HTTP clients: the OpenAI backend (``backends/response_limits.py`` derives its bound from the
request) and the retrieval client (``retrieval/client.py``).
"""

from __future__ import annotations

from typing import Any


class BodyTooLarge(Exception):
    """An answer larger than its bound; its message names the bound and how far the read got."""


async def read_bounded(response: Any, limit: int, what: str) -> bytes:
    """The decoded body of an aiohttp ``response``; ``BodyTooLarge`` as soon as it (or its
    compressed form) passes ``limit`` bytes, or when its ``Content-Length`` announces more.
    ``what`` describes the bound in the message ("the 1,064,960-byte cap for this request")."""
    announced = response.content_length
    if announced is not None and announced > limit:
        raise BodyTooLarge(f"the server announced a {announced:,}-byte body, over {what}")
    chunks: list[bytes] = []
    size = 0
    stream = response.content
    async for chunk in stream.iter_any():
        size += len(chunk)
        compressed = getattr(stream, "total_compressed_bytes", None) or 0
        if size > limit or compressed > limit:
            encoding = response.headers.get("Content-Encoding", "identity")
            raise BodyTooLarge(f"the body passed {what} after {max(size, compressed):,} bytes "
                               f"(Content-Encoding: {encoding}); the rest was not read")
        chunks.append(chunk)
    return b"".join(chunks)

"""A server whose ``/{announced,chunked,gzip}/retrieve`` answers are far larger than any retrieval
request may return (``test_client_limits.py``). It runs in a process of its own, so the client's
memory, measured with ``tracemalloc`` in the test process, holds the client alone: a server thread
in the same process would add its own write buffers to the peak (up to 30 MB seen on a loaded
machine). Prints ``PORT <n>`` once it listens.

    python tests/retrieval/oversized_server.py
"""

from __future__ import annotations

import asyncio
import zlib

from aiohttp import web

MB = 1 << 20
BODY = b'{"result": [[' + b" " * (32 * MB) + b"]]}"  # far past the client's bound (about 1.1 MB here)
BOMB_MIB = 64  # the gzip answer inflates to this many MiB of zeros


def _gzip_zeros(mib: int) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    zeros = bytes(MB)
    return b"".join([*(packer.compress(zeros) for _ in range(mib)), packer.flush()])


async def _stream(request: web.Request, body: bytes, headers: dict[str, str]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json", **headers})
    response.enable_chunked_encoding()
    await response.prepare(request)
    try:
        for i in range(0, len(body), 1 << 16):
            await response.write(body[i:i + (1 << 16)])
        await response.write_eof()
    except (ConnectionError, RuntimeError):
        pass  # the client stopped reading at its bound and closed the connection: expected
    return response


async def main() -> None:
    bomb = _gzip_zeros(BOMB_MIB)

    async def announced(request: web.Request) -> web.Response:
        return web.Response(body=BODY, content_type="application/json")

    async def chunked(request: web.Request) -> web.StreamResponse:
        return await _stream(request, BODY, {})

    async def gzipped(request: web.Request) -> web.StreamResponse:
        return await _stream(request, bomb, {"Content-Encoding": "gzip"})

    app = web.Application()
    for name, handler in (("announced", announced), ("chunked", chunked), ("gzip", gzipped)):
        app.router.add_post(f"/{name}/retrieve", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"PORT {site._server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())

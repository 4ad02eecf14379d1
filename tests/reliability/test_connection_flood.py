"""A connection flood against the real retrieval service (issue 54): ``memsearch retrieval serve
--max-connections 40`` as a subprocess, and several times that many hostile sockets that hold
connections without finishing a request (slowloris: a request head a header line at a time; a
complete head whose body dribbles; a socket that sends nothing), each reconnecting at once when
the service closes it. Beside them a prober opens a fresh connection per request, as a plain
client (curl, a health check) does, and alternates ``POST /retrieve`` with ``GET /health``.
The service must keep answering the prober (>= 95 % of its requests, every ``/health`` but at
most one), close the hostile sockets, and exit 0 on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import threading
import time

import pytest

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

MAX_CONNECTIONS = 40
FLOOD = 300  # hostile sockets, each reconnecting as soon as it is closed
FLOOD_S = 6.0  # how long the prober runs under the flood
TIMEOUT_S = 5  # the service's timeout_s: how long a slow client may take
WAIT_S = 60


@pytest.fixture(scope="module")
def index(bm25_index):
    return bm25_index


async def _hostile(port: int, kind: str, stop: asyncio.Event, counts: dict[str, int]) -> None:
    """One hostile client: holds a connection without finishing a request, and reconnects at
    once whenever the service closes it."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        counts["connections"] += 1
        try:
            if kind == "slow_body":
                writer.write(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 100000\r\n\r\n{")
            elif kind == "slow_head":
                writer.write(b"POST /retrieve HTTP/1.1\r\nHost: x\r\n")
            while not stop.is_set():
                if kind != "silent":
                    writer.write(b"X-a: b\r\n" if kind == "slow_head" else b" ")
                    await writer.drain()
                try:
                    if await asyncio.wait_for(reader.read(65536), 0.3) == b"":
                        break  # closed by the service
                except TimeoutError:
                    pass
        except OSError:
            pass
        finally:
            counts["closed"] += 1
            writer.close()


def _flood(port: int, stop: threading.Event, counts: dict[str, int]) -> None:
    async def main() -> None:
        done = asyncio.Event()
        kinds = ("slow_head", "slow_body", "silent")
        tasks = [asyncio.create_task(_hostile(port, kinds[i % 3], done, counts)) for i in range(FLOOD)]
        while not stop.is_set():
            await asyncio.sleep(0.05)
        done.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())


def _probe(port: int, path: str) -> bool:
    """One plain request on a fresh connection: True when answered 200 with the expected JSON."""
    if path == "/health":
        head = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    else:
        body = json.dumps({"queries": ["Ed Wood film director"], "topk": 2}).encode()
        head = (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(head)
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
    except OSError:
        return False
    status, _, rest = received.partition(b"\r\n")
    answer = json.loads(rest.partition(b"\r\n\r\n")[2] or b"null") if status.startswith(b"HTTP/1.1 200") else None
    if path == "/health":
        return answer == {"status": "ok"}
    return isinstance(answer, dict) and len(answer["result"][0]) == 2


def test_plain_clients_are_answered_during_a_connection_flood(index, rel):
    started = time.perf_counter()
    server = subprocess.Popen(
        [str(rel.EXE), "retrieval", "serve", "--index", str(index), "--port", "0", "--timeout-s", str(TIMEOUT_S),
         "--max-connections", str(MAX_CONNECTIONS)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    log: list[str] = []
    counts = {"connections": 0, "closed": 0}
    stop = threading.Event()
    probes: dict[str, list[bool]] = {"/retrieve": [], "/health": []}
    try:
        line = server.stdout.readline()
        assert line.startswith("serving on http://127.0.0.1:"), (line, server.stderr.read())
        threading.Thread(target=lambda: log.extend(server.stderr), daemon=True).start()
        port = int(line.strip().rsplit(":", 1)[1])
        flood = threading.Thread(target=_flood, args=(port, stop, counts), daemon=True)
        flood.start()
        time.sleep(1.0)  # the hostile sockets hold every connection before the prober starts
        deadline = time.monotonic() + FLOOD_S
        while time.monotonic() < deadline:
            for path in probes:
                probes[path].append(_probe(port, path))
            time.sleep(0.02)
        stop.set()
        flood.join(WAIT_S)
        alive = server.poll() is None
        server.send_signal(signal.SIGTERM)
        code = server.wait(WAIT_S)
    finally:
        stop.set()
        if server.poll() is None:
            server.kill()
    sent = sum(map(len, probes.values()))
    failed = sum(ok is False for results in probes.values() for ok in results)
    rel.LEDGER.record("connection flood: plain requests (retrieval serve)", runs=sent, lost=failed,
                      wrong_exit=int(not alive or code != 0), seconds=time.perf_counter() - started)
    rate = 1 - failed / max(sent, 1)
    print(f"flood: {counts}, probes {sent}, answered {rate:.1%}, "
          f"health failed {probes['/health'].count(False)} of {len(probes['/health'])}")
    assert sent >= 20, probes
    assert rate >= 0.95, (rate, {k: v.count(False) for k, v in probes.items()}, counts)
    assert probes["/health"].count(False) <= 1, probes["/health"]
    # The flood really held connections past the cap: the service closed many hostile sockets.
    assert counts["closed"] >= FLOOD, counts
    assert alive and code == 0, "".join(log)[-2000:]
    assert "Traceback" not in "".join(log), "".join(log)[-3000:]

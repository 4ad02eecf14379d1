"""Load test of ``memsearch retrieval serve`` on loopback, without and with hostile clients.

    uv run python bench/retrieval_load.py [--requests 5000] [--method bm25|dense] [--index FOLDER]
                                          [--max-seconds 300]

Starts the real service as a subprocess on 127.0.0.1 (an ephemeral port; nothing else is
contacted), twice, fresh each time, over a BM25 index of the shipped HotpotQA dev sample (built in
seconds into a temporary folder; ``--method dense`` for the cached dense index, ``--index`` for
another folder), and sends ``--requests`` requests from 64 concurrent clients: 94 % well-formed
(a dev question with a per-request suffix, so the cache cannot answer them all), 5 % from clients
that disconnect mid-request (half a body, or the whole request and a close before the answer) and
1 % malformed bodies; each run stops at the count or at ``--max-seconds``.

1. **baseline**: that normal load alone;
2. **hostile**: the same normal load with hostile clients running for all of it: a 1 MB query,
   1024 queries x topk 1000, JSON nested 100,000 deep (each must get 400), a well-formed request
   at the limits (1024 queries x topk 16, 200), 48 connections sending a request head one byte a
   second (reopened whenever the server closes one), and clients that send a request at the
   limits and never read the answer. The service runs with ``--timeout-s 5`` (``SERVER_TIMEOUT_S``)
   in both runs, so the slow clients are cut off within a run.

Passes when in both runs every well-formed normal request gets 200 with 5 hits and every malformed
one 400, every hostile request gets its expected status, and the service is alive at the end and
exits 0 on SIGTERM. It reports the normal clients' p99 latency and the server's peak (VmHWM) and
final RSS in each run; the baseline's RSS at the end must be within 10 % of its RSS after warm-up
(the first 10 % of requests). The last line is machine-readable:

    RESULT requests=<n> answered_ok=<fraction, worst run> p99_ms=<baseline> hostile_p99_ms=<hostile> ...
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from retrieval_common import dense_index, dev_dataset

CLIENTS = 64
HOSTILE_TIMEOUT_S = 180  # a hostile request the service does not refuse may take this long
SLOW_CONNECTIONS = 48
# The service's timeout_s in both runs (its default is 30 s): short enough that within a run of
# ~20 s the slow and never-reading clients are cut off and reconnect, as they would over hours.
SERVER_TIMEOUT_S = 5


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """``VmRSS`` (or ``VmHWM``, the peak) of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field}")


async def disconnect(port: int, body: bytes, half: bool) -> None:
    """A client that goes away mid-request: half a body, or a whole request then a close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (f"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    writer.write(head + (body[: len(body) // 2] if half else body))
    await writer.drain()
    writer.close()
    await writer.wait_closed()


async def run(port: int, pid: int, questions: list[str], total: int, max_s: float) -> dict[str, float]:
    import aiohttp

    rng = random.Random(0)
    kinds = ["ok"] * 94 + ["disconnect"] * 5 + ["malformed"]
    plan = [rng.choice(kinds) for _ in range(total)]
    counts = {"ok": 0, "ok_answered": 0, "malformed": 0, "malformed_400": 0, "disconnect": 0, "other": 0}
    latencies: list[float] = []
    warm = {"rss": None}
    todo = iter(enumerate(plan))
    deadline = time.monotonic() + max_s

    async def client(session):
        for i, kind in todo:
            if time.monotonic() > deadline:
                return
            if i == total // 10:
                warm["rss"] = rss_mb(pid)
            body = json.dumps(
                {"queries": [f"{questions[i % len(questions)]} {i // len(questions)}"], "topk": 5}
            ).encode()
            counts[kind] += 1
            if kind == "disconnect":
                await disconnect(port, body, half=i % 2 == 0)
                continue
            payload = body if kind == "ok" else body[: len(body) // 2] + b"}{"
            start = time.perf_counter()
            try:
                async with session.post(
                    f"http://127.0.0.1:{port}/retrieve", data=payload, headers={"Content-Type": "application/json"}
                ) as response:
                    answer = await response.read()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError):
                counts["other"] += 1
                continue
            latencies.append((time.perf_counter() - start) * 1000)
            if kind == "ok" and status == 200 and len(json.loads(answer)["result"][0]) == 5:
                counts["ok_answered"] += 1
            elif kind == "malformed" and status == 400:
                counts["malformed_400"] += 1
            else:
                counts["other"] += 1

    started = time.perf_counter()
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=CLIENTS), timeout=aiohttp.ClientTimeout(total=60)
    ) as session:
        await asyncio.gather(*(client(session) for _ in range(CLIENTS)))
    took = time.perf_counter() - started
    latencies.sort()
    return {
        **counts,
        "sent": sum(counts[k] for k in ("ok", "malformed", "disconnect")),
        "seconds": took,
        "rss_warm_mb": warm["rss"] or rss_mb(pid),
        "rss_end_mb": rss_mb(pid),
        "p99_ms": latencies[int(len(latencies) * 0.99)] if latencies else float("nan"),
    }


def hostile_bodies() -> dict[str, tuple[bytes, int]]:
    """Each hostile request kind: its body and the status the service must answer it with."""
    at_limits = {"queries": [f"hostile at the limits {i}" for i in range(1024)], "topk": 16}
    return {
        "1mb_query": (json.dumps({"queries": ["film " * 200_000]}).encode(), 400),
        "million_hits": (json.dumps({"queries": [f"q{i}" for i in range(1024)], "topk": 1000}).encode(), 400),
        "deep_json": (b"[" * 100_000 + b"]" * 100_000, 400),
        "at_limits": (json.dumps(at_limits).encode(), 200),
    }


def request_bytes(body: bytes) -> bytes:
    return (f"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def hostile(port: int, stop: asyncio.Event, tally: dict[str, collections.Counter]) -> None:
    """Run every hostile client until ``stop``, counting in ``tally`` what each kind got back."""
    import aiohttp

    async def requests(session, kind: str, body: bytes, expected: int) -> None:
        while not stop.is_set():
            try:
                async with session.post(f"http://127.0.0.1:{port}/retrieve", data=body,
                                        headers={"Content-Type": "application/json"}) as response:
                    await response.read()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                status = type(exc).__name__
            tally[kind]["ok" if status == expected else f"got {status}"] += 1

    async def slow_head() -> None:
        while not stop.is_set():
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            try:
                while not stop.is_set():
                    writer.write(b"a")
                    await writer.drain()
                    with contextlib.suppress(TimeoutError):
                        if await asyncio.wait_for(reader.read(1), 1.0) == b"":
                            break  # the server closed it
                else:
                    continue
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()
            tally["slow_head"]["closed by the server"] += 1

    async def never_reads(body: bytes) -> None:
        while not stop.is_set():
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            loop = asyncio.get_running_loop()
            try:
                await loop.sock_connect(sock, ("127.0.0.1", port))
                await loop.sock_sendall(sock, request_bytes(body))
                tally["never_reads"]["sent"] += 1
                waited = 0.0
                while not stop.is_set() and waited < HOSTILE_TIMEOUT_S:
                    await asyncio.sleep(0.5)  # reads nothing: the answer waits in the server
                    waited += 0.5
                    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        break
            except OSError:
                pass
            finally:
                sock.close()

    bodies = hostile_bodies()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HOSTILE_TIMEOUT_S)) as session:
        await asyncio.gather(
            *(requests(session, kind, body, expected) for kind, (body, expected) in bodies.items()),
            *(slow_head() for _ in range(SLOW_CONNECTIONS)),
            never_reads(bodies["at_limits"][0]),
        )


def start_server(index: Path, method: str | None) -> subprocess.Popen:
    command = [sys.executable, "-m", "memsearch.cli.app", "retrieval", "serve", "--index", str(index),
               "--host", "127.0.0.1", "--port", "0", "--timeout-s", str(SERVER_TIMEOUT_S)] + (
                   ["--method", method] if method else [])
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def one_run(index: Path, method: str | None, questions: list[str], total: int, max_s: float,
            with_hostile: bool) -> dict[str, Any]:
    """One fresh server: the normal load, with the hostile clients running beside it or not."""
    server = start_server(index, method)
    stderr: list[str] = []
    r: dict[str, Any] = {"counts": {}}
    try:
        line = server.stdout.readline()
        if "serving on" not in line:
            raise RuntimeError(f"service did not start: {line!r} {server.stderr.read()}")
        # The server's log, read as it comes (a flood of it would fill the pipe and block it).
        threading.Thread(target=lambda: stderr.extend(server.stderr), daemon=True).start()
        port = int(line.strip().rsplit(":", 1)[1])

        async def both() -> tuple[dict[str, float], dict[str, Any]]:
            stop, tally = asyncio.Event(), collections.defaultdict(collections.Counter)
            attack = asyncio.create_task(hostile(port, stop, tally)) if with_hostile else None
            if attack is not None:
                await asyncio.sleep(2)  # every hostile client is at it before the normal load starts
            try:
                normal = await run(port, server.pid, questions, total, max_s)
            finally:
                stop.set()
            if attack is not None:
                # A request the service did not refuse may still be in flight: its tally so far counts.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(attack, 30)
            return normal, {kind: dict(counts) for kind, counts in tally.items()}

        normal, r["hostile"] = asyncio.run(both())
        r.update(normal)
        r["rss_peak_mb"] = rss_mb(server.pid, "VmHWM")
        r["alive"] = server.poll() is None
        if r["alive"]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=60) as response:
                r["counts"] = json.loads(response.read())["counts"]
    finally:
        server.terminate()  # SIGTERM: the graceful path
        r["exit_code"] = server.wait(120)
    r["log_bytes"] = sum(len(x) for x in stderr)
    return r


def bm25_index(documents, folder: Path) -> Path:
    from memsearch.retrieval.index import build_index

    build_index(documents, "bm25", folder)
    return folder


def summary(name: str, r: dict[str, Any]) -> tuple[float, bool]:
    """Print one run's outcome; its answered fraction and whether its normal clients passed."""
    answered = r["ok_answered"] / max(r["ok"], 1)
    print(
        f"{name}: sent {r['sent']} in {r['seconds']:.1f}s ({r['sent'] / r['seconds']:.0f} req/s): {r['ok']} "
        f"well-formed ({r['ok_answered']} answered), {r['malformed']} malformed ({r['malformed_400']} got 400), "
        f"{r['disconnect']} disconnected mid-request, {r['other']} other outcomes; p99 {r['p99_ms']:.0f} ms"
    )
    print(
        f"{name}: server RSS {r['rss_warm_mb']:.0f} MB after warm-up, {r['rss_end_mb']:.0f} MB at the end, peak "
        f"{r['rss_peak_mb']:.0f} MB; log {r['log_bytes']} bytes; alive at the end: {r['alive']}; exit status after "
        f"SIGTERM: {r['exit_code']}"
    )
    ok = r["alive"] and answered == 1.0 and r["malformed_400"] == r["malformed"] and r["exit_code"] == 0
    return answered, ok


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5_000, help="normal requests in each run")
    parser.add_argument("--method", choices=("bm25", "dense"), default="bm25")
    parser.add_argument("--index", type=Path, default=None)
    parser.add_argument("--max-seconds", type=float, default=300, help="of normal load in each run")
    args = parser.parse_args()
    dataset = dev_dataset()
    questions = [t.question for t in dataset.tasks]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="retrieval-load-") as tmp:
        index = args.index
        if index is None:
            index = bm25_index(dataset.documents, Path(tmp) / "bm25") if args.method == "bm25" else (
                dense_index(dataset.documents)[2])
        base = one_run(index, None, questions, args.requests, args.max_seconds, with_hostile=False)
        attacked = one_run(index, None, questions, args.requests, args.max_seconds, with_hostile=True)
    answered, ok = summary("baseline", base)
    hostile_answered, hostile_ok = summary("with hostile clients", attacked)
    growth = base["rss_end_mb"] / base["rss_warm_mb"] - 1
    tallies = attacked["hostile"]
    wrong = sum(n for kind, counts in tallies.items() if kind in hostile_bodies()
                for outcome, n in counts.items() if outcome != "ok")
    sent = sum(sum(counts.values()) for kind, counts in tallies.items() if kind in hostile_bodies())
    for kind, counts in sorted(tallies.items()):
        print(f"  hostile {kind}: {counts}")
    counts = attacked["counts"]
    print(f"  server counts: timeouts {counts.get('timeouts', 0)}, bad requests {counts.get('bad_requests', 0)}, "
          f"evicted connections {counts.get('evicted_connections', 0)}, refused connections "
          f"{counts.get('refused_connections', 0)}, server errors {counts.get('server_errors', 0)}")
    ratio = attacked["p99_ms"] / base["p99_ms"]
    malformed_400 = base["malformed_400"] + attacked["malformed_400"]
    malformed = base["malformed"] + attacked["malformed"]
    passed = ok and hostile_ok and abs(growth) <= 0.10 and wrong == 0 and sent > 0
    print("PASS" if passed else "FAIL")
    print(
        f"RESULT requests={base['sent']} answered_ok={min(answered, hostile_answered):.4f} "
        f"malformed_400={malformed_400}/{malformed} "
        f"disconnects={base['disconnect']} rss_growth={growth:.4f} p99_ms={base['p99_ms']:.0f} "
        f"hostile_p99_ms={attacked['p99_ms']:.0f} p99_ratio={ratio:.2f} rss_peak_mb={base['rss_peak_mb']:.0f} "
        f"hostile_rss_peak_mb={attacked['rss_peak_mb']:.0f} hostile_rss_end_mb={attacked['rss_end_mb']:.0f} "
        f"hostile_requests={sent} hostile_wrong_status={wrong} "
        f"slow_closed={tallies.get('slow_head', {}).get('closed by the server', 0)} "
        f"answer_timeouts={counts.get('timeouts', 0)} log_bytes={attacked['log_bytes']} "
        f"seconds={time.perf_counter() - started:.1f} exit_code={max(base['exit_code'], attacked['exit_code'])}"
    )


if __name__ == "__main__":
    main()

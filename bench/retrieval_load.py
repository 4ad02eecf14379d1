"""Load test of ``memsearch retrieval serve`` on loopback, bounded in count and time.

    uv run python bench/retrieval_load.py [--requests 10000] [--index FOLDER] [--max-seconds 600]

Starts the real service as a subprocess on 127.0.0.1 (an ephemeral port; nothing else is
contacted) over the cached dense index of the shipped HotpotQA dev sample (``--index`` for another
folder), then sends ``--requests`` requests from 64 concurrent clients: 94 % well-formed (dense
search of a dev question with a per-request suffix, so the cache cannot answer them all), 5 % from
clients that disconnect mid-request (half a body, or the whole request and a close before the
answer) and 1 % malformed bodies. It stops at the count or at ``--max-seconds``, whichever comes
first. Passes when the service keeps answering, every well-formed request gets 200, every
malformed one 400, and the server's RSS at the end is within 10 % of its RSS after warm-up (the
first 10 % of requests). The last line is machine-readable:

    RESULT requests=<n> answered_ok=<fraction of well-formed answered> rss_growth=<end/warm-up - 1> ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from retrieval_common import dense_index, dev_dataset

CLIENTS = 64


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


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
            except aiohttp.ClientError:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--index", type=Path, default=None)
    parser.add_argument("--max-seconds", type=float, default=600)
    args = parser.parse_args()
    dataset = dev_dataset()
    questions = [t.question for t in dataset.tasks]
    index = args.index
    if index is None:
        _, _, index = dense_index(dataset.documents)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "memsearch.cli.app",
            "retrieval",
            "serve",
            "--index",
            str(index),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = server.stdout.readline()
        if "serving on" not in line:
            raise RuntimeError(f"service did not start: {line!r}")
        port = int(line.strip().rsplit(":", 1)[1])
        r = asyncio.run(run(port, server.pid, questions, args.requests, args.max_seconds))
        alive = server.poll() is None
    finally:
        server.terminate()  # SIGTERM: the graceful path
        code = server.wait(60)
    growth = r["rss_end_mb"] / r["rss_warm_mb"] - 1
    answered = r["ok_answered"] / max(r["ok"], 1)
    print(
        f"sent {r['sent']} in {r['seconds']:.1f}s ({r['sent'] / r['seconds']:.0f} req/s): {r['ok']} well-formed "
        f"({r['ok_answered']} answered), {r['malformed']} malformed ({r['malformed_400']} got 400), "
        f"{r['disconnect']} disconnected mid-request, {r['other']} other outcomes"
    )
    print(
        f"server RSS {r['rss_warm_mb']:.0f} MB after warm-up, {r['rss_end_mb']:.0f} MB at the end ({growth:+.1%}); "
        f"alive at the end: {alive}; exit status after SIGTERM: {code}; p99 {r['p99_ms']:.0f} ms"
    )
    ok = alive and answered == 1.0 and r["malformed_400"] == r["malformed"] and abs(growth) <= 0.10 and code == 0
    print("PASS" if ok else "FAIL")
    print(
        f"RESULT requests={r['sent']} answered_ok={answered:.4f} malformed_400={r['malformed_400']}/{r['malformed']} "
        f"disconnects={r['disconnect']} rss_growth={growth:.4f} p99_ms={r['p99_ms']:.0f} seconds={r['seconds']:.1f} "
        f"exit_code={code}"
    )


if __name__ == "__main__":
    main()

"""A real OpenAI-compatible HTTP server that answers memsearch's prompts with valid actions
after a fixed delay: a stand-in for a fast model server when testing or benchmarking the
pipeline (concurrency, retries, resume), not a model.

    python -m memsearch.testing.agent_server --port 8011 --delay-ms 200

It reads the role from the prompt wording (``memsearch.engine.prompts``) and answers:
memory decision -> ADD the first new evidence sentence (or NOOP when the budget is low);
summary / overwrite -> the first evidence lines; controller -> SEARCH the question first, then
FINISH; reader -> "Answer: yes" citing the first evidence id in memory. Usage is reported as
whitespace-separated word counts. ``fail_every`` / ``garbage_every`` inject HTTP 500s and
unreadable completions on every n-th request, for fault tests.

Seeded, rate-based faults (the reliability suite, ``tests/reliability``) — ``faults`` maps a
kind to the probability that one request gets it:

    ``"500"``            HTTP 500 with a JSON error body
    ``"429"``            HTTP 429 with ``Retry-After: <retry_after_s>``
    ``"stall"``          no answer for ``stall_s`` (set it above the client's timeout), then the
                         connection is closed without a response
    ``"bad_json"``       HTTP 200 whose body is not JSON
    ``"empty_choices"``  HTTP 200 with ``"choices": []``
    ``"short_body"``     HTTP 200 whose Content-Length is larger than the bytes sent, then close
    ``"drop"``           the connection is closed without any response
    ``"400"``            HTTP 400 with a JSON error body (a request the server refuses: never retried)

    python -m memsearch.testing.agent_server --port 8011 --delay-ms 5 --seed 7 \
        --fault 500=0.05 --fault stall=0.02 --stall-ms 2000 --lifetime-s 300

Which fault a request gets is decided by ``seed``, the SHA-256 of the request body and how many
times that same body was seen before, so a run's fault pattern is reproducible whatever the
order in which concurrent requests arrive, and a retried request draws again. Bounds:
``max_faults`` faults in total (afterwards every request is answered), ``max_faults_per_request``
consecutive faults for one body (so a client with more retries always gets through), and
``lifetime_s``: the server shuts itself down after that many seconds (default 300 s whenever
faults are set; stalls end early on shutdown). It listens on 127.0.0.1 only.
``served_name`` makes it answer ``GET /health`` and list that name at ``GET /v1/models``, so it
can be launched as a service (``serving.started_service`` with a ``command``). ``echo_key=True``
echoes the request's bearer token (the API key) in every completion and in every error body: a
canary key must never reach a run folder. ``fault_counts`` counts the faults served by kind;
``echoed`` counts echoes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_EID = re.compile(r"\[([^\[\]\s]+:\d+)\]")

# Faults a client with retries gets through (the reliability suite draws all of them), and "400":
# a refusal no client retries, for a run that must end with failed tasks.
TRANSIENT_FAULT_KINDS = ("500", "429", "stall", "bad_json", "empty_choices", "short_body", "drop")
FAULT_KINDS = (*TRANSIENT_FAULT_KINDS, "400")


def evidence_lines(prompt: str) -> list[tuple[str, str]]:
    """``(evidence id, sentence)`` of each line of a memory prompt's new evidence, in order."""
    return re.findall(r"^\[([^\]]+:\d+)\] (.+)$", prompt.split("New evidence", 1)[-1], re.MULTILINE)


def add_op(source: str, sentence: str) -> str:
    """A decision-memory batch adding the first 12 words of ``sentence``, citing ``source``."""
    text = " ".join(sentence.split()[:12])
    return json.dumps({"ops": [{"op": "ADD", "text": text, "sources": [source], "kind": "fact"}]})


def answer_for(prompt: str) -> str:
    """The scripted completion for one memsearch prompt."""
    if "Reply with one JSON object only" in prompt:
        lines = evidence_lines(prompt)
        left = re.search(r"Memory budget left: (-?\d+) tokens", prompt)
        if lines and left and int(left.group(1)) > 60:
            if "You do not write facts" in prompt:  # the extractive format: name the sentence only
                return json.dumps({"ops": [{"op": "ADD", "sources": [lines[0][0]]}]})
            return add_op(*lines[0])
        return '{"ops": [{"op": "NOOP"}]}'
    if "Rewrite the notes" in prompt:
        evidence = prompt.split("New evidence", 1)[-1]
        lines = [ln for ln in evidence.splitlines() if ln.startswith("[")][:2]
        return "\n".join(lines) or "nothing new"
    if "Next section:" in prompt:
        section = prompt.split("Next section:", 1)[-1]
        return "memory: " + " ".join(section.split()[:30])
    if "Searches left:" in prompt:
        if "Queries already made:\n(none)" in prompt:
            question = prompt.split("Question: ", 1)[-1].split("\n", 1)[0]
            return f"SEARCH: {question}"
        return "FINISH"
    ids = _EID.findall(prompt.split("Memory:", 1)[-1])
    return "Answer: yes" + (f"\nEvidence: [{ids[0]}]" if ids else "")


def _echo(text: str, key: str) -> str:
    """``text`` carrying ``key`` where the action parser still accepts it: inside the ADD text of
    JSON ops, otherwise on a line of its own at the end."""
    try:
        ops = json.loads(text)
    except ValueError:
        return f"{text}\nkey {key}"
    for op in ops.get("ops", []) if isinstance(ops, dict) else []:
        if op.get("op") == "ADD":
            op["text"] = f"{op['text']} key {key}"
            return json.dumps(ops)
    return json.dumps({**ops, "note": key}) if isinstance(ops, dict) else text


class _Server(ThreadingHTTPServer):
    # The default listen backlog (5) drops bursts of new connections, and a dropped SYN is
    # retried only after a second: far from a fast server.
    request_queue_size = 256
    daemon_threads = True


class AgentServer:
    """The server, on 127.0.0.1; ``start()`` serves from a background thread."""

    def __init__(self, port: int = 0, delay_s: float = 0.2, fail_every: int = 0, garbage_every: int = 0, *,
                 faults: dict[str, float] | None = None, seed: int = 0, retry_after_s: float = 0.05,
                 stall_s: float = 2.0, max_faults: int = 1000, max_faults_per_request: int = 2,
                 lifetime_s: float | None = None, echo_key: bool = False, served_name: str | None = None) -> None:
        self.delay_s, self.fail_every, self.garbage_every = delay_s, fail_every, garbage_every
        self.faults = {k: float(v) for k, v in (faults or {}).items()}
        unknown = sorted(set(self.faults) - set(FAULT_KINDS))
        if unknown:
            raise ValueError(f"unknown fault kind(s) {unknown}; valid: {', '.join(FAULT_KINDS)}")
        if any(not 0.0 <= v <= 1.0 for v in self.faults.values()) or sum(self.faults.values()) > 1.0:
            raise ValueError(f"fault rates must be in [0, 1] and sum to at most 1: {self.faults}")
        self.seed, self.retry_after_s, self.stall_s = seed, retry_after_s, stall_s
        self.max_faults, self.max_faults_per_request = max_faults, max_faults_per_request
        self.lifetime_s = lifetime_s if lifetime_s is not None else (300.0 if self.faults else None)
        self.echo_key = echo_key
        self.served_name = served_name
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.auth_headers: list[str | None] = []
        self.fault_counts: dict[str, int] = {k: 0 for k in FAULT_KINDS}
        self.echoed = 0
        self._seen: dict[str, int] = {}       # body digest -> times seen
        self._streak: dict[str, int] = {}     # body digest -> consecutive faults served
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._timer: threading.Timer | None = None
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes; with Nagle's algorithm on, the body waits
            # for the client's delayed ACK (~40 ms per call), which would swamp the delay.
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, data: bytes, headers: dict[str, str] | None = None,
                      length: int | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data) if length is None else length))
                self.end_headers()
                self.wfile.write(data)

            def _abort(self) -> None:
                # Close the connection with no (or a partial) response.
                self.close_connection = True
                try:
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

            def do_GET(self) -> None:
                # Only with a served name: a server launched as a service must say it is ready
                # (/health) and list what it serves (/v1/models), as the engines do.
                if server.served_name is None or self.path not in ("/health", "/v1/models"):
                    self._send(404, b'{"error": {"message": "not found"}}')
                    return
                listed = {"object": "list", "data": [{"id": server.served_name, "object": "model",
                                                      "owned_by": "memsearch-agent-server"}]}
                self._send(200, json.dumps(listed if self.path == "/v1/models" else {"status": "ok"}).encode())

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                body = json.loads(raw or b"{}")
                auth = self.headers.get("Authorization")
                with server._lock:
                    server.requests += 1
                    n = server.requests
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                    server.auth_headers.append(auth)
                    fault = server._draw_fault(raw)
                key = auth[len("Bearer "):] if server.echo_key and auth and auth.startswith("Bearer ") else ""
                try:
                    time.sleep(server.delay_s)
                    if fault == "drop":
                        self._abort()
                        return
                    if fault == "stall":
                        server._stopping.wait(server.stall_s)
                        self._abort()
                        return
                    if fault in ("500", "429", "400"):
                        status = int(fault)
                        payload = {"error": {"message": f"injected {fault}" + (f" for key {key}" if key else "")}}
                        server._count_echo(key)
                        headers = {"Retry-After": f"{server.retry_after_s:g}"} if fault == "429" else None
                        self._send(status, json.dumps(payload).encode(), headers)
                        return
                    if fault == "bad_json":
                        server._count_echo(key)
                        self._send(200, ('{"choices": [{"message": {"content": "cut ' + key).encode())
                        return
                    status, payload = server._respond(n, body, key)
                    if fault == "empty_choices":
                        payload["choices"] = []
                    data = json.dumps(payload).encode()
                    if fault == "short_body":
                        self._send(status, data[: len(data) // 2], length=len(data))
                        self._abort()
                        return
                    self._send(status, data)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with server._lock:
                        server.in_flight -= 1

        self.httpd = _Server(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread: threading.Thread | None = None

    def _draw_fault(self, raw: bytes) -> str | None:
        """The fault for this request (called under the lock): seeded by the body and how many
        times it was seen, bounded by ``max_faults`` and ``max_faults_per_request``."""
        if not self.faults or self._stopping.is_set():
            return None
        digest = hashlib.sha256(raw).hexdigest()
        seen = self._seen.get(digest, 0)
        self._seen[digest] = seen + 1
        exhausted = sum(self.fault_counts.values()) >= self.max_faults
        if exhausted or self._streak.get(digest, 0) >= self.max_faults_per_request:
            self._streak[digest] = 0
            return None
        draw = random.Random(f"{self.seed}:{digest}:{seen}").random()
        for kind in FAULT_KINDS:
            rate = self.faults.get(kind, 0.0)
            if draw < rate:
                self.fault_counts[kind] += 1
                self._streak[digest] = self._streak.get(digest, 0) + 1
                return kind
            draw -= rate
        self._streak[digest] = 0
        return None

    def _count_echo(self, key: str) -> None:
        if key:
            with self._lock:
                self.echoed += 1

    def _respond(self, n: int, body: dict[str, Any], key: str = "") -> tuple[int, dict[str, Any]]:
        if self.fail_every and n % self.fail_every == 0:
            return 500, {"error": {"message": "scripted failure" + (f" for key {key}" if key else "")}}
        prompt = "\n".join(m.get("content", "") for m in body.get("messages", []))
        text = "I am not sure what to do." if self.garbage_every and n % self.garbage_every == 0 else answer_for(prompt)
        if key:
            text = _echo(text, key)
            self._count_echo(key)
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split())}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        return 200, {"id": f"cmpl-{n}", "object": "chat.completion", "model": body.get("model", "scripted"),
                     "choices": [choice], "usage": usage}

    def start(self) -> AgentServer:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve until ``stop()`` or until ``lifetime_s`` has passed (then it stops itself)."""
        if self.lifetime_s is not None:
            self._timer = threading.Timer(self.lifetime_s, self._expire)
            self._timer.daemon = True
            self._timer.start()
        self.httpd.serve_forever(poll_interval=0.05)

    def _expire(self) -> None:
        self._stopping.set()
        self.httpd.shutdown()

    def stop(self) -> None:
        self._stopping.set()
        if self._timer is not None:
            self._timer.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> AgentServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--delay-ms", type=float, default=200.0)
    parser.add_argument("--fail-every", type=int, default=0)
    parser.add_argument("--garbage-every", type=int, default=0)
    parser.add_argument("--fault", action="append", default=[], metavar="KIND=RATE",
                        help=f"inject a fault at this rate (repeatable); kinds: {', '.join(FAULT_KINDS)}")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault draws")
    parser.add_argument("--retry-after-ms", type=float, default=50.0, help="Retry-After of injected 429s")
    parser.add_argument("--stall-ms", type=float, default=2000.0, help="how long an injected stall lasts")
    parser.add_argument("--max-faults", type=int, default=1000, help="faults in total, then every request is answered")
    parser.add_argument("--max-faults-per-request", type=int, default=2, help="consecutive faults for one request body")
    parser.add_argument("--lifetime-s", type=float, default=None,
                        help="stop after this long (default 300 s when faults are set)")
    parser.add_argument("--echo-key", action="store_true", help="echo the bearer token in completions and error bodies")
    parser.add_argument("--served-name", default=None,
                        help="answer GET /health and list this name at GET /v1/models (as a launched service must)")
    args = parser.parse_args()
    faults = {}
    for item in args.fault:
        kind, _, rate = item.partition("=")
        faults[kind] = float(rate)
    server = AgentServer(args.port, args.delay_ms / 1000, args.fail_every, args.garbage_every, faults=faults,
                         seed=args.seed, retry_after_s=args.retry_after_ms / 1000, stall_s=args.stall_ms / 1000,
                         max_faults=args.max_faults, max_faults_per_request=args.max_faults_per_request,
                         lifetime_s=args.lifetime_s, echo_key=args.echo_key, served_name=args.served_name)
    print(f"serving on {server.base_url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

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
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_EID = re.compile(r"\[([^\[\]\s]+:\d+)\]")


def answer_for(prompt: str) -> str:
    """The scripted completion for one memsearch prompt."""
    if "Reply with one JSON object only" in prompt:
        evidence = prompt.split("New evidence", 1)[-1]
        match = re.search(r"^\[([^\]]+:\d+)\] (.+)$", evidence, re.MULTILINE)
        left = re.search(r"Memory budget left: (-?\d+) tokens", prompt)
        if match and left and int(left.group(1)) > 60:
            text = " ".join(match.group(2).split()[:12])
            return json.dumps({"ops": [{"op": "ADD", "text": text, "sources": [match.group(1)], "kind": "fact"}]})
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


class _Server(ThreadingHTTPServer):
    # The default listen backlog (5) drops bursts of new connections, and a dropped SYN is
    # retried only after a second: far from a fast server.
    request_queue_size = 256
    daemon_threads = True


class AgentServer:
    """The server, on 127.0.0.1; ``start()`` serves from a background thread."""

    def __init__(self, port: int = 0, delay_s: float = 0.2, fail_every: int = 0, garbage_every: int = 0) -> None:
        self.delay_s, self.fail_every, self.garbage_every = delay_s, fail_every, garbage_every
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.auth_headers: list[str | None] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes; with Nagle's algorithm on, the body waits
            # for the client's delayed ACK (~40 ms per call), which would swamp the delay.
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                with server._lock:
                    server.requests += 1
                    n = server.requests
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                    server.auth_headers.append(self.headers.get("Authorization"))
                try:
                    time.sleep(server.delay_s)
                    status, payload = server._respond(n, body)
                    data = json.dumps(payload).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
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

    def _respond(self, n: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.fail_every and n % self.fail_every == 0:
            return 500, {"error": {"message": "scripted failure"}}
        prompt = "\n".join(m.get("content", "") for m in body.get("messages", []))
        text = "I am not sure what to do." if self.garbage_every and n % self.garbage_every == 0 else answer_for(prompt)
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split())}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        return 200, {"id": f"cmpl-{n}", "object": "chat.completion", "model": body.get("model", "scripted"),
                     "choices": [choice], "usage": usage}

    def start(self) -> AgentServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
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
    args = parser.parse_args()
    server = AgentServer(args.port, args.delay_ms / 1000, args.fail_every, args.garbage_every)
    print(f"serving on {server.base_url}", flush=True)
    try:
        server.httpd.serve_forever(poll_interval=0.05)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

"""A threaded HTTP server on a free loopback port, for tests that script what a server answers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextmanager
def loopback_server(handler: type[BaseHTTPRequestHandler], **attributes: Any) -> Iterator[ThreadingHTTPServer]:
    """``handler`` served on 127.0.0.1 from a background thread while inside; the server carries
    ``attributes`` (what its handler reads as ``self.server.NAME``) and ``url`` (``http://host:port``)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    for name, value in attributes.items():
        setattr(httpd, name, value)
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()

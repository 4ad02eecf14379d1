"""Drive the system's headless Chromium over the DevTools protocol (``--remote-debugging-pipe``),
for the report's browser tests and benchmark. No browser download, no network, no extra Python
package: messages are NUL-terminated JSON on file descriptors 3 (to the browser) and 4 (from it).

It lives with the tests, not in the package: only ``tests/report/test_browser.py`` and
``bench/report.py`` use it, both from a clone, and it checks memsearch's own report page rather
than anything a researcher plugs in (unlike ``memsearch.testing``'s servers). Import it as
``tests.support.chromium`` (pytest's importlib mode resolves ``tests`` from the rootdir; a bench
script puts the repository root on ``sys.path`` first).

    with Chromium() as browser:
        page = browser.open(Path("runs/demo/report.html").resolve().as_uri() + "#filter=incorrect")
        page.eval("document.querySelector('[data-testid=task-count]').textContent")
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    """Path of a Chromium binary on PATH, or ``None``."""
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


class Page:
    """One tab, attached with a flat session; collects console errors and uncaught exceptions."""

    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser, self.session, self.console_errors = browser, session, []

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        return self.browser.send(method, params, self.session)

    def eval(self, expression: str, await_promise: bool = True) -> Any:
        """Evaluate JavaScript in the page; return its value (an exception raises ``RuntimeError``)."""
        result = self.send("Runtime.evaluate", expression=expression, awaitPromise=await_promise, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page exception: {json.dumps(result['exceptionDetails'])[:2000]}")
        return result["result"].get("value")

    def screenshot(self, path: Path, width: int = 1400, height: int = 1000) -> Path:
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        data = self.send("Page.captureScreenshot", format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)


class Chromium:
    """A headless Chromium process speaking the DevTools protocol over a pipe."""

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or find_chromium()
        if self.binary is None:
            raise FileNotFoundError("no chromium on PATH (Debian: apt-get install -y chromium)")
        self._id = 0
        self._buffer = b""
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> Chromium:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        self._profile = tempfile.mkdtemp(prefix="memsearch-chromium-")

        def wire() -> None:  # in the child: the protocol's fixed descriptors 3 and 4
            # dup first: either end may already sit on 3 or 4; then mark both inheritable, since
            # dup2 onto the same number keeps close-on-exec.
            a, b = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(a, 3)
            os.dup2(b, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        args = [self.binary, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--no-first-run", "--disable-extensions", "--disable-dev-shm-usage", f"--user-data-dir={self._profile}",
                "--allow-file-access-from-files", "about:blank"]
        self._log = open(os.path.join(self._profile, "chromium.log"), "wb")  # noqa: SIM115 - closed in __exit__
        # Its own process group: the renderer and utility processes are killed with the browser.
        self.proc = subprocess.Popen(args, preexec_fn=wire, close_fds=False, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self._log, start_new_session=True)
        os.close(to_child_r)
        os.close(from_child_w)
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)
        self._log.close()
        # A child that was still writing its profile when killed may leave a file behind for a
        # moment (seen under load: "Directory not empty: 'Default'"): retry briefly.
        for _ in range(50):
            try:
                shutil.rmtree(self._profile)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        shutil.rmtree(self._profile, ignore_errors=True)

    def _read_message(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read_message()
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._record(reply)

    def _record(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        page = self._pages.get(event.get("sessionId")) if hasattr(self, "_pages") else None
        if page is None:
            return
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = params.get("args", [])
            page.console_errors.append(" ".join(str(a.get("value", a.get("description"))) for a in args))
        elif method == "Runtime.exceptionThrown":
            page.console_errors.append(json.dumps(params.get("exceptionDetails"))[:1000])
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            page.console_errors.append(params["entry"].get("text", ""))

    def open(self, url: str, ready: str = "window.__report && window.__report.ready") -> Page:
        """A new tab at ``url``; waits for ``ready`` (a JS expression, awaited) before returning."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self._pages = getattr(self, "_pages", {})
        page = self._pages[session] = Page(self, session)
        for domain in ("Runtime.enable", "Page.enable", "Log.enable"):
            page.send(domain)
        page.send("Page.navigate", url=url)
        # Navigation is asynchronous: poll until the page's own promise exists, then await it.
        page.eval(f"new Promise((ok, ko) => {{ const t0 = Date.now(); (function wait() {{ const r = {ready}; "
                  f"if (r) r.then(ok, ko); else if (Date.now() - t0 > 30000) ko('page never became ready'); "
                  f"else setTimeout(wait, 20); }})(); }})")
        return page

"""Report at scale: build and open a 2,000-task report in headless Chromium.

The 1,000 shipped HotpotQA dev questions, each twice (the copy's id gets a ``-copy`` suffix, so
the folder has 2,000 distinct tasks), run by the rules backend (``configs/rules.toml``, decision
memory); then ``memsearch report view`` and the page in Debian's ``chromium`` over the DevTools
pipe. Measured, not asserted (the target is a filter applied in < 200 ms):

- build_s: building the payload and writing the HTML file;
- html_mb: its size;
- load_ms: navigation start to the first full render (decode + parse + table), in the page;
- filter_ms: ``#filter=incorrect`` applied, re-rendered and laid out, in the page.

Run: uv run python bench/report.py   (about a minute on 2 cores)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from memsearch.assets.samples import HOTPOT_DEV, config_path, samples_dir
from memsearch.config import load_config
from memsearch.data.dataset import save_dataset
from memsearch.data.hotpot import convert_hotpot
from memsearch.eval.runner import run_eval
from memsearch.report.html import write_report

# The Chromium driver lives with the tests (tests/support/chromium.py), imported from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.chromium import Chromium  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="memsearch-bench-report-") as tmp:
        root = Path(tmp)
        records = json.loads((samples_dir() / HOTPOT_DEV).read_text(encoding="utf-8"))
        doubled = records + [{**r, "_id": r["_id"] + "-copy"} for r in records]
        source = root / "hotpot-2000.json"
        source.write_text(json.dumps(doubled), encoding="utf-8")
        data = root / "data"
        save_dataset(convert_hotpot(source, split="dev"), data)
        run = root / "run"
        run_eval(load_config(config_path("rules.toml"), ["concurrency=64"]), data, run, show_progress=False)
        started = time.perf_counter()
        report = write_report([run], data, root / "report.html")
        build_s = time.perf_counter() - started
        html_mb = report.stat().st_size / 1e6
        with Chromium() as browser:
            page = browser.open(report.as_uri())
            tasks = int(page.eval("document.querySelector('[data-testid=task-count]').textContent"))
            load_ms = float(page.eval("document.body.dataset.loadMs"))
            filter_ms = min(float(page.eval("window.__report.apply('filter=incorrect')")) for _ in range(3))
            search_ms = float(page.eval("(() => { const q = document.getElementById('q'); const t = performance.now(); "
                                        "q.value = 'film'; q.dispatchEvent(new Event('input')); "
                                        "void document.body.offsetHeight; return performance.now() - t; })()"))
            errors = page.console_errors
        print(f"tasks={tasks} console_errors={len(errors)} search_ms={search_ms:.1f}")
        print(f"RESULT build_s={build_s:.2f} html_mb={html_mb:.2f} load_ms={load_ms:.0f} filter_ms={filter_ms:.1f}")


if __name__ == "__main__":
    main()

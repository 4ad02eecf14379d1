"""The report as one self-contained HTML file: inline CSS and JavaScript, the payload embedded as
gzip + base64 (the page decodes it with the browser's ``DecompressionStream``), no network.

Deterministic: the same payload gives the same bytes (canonical JSON, gzip with mtime 0), so a
report can be diffed, cached and checked in.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

PAYLOAD_TAG = '<script id="payload" type="application/octet-stream">'
# The template's placeholders (static/report.html); nothing else in the page is one.
PLACEHOLDER = re.compile(r"__(TITLE|CSS|JS|PAYLOAD)__")


def encode_payload(payload: dict[str, Any]) -> str:
    """Canonical JSON, gzip (mtime 0, so no timestamp in the bytes), base64."""
    raw = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode(
        "utf-8"
    )
    return base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")


def decode_payload(text: str) -> dict[str, Any]:
    """The inverse of ``encode_payload`` (what the page does), for tests and tools."""
    return json.loads(gzip.decompress(base64.b64decode(text)).decode("utf-8"))


def _static(name: str) -> str:
    return resources.files("memsearch.report").joinpath("static", name).read_text(encoding="utf-8")


def render_html(payload: dict[str, Any], title: str) -> str:
    """The page: template + CSS + JS + encoded payload, substituted in one pass over the template
    only, so no substituted text (a run folder named ``__JS__`` in the title, a placeholder
    written in the CSS or JS) is ever taken for a placeholder itself."""
    values = {"TITLE": html.escape(title), "CSS": _static("report.css"), "JS": _static("report.js"),
              "PAYLOAD": encode_payload(payload)}
    # A function replacement is inserted literally: no backslash or group expansion of the values.
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], _static("report.html"))


def payload_of_html(page: str) -> dict[str, Any]:
    """The payload embedded in a written report."""
    start = page.index(PAYLOAD_TAG) + len(PAYLOAD_TAG)
    return decode_payload(page[start : page.index("</script>", start)])


def write_report(
    paths: list[Path], data_dir: Path, out: Path, train_logs: list[Path] | None = None, force: bool = False
) -> Path:
    """Build the payload from run folders (and training logs) and write the HTML file.

    An existing ``out`` (a symlink too, even a dangling one) is refused before any work unless
    ``force``; the page is written whole and renamed onto ``out``, so a symlink there is replaced,
    never written through."""
    from memsearch.errors import InputError
    from memsearch.eval.run_folder import replacing
    from memsearch.report.payload import build_payload

    out = Path(out)
    if os.path.lexists(out) and not force:
        raise InputError(f"{out}: already exists; pass --force to replace it, or choose another --out")
    payload = build_payload([Path(p) for p in paths], Path(data_dir), [Path(p) for p in train_logs or []])
    title = " vs ".join(Path(p).name for p in paths)
    out.parent.mkdir(parents=True, exist_ok=True)
    with replacing(out) as tmp:
        tmp.write_text(render_html(payload, title), encoding="utf-8")
    return out

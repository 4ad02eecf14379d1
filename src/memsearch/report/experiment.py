"""An experiment folder (``memsearch experiment run``) as HTML: ``OUT/report.html``, the folder's
``report.md`` as a page, headed by links to the view of each A-D matrix under the folder
(``baseline/matrix``, ``seed-N/matrix``). A view is the report ``memsearch report view`` writes
for a matrix folder (``html.write_report``), saved beside the matrix as ``<matrix>.html``
(``seed-1/matrix.html``), outside the matrix folder itself.

Everything is derived from finished records and rewritten whole on each call (deterministic: the
same folder gives the same bytes), so a resumed experiment simply writes it again. The markdown
read is the subset ``report.md`` is written in: headings, paragraphs, ``- `` lists, pipe tables,
```code``` and ``**bold**``; any other text is shown as it is, escaped.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from memsearch.errors import InputError

PAGE = "report.html"
_HEADING = re.compile(r"(#{1,6}) (.*)")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_TABLE_RULE = re.compile(r"\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?")
_CSS = ("body{font-family:system-ui,sans-serif;margin:2em auto;max-width:80em;padding:0 1em;line-height:1.4}"
        "table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:.2em .5em;"
        "text-align:left}th{background:#f3f3f3}code{background:#f3f3f3;padding:0 .2em}"
        "nav{border:1px solid #ccc;padding:.5em 1em;margin-bottom:1em}")


def matrix_folders(out: Path) -> list[Path]:
    """The finished matrix folders (holding ``matrix.json``) one or two levels under ``out``:
    ``baseline/matrix``, ``seed-N/matrix``, in the order of their paths with seeds by number."""
    found = [p.parent for pattern in ("*/matrix.json", "*/*/matrix.json") for p in Path(out).glob(pattern)
             if p.is_file() and not any(part.startswith(".") for part in p.relative_to(out).parts)]

    def order(folder: Path) -> list[tuple[int, int | str]]:
        parts = re.split(r"(\d+)", folder.relative_to(out).as_posix())
        return [(0, int(p)) if p.isdigit() else (1, p) for p in parts]

    return sorted(found, key=order)


def _inline(text: str) -> str:
    """Escaped text with ```code``` and ``**bold**`` spans."""
    pieces = text.split("`")
    if len(pieces) % 2 == 0:  # an unpaired backtick is text
        pieces[-2:] = [pieces[-2] + "`" + pieces[-1]]
    out = []
    for i, piece in enumerate(pieces):
        escaped = html.escape(piece, quote=False)
        out.append(f"<code>{escaped}</code>" if i % 2 else _BOLD.sub(r"<strong>\1</strong>", escaped))
    return "".join(out)


def _cells(row: str) -> list[str]:
    """The cells of a pipe-table row; a ``|`` inside ```code``` is part of its cell."""
    row = row.strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") and not row.endswith("\\|") else row
    cells, cell, in_code = [], "", False
    for ch in row:
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
    return [*cells, cell.strip()]


def _table(rows: list[str]) -> str:
    head, body = rows[0], rows[2:]
    lines = ["<table>", "<thead><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in _cells(head)) + "</tr></thead>",
             "<tbody>"]
    lines += ["<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in _cells(r)) + "</tr>" for r in body]
    return "\n".join([*lines, "</tbody>", "</table>"])


def _kind(line: str) -> str:
    stripped = line.strip()
    if not stripped:
        return "blank"
    if _HEADING.fullmatch(stripped):
        return "heading"
    return "table" if stripped.startswith("|") else "list" if stripped.startswith("- ") else "text"


def markdown_html(text: str) -> str:
    """The HTML of ``text`` in the markdown subset ``report.md`` uses (module doc)."""
    blocks: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        kind = _kind(lines[i])
        if kind in ("blank", "heading"):
            if match := _HEADING.fullmatch(lines[i].strip()):
                level = len(match.group(1))
                blocks.append(f"<h{level}>{_inline(match.group(2))}</h{level}>")
            i += 1
            continue
        group = []
        while i < len(lines) and _kind(lines[i]) == kind:
            group.append(lines[i].strip())
            i += 1
        if kind == "table" and len(group) > 1 and _TABLE_RULE.fullmatch(group[1]):
            blocks.append(_table(group))
        elif kind == "list":
            blocks.append("<ul>\n" + "\n".join(f"<li>{_inline(g[2:])}</li>" for g in group) + "\n</ul>")
        elif kind == "table":  # pipes without a header rule: lines as they are
            blocks.append("<p>" + "<br>\n".join(_inline(g) for g in group) + "</p>")
        else:
            blocks.append("<p>" + _inline(" ".join(group)) + "</p>")
    return "\n".join(blocks)


def write_experiment_html(out: Path, data_dir: Path) -> Path:
    """Write ``out/report.html`` (``out/report.md`` with links to the matrix views) and the view
    of each matrix under ``out`` (``<matrix>.html``, ``memsearch report view`` of it; ``data_dir``:
    the held-out data folder the matrices ran on, whose fingerprint they recorded). Replaces what
    an earlier call wrote; returns the page's path. ``InputError`` when ``report.md`` is missing or
    a matrix was run on other data."""
    from memsearch.eval.run_folder import replacing
    from memsearch.report.html import write_report

    out = Path(out)
    source = out / "report.md"
    if not source.is_file():
        raise InputError(f"{source}: missing; the experiment's report is written from it")
    links = []
    for matrix in matrix_folders(out):
        view = write_report([matrix], Path(data_dir), matrix.parent / f"{matrix.name}.html", force=True)
        name = matrix.relative_to(out).as_posix()
        href = html.escape(view.relative_to(out).as_posix())
        links.append(f'<li><a href="{href}">{html.escape(name)}</a>: the A-D matrix, episode by episode</li>')
    nav = ("<nav><strong>Views</strong> (self-contained, offline):\n<ul>\n" + "\n".join(links) + "\n</ul></nav>"
           if links else "<nav>No finished matrix under this folder yet.</nav>")
    title = html.escape(f"memsearch experiment: {out.resolve().name}")
    page = (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{title}</title>\n'
            f"<style>{_CSS}</style>\n</head>\n<body>\n{nav}\n"
            f"{markdown_html(source.read_text(encoding='utf-8'))}\n</body>\n</html>\n")
    path = out / PAGE
    with replacing(path) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return path

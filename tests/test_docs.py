"""The documentation points at things that exist.

- every ``docs/design.md §N`` cited in src/, tests/ or docs/ names a section docs/design.md has;
- nothing cites the founding brief, a document outside the repository, by its old name;
- every relative link in README.md and docs/**/*.md, and every repository path quoted in them
  (``configs/…``, ``docs/…``, ``bench/…``, ``scripts/…``, ``data/samples/…``), exists;
- the torch version README.md quotes for the CPU-only install is the one uv.lock pins.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
MARKDOWN = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CITATION = re.compile(r"docs/design\.md §(\d+)")
# Spelled in pieces so this file does not match itself.
OLD_CITATION = re.compile("DESIGN" + r"(\.md\b| §| section \d)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"(?<![\w/.-])((?:configs|docs|bench|scripts|data/samples)/[\w./-]*[\w/])")


def cited_files() -> list[Path]:
    return [p for d in ("src", "tests", "docs") for p in sorted((ROOT / d).rglob("*"))
            if p.is_file() and p.suffix in {".py", ".md", ".toml"}] + [ROOT / "README.md"]


def design_sections() -> set[int]:
    return {int(n) for n in re.findall(r"^## (\d+)\. ", DESIGN.read_text(encoding="utf-8"), re.MULTILINE)}


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.MULTILINE)}


def test_design_has_the_cited_sections():
    sections = design_sections()
    assert set(range(1, 12)) <= sections, sorted(sections)
    bad = [f"{p.relative_to(ROOT)}: §{n}" for p in cited_files()
           for n in CITATION.findall(p.read_text(encoding="utf-8")) if int(n) not in sections]
    assert not bad, f"cite sections that docs/design.md has ({sorted(sections)}): {bad}"


def test_code_cites_the_design_in_the_repository():
    cited = sum(len(CITATION.findall(p.read_text(encoding="utf-8"))) for p in cited_files() if p.suffix == ".py")
    assert cited >= 10  # the code does cite it; the pattern above is not silently matching nothing
    old = [f"{p.relative_to(ROOT)}:{i}" for p in [*cited_files(), *sorted((ROOT / "configs").rglob("*.toml"))]
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if OLD_CITATION.search(line)]
    assert not old, f"cite docs/design.md §N, not a document outside the repository: {old}"


def test_links_and_quoted_paths_exist():
    missing = []
    for md in MARKDOWN:
        text = md.read_text(encoding="utf-8")
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s)/mailto: not checked offline
            file, _, anchor = target.partition("#")
            path = (md.parent / file) if file else md
            if not path.exists():
                missing.append(f"{md.relative_to(ROOT)}: link {target}")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                missing.append(f"{md.relative_to(ROOT)}: link {target} (no such heading)")
        for quoted in REPO_PATH.findall(text):
            if not (ROOT / quoted).exists():
                missing.append(f"{md.relative_to(ROOT)}: {quoted}")
    assert not missing, missing


def test_readme_quotes_the_locked_torch_version():
    lock = tomllib.loads((ROOT / "uv.lock").read_text(encoding="utf-8"))
    locked = {p["name"]: p["version"] for p in lock["package"]}["torch"]
    quoted = re.findall(r"torch==([\w.+]+)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert quoted and set(quoted) == {locked}, (quoted, locked)

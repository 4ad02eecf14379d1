"""The documentation points at things that exist.

- every ``docs/design.md §N`` cited in src/, tests/ or docs/ names a section docs/design.md has;
- nothing cites the founding brief, a document outside the repository, by its old name;
- every relative link in README.md and docs/**/*.md, and every repository path quoted in them
  (``configs/…``, ``docs/…``, ``bench/…``, ``scripts/…``, ``studies/…``, ``data/samples/…``), exists;
- the torch version README.md quotes for the CPU-only install is the one uv.lock pins;
- every ``src/memsearch/….py`` path, every package-relative module path (``train/grpo/trainer.py``) and
  every dotted ``memsearch.x.y`` name quoted in README.md or docs/ exists, so the docs follow code
  moves;
- sizes: README.md at most 14,000 characters; the top-level docs (``docs/*.md``) at most 70,000
  together. The published run records (``docs/results/**``, their READMEs included) are not
  prose under that budget: their tracked files are bounded as a whole, 4 MB.
"""

from __future__ import annotations

import ast
import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
MARKDOWN = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CITATION = re.compile(r"docs/design\.md §(\d+)")
# Spelled in pieces so this file does not match itself.
OLD_CITATION = re.compile("DESIGN" + r"(\.md\b| §| section \d)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"(?<![\w/.-])((?:configs|docs|bench|scripts|studies|data/samples)/[\w./-]*[\w/])")
PACKAGE = ROOT / "src" / "memsearch"
SOURCE_PATH = re.compile(r"(?<![\w/.-])(src/memsearch/[\w/]+\.py)\b")
# A module path relative to the package, quoted in backticks: `train/grpo/trainer.py`, `backends/hf/model.py`.
PACKAGE_PATH = re.compile(r"`([a-z_]+(?:/[a-z_]+)+\.py)`")
DOTTED = re.compile(r"(?<![\w./-])(memsearch(?:\.[A-Za-z_]\w*)+)")
README_MAX_CHARS = 14_000
TOP_DOCS_MAX_CHARS = 70_000
RESULTS_MAX_BYTES = 4_000_000


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


def defined_names(module: Path) -> set[str]:
    """Top-level names a module defines or imports (read with ``ast``, nothing imported)."""
    names = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def module_file(dotted: str) -> Path | None:
    """The file of a ``memsearch.…`` module (a package's ``__init__.py``), or None."""
    path = ROOT / "src" / Path(*dotted.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def dotted_name_exists(dotted: str) -> bool:
    """A module, or a module and a name it defines (``memsearch.assets.adapter.verify_adapter``)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        module = module_file(".".join(parts[:cut]))
        if module is not None:
            rest = parts[cut:]
            return not rest or rest[0] in defined_names(module)
    return False


def test_quoted_modules_and_source_paths_exist():
    missing = []
    for md in MARKDOWN:
        text = md.read_text(encoding="utf-8")
        where = md.relative_to(ROOT)
        missing += [f"{where}: {p}" for p in SOURCE_PATH.findall(text) if not (ROOT / p).is_file()]
        missing += [f"{where}: {p}" for p in PACKAGE_PATH.findall(text)
                    if not (PACKAGE / p).is_file() and not (ROOT / p).is_file()]
        missing += [f"{where}: {d}" for d in DOTTED.findall(text) if not dotted_name_exists(d.rstrip("."))]
    assert not missing, f"the docs quote modules or files the code no longer has: {missing}"


def test_the_check_sees_a_moved_module():
    assert dotted_name_exists("memsearch.eval.run_diff") and dotted_name_exists("memsearch.cli.app")
    assert dotted_name_exists("memsearch.assets.adapter.verify_adapter")
    assert not dotted_name_exists("memsearch.eval.no_such_module")
    assert not dotted_name_exists("memsearch.assets.adapter.no_such_function")
    assert PACKAGE_PATH.findall("see `train/grpo/trainer.py` and `hf.py`") == ["train/grpo/trainer.py"]
    assert SOURCE_PATH.findall("in src/memsearch/text/answers.py:") == ["src/memsearch/text/answers.py"]


def test_readme_and_docs_stay_within_their_size():
    readme = len((ROOT / "README.md").read_text(encoding="utf-8"))
    assert readme <= README_MAX_CHARS, f"README.md has {readme} characters; move detail to docs/ (once)"
    top = {p.name: len(p.read_text(encoding="utf-8")) for p in sorted((ROOT / "docs").glob("*.md"))}
    assert sum(top.values()) <= TOP_DOCS_MAX_CHARS, f"docs/*.md have {sum(top.values())} characters: {top}"


def results_files() -> list[Path]:
    """The files under docs/results that git tracks (every file there when git cannot say)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "docs/results"], cwd=ROOT, capture_output=True,
                                check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        return [p for p in (ROOT / "docs" / "results").rglob("*") if p.is_file()]
    return [ROOT / name for name in listed if name and (ROOT / name).is_file()]


def test_published_results_stay_small():
    files = results_files()
    total = sum(p.stat().st_size for p in files)
    largest = sorted(files, key=lambda p: p.stat().st_size)[-3:]
    assert files and total <= RESULTS_MAX_BYTES, (
        f"docs/results holds {total} bytes; keep what a README cites, gzip per-question metrics: "
        f"{[str(p.relative_to(ROOT)) for p in largest]}")

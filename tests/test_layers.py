"""Imports point down the layers (docs/design.md §11).

Every module of ``src/memsearch`` belongs to one layer; a module may import from its own layer and
from any layer below, never from one above. The check reads the source with ``ast`` (imports at
module level and inside functions alike, since a lazy import is still a dependency), so it needs
no import of the package and no heavy dependency. A new module must be given a layer here, which
is the point: where a module sits is a decision, written down in docs/design.md §11.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "memsearch"

# Bottom first. A module's layer is the one of its longest listed prefix.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("memsearch", "memsearch.errors", "memsearch.io", "memsearch.config", "memsearch.config.strict",
                    "memsearch.devices",
                    "memsearch.tokenizer", "memsearch.assets", "memsearch.text", "memsearch.records")),
    ("data", ("memsearch.data",)),
    ("memory/retrieval", ("memsearch.memory", "memsearch.retrieval")),
    ("backends", ("memsearch.backends",)),
    ("engine", ("memsearch.engine",)),
    ("eval", ("memsearch.eval",)),
    ("train", ("memsearch.train",)),
    ("pipelines", ("memsearch.pipelines", "memsearch.report", "memsearch.integrations", "memsearch.serving",
                   "memsearch.experiment")),
    ("entry points", ("memsearch.cli", "memsearch.retrieval.server", "memsearch.testing")),
]

# (importer, imported) pairs allowed to point up, each with the reason it is there.
KNOWN_EXCEPTIONS: set[tuple[str, str]] = {
    # The built-in backend kinds and memory modes, registered in the foundation so that a config
    # is checked (its kind, its keys, schema mode, answer format) without importing any backend or
    # the engine; each factory is a "module:attribute" string imported only when a run builds one.
    ("memsearch.registry", "memsearch.backends.rules"),
    ("memsearch.registry", "memsearch.backends.hf.backend"),
    ("memsearch.registry", "memsearch.backends.openai"),
    ("memsearch.registry", "memsearch.backends.oracle"),
    ("memsearch.registry", "memsearch.engine.memory_modes"),
}
# Edges of one layer that close an import cycle and are left out of the cycle check, each with
# the reason: a factory string, imported only when used, breaks the cycle at run time.
LAZY_CYCLE_EDGES: set[tuple[str, str]] = {
    # a backend kind's default settings model; config.backend validates kinds through the registry
    ("memsearch.registry", "memsearch.config.backend"),
}


def layer_of(module: str) -> int | None:
    """Index of the module's layer in ``LAYERS`` (longest matching prefix), ``None`` if unlisted."""
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def package_modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under ``root``."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


# A factory named as a string ("memsearch.backends.rules:from_config", registry.load_factory) is
# imported where it is used: an arrow like an import statement.
FACTORY_STRING = re.compile(r"^(memsearch(?:\.\w+)+):[\w.]+$")


def imported_modules(module: str, source: str, is_package: bool, known: set[str]) -> set[str]:
    """``memsearch`` modules that ``source`` imports anywhere in its body (relative imports
    resolved; ``from pkg import name`` counts as ``pkg.name`` when that is a module; a
    ``"module:attribute"`` factory string counts as an import of its module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and FACTORY_STRING.match(node.value):
            found.add(FACTORY_STRING.match(node.value).group(1))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in known)
    return {name for name in found if name == "memsearch" or name.startswith("memsearch.")}


def upward_imports(modules: dict[str, Path]) -> list[str]:
    """``importer -> imported (layer -> layer)`` for every import that points up."""
    known = set(modules)
    bad = []
    for module, path in modules.items():
        here = layer_of(module)
        for target in sorted(
            imported_modules(module, path.read_text(encoding="utf-8"), path.name == "__init__.py", known)
        ):
            there = layer_of(target)
            if here is not None and there is not None and there > here and (module, target) not in KNOWN_EXCEPTIONS:
                bad.append(f"{module} -> {target} ({LAYERS[here][0]} -> {LAYERS[there][0]})")
    return bad


def test_every_module_has_a_layer():
    unlisted = [m for m in package_modules() if layer_of(m) is None]
    assert not unlisted, f"give these modules a layer in LAYERS (and in docs/design.md §11): {unlisted}"


def test_imports_point_down():
    bad = upward_imports(package_modules())
    assert not bad, "imports pointing up the layers (docs/design.md §11):\n" + "\n".join(bad)


def test_known_exceptions_still_exist():
    # An exception that no longer occurs must go, or it would silently allow the import back.
    modules = package_modules()
    known = set(modules)
    stale = [
        (a, b)
        for a, b in KNOWN_EXCEPTIONS | LAZY_CYCLE_EDGES
        if a not in modules
        or b not in imported_modules(a, modules[a].read_text(encoding="utf-8"), modules[a].name == "__init__.py", known)
    ]
    assert not stale, f"remove these from KNOWN_EXCEPTIONS, the imports are gone: {stale}"


def test_the_check_sees_lazy_and_relative_imports(tmp_path):
    # The checker itself: an import inside a function, a relative import and a "module:attribute"
    # factory string all count.
    pkg = tmp_path / "memsearch"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / "__init__.py").write_text("")
    (pkg / "data" / "records.py").write_text("def f():\n    from memsearch.eval import metrics\n")
    (pkg / "data" / "hotpot.py").write_text("from ..engine.parsing import x\nfrom . import records\n"
                                            "FACTORY = 'memsearch.eval.metrics:score'\n")
    (pkg / "eval").mkdir()
    (pkg / "eval" / "__init__.py").write_text("")
    (pkg / "eval" / "metrics.py").write_text("from memsearch.data import records\n")
    (pkg / "engine").mkdir()
    (pkg / "engine" / "__init__.py").write_text("")
    (pkg / "engine" / "parsing.py").write_text("")
    assert upward_imports(package_modules(pkg)) == [
        "memsearch.data.hotpot -> memsearch.engine.parsing (data -> engine)",
        "memsearch.data.hotpot -> memsearch.eval.metrics (data -> eval)",  # a factory named as a string
        "memsearch.data.records -> memsearch.eval (data -> eval)",
        "memsearch.data.records -> memsearch.eval.metrics (data -> eval)",
    ]


def import_cycles(modules: dict[str, Path]) -> list[list[str]]:
    """Every strongly connected component of more than one module in the import graph (lazy
    imports included; ``KNOWN_EXCEPTIONS`` and ``LAZY_CYCLE_EDGES`` left out), each sorted: a cycle of any
    length shows up as one component."""
    known = set(modules)
    graph = {
        m: sorted(
            t
            for t in imported_modules(m, p.read_text(encoding="utf-8"), p.name == "__init__.py", known)
            if t in known and t != m and not m.startswith(t + ".") and (m, t) not in KNOWN_EXCEPTIONS | LAZY_CYCLE_EDGES
        )
        for m, p in modules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_no_import_cycles():
    # A package's __init__ importing its own modules is not a cycle (the edge to a parent is dropped).
    cycles = import_cycles(package_modules())
    assert not cycles, f"modules that import each other (directly or through others): {cycles}"


def test_the_cycle_check_finds_a_long_cycle(tmp_path):
    pkg = tmp_path / "memsearch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from memsearch import b\n")
    (pkg / "b.py").write_text("def f():\n    import memsearch.c\n")
    (pkg / "c.py").write_text("from memsearch.a import x\n")
    (pkg / "d.py").write_text("from memsearch import a\n")
    assert import_cycles(package_modules(pkg)) == [["memsearch.a", "memsearch.b", "memsearch.c"]]


# The engine runs any backend through the protocol: it may build one through the registry
# (``memsearch.backends``) but imports no particular backend.
ENGINE_MAY_IMPORT = {"memsearch.backends", "memsearch.backends.base"}


def test_the_engine_imports_no_particular_backend():
    modules = package_modules()
    known = set(modules)
    engine = [name for name, prefixes in LAYERS].index("engine")
    bad = [f"{m} -> {t}" for m, p in modules.items() if layer_of(m) == engine
           for t in imported_modules(m, p.read_text(encoding="utf-8"), p.name == "__init__.py", known)
           if (t == "memsearch.backends" or t.startswith("memsearch.backends.")) and t not in ENGINE_MAY_IMPORT]
    assert not bad, f"the engine imports a particular backend (use the protocol, backends.base): {bad}"


def test_nothing_in_the_library_imports_a_study():
    # studies/ holds experiments on top of the library (docs/design.md §11); never the other way.
    bad = []
    for module, path in package_modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{module} -> {n}" for n in names if n == "studies" or n.startswith("studies.")]
    assert not bad, bad


def test_studies_use_only_public_names_of_the_library():
    # A study measures what the library does through its public names: a private one (a leading
    # underscore) may change under it with no warning.
    bad = []
    for path in sorted((ROOT / "studies").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("memsearch"):
                bad += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                        if a.name.startswith("_")]
    assert not bad, bad


# Keys only a trajectory, one of its events or an observation has: code under src/ reads these
# records by attribute (memsearch.records); only the record modules read their JSON by key.
RECORD_KEYS = (
    "events", "policy_calls", "memory_final", "memory_sources", "memory_cited", "shown_evidence", "reader_text",
    "invalid_citations", "answer_format", "invalid_cause", "invalid_reason", "completion_ids", "prompt_ids",
    "constraint_id", "branches", "branch_chosen", "kept_before", "cited_before", "sources_before", "executed",
    "memory_items", "memory_text", "budget_left", "item_texts", "sources_shown", "past_queries", "searches_left",
    "evidence_tokens", "cut_sentences",
)
RECORD_KEY_READ = re.compile(r"""(?:\[|\.get\(|\.pop\(|\bin\s+)["'](%s)["']""" % "|".join(RECORD_KEYS))
# Modules that read JSON of these names that is not a trajectory, with the reason.
RECORD_KEY_READERS: dict[str, str] = {
    "memsearch/records": "the records' own to_json / from_json",
    "memsearch/train/sft/row_selection.py": "export-sft rows (train.sft.export) carry memory_sources: not a trajectory",
}


def test_no_module_reads_a_trajectory_or_an_observation_by_key():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if any(rel.startswith(prefix) for prefix in RECORD_KEY_READERS):
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if (match := RECORD_KEY_READ.search(line)) and not line.lstrip().startswith("#"):
                found.append(f"{rel}:{lineno}: {match.group(0)}")
    assert not found, "read these records by attribute (memsearch.records):\n" + "\n".join(found)


# Keys only an eval run's summary has: code reads a summary through records.run_summary.RunSummary.
SUMMARY_KEYS = ("metric_counts", "evaluator_version", "prompt_version", "denominators", "data_build", "backend_stats",
                "entailment_evaluated", "truncation", "context_truncated", "usable_for_comparison", "memory_backend")
SUMMARY_KEY_READ = re.compile(r"""(?:\[|\.get\(|\.pop\(|\bin\s+)["'](%s)["']""" % "|".join(SUMMARY_KEYS))
# Modules that read JSON of these names that is not a summary, with the reason.
SUMMARY_KEY_READERS: dict[str, str] = {
    "memsearch/records": "the records' own to_json / from_json",
    "memsearch/backends/openai.py": "its own request counters (context_truncated calls)",
    "memsearch/pipelines/memory_policy/report.py": "the report's own rows and held-out rows (report.json)",
    "memsearch/pipelines/memory_policy/heldout.py": "the held-out comparison's own rows (heldout/summary.json)",
    "memsearch/pipelines/memagent/report.py": "the report's own rows (report.json)",
    "memsearch/pipelines/demo.py": "the matrix result (matrix.json), not a run summary",
    "memsearch/cli/eval.py": "the matrix result (matrix.json), not a run summary",
    "memsearch/experiment/run.py": "the baseline matrix result (matrix.json), not a run summary",
    "studies/memory_policy/published.py": "the held-out comparison's rows (heldout/summary.json)",
}
# Reading a train log line by line as JSON; every module reads it as TrainStep records instead.
TRAIN_LOG_READ = re.compile(r"\bread_log\(|iter_jsonl\([^)]*train_log")
TRAIN_LOG_READERS: dict[str, str] = {
    "memsearch/train/log.py": "read_log itself",
    "memsearch/report/training.py": "curves of every numeric key, where an absent key is no point (its module doc)",
    "memsearch/pipelines/memory_policy/report.py": "plot_curves: a panel per key name, through report.training",
}


def _key_reads(pattern: re.Pattern[str], allowed: dict[str, str]) -> list[str]:
    found = []
    for path in [*sorted(PACKAGE.rglob("*.py")), *sorted((ROOT / "studies").rglob("*.py"))]:
        rel = path.relative_to(PACKAGE.parent if path.is_relative_to(PACKAGE) else ROOT).as_posix()
        if any(rel.startswith(prefix) for prefix in allowed):
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if (match := pattern.search(line)) and not line.lstrip().startswith("#"):
                found.append(f"{rel}:{lineno}: {match.group(0)}")
    return found


def test_no_module_reads_an_eval_summary_by_key():
    found = _key_reads(SUMMARY_KEY_READ, SUMMARY_KEY_READERS)
    assert not found, "read eval summaries by attribute (records.run_summary.RunSummary):\n" + "\n".join(found)


# Keys only a metrics row has: code reads a metrics.jsonl line through records.metrics_row.MetricsRow.
METRICS_ROW_KEY_READ = re.compile(
    r"""(?:\[|\.get\(|\.pop\(|\bin\s+)["'](truncated_by_chunk_limit|context_truncated_by_role|context_truncated_calls)["']""")


def test_no_module_reads_a_metrics_row_by_key():
    found = _key_reads(METRICS_ROW_KEY_READ, {"memsearch/records": "the record's own to_json / from_json"})
    assert not found, "read metrics rows by attribute (records.metrics_row.MetricsRow):\n" + "\n".join(found)


def test_no_module_reads_a_train_log_as_raw_json():
    found = _key_reads(TRAIN_LOG_READ, TRAIN_LOG_READERS)
    assert not found, "read train logs through records.train_step.read_train_log:\n" + "\n".join(found)


def test_the_key_checks_see_a_raw_read():
    # The checks themselves: a summary key read and a raw train-log read are found.
    assert SUMMARY_KEY_READ.search('if not s["usable_for_comparison"]:')
    assert SUMMARY_KEY_READ.search("summary.get('evaluator_version')")
    assert not SUMMARY_KEY_READ.search("summary.usable_for_comparison")
    assert TRAIN_LOG_READ.search('rows = [r for _, r in iter_jsonl(run / "train_log.jsonl")]')
    assert TRAIN_LOG_READ.search("steps = read_log(path)")
    assert not TRAIN_LOG_READ.search("steps = read_train_log(path)")
    assert METRICS_ROW_KEY_READ.search('cut = sum(1 for r in rows if r["truncated_by_chunk_limit"])')
    assert not METRICS_ROW_KEY_READ.search("cut = sum(1 for r in rows if r.truncated_by_chunk_limit)")

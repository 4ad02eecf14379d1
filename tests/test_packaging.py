"""The package installs on every Python it claims (issue 11 item 17).

CI runs 3.11 only, so a lock that silently lost 3.12/3.13 would go unnoticed until a GPU user
with a newer interpreter tried ``uv sync``. These checks read pyproject.toml and uv.lock as
files: no network, no second interpreter.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUPPORTED = ("3.11", "3.12", "3.13")


def _lock() -> dict:
    return tomllib.loads((ROOT / "uv.lock").read_text(encoding="utf-8"))


def _allows(spec: str, version: str) -> bool:
    """True when a ``>=a, <b`` style specifier admits ``version`` (major.minor)."""
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(spec).contains(version + ".0")


def test_pyproject_and_lock_admit_every_supported_python():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lock = _lock()
    for version in SUPPORTED:
        assert _allows(project["requires-python"], version), (project["requires-python"], version)
        assert _allows(lock["requires-python"].replace(" ", ""), version), (lock["requires-python"], version)
    # The development interpreter stays the one the machines have.
    assert (ROOT / ".python-version").read_text().strip() == "3.11"


def test_every_locked_binary_only_package_has_a_wheel_for_each_supported_python():
    """A package locked without an sdist must ship a wheel each interpreter can install:
    a cpXY wheel, an abi3 wheel, or a pure-Python one."""
    missing = []
    for pkg in _lock()["package"]:
        if "sdist" in pkg or not pkg.get("wheels"):
            continue  # buildable from source, or the project itself
        names = [w["url"].rsplit("/", 1)[1] for w in pkg["wheels"]]
        for version in SUPPORTED:
            tag = "cp" + version.replace(".", "")
            if not any(re.search(rf"-({tag}|py3|py2\.py3)-|-abi3-", n) for n in names):
                missing.append(f"{pkg['name']} {pkg['version']}: no wheel for Python {version}")
    assert not missing, "\n".join(missing)

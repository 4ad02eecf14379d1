"""The package installs and works as installed.

Every Python it claims: CI runs 3.11 only, so a lock that silently lost 3.12/3.13 would go
unnoticed until a GPU user with a newer interpreter tried ``uv sync``. These checks read
pyproject.toml and uv.lock as files: no network, no second interpreter.

The wheel: built offline, installed into a fresh virtual environment with nothing from the
checkout's ``src/``, and run from a folder outside the checkout, so ``memsearch walkthrough`` and
``memsearch demo`` must find their samples, configs and adapter in the package itself.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

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


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def test_the_distribution_name_is_not_the_unrelated_memsearch_and_metadata_is_read_by_it():
    """``memsearch`` on the package index is another project: this one is ``memsearch-rl``, and
    every read of installed metadata uses that name (memsearch.DISTRIBUTION), not the import name."""
    from importlib.metadata import version

    import memsearch
    from memsearch.eval.runner import software_versions

    assert _project()["name"] == memsearch.DISTRIBUTION == "memsearch-rl"
    assert software_versions()["memsearch"] == version(memsearch.DISTRIBUTION) == memsearch.__version__
    by_import_name = [f"{path.relative_to(ROOT)}:{i}" for path in sorted((ROOT / "src").rglob("*.py"))
                      for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                      if re.search(r"""(version|distribution|metadata)\(["']memsearch["']\)""", line)]
    assert not by_import_name, by_import_name


def transformers_floor() -> str:
    """The lower bound of pyproject's ``transformers`` requirement (it must have exactly one, ``>=``)."""
    from packaging.requirements import Requirement

    (req,) = [r for r in map(Requirement, _project()["dependencies"]) if r.name == "transformers"]
    (spec,) = req.specifier
    assert spec.operator == ">=", req
    return spec.version


def test_ci_tests_the_transformers_floor_that_pyproject_declares():
    """.ci/run reads the floor from pyproject.toml (one source) and runs the hf backend's check on
    exactly that version; the floor is no newer than any transformers the lock resolves."""
    from packaging.version import Version

    floor = transformers_floor()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    (reader,) = re.findall(r'^floor=\$\(uv run python -c "(.+)"\)$', ci, flags=re.M)
    done = subprocess.run([sys.executable, "-c", reader], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == floor
    assert re.search(r'MEMSEARCH_EXPECT_TRANSFORMERS="\$floor" uv run [^\n]*--with "transformers==\$floor"[^\n]*'
                     r"tests/test_transformers_floor\.py", ci), "the floor step of .ci/run changed"
    locked = [p["version"] for p in _lock()["package"] if p["name"] == "transformers"]
    assert locked and all(Version(v) >= Version(floor) for v in locked), (floor, locked)


def test_the_training_doc_quotes_the_locked_torch_and_its_cuda_version():
    """docs/training.md says which torch build the lock pins (and so which NVIDIA driver it needs):
    the torch version and the CUDA runtime major.minor it names are the lock's."""
    text = " ".join((ROOT / "docs" / "training.md").read_text(encoding="utf-8").split())
    quoted = re.search(r"pins PyPI's torch ([\d.]+) built for CUDA (\d+\.\d+)", text)
    assert quoted, "docs/training.md no longer says which torch build uv.lock pins"
    locked = {p["name"]: p["version"] for p in _lock()["package"]}
    cuda = ".".join(locked["nvidia-cuda-runtime"].split(".")[:2])
    assert quoted.groups() == (locked["torch"], cuda)


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 600) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    """A fresh venv holding only the built wheel; the dependencies come from the project's .venv
    through a .pth line (that folder has no memsearch package: the checkout's is an editable
    path the venv never reads). Returns (venv, a working folder outside the checkout, its env)."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    root = tmp_path_factory.mktemp("wheel")
    _run([uv, "build", "--wheel", "--offline", "--out-dir", str(root / "dist")], cwd=ROOT)
    (wheel,) = (root / "dist").glob("memsearch_rl-*.whl")
    venv = root / "venv"
    _run([uv, "venv", "--offline", "--python", sys.executable, str(venv)], cwd=root)
    python = venv / "bin" / "python"
    _run([uv, "pip", "install", "--offline", "--no-deps", "--python", str(python), str(wheel)], cwd=root)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([str(python), "-c", purelib], cwd=root).strip())
    (site / "project_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    work = root / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "MEMSEARCH_SAMPLES", "MEMSEARCH_MEMORY_POLICY_ADAPTER", "VIRTUAL_ENV")}
    return venv, work, env


@pytest.mark.slow
def test_the_installed_wheel_reads_its_own_package_data(installed_wheel):
    venv, work, env = installed_wheel
    probe = (
        "import json, memsearch\n"
        "from memsearch.assets.samples import config_path, repository_root, samples_dir\n"
        "from memsearch.assets.adapter import shipped_adapter_dir, verify_adapter\n"
        "verify_adapter(shipped_adapter_dir(), base_model='embedded', required=True)\n"
        "print(json.dumps({'package': memsearch.__file__, 'root': repository_root(), 'samples': str(samples_dir()),\n"
        "                  'config': str(config_path('rules.toml')), 'adapter': str(shipped_adapter_dir())}))\n"
    )
    seen = json.loads(_run([str(venv / "bin" / "python"), "-c", probe], cwd=work, env=env).strip().splitlines()[-1])
    assert seen["root"] is None, seen
    for key in ("package", "samples", "config", "adapter"):
        assert Path(seen[key]).is_relative_to(venv), (key, seen[key])
        assert not Path(seen[key]).is_relative_to(ROOT), (key, seen[key])
    assert Path(seen["samples"]).name == "samples" and Path(seen["samples"]).parent.name == "data"


@pytest.mark.slow
def test_the_installed_walkthrough_and_rules_demo_run_outside_the_checkout(installed_wheel):
    venv, work, env = installed_wheel
    cli = str(venv / "bin" / "memsearch")
    out = _run([cli, "walkthrough"], cwd=work, env=env)
    (run,) = (work / "runs").glob("walkthrough-*")
    assert (run / "summary.json").is_file() and (run / "index").is_dir(), out[-2000:]
    out = _run([cli, "demo", "--backend", "rules", "--limit", "1"], cwd=work, env=env)
    (demo,) = (work / "runs").glob("demo-*")
    assert (demo / "matrix" / "matrix.md").is_file() and (demo / "report.html").is_file(), out[-2000:]
    assert "rules.toml" in out


"""run.json names the memsearch code that ran (issue 55): the git commit of the checkout the
package runs from and whether its files differ from it, else the installed version. Real git
repositories in temporary folders."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import memsearch
from memsearch.config import load_config
from memsearch.eval.provenance import _version as memsearch_version
from memsearch.eval.provenance import package_source, source_identity
from memsearch.eval.runner import run_eval

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
ROOT = Path(__file__).resolve().parents[2]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout.strip()


def _repo(tmp_path: Path) -> Path:
    """A repository whose src/pkg holds a package, committed."""
    repo = tmp_path / "repo"
    (repo / "src" / "pkg").mkdir(parents=True)
    (repo / "src" / "pkg" / "__init__.py").write_text("X = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    return repo


def test_a_checkout_gives_its_commit_and_dirty_flag(tmp_path):
    repo = _repo(tmp_path)
    package = repo / "src" / "pkg"
    clean = package_source(package)
    assert clean | {"version": None} == {"kind": "git", "commit": _git(repo, "rev-parse", "HEAD"), "dirty": False,
                                          "version": None}
    (package / "__init__.py").write_text("X = 2\n")  # the code that runs is no longer the commit
    assert package_source(package)["dirty"] is True
    _git(repo, "checkout", "-q", "--", ".")
    (package / "new.py").write_text("")  # an untracked module of the package counts too
    assert package_source(package)["dirty"] is True
    (package / "new.py").unlink()
    (repo / "notes.txt").write_text("")  # outside the package: not the code that ran
    assert package_source(package)["dirty"] is False


def test_a_copy_git_does_not_track_is_an_installed_distribution(tmp_path):
    repo = _repo(tmp_path)
    # An installed copy inside some repository's virtual environment is not that repository's commit.
    site = repo / ".venv" / "lib" / "site-packages" / "pkg"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("X = 1\n")
    outside = tmp_path / "elsewhere" / "pkg"
    outside.mkdir(parents=True)
    for folder in (site, outside):
        got = package_source(folder)
        assert (got["kind"], got["commit"], got["dirty"]) == ("distribution", None, None)


def test_run_json_records_the_source_of_this_process(hotpot_dev_dir, tmp_path):
    run_eval(load_config(ROOT / "configs" / "rules.toml", ["limit=1"]), hotpot_dev_dir, tmp_path / "run",
             show_progress=False)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["memsearch_source"] == source_identity()
    package = Path(memsearch.__file__).resolve().parent
    if run["memsearch_source"]["kind"] == "git":  # run from this checkout
        assert run["memsearch_source"]["commit"] == _git(package, "rev-parse", "HEAD")
    else:
        assert run["memsearch_source"]["version"] == memsearch_version()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["memsearch_source"] == run["memsearch_source"]

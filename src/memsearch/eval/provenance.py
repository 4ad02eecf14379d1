"""Which memsearch code made a record: the git commit of the checkout it runs from, else the
installed distribution's version. Recorded in every eval run's ``run.json`` beside the data and
model fingerprints; pipelines and trainers may record it too (this is the eval layer: below them).

    source_identity()
    # {"kind": "git", "commit": "daf7ce7...", "dirty": False, "version": "0.4.0"}
    # {"kind": "distribution", "commit": None, "dirty": None, "version": "0.4.0"}  (an installed wheel)

The package counts as running from a checkout only when git tracks its own ``__init__.py`` there:
an installed copy inside some other repository's virtual environment is not that repository's
commit. ``dirty`` is true when the package's files differ from the commit (changes, staged or not,
and untracked files under the package folder): the code that ran is then not the commit alone.
Git is asked with a timeout; no git, or any failure, falls back to the distribution version.
"""

from __future__ import annotations

import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

import memsearch
from memsearch import DISTRIBUTION

_GIT_TIMEOUT_S = 10.0


def _git(cwd: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True,
                              timeout=_GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _version() -> str | None:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def source_identity() -> dict[str, Any]:
    """The memsearch code of this process (module doc); computed once per process."""
    return package_source(Path(memsearch.__file__).resolve().parent)


def package_source(package: Path) -> dict[str, Any]:
    """``source_identity`` of the package folder ``package`` (module doc), asked now."""
    version = _version()
    if _git(package, "rev-parse", "--show-toplevel"):
        tracked = _git(package, "ls-files", "--", "__init__.py")
        commit = _git(package, "rev-parse", "HEAD")
        status = _git(package, "status", "--porcelain", "--untracked-files=normal", "--", ".")
        if tracked and commit and status is not None:
            return {"kind": "git", "commit": commit, "dirty": bool(status), "version": version}
    return {"kind": "distribution", "commit": None, "dirty": None, "version": version}

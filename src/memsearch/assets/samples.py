"""Where the files memsearch ships are: the real data samples (``data/samples``), the configs the
code loads by name (``configs/``) and, through ``adapter.py``, the trained memory-policy adapter.

Each shipped resource is named by its path in the repository (``"data/samples"``). A wheel
carries it as package data under ``memsearch/assets/`` at that same path (pyproject.toml,
``[tool.hatch.build.targets.wheel.force-include]``), so an installed package reads its own copy;
a source checkout (``uv run``, an editable install) has no such copy and reads the repository's
top-level folder, which tests, docs and the README point at. ``shipped_path`` is the one place
that decides between the two.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

SAMPLES_ENV = "MEMSEARCH_SAMPLES"
SAMPLES = "data/samples"
# The configs ``config_path`` is called with inside the package (``pipelines/demo.py``); the wheel
# carries exactly these. The others in configs/ name their data and adapter by paths relative to
# a clone, so they are only meaningful there.
SHIPPED_CONFIGS = ("demo.toml", "rules.toml")

HOTPOT_DEV = "hotpotqa/dev_distractor_sample.json"
HOTPOT_TRAIN = "hotpotqa/train_sample.json"
# 619 train questions: HOTPOT_TRAIN's 100 first, then 519 more (provenance per record in
# train_extended.sources.tsv; hotpotqa/SOURCE.md): the memory-policy recipe's training data.
HOTPOT_TRAIN_EXTENDED = "hotpotqa/train_extended.json"
MUSIQUE_DEV = "musique/musique_ans_dev_sample.json"
MUSIQUE_TRAIN = "musique/musique_ans_train_sample.json"


def repository_root() -> Path | None:
    """The source checkout this package is imported from, or ``None`` for an installed wheel."""
    # src/memsearch/assets/samples.py -> the checkout is three folders above the package.
    here = Path(__file__).resolve()
    root = here.parents[3]
    if here.parents[2].name == "src" and (root / "pyproject.toml").is_file():
        return root
    return None


def packaged_path(relative: str) -> Path:
    """Where a wheel keeps the shipped resource ``relative``: ``memsearch/assets/<relative>``."""
    # A regular (unzipped) install, which is what pip and uv produce, gives a real folder.
    return Path(str(importlib.resources.files("memsearch"))) / "assets" / relative


def shipped_path(relative: str) -> Path:
    """The shipped file or folder ``relative`` (its path in the repository, e.g. ``"data/samples"``):
    the installed package's copy when it has one, else the source checkout's.

    Not checked beyond that choice: when neither exists the checkout's path is returned from a
    checkout (so a tool may create it there) and the package's otherwise; callers say what is
    missing with ``missing_message``."""
    packaged = packaged_path(relative)
    if packaged.exists():
        return packaged
    root = repository_root()
    return root / relative if root is not None else packaged


def missing_message(path: Path, what: str, env: str | None = None) -> str:
    """Why a shipped resource at ``path`` was not found, and what to do about it."""
    hint = f" or set {env} to a copy" if env else ""
    if repository_root() is None:
        return (f"{path}: {what} not found; an installed memsearch carries it as package data, so this "
                f"installation is incomplete: reinstall the wheel{hint}")
    return f"{path}: {what} not found in this checkout; restore it from git{hint}"


def samples_dir() -> Path:
    """``MEMSEARCH_SAMPLES`` if set, else the shipped ``data/samples`` (package data, or the
    checkout's folder)."""
    override = os.environ.get(SAMPLES_ENV)
    path = Path(override) if override else shipped_path(SAMPLES)
    if not path.is_dir():
        raise FileNotFoundError(missing_message(path, "shipped samples", SAMPLES_ENV))
    return path


def config_path(name: str) -> Path:
    """A config shipped in ``configs/`` (e.g. ``"demo.toml"``). An installed wheel carries only
    ``SHIPPED_CONFIGS``; every config is there in a source checkout."""
    path = shipped_path(f"configs/{name}")
    if path.is_file():
        return path
    if repository_root() is None and name not in SHIPPED_CONFIGS:
        raise FileNotFoundError(
            f"configs/{name}: ships only with a clone of the memsearch repository (an installed package "
            f"carries {', '.join(SHIPPED_CONFIGS)}); run from a clone or pass the file's path")
    raise FileNotFoundError(missing_message(path, "shipped config"))

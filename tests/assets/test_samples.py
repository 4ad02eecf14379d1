"""Where shipped files are found (memsearch.assets.samples): the checkout's folders from a clone,
the package's copy when installed, the environment variables first, and errors that say which
case failed. The wheel itself is built and installed in tests/test_packaging.py."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from memsearch.assets import samples
from memsearch.assets.adapter import SHIPPED_ADAPTER, shipped_adapter_dir
from memsearch.assets.samples import (
    HOTPOT_DEV,
    HOTPOT_TRAIN,
    HOTPOT_TRAIN_EXTENDED,
    MUSIQUE_DEV,
    MUSIQUE_TRAIN,
    SAMPLES,
    SAMPLES_ENV,
    SHIPPED_CONFIGS,
    config_path,
    repository_root,
    samples_dir,
    shipped_path,
)

ROOT = Path(__file__).resolve().parents[2]


def force_include() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return project["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]


@pytest.fixture
def installed(monkeypatch, tmp_path):
    """The module as an installed wheel sees it: no checkout, package data under ``tmp_path``."""
    monkeypatch.delenv(SAMPLES_ENV, raising=False)
    monkeypatch.setattr(samples, "repository_root", lambda: None)
    monkeypatch.setattr(samples, "packaged_path", lambda relative: tmp_path / "memsearch" / "assets" / relative)
    return tmp_path / "memsearch" / "assets"


def test_from_the_checkout_every_resource_is_the_repository_folder(monkeypatch):
    monkeypatch.delenv(SAMPLES_ENV, raising=False)
    assert repository_root() == ROOT
    assert samples_dir() == ROOT / "data" / "samples"
    assert config_path("api.toml") == ROOT / "configs" / "api.toml"
    assert shipped_path(SHIPPED_ADAPTER) == ROOT / "models" / "memory-policy-cpu"


def test_the_samples_variable_wins_and_a_missing_folder_names_it(monkeypatch, tmp_path):
    monkeypatch.setenv(SAMPLES_ENV, str(tmp_path))
    assert samples_dir() == tmp_path
    monkeypatch.setenv(SAMPLES_ENV, str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path / 'absent'}: shipped samples not found.*{SAMPLES_ENV}"):
        samples_dir()


def test_an_installed_package_reads_its_own_copy(installed):
    (installed / SAMPLES).mkdir(parents=True)
    (installed / "configs").mkdir()
    (installed / "configs" / "rules.toml").write_text("", encoding="utf-8")
    (installed / SHIPPED_ADAPTER).mkdir(parents=True)
    assert samples_dir() == installed / SAMPLES
    assert config_path("rules.toml") == installed / "configs" / "rules.toml"
    assert shipped_adapter_dir() == installed / SHIPPED_ADAPTER


def test_an_installed_package_says_a_clone_only_config_needs_a_clone(installed):
    with pytest.raises(FileNotFoundError, match=r"configs/api.toml: ships only with a clone"):
        config_path("api.toml")


def test_an_incomplete_installation_says_so(installed):
    with pytest.raises(FileNotFoundError, match="shipped samples not found; an installed memsearch carries it"):
        samples_dir()
    with pytest.raises(FileNotFoundError, match="shipped config not found; an installed memsearch carries it"):
        config_path("demo.toml")


def test_the_wheel_carries_each_shipped_resource_at_its_repository_path():
    mapping = force_include()
    expected = [SAMPLES, SHIPPED_ADAPTER, *(f"configs/{name}" for name in SHIPPED_CONFIGS)]
    assert sorted(mapping) == sorted(expected)
    for source, target in mapping.items():
        assert target == f"memsearch/assets/{source}", (source, target)
        assert (ROOT / source).exists(), source
    # The samples travel with their origin, licences and citations.
    for notice in ("README.md", "hotpotqa/SOURCE.md", "musique/SOURCE.md"):
        assert (ROOT / SAMPLES / notice).is_file(), notice
    for sample in (HOTPOT_DEV, HOTPOT_TRAIN, HOTPOT_TRAIN_EXTENDED, MUSIQUE_DEV, MUSIQUE_TRAIN):
        assert (ROOT / SAMPLES / sample).is_file(), sample
    assert (ROOT / SHIPPED_ADAPTER / "fingerprint.json").is_file()


def test_every_config_the_package_loads_by_name_is_shipped():
    from memsearch.pipelines.demo import DEMO_CONFIGS

    assert set(DEMO_CONFIGS.values()) <= set(SHIPPED_CONFIGS)
    literal = re.compile(r"config_path\(\s*[\"']([^\"']+)[\"']")
    for path in (ROOT / "src" / "memsearch").rglob("*.py"):
        for name in literal.findall(path.read_text(encoding="utf-8")):
            assert name in SHIPPED_CONFIGS, f"{path}: config_path({name!r}) is not in SHIPPED_CONFIGS"


def test_the_extended_train_set_is_real_train_data_that_shares_nothing_with_dev(tmp_path):
    """619 HotpotQA train questions, the 100 of the small sample first, each record's origin in the
    sources table; converted with split = train it validates, and no id or question is shared with
    the dev sample, the 7405 dev questions or a prepared dev folder (``data validate --against``)."""
    import csv
    import json

    from memsearch.data.dataset import save_dataset
    from memsearch.data.hotpot import convert_hotpot
    from memsearch.data.validate import normalize_question, validate_data

    folder = ROOT / SAMPLES
    extended = json.loads((folder / HOTPOT_TRAIN_EXTENDED).read_text(encoding="utf-8"))
    small = json.loads((folder / HOTPOT_TRAIN).read_text(encoding="utf-8"))
    assert len(extended) == 619 and extended[:100] == small
    with open(folder / "hotpotqa" / "train_extended.sources.tsv", encoding="utf-8", newline="") as fh:
        written = {r["_id"] for r in csv.DictReader(fh, delimiter="\t") if r["role"] == "written"}
    assert written == {r["_id"] for r in extended}  # every record says where it was copied from
    dev = json.loads((folder / HOTPOT_DEV).read_text(encoding="utf-8"))
    dev_all = json.loads((folder / "hotpotqa" / "dev_distractor_qa_only_all.json").read_text(encoding="utf-8"))
    questions = {normalize_question(r["question"]) for r in extended}
    assert not questions & {normalize_question(r["question"]) for r in dev + dev_all}
    assert not {r["_id"] for r in extended} & {r["_id"] for r in dev}  # the 7405 carry no _id
    save_dataset(convert_hotpot(folder / HOTPOT_TRAIN_EXTENDED, split="train"), tmp_path / "train")
    save_dataset(convert_hotpot(folder / HOTPOT_DEV, split="dev", limit=300), tmp_path / "dev")
    assert validate_data(tmp_path / "train", against=tmp_path / "dev") == []

"""The project's own configs are written in the current spelling (issue 65): the loaders read the
earlier spellings of keys and tables (``train.config_keys.upgrade_grpo_keys``: flat GRPO fields,
``credit = "..."``, ``invalid_penalty``, role ``overwrite``; a pipeline's ``EARLIER_TABLE_NAMES``:
``[train]``, ``[stage2.train]``; the flat backend form of ``config.backend``), so a published
config in an earlier one would still load, and be copied as the way to write one.

A file is checked through its own loader: every key it writes must be a field of the validated
model at the same place (an earlier spelling is not: the loader moved or dropped it), and no
``role`` may use an earlier role name. The study configs that keep the layout they were
registered in (the records of what ran) are listed with the reason, and must still be in that
layout, so the list never outlives its reason.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from memsearch.config import RunConfig, load_config, merge_tables, read_config_file
from memsearch.experiment.config import load_experiment
from memsearch.pipelines.memagent.config import MemAgentPipeline
from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline
from memsearch.train.config import GRPOConfig, SFTConfig
from memsearch.train.config_keys import upgrade_grpo_keys
from memsearch.train.rows import EARLIER_ROLE_NAMES

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("configs", "studies", "scripts", "tests")

# Published study configs kept in the layout they were registered in: each is the record of a
# run published under docs/results (studies/protocols.toml names its results folder), and the
# tests that read them say so (tests/studies/test_ablation_configs.py ``current_spelling``;
# tests/train/test_config_keys.py reads v3 as a published config in the earlier spelling).
_REGISTERED = "a registered study's config, kept in the layout it ran in (studies/protocols.toml)"
EARLIER_SPELLING_RECORDS: dict[str, str] = {
    "studies/memory_policy/configs/memory_policy_cpu_v2.toml":
        f"{_REGISTERED}; PROTOCOL.md: seed 1's stages 'were made by this exact config (the stage fingerprints)'",
    "studies/memory_policy/configs/memory_policy_cpu_v3.toml":
        f"{_REGISTERED}; PROTOCOL.md: 'made by this exact resolved config (the stage fingerprints)'; "
        "tests/train/test_config_keys.py overrides it in its own spelling",
    "studies/memory_policy/configs/ablations/cold_start.toml":
        f"{_REGISTERED}; its README: the copied stages' input fingerprints equal this config's",
    "studies/memory_policy/configs/ablations/no_sources.toml":
        f"{_REGISTERED}; its README: the copied prepare stage's fingerprint matches",
    "studies/memory_policy/configs/ablations/stage2_control.toml":
        f"{_REGISTERED}; ablation-stage2-base-start/README.md: its records are the recipe's (same fingerprints)",
    "studies/memory_policy/configs/ablations/open_items.toml": _REGISTERED,
    "studies/memory_policy/configs/ablations/search_cost.toml": _REGISTERED,
}
# TOML files that are no config of a loader with earlier spellings.
NOT_CONFIGS = {"studies/protocols.toml": "the registry of study protocols (studies/protocols.py)"}

PIPELINES: dict[str, type[BaseModel]] = {"memagent": MemAgentPipeline, "memory-policy": MemoryPolicyPipeline}


def published_tomls() -> list[Path]:
    """Every TOML under FOLDERS but those in a results folder (what ran is recorded as it ran)."""
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.toml")
                  if not any(part.startswith("results") for part in p.relative_to(ROOT).parts))


def earlier_keys(raw: Any, value: Any, where: str = "") -> list[str]:
    """Keys of ``raw`` (a file's tables) in an earlier spelling, as dotted paths: a key that is no
    field of the validated model at its place (``value``), a table written as a value (the flat
    ``credit = "share"``), a ``role`` with an earlier name."""
    found = []
    if isinstance(value, BaseModel) and not isinstance(raw, dict):
        return [f"{where} (a {type(value).__name__} table written as a value)"]
    if not (isinstance(value, BaseModel) and isinstance(raw, dict)):
        return found
    fields = type(value).model_fields
    for key, below in raw.items():
        at = f"{where}.{key}" if where else key
        if key not in fields:
            found.append(f"{at} (no field of {type(value).__name__})")
            continue
        if key == "role" and isinstance(below, str) and below in EARLIER_ROLE_NAMES:
            found.append(f"{at} = {below!r} (now {EARLIER_ROLE_NAMES[below]!r})")
        found += earlier_keys(below, getattr(value, key), at)
    return found


def config_model(raw: dict[str, Any]) -> type[BaseModel]:
    """The model a config file's tables are read as, by its content."""
    if "pipeline" in raw:
        return PIPELINES[raw["pipeline"]]
    if "role" in raw and "data" in raw:  # a trainer config (memsearch train grpo | sft)
        return SFTConfig if "eval_config" in raw or "micro_batch_rows" in raw else GRPOConfig
    return RunConfig


def earlier_spellings(path: Path) -> list[str]:
    """What ``path`` (a config file) writes in an earlier spelling, each as a dotted key path."""
    raw = read_config_file(path)
    if "recipe" in raw or "profile" in raw:  # an experiment config (memsearch experiment run)
        return experiment_earlier_keys(path, raw)
    return earlier_keys(raw, load_config(path, [], model=config_model(raw)))


def experiment_earlier_keys(path: Path, raw: dict[str, Any]) -> list[str]:
    """An experiment config's own tables, each profile's, and every ``[recipe.override]`` read as
    tables of the pipeline config it overrides."""
    profiles = raw.get("profile", {})
    checks = [("", {k: v for k, v in raw.items() if k != "profile"}, None),
              *((f"profile.{name}", table, name) for name, table in profiles.items())]
    found = []
    for where, tables, profile in checks:
        cfg = load_experiment(path, profile=profile)
        found += [f"{where}.{key}" if where else key for key in earlier_keys(tables, cfg)]
        override = (tables.get("recipe") or {}).get("override")
        if override:
            pipeline_tables = merge_tables(read_config_file(ROOT / cfg.recipe.pipeline), override)
            pipeline = PIPELINES[pipeline_tables["pipeline"]].model_validate(pipeline_tables)
            at = f"{where}.recipe.override" if where else "recipe.override"
            found += [f"{at}.{key}" for key in earlier_keys(override, pipeline)]
    return found


SET_FLAG = re.compile(r"--set\s+([\w.]+)=")
ROLE_FLAG = re.compile(r"--role\s+(\S+)")


def script_earlier_spellings(path: Path) -> list[str]:
    """Config keys a shell script writes in an earlier spelling: a ``--set`` key a GRPO config
    reads as another (``upgrade_grpo_keys``; a pipeline's ``grpo.`` table too), a ``--role`` with
    an earlier name."""
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        for key in SET_FLAG.findall(code):
            parts = key.removeprefix("stage2.").removeprefix("grpo.").split(".")
            probe: Any = "value"
            for part in reversed(parts):
                probe = {part: probe}
            if upgrade_grpo_keys(probe) != probe:
                found.append(f"line {number}: --set {key}")
        for role in ROLE_FLAG.findall(code):
            if shlex.split(role)[0] in EARLIER_ROLE_NAMES:
                found.append(f"line {number}: --role {role} (now {EARLIER_ROLE_NAMES[role]})")
    return found


def test_every_published_config_is_written_in_the_current_spelling():
    checked, earlier = [], {}
    for path in published_tomls():
        name = path.relative_to(ROOT).as_posix()
        if name in NOT_CONFIGS or name in EARLIER_SPELLING_RECORDS:
            continue
        checked.append(name)
        if found := earlier_spellings(path):
            earlier[name] = found
    assert "configs/train/grpo_gpu.toml" in checked and "configs/experiment.example.toml" in checked
    assert not earlier, ("published configs in an earlier spelling; write them the current way (the loader's "
                         "upgrade moves these keys) or list a record of what ran in EARLIER_SPELLING_RECORDS: "
                         f"{earlier}")


def test_the_listed_records_exist_and_are_still_in_their_earlier_spelling():
    """An entry whose file was rewritten in the current spelling (or removed) goes from the list."""
    for name in (*EARLIER_SPELLING_RECORDS, *NOT_CONFIGS):
        assert (ROOT / name).is_file(), name
    assert {name for name in EARLIER_SPELLING_RECORDS if not earlier_spellings(ROOT / name)} == set()


def test_the_scripts_pass_current_keys_and_role_names():
    scripts = sorted((ROOT / "scripts").rglob("*.sh"))
    assert scripts
    earlier = {p.relative_to(ROOT).as_posix(): found for p in scripts if (found := script_earlier_spellings(p))}
    assert not earlier, f"scripts passing earlier spellings: {earlier}"


EARLIER = {
    "flat GRPO field": ('role = "memory"\ndata = "x"\nclip_low = 0.1\n', GRPOConfig, "clip_low"),
    "flat credit": ('role = "memory"\ndata = "x"\ncredit = "share"\n', GRPOConfig, "credit (a CreditSettings"),
    "renamed penalty": ('role = "memory"\ndata = "x"\n[reward]\ninvalid_penalty = 0.5\n', GRPOConfig,
                        "reward.invalid_penalty"),
    "earlier role": ('role = "overwrite"\ndata = "x"\n[episode.agent]\nevidence = "stream"\nmemory = "overwrite"\n'
                     'controller = "exhaust"\n', GRPOConfig, "role = 'overwrite' (now 'memagent')"),
    "flat backend key": ('[backends.reader]\nkind = "rules"\nmodel = "embedded"\n', RunConfig,
                         "backends.reader.model (no field of RulesSettings)"),
}


@pytest.mark.parametrize("case", sorted(EARLIER))
def test_an_earlier_spelling_is_found_and_named(tmp_path, case):
    text, model, named = EARLIER[case]
    path = tmp_path / "earlier.toml"
    path.write_text(text, encoding="utf-8")
    assert config_model(read_config_file(path)) is model
    found = earlier_spellings(path)
    assert any(named in key for key in found), found


def test_an_earlier_table_name_of_a_published_pipeline_is_found(tmp_path):
    """A copy of the MemAgent recipe with its trainer table under the earlier name [train]."""
    recipe = (ROOT / "configs" / "memagent.toml").read_text(encoding="utf-8")
    assert earlier_spellings(ROOT / "configs" / "memagent.toml") == []
    copy = tmp_path / "memagent.toml"
    copy.write_text(re.sub(r"^\[grpo(\.|\])", r"[train\1", recipe, flags=re.MULTILINE), encoding="utf-8")
    assert earlier_spellings(copy) == ["train (no field of MemAgentPipeline)"]


def test_a_script_with_an_earlier_role_or_key_is_found(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text('memsearch verl export-data --data d --out o --role overwrite\n'
                      'memsearch verl config --config c --set clip_low=0.1 --set loss.clip_high=0.3\n',
                      encoding="utf-8")
    assert script_earlier_spellings(script) == ["line 1: --role overwrite (now memagent)", "line 2: --set clip_low"]

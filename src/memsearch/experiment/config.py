"""The settings file of ``memsearch experiment run`` (``configs/experiment.example.toml``).

It names what a node changes and nothing else: the data sources (``[data]``), the models
(``[models]``), the GPUs (``[devices]``), the model servers (``[services.reader]``, the frozen
reader; ``[services.stage1]``, each seed's trained stage 1 deployed) and the recipe: a
memory-policy pipeline config (``[recipe] pipeline``) with ``[recipe.override]`` tables over it,
never a second copy of its tables. The fields the experiment fills in the pipeline config itself
(``OWNED``: the model, the downloaded data, the layout, the served reader and stage 1) are
refused in the overrides.

A ``[profile.NAME]`` table holds overrides of this file selected with ``--profile NAME``
(``[profile.cpu]`` of the example: the embedded model, `transformers serve`, a few questions):
merged over the file's tables key by key before ``--set`` (an empty table, e.g. ``services = {}``,
replaces the file's), so one file serves the GPU node and the CPU check.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from memsearch.config import (
    KeyProblems,
    StrictConfig,
    apply_overrides,
    config_check,
    config_from_tables,
    read_config_file,
)
from memsearch.config.locate import Where, file_locator, locate_problems
from memsearch.devices import DeviceLayout
from memsearch.errors import InputError
from memsearch.serving import ServiceSpec
from memsearch.serving.engines import LORA_ENGINES

HOTPOT_TRAIN_URL = "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_train_v1.1.json"
HOTPOT_DEV_URL = "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json"
SERVICES = ("reader", "stage1")
# Pipeline fields the experiment sets itself (dotted); an override of one (or of a table above
# one) would be silently replaced, so it is refused naming where the setting belongs.
OWNED = {
    "pipeline": "the recipe file's own",
    "model": "[models] policy",
    "data": "[data]",
    "devices": "[devices]",
    "stage1_serving": "the experiment (stage 1 is deployed: 'http')",
    "episode.backends.reader": "[services.reader] (the reader is the served model)",
    "stage2.memory_serving": "the experiment (stage 2 reads the deployed stage 1: 'http')",
    "stage2.memory_url": "[services.stage1]",
    "stage2.memory_model": "[services.stage1]",
    "stage2.serve_port": "[services.stage1] port",
    "stage2.serve_args": "[services.stage1] extra_args",
    "stage2.serve_start_timeout_s": "[services.stage1] start_timeout_s",
}
_SHA256 = re.compile(r"[0-9a-f]{64}")


class ExperimentData(StrictConfig):
    """Where the HotpotQA files come from (fetched into ``OUT/data``) and how many questions."""

    train: str = Field(HOTPOT_TRAIN_URL, description="HotpotQA train file: an http(s):// or file:// URL or a local "
                       "path (default: the official train set); fetched resumably into OUT/data")
    dev: str = Field(HOTPOT_DEV_URL, description="HotpotQA dev file (distractor setting), the held-out questions "
                     "come from: URL or local path (default: the official dev-distractor set)")
    train_sha256: str | None = Field(None, description="Expected SHA-256 of the train file (64 lowercase hex); a "
                                     "file with another is refused. Unset: the fetched file's is recorded")
    dev_sha256: str | None = Field(None, description="Expected SHA-256 of the dev file; as train_sha256")
    train_questions: int | None = Field(None, ge=1, description="Train questions (the first N of the file); "
                                        "unset: the recipe's data.train_questions")
    dev_questions: int | None = Field(None, ge=1, description="Held-out questions (the first N of the dev file); "
                                      "unset: the recipe's data.dev_questions")
    val_questions: int | None = Field(None, ge=0, description="Validation questions (the next N of the dev file) "
                                      "for GRPO's periodic evaluation; unset: the recipe's data.val_questions")

    @config_check
    def _hex_digests(self, context: dict[str, Any]) -> None:
        bad = [(key, f"{value!r}: expected 64 lowercase hex digits (a SHA-256)")
               for key in ("train_sha256", "dev_sha256")
               if (value := getattr(self, key)) is not None and not _SHA256.fullmatch(value)]
        if bad:
            raise KeyProblems(*bad)


class Models(StrictConfig):
    """The policy model (trained, and the untrained A/C baseline) and the frozen reader."""

    policy: str = Field(..., description="The base model every stage trains and the summary groups A/C keep "
                        "untrained: 'embedded', a local Hugging Face folder, or a hub id (org/name) fetched into "
                        "cache_dir when missing")
    reader: str = Field(..., description="The frozen reader [services.reader] serves: 'embedded', a local folder "
                        "or a hub id, as policy")
    cache_dir: str = Field("models", description="Where hub ids are fetched (cache_dir/org/name), with "
                           "huggingface_hub; a folder already there is used as it is")


class ReaderService(ServiceSpec):
    """The frozen reader's server (``[services.reader]``)."""

    model: str | None = Field(None, description="What the server loads; unset: the [models] reader folder "
                              "(set it for llama.cpp, which loads a GGUF file)")


class Stage1Service(ServiceSpec):
    """How each seed's trained stage 1 is deployed (``[services.stage1]``): stage 2 trains against
    it, the held-out grpo row and B/D run on it. As a LoRA adapter (``stage1-seedN``) where the
    engine serves adapters: on the reader's own server when it is a vLLM on the policy model (loaded
    while it runs), else on a server of this table on the policy model; merged
    (``OUT/seed-N/merged1``) on a server of this table otherwise."""

    model: str | None = Field(None, description="Set by the experiment (the policy model, or each seed's "
                              "OUT/seed-N/merged1); leave unset")
    serve_as: Literal["auto", "adapter", "merged"] = Field(
        "auto", description="adapter: stage 1's LoRA adapter, no merged copy served (vllm, sglang; on the "
        "reader's server when it is a vllm on the policy model); merged: the merged folder on a server of its "
        "own (any engine but llama.cpp); auto: adapter where the engine serves adapters, else merged")

    @config_check
    def _deployable(self, context: dict[str, Any]) -> None:
        problems = []
        if self.model is not None:
            problems.append(("model", "set by the experiment (each seed's merged stage-1 folder); remove it"))
        if self.serve_as == "adapter" and self.engine not in LORA_ENGINES:
            problems.append(("serve_as", "'adapter' needs an engine that serves LoRA adapters "
                             f"({', '.join(LORA_ENGINES)}); engine is {self.engine!r}: set serve_as = 'merged'"))
        if self.engine == "llama.cpp" and self.command is None:
            problems.append(("engine", "llama.cpp serves GGUF files, and stage 1 is a merged Hugging Face folder; "
                             "choose vllm, sglang or transformers"))
        if problems:
            raise KeyProblems(*problems)


class Services(StrictConfig):
    """The model servers the experiment starts and stops."""

    reader: ReaderService = Field(..., description="The frozen reader, up from the start to the end")
    stage1: Stage1Service = Field(..., description="Each seed's stage 1, up from its merge to its matrix")


class Recipe(StrictConfig):
    """The memory-policy pipeline config the stages run, and overrides of its tables."""

    pipeline: str = Field("configs/memory_policy_gpu.toml", description="A `memsearch pipeline memory-policy` "
                          "config: teacher, SFT, GRPO, stage 2, matrix and report settings")
    override: dict[str, Any] = Field(default_factory=dict, description="Tables merged over the pipeline config's, "
                                     "key by key (e.g. [recipe.override.grpo] steps = 50); the fields the "
                                     "experiment sets (model, data, devices, the served reader and stage 1) are "
                                     "refused")

    @config_check
    def _not_owned(self, context: dict[str, Any]) -> None:
        problems = [(f"override.{key}", f"set by the experiment from {where}; remove it")
                    for key, where in OWNED.items() if _holds(self.override, key.split("."))]
        if problems:
            raise KeyProblems(*problems)


def _holds(table: dict[str, Any], keys: list[str]) -> bool:
    """Whether the nested ``table`` sets the dotted key ``keys`` (or a table above it)."""
    node: Any = table
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


class ExperimentConfig(StrictConfig):
    """``memsearch experiment run``: data, models, GPUs, model servers and the recipe."""

    data: ExperimentData = Field(default_factory=ExperimentData, description="HotpotQA sources and question counts")
    models: Models = Field(..., description="The policy and reader models")
    devices: DeviceLayout = Field(default_factory=DeviceLayout, description="GPUs of the trainer (train) and of each "
                                  "server (services.reader, services.stage1); empty: a CPU run")
    services: Services = Field(..., description="The reader and stage-1 servers")
    recipe: Recipe = Field(default_factory=Recipe, description="The memory-policy pipeline config and overrides")

    def stage1_on_reader(self) -> bool:
        """Whether each seed's stage 1 is an adapter loaded on the reader's server: stage 1 goes as
        an adapter, the reader is a vLLM (it loads adapters while it runs) and serves the policy
        model (an adapter runs on the model it was trained from)."""
        reader = self.services.reader
        return (self.stage1_as_adapter() and reader.engine == "vllm" and reader.command is None
                and reader.model is None and self.models.reader == self.models.policy)

    def stage1_as_adapter(self) -> bool:
        """Whether each seed's stage 1 is served as its LoRA adapter (``serve_as``)."""
        return self.services.stage1.serve_as == "adapter" or (
            self.services.stage1.serve_as == "auto" and self.services.stage1.engine in LORA_ENGINES)

    @config_check
    def _layout(self, context: dict[str, Any]) -> None:
        # Several training GPUs are fine: each trainer stage then runs under torchrun, one rank a GPU
        # (memsearch.pipelines.trainer_stages); a service must still not share the trainer's GPUs.
        problems = []
        if unknown := sorted(set(self.devices.services) - set(SERVICES)):
            problems.append(("devices.services", f"{unknown}: expected the experiment's services {list(SERVICES)}"))
        if self.devices.train:
            problems += [("devices.services", f"no GPUs for service {name!r}: with training GPUs in the layout each "
                          "server needs GPUs of its own (it would otherwise share the trainer's)")
                         for name in SERVICES if name not in self.devices.services]
        if problems:
            raise KeyProblems(*problems)


def load_experiment(path: str | Path, overrides: list[str] | None = None,
                    profile: str | None = None) -> ExperimentConfig:
    """The config of ``path`` with ``[profile.NAME]`` merged over its tables (``profile``), then
    ``--set`` ``overrides``. Problems name the flag, or the file, the line and the key as the file
    writes it (``profile.NAME.key`` where the profile set it); an unknown key, the keys its table
    takes (``memsearch.config.locate``)."""
    tables = read_config_file(path)
    profiles = tables.pop("profile", {})
    if not isinstance(profiles, dict) or not all(isinstance(p, dict) for p in profiles.values()):
        raise InputError(f"{path}: profile: expected tables [profile.NAME] of overrides")
    merged = tables
    if profile is not None:
        if profile not in profiles:
            raise InputError(f"--profile {profile}: {path} has no [profile.{profile}]; it has "
                             f"{sorted(profiles) or 'none'}")
        merged = _overlay(tables, profiles[profile])
    try:
        return config_from_tables(merged, overrides, ExperimentConfig, str(path))
    except InputError as exc:
        in_file = file_locator(path)

        def locate(key: str) -> Where:
            if profile is not None and _from_profile(key.split("."), tables, profiles[profile]):
                return in_file(f"profile.{profile}.{key}")
            return in_file(key)

        raise locate_problems(exc, ExperimentConfig, apply_overrides(merged, overrides or []), locate,
                              top_level=("profile",)) from None


def _from_profile(keys: list[str], base: dict[str, Any], top: dict[str, Any]) -> bool:
    """Whether the value at ``keys`` of the merged tables is the profile's (``_overlay``): the
    profile replaced it or a table above it, or writes more of its path than the file does."""
    depth = {"file": 0, "profile": 0}
    for name, node in (("file", base), ("profile", top)):
        for key in keys:
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
            depth[name] += 1
            if name == "profile" and not (isinstance(node, dict) and node):
                return True  # a value, or an empty table: everything below is the profile's
    return depth["profile"] > depth["file"] or depth["profile"] == len(keys)


def _overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """A profile's tables over the file's: key by key, where an empty table replaces (clears)."""
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        out[key] = _overlay(below, value) if value and isinstance(value, dict) and isinstance(below, dict) else value
    return out

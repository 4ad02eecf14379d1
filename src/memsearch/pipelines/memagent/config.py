"""The config of ``memsearch pipeline memagent``: the MemAgent recipe in one TOML file.

``configs/memagent.toml`` holds it: ``model`` (the base of everything), ``[data]`` (sources and
the numbers of documents N), ``[episode]`` (the recurrent agent: chunk, memory and answer limits,
prompts; the same tables ``memsearch eval`` reads), ``[grpo]`` (GRPO of the ``memagent`` role; a
config of an earlier layout says ``[train]``, read as ``[grpo]``).
``model`` fills the episode's tokenizer and its memory and reader backends, so budgets are
always counted with the tokenizer of the model that is trained and evaluated.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from memsearch.config import KeyProblems, RunConfig, config_check
from memsearch.devices import DeviceLayout
from memsearch.pipelines.config import (
    PipelineConfig,
    PipelineReport,
    SourceFiles,
    check_episode_tokenizer,
    episode_table,
    trainer_config,
    updated,
)
from memsearch.train.config import GRPOConfig, as_written, trainer_table

# [grpo]: the GRPO fields but those the pipeline sets from model, data, episode and devices, and
# periodic evaluation (the pipeline evaluates the base and the trained model itself).
GRPOTable = trainer_table(
    GRPOConfig, "GRPOTable", __name__, owned=("eval",),
    doc="[grpo] of the MemAgent pipeline: memsearch train grpo fields but role, model, data, episode, "
    "episode_config, eval and devices, which the pipeline sets (role = 'memagent')")


class PipelineData(SourceFiles):
    """What the pipeline prepares (``prepare`` stage)."""

    dev: str = Field("data/samples/hotpotqa/dev_distractor_sample.json",
                     description="Dev file (data.format; HotpotQA: distractor) the RULER-HQA-style sets are built from")
    train: str = Field("data/samples/hotpotqa/train_sample.json", description="Train file (data.format) for GRPO")
    docs: list[int] = Field(
        [50, 200, 800], description="Documents per context N of the evaluation sets (one set per N)"
    )
    questions: int | None = Field(None, ge=1, description="Dev questions per set (first N in file order; None = all)")
    train_questions: int | None = Field(None, ge=1, description="Train questions (first N; None = all)")
    train_docs: int = Field(
        0,
        ge=0,
        description="Documents per training context (built like the dev sets, from train only); "
        "0 = each question's own candidate paragraphs",
    )
    seed: int = Field(42, description="Seed of the document sampling and shuffling")

    @config_check
    def _distinct_docs(self, context: dict[str, Any]) -> None:
        if not self.docs or len(set(self.docs)) != len(self.docs) or min(self.docs) < 2:
            raise KeyProblems(
                ("docs", f"{self.docs}: expected distinct numbers of documents of at least 2, e.g. [50, 200, 800]")
            )


class MemAgentPipeline(PipelineConfig):
    """``memsearch pipeline memagent``: prepare, train (GRPO, memagent role), merge, evaluate
    base and trained at every N, report."""

    TRAINER_TABLES = ("grpo",)
    # The trainer table was [train] before every trainer table was named by its trainer.
    EARLIER_TABLE_NAMES = {"train": "grpo"}

    pipeline: Literal["memagent"] = Field(..., description="Marks a pipeline config (its [episode] is a run config)")
    model: str = Field(
        "embedded",
        description="'embedded' or a local Hugging Face folder: trained, evaluated, and the budget tokenizer",
    )
    data: PipelineData = Field(default_factory=PipelineData, description="Sources and sets")
    episode: RunConfig = Field(
        ..., description="The recurrent agent (stream + overwrite + exhaust) and its budgets and prompts"
    )
    report: PipelineReport = Field(
        default_factory=PipelineReport, description="Paired bootstrap settings of the report"
    )
    grpo: as_written(GRPOTable) = Field(
        default_factory=GRPOTable,
        description="GRPO settings (memsearch train grpo fields but role/model/data/episode, which the pipeline "
        "sets); [train] reads as it",
    )
    devices: DeviceLayout = Field(
        default_factory=DeviceLayout,
        description="GPUs of the trainer (memsearch.devices); the pipeline's evaluations run on the trainer's GPUs",
    )

    @model_validator(mode="before")
    @classmethod
    def _model_fills_episode(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("episode"), dict):
            return data
        return {**data, "episode": episode_table(data)}

    # Checks across fields (``@config_check``): all run, their problems reported together.
    @config_check
    def _recurrent_agent(self, context: dict[str, Any]) -> None:
        agent = self.episode.agent
        if (agent.evidence, agent.memory, agent.controller) != ("stream", "overwrite", "exhaust"):
            raise KeyProblems((
                "episode.agent",
                "the MemAgent pipeline needs evidence 'stream', memory 'overwrite', controller 'exhaust'",
            ))

    @config_check
    def _model_everywhere(self, context: dict[str, Any]) -> None:
        problems = []
        try:
            check_episode_tokenizer(self.episode, self.model)
        except KeyProblems as exc:
            problems += exc.keyed
        for role in ("memory", "reader"):
            b = getattr(self.episode.backends, role)
            if b.kind != "hf" or b.model != self.model or b.adapter is not None:
                problems.append((
                    f"episode.backends.{role}",
                    f"must be kind 'hf' with model {self.model!r} and no adapter "
                    "(the pipeline swaps in the trained model; leave it unset)",
                ))
        if problems:
            raise KeyProblems(*problems)

    @config_check
    def _train_table(self, context: dict[str, Any]) -> None:
        # [grpo]'s own values were checked as its fields; this checks them with what the pipeline
        # sets (role against episode, schema mode), now, with their field names.
        self.grpo_config("<train-data>")

    def grpo_config(self, train_data: str) -> GRPOConfig:
        """The ``memsearch train grpo`` config of the training stage."""
        return trainer_config(GRPOConfig, "grpo", self.grpo, role="memagent", model=self.model, data=train_data,
                              episode=self.episode, devices=self.devices)

    def eval_config(self, model: str, limit: int | None = None) -> RunConfig:
        """The run config evaluating ``model`` (the base, or a merged checkpoint): the episode
        with only the memory and reader models replaced, so base and trained share every other
        setting, the budget tokenizer included. ``limit``: evaluate the first questions only
        (the plain HotpotQA set, whose prepared folder holds the whole dev file)."""
        backends = self.episode.backends
        swapped = {role: updated(getattr(backends, role), f"episode.backends.{role}", model=model)
                   for role in ("memory", "reader")}
        limited = {"limit": limit} if limit is not None else {}
        return updated(self.episode, "episode", backends=updated(backends, "episode.backends", **swapped), **limited)

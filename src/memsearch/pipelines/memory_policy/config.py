"""The config of ``memsearch pipeline memory-policy``: the memory-policy track in one TOML file.

``configs/memory_policy_cpu.toml`` holds it: ``model`` (the base of every trained stage and the
untrained baseline), ``[data]`` (train and the named held-out dev questions), ``[episode]`` (the
run config of every episode: agent, budgets, reader, retrieval), ``[teacher]`` (the backend that
writes the SFT trajectories), ``[sft]``, ``[grpo]`` (stage 1, memory role), ``[stage2]`` (optional
GRPO of the controller with the stage-1 model frozen as memory backend: ``[stage2.grpo]``, which a
config of an earlier layout calls ``[stage2.train]``) and ``seeds``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from memsearch.config import BackendConfig, KeyProblems, Matrix, RunConfig, StrictConfig, config_check
from memsearch.devices import DeviceLayout
from memsearch.pipelines.config import (
    PipelineConfig,
    PipelineReport,
    SourceFiles,
    check_episode_tokenizer,
    trainer_config,
    updated,
)
from memsearch.pipelines.trainer_stages import OnCollapse
from memsearch.train.config import EvalSettings, GRPOConfig, SFTConfig, as_written, trainer_table

# Trainer fields the pipeline sets itself besides the model, data, role, episode and devices
# (``train.config.PIPELINE_FIELDS``): the adapter each stage starts from and the seed. Periodic
# evaluation reads only the validation split (data.val_questions), never the final comparison's
# questions, which must not steer training, early stopping or tuning: GRPO's eval.data is the
# pipeline's, the rest of its eval table the user's; SFT has no periodic evaluation here.
SFTTable = trainer_table(
    SFTConfig, "SFTTable", __name__, owned=("episode", "episode_config", "eval", "eval_config", "adapter", "seed"),
    doc="[sft] / [stage2.sft] of the memory-policy pipeline: memsearch train sft fields but model, data, role, "
    "adapter, seed, eval, eval_config and devices, which the pipeline sets")
GRPOTable = trainer_table(
    GRPOConfig, "GRPOTable", __name__, owned=("eval_config", "adapter", "seed"), owned_eval=("data",),
    doc="[grpo] / [stage2.grpo] of the memory-policy pipeline: memsearch train grpo fields but role, model, data, "
    "episode, adapter, seed, eval.data and devices, which the pipeline sets")



def oracle_teacher(description: str) -> Any:
    """A teacher backend field, the oracle by default (each use says what it teaches)."""
    return Field(default_factory=lambda: BackendConfig.model_validate({"kind": "oracle"}), description=description)

class MPData(SourceFiles):
    """Train and held-out dev questions (``prepare`` stage)."""

    train: str = Field(
        "data/samples/hotpotqa/train_sample.json", description="Train file (data.format): teacher, SFT and GRPO"
    )
    dev: str = Field(
        "data/samples/hotpotqa/dev_distractor_sample.json",
        description="Dev file (data.format) the held-out comparison questions come from",
    )
    train_questions: int | None = Field(None, ge=1, description="Train questions (first N of the file; None = all)")
    dev_questions: int = Field(
        ...,
        ge=1,
        description="The held-out comparison questions: the first N of the dev file. "
        "Used only by the final A-D matrix, never for training, early stopping or tuning",
    )
    val_questions: int = Field(
        0,
        ge=0,
        description="Validation questions for the periodic evaluation of GRPO "
        "(grpo.eval.every / stage2.grpo.eval.every): the next N of the dev file after the "
        "held-out ones, disjoint from them; 0 = no periodic evaluation",
    )


class TeacherRows(StrictConfig):
    """Which teacher rows SFT trains on (``train.sft.row_selection``): every operation row, every
    NOOP row where a gold sentence was shown but not kept, and a share of the other NOOP rows."""

    other_noop_share: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Share of the NOOP rows without a new gold sentence to keep (sampled with "
        "`seed`); None = keep every exported row (no selection)",
    )
    seed: int = Field(0, description="Seeds the sample of NOOP rows")


class Stage2(StrictConfig):
    """Optional stage 2: GRPO of the search controller (``agent.controller = 'policy'``) with the
    stage-1 model frozen as the memory backend."""

    enabled: bool = Field(False, description="Train the controller; false: C/D use the untrained base controller")
    start: Literal["base", "sft"] = Field(
        "base",
        description="Where stage 2's controller starts: 'base' (a fresh LoRA on the untrained model; a small "
        "model sampled at temperature 1 rarely writes a readable SEARCH/FINISH, so most groups score alike) or "
        "'sft' (LoRA SFT on the controller rows of a teacher run on train, OUT/teacher2: `teacher` answers the "
        "controller, the pipeline's [teacher] the memory)",
    )
    teacher: BackendConfig = oracle_teacher(
        "start = 'sft': the controller backend of the teacher run (oracle: SEARCH the title of the first gold "
        "paragraph the memory has no supporting fact of, then FINISH; rules: the question, then open items)")
    sft: as_written(SFTTable) = Field(
        default_factory=SFTTable,
        description="start = 'sft': memsearch train sft fields of the controller's SFT, over the "
        "pipeline's [sft] table key by key (model, data, role, seed are set by the pipeline)",
    )
    memory_serving: Literal["in_process", "http"] = Field(
        "in_process",
        description="How the frozen stage-1 model (seed-N/merged1) answers the memory calls of stage 2's "
        "rollouts and periodic evaluation: in_process (hf backend, schema_mode as the pipeline's); http (an "
        "OpenAI-compatible server reached through the openai backend, which keeps [episode.backends.memory]'s "
        "max_concurrency, timeout_s, max_retries and sampling, and decodes in the pipeline's schema_mode where the "
        "server constrains output: vLLM, SGLang): `transformers serve` launched by the pipeline (it constrains "
        "nothing, so schema_mode = false), or a server you run (memory_url; schema mode on an engine that "
        "constrains nothing is refused before the stage)",
    )
    memory_url: str | None = Field(
        None,
        description="http: the API root of a server you run on seed-N/merged1, e.g. http://127.0.0.1:8000/v1 "
        "(vLLM: `vllm serve OUT/seed-N/merged1 --served-model-name NAME`); you are responsible for serving that "
        "folder. Unset: the pipeline launches `transformers serve` on merged1 itself and stops it after the stage",
    )
    memory_model: str | None = Field(
        None,
        description="http with memory_url: the served model name; the pipeline refuses to start stage 2 "
        "unless the server's /v1/models lists it",
    )
    serve_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="http, launched server: its port on 127.0.0.1; unset = a free port, chosen "
        "at the stage's first start and kept for its resumes (the port is part of the trainer config)",
    )
    serve_args: list[str] = Field(
        default_factory=list,
        description="http, launched server: extra `transformers serve` options, e.g. "
        '["--device", "cuda:0", "--continuous-batching"] (host, port and the model are set by the pipeline)',
    )
    serve_engine: Literal["vllm", "sglang", "transformers", "llama.cpp"] = Field(
        "transformers",
        description="http, launched server: the engine that serves stage 1 at serve_port. The pipeline launches "
        "`transformers serve` (which constrains no output, so schema_mode = true is refused with it); `memsearch "
        "experiment run` sets its [services] engine here",
    )
    serve_start_timeout_s: float = Field(
        300.0,
        gt=0,
        description="http, launched server: how long to wait for its /health before giving up "
        "(the error shows the end of its log)",
    )
    grpo: as_written(GRPOTable) = Field(
        default_factory=GRPOTable,
        description="memsearch train grpo fields of stage 2 (role, model, data, episode, seed are set by the "
        "pipeline); [stage2.train] reads as it",
    )


class MemoryPolicyPipeline(PipelineConfig):
    """``memsearch pipeline memory-policy``: prepare, teacher + export-sft, SFT, GRPO stage 1,
    merge, optional stage 2, the A-D matrix on held-out dev, report."""

    TRAINER_TABLES = ("sft", "grpo", "stage2.grpo", "stage2.sft")
    # Stage 2's trainer table was [stage2.train] before every trainer table was named by its trainer.
    EARLIER_TABLE_NAMES = {"stage2.train": "stage2.grpo"}

    pipeline: Literal["memory-policy"] = Field(
        ..., description="Marks a pipeline config (its [episode] is a run config)"
    )
    model: str = Field(
        "embedded",
        description="'embedded' or a local Hugging Face folder: the base of every trained "
        "stage, the untrained A/C baseline memory and the budget tokenizer",
    )
    seeds: list[int] = Field(
        [0],
        min_length=1,
        description="One trained model per seed (same data; sampling and "
        "initialisation seeds differ); curves are drawn as mean with a min-max band",
    )
    data: MPData = Field(..., description="Sources and the held-out dev questions")
    episode: RunConfig = Field(
        ...,
        description="Every episode's run config (decision memory, fixed plan, reader, budgets); "
        "backends.memory/controller are replaced per stage by the pipeline",
    )
    schema_mode: bool = Field(
        False,
        description="The trained memory policy decodes in schema mode (constrained JSON): "
        "GRPO rollouts and periodic evaluation, the held-out sft/grpo rows and B/D of the matrix "
        "(the held-out 'base' row always uses schema mode)",
    )
    grpo_start: Literal["sft", "base"] = Field(
        "sft",
        description="Where GRPO stage 1 starts: 'sft' (the seed's SFT adapter on the teacher rows) or 'base' "
        "(a cold start: a fresh LoRA on the untrained base in schema mode; the teacher, export and SFT stages are "
        "skipped and the held-out comparison has no 'sft' row): the cold-start control",
    )
    teacher_rows: TeacherRows = Field(default_factory=TeacherRows, description="Selection of the teacher's SFT rows")
    matrix_seeds: list[int] | None = Field(
        None,
        description="Seeds whose A-D matrix runs on the held-out questions "
        "(None = every seed; [] = none; each must be in `seeds`: a session that trains `seeds = [2]` "
        "alone says matrix_seeds = [2] or []); the held-out comparison of memory policies runs for every "
        "seed regardless",
    )
    teacher: BackendConfig = oracle_teacher("Memory backend of the teacher trajectories on train (oracle by default)")
    sft: as_written(SFTTable) = Field(
        default_factory=SFTTable, description="memsearch train sft fields (model, data, role, seed set by the pipeline)"
    )
    grpo: as_written(GRPOTable) = Field(
        default_factory=GRPOTable, description="memsearch train grpo fields of stage 1 (memory role)"
    )
    stage2: Stage2 = Field(default_factory=Stage2, description="Optional GRPO of the controller")
    merge_dtype: str = Field("float32", description="dtype of the merged checkpoints (bfloat16 on a GPU)")
    devices: DeviceLayout = Field(
        default_factory=DeviceLayout,
        description="GPUs of the trainers (every stage) and of the model servers (memsearch.devices): e.g. "
        "train = [0], services = { reader = [1], stage1 = [2] }; `stage1` is the GPU of the stage-1 server stage 2 "
        "launches (stage2.memory_serving = 'http'). Empty: the processes use what CUDA_VISIBLE_DEVICES gives",
    )
    report: PipelineReport = Field(
        default_factory=PipelineReport, description="Paired bootstrap settings of the report"
    )
    on_collapse: OnCollapse = Field(
        "stop",
        description="What a stop of a GRPO stage's collapse guard does: 'stop' ends the pipeline (CollapseError); "
        "'score_last_checkpoint' finishes the stage with its newest checkpoint's adapter (the policy at the stop when "
        "that is a checkpoint step, e.g. the last) and records the stop in the stage record and the report, so the "
        "collapsed seed keeps its held-out rows in the comparison. Not in any stage fingerprint: it decides "
        "whether a stopped stage counts as finished, not what a stage computes",
    )
    stage1_serving: Literal["in_process", "http"] = Field(
        "in_process",
        description="How the held-out 'grpo' row, stage 2's memory and groups B/D of the matrix reach the seed's "
        "stage-1 model (seed-N/merged1): in_process (hf) or http, one server per seed for all three: the one you "
        "run (stage2.memory_url + memory_model), else `transformers serve` launched on stage2.serve_port (a fixed "
        "port: the URL is part of every stage's fingerprint); `memsearch experiment run` deploys it with the "
        "engine of its config. Needs stage2.memory_serving = 'http' (whose checks apply); schema_mode holds over "
        "HTTP on engines that constrain output (vLLM, SGLang) and is refused before the run on one that does not",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_bar(cls, data: Any) -> Any:
        # A bar is registered by a study before its numbers exist and applied there; a pipeline
        # config that still names one would read as if the pipeline judged it.
        if isinstance(data, dict) and "bar" in data:
            raise KeyProblems(("bar", "the pipeline no longer judges a bar: it writes the held-out comparison "
                               "only. A bar is registered and applied by its study (studies/protocols.toml; "
                               "python -m studies.memory_policy.verdict RUN); remove `bar` from this config"))
        return data

    @model_validator(mode="before")
    @classmethod
    def _model_fills_episode(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("episode"), dict):
            episode = dict(data["episode"])
            episode.setdefault("tokenizer", data.get("model", "embedded"))
            data = {**data, "episode": episode}
        return data

    # Checks across fields (``@config_check``): all of them run and their problems are reported
    # together, so a config with several problems is refused once, naming each.
    @config_check
    def _fixed_plan(self, context: dict[str, Any]) -> None:
        agent = self.episode.agent
        if (agent.evidence, agent.memory, agent.controller) != ("search", "decision", "fixed"):
            raise KeyProblems((
                "episode.agent",
                "the memory-policy pipeline trains decision memory on a fixed plan "
                "(evidence 'search', memory 'decision', controller 'fixed'); stage 2 switches to 'policy' itself",
            ))

    @config_check
    def _model_tokenizer(self, context: dict[str, Any]) -> None:
        check_episode_tokenizer(self.episode, self.model)

    @config_check
    def _matrix_is_the_pipelines(self, context: dict[str, Any]) -> None:
        problems = []
        if self.episode.matrix != Matrix():
            # matrix_config sets the matrix table whole: a setting here would be silently dropped.
            problems.append(("episode.matrix", "the pipeline runs the A-D matrix itself (groups A-D, their "
                             "backends per stage, report.bootstrap_resamples); remove [episode.matrix]"))
        if self.matrix_seeds and (untrained := sorted(set(self.matrix_seeds) - set(self.seeds))):
            # A matrix seed that is not trained would run no matrix, without a word.
            problems.append(("matrix_seeds", f"{untrained} not in seeds {self.seeds}: expected seeds that are "
                             "trained (matrix_seeds = [] runs no matrix)"))
        if len(set(self.seeds)) != len(self.seeds):
            problems.append(("seeds", f"{self.seeds}: expected distinct seeds"))
        if problems:
            raise KeyProblems(*problems)

    @config_check
    def _stage2_serving(self, context: dict[str, Any]) -> None:
        self._check_stage2_serving()

    @config_check
    def _stage1_served(self, context: dict[str, Any]) -> None:
        if self.stage1_serving == "in_process":
            return
        if self.stage2.memory_serving != "http":
            raise KeyProblems(("stage1_serving", "stage1_serving = 'http' serves stage 1 to stage 2 as well: set "
                               "stage2.memory_serving = 'http' too (with memory_url, or serve_port for a launched "
                               "server)"))
        if not self.stage2.memory_url and self.stage2.serve_port is None:
            raise KeyProblems(("stage2.serve_port", "stage1_serving = 'http' with a launched server needs a fixed "
                               "port: the held-out and matrix runs fingerprint its URL, so a resume must find it "
                               "again"))

    @config_check
    def _start_and_schema_mode(self, context: dict[str, Any]) -> None:
        problems = []
        if self.grpo_start == "base" and not self.schema_mode:
            problems.append((
                "grpo_start",
                "grpo_start = 'base' needs schema_mode = true: without SFT the untrained base model "
                "hardly ever writes a readable operation batch, so GRPO would have nothing to compare",
            ))
        if "schema_mode" in self.grpo.rollout.model_fields_set:
            problems.append((
                "grpo.rollout.schema_mode",
                "set the pipeline's top-level schema_mode (it also sets the held-out "
                "evaluations and B/D); remove it from [grpo]",
            ))
        if self.stage2.start == "sft" and not self.stage2.enabled:
            problems.append((
                "stage2.start",
                "stage2.start = 'sft' needs stage2.enabled = true (it is where stage 2's controller starts)",
            ))
        elif self.stage2.start != "sft" and self.stage2.sft.model_fields_set:
            problems.append(("stage2.sft", "only used with stage2.start = 'sft'"))
        if problems:
            raise KeyProblems(*problems)

    @config_check
    def _trainer_tables(self, context: dict[str, Any]) -> None:
        problems = [
            (f"{table}.eval.every", f"{table}.eval.every needs data.val_questions > 0: periodic evaluation reads the "
             "validation split only, never the held-out comparison questions")
            for table, grpo in (("grpo", self.grpo), ("stage2.grpo", self.stage2.grpo))
            if grpo.eval.every and not self.data.val_questions
        ]
        if problems:
            raise KeyProblems(*problems)
        # Each table's values were checked as its fields; check them with what the pipeline sets
        # (role against episode, schema mode...) now, before any stage runs. Each table's problems
        # are collected, so one run names them all.
        builders = [lambda: self.sft_config(["<rows>"], self.seeds[0]),
                    lambda: self.grpo_config("<train>", self.seeds[0], None)]
        if self.stage2.enabled:
            builders.append(lambda: self.stage2_config("<train>", self.seeds[0], "<stage-1 model>"))
        if self.stage2.enabled and self.stage2.start == "sft":
            builders += [self.controller_teacher_config, lambda: self.stage2_sft_config(["<rows>"], self.seeds[0])]
        for build in builders:
            try:
                build()
            except KeyProblems as exc:
                problems += [p for p in exc.keyed if p not in problems]
        if problems:
            raise KeyProblems(*problems)

    def _check_stage2_serving(self) -> None:
        s2 = self.stage2
        launched = ("serve_port", "serve_args") if s2.memory_url else ()
        if s2.memory_serving == "in_process":
            bad = [k for k in ("memory_url", "memory_model", "serve_port", "serve_args") if getattr(s2, k)]
            if bad:
                raise KeyProblems(*[(f"stage2.{k}", "only used with stage2.memory_serving = 'http'") for k in bad])
            return
        if self.devices.train and not s2.memory_url and "stage1" not in self.devices.services:
            # The launched server inherits this process's CUDA_VISIBLE_DEVICES: the trainer's GPUs.
            raise KeyProblems((
                "devices.services",
                "stage 2 launches the stage-1 server (stage2.memory_serving = 'http', no memory_url): give it GPUs "
                "of its own in the layout, e.g. services = { stage1 = [1] }, or it would share the trainer's",
            ))
        if s2.memory_url and not s2.memory_model:
            raise KeyProblems((
                "stage2.memory_url",
                "stage2.memory_url needs stage2.memory_model: the name the server serves seed-N/merged1 "
                "under (vLLM's --served-model-name)",
            ))
        if s2.memory_model and not s2.memory_url:
            raise KeyProblems((
                "stage2.memory_model",
                "stage2.memory_model without stage2.memory_url: the launched `transformers serve` serves "
                "merged1 under its folder path; set memory_url to use a server you run",
            ))
        if bad := [k for k in launched if getattr(s2, k)]:
            raise KeyProblems(
                *[(f"stage2.{k}", "only for the server the pipeline launches (no memory_url)") for k in bad]
            )
        if not s2.memory_url and self.episode.backends.memory.sampling.temperature > 0:
            # transformers serve (5.x) sets do_sample only to switch it off at temperature 0: a
            # temperature above 0 would decode greedily unless the folder's generation_config says
            # do_sample, so the requested sampling would silently not happen.
            raise KeyProblems((
                "stage2.memory_serving",
                "stage2.memory_serving = 'http' with a launched `transformers serve`: episode.backends.memory."
                "sampling.temperature > 0 is not honoured by it (it samples only when the model folder's "
                "generation_config sets do_sample); keep the frozen memory greedy (temperature 0) or run "
                "your own server (stage2.memory_url)",
            ))
        if self.schema_mode and not self.stage2.memory_url and self.stage2.serve_engine == "transformers":
            # The server the pipeline launches is `transformers serve`, which ignores every schema form (it logs
            # "Ignoring unsupported fields"): refused rather than decoding freely. A server you run (memory_url)
            # or `experiment run` deploys is checked by the openai backend against its engine before the run.
            raise KeyProblems((
                "stage2.memory_serving",
                "stage2.memory_serving = 'http' with schema_mode = true on the `transformers serve` the pipeline "
                "launches: it constrains no output, so stage 2's frozen memory would decode freely; serve stage 1 "
                "with vLLM or SGLang (stage2.memory_url, or memsearch experiment run), set schema_mode = false, "
                "or stage2.memory_serving = 'in_process'",
            ))

    def _episode(
        self,
        memory: BackendConfig | None = None,
        controller: BackendConfig | None = None,
        agent_controller: str | None = None,
        **fields: Any,
    ) -> RunConfig:
        """The pipeline's episode with the stage's memory / controller backends, agent controller
        and other run-config ``fields`` (``limit``, ``matrix``) replaced."""
        backends = {role: b for role, b in (("memory", memory), ("controller", controller)) if b is not None}
        if backends:
            fields["backends"] = updated(self.episode.backends, "episode.backends", **backends)
        if agent_controller is not None:
            fields["agent"] = updated(self.episode.agent, "episode.agent", controller=agent_controller)
        return updated(self.episode, "episode", **fields)

    def base_backend(self, model: str | None = None, schema_mode: bool | None = None) -> BackendConfig:
        """An hf backend on ``model`` (the base by default), with the episode memory backend's other
        settings; decoding in ``schema_mode`` (the pipeline's by default; summary memory and the
        controller decode freely)."""
        return updated(self.episode.backends.memory, "episode.backends.memory", kind="hf", model=model or self.model,
                       adapter=None, base_url=None,  # a served memory's URL is no setting of a local model
                       schema_mode=self.schema_mode if schema_mode is None else schema_mode)

    def teacher_config(self) -> RunConfig:
        """The run config of the teacher trajectories on train."""
        return self._episode(memory=self.teacher)

    def sft_config(self, rows: list[str], seed: int) -> SFTConfig:
        """The ``memsearch train sft`` config of one seed."""
        return trainer_config(SFTConfig, "sft", self.sft, model=self.model, data=rows, role="memory", seed=seed,
                              devices=self.devices)

    def controller_teacher_config(self) -> RunConfig:
        """The run config of the controller's teacher trajectories on train (``stage2.start =
        'sft'``): the policy controller answered by ``stage2.teacher``, the memory by ``[teacher]``."""
        return self._episode(memory=self.teacher, controller=self.stage2.teacher, agent_controller="policy")

    def stage2_sft_config(self, rows: list[str], seed: int) -> SFTConfig:
        """The ``memsearch train sft`` config of the controller's SFT of one seed (``stage2.start =
        'sft'``): ``[stage2.sft]`` over ``[sft]`` key by key (a table given there replaces [sft]'s)."""
        return trainer_config(SFTConfig, "stage2.sft", self.sft, self.stage2.sft, model=self.model, data=rows,
                              role="controller", seed=seed, devices=self.devices)

    def _eval(self, table: GRPOTable, val: str | None) -> EvalSettings:
        return table.eval.model_copy(update={"data": val if self.data.val_questions else None})

    def grpo_config(self, train: str, seed: int, adapter: str | None, val: str | None = None) -> GRPOConfig:
        """Stage 1: GRPO of the memory role from the SFT adapter (``adapter``; None: from the base
        model, ``grpo_start = 'base'``); periodic evaluation on ``val``."""
        return trainer_config(
            GRPOConfig, "grpo", self.grpo, role="memory", model=self.model, data=train, seed=seed,
            adapter=adapter, episode=self._episode(memory=self.base_backend()),  # in the pipeline's schema_mode
            rollout=updated(self.grpo.rollout, "grpo.rollout", schema_mode=None),  # [grpo]'s own is refused
            eval=self._eval(self.grpo, val), devices=self.devices,
        )

    def served_backend(self, url: str, name: str) -> BackendConfig:
        """An openai backend on ``url`` serving ``name``, with the episode memory backend's
        concurrency, timeout, retries and sampling, in the pipeline's ``schema_mode`` (the backend
        refuses it before the run where the server's engine constrains nothing). A server you run
        (``memory_url``) is read as what its /models says; a launched one as ``serve_engine``."""
        engine = "auto" if self.stage2.memory_url else self.stage2.serve_engine
        return updated(self.episode.backends.memory, "episode.backends.memory", kind="openai", model=name, base_url=url,
                       adapter=None, schema_mode=self.schema_mode, engine=engine)

    def stage1_backend(self, stage1: str, served: tuple[str, str] | None = None) -> BackendConfig:
        """The stage-1 model as memory backend: ``served`` (API root, served name: the seed's server,
        ``stage1_serving = 'http'``) over HTTP, else the folder ``stage1`` in process."""
        return self.served_backend(*served) if served else self.base_backend(stage1)

    def stage2_memory(
        self, stage1: str, launched_url: str | None = None, served: tuple[str, str] | None = None
    ) -> BackendConfig:
        """Stage 2's memory backend: the seed's server (``served``), merged1 in process, or over
        HTTP (``stage2.memory_url`` or the launched server's ``launched_url``; it serves merged1
        under its folder path)."""
        if served:
            return self.served_backend(*served)
        if self.stage2.memory_serving == "in_process":
            return self.base_backend(stage1)
        if self.stage2.memory_url:
            return self.served_backend(self.stage2.memory_url, self.stage2.memory_model)
        return self.served_backend(launched_url or "http://127.0.0.1:1/v1", stage1)

    def stage2_config(
        self,
        train: str,
        seed: int,
        stage1: str,
        val: str | None = None,
        launched_url: str | None = None,
        adapter: str | None = None,
        served: tuple[str, str] | None = None,
    ) -> GRPOConfig:
        """Stage 2: GRPO of the controller from ``adapter`` (the controller's SFT adapter; None: a
        fresh LoRA on the base), the merged stage-1 model frozen as memory backend (in process or
        over HTTP: ``stage2_memory``)."""
        episode = self._episode(
            memory=self.stage2_memory(stage1, launched_url, served),
            controller=self.base_backend(schema_mode=False),
            agent_controller="policy",
        )
        return trainer_config(
            GRPOConfig, "stage2.grpo", self.stage2.grpo, role="controller", model=self.model, data=train,
            seed=seed, adapter=adapter, episode=episode, eval=self._eval(self.stage2.grpo, val), devices=self.devices,
        )

    def matrix_config(self, stage1: str, controller: str | None, served: tuple[str, str] | None = None) -> RunConfig:
        """The A-D matrix: A/C summarize with the untrained base (``backends.baseline_memory``,
        set explicitly so a stage-1 checkpoint can never reach them), B/D with the stage-1
        model (in process, or ``served``: ``stage1_backend``), C/D with the stage-2 controller
        (``controller``; None = the base model)."""
        # Summary mode has no operations to constrain: the baseline decodes freely.
        backends = updated(self.episode.backends, "episode.backends", memory=self.stage1_backend(stage1, served),
                           controller=self.base_backend(controller, schema_mode=False),
                           baseline_memory=self.base_backend(schema_mode=False))
        matrix = Matrix(groups=["A", "B", "C", "D"], bootstrap_resamples=self.report.bootstrap_resamples)
        return updated(self.episode, "episode", backends=backends, limit=None, matrix=matrix)

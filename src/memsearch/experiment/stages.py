"""The stages ``memsearch experiment run`` adds around the memory-policy pipeline's: the data
download, the models, the pipeline config it generates, the services' specs and the untrained
baseline matrix. Each stage is fingerprinted and resumable (``pipelines.stages.Stage``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from memsearch.config import config_from_tables, merge_tables, read_config_file
from memsearch.errors import InputError
from memsearch.experiment.config import ExperimentConfig
from memsearch.io import write_json
from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline
from memsearch.pipelines.stages import Stage, folder_sha256
from memsearch.serving import ServiceSpec

# A hub id: "org/name" (letters, digits, . _ -), never a path that exists here.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
SPLITS = ("train", "dev")


def download_stage(cfg: ExperimentConfig, out: Path, echo=print) -> dict[str, Any]:
    """``OUT/data/{train,dev}/FILE``: each source fetched (resumably; verified when the config
    gives its SHA-256) and ``OUT/data/manifest.json``: per split its source, path, SHA-256 and
    size. A re-run refetches nothing and refuses a file that changed since."""
    from memsearch.data.download import download

    folder = out / "data"
    sources = {name: {"source": getattr(cfg.data, name), "sha256": getattr(cfg.data, f"{name}_sha256")}
               for name in SPLITS}
    stage = Stage(folder, "download", sources, out / "download.stage.json")
    stage.restart_if_changed(echo)  # e.g. a local path given after the URL could not be reached
    done = stage.done()
    stage.start()
    files = {}
    for name, source in sources.items():
        try:
            got = download(source["source"], folder / name / _file_name(source["source"]), source["sha256"], echo)
        except InputError as exc:
            raise InputError(f"data.{name}: {exc} (--set data.{name}=PATH; the same --out continues)") from None
        files[name] = {"source": source["source"], "path": str(got.path), "sha256": got.sha256, "bytes": got.bytes,
                       "verified": source["sha256"] is not None}
    if done:
        recorded = stage.record()["outputs"]["sha256"]
        if changed := [n for n in SPLITS if files[n]["sha256"] != recorded[n]]:
            raise InputError(f"{folder}: {', '.join(changed)} changed since the download stage recorded it; delete "
                             f"{folder} and {stage.record_path} to fetch again")
    else:
        write_json(folder / "manifest.json", {"files": files})
        stage.finish({"manifest": "data/manifest.json", "sha256": {n: files[n]["sha256"] for n in SPLITS}})
    return files


def _file_name(source: str) -> str:
    """The file name a source is stored under: its URL's or path's last component."""
    name = Path(urlparse(source).path if "://" in source else source).name
    if not name:
        raise InputError(f"{source}: names no file (expected a URL or path ending in the file's name)")
    return name


def resolve_model(key: str, source: str, cache_dir: Path, echo=print) -> Path:
    """The local folder of ``source`` (``models.KEY``): the embedded model, a local folder, or a hub
    id fetched into ``cache_dir/ID`` with huggingface_hub when it is not there yet."""
    if source == "embedded":
        from memsearch.assets.embedded import model_dir

        return Path(model_dir())
    path = Path(source)
    if path.exists():
        if not (path / "config.json").is_file():
            raise InputError(f"models.{key}: {source} is no Hugging Face model folder (no config.json)")
        return path
    if not _HUB_ID.fullmatch(source):
        raise InputError(f"models.{key}: {source}: no such folder, and not a hub id (org/name)")
    dest = cache_dir / source
    if (dest / "config.json").is_file():
        return dest
    echo(f"models.{key}: fetching {source} from the hub into {dest}")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        snapshot_download(repo_id=source, local_dir=str(dest))
    except (OSError, ValueError, HfHubHTTPError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise InputError(f"models.{key}: could not fetch {source} into {dest} ({type(exc).__name__}: {first}); "
                         f"offline? fetch it yourself (e.g. `hf download {source} --local-dir {dest}`) or set "
                         f"models.{key} to a local folder") from None
    return dest


def models_stage(cfg: ExperimentConfig, out: Path, echo=print) -> dict[str, dict[str, Any]]:
    """The policy and reader folders (hub ids fetched) and their fingerprints (``folder_sha256``,
    computed once: a re-run reads the stage record)."""
    models = {"policy": cfg.models.policy, "reader": cfg.models.reader}
    stage = Stage(out / "models", "models", {"models": models, "cache_dir": cfg.models.cache_dir},
                  out / "models.stage.json")
    paths = {key: resolve_model(key, source, Path(cfg.models.cache_dir), echo) for key, source in models.items()}
    if stage.done():
        return stage.record()["outputs"]["models"]
    stage.start()
    hashes: dict[Path, str] = {}
    for path in paths.values():  # the reader is often the policy: hashed once
        if path not in hashes:
            echo(f"models: fingerprinting {path}")
            hashes[path] = folder_sha256(path)
    record = {key: {"source": models[key], "path": str(paths[key]), "sha256": hashes[paths[key]]} for key in models}
    stage.finish({"models": record})
    return record


def pipeline_config(cfg: ExperimentConfig, data: dict[str, Any] | None = None,
                    models: dict[str, Any] | None = None) -> MemoryPolicyPipeline:
    """The memory-policy pipeline config the stages run: the recipe file, ``[recipe.override]``
    over it, then what the experiment owns (``config.OWNED``): the policy model, the fetched data
    and question counts, the layout, the reader served by ``[services.reader]`` and stage 1 served
    per seed (``stage1_serving = 'http'``). Without ``data`` / ``models`` (a check before anything
    runs) the configured sources stand in, and a model not fetched yet is the embedded one."""
    recipe = cfg.recipe.pipeline
    tables = merge_tables(read_config_file(recipe), cfg.recipe.override)
    policy = models["policy"]["path"] if models else (
        cfg.models.policy if cfg.models.policy == "embedded" or Path(cfg.models.policy).exists() else "embedded")
    limits = {k: v for k in ("train_questions", "dev_questions", "val_questions")
              if (v := getattr(cfg.data, k)) is not None}
    tables["model"] = policy
    tables["data"] = {**(tables.get("data") or {}), **limits,
                      **{n: data[n]["path"] if data else getattr(cfg.data, n) for n in SPLITS}}
    tables["devices"] = cfg.devices.model_dump(mode="json")
    reader = reader_spec(cfg, models, ranked=False)  # its name and URL; the rank comes from this config
    episode = tables.setdefault("episode", {})
    backends = episode.setdefault("backends", {})
    kept = {k: v for k, v in (backends.get("reader") or {}).items()
            if k not in ("kind", "model", "base_url", "adapter")}
    backends["reader"] = {**kept, "kind": "openai", "model": reader.name_served, "base_url": service_url(reader)}
    tables["stage1_serving"] = "http"
    stage2 = {k: v for k, v in (tables.get("stage2") or {}).items() if k not in ("memory_url", "memory_model")}
    served_by = cfg.services.reader if cfg.stage1_on_reader() else cfg.services.stage1
    tables["stage2"] = {**stage2, "memory_serving": "http", "serve_port": served_by.port,
                        "serve_start_timeout_s": served_by.start_timeout_s, "serve_engine": served_by.engine}
    return config_from_tables(tables, None, MemoryPolicyPipeline, f"{recipe} (with [recipe.override] and the "
                              "fields the experiment sets)")


def service_url(spec: ServiceSpec) -> str:
    """The API root a service answers at."""
    return f"http://{spec.host}:{spec.port}/v1"


def reader_spec(cfg: ExperimentConfig, models: dict[str, Any] | None = None, ranked: bool = True) -> ServiceSpec:
    """``[services.reader]`` on the reader model (its configured ``model``, else the resolved
    reader folder; before the models stage, the configured source); when each seed's stage 1 is
    loaded on it (``stage1_on_reader``), ready for adapters up to the recipe's LoRA rank."""
    reader = cfg.services.reader
    model = reader.model or (models["reader"]["path"] if models else _local_or_source(cfg.models.reader))
    update: dict[str, Any] = {"model": model}
    if ranked and cfg.stage1_on_reader():
        update["max_lora_rank"] = max(reader.max_lora_rank or 1, stage1_lora_rank(cfg))
    return reader.model_copy(update=update)


def stage1_lora_rank(cfg: ExperimentConfig) -> int:
    """The rank of the stage-1 adapter the recipe trains (its SFT's and GRPO's LoRA, the larger)."""
    pcfg = pipeline_config(cfg)
    return max(pcfg.sft.lora.r, pcfg.grpo.lora.r)


def stage1_name(seed: int) -> str:
    """The name a seed's stage-1 adapter is served under."""
    return f"stage1-seed{seed}"


def stage1_spec(cfg: ExperimentConfig, merged1: Path | str, adapter1: Path | str | None = None,
                seed: int | None = None, models: dict[str, Any] | None = None) -> ServiceSpec:
    """``[services.stage1]`` for one seed: its merged stage-1 folder, or (``stage1_as_adapter``)
    the policy model with the seed's adapter ``adapter1`` served as ``stage1_name(seed)``."""
    stage1 = cfg.services.stage1
    if cfg.stage1_as_adapter() and adapter1 is not None and seed is not None:
        policy = models["policy"]["path"] if models else _local_or_source(cfg.models.policy)
        return stage1.model_copy(update={"model": str(policy), "adapters": {stage1_name(seed): str(adapter1)}})
    return stage1.model_copy(update={"model": str(merged1)})


def _local_or_source(source: str) -> str:
    if source == "embedded":
        from memsearch.assets.embedded import model_dir

        return str(model_dir())
    return source


def baseline_stage(pcfg: MemoryPolicyPipeline, out: Path, paths: dict[str, Any], echo=print) -> dict[str, Any]:
    """``OUT/baseline/matrix``: the A-D matrix before any training (B/D's memory and C/D's
    controller are the untrained policy model: prompt baselines) on the held-out questions,
    with the served reader."""
    from memsearch.pipelines.memory_policy.pipeline import matrix_stage

    return matrix_stage(out / "baseline" / "matrix", out / "baseline" / "matrix.stage.json",
                        pcfg.matrix_config(pcfg.model, None), paths, {"stage1": None, "stage2": None},
                        "baseline matrix (untrained)", echo)

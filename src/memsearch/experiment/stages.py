"""The stages ``memsearch experiment run`` adds around the memory-policy pipeline's: the data
download, the models, the pipeline config it generates, the services' specs and the untrained
baseline matrix. Each stage is fingerprinted and resumable (``pipelines.stage_record.Stage``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from memsearch.config import config_from_tables, config_json, merge_tables, read_config_file
from memsearch.errors import InputError
from memsearch.experiment.config import ExperimentConfig
from memsearch.io import sha256_file, write_json
from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline
from memsearch.pipelines.stage_record import Stage, folder_sha256
from memsearch.serving import ServiceSpec

# A hub id: "org/name" (letters, digits, . _ -), never a path that exists here.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
SPLITS = ("train", "dev")


def download_stage(cfg: ExperimentConfig, out: Path, echo=print) -> dict[str, Any]:
    """``OUT/data/{train,dev}/FILE``: each source fetched (resumably; verified when the config
    gives its SHA-256) and ``OUT/data/manifest.json``: per split its source, path, SHA-256 and
    size.

    What comes back is judged before anything is kept as complete (``data_file_problem``): an
    HTML page answering 200 or bytes no data file of that name starts with is refused, nothing of
    it kept. Every split is tried and every failure named by its field (``data.train``,
    ``data.dev``) before the stage is refused; it is recorded complete only when both files are
    there, so a corrected source continues the same ``--out`` (``Stage.restart_if_changed``).

    A finished stage refetches nothing and reads its files against the SHA-256 it recorded: a
    changed file is refused, a deleted one fetched again and held to the recorded digest, and a
    missing or changed ``manifest.json`` is written again from the record and those verified
    files (it holds nothing else). Given another source (a URL, a local path) or ``sha256`` for a
    split, a finished stage continues when the new one names the recorded bytes (its configured
    digest, the local file's, else the URL's file, downloaded for the check): the file stays
    where it is, so later stages see the same path, and the new source is recorded; other bytes
    are refused (``_adopt_same_bytes``)."""
    from memsearch.data.download import data_file_problem, download

    folder = out / "data"
    sources = {name: {"source": getattr(cfg.data, name), "sha256": getattr(cfg.data, f"{name}_sha256")}
               for name in SPLITS}
    stage = Stage(folder, "download", sources, out / "download.stage.json")
    # e.g. a local path given after the URL could not be reached: only that split is fetched again
    stage.restart_if_changed(echo, {name: folder / name for name in SPLITS})
    _adopt_same_bytes(stage, sources, folder, echo)
    done = stage.done()
    record = stage.record() if done else None
    recorded = (record or {}).get("outputs", {}).get("sha256", {})
    stored = _stored_names(record, sources)
    stage.start()
    files, failed = {}, []
    for name, source in sources.items():
        dest = folder / name / stored[name]
        try:
            if done and dest.is_file():
                got_sha = sha256_file(dest)
                if got_sha != recorded[name]:
                    raise InputError(f"data.{name}: {dest} has SHA-256 {got_sha}, not the {recorded[name]} the "
                                     f"download stage recorded: changed since; later stages were made from the "
                                     f"recorded file. Put it back, or choose a new --out (or delete {folder} and "
                                     f"{stage.record_path} to fetch it again)")
                files[name] = _entry(source, dest, got_sha)
                continue
            if done:
                echo(f"download: {dest} is missing; fetching data.{name} again from {source['source']} (it must "
                     f"have the recorded SHA-256 {recorded[name][:12]}...)")
            got = download(source["source"], dest, source["sha256"] or recorded.get(name), echo,
                           expect=data_file_problem)
        except InputError as exc:
            text = str(exc)
            failed.append(text if text.startswith(f"data.{name}: ") else
                          f"data.{name}: {text} (--set data.{name}=PATH; the same --out continues)")
            continue
        files[name] = _entry(source, got.path, got.sha256)
    if failed:
        raise InputError("\n".join(failed))
    manifest = folder / "manifest.json"
    if not done:
        write_json(manifest, {"files": files})
        stage.finish({"manifest": "data/manifest.json", "sha256": {n: files[n]["sha256"] for n in SPLITS},
                      "files": {n: f"data/{n}/{stored[n]}" for n in SPLITS}})
    elif _read_json(manifest) != {"files": files}:
        echo(f"download: {manifest} {'is missing' if not manifest.is_file() else 'differs from the record'}; "
             "written again from the stage record and the files (their SHA-256 as recorded)")
        write_json(manifest, {"files": files})
    return files


def _entry(source: dict[str, Any], path: Path, sha256: str) -> dict[str, Any]:
    """A split's line of ``data/manifest.json``."""
    return {"source": source["source"], "path": str(path), "sha256": sha256, "bytes": Path(path).stat().st_size,
            "verified": source["sha256"] is not None}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _stored_names(record: dict[str, Any] | None, sources: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The file name each split is stored under: the one a finished record names (``outputs.files``;
    an older record: its source's), else the configured source's."""
    names = {}
    for name in SPLITS:
        kept = ((record or {}).get("outputs") or {}).get("files", {}).get(name)
        source = ((record or {}).get("inputs") or {}).get(name, {}).get("source") or sources[name]["source"]
        names[name] = Path(kept).name if kept else _file_name(source)
    return names


def _adopt_same_bytes(stage: Stage, sources: dict[str, dict[str, Any]], folder: Path, echo) -> None:
    """A finished download stage whose sources changed continues when every changed split's new
    source names the bytes the stage recorded (``Stage.adopt``: the new sources recorded, the
    files kept where they are); ``InputError`` naming the split when one names other bytes. Any
    other record is left to ``Stage.done`` (resumed, skipped or refused as ever)."""
    from memsearch.pipelines.stage_versions import RECORD_VERSION

    record = stage.record()
    if (not record or not record.get("complete") or record.get("fingerprint") == stage.fingerprint
            or record.get("version") != RECORD_VERSION):
        return
    before = record.get("inputs") or {}
    outputs = record.get("outputs") or {}
    recorded = outputs.get("sha256") or {}
    if set(before) != set(SPLITS) or set(recorded) != set(SPLITS):
        return
    changed = [n for n in SPLITS if before[n] != stage.inputs[n]]
    stored = _stored_names(record, sources)
    for name in changed:
        old, new = before[name]["source"], sources[name]
        sha = _source_sha256(name, new, folder / f".check-{name}", stored[name], echo)
        if sha != recorded[name]:
            given = f"data.{name}_sha256 = {new['sha256']!r}" if new["sha256"] else new["source"]
            raise InputError(
                f"data.{name}: {given} gives SHA-256 {sha}, not the {recorded[name]} the finished download stage "
                f"recorded from {old}: other bytes than the later stages were made from. Set data.{name} (and "
                f"data.{name}_sha256) back, or choose a new --out")
    stage.adopt({**outputs, "files": {n: f"data/{n}/{stored[n]}" for n in SPLITS}})
    for name in changed:
        echo(f"download: data.{name} is now {sources[name]['source']}: the same bytes (SHA-256 "
             f"{recorded[name][:12]}...) as the finished stage's {before[name]['source']}; continuing with "
             f"{folder / name / stored[name]} (the new source recorded)")


def _source_sha256(name: str, source: dict[str, Any], scratch: Path, file_name: str, echo) -> str:
    """The SHA-256 of the bytes ``source`` names: its configured ``sha256``, a local file's, else
    the URL's file downloaded into ``scratch`` (removed after)."""
    import shutil

    from memsearch.data.download import data_file_problem, download, local_source

    if source["sha256"]:
        return source["sha256"].lower()
    try:
        path = local_source(source["source"])
        if path is not None:
            if not path.is_file():
                raise InputError(f"{source['source']}: no such file")
            return sha256_file(path)
        try:
            return download(source["source"], scratch / file_name, None, echo, expect=data_file_problem).sha256
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    except InputError as exc:
        raise InputError(f"data.{name}: {exc}") from None


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
    tables["devices"] = config_json(cfg.devices)  # the tables are JSON: the pipeline's config records them
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

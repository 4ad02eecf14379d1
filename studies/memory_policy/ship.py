"""Ship a memory-policy adapter from a ``memsearch pipeline memory-policy`` run into the
repository (``models/memory-policy-cpu``), with a ``fingerprint.json`` whose ``provenance``
is read from the run folder (docs/memory_policy.md).

    uv run python -m studies.memory_policy.ship runs/mp/seed-1/grpo1/adapter --run runs/mp --seed 1 \
        [--dtype bfloat16] [--force] [--dest DIR]

SRC_ADAPTER_DIR is the GRPO stage-1 trainer's final adapter (RUN/seed-N/grpo1/adapter); it must
hash to the adapter recorded in RUN/seed-N/grpo1.stage.json. A non-empty destination is replaced
only with ``--force``.

What the provenance holds, every item read from the run's files (stage records, manifests,
summaries), never typed by hand:

- ``run``, ``seed``, ``source``: the run folder, the seed and the adapter folder relative to it
  (the GRPO stage-1 trainer's final adapter, ``seed-N/grpo1/adapter``);
- ``config``: the pipeline config of the run's last invocation (``invocations.jsonl``);
- ``stage``: the ``seed-N/grpo1.stage.json`` record (fingerprint, adapter hash, times); the
  source folder must still hash to the recorded ``adapter_sha256``;
- ``data``: the prepare stage's inputs (source file hashes, question counts), the prepared
  folders' manifest file hashes and the teacher rows' hashes (export and selection stages);
- ``heldout``: the seed's held-out runs (``seed-N/heldout/{sft,grpo}``) and the shared ones
  (``heldout/{base,rules}``): metrics, questions scored, usable; and the seed's paired
  differences from ``heldout/summary.json`` when the run has written it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from memsearch.assets.adapter import FINGERPRINT, shipped_adapter_dir, write_fingerprint
from memsearch.errors import InputError
from memsearch.io import iter_jsonl
from memsearch.pipelines.stage_record import folder_sha256
from memsearch.records.run_summary import RunSummary

CAST_DTYPES = ("bfloat16", "float16")
HELDOUT_METRICS = ("memory_support_recall", "memory_support_precision", "retrieval_support_recall", "f1", "em",
                   "invalid_action_rate")


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise InputError(f"{path}: missing; is this a finished `memsearch pipeline memory-policy` run folder?")
    return json.loads(path.read_text(encoding="utf-8"))


def _heldout_row(run: Path) -> dict[str, Any] | None:
    if not (run / "summary.json").is_file():
        return None
    s = RunSummary.read(run / "summary.json")
    return {"metrics": {m: s.metrics.get(m) for m in HELDOUT_METRICS}, "questions": s.tasks.scored,
            "usable_for_comparison": s.usable_for_comparison}


def run_provenance(run: str | Path, seed: int, source: str | Path) -> dict[str, Any]:
    """The provenance of ``source`` (an adapter folder of ``run``'s seed ``seed``), from the run's files."""
    run, source = Path(run), Path(source)
    stage = _json(run / f"seed-{seed}" / "grpo1.stage.json")
    if not stage.get("complete"):
        raise InputError(f"{run / f'seed-{seed}' / 'grpo1.stage.json'}: GRPO stage 1 of seed {seed} has not finished")
    actual = folder_sha256(source)
    if actual != stage["outputs"]["adapter_sha256"]:
        raise InputError(f"{source}: folder sha256 {actual} is not the stage-1 adapter recorded in "
                         f"{run / f'seed-{seed}' / 'grpo1.stage.json'} ({stage['outputs']['adapter_sha256']}); "
                         f"ship {run / f'seed-{seed}' / 'grpo1' / 'adapter'} of the same run")
    invocations = (
        [record for _, record in iter_jsonl(run / "invocations.jsonl")] if (run / "invocations.jsonl").is_file() else []
    )
    if not invocations:
        raise InputError(
            f"{run / 'invocations.jsonl'}: missing or empty; is {run} a memory-policy pipeline run folder?"
        )
    config = invocations[-1]["config"]
    prepare = _json(run / "prepare.stage.json")
    data: dict[str, Any] = {
        "prepare_fingerprint": prepare["fingerprint"],
        "prepare_inputs": prepare["inputs"],
        "prepared": {},
        "teacher_rows": {},
    }
    for split in ("train", "dev", "val"):
        manifest = run / "prepare" / split / "manifest.json"
        if manifest.is_file():
            data["prepared"][split] = _json(manifest).get("files")
    for name in ("export", "select"):
        record = run / "teacher" / f"{name}.stage.json"
        if record.is_file():
            data["teacher_rows"][name] = (_json(record).get("outputs") or {}).get("rows_sha256")
    heldout: dict[str, Any] = {}
    for policy, folder in (
        ("base", run / "heldout" / "base"),
        ("rules", run / "heldout" / "rules"),
        ("sft", run / f"seed-{seed}" / "heldout" / "sft"),
        ("grpo", run / f"seed-{seed}" / "heldout" / "grpo"),
    ):
        heldout[policy] = _heldout_row(folder)
    if heldout["grpo"] is None:
        raise InputError(
            f"{run / f'seed-{seed}' / 'heldout' / 'grpo' / 'summary.json'}: missing; ship an adapter only "
            "after its held-out evaluation has run (re-run the pipeline command to finish it)"
        )
    comparison = run / "heldout" / "summary.json"
    if comparison.is_file():
        heldout["differences"] = (_json(comparison).get("per_seed") or {}).get(str(seed))
    try:
        source_rel = str(source.resolve().relative_to(run.resolve()))
    except ValueError:
        source_rel = str(source)
    return {
        "run": str(run),
        "seed": seed,
        "source": source_rel,
        "config": config,
        "stage": {k: stage.get(k) for k in ("fingerprint", "outputs", "started", "finished")},
        "data": data,
        "heldout": heldout,
    }


def ship_adapter(
    source: str | Path,
    run: str | Path,
    seed: int,
    dest: str | Path | None = None,
    force: bool = False,
    dtype: str | None = None,
) -> Path:
    """Copy the adapter files of ``source`` (``adapter_config.json`` and ``adapter_model.*``) into
    ``dest`` (the shipped folder by default) and write its ``fingerprint.json``; refuses an
    existing ``dest`` with files unless ``force``. With ``dtype`` (``bfloat16`` / ``float16``) the
    weights are stored in that precision (the provenance records the cast and the source hash; an
    adapter cast this way is a different artefact and needs its own held-out evaluation).
    Returns ``dest``."""
    source = Path(source)
    dest = Path(dest) if dest is not None else shipped_adapter_dir()
    files = [source / "adapter_config.json", *sorted(source.glob("adapter_model.*"))]
    if not files[0].is_file() or len(files) < 2:
        raise InputError(
            f"{source}: not a LoRA adapter folder (expected adapter_config.json and adapter_model.safetensors)"
        )
    provenance = run_provenance(run, seed, source)
    base = provenance["config"].get("model", "embedded")
    if dtype is not None and dtype not in CAST_DTYPES:
        raise InputError(f"--dtype {dtype!r}: expected one of {', '.join(CAST_DTYPES)}")
    if dest.exists() and any(dest.iterdir()) and not force:
        raise InputError(f"{dest}: exists and is not empty; pass --force to replace the shipped adapter")
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.iterdir():  # --force: the folder holds exactly the new adapter and its fingerprint
        if old.is_file() and (old.name == FINGERPRINT or old.name.startswith("adapter_")):
            old.unlink()
    for path in files:
        shutil.copy2(path, dest / path.name)
    normalized = _portable_adapter_config(dest / "adapter_config.json", base)
    if normalized:
        provenance["adapter_config_normalized"] = normalized
    if dtype is not None:
        provenance["weights_cast"] = _cast_weights(dest / "adapter_model.safetensors", dtype)
    write_fingerprint(dest, base, provenance)
    return dest


def _portable_adapter_config(path: Path, base: str) -> dict[str, Any] | None:
    """peft records the base model's folder as the trainer saw it: for the embedded model an
    absolute cache path of the training machine. The shipped copy names the base as the config
    does (``embedded``); memsearch loads the base itself and never reads this field. Returns what
    changed (the source file's hash stays in the stage record and the provenance) or None."""
    import hashlib

    raw = path.read_bytes()
    config = json.loads(raw)
    if config.get("base_model_name_or_path", base) == base:
        return None
    config["base_model_name_or_path"] = base
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return {
        "field": "base_model_name_or_path",
        "to": base,
        "source_sha256": hashlib.sha256(raw).hexdigest(),
        "why": "the training machine's absolute path replaced by the config's base model name",
    }


def _cast_weights(path: Path, dtype: str) -> dict[str, Any]:
    """Store the floating tensors of a safetensors file in ``dtype``, in place. Why: the trainer
    saves float32 LoRA weights, and the repository ships the adapter in git, where half the bytes
    matter; the hf backend copies them into its float32 modules when it loads them, so the cast
    only rounds the weights. Returns the record of what changed."""
    import hashlib

    import torch
    from safetensors.torch import load_file, save_file

    if not path.is_file():
        raise InputError(f"{path}: --dtype needs the adapter's weights as adapter_model.safetensors")
    raw = path.read_bytes()
    tensors = load_file(str(path))
    target = getattr(torch, dtype)
    cast = {name: t.to(target) if t.is_floating_point() else t for name, t in tensors.items()}
    save_file(cast, str(path), metadata={"format": "pt"})
    return {
        "file": path.name,
        "dtype": dtype,
        "source_sha256": hashlib.sha256(raw).hexdigest(),
        "source_bytes": len(raw),
        "bytes": path.stat().st_size,
        "source_dtypes": sorted({str(t.dtype).removeprefix("torch.") for t in tensors.values()}),
        "why": "half the bytes in git; the hf backend loads them into float32 modules (the cast only rounds)",
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m studies.memory_policy.ship SRC_ADAPTER_DIR --run RUN --seed N [--dest DIR] [--force]
    [--dtype D]``."""
    parser = argparse.ArgumentParser(description="Ship a trained memory-policy adapter into "
                                     "models/memory-policy-cpu with its fingerprint.json.")
    parser.add_argument("source", type=Path, metavar="SRC_ADAPTER_DIR", help="RUN/seed-N/grpo1/adapter")
    parser.add_argument("--run", type=Path, required=True, help="the pipeline run folder (the pipeline's --out)")
    parser.add_argument("--seed", type=int, required=True, help="the seed whose adapter this is")
    parser.add_argument("--dest", type=Path, default=None, help="default: models/memory-policy-cpu of this checkout")
    parser.add_argument("--force", action="store_true", help="replace an existing shipped adapter")
    parser.add_argument("--dtype", choices=CAST_DTYPES, default=None,
                        help="store the weights in this precision (half the bytes; evaluate the shipped copy again)")
    args = parser.parse_args(argv)
    try:
        dest = ship_adapter(args.source, args.run, args.seed, args.dest, args.force, args.dtype)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    record = json.loads((dest / FINGERPRINT).read_text(encoding="utf-8"))
    print(f"shipped {args.source} -> {dest}")
    for name, sha in record["files"].items():
        print(f"  {name}  sha256 {sha}")
    grpo = record["provenance"]["heldout"]["grpo"]
    print(f"  held-out (seed {args.seed}, {grpo['questions']} questions): {json.dumps(grpo['metrics'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

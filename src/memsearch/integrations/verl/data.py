"""``memsearch verl export-data``: a prepared data folder as the parquet verl's ``RLHFDataset`` reads.

One row per task:

- ``prompt``: ``[{"role": "user", "content": question}]``, the question only: verl's
  ``filter_overlong_prompts`` tokenizes it, and the loop builds every real prompt itself;
- ``data_source``: ``memsearch/<kind>`` (verl groups validation metrics by it);
- ``agent_name``: the memsearch loop (``memsearch_agent``);
- ``reward_model``: ``{"style": "rule", "ground_truth": [gold, aliases...]}``, the only place a
  label appears (verl hands it to ``compute_score`` only);
- ``extra_info``: ``index``, ``split``, ``task_id``, ``doc_ids``, ``data_dir`` (the folder the
  loop reads the task's documents from, so train and validation files may come from different
  folders) and the data fingerprint (``dataset_sha256``: the manifest's SHA-256), which the loop
  checks, so a run can prove which folder it read; with ``role``, also the trained role the
  file is meant for (the loop refuses a config that trains another).

Documents stay out of the rows: verl copies every column into every output row of a session,
and the loop reads them from the prepared folder (cached per worker).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memsearch.integrations.verl import AGENT_NAME

COLUMNS = ("prompt", "data_source", "agent_name", "reward_model", "extra_info")


def parquet_rows(data_dir: str | Path, role: str | None = None) -> list[dict[str, Any]]:
    """The rows of ``data_dir`` (module doc), tasks in folder order."""
    from memsearch.data.dataset import load_dataset
    from memsearch.io import sha256_file

    dataset = load_dataset(data_dir)
    labels = dataset.labels_by_id()
    fingerprint = sha256_file(Path(data_dir) / "manifest.json")
    kind = dataset.manifest.get("kind") or "data"
    split = dataset.manifest.get("split")
    folder = str(Path(data_dir).resolve())  # Ray workers may start in another directory
    rows = []
    for i, task in enumerate(dataset.tasks):
        rows.append({
            "prompt": [{"role": "user", "content": task.question}],
            "data_source": f"memsearch/{kind}",
            "agent_name": AGENT_NAME,
            "reward_model": {"style": "rule", "ground_truth": list(labels[task.id].answers)},
            "extra_info": {"index": i, "split": split, "task_id": task.id, "doc_ids": list(task.doc_ids),
                           "data_dir": folder, "dataset_sha256": fingerprint, **({"role": role} if role else {})},
        })
    return rows


def export_parquet(data_dir: str | Path, out: str | Path, role: str | None = None) -> int:
    """Write ``parquet_rows(data_dir)`` to ``out`` (needs pyarrow; verl installs it); returns the row count."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # the base package does not depend on pyarrow
        raise RuntimeError("export-data writes parquet with pyarrow: install the verl extra "
                           "(uv sync --extra verl --no-dev) or pip install pyarrow") from exc
    rows = parquet_rows(data_dir, role)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows)
    tmp = out.with_name(out.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(out)  # a reader never sees a half-written file
    return len(rows)

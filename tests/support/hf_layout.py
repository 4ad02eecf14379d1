"""The shipped samples rewritten in the layouts researchers download from the Hugging Face Hub,
for the converter tests: HotpotQA as the ``hotpot_qa`` dataset stores it (``id``; ``context`` and
``supporting_facts`` as structs of parallel lists), MuSiQue as its Hub exports store it (the
original fields, lists of objects as lists of structs). Parquet is written with pyarrow in the
arrow types ``datasets`` gives these features; JSON lines with json, as ``Dataset.to_json`` writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def hotpot_to_hf(ex: dict[str, Any]) -> dict[str, Any]:
    """One original HotpotQA record in the ``hotpot_qa`` layout."""
    return {
        "id": ex["_id"],
        "question": ex["question"],
        "answer": ex["answer"],
        "type": ex["type"],
        "level": ex["level"],
        "supporting_facts": {
            "title": [t for t, _ in ex["supporting_facts"]],
            "sent_id": [s for _, s in ex["supporting_facts"]],
        },
        "context": {"title": [t for t, _ in ex["context"]], "sentences": [s for _, s in ex["context"]]},
    }


def hotpot_schema():
    """The arrow schema of ``hotpot_qa`` (its features: ``Sequence`` of a dict is a struct of lists)."""
    import pyarrow as pa

    text = pa.string()
    return pa.schema([
        ("id", text), ("question", text), ("answer", text), ("type", text), ("level", text),
        ("supporting_facts", pa.struct([("title", pa.list_(text)), ("sent_id", pa.list_(pa.int32()))])),
        ("context", pa.struct([("title", pa.list_(text)), ("sentences", pa.list_(pa.list_(text)))])),
    ])


def as_parallel_lists(objects: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """A list of objects as a ``datasets`` ``Sequence`` of a dict stores it: one list per field."""
    return {key: [o[key] for o in objects] for key in objects[0]} if objects else {}


def write_parquet(path: Path, records: list[dict[str, Any]], schema=None, row_group_size: int | None = None) -> Path:
    """``records`` as a parquet file (arrow types inferred unless ``schema`` is given)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records, schema=schema), path, row_group_size=row_group_size)
    return path


def write_json_lines(path: Path, records: list[dict[str, Any]]) -> Path:
    """``records`` as JSON lines, one object per line, as ``Dataset.to_json`` writes them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def prepared_differences(a: Path, b: Path) -> list[str]:
    """The files in which two prepared data folders differ; the manifest is compared without its
    ``source`` (the input file's name and hash), the only thing a change of layout may change."""
    names = ("corpus.jsonl", "tasks.jsonl", "labels.jsonl")
    differ = [n for n in names if (a / n).read_bytes() != (b / n).read_bytes()]
    ma, mb = (json.loads((d / "manifest.json").read_text(encoding="utf-8")) for d in (a, b))
    ma.pop("source"), mb.pop("source")
    return differ + (["manifest.json"] if ma != mb else [])

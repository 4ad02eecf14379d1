"""Source records from a parquet file, the layout the Hugging Face Hub and ``datasets``
(``Dataset.to_parquet``) store HotpotQA and MuSiQue in.

pyarrow reads it and is imported only here, when a parquet file is given: the package does not
depend on it (``datasets`` brings it into the dev environment; ``pip install pyarrow`` elsewhere).
Arrow structs become dicts and lists become lists, so a row reads like the same record exported
as JSON lines and the converters see one layout per dataset, whichever file it came from.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memsearch.errors import InputError, Problem

MAGIC = b"PAR1"
# Rows decoded at a time: memory stays bounded on a 90k-question train file, and --limit stops
# reading after the batch holding its last record.
BATCH_ROWS = 256


def is_parquet(path: str | Path) -> bool:
    """Whether the file's bytes are parquet (it starts with the format's magic ``PAR1``), whatever its name."""
    with open(path, "rb") as fh:
        return fh.read(len(MAGIC)) == MAGIC


def iter_parquet_rows(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(row_index, record)`` for each row of a parquet file, in file order (row 0 first)."""
    path = Path(path)
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError([Problem(str(path), None, "file", "a parquet file, but the pyarrow package that reads it is "
                                  "not installed; expected `pip install pyarrow`, or the dataset exported as JSON "
                                  "lines (datasets: Dataset.to_json)")]) from None
    import pyarrow as pa

    def unreadable(exc: Exception) -> InputError:
        return InputError([Problem(str(path), None, "file", f"unreadable parquet ({exc}), expected a complete "
                                   "parquet file as datasets or pyarrow write it")])

    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS)
    except (pa.ArrowException, OSError) as exc:
        raise unreadable(exc) from None
    row = 0
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as exc:  # a damaged page deep in the file
            raise unreadable(exc) from None
        if batch is None:
            return
        for record in batch.to_pylist():
            yield row, record
            row += 1

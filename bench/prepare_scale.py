"""Benchmark: `data prepare-hotpot` and `data validate` at the size of the official train file.

    uv run python bench/prepare_scale.py            # 9,000 and 90,000 records
    uv run python bench/prepare_scale.py --small 900 --large 9000

Builds two HotpotQA sources in the official layout (one JSON array on one line, as
``hotpot_train_v1.1.json``, whose 90,447 records are one array) from the shipped samples
(data/samples/hotpotqa/*.json): copy ``k`` of a sample record gets a new ``_id``, its paragraphs
in a shuffled order and a copy suffix on every title (so paragraphs are distinct across copies,
as in the real file, and supporting facts follow their titles). Each source is converted and the
folder validated through the real CLI, one process per command; wall time and peak resident
memory (``wait4``'s ``ru_maxrss`` of that process) are measured per command.

Goal: linear time (time_ratio <= 12 for 10x the records) and the large array converted in
minutes; peak memory is stated. The last line is machine-readable:

    RESULT records_ratio=<large/small> time_ratio=<t_large/t_small> peak_rss_mb=<largest of all commands>
           cpu_ratio=<the same ratio in CPU seconds> large_s=<prepare + validate of the large array>
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "samples" / "hotpotqa"
SOURCES = ("train_sample.json", "dev_distractor_sample.json", "train_extended.json")
EXE = Path(sys.executable).parent / "memsearch"


def sample_records() -> list[dict]:
    """The shipped samples' records in the original layout (files of another layout are skipped)."""
    records = []
    for name in SOURCES:
        for rec in json.loads((SAMPLES / name).read_text(encoding="utf-8")):
            if isinstance(rec, dict) and {"_id", "context", "supporting_facts"} <= rec.keys():
                records.append(rec)
    return records


def variant(rec: dict, k: int, copy: int, rng: random.Random) -> dict:
    """Record ``k`` of a source, copy ``copy`` of a sample record: a new id (the samples share
    some ids between files), paragraphs shuffled, titles made distinct per copy."""
    def title(t: str) -> str:
        return f"{t} ({copy})"

    context = [[title(t), sentences] for t, sentences in rec["context"]]
    rng.shuffle(context)
    return {**rec, "_id": f"bench-{k:07d}", "context": context,
            "supporting_facts": [[title(t), i] for t, i in rec["supporting_facts"]]}


def write_source(path: Path, n: int, records: list[dict], seed: int) -> None:
    """``n`` variant records as one JSON array on one line, written record by record."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("[")
        for k in range(n):
            rec = variant(records[k % len(records)], k, k // len(records), rng)
            fh.write(("," if k else "") + json.dumps(rec, ensure_ascii=False))
        fh.write("]")


def timed(args: list[str]) -> tuple[float, float, float, str]:
    """Run one CLI command: (wall seconds, its CPU seconds, its peak RSS in MB, its stdout); a
    failure stops the bench. CPU time is stated too: on a shared machine wall time also carries
    the other processes' load."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(args, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # this process's own rusage, not all children's
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(args)} failed ({proc.returncode}):\n{err.read()[-3000:]}")
        return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out.read().strip()


def run(n: int, work: Path, records: list[dict]) -> dict:
    source = work / f"hotpot_train_{n}.json"
    write_source(source, n, records, seed=n)
    out = work / f"prepared_{n}"
    prep_s, prep_cpu, prep_mb, said = timed([str(EXE), "data", "prepare-hotpot", "--input", str(source),
                                             "--split", "train", "--out", str(out)])
    val_s, val_cpu, val_mb, _ = timed([str(EXE), "data", "validate", "--data", str(out)])
    size_mb = source.stat().st_size / 2**20
    print(f"  {n:>7} records ({size_mb:.0f} MB): prepare {prep_s:.1f} s (CPU {prep_cpu:.1f} s, {prep_mb:.0f} MB "
          f"peak), validate {val_s:.1f} s (CPU {val_cpu:.1f} s, {val_mb:.0f} MB peak); {said}", flush=True)
    source.unlink()
    return {"n": n, "prepare_s": prep_s, "validate_s": val_s, "cpu_s": prep_cpu + val_cpu,
            "rss_mb": max(prep_mb, val_mb)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", type=int, default=9_000)
    parser.add_argument("--large", type=int, default=90_000)
    args = parser.parse_args()
    records = sample_records()
    print(f"{len(records)} sample records; building arrays of {args.small} and {args.large}", flush=True)
    with tempfile.TemporaryDirectory(prefix="prepare-scale-") as tmp:
        small = run(args.small, Path(tmp), records)
        large = run(args.large, Path(tmp), records)
    t_small = small["prepare_s"] + small["validate_s"]
    t_large = large["prepare_s"] + large["validate_s"]
    print(f"prepare ratio {large['prepare_s'] / small['prepare_s']:.2f}, "
          f"validate ratio {large['validate_s'] / small['validate_s']:.2f}")
    print(f"RESULT records_ratio={args.large / args.small:g} time_ratio={t_large / t_small:.2f} "
          f"peak_rss_mb={max(small['rss_mb'], large['rss_mb']):.0f} cpu_ratio={large['cpu_s'] / small['cpu_s']:.2f} "
          f"large_s={t_large:.0f}")


if __name__ == "__main__":
    main()

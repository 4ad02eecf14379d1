"""Which memory-role SFT rows to train on: every operation row, and the NOOP rows that teach something.

A teacher run on the CPU budgets answers NOOP in about 70 % of its memory calls (probe:
316 of 430 rows), mostly because the step showed no gold sentence. Trained on all of them a
small model learns to answer NOOP; with the NOOP rows cut hard (probe: 40 of 316 kept at
random) it never says NOOP and a third of its calls overflow the memory budget. The NOOP rows
that carry the "stop when full" signal are those where a gold sentence *was* shown and not
kept (it did not fit the budget or the completion), so they are all kept; of the other NOOP
rows (nothing worth keeping was shown) a fixed share is sampled:

    kind        | the row's completion, the step's new evidence, the memory           | kept
    op          | any operation batch other than a lone NOOP                          | all
    gold_unfit  | NOOP, a gold sentence among the new evidence, not cited by memory   | all
    other_noop  | NOOP, no new gold sentence                                           | share, sampled

The step's new evidence is read from the row's prompt (``engine.prompts.memory_decision``
sections); what the memory cites from the row's ``memory_sources`` (written by ``export-sft``),
or, in rows exported before that field existed, from the prompt's memory section (which lists no
sources under ``agent.memory_sources = "hidden"``: such rows are refused). The gold sentences are
the train label's supporting facts. Labels only choose rows:
the completions are the teacher's text, unchanged. Train labels only (``export-sft`` refuses
other splits; this function checks the rows' ``source.split`` again).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memsearch.data.records import Label
from memsearch.errors import InputError
from memsearch.io import iter_jsonl, write_jsonl
from memsearch.memory.extractive import parse_extractive
from memsearch.memory.ops import Noop, parse_ops
from memsearch.text.actions import evidence_ids_in

KINDS = ("op", "gold_unfit", "other_noop")
_MEMORY_HEAD, _HIDDEN_MEMORY_HEAD = "Memory (id, kind, sources, text):\n", "Memory (id, kind, text):\n"
_EVIDENCE_HEAD, _BUDGET_HEAD = "New evidence (", "Memory budget left:"


def _sections(prompt: str, where: str) -> tuple[str | None, str]:
    """(memory, new evidence) text of a memory_decision prompt; memory is None when the prompt
    renders the items without their sources (``agent.memory_sources = "hidden"``)."""
    head = _MEMORY_HEAD if _MEMORY_HEAD in prompt else _HIDDEN_MEMORY_HEAD
    try:
        memory = prompt.split(head, 1)[1].split(_EVIDENCE_HEAD, 1)[0]
        evidence = prompt.split(_EVIDENCE_HEAD, 1)[1].split(_BUDGET_HEAD, 1)[0]
    except IndexError:
        raise InputError(f"{where}: messages: not a decision-mode memory prompt (no {_MEMORY_HEAD.strip()!r} or "
                         f"{_HIDDEN_MEMORY_HEAD.strip()!r} / {_EVIDENCE_HEAD!r} / {_BUDGET_HEAD!r} sections)") from None
    return (memory if head == _MEMORY_HEAD else None), evidence


def row_kind(row: Mapping[str, Any], label: Label, where: str = "row") -> str:
    """``op``, ``gold_unfit`` or ``other_noop`` (module docstring)."""
    # Either format (agent.memory_format): a NOOP reads the same in both.
    ops = parse_ops(row["completion"]).ops or parse_extractive(row["completion"], {}).ops
    if ops is None:
        raise InputError(f"{where}: completion: not a batch of memory ops in either format")
    if not (len(ops) == 1 and isinstance(ops[0], Noop)):
        return "op"
    memory, evidence = _sections(row["messages"][-1]["content"], where)
    if "memory_sources" in row:
        held = set(row["memory_sources"])
    elif memory is not None:
        held = set(evidence_ids_in(memory))
    else:
        raise InputError(f"{where}: memory_sources: missing, and the prompt shows the memory without its sources "
                         "(agent.memory_sources = 'hidden'), so what it cites is unknown; re-export the rows with "
                         "this version of `memsearch export-sft`, which records them")
    new_gold = set(evidence_ids_in(evidence)) & set(label.supporting_facts)
    return "gold_unfit" if new_gold - held else "other_noop"


def select_memory_rows(rows: str | Path, labels: Mapping[str, Label], out: str | Path, other_noop_share: float,
                       seed: int) -> dict[str, Any]:
    """Write the selected rows of ``rows`` (``export-sft --role memory`` output) to the new file
    ``out`` in their original order; returns counts per kind, read and kept."""
    rows, out = Path(rows), Path(out)
    if not 0.0 <= other_noop_share <= 1.0:
        raise InputError(f"other_noop_share {other_noop_share}: expected a share between 0 and 1")
    if out.exists():
        raise InputError(f"{out}: output file already exists; choose a new file (nothing was written)")
    lines: list[tuple[str, dict[str, Any]]] = []
    for lineno, row in iter_jsonl(rows):
        where = f"{rows}:{lineno}"
        if row.get("role") != "memory" or (row.get("source") or {}).get("split") != "train":
            raise InputError(f"{where}: expected a memory-role row exported from a train split "
                             f"(role {row.get('role')!r}, split {(row.get('source') or {}).get('split')!r})")
        if row.get("task_id") not in labels:
            raise InputError(f"{where}: task_id {row.get('task_id')!r} has no label in the train data given")
        lines.append((row_kind(row, labels[row["task_id"]], where), row))
    read = Counter(kind for kind, _ in lines)
    others = [i for i, (kind, _) in enumerate(lines) if kind == "other_noop"]
    sampled = set(random.Random(seed).sample(others, round(other_noop_share * len(others))))
    kept = [(kind, row) for i, (kind, row) in enumerate(lines) if kind != "other_noop" or i in sampled]
    if not kept:
        raise InputError(f"{rows}: no row selected (nothing was written)")
    partial = out.with_name(out.name + ".partial")  # renamed when complete: a crash leaves no half file at `out`
    write_jsonl(partial, (row for _, row in kept))
    partial.replace(out)
    report = {"read": {k: read[k] for k in KINDS}, "kept": {k: sum(1 for kind, _ in kept if kind == k) for k in KINDS},
              "other_noop_share": other_noop_share, "seed": seed}
    report["kept_noop_share"] = round((report["kept"]["gold_unfit"] + report["kept"]["other_noop"]) / len(kept), 4)
    return report


def describe(report: dict[str, Any]) -> str:
    """One line for logs: rows read and kept per kind."""
    return "SFT rows kept/read: " + ", ".join(f"{k} {report['kept'][k]}/{report['read'][k]}" for k in KINDS) + \
        f" (NOOP share of kept rows {report['kept_noop_share']:.2f})"

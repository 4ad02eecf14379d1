"""Training logs: one JSON line per step (``train_log.jsonl``) and TensorBoard scalars (``tb/``).

Only the main rank writes. On ``--resume`` from step k, lines after step k are dropped from the
JSONL and TensorBoard purges events after k, so a resumed run's log reads like an uninterrupted
one (no duplicated steps).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from memsearch.io import dumps_line, iter_jsonl

log = logging.getLogger(__name__)


class TrainLog:
    def __init__(
        self, out: Path, enabled: bool = True, resume_step: int | None = None, name: str = "train_log.jsonl"
    ) -> None:
        self.enabled = enabled
        self.path = out / name
        self._tb = None
        if not enabled:
            return
        if resume_step is not None and self.path.is_file():
            kept = [
                line
                for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= resume_step
            ]
            self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        try:
            from torch.utils.tensorboard import SummaryWriter

            purge = resume_step + 1 if resume_step is not None else None
            self._tb = SummaryWriter(str(out / "tb"), purge_step=purge)
        except ImportError:  # tensorboard is a dependency; keep training if a slim install lacks it
            log.warning("tensorboard is not installed: logging to %s only", self.path)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(dumps_line(record) + "\n")
        if self._tb is not None:
            step = int(record.get("step", 0))
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def read_log(path: Path) -> list[dict[str, Any]]:
    """All lines of a training log as JSON objects: an SFT log's (its own fields); a GRPO log reads
    as ``TrainStep`` records through ``records.train_step.read_train_log``."""
    return [record for _, record in iter_jsonl(path)]  # the shared reader: a bad line is named file:line

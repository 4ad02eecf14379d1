"""The collapse guard of GRPO: stop a run that has fallen into an absorbing state.

A memory policy that writes NOOP in every call earns the same reward in every rollout, so every
group has zero variance, no advantage and no gradient: nothing moves it back, and training on
only spends time (docs/results/memory_policy_cpu_v2 shows such runs). The guard reads each step's
log record (``train_log.jsonl``: ``decision_entropy`` and the op histogram ``ops``, from
``train.grpo.decisions``) and stops the run when, for ``patience`` consecutive steps,

- the decision entropy is below ``min_decision_entropy`` (the choice has become deterministic), or
- one bucket of the op histogram (an op, or invalid calls of one cause) holds more than
  ``max_op_share`` of the step's ops and invalid calls (steps with fewer than ``min_ops`` of
  them are too small to judge and reset neither count).

The sampled rollouts can hide a collapse that greedy decoding shows (a run whose sampled ops kept
ADD at 22 % had its greedy evaluation write NOOP in 150 of 150 calls:
docs/results/memory_policy_cpu_v2). With ``max_eval_op_share`` set, the guard also reads the
periodic evaluation's op counts (``eval_ops`` on an evaluation step's record) and stops when one
op holds more than that share of the evaluation's ops for ``eval_patience`` consecutive
evaluations.

It writes ``collapse.json`` in the run folder (the rule, the steps and values that tripped it,
the last checkpoint) and raises ``CollapseError``: the trainer exits non-zero, so a pipeline
stage is not marked done. The state is a function of the log, so ``--resume`` rebuilds it from
the records kept: a resume whose kept records already trip the guard (a run stopped at a
checkpoint step, e.g. its last) stops again at once instead of finishing without a word.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memsearch.io import write_json
from memsearch.records.train_step import TrainStep, read_train_log
from memsearch.train.checkpoint import checkpoints

if TYPE_CHECKING:
    from memsearch.train.config import CollapseGuardSettings
    from memsearch.train.distributed import Dist


class CollapseError(RuntimeError):
    """The collapse guard stopped the run (``collapse.json`` says why)."""


@dataclass
class CollapseGuard:
    """Counts consecutive collapsed steps; ``observe`` returns a reason once ``patience`` is reached."""

    min_decision_entropy: float
    max_op_share: float
    patience: int
    min_ops: int = 4
    max_eval_op_share: float | None = None  # None: evaluations are not judged
    eval_patience: int = 2
    low_entropy: list[dict[str, Any]] = field(default_factory=list)  # the current run of low-entropy steps
    one_op: list[dict[str, Any]] = field(default_factory=list)  # the current run of one-op steps
    eval_one_op: list[dict[str, Any]] = field(default_factory=list)  # the current run of one-op evaluations

    def observe(self, record: TrainStep) -> str | None:
        """Feed one step's log record; the reason to stop, or None."""
        entropy = record.decision_entropy
        if entropy is not None:
            if entropy < self.min_decision_entropy:
                self.low_entropy.append({"step": record.step, "decision_entropy": entropy})
            else:
                self.low_entropy = []
        ops = record.ops or {}
        if sum(ops.values()) >= self.min_ops:
            self.one_op = _extend_one_op_run(self.one_op, record.step, ops, self.max_op_share)
        eval_ops = record.eval_ops
        if self.max_eval_op_share is not None and eval_ops and sum(eval_ops.values()):
            # an evaluation without memory ops, or a step without an evaluation, neither counts nor resets
            self.eval_one_op = _extend_one_op_run(self.eval_one_op, record.step, eval_ops, self.max_eval_op_share)
        if len(self.low_entropy) >= self.patience:
            values = ", ".join(f"{r['decision_entropy']:.4f}" for r in self.low_entropy[-self.patience:])
            return (f"decision entropy below {self.min_decision_entropy} for {self.patience} steps "
                    f"(steps {self._steps(self.low_entropy)}: {values})")
        if len(self.one_op) >= self.patience:
            shares = ", ".join(f"{r['share']:.2f}" for r in self.one_op[-self.patience:])
            return (f"{self.one_op[-1]['op']} took more than {self.max_op_share:.0%} of the memory calls' ops for "
                    f"{self.patience} steps (steps {self._steps(self.one_op)}: {shares})")
        if len(self.eval_one_op) >= self.eval_patience:
            tail = self.eval_one_op[-self.eval_patience:]
            shares = ", ".join(f"{r['share']:.2f}" for r in tail)
            steps = ", ".join(str(r["step"]) for r in tail)
            return (f"{tail[-1]['op']} took more than {self.max_eval_op_share:.0%} of the greedy evaluation's ops "
                    f"in {self.eval_patience} evaluations in a row (steps {steps}: {shares})")
        return None

    def _steps(self, run: list[dict[str, Any]]) -> str:
        tail = run[-self.patience:]
        return f"{tail[0]['step']}-{tail[-1]['step']}"

    def evidence(self) -> dict[str, Any]:
        """The records behind the current counts, for ``collapse.json``."""
        return {"low_decision_entropy": self.low_entropy[-self.patience:], "one_op": self.one_op[-self.patience:],
                "eval_one_op": self.eval_one_op[-self.eval_patience:]}


def _extend_one_op_run(run: list[dict[str, Any]], step: int, ops: Mapping[str, int], max_share: float
                       ) -> list[dict[str, Any]]:
    """The run of consecutive one-op records after ``ops`` (a non-empty histogram) at ``step``:
    reset when no op holds more than ``max_share``, restarted when another op took over."""
    total = sum(ops.values())
    name, count = max(ops.items(), key=lambda kv: (kv[1], kv[0]))
    if count / total <= max_share:
        return []
    kept = run if run and run[-1]["op"] == name else []
    return [*kept, {"step": step, "op": name, "share": count / total}]


def guard_for_run(settings: CollapseGuardSettings, out: Path, start: int, dist: Dist) -> CollapseGuard | None:
    """The run's guard (None when off), fed the log records of the steps a resume keeps; raises
    ``CollapseError`` when those records already trip it (the run stopped there and would
    otherwise resume past the stop, or finish at its last step as if never stopped)."""
    if not settings.enabled:
        return None
    guard = CollapseGuard(settings.min_decision_entropy, settings.max_op_share, settings.patience, settings.min_ops,
                          settings.max_eval_op_share, settings.eval_patience)
    log_path = out / "train_log.jsonl"
    if start and log_path.is_file():
        for record in read_train_log(log_path):
            if 0 < record.step <= start and (reason := guard.observe(record)) is not None:
                stop_collapsed(guard, reason, record.step, out, dist)
    return guard


def stop_collapsed(guard: CollapseGuard, reason: str, step: int, out: Path, dist: Dist) -> None:
    """Write ``collapse.json`` (main rank) and raise ``CollapseError``."""
    found = checkpoints(out / "checkpoints")
    last = str(found[-1]) if found else None
    if dist.main:
        write_json(out / "collapse.json", {"step": step, "reason": reason, "last_checkpoint": last,
                                           **guard.evidence()})
    raise CollapseError(f"{out}: collapse guard stopped GRPO at step {step}: {reason}. The policy has collapsed "
                        f"into one decision, which no zero-variance group can undo; collapse.json has the record, "
                        f"the newest checkpoint is {last}. Change the recipe (collapse_guard in the config) rather "
                        "than resuming")

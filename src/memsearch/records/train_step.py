"""One line of GRPO's ``train_log.jsonl``: a training step's figures, an evaluation's, or both
(docs/training.md lists what each means).

``TrainStep.from_json`` reads logs of every version (a field an older log lacks is ``None``; keys
it does not know are kept in ``extra``); ``to_json`` writes the line as the trainer always has: a
training step's fields in order (``None`` written as null), then the evaluation's as ``eval_<metric>``
and ``eval_ops``. The step-0 line of a run that evaluates before training holds the evaluation only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from memsearch.records.lines import read_lines

EVAL_PREFIX = "eval_"


@dataclass(frozen=True)
class TrainStep:
    """A training step's figures summed over ranks (means per completion token where a mean is
    meant), and the periodic evaluation of its checkpoint when one ran."""

    step: int  # 1-based optimizer step (0: the evaluation before training)
    reward_mean: float | None = None  # mean reward of the trajectories trained on
    reward_std: float | None = None  # their standard deviation
    call_reward_mean: float | None = None  # mean per-call reward (credit = "state"; None otherwise)
    zero_variance_groups: int | None = None  # groups whose rewards were all equal (no advantage)
    groups: int | None = None  # groups trained on
    trajectories: int | None = None  # trajectories trained on
    rows_generated: int | None = None  # completions the policy backend returned
    rows_converted: int | None = None  # of those, made into training rows
    rows_consumed: int | None = None  # rows the update used
    rows_dropped: int | None = None  # rows left out (no token in the loss)
    rows_failed: int | None = None  # rows of failed trajectories (not trained on)
    groups_sampled: int | None = None  # groups rolled out (dynamic sampling)
    groups_dropped: int | None = None  # of those, dropped as zero-variance
    sampling_rounds: int | None = None  # rollout rounds of this step
    rows_per_trajectory: float | None = None  # mean rows per trajectory
    failed_calls: int | None = None  # calls whose request failed in the trajectories trained on
    request_errors: int | None = None  # failed requests of every trajectory rolled out
    failed_trajectories: int | None = None  # trajectories with a failed request (no group member)
    failed_share: float | None = None  # their share of those rolled out (train.grpo.failures)
    invalid_rate: float | None = None  # share of trained calls judged invalid
    loss: float | None = None  # the policy loss of the first epoch
    clip_fraction: float | None = None  # share of tokens whose ratio was clipped
    kl: float | None = None  # KL to the reference, per completion token
    entropy: float | None = None  # mean token entropy
    decision_entropy: float | None = None  # mean entropy at the tokens that choose (train.grpo.decisions)
    masked_decision_tokens: int | None = None  # decision tokens masked out of the loss
    ops: Mapping[str, int] | None = None  # the trained calls' op histogram (train.grpo.decisions)
    ratio_mean: float | None = None  # mean new/old probability ratio
    grad_norm: float | None = None  # gradient norm before clipping
    skipped_steps: int | None = None  # optimizer steps skipped (no row with a non-zero advantage)
    completion_tokens: int | None = None  # completion tokens in the loss
    prompt_tokens: int | None = None  # prompt tokens of the trained calls
    logprob_mismatch: float | None = None  # largest |rollout - recomputed| log-prob in the loss
    logprob_mismatch_mean: float | None = None  # their mean
    lr: float | None = None  # the learning rate of the step
    rollout_s: float | None = None  # seconds rolling out
    step_s: float | None = None  # seconds for the whole step
    evaluation: Mapping[str, float] = field(default_factory=dict)  # eval metrics by name (written eval_<name>)
    eval_ops: Mapping[str, int] | None = None  # the evaluation's executed ops by name (the collapse guard)
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this version does not know

    @property
    def trained(self) -> bool:
        """Whether the line holds a training step (the step-0 line holds an evaluation only)."""
        return self.reward_mean is not None

    @property
    def evaluated(self) -> bool:
        """Whether the line holds an evaluation of the step's checkpoint."""
        return bool(self.evaluation) or self.eval_ops is not None

    def evaluation_json(self) -> dict[str, Any]:
        """The step and its evaluation as the line writes them (``step``, ``eval_<metric>``, ``eval_ops``)."""
        out: dict[str, Any] = {"step": self.step, **{EVAL_PREFIX + k: v for k, v in self.evaluation.items()}}
        return out if self.eval_ops is None else {**out, "eval_ops": dict(self.eval_ops)}

    def with_evaluation(self, evaluation: Mapping[str, float], eval_ops: Mapping[str, int] | None) -> TrainStep:
        """The record with the evaluation of its checkpoint."""
        return replace(self, evaluation=dict(evaluation), eval_ops=None if eval_ops is None else dict(eval_ops))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step}
        if self.trained:  # every field, null where a figure does not apply
            out.update({name: getattr(self, name) for name in _STEP_FIELDS})
            out["ops"] = None if self.ops is None else dict(self.ops)
        else:  # an evaluation-only line, or another trainer's (SFT: loss, lr): the fields it has
            out.update({name: getattr(self, name) for name in _STEP_FIELDS if getattr(self, name) is not None})
        out.update({EVAL_PREFIX + name: value for name, value in self.evaluation.items()})
        if self.eval_ops is not None:
            out["eval_ops"] = dict(self.eval_ops)
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainStep:
        if not isinstance(data, Mapping) or not isinstance(data.get("step"), int):
            raise ValueError("not a train-log line: expected a JSON object with an integer 'step'")
        known = {k: v for k, v in data.items() if k in _STEP_FIELDS or k in ("step", "eval_ops")}
        evaluation = {k.removeprefix(EVAL_PREFIX): v for k, v in data.items()
                      if k.startswith(EVAL_PREFIX) and k != "eval_ops"}
        extra = {k: v for k, v in data.items() if k not in known and not k.startswith(EVAL_PREFIX)}
        return cls(**known, evaluation=evaluation, extra=extra)


_STEP_FIELDS = tuple(f.name for f in fields(TrainStep) if f.name not in ("step", "evaluation", "eval_ops", "extra"))


def read_train_log(path: str | Path) -> list[TrainStep]:
    """Every line of a ``train_log.jsonl``; a bad line is named by file and line (``records.lines``:
    an ``InputValueError``, so a caller catching ``ValueError`` still does)."""
    return read_lines(path, TrainStep.from_json)

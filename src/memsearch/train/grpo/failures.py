"""Failed trajectories in GRPO: an episode with a failed request is a fault, not a policy outcome.

A request that still fails after its retries (a frozen role served over HTTP, e.g. stage 1
deployed for stage 2 or a reader on an ``openai`` backend, or the retrieval service) leaves an
error in the trajectory: the call's or search's ``error``, ``counts.request_errors``,
``status = "error"``. The episode then answers nothing or works from missing evidence, and its
reward (0, or what is left of it) measures the service, not the policy's choices: trained on, a
server outage would push the policy away from whatever it did. A *failed trajectory* is one
with ``request_errors > 0`` or status ``"error"`` (``is_failed``), and in the update:

- its rows are left out, and it is no member of its group: the group's advantages are computed
  over its successful members (``batch.build_batch``); a group left with fewer than two
  successful members has no baseline and contributes nothing (its other rows are left out too);
- with ``credit.mode = "state"`` the groups that give the advantages are the state groups of each
  memory call (``train.grpo.state_credit``): a successful trajectory's calls still train when its
  task lost members, only the global term is taken over the successful members;
- dynamic sampling judges a group's reward spread over its successful members.

The rows left out are counted (``rows_failed``), so the row-count contract reads generated =
converted + dropped + failed.

The trained policy's own failed requests (its ``hf`` backend: a prompt longer than the model's
context, a schema that leaves no token, the backend closed) are no transport fault, but no
decision of the policy either: the call has no completion to train, and the episode went on
without it. They fail their trajectory the same way, and the stop message names the role.

Per step, the log counts ``request_errors`` and ``failed_trajectories`` over every trajectory
rolled out (every dynamic-sampling round). When more than ``max_failed_share`` of them failed,
the run stops before that step's update with ``FailedTrajectoriesError`` (an ``InputError``: the
CLI prints it and exits 2) naming the step, the share, the threshold and the first error.
Nothing of that step is trained or saved: ``--resume`` continues from the newest checkpoint
once the service is fixed (the threshold changes no number of the run, so a resume may raise it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from memsearch.errors import InputError
from memsearch.records.events import PolicyCall, SearchEvent

if TYPE_CHECKING:
    from memsearch.records.trajectory import Trajectory
    from memsearch.train.distributed import Dist


class FailedTrajectoriesError(InputError):
    """Too many of a step's trajectories had a failed request; the message names the step, the
    share, the threshold and the first error. An ``InputError`` (the CLI exits with status 2):
    the remedy is outside the trainer (the service), then ``--resume``."""


def is_failed(trajectory: Trajectory) -> bool:
    """Whether the episode had a request error (module doc)."""
    return trajectory.status == "error" or bool(trajectory.counts.request_errors)


def split_failed(trajectories: Sequence[Trajectory], rewards: Sequence[float]
                 ) -> tuple[list[bool], list[float]]:
    """Per trajectory whether it succeeded, and the rewards of those that did (the group's members)."""
    ok = [not is_failed(tr) for tr in trajectories]
    return ok, [r for r, good in zip(rewards, ok, strict=True) if good]


def first_error(trajectory: Trajectory) -> str:
    """The first error of a failed trajectory, with its task and where it happened."""
    where = f"task {trajectory.task_id}"
    for event in trajectory.events:
        if isinstance(event, (PolicyCall, SearchEvent)) and event.error:  # the events a request fails on
            what = f"{event.role} call" if isinstance(event, PolicyCall) else str(event.kind)
            return f"{where}, {what} at step {event.step}: {event.error}"
    return f"{where}: status {trajectory.status!r} with no error recorded on an event"


@dataclass
class StepFaults:
    """What a step's rollouts lost to failed requests, over every round (``add``)."""

    trajectories: int = 0  # trajectories rolled out
    failed: int = 0  # of them, failed ones
    request_errors: int = 0
    first_error: str | None = None

    def add(self, groups: Iterable[Sequence[Trajectory]]) -> None:
        for group in groups:
            for trajectory in group:
                self.trajectories += 1
                self.request_errors += trajectory.counts.request_errors
                if is_failed(trajectory):
                    self.failed += 1
                    if self.first_error is None:
                        self.first_error = first_error(trajectory)


def failed_share(failed: float, trajectories: float) -> float:
    return failed / trajectories if trajectories else 0.0


def check_failed_share(faults: StepFaults, max_share: float, step: int, out: Path, dist: Dist,
                       newest_checkpoint: Callable[[], Path | None]) -> None:
    """Raise ``FailedTrajectoriesError`` on every rank when more than ``max_share`` of the step's
    trajectories (summed over ranks) failed (module doc). ``newest_checkpoint`` (asked only then:
    ``train.checkpoint``, which this module, imported by the rows, must not import) names where a
    resume starts."""
    total = dist.all_sum_named({"trajectories": float(faults.trajectories), "failed": float(faults.failed)})
    share = failed_share(total["failed"], total["trajectories"])
    if share <= max_share:
        return
    newest = newest_checkpoint()
    resume = f"--resume continues from {newest}" if newest else "no checkpoint was saved yet: start it again"
    error = faults.first_error or "none on this rank (see the other ranks' output)"
    raise FailedTrajectoriesError(
        f"{out}: GRPO stopped at step {step}: {int(total['failed'])} of {int(total['trajectories'])} trajectories "
        f"({share:.0%}) had a failed request, more than max_failed_share = {max_share:g}. First error: {error}. "
        "A failed request is a fault of the service, not the policy's doing: failed trajectories are never trained "
        "on, and this step was not. Check the logs of the service that failed (the model server of a frozen role, "
        f"the retrieval service; a trained role's own errors: its prompts against the model's context), then {resume}"
    )

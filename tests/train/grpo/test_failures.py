"""Failed trajectories (``train.grpo.failures``): a trajectory with a request error is no member of its
group and none of its rows is trained on; the step counts what failed and stops past
``max_failed_share``. Hand-made trajectories for the arithmetic, then a real GRPO run whose
reader is served over HTTP by the fault server (``memsearch.testing.agent_server``)."""

from __future__ import annotations

import json

import pytest
from tests.train.grpo.test_batch import call, traj
from tests.train.grpo.test_state_credit import BEFORE, GOLD, SETTINGS, branch
from tests.train.grpo.test_state_credit import trajectory as state_trajectory

from memsearch.data.records import Label
from memsearch.records.trajectory import Trajectory
from memsearch.train.distributed import Dist
from memsearch.train.grpo.batch import build_batch, rows_from_trajectory
from memsearch.train.grpo.dynamic_sampling import sample_step
from memsearch.train.grpo.failures import (
    FailedTrajectoriesError,
    StepFaults,
    check_failed_share,
    first_error,
    is_failed,
)
from memsearch.train.grpo.state_credit import build_state_batch

SERVER_ERROR = "HTTP 500: scripted failure"


def failed(trajectory: Trajectory, error: str = SERVER_ERROR) -> Trajectory:
    """``trajectory`` as the engine ends it when its reader request failed after the retries."""
    data = trajectory.to_json()
    reader = {"type": "policy_call", "role": "reader", "step": 0, "error": error, "valid": None}
    return Trajectory.from_json({**data, "events": [*data["events"], reader], "status": "error",
                                 "counts": {"request_errors": 1}})


def test_a_failed_trajectory_is_no_member_of_its_group_and_gives_no_row():
    """Group 1: rewards 1, 0 and a failed 0. Its advantages are over the two that ran (+0.5, -0.5;
    with the failed one as a member they would be +0.67, -0.33). Group 2 keeps one successful
    member: no baseline, nothing trained. Every row left out is counted, so the contract closes."""
    groups = [
        [traj("q1", call("memory", 0), call("memory", 1)), traj("q1", call("memory", 0)),
         failed(traj("q1", call("memory", 0), call("memory", 1), call("memory", 2)))],
        [traj("q2", call("memory", 0)), failed(traj("q2", call("memory", 0), call("memory", 1)))],
    ]
    batch = build_batch(groups, [[1.0, 0.0, 0.0], [0.5, 0.0]], "memory", "share", False, generated=9)
    assert [r.advantage for r in batch.rows] == pytest.approx([0.5, 0.5, -0.5])
    assert [r.trajectory for r in batch.rows] == [0, 0, 1] and {r.group_index for r in batch.rows} == {0}
    assert batch.groups == 1 and batch.zero_variance_groups == 0
    assert batch.rewards == [1.0, 0.0] and batch.advantages == pytest.approx([0.5, -0.5])
    assert batch.rows_per_trajectory == [2, 1]
    assert batch.counts.converted == 3 and batch.counts.failed == 3 + 1 + 2
    batch.counts.consumed = 3
    batch.counts.check()  # generated 9 = converted 3 + failed 6
    # the same group without the failure: the failed member would have been a member
    plain = build_batch([groups[0][:2] + [traj("q1", call("memory", 0))]], [[1.0, 0.0, 0.0]], "memory", "share",
                        False, generated=4)
    assert [r.advantage for r in plain.rows][:2] == pytest.approx([2 / 3, 2 / 3])


def test_state_credit_leaves_a_failed_trajectory_out_and_takes_the_global_term_over_the_others():
    good = branch(kept=("d1:0", "d2:3"), cited=("d1:0", "d2:3"))
    calls = [([branch(), good], 1, BEFORE)]  # per-call rewards 0 and 0.5: local advantages -0.25, +0.25
    labels = {"q1": Label(id="q1", answers=["x"], supporting_facts=sorted(GOLD), gold_doc_ids=["d1", "d2"])}
    trajs = [[state_trajectory("q1", calls), state_trajectory("q1", calls), failed(state_trajectory("q1", calls))]]
    batch = build_state_batch(trajs, [[1.0, 0.0, 0.0]], labels, SETTINGS, std_scale=False, global_weight=0.2,
                              generated=6)
    # global advantages over the two that ran: +0.5 and -0.5, x 0.2 on the continued branch (1)
    assert [r.advantage for r in batch.rows] == pytest.approx([-0.25, 0.25 + 0.1, -0.25, 0.25 - 0.1])
    assert batch.counts.converted == 4 and batch.counts.failed == 2 and batch.rows_per_trajectory == [2, 2]
    assert batch.rewards == [1.0, 0.0] and batch.advantages == pytest.approx([0.5, -0.5])


def test_dynamic_sampling_judges_the_spread_of_the_successful_members_and_counts_every_failure():
    """Task t0's only reward spread comes from its failed rollout: dropped, and t1 rolled out in
    its place; the faults of both rounds are counted, the dropped group's included."""
    def roll(tasks, round_):
        groups = [[traj(t, call("memory", 0)), traj(t, call("memory", 0))] for t in tasks]
        if tasks == ["t0"]:
            groups[0][1] = failed(groups[0][1])
        return groups, 2 * len(tasks)

    def score(groups):
        return [[0.0, 1.0] if is_failed(g[1]) else [0.0, 0.5] for g in groups]

    out = sample_step([0], ["t0", "t1"], roll, score, filter_groups=True, max_extra_rounds=1, seed=0, step=1, rank=0,
                      role="memory")
    assert [g[0].task_id for g in out.groups] == ["t1"] and out.groups_dropped == 1 and out.rows_dropped == 2
    assert (out.faults.trajectories, out.faults.failed, out.faults.request_errors) == (4, 1, 1)
    assert out.faults.first_error == f"task t0, reader call at step 0: {SERVER_ERROR}"


def test_past_max_failed_share_the_step_stops_with_the_step_share_threshold_and_first_error(tmp_path):
    faults = StepFaults()
    faults.add([[traj("q1", call("memory", 0)), failed(traj("q1"))], [traj("q2"), traj("q2")]])
    assert (faults.trajectories, faults.failed) == (4, 1)
    check_failed_share(faults, 0.25, 3, tmp_path, Dist(), lambda: None)  # 25 % is not more than 0.25: the step goes on
    faults.add([[failed(traj("q3")), traj("q3")]])  # 2 of 6
    with pytest.raises(FailedTrajectoriesError) as stop:
        check_failed_share(faults, 0.25, 3, tmp_path, Dist(), lambda: None)
    message = str(stop.value)
    assert f"{tmp_path}: GRPO stopped at step 3: 2 of 6 trajectories (33%) had a failed request" in message
    assert "more than max_failed_share = 0.25" in message
    assert f"First error: task q1, reader call at step 0: {SERVER_ERROR}" in message
    assert "Check the logs of the service" in message and "no checkpoint was saved yet" in message
    check_failed_share(faults, 1.0, 3, tmp_path, Dist(), lambda: None)  # 1: never stops
    # a search the retrieval service failed, and a status without an event error, are named too
    search = {"task_id": "q4", "status": "error", "events": [{"type": "search", "step": 1, "error": "HTTP 503"}]}
    assert first_error(Trajectory.from_json(search)) == "task q4, search at step 1: HTTP 503"
    assert first_error(Trajectory.from_json({"task_id": "q5", "status": "error"})) == \
        "task q5: status 'error' with no error recorded on an event"


def test_train_logs_from_before_the_fault_counts_still_read(tmp_path):
    """The report's training view and the reward plot read a log without the new keys beside one
    with them: the old log has no value there (None), nothing is refused."""
    from memsearch.report.training import training_series
    from memsearch.train.plot import curve_records

    base = {"reward_mean": 0.2, "reward_std": 0.1, "invalid_rate": 0.0, "request_errors": 0}
    for name, extra in (("old", {}), ("new", {"failed_trajectories": 1, "failed_share": 0.125, "rows_failed": 3})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train_log.jsonl").write_text(json.dumps({"step": 1, **base, **extra}) + "\n")
    series = training_series([tmp_path / "old" / "train_log.jsonl", tmp_path / "new" / "train_log.jsonl"])
    assert series["order"][:5] == ["reward_mean", "reward_std", "invalid_rate", "failed_trajectories", "failed_share"]
    assert series["metrics"]["failed_trajectories"] == {"steps": [1], "values": [[None, 1]]}
    assert [r.reward_mean for r in curve_records(tmp_path / "old" / "train_log.jsonl")] == [0.2]


# --- a real run: the reader served over HTTP, some of its requests failing ---------------------------


def _sets(server_url: str, model, adapter, data) -> dict:
    return {"model": str(model), "adapter": str(adapter), "data": str(data), "steps": 3, "tasks_per_step": 2,
            "group_size": 3, "keep_checkpoints": 3, "episode.backends.reader.kind": "openai",
            "episode.backends.reader.model": "scripted", "episode.backends.reader.base_url": server_url,
            "episode.backends.reader.max_retries": 0}


def _rows(trajectories: list[dict]) -> int:
    """The memory rows of rollout lines (trajectories as the run wrote them)."""
    return sum(len(rows_from_trajectory(Trajectory.from_json(tr), "memory", 0, 0)[0]) for tr in trajectories)


@pytest.mark.slow
def test_a_grpo_run_trains_on_the_trajectories_that_ran_and_stops_when_the_reader_server_fails(
    tiny_model_dir, tiny_adapter_dir, hotpot_train_dir, tmp_path
):
    """2 tasks x group 3 = 6 reader requests a step, each episode's only request to the server.
    Steps 1-2: the server fails every 6th request, so one trajectory a step fails (17 %): it is
    counted, echoed and not trained on. Then it fails every 2nd (50 % > 0.25): step 3 stops
    before its update, and again on --resume (exit 2 through the CLI, the message on stderr);
    once the server is healthy, --resume finishes the run from the step-2 checkpoint."""
    from tests.train.grpo.test_grpo import CONFIG, grpo_config
    from typer.testing import CliRunner

    from memsearch.cli.app import app
    from memsearch.testing.agent_server import AgentServer
    from memsearch.train.grpo.trainer import train_grpo

    out = tmp_path / "run"
    with AgentServer(delay_s=0.0, fail_every=6, lifetime_s=240) as server:
        sets = _sets(server.base_url, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir)
        cfg = grpo_config(tmp_path, **{k: sets.pop(k) for k in ("model", "adapter", "data")}, **sets)
        lines: list[str] = []

        def echo(line: str) -> None:
            lines.append(line)
            if line.startswith("step 2/"):
                server.fail_every = 2  # the service goes bad before step 3

        with pytest.raises(FailedTrajectoriesError) as stop:
            train_grpo(cfg, out, echo=echo)
        log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
        assert [r["step"] for r in log] == [1, 2]  # step 3 was not trained on, nor logged
        for record in log:
            rolled = [json.loads(x) for x in
                      (out / "rollouts" / f"step-{record['step']:06d}.rank0.jsonl").read_text().splitlines()]
            bad = [tr for tr in rolled if tr["status"] == "error"]
            good = [tr for tr in rolled if tr["status"] == "ok"]
            assert len(bad) == 1 and len(good) == 5
            assert (record["request_errors"], record["failed_trajectories"]) == (1, 1)
            assert record["failed_share"] == pytest.approx(1 / 6) and record["trajectories"] == 5
            assert record["groups"] == 2  # the group that lost a member kept two: it still trains
            # the failed trajectory's rows were generated by the policy but never reached the loss
            assert record["rows_failed"] == _rows(bad) > 0
            assert record["rows_consumed"] == record["rows_converted"] == _rows(good)
            assert record["rows_generated"] == _rows(rolled)
            assert record["reward_mean"] == pytest.approx(sum(tr["reward"] for tr in good) / 5)
            line = next(x for x in lines if x.startswith(f"step {record['step']}/"))
            assert line.endswith("; request errors 1, failed trajectories 1 (17%, not trained on)"), line
        message = str(stop.value)
        assert "GRPO stopped at step 3: 3 of 6 trajectories (50%) had a failed request, more than " \
               "max_failed_share = 0.25" in message
        assert "reader call at step 0: " in message and "500" in message
        assert f"--resume continues from {out / 'checkpoints' / 'step-000002'}" in message
        assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001", "step-000002"]
        stopped = [json.loads(x) for x in (out / "rollouts" / "step-000003.rank0.jsonl").read_text().splitlines()]
        assert sum(tr["status"] == "error" for tr in stopped) == 3  # kept to read the errors from

        # the same command resumed while the server still fails: the same stop, as the CLI shows it
        (tmp_path / "cli.toml").write_text(CONFIG)
        args = ["train", "grpo", "--config", str(tmp_path / "cli.toml"), "--out", str(out), "--resume"]
        for k, v in _sets(server.base_url, tiny_model_dir, tiny_adapter_dir, hotpot_train_dir).items():
            args += ["--set", f"{k}={json.dumps(v)}"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "error: " in result.output and "GRPO stopped at step 3: 3 of 6 trajectories (50%)" in result.output

        server.fail_every = 0  # the service is back
        train_grpo(cfg, out, resume=True, echo=lines.append)
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3]
    assert (log[2]["request_errors"], log[2]["failed_trajectories"], log[2]["rows_failed"]) == (0, 0, 0)
    assert log[2]["trajectories"] == 6 and lines[-1].startswith("step 3/3") and "request errors" not in lines[-1]
    assert (out / "adapter" / "adapter_config.json").is_file()

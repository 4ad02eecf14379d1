"""`--resume` reads back only what `eval run` wrote (issue 54): every line of trajectories.jsonl
must be one trajectory object of a task of this run, once. Generated variants of a damaged
line (not an object, a task_id that is no string or no task of the run, a copy or a second
result of a finished task), inserted anywhere: the resume is refused naming ``file:line`` and
which line to remove, and the file is left as it was (nothing kept, dropped or appended)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memsearch.config import load_config
from memsearch.errors import InputError
from memsearch.eval.runner import read_finished, run_eval

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "configs" / "rules.toml"
TASKS = 3


@pytest.fixture(scope="module")
def finished(hotpot_dev_dir, tmp_path_factory):
    """A finished 3-task rules run, its config and its data folder."""
    cfg = load_config(RULES, [f"limit={TASKS}"])
    out = tmp_path_factory.mktemp("finished") / "run"
    run_eval(cfg, hotpot_dev_dir, out, show_progress=False)
    return out, cfg, hotpot_dev_dir


_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                          st.text(max_size=8))


@st.composite
def damaged_lines(draw, lines: list[str]) -> tuple[str, str]:
    """One line that is no trajectory of the run, and what the refusal must say about it."""
    ids = [json.loads(line)["task_id"] for line in lines]
    kind = draw(st.sampled_from(["not an object", "task_id type", "no task_id", "unknown task", "copy", "second"]))
    if kind == "not an object":
        value = draw(st.one_of(_json_scalars, st.lists(_json_scalars, max_size=3)))
        return json.dumps(value), f"json: a JSON {type(value).__name__}, expected a trajectory object"
    if kind in ("task_id type", "no task_id"):
        traj = json.loads(draw(st.sampled_from(lines)))
        if kind == "no task_id":
            del traj["task_id"]
            return json.dumps(traj), "task_id: no task_id, expected the id of a task (a string)"
        value = draw(st.one_of(st.none(), st.booleans(), st.integers(), st.lists(st.text(max_size=3), max_size=2)))
        traj["task_id"] = value
        return json.dumps(traj), f"task_id: task_id {value!r} ({type(value).__name__}), expected the id"
    if kind == "unknown task":
        traj = json.loads(draw(st.sampled_from(lines)))
        traj["task_id"] = draw(st.text(min_size=1, max_size=12).filter(lambda t: t not in ids))
        return json.dumps(traj), f"task_id: {traj['task_id']!r} is no task of this run"
    line = draw(st.sampled_from(lines))
    if kind == "copy":
        return line.rstrip("\n"), "task_id: an identical copy of task"
    traj = json.loads(line)
    traj["prediction"] = f"{traj.get('prediction')} (again)"
    return json.dumps(traj), "task_id: a second, different result for task"


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_line_that_is_no_trajectory_of_the_run_is_refused_naming_its_line(finished, tmp_path_factory, data):
    source, cfg, data_dir = finished
    lines = (source / "trajectories.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    bad, says = data.draw(damaged_lines([line.rstrip("\n") for line in lines]))
    at = data.draw(st.integers(0, len(lines)))
    out = tmp_path_factory.mktemp("damaged") / "run"
    shutil.copytree(source, out)
    traj = out / "trajectories.jsonl"
    traj.write_text("".join(lines[:at] + [bad + "\n"] + lines[at:]), encoding="utf-8")
    before = traj.read_bytes()
    lineno = at + 1
    if says.startswith("task_id: an identical copy") or says.startswith("task_id: a second"):
        # The later of the two lines of one task is the one reported.
        first = next(i for i, line in enumerate(lines) if json.loads(line)["task_id"] == json.loads(bad)["task_id"])
        lineno = max(lineno, first + 1 + (first >= at))
    with pytest.raises(InputError) as refused:
        run_eval(cfg, data_dir, out, resume=True, show_progress=False)
    message = str(refused.value)
    assert message.startswith(f"{traj}:{lineno}: {says}"), message
    assert f"remove line {lineno}" in message
    assert traj.read_bytes() == before  # nothing appended, nothing dropped


def test_read_finished_names_every_bad_line_at_once(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    path.write_text('{"task_id": "a"}\n{}\n[]\n{"task_id": 7}\n{"task_id": "z"}\n{"task_id": "a"}\n')
    with pytest.raises(InputError) as refused:
        read_finished(path, ["a", "b"])
    assert [p.line for p in refused.value.problems] == [2, 3, 4, 5, 6]
    assert read_finished(path.with_name("none.jsonl"), ["a"]) == {}


def test_read_finished_refuses_a_line_that_is_no_trajectory_record(tmp_path):
    """A line with a task id whose events are not a trajectory's is refused, naming it, not kept."""
    path = tmp_path / "trajectories.jsonl"
    path.write_text('{"task_id": "a", "status": "ok", "events": []}\n'
                    '{"task_id": "b", "status": "ok", "events": [{"type": "thought"}]}\n')
    with pytest.raises(InputError) as refused:
        read_finished(path, ["a", "b"])
    (problem,) = refused.value.problems
    assert (problem.line, problem.field) == (2, "events")
    assert "type 'thought'" in problem.message and "remove line 2" in problem.message
    path.write_text('{"task_id": "a", "status": "ok", "events": []}\n')
    (done,) = read_finished(path, ["a", "b"]).values()
    assert (done.task_id, done.ok, done.events) == ("a", True, ())

"""The memory-policy report's tables read from a run folder and its held-out summary."""

from __future__ import annotations

import json

from memsearch.pipelines.memory_policy.report import _gold_call_table, render_stage_times, stage_times


def _record(path, started, finished=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"version": 2, "stage": path.name, "fingerprint": "f", "started": started,
              "complete": finished is not None}
    path.write_text(json.dumps({**record, **({"finished": finished} if finished else {})}))


def test_stage_times_span_each_finished_stage_and_sum_a_trainers_steps(tmp_path):
    """A trainer interrupted for an hour: its span counts the hour, its logged steps do not."""
    _record(tmp_path / "seed-1" / "grpo1.stage.json", "2026-12-04T07:00:00+0000", "2026-12-04T09:30:00+0000")
    log = tmp_path / "seed-1" / "grpo1" / "train_log.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text("".join(json.dumps({"step": i, "step_s": 1800.0}) + "\n" for i in (1, 2, 3)))
    _record(tmp_path / "prepare.stage.json", "2026-12-04T06:59:00+0000", "2026-12-04T06:59:30+0000")
    _record(tmp_path / "seed-2" / "sft.stage.json", "2026-12-04T09:30:00+0000")  # still running: left out
    times = stage_times(tmp_path)
    assert [(t["stage"], t["span_s"], t["step_s"]) for t in times] == [
        ("prepare", 30.0, None), ("seed-1/grpo1", 9000.0, 5400.0)]
    text = render_stage_times(times)
    assert "| seed-1/grpo1 | 2026-12-04T07:00:00+0000 | 150.0 min | 90.0 min |" in text
    assert "| prepare | 2026-12-04T06:59:00+0000 | 0.5 min |  |" in text
    assert render_stage_times([]) == ""


def test_report_tables_the_gold_call_outcomes_of_summaries_that_have_them():
    counted = {"kept_gold": 139, "stored_other_only": 18, "stored_nothing": 88, "over_budget": 0, "invalid_other": 0}
    rows = {"rules": {"decisions": {"gold_call_outcomes": counted}}, "sft": {"decisions": {"gold_kept_share": 0.5}}}
    lines = _gold_call_table(rows)
    assert lines[3] == "| policy | kept gold | stored other only | stored nothing | over budget | invalid other |"
    assert lines[-1] == "| rules | 139 | 18 | 88 | 0 | 0 |"  # sft's summary predates the count: no row
    assert _gold_call_table({"sft": {"decisions": None}}) == []

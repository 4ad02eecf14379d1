"""The report's payload and HTML on real rules runs: schema, label join by task id, gzip round
trip, determinism, nothing cut, the data-folder check, comparison sets against hand-computed values."""

from __future__ import annotations

import html
import json

import pytest

from memsearch.errors import InputError
from memsearch.io import iter_jsonl
from memsearch.report.html import decode_payload, encode_payload, payload_of_html, render_html, write_report
from memsearch.report.payload import SCHEMA, build_payload


def _rows(folder):
    return [row for _, row in iter_jsonl(folder / "metrics.jsonl")]


def test_payload_schema_and_label_join(rules_matrix, hotpot_dev_dir):
    payload = build_payload([rules_matrix], hotpot_dev_dir)
    assert payload["schema"] == SCHEMA
    assert payload["run_order"] == ["A", "B", "C", "D"]
    labels = {row["id"]: row for _, row in iter_jsonl(hotpot_dev_dir / "labels.jsonl")}
    for group in "ABCD":
        run = payload["runs"][group]
        rows = _rows(rules_matrix / group)
        assert [t["task_id"] for t in run["tasks"]] == [r["task_id"] for r in rows]
        assert set(run["episodes"]) == {r["task_id"] for r in rows}
        for task, row in zip(run["tasks"], rows):
            # Joined by id: the gold is the label's first answer, the metrics are metrics.jsonl's.
            assert task["gold"] == labels[task["task_id"]]["answers"][0]
            assert (task["em"], task["f1"], task["searches"]) == (row["em"], row["f1"], row["searches"])
        assert run["header"]["metrics"]["em"] == pytest.approx(sum(r["em"] for r in rows) / len(rows))
        lo, hi = run["header"]["ci"]["f1"]
        assert lo <= run["header"]["metrics"]["f1"] <= hi
    assert (
        payload["labels"]["5a8b57f25542995d1e6f1371"]["supporting_facts"]
        == labels["5a8b57f25542995d1e6f1371"]["supporting_facts"]
    )
    # Every evidence id an episode was shown has its sentence text in the payload.
    shown = {e for t in payload["runs"]["B"]["episodes"].values() for e in t["shown_evidence"]}
    assert shown <= set(payload["evidence"])


def test_gzip_round_trip_determinism_and_no_truncation(rules_matrix, hotpot_dev_dir, tmp_path):
    payload = build_payload([rules_matrix], hotpot_dev_dir)
    assert decode_payload(encode_payload(payload)) == payload
    a = write_report([rules_matrix], hotpot_dev_dir, tmp_path / "a.html").read_bytes()
    b = write_report([rules_matrix], hotpot_dev_dir, tmp_path / "b.html").read_bytes()
    assert a == b  # same inputs, same bytes
    page = a.decode("utf-8")
    assert "http://" not in page and "https://" not in page  # nothing fetched: works offline
    embedded = payload_of_html(page)
    # The longest text of any event (a policy prompt) travels whole.
    longest = max(
        (
            m["content"]
            for run in embedded["runs"].values()
            for t in run["episodes"].values()
            for e in t["events"]
            if e["type"] == "policy_call"
            for m in e["messages"]
        ),
        key=len,
    )
    source = max(
        (
            m["content"]
            for _, t in iter_jsonl(rules_matrix / "B" / "trajectories.jsonl")
            for e in t["events"]
            if e["type"] == "policy_call"
            for m in e["messages"]
        ),
        key=len,
    )
    assert len(longest) >= len(source) > 1500  # longer than the page's preview: collapsed, never cut
    assert source in {
        m["content"]
        for t in embedded["runs"]["B"]["episodes"].values()
        for e in t["events"]
        if e["type"] == "policy_call"
        for m in e["messages"]
    }
    assert render_html(payload, "x") == render_html(json.loads(json.dumps(payload)), "x")


def test_refuses_data_of_another_folder(rules_matrix, hotpot_dev_dir, tmp_path):
    from memsearch.assets.samples import HOTPOT_DEV, samples_dir
    from memsearch.data.dataset import save_dataset
    from memsearch.data.hotpot import convert_hotpot

    other = tmp_path / "other"
    save_dataset(convert_hotpot(samples_dir() / HOTPOT_DEV, split="dev", limit=5), other)
    with pytest.raises(InputError, match="data fingerprint differs"):
        build_payload([rules_matrix], other)


def test_comparison_sets_and_deltas_by_hand(rules_matrix, short_memory_run, hotpot_dev_dir):
    payload = build_payload([rules_matrix / "B", short_memory_run], hotpot_dev_dir)
    assert payload["run_order"] == ["B", "short-memory"]
    a, b = _rows(rules_matrix / "B"), {r["task_id"]: r for r in _rows(short_memory_run)}
    regressions = [r["task_id"] for r in a if r["em"] == 1.0 and b[r["task_id"]]["em"] == 0.0]
    improvements = [r["task_id"] for r in a if r["em"] == 0.0 and b[r["task_id"]]["em"] == 1.0]
    comp = payload["comparisons"]["B|short-memory"]
    assert comp["regressions"] == regressions and comp["improvements"] == improvements
    assert len(regressions) > 0  # the fixture is built to have some: the test would be vacuous otherwise
    assert comp["n"] == 40
    assert comp["mean_delta"]["f1"] == pytest.approx(sum(b[r["task_id"]]["f1"] - r["f1"] for r in a) / 40, abs=1e-6)
    for r in a:
        assert comp["deltas"][r["task_id"]]["em"] == pytest.approx(b[r["task_id"]]["em"] - r["em"])
    # The reverse direction swaps the sets.
    back = payload["comparisons"]["short-memory|B"]
    assert back["regressions"] == [t for t in b if t in set(improvements)]
    assert sorted(back["improvements"]) == sorted(regressions)


def test_token_arrays_become_lengths():
    from memsearch.records.trajectory import Trajectory
    from memsearch.report.payload import _readable

    call = {"type": "policy_call", "role": "reader", "text": "x", "prompt_ids": [1, 2, 3], "completion_ids": [4],
            "logprobs": None}
    record = Trajectory.from_json({"task_id": "t", "status": "ok",
                                   "events": [call, {"type": "search", "query": "q"}]})
    line = record.to_json()  # what trajectories.jsonl holds
    traj = _readable(record)
    assert traj["events"][0] == {
        **{k: v for k, v in line["events"][0].items() if k not in ("prompt_ids", "completion_ids", "logprobs")},
        "token_counts": {"prompt_ids": 3, "completion_ids": 1, "logprobs": None},
    }
    assert traj["events"][0]["text"] == "x" and "prompt_ids" not in traj["events"][0]
    assert traj["events"][1] == line["events"][1] and traj["events"][1]["query"] == "q"
    assert {k: v for k, v in traj.items() if k != "events"} == {k: v for k, v in line.items() if k != "events"}
    assert _readable(None) == {"events": []}  # a task with no trajectory written


@pytest.mark.parametrize("name", ["__TITLE__", "__CSS__", "__JS__", "__PAYLOAD__", "__JS__ vs __PAYLOAD__ <b>&'\"\\1"])
def test_placeholder_text_in_the_title_is_not_expanded(name):
    """The template is filled in one pass: a run folder named like a placeholder stays text."""
    from memsearch.report.html import _static

    payload = {"runs": {name: {}}, "note": "__JS__ __CSS__ __TITLE__ __PAYLOAD__"}
    page = render_html(payload, name)
    escaped = html.escape(name)
    assert page.count(f"<title>{escaped}</title>") == 1 and page.count(f'<span id="title">{escaped}</span>') == 1
    for text in (_static("report.css"), _static("report.js"), encode_payload(payload)):
        assert page.count(text) == 1  # each placeholder's content once, where the template has it
    assert payload_of_html(page) == payload


def test_headers_carry_what_the_numbers_are_not(rules_matrix, hotpot_dev_dir, tmp_path):
    """Each run's caveats (eval.caveats) as its summary recorded them; a summary written before
    they existed gets them from its config. The memory backend and the code's source come along."""
    import shutil

    payload = build_payload([rules_matrix], hotpot_dev_dir)
    scope = "Retrieval is candidate-scope (each task's own candidate paragraphs): not open-domain full-wiki retrieval."
    header = {g: payload["runs"][g]["header"] for g in "ABCD"}
    assert header["A"]["caveats"] == [scope]
    for g in "BCD":  # rules answer their policy calls: prompt baselines (rules C's controller is no cross-ablation)
        assert header[g]["caveats"] == [
            f"{g}: no trained policy (base model or rules: no adapter, no merged checkpoint) answers the policy "
            "calls: prompt baseline(s), not RL results.", scope]
    assert header["B"]["memory_backend"]["kind"] == "rules"
    assert header["B"]["memsearch_source"]["kind"] in ("git", "distribution")
    old = tmp_path / "old-B"
    shutil.copytree(rules_matrix / "B", old)
    summary = json.loads((old / "summary.json").read_text())
    del summary["caveats"]
    (old / "summary.json").write_text(json.dumps(summary))
    assert build_payload([old], hotpot_dev_dir)["runs"]["old-B"]["header"]["caveats"] == header["B"]["caveats"]

"""Memory provenance in a metrics row (``eval.score.score_trajectory``): memory support recall of
the faithful items' ids, memory support precision over every cited id, old trajectories too."""

from __future__ import annotations

import pytest

from memsearch.data.records import Label
from memsearch.eval.score import score_trajectory
from memsearch.records.trajectory import Trajectory

LABEL = Label(id="t1", answers=["Paris"], supporting_facts=["d1:0", "d2:1", "d2:3"], gold_doc_ids=["d1", "d2"])


def _score(traj: dict, label: Label) -> dict:
    """The metrics row of a trajectory line (read as ``eval run`` reads it)."""
    return score_trajectory(Trajectory.from_json(traj), label)


def _traj(**memory) -> dict:
    return {"task_id": "t1", "status": "ok", "prediction": "Paris", "shown_evidence": ["d1:0", "d2:1", "d9:9"],
            **memory}


def test_precision_and_recall_on_a_hand_computed_memory():
    # The final memory cites d1:0 d2:1 d9:9 d9:8; the faithful items cite d1:0 and d9:9.
    row = _score(_traj(memory_cited=["d1:0", "d2:1", "d9:9", "d9:8"], memory_sources=["d1:0", "d9:9"]),
                           LABEL)
    assert row.scores["memory_support_recall"] == pytest.approx(1 / 3)  # d1:0 of 3 gold facts
    assert row.scores["memory_support_precision"] == 0.25  # d1:0 of 4 cited ids
    assert row.scores["retrieval_support_recall"] == pytest.approx(2 / 3)


def test_a_memory_citing_gold_from_unfaithful_items_only_scores_zero():
    row = _score(_traj(memory_cited=["d1:0", "d2:1", "d9:9"], memory_sources=[]), LABEL)
    assert row.scores["memory_support_recall"] == 0.0 and row.scores["memory_support_precision"] == 0.0


def test_precision_is_none_without_citations_or_gold_and_old_trajectories_still_score():
    empty = _score(_traj(memory_cited=[], memory_sources=[]), LABEL)
    assert empty.scores["memory_support_recall"] == 0.0 and empty.scores["memory_support_precision"] is None
    no_gold = LABEL.model_copy(update={"supporting_facts": []})
    row = _score(_traj(memory_cited=["d1:0"], memory_sources=["d1:0"]), no_gold)
    assert row.scores["memory_support_recall"] is None and row.scores["memory_support_precision"] is None
    # Written before memory_cited existed (engine-4): memory_sources was every cited id.
    old = _score(_traj(memory_sources=["d1:0", "d9:9"]), LABEL)
    assert old.scores["memory_support_recall"] == pytest.approx(1 / 3) and old.scores["memory_support_precision"] == 0.5
    assert _score(_traj(), LABEL).scores["memory_support_precision"] is None


def test_a_failed_task_scores_zero_on_every_answer_metric_whatever_came_back():
    """A task with a request error used to be scored on the answer its reader still gave (a run
    with all 5 tasks failed reported EM 0.2). Now every answer metric is 0 (None where the task
    has no gold facts to judge citations by); what the episode saw is still measured."""
    from memsearch.eval.score import answer_keys

    assert answer_keys() == ("em", "f1", "sub_em", "boxed_em", "sub_em_lenient", "citation_precision",
                             "citation_recall")
    right = _traj(reader_text=r"Answer: Paris \boxed{Paris}", citations=["d1:0", "d2:1", "d2:3"],
                  memory_sources=["d1:0"], memory_cited=["d1:0"])
    ok = _score(right, LABEL)
    assert all(ok.column(key) == 1.0 for key in answer_keys()), ok  # the same record, status ok: full marks
    failed = _score({**right, "status": "error"}, LABEL)
    assert {key: failed.column(key) for key in answer_keys()} == dict.fromkeys(answer_keys(), 0.0)
    assert failed.status == "error" and failed.prediction == "Paris"  # the record stays as it came
    assert failed.scores["retrieval_support_recall"] == ok.scores["retrieval_support_recall"] == pytest.approx(2 / 3)
    assert failed.scores["memory_support_recall"] == ok.scores["memory_support_recall"] == pytest.approx(1 / 3)
    # A trajectory without a status (a crash record) is failed too.
    assert _score({k: v for k, v in right.items() if k != "status"}, LABEL).scores["em"] == 0.0
    no_gold = LABEL.model_copy(update={"supporting_facts": []})
    cites = _score({**right, "status": "error"}, no_gold)
    assert [cites.scores[k] for k in ("citation_precision", "citation_recall", "em")] == [None, None, 0.0]


def test_context_truncated_calls_are_counted_by_role():
    call = {"type": "policy_call", "finish_reason": "length", "usage": {"source": "none"}}
    cut = {**call, "context_truncated": True}
    events = [{**cut, "role": "memory"}, {**cut, "role": "memory"},
              {**call, "role": "reader", "context_truncated": False}, {**call, "role": "reader"},
              {**cut, "role": "controller"}, {"type": "search", "context_truncated": True}]
    row = _score(_traj(events=events, counts={"context_truncated_calls": 3}), LABEL)
    assert row.context_truncated_by_role == {"memory": 2, "controller": 1}
    assert row.context_truncated_calls == 3
    # Written before the count existed: read from the events; none at all reads as 0.
    assert _score(_traj(events=events), LABEL).context_truncated_calls == 3
    assert _score(_traj(), LABEL).context_truncated_calls == 0


def test_a_task_that_failed_without_an_episode_has_no_latency_and_its_attempt():
    """A crash record (``Trajectory.failed``) holds no latency: None in its row, left out of the
    mean (a 0.0 would pull the run's mean latency down); a record without ``attempt`` is attempt 1."""
    crashed = Trajectory.failed("t1", "q?", "B", "RuntimeError: boom", attempt=3)
    row = score_trajectory(crashed, LABEL)
    assert (row.status, row.latency_s, row.attempt, row.scores["em"], row.policy_calls) == \
        ("error", None, 3, 0.0, 0)
    read_back = _score(crashed.to_json(), LABEL)  # as eval run scores the line it wrote
    assert read_back == row
    ran = _score({**_traj(), "latency_s": 1.5}, LABEL)
    assert (ran.latency_s, ran.attempt) == (1.5, 1)

"""memsearch's rows and advantages (``train.grpo.batch.build_batch``, ``credit = "share"``) equal verl's
``compute_advantage_for_multi_trajectories`` on the same sessions, std-scaling on and off.

The fixture was produced once by verl 0.9.1 itself (``scripts/verl/make_parity_fixture.py``, run in
the verl environment); this test needs no verl. One documented difference: a group of a single
session gets advantage = reward in verl (its mean is taken as 0, its std as 1), 0 in memsearch.
memsearch's trainer never has such a group (``group_size >= 2`` and a failed episode stays in its
group with reward 0); on verl it appears when a sibling session fails or with ``rollout.n = 1``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsearch.records.trajectory import Trajectory
from memsearch.train.grpo.batch import build_batch

FIXTURE = Path(__file__).parent / "fixtures" / "verl_advantage_parity.json"


def _trajectory(task: str, lengths: list[int]) -> Trajectory:
    # A trajectory whose trained (memory) calls generated `lengths` tokens, in episode order.
    calls = [{"type": "policy_call", "role": "memory", "step": i, "completion_ids": list(range(100, 100 + n)),
              "logprobs": [-0.5] * n, "prompt_ids": [1, 2, 3], "error": None} for i, n in enumerate(lengths)]
    return Trajectory.from_json({"task_id": task, "status": "ok", "events": calls})


def _memsearch_advantages(fixture: dict, std_scale: bool) -> tuple[list[str], list[float], list[int]]:
    groups: dict[str, list[dict]] = {}
    for s in fixture["sessions"]:
        groups.setdefault(s["uid"], []).append(s)
    trajs = [[_trajectory(uid, s["lengths"]) for s in sessions] for uid, sessions in groups.items()]
    rewards = [[s["reward"] for s in sessions] for sessions in groups.values()]
    batch = build_batch(
        trajs, rewards, "memory", "share", std_scale, generated=sum(len(s["lengths"]) for s in fixture["sessions"])
    )
    batch.counts.consumed = len(batch.rows)
    batch.counts.check()  # one row per verl output: nothing dropped or added
    keys = [f"{s['uid']}_{s['session']}_{i}" for ss in groups.values() for s in ss for i in range(len(s["lengths"]))]
    return keys, [r.advantage for r in batch.rows], [len(r.completion_ids) for r in batch.rows]


@pytest.mark.parametrize("std_scale", [True, False])
def test_share_credit_equals_verl_multi_trajectory_grpo(std_scale):
    fixture = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert fixture["verl_version"] == "0.9.1"
    verl_rows = fixture["advantages"]["std" if std_scale else "no_std"]
    keys, ours, lengths = _memsearch_advantages(fixture, std_scale)
    # Same rows in the same order (verl's {uid}_{session}_{index} keys), each advantage broadcast
    # over the row's generated tokens in verl too.
    assert keys == [r["key"] for r in verl_rows]
    assert all(r["broadcast"] for r in verl_rows)
    assert lengths == [n for s in fixture["sessions"] for n in s["lengths"]]
    for key, mine, theirs in zip(keys, ours, (r["advantage"] for r in verl_rows), strict=True):
        if key.startswith("c_"):
            continue  # the singleton group: below
        assert mine == pytest.approx(theirs, abs=1e-5), key
    # Numbers, not only agreement: group a has rewards 1.0, 0.2, -0.5 (mean 0.2333, unbiased std 0.7506).
    expected_a = [1.0215, -0.0444, -0.9771] if std_scale else [0.7667, -0.0333, -0.7333]
    assert [ours[0], ours[2], ours[5]] == pytest.approx(expected_a, abs=1e-4)
    assert ours[6:9] == [0.0, 0.0, 0.0]  # group b: equal rewards, zero variance


@pytest.mark.parametrize("std_scale", [True, False])
def test_singleton_group_differs_as_documented(std_scale):
    fixture = json.loads(FIXTURE.read_text(encoding="utf-8"))
    verl_rows = {r["key"]: r["advantage"] for r in fixture["advantages"]["std" if std_scale else "no_std"]}
    keys, ours, _ = _memsearch_advantages(fixture, std_scale)
    (single,) = [s for s in fixture["sessions"] if s["uid"] == "c"]
    for key, mine in zip(keys, ours, strict=True):
        if key.startswith("c_"):
            assert mine == 0.0  # memsearch: reward minus its own mean
            assert verl_rows[key] == pytest.approx(single["reward"], rel=1e-5)  # verl: mean 0, std 1

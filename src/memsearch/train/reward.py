"""The trajectory reward of GRPO: one number per episode, computed after it (labels join here).

    reward = metric(prediction, gold answers)
             - invalid_penalty * (invalid calls / calls of the trained role)
             - search_cost * searches

``boxed_em`` (MemAgent) scores the reader's full text (the last ``\\boxed{}``); the other
metrics score the parsed prediction. A failed episode (no prediction) scores 0 before penalties
and stays in its group.
"""

from __future__ import annotations

from typing import Any

from memsearch.data.records import Label
from memsearch.eval.metrics import answer_metric
from memsearch.train.config import RewardSettings
from memsearch.train.rows import trained_calls


def trajectory_reward(trajectory: dict[str, Any], label: Label, settings: RewardSettings, role: str) -> float:
    metric = answer_metric(settings.metric)
    text = trajectory.get("reader_text") if settings.metric == "boxed_em" else trajectory.get("prediction")
    reward = float(metric(text, label.answers))
    calls = trained_calls(trajectory, role)
    if calls and settings.invalid_penalty:
        invalid = sum(1 for c in calls if c.get("valid") is False)
        reward -= settings.invalid_penalty * invalid / len(calls)
    if settings.search_cost:
        reward -= settings.search_cost * trajectory.get("counts", {}).get("searches", 0)
    return reward

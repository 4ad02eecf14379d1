"""``compute_score`` for verl's ``reward.custom_reward_function`` (path ``pkg://memsearch.integrations.verl.reward``).

It computes memsearch's own trajectory reward (``memsearch.train.grpo.reward.trajectory_reward``:
the configured answer metric of ``memsearch.eval`` minus the invalid-action, invalid-citation and
search penalties) from the episode summary the agent loop puts in the last output's
``extra_fields["memsearch"]``. In verl 0.9.1 only the reward-loop managers
(``verl.experimental.reward_loop.reward_manager``: ``naive``, the default
``reward.reward_manager.name``, ``rate_limited`` and ``remote``) merge those fields (the agent
loop's ``tool_extra_fields`` column) into ``extra_info``; its reward-loop ``dapo`` and ``gdpo`` and
the legacy ``verl.workers.reward_manager`` classes (``naive``, ``batch``, ``dapo``, ``prime``) do
not, and under them every row would be refused below.
``solution_str`` (the decoded last output) is not read: when the memory role alone is trained
the last output is a memory update, not the answer, and the engine's parse of the reader's
text is the prediction evaluation scores.

The reward settings arrive as keyword arguments (``reward.custom_reward_function.reward_kwargs``,
written by ``memsearch verl config`` from ``reward_kwargs``): exactly ``RewardSettings``'s terms
(its defaults for those unset), an unknown one refused.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from memsearch.data.records import Label
from memsearch.eval.metrics import answer_metric
from memsearch.eval.score import protocol_answer
from memsearch.records.trajectory import Trajectory
from memsearch.train.config import RewardSettings
from memsearch.train.grpo.reward import trajectory_reward

# RewardSettings' field -> its keyword in the overrides (every verl run's overrides spell it so).
OVERRIDE_NAMES = {"invalid_call_penalty": "invalid_penalty"}
# Keywords verl's reward-loop managers add when a reward-model router exists (not memsearch's reward).
VERL_KEYWORDS = ("reward_router_address", "reward_model_tokenizer")


def reward_kwargs(settings: RewardSettings) -> dict[str, Any]:
    """``settings`` as ``reward.custom_reward_function.reward_kwargs``: every term of
    ``RewardSettings``, the one list of reward terms (a new field reaches verl with no edit here)."""
    return {OVERRIDE_NAMES.get(name, name): value for name, value in settings.model_dump().items()}


def settings_from_kwargs(kwargs: dict[str, Any]) -> RewardSettings:
    """The ``RewardSettings`` that ``reward_kwargs`` (or a ``model_dump`` of them) gave; an unknown
    term, one given under both names, or a bad value is a ``ValueError`` naming it: a dropped term
    would train on another reward than the config says."""
    fields = {value: name for name, value in OVERRIDE_NAMES.items()}
    values: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in VERL_KEYWORDS:
            continue
        name = fields.get(key, key)
        if name not in RewardSettings.model_fields:
            known = sorted({OVERRIDE_NAMES.get(f, f) for f in RewardSettings.model_fields})
            raise ValueError(f"reward_kwargs.{key}: not a memsearch reward term; expected one of {', '.join(known)}")
        if name in values:
            raise ValueError(f"reward_kwargs: {name} given twice (as {OVERRIDE_NAMES.get(name, name)} and {name})")
        values[name] = value
    try:
        return RewardSettings(**values)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"reward_kwargs: {problems}") from None


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None,
                  **kwargs: Any) -> dict[str, Any]:
    """The memsearch reward of one session, with the raw metric beside it (``reward_extra_info``).

    ``kwargs``: the reward terms (``reward_kwargs``; unset ones take ``RewardSettings``'s defaults).
    Returns ``{"score": reward, "metric": raw answer metric, "answered": 0/1}``. A row without the
    loop's summary (another agent loop's data) is refused: scoring the decoded text instead would
    silently train on a different reward.
    """
    del data_source, solution_str  # the summary carries the prediction (module doc)
    settings = settings_from_kwargs(kwargs)
    if settings.memory_recall:
        # A dropped term would train on a different reward than the config says.
        raise ValueError("memory_recall > 0: verl rows carry the gold answers only, not the supporting facts the "
                         "memory-recall term needs (memsearch verl config refuses it too)")
    summary = (extra_info or {}).get("memsearch")
    if not isinstance(summary, dict):
        raise ValueError("extra_info has no 'memsearch' summary: this row was not rolled out by MemsearchAgentLoop")
    if hasattr(ground_truth, "tolist"):  # a parquet list column arrives as a numpy array
        ground_truth = ground_truth.tolist()
    answers = [str(a) for a in ground_truth] if isinstance(ground_truth, (list, tuple)) else [str(ground_truth)]
    trajectory = Trajectory.from_json(summary)  # the trajectory's fields the reward reads (outputs.reward_summary)
    role = summary["role"]  # the summary's own field beside them
    label = Label(id=trajectory.task_id, answers=answers, supporting_facts=[], gold_doc_ids=[])
    score = trajectory_reward(trajectory, label, settings, role)
    metric = settings.metric
    text = trajectory.reader_text if metric == "boxed_em" else protocol_answer(trajectory)
    return {"score": score, "metric": float(answer_metric(metric)(text, answers)),
            "answered": int(trajectory.prediction is not None)}

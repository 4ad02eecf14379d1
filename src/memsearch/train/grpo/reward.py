"""The trajectory reward of GRPO: one number per episode, computed after it (labels join here).

    reward = metric(prediction, gold answers)
             - invalid_call_penalty * (invalid calls / calls of the trained role(s))
             - citation_penalty * (invalid citations / citations of the answer)
             - search_cost * searches
             + memory_recall * memory support recall

- metric: ``boxed_em`` (MemAgent) scores the reader's full text (the last ``\\boxed{}``); the
  other metrics score the answer the evaluation scores (``eval.score.protocol_answer``: the box
  when the reader was asked for one, no box scoring 0; else the parsed prediction),
  docs/design.md §6.
  A failed episode (no prediction) scores 0 before penalties and stays in its group.
- invalid calls: policy calls of the trained role(s) the engine judged invalid (``valid`` is
  false: unparsable or rejected memory operations, unreadable controller decisions, no answer),
  as a fraction of those calls; a role with no call in the episode is not penalised.
- invalid citations: evidence ids the reader cites that the episode never showed (the engine's
  ``invalid_citations``), as a fraction of the ids cited; an answer citing nothing is not
  penalised (citation recall is an evaluation metric, not a reward term).
- searches: the episode's retriever calls (``counts.searches``), each costing ``search_cost``.
- memory support recall: the share of the label's supporting facts whose evidence ids the final
  memory cites (``memory_sources``, as the evaluation scores it), weighted by ``memory_recall``
  (0 by default). Train labels only, like every reward term; a question without supporting
  facts adds 0. On the CPU recipe answer F1 barely moves with memory quality, so this term
  gives the memory role a signal that sees which evidence was kept (docs/memory_policy.md).

Each term's scale, explicitly: the metric is in [0, 1]; the invalid term is a *fraction* of the
calls, so with the default 0.5 one invalid call of three costs 0.5 x 1/3 = 0.167, and only an
episode whose every trained call is invalid loses the full 0.5; the citation term likewise (0.5
when every cited id was never shown); each search costs ``search_cost``; the recall term adds at
most ``memory_recall``. An over-budget ADD is a rejected batch: the memory stays as it was (as
after a NOOP), the call counts invalid (one such call of three: -0.167), and the trajectory keeps
the one advantage every row of it shares (``credit.mode = "share"``).

Defaults (``RewardSettings``): F1, both penalties 0.5, searches free (docs/design.md §7).
"""

from __future__ import annotations

from memsearch.data.records import Label
from memsearch.eval.metrics import answer_metric, support_recall
from memsearch.eval.score import protocol_answer
from memsearch.records.trajectory import Trajectory
from memsearch.train.config import RewardSettings
from memsearch.train.rows import trained_calls


def trajectory_reward(trajectory: Trajectory, label: Label, settings: RewardSettings, role: str) -> float:
    """The reward of one trajectory for trained ``role`` (module doc)."""
    metric = answer_metric(settings.metric)
    text = trajectory.reader_text if settings.metric == "boxed_em" else protocol_answer(trajectory)
    reward = float(metric(text, label.answers))
    calls = trained_calls(trajectory, role)
    if calls and settings.invalid_call_penalty:
        invalid = sum(1 for c in calls if c.valid is False)
        reward -= settings.invalid_call_penalty * invalid / len(calls)
    if trajectory.citations and settings.citation_penalty:
        reward -= settings.citation_penalty * len(trajectory.invalid_citations) / len(trajectory.citations)
    if settings.search_cost:
        reward -= settings.search_cost * trajectory.counts.searches
    if settings.memory_recall:
        reward += settings.memory_recall * (
            support_recall(trajectory.memory_sources, label.supporting_facts) or 0.0
        )
    return reward

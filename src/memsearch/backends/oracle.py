"""The ``oracle`` backend: a cold-start teacher that answers every role from *train* labels.

It writes exactly what a trained policy should emit, in the same text formats the engine's
parsers read, so its trajectories go through the normal validation and can be exported as SFT
rows (``memsearch export-sft``). Labels of an evaluation split must never produce training
data (docs/design.md §9): the backend refuses any dataset whose manifest split is not ``train``.

- memory (decision mode): ``{"ops": [...]}`` that ADDs every supporting-fact sentence shown in
  this step (first shown first) as a ``fact`` citing its evidence id; the text is the sentence,
  prefixed with its paragraph title when the sentence does not name it, so a reader can use the
  fact on its own. Facts that would push the memory over its budget (checked on a scratch copy
  of the store, the same accounting the environment uses) or the completion over
  ``max_tokens`` are dropped; ``{"ops": [{"op": "NOOP"}]}`` when nothing is left. Summary and
  overwrite modes are not supported (error result): their outputs are not operation batches.
  With ``open_items`` (``OracleSettings.open_items``) it also keeps the open sub-questions the
  labels imply, as items of kind ``open`` citing the shown evidence they were inferred from:
  HotpotQA, ``Find: <title>`` for a gold paragraph the question does not name and no evidence of
  which was shown yet, once a shown gold sentence names its title (the bridge entity); MuSiQue,
  the next sub-question of the decomposition whose earlier answers (``#1``, ...) a shown gold
  paragraph holds, with those answers filled in. An open item that is resolved (its paragraph
  shown; its answer shown) is DELETEd first, then the facts are added, then new open items if
  they still fit (in a teacher run the oracle writes every item, so every open item is its own).
- controller: ``SEARCH: <title>`` of the first gold paragraph that has no supporting fact in
  memory and was not searched for yet, else ``FINISH`` (it knows the gold titles, so it needs no
  open item; the rules controller is the one that queries them).
- reader: ``Answer: <gold answer>`` and ``Evidence: [ids]`` citing the supporting facts present
  in the memory (``\\boxed{answer}`` in overwrite mode, like the rules reader).

The request carries no task id, so the task is found by its question. Should a question occur
twice in the split, the task whose candidate documents share the most documents with those the
observation mentions (this step's evidence, the memory's sources) is taken; if that still leaves
tasks whose gold differs (e.g. nothing shown or kept yet), the call fails with an error naming
them rather than guessing.

Stream (chunk) evidence carries no evidence ids, so the memory teacher answers NOOP there.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

from memsearch.backends.base import GenerationRequest, GenerationResult, Usage
from memsearch.config.backend import OracleSettings
from memsearch.data.dataset import Dataset
from memsearch.data.records import Document, Label, Task, split_evidence_id
from memsearch.errors import InputValueError
from memsearch.memory import Memory
from memsearch.memory.extractive import fact_text, format_extractive, mentions_title
from memsearch.memory.ops import Add, Delete, Noop, Op, format_ops
from memsearch.records.observation import Observation
from memsearch.text.actions import evidence_ids_in, parse_controller
from memsearch.tokenizer import Tokenizer

_SCRATCH_BUDGET = 10**9  # for measuring the current memory before its real budget is known
_REF = re.compile(r"#(\d+)")  # a MuSiQue sub-question's reference to an earlier answer
FIND = "Find: "  # the HotpotQA open item's text: FIND + the title of the paragraph still to find


class OracleError(Exception):
    """Internal: a call the oracle cannot answer; becomes an error result."""


class OracleBackend:
    """The ``oracle`` backend (see module docstring)."""

    name = "oracle"

    def __init__(self, dataset: Dataset, tokenizer: Tokenizer, open_items: bool = False) -> None:
        split = dataset.manifest.get("split")
        if split != "train":
            raise InputValueError(
                f"oracle backend refuses a {split!r} split: it reads gold labels to produce teacher "
                "trajectories, and labels of an evaluation split must never produce training data "
                "(docs/design.md §9); prepare the train split (e.g. prepare-hotpot --split train)")
        self.tokenizer = tokenizer
        self.open_items = open_items
        self.documents: dict[str, Document] = dataset.documents_by_id()
        self.labels: dict[str, Label] = dataset.labels_by_id()
        self.by_question: dict[str, list[Task]] = {}
        for task in dataset.tasks:
            self.by_question.setdefault(task.question, []).append(task)

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        out = []
        for request in requests:
            start = time.perf_counter()
            handler = {"memory": self._memory, "controller": self._controller, "reader": self._reader}.get(request.role)
            try:
                if handler is None:
                    raise OracleError(f"oracle backend has no rule for role {request.role!r}")
                if request.observation is None:
                    raise OracleError("oracle backend needs the structured observation of the request")
                text = handler(request.observation, request.sampling.max_tokens)
            except OracleError as exc:
                out.append(GenerationResult("", "error", error=str(exc), latency_s=time.perf_counter() - start))
                continue
            out.append(
                GenerationResult(text, "stop", usage=Usage(source="none"), latency_s=time.perf_counter() - start)
            )
        return out

    async def aclose(self) -> None:
        return None

    # -- which task ------------------------------------------------------------------------

    def _label(self, obs: Observation) -> Label:
        """The label of the task this observation belongs to (see module docstring)."""
        question = obs.question
        tasks = self.by_question.get(question)
        if not tasks:
            raise OracleError(f"oracle: question not in the train dataset: {question[:80]!r}")
        if len(tasks) > 1:
            # Shown evidence comes from the task's candidates (all of it in the candidates scope,
            # most of it in the corpus scope), so the twin sharing the most documents is the one.
            docs = {split[0] for split in map(split_evidence_id, _mentioned_ids(obs)) if split}
            overlap = {t.id: len(docs & set(t.doc_ids)) for t in tasks}
            tasks = [t for t in tasks if overlap[t.id] == max(overlap.values())]
        labels = [self.labels[t.id] for t in tasks]
        gold = {(lab.answers[0], tuple(lab.supporting_facts)) for lab in labels}
        if len(gold) > 1:
            raise OracleError(
                f"oracle: tasks {', '.join(t.id for t in tasks)} share this question and the "
                "observation does not tell them apart yet"
            )
        return labels[0]

    # -- roles -----------------------------------------------------------------------------

    def _memory(self, obs: Observation, max_tokens: int) -> str:
        if obs.memory_items is None:
            raise OracleError(
                f"oracle supports decision mode only (memory mode is {obs.mode!r}): "
                "summary and overwrite outputs are not operation batches"
            )
        label = self._label(obs)
        gold = set(label.supporting_facts)
        items = [item.to_json() for item in obs.memory_items]
        kept = {s for item in obs.memory_items if item.kind == "fact" for s in item.sources}
        # Scratch copy of the store with the real budget (rendered size + what is left) and the
        # same rendering (sources shown or hidden), so the batch is judged by the same accounting
        # the environment will apply.
        snapshot = {"items": items, "next_id": _next_id(items)}
        shown = obs.sources_shown
        size = Memory.from_snapshot(snapshot, self.tokenizer, _SCRATCH_BUDGET, shown).tokens()
        scratch = Memory.from_snapshot(snapshot, self.tokenizer, size + obs.budget_left, shown)
        ops: list[Op] = []
        extractive = obs.extractive

        def offer(op: Op, source: str | None = None) -> bool:
            # What would be written must fit the policy's output budget: the text batch so far, or
            # (extractive: one op per call) this op alone by its ids, however long its sentence.
            written = format_extractive([op]) if extractive else format_ops([*ops, op])
            fits_output = self.tokenizer.count(written) <= max_tokens
            if fits_output and scratch.apply([op], {source} if source else set()).applied:  # unchanged if not
                ops.append(op)
                return True
            return False

        targets = self._open_targets(label, obs) if self.open_items else {}
        opens = {item.text: item.id for item in obs.memory_items if item.kind == "open"} if self.open_items else {}
        for text, item_id in opens.items():
            if text not in targets:  # resolved: free its room before the new facts
                offer(Delete(item_id))
        for eid, sentence in obs.evidence:
            if eid is None or eid not in gold or eid in kept:
                continue
            if offer(Add(text=self._fact_text(eid, sentence), sources=(eid,), kind="fact"), eid):
                kept.add(eid)
        for text, source in targets.items():
            if text not in opens:
                offer(Add(text=text, sources=(source,), kind="open"), source)
        if extractive:
            return format_extractive(self._one_op(ops, snapshot, size + obs.budget_left, shown, max_tokens))
        return format_ops(ops or [Noop()])

    def _one_op(self, ops: list[Op], snapshot: dict[str, Any], budget: int, show_sources: bool,
                max_tokens: int) -> list[Op]:
        """The extractive teacher's single op (what a constrained policy can write): this step's
        first two gold facts as one item when that fits (memory and output budgets), else the
        first fact, else the first other op (a DELETE of a resolved open item, a new open item),
        else NOOP."""
        facts = [op for op in ops if isinstance(op, Add) and op.kind == "fact"]
        if len(facts) >= 2:
            pair = Add(" ".join(f.text for f in facts[:2]), tuple(s for f in facts[:2] for s in f.sources))
            scratch = Memory.from_snapshot(snapshot, self.tokenizer, budget, show_sources)
            if (self.tokenizer.count(format_extractive([pair])) <= max_tokens
                    and scratch.apply([pair], set(pair.sources)).applied):
                return [pair]
        return (facts or ops)[:1] or [Noop()]

    # -- open sub-questions (open_items) -----------------------------------------------------

    def _known(self, label: Label, obs: Observation) -> list[tuple[str, str]]:
        """``(evidence id, text)`` of the gold evidence the agent holds or sees now: the memory's
        facts (their first source) and this step's gold sentences, memory first."""
        gold = set(label.supporting_facts)
        items = obs.memory_items or ()
        known = [(item.sources[0], item.text) for item in items if item.kind == "fact" and item.sources]
        return known + [(eid, s) for eid, s in obs.evidence if eid in gold]

    def _open_targets(self, label: Label, obs: Observation) -> dict[str, str]:
        """The open items the memory should hold after this step: text -> the evidence id it cites."""
        known = self._known(label, obs)
        if label.decomposition:
            return self._next_subquestion(label.decomposition, known)
        seen_docs = {split[0] for split in map(split_evidence_id, _mentioned_ids(obs)) if split}
        question = obs.question
        targets = {}
        for doc_id in label.gold_doc_ids:
            doc = self.documents.get(doc_id)
            if doc is None or doc_id in seen_docs or mentions_title(question, doc.title):
                continue
            # The bridge: a shown gold sentence of another paragraph names this one's title.
            source = next(
                (eid for eid, text in known if not eid.startswith(f"{doc_id}:") and mentions_title(text, doc.title)),
                None,
            )
            if source is not None:
                targets[f"{FIND}{doc.title}"] = source
        return targets

    @staticmethod
    def _next_subquestion(steps: list[dict[str, str]], known: list[tuple[str, str]]) -> dict[str, str]:
        """The first unanswered sub-question whose references (``#k``) are all answered by the
        known evidence, with the answers filled in, citing the evidence of its first reference.
        A sub-question without references is inferred from no evidence: never written."""

        def holding(answer: str) -> str | None:
            needle = " ".join(answer.lower().split())
            if not needle:
                return None
            # As a whole word or phrase: the answer "35" is not held by "1935".
            pattern = re.compile(rf"(?<!\w){re.escape(needle)}(?!\w)")
            return next((eid for eid, text in known if pattern.search(" ".join(text.lower().split()))), None)

        for step in steps:
            if holding(step["answer"]) is not None:
                continue  # answered already
            refs = [int(k) for k in _REF.findall(step["question"])]
            if not refs or any(not 1 <= k <= len(steps) for k in refs):
                return {}
            sources = [holding(steps[k - 1]["answer"]) for k in refs]
            if None in sources:
                return {}  # an earlier answer is still missing: that sub-question comes first
            text = _REF.sub(lambda m: steps[int(m.group(1)) - 1]["answer"], step["question"])
            return {" ".join(text.split()): sources[0]}
        return {}

    def _fact_text(self, eid: str, sentence: str) -> str:
        # The same text the memory writes for a fact of the extractive format (memory.extractive).
        split = split_evidence_id(eid)
        doc = self.documents.get(split[0]) if split else None
        return fact_text(doc.title if doc is not None else None, sentence)

    def _controller(self, obs: Observation, max_tokens: int) -> str:
        label = self._label(obs)
        in_memory = set(_memory_ids(obs))
        asked = set(obs.past_queries)
        for doc_id in label.gold_doc_ids:
            facts = {f for f in label.supporting_facts if f.startswith(f"{doc_id}:")}
            if facts & in_memory or doc_id not in self.documents:
                continue
            text = f"SEARCH: {self.documents[doc_id].title}"
            # Compare as the engine will record it (the parser trims wrapping punctuation).
            if parse_controller(text).query not in asked:
                return text
        return "FINISH"

    def _reader(self, obs: Observation, max_tokens: int) -> str:
        label = self._label(obs)
        answer = " ".join(label.answers[0].split())
        if obs.answer_format == "boxed":  # MemAgent's reader answers in \boxed{}
            return f"\\boxed{{{answer}}}"
        gold = set(label.supporting_facts)
        cites = [eid for eid in _memory_ids(obs) if eid in gold]
        # Drop citations from the end rather than exceed the answer budget.
        while True:
            text = f"Answer: {answer}\nEvidence: {', '.join(f'[{c}]' for c in cites)}"
            if not cites or self.tokenizer.count(text) <= max_tokens:
                return text
            cites.pop()


def _next_id(items: list[dict[str, Any]]) -> int:
    """The store's id counter as far as the observation shows it (after a DELETE the store's may be
    higher; the scratch copy only judges this batch, whose DELETEs name items the observation shows)."""
    numbers = [int(item["id"][1:]) for item in items if item.get("id", "")[1:].isdigit()]
    return max(numbers, default=0) + 1


def _memory_ids(obs: Observation) -> list[str]:
    """Evidence ids the memory cites: item sources (decision) or ids in the notes (summary)."""
    if obs.memory_items is not None:
        return list(dict.fromkeys(s for item in obs.memory_items for s in item.sources))
    return list(evidence_ids_in(obs.memory_text or ""))


def _mentioned_ids(obs: Observation) -> list[str]:
    """Every evidence id the observation shows: this step's evidence and the memory's sources."""
    return [eid for eid, _ in obs.evidence if eid] + _memory_ids(obs)


__all__ = ["OracleBackend", "mentions_title"]


def from_config(cfg: OracleSettings, tokenizer: Tokenizer, dataset: Dataset | None = None) -> OracleBackend:
    """The ``oracle`` kind's factory (``memsearch.registry``): needs the loaded dataset, whose
    train labels it reads (``OracleBackend`` refuses any other split)."""
    if dataset is None:
        raise ValueError("backend kind 'oracle' needs the dataset (its train labels)")
    return OracleBackend(dataset, tokenizer, open_items=cfg.open_items)

"""The episode engine: one code path for evaluation, SFT export and RL rollouts, those of
memsearch's own trainer and those of verl (``memsearch.integrations.verl`` runs this function
unchanged as a verl agent loop, docs/verl.md).

An episode runs one agent on one task and returns its trajectory (``records.Trajectory``,
holding every event). Three orthogonal choices make the agent (docs/design.md §3): the evidence source
(``search`` | ``stream``), the memory mode (``decision`` | ``summary`` | ``overwrite``) and the
controller (``fixed`` | ``policy`` | ``exhaust``); then a reader answers from the question and
the final memory only. Budgets are enforced here, never left to prompts. The engine never sees
labels: scoring joins labels by task id after the episode (``memsearch.eval.score``).

Fixed retrieval plan (identical for every group that uses it): ``max_searches`` searches, each
with the question as the query, each showing the best-ranked passages not shown before
(``passages_per_search`` of them, cut to ``evidence_tokens``).
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from memsearch.backends.base import Constraint, GenerationRequest, GenerationResult, PolicyBackend, SamplingParams
from memsearch.config import RunConfig
from memsearch.data.records import Document, Task, split_evidence_id
from memsearch.engine import prompts
from memsearch.engine.branching import branched_memory_call
from memsearch.engine.evidence import chunk_context, render_evidence
from memsearch.engine.memory_modes import make_memory
from memsearch.engine.parsing import parse_controller, parse_reader
from memsearch.memory.action_format import text_ops_constraint
from memsearch.memory.choices import fitting_choices
from memsearch.memory.extractive import written_text
from memsearch.memory.extractive_constraint import extractive_ops_constraint
from memsearch.records.causes import InvalidCause
from memsearch.records.events import CallUsage, ChunkEvent, Event, MemoryEvent, PolicyCall, SearchEvent
from memsearch.records.observation import Observation
from memsearch.records.trajectory import ENGINE_VERSION, Counts, Trajectory
from memsearch.registry import memory_mode
from memsearch.retrieval import Passage, Retriever
from memsearch.retrieval.client import RetrievalRequestError
from memsearch.tokenizer import Tokenizer

# ENGINE_VERSION is defined in memsearch.records.trajectory.
__all__ = ["ENGINE_VERSION", "Environment", "derived_seed", "run_episode"]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def derived_seed(*parts: Any) -> int:
    """A 32-bit seed that is a function of ``parts`` only (their ``str``, joined by "/"): the
    seed of every sampled call, and of the trainer's epoch orders and rollouts, so a run is
    reproducible whatever runs beside it."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little")


@dataclass
class Environment:
    """What all episodes of a run share."""

    config: RunConfig
    tokenizer: Tokenizer
    documents: dict[str, Document]
    backends: dict[str, PolicyBackend]
    retriever: Retriever | None = None
    group: str = ""
    branches: int = 1  # > 1: completions drawn at each decision-memory call (GRPO state groups, engine.branching)
    # Roles whose per-token log-probs a consumer reads (a trainer's live policies): only their
    # calls ask for them; a server may sort its whole vocabulary per token to answer.
    logprob_roles: frozenset[str] = frozenset()


@dataclass
class _Episode:
    env: Environment
    task: Task
    events: list[Event] = field(default_factory=list)
    shown: dict[str, None] = field(default_factory=dict)  # ordered set of evidence ids
    # The text each shown id stands for (its paragraph's title and the sentence): what the
    # faithfulness of a memory item citing it is judged on.
    texts: dict[str, str] = field(default_factory=dict)
    calls: int = 0
    invalid: int = 0
    request_errors: int = 0
    context_truncated: int = 0  # completions the server's context cut short (below max_tokens)

    def _seed(self, role: str, step: int, *branch: int) -> int | None:
        base = self.env.config.backends.model_dump()[role]["sampling"]["seed"]
        if base is None:
            return None
        return derived_seed(base, self.task.id, role, step, *(("branch", *branch) if branch else ()))

    def branch_seed(self, step: int) -> int:
        """Seed of the choice of the continued branch at memory call ``step`` (engine.branching)."""
        return derived_seed(self._seed("memory", step), self.task.id, "continue", step)

    async def sample(self, role: str, step: int, messages, observation: Observation, max_tokens: int,
                     constraint: Constraint | None, n: int = 1) -> list[GenerationResult]:
        """``n`` completions of one prompt in one batch (n > 1: each with its branch's seed)."""
        cfg = getattr(self.env.config.backends, role)
        seeds = [self._seed(role, step)] if n == 1 else [self._seed(role, step, k) for k in range(n)]
        requests = [
            GenerationRequest(role=role, messages=tuple(messages), observation=observation, constraint=constraint,
                              sampling=SamplingParams(temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
                                                      max_tokens=max_tokens, seed=seed,
                                                      logprobs=role in self.env.logprob_roles))
            for seed in seeds
        ]
        return list(await self.env.backends[role].generate(requests))

    async def call(self, role: str, step: int, messages, observation: Observation, max_tokens: int,
                   constraint: Constraint | None = None) -> GenerationResult:
        (result,) = await self.sample(role, step, messages, observation, max_tokens, constraint)
        self.record(role, step, messages, result, constraint, observation)
        return result

    def record(self, role: str, step: int, messages, result: GenerationResult,
               constraint: Constraint | None = None, observation: Observation | None = None) -> None:
        """Count one policy call and append its event (a memory call's with the budget left that
        ``observation`` showed it)."""
        self.calls += 1
        if not result.ok:
            self.request_errors += 1
        # Set by the backend: finish_reason "length" with fewer completion tokens than asked.
        context_truncated = bool(getattr(result, "context_truncated", False))
        self.context_truncated += context_truncated
        tok = self.env.tokenizer
        if result.usage.source == "reported":
            usage = CallUsage("reported", result.usage.prompt_tokens, result.usage.completion_tokens)
        else:
            # The backend's own source ("none": rules and oracle report nothing) as files have always held it.
            usage = CallUsage(result.usage.source, sum(tok.count(m["content"]) for m in messages),
                              tok.count(result.text))
        self.events.append(PolicyCall(
            role=role, step=step, messages=tuple(messages), text=result.text,
            completion_ids=_tuple(result.completion_ids), logprobs=_tuple(result.logprobs),
            prompt_ids=_tuple(result.prompt_ids), finish_reason=result.finish_reason,
            context_truncated=context_truncated, usage=usage, latency_s=round(result.latency_s, 4),
            attempts=result.attempts, error=result.error,
            # schema mode: training replays this constraint's masks on the completion ids
            constraint_id=constraint.id if constraint is not None else None,
            budget_left=observation.budget_left if role == "memory" and observation is not None else None,
        ))

    def judge(self, valid: bool, action: dict[str, Any] | None, reason: str | None,
              cause: InvalidCause | None) -> None:
        """Attach the parsed action and the engine's judgement to the last policy call; count
        invalid actions. ``reason`` is for a person, ``cause`` for code (``records.causes``); a
        memory call's action is its ``MemoryEvent`` (``action`` None).

        A call whose request failed produced no action to judge: it is recorded with
        ``valid = None`` and counted as a request error only, never as the policy's invalid
        action (a server that never answers must not read as a policy that always errs).
        """
        call = self.events[-1]
        assert isinstance(call, PolicyCall)
        if call.error is not None:
            self.events[-1] = replace(call, action=action, valid=None, invalid_reason=reason,
                                      invalid_cause=InvalidCause.REQUEST_FAILED)
            return
        self.events[-1] = replace(call, action=action, valid=valid, invalid_reason=None if valid else reason,
                                  invalid_cause=None if valid else cause)
        if not valid:
            self.invalid += 1


def _tuple(values) -> tuple | None:
    return None if values is None else tuple(values)

async def _search(retriever: Retriever, query: str, k: int, candidates) -> list[Passage]:
    """A search through the service's client (awaited: other episodes run meanwhile) or in process."""
    asearch = getattr(retriever, "asearch", None)
    if asearch is not None:
        return await asearch(query, k=k, candidates=candidates)
    return retriever.search(query, k=k, candidates=candidates)


@dataclass
class _Tally:
    """What the engine counts as an episode runs (``records.trajectory.Counts`` documents each)."""

    searches: int = 0
    chunks: int = 0
    chunks_cut: int = 0
    evidence_cut_sentences: int = 0
    memory_truncations: int = 0


class _Run:
    """One episode as it runs: the agent's memory, the engine's counts, and the three phases."""

    def __init__(self, task: Task, env: Environment) -> None:
        cfg = env.config
        self.cfg, self.budgets, self.tok, self.task = cfg, cfg.budgets, env.tokenizer, task
        self.ep = _Episode(env, task)
        self.memory = make_memory(cfg.agent.memory, env.tokenizer, cfg.budgets.memory_tokens, cfg.prompts,
                                  show_sources=cfg.agent.memory_sources == "shown",
                                  max_sources=cfg.agent.memory_max_sources,
                                  extractive=cfg.agent.memory_format == "extractive")
        # Schema mode (docs/design.md §7): memory ops are sampled under the JSON constraint, masks
        # replayable (RunConfig checks that the memory backend is then a local hf model).
        self.operations = memory_mode(self.memory.mode).operations  # an item store the policy edits with ops
        self.schema_mode = cfg.backends.memory.schema_mode and self.operations
        self.tally = _Tally()

    def ops_constraint(self, evidence_items) -> Constraint | None:
        """The schema constraint of a memory call (None without schema mode): the memory-ops JSON
        of the text format, bounded so that no allowed answer outruns ``policy_tokens``
        (``memory.action_format.text_ops_constraint``), or, extractive, the ops that fit this state
        (``memory.choices``)."""
        if not self.schema_mode:
            return None
        if not self.memory.extractive:
            return text_ops_constraint(self.budgets.policy_tokens, self.cfg.agent.memory_max_sources)
        choices = fitting_choices(self.memory.store, [eid for eid, _ in evidence_items if eid], self.ep.texts,
                                  set(self.ep.shown))
        return extractive_ops_constraint(choices["add"], choices["update"], choices["delete"], choices["open"])

    async def remember(self, step: int, evidence_text: str, evidence_items) -> None:
        """One memory call on new evidence, applied to the memory and judged."""
        ep, memory, task = self.ep, self.memory, self.task
        # Extractive: the item each id would become (rule-based backends count it).
        item_texts = ({eid: written_text([eid], ep.texts) for eid, _ in evidence_items if eid}
                      if memory.extractive else {})
        obs = memory.observation().observation(task.question, mode=memory.mode, evidence=tuple(evidence_items),
                                               item_texts=item_texts)
        messages = memory.messages(task.question, evidence_text)
        constraint = self.ops_constraint(evidence_items)
        if ep.env.branches > 1 and self.operations:
            result = await branched_memory_call(ep, memory, step, messages, obs, self.budgets.policy_tokens,
                                                constraint, ep.env.branches)
        else:
            result = await ep.call("memory", step, messages, obs, self.budgets.policy_tokens, constraint)
        outcome = (
            memory.update(result.text, set(ep.shown), ep.texts, step=step)
            if result.ok
            else MemoryEvent(step=step, valid=False, reason=f"request failed: {result.error}",
                             cause=InvalidCause.REQUEST_FAILED)
        )
        ep.judge(outcome.valid, None, outcome.reason, outcome.cause)
        ep.events.append(outcome)
        self.tally.memory_truncations += int(outcome.truncated)

    async def next_query(self, step: int, queries: list[str]) -> str | None:
        """The query of search ``step``: the question (fixed plan) or the controller's; ``None``
        when the controller finishes or its decision is unreadable (recorded as invalid)."""
        if self.cfg.agent.controller != "policy":
            return self.task.question
        ep, left = self.ep, self.budgets.max_searches - step
        obs = self.memory.observation().observation(self.task.question, searches_left=left,
                                                    past_queries=tuple(queries))
        messages = prompts.controller(self.task.question, self.memory.render(), left, queries)
        result = await ep.call("controller", step, messages, obs, self.budgets.policy_tokens)
        action = parse_controller(result.text) if result.ok else None
        valid = action is not None and action.kind != "invalid"
        reason = action.error if action else f"request failed: {result.error}"
        ep.judge(valid, action.to_dict() if action else {}, reason, None if valid else InvalidCause.PARSE)
        return action.query if valid and action.kind == "search" else None

    async def search_phase(self) -> None:
        """Search evidence (module doc): up to ``max_searches`` searches, each followed by a memory call."""
        ep, budgets = self.ep, self.budgets
        queries: list[str] = []
        shown_docs: list[str] = []
        for step in range(budgets.max_searches):
            query = await self.next_query(step, queries)
            if query is None:
                break
            queries.append(query)
            scope = self.task.doc_ids if self.cfg.agent.retrieval_scope == "candidates" else None
            self.tally.searches += 1
            try:
                found = await _search(ep.env.retriever, query, budgets.passages_per_search + len(shown_docs), scope)
            except RetrievalRequestError as exc:
                # The service failed after its retries: a request error, never a crash; nothing is shown.
                ep.request_errors += 1
                ep.events.append(SearchEvent(step=step, query=query, error=str(exc)))
                break
            fresh = [p for p in found if p.doc_id not in shown_docs][: budgets.passages_per_search]
            evidence = render_evidence(fresh, self.tok, budgets.evidence_tokens)
            self.tally.evidence_cut_sentences += evidence.cut_sentences
            shown_docs.extend(evidence.doc_ids)
            ep.shown.update(dict.fromkeys(evidence.ids))
            ids = set(evidence.ids)
            ep.texts.update((eid, f"{p.title}\n{sentence.strip()}") for p in fresh for eid, sentence in p.sentences
                            if eid in ids)
            ep.events.append(SearchEvent(step=step, query=query, doc_ids=tuple(evidence.doc_ids),
                                         shown=tuple(evidence.ids), evidence_tokens=evidence.tokens,
                                         cut_sentences=evidence.cut_sentences))
            if not evidence.ids:
                if self.cfg.agent.controller == "fixed":
                    break  # the plan has nothing new to show
                continue
            await self.remember(step, evidence.text, evidence.items())

    async def stream_phase(self) -> None:
        """Stream evidence: every chunk of the long context (up to ``max_chunks``), each remembered."""
        ep, documents = self.ep, self.ep.env.documents
        _, chunked = chunk_context(self.task.doc_ids, documents, self.tok, self.budgets.chunk_tokens,
                                   self.budgets.max_chunks)
        self.tally.chunks_cut = chunked.cut_off
        for step, chunk in enumerate(chunked.chunks):
            ep.shown.update(dict.fromkeys(chunked.shown_after[step]))
            for eid in chunked.shown_after[step]:
                if eid not in ep.texts and (split := split_evidence_id(eid)) is not None:
                    doc = documents[split[0]]
                    ep.texts[eid] = f"{doc.title}\n{doc.sentences[split[1]].strip()}"
            self.tally.chunks += 1
            ep.events.append(ChunkEvent(step=step, tokens=self.tok.count(chunk)))
            # Chunks carry no evidence ids; rule-based policies still get the sentences.
            await self.remember(step, chunk, [(None, s) for s in _SENTENCE_END.split(chunk) if s.strip()])

    async def answer(self, started: float) -> Trajectory:
        """The reader's answer from the final memory, and the trajectory (``records.trajectory``)."""
        ep, memory, task = self.ep, self.memory, self.task
        boxed = memory.answer_format == "boxed"  # the mode's registered reader format (engine.memory_modes)
        obs = memory.observation().observation(task.question, mode=memory.mode,
                                               answer_format="boxed" if boxed else "free")
        wording = self.cfg.prompts.overwrite_final
        messages = prompts.reader(task.question, memory.render(), boxed=boxed, template=wording)
        result = await ep.call("reader", 0, messages, obs, self.budgets.answer_tokens)
        answer = parse_reader(result.text) if result.ok else None
        readable = answer is not None and answer.answer is not None
        ep.judge(readable, answer.to_dict() if answer else {},
                 answer.error if answer else f"request failed: {result.error}",
                 None if readable else InvalidCause.PARSE)
        citations = tuple(answer.citations) if answer else ()
        return Trajectory(
            task_id=task.id, engine_version=ENGINE_VERSION, run_label=ep.env.group, question=task.question,
            prediction=answer.answer if answer else None, reader_text=result.text,
            # The reader was asked for a \boxed{} answer: scoring then reads the box only (eval.score).
            answer_format="boxed" if boxed else "free",
            citations=citations, invalid_citations=tuple(c for c in citations if c not in ep.shown),
            shown_evidence=tuple(ep.shown), memory_final=memory.render(),
            # What memory support recall scores: ids cited by items their cited sentences support
            # (memory.faithfulness); memory_cited is every id the final memory cites.
            memory_sources=tuple(memory.faithful_cited(ep.texts)), memory_cited=tuple(memory.cited()),
            counts=Counts(**asdict(self.tally), policy_calls=ep.calls, invalid_actions=ep.invalid,
                          request_errors=ep.request_errors, context_truncated_calls=ep.context_truncated),
            latency_s=round(time.perf_counter() - started, 4), status="error" if ep.request_errors else "ok",
            events=tuple(ep.events),
        )


async def run_episode(task: Task, env: Environment) -> Trajectory:
    """Run one task to the end and return its trajectory (``records.trajectory``)."""
    started = time.perf_counter()
    run = _Run(task, env)
    if env.config.agent.evidence == "search":
        await run.search_phase()
    else:
        await run.stream_phase()
    return await run.answer(started)

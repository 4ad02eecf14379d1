"""The oracle teacher on real prepared train samples: valid memory batches that keep every shown
gold sentence, gold answers citing memory, budgets respected, eval splits refused."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from memsearch.assets.samples import HOTPOT_TRAIN, MUSIQUE_TRAIN, samples_dir
from memsearch.backends import GenerationRequest, SamplingParams, make_backend
from memsearch.backends.oracle import OracleBackend, mentions_title
from memsearch.config import load_config
from memsearch.data.dataset import load_dataset, save_dataset
from memsearch.data.hotpot import convert_hotpot
from memsearch.data.musique import convert_musique
from memsearch.engine.parsing import parse_reader
from memsearch.eval.metrics import exact_match
from memsearch.eval.runner import run_eval
from memsearch.io import iter_jsonl
from memsearch.memory import Memory
from memsearch.memory.ops import format_ops, parse_ops
from memsearch.records.observation import Observation
from memsearch.records.run_summary import RunSummary
from memsearch.retrieval import BM25Retriever
from memsearch.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "configs" / "rules.toml"
ORACLE = ['backends.memory.kind="oracle"', 'backends.reader.kind="oracle"']
ROOMY = ["budgets.memory_tokens=4096", "budgets.policy_tokens=1024"]  # nothing budget-limited


def _lines(path: Path) -> list[dict]:
    return [obj for _, obj in iter_jsonl(path)]


@pytest.fixture(scope="module")
def hotpot_train(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("oracle") / "hotpot-train"
    save_dataset(convert_hotpot(samples_dir() / HOTPOT_TRAIN, split="train", limit=60), out)
    return out


@pytest.fixture(scope="module")
def musique_train(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("oracle") / "musique-train"
    save_dataset(convert_musique(samples_dir() / MUSIQUE_TRAIN, split="train", limit=60), out)
    return out


def _run(data: Path, out: Path, *overrides: str) -> tuple[list[dict], list[dict], RunSummary]:
    summary = run_eval(load_config(RULES, [*ORACLE, *overrides]), data, out, show_progress=False)
    return _lines(out / "trajectories.jsonl"), _lines(out / "metrics.jsonl"), summary


def _calls(traj: dict, role: str) -> list[dict]:
    return [e for e in traj["events"] if e["type"] == "policy_call" and e["role"] == role]


def _check_teacher_run(data: Path, trajectories: list[dict], rows: list[dict], summary: RunSummary) -> tuple[int, int]:
    """Checks every teacher call; returns (facts added, facts that got a title prefix)."""
    dataset = load_dataset(data)
    labels, docs = dataset.labels_by_id(), dataset.documents_by_id()
    assert summary.complete and summary.request_errors == 0
    assert summary.backends["memory"] == "oracle"
    prefixed = 0
    for traj in trajectories:
        gold = set(labels[traj["task_id"]].supporting_facts)
        added = []
        for call in _calls(traj, "memory"):
            assert call["valid"], call["invalid_reason"]
            ops = parse_ops(call["text"]).ops
            assert call["text"] == format_ops(ops)  # the canonical compact form a policy must emit
            for op in ops:
                if op.name == "ADD":
                    (eid,) = op.sources
                    doc = docs[eid.rsplit(":", 1)[0]]
                    sentence = doc.sentences[int(eid.rsplit(":", 1)[1])].strip()
                    assert eid in gold and op.kind == "fact"
                    assert op.text in (sentence, f"{doc.title}: {sentence}")
                    assert (op.text == sentence) == mentions_title(sentence, doc.title)
                    prefixed += op.text != sentence
                    added.append(eid)
        assert sorted(added) == sorted(gold & set(traj["shown_evidence"]))
        (reader,) = _calls(traj, "reader")
        answer = parse_reader(reader["text"])
        assert exact_match(answer.answer, labels[traj["task_id"]].answers) == 1.0  # the parser drops a final "."
        assert set(answer.citations) == set(added)
    for row in rows:
        assert row["memory_support_recall"] == row["retrieval_support_recall"], row["task_id"]
        assert row["invalid_action_rate"] == 0
    assert sum(r["f1"] for r in rows) / len(rows) >= 0.95
    assert summary.metrics["invalid_action_rate"] == 0
    return sum(len(t["memory_sources"]) for t in trajectories), prefixed


def test_oracle_keeps_every_shown_gold_sentence_on_hotpot_train(hotpot_train, tmp_path):
    trajectories, rows, summary = _run(hotpot_train, tmp_path / "run", *ROOMY)
    facts, prefixed = _check_teacher_run(hotpot_train, trajectories, rows, summary)
    # Most gold sentences name their paragraph; the others get its title (checked per fact above).
    assert 0 < prefixed < facts


def test_oracle_on_musique_train_paragraph_evidence(musique_train, tmp_path):
    trajectories, rows, summary = _run(musique_train, tmp_path / "run", *ROOMY)
    _check_teacher_run(musique_train, trajectories, rows, summary)
    # MuSiQue evidence is paragraph level: one "sentence" per document.
    assert all(eid.endswith(":0") for t in trajectories for eid in t["memory_sources"])


def test_oracle_controller_searches_gold_titles(musique_train, tmp_path):
    fixed = _run(musique_train, tmp_path / "fixed", *ROOMY)[1]
    trajectories, rows, summary = _run(musique_train, tmp_path / "policy", *ROOMY, 'agent.controller="policy"',
                                       'backends.controller.kind="oracle"')
    _check_teacher_run(musique_train, trajectories, rows, summary)
    dataset = load_dataset(musique_train)
    labels, docs = dataset.labels_by_id(), dataset.documents_by_id()
    for traj in trajectories:
        calls = _calls(traj, "controller")
        assert all(c["valid"] for c in calls)
        titles = {docs[d].title for d in labels[traj["task_id"]].gold_doc_ids}
        assert all(c["text"].removeprefix("SEARCH: ") in titles for c in calls if c["text"] != "FINISH")

    def mean(rs):
        return sum(r["retrieval_support_recall"] for r in rs) / len(rs)

    assert mean(rows) > mean(fixed) + 0.2  # searching gold titles finds far more of the gold evidence


def test_tiny_memory_budget_drops_what_does_not_fit(hotpot_train, tmp_path):
    tok = load_tokenizer("lexical")
    trajectories, rows, summary = _run(hotpot_train, tmp_path / "run", "budgets.memory_tokens=40")
    assert summary.metrics["invalid_action_rate"] == 0
    for traj in trajectories:
        assert all(c["valid"] for c in _calls(traj, "memory"))
        assert tok.count(traj["memory_final"]) <= 40
    assert any(r["memory_support_recall"] < r["retrieval_support_recall"] for r in rows)


def _obs(dataset, task_index: int = 0, **extra) -> dict:
    """A decision-mode memory observation showing every sentence of the task's gold documents."""
    task, label = dataset.tasks[task_index], dataset.labels[task_index]
    docs = dataset.documents_by_id()
    evidence = [(f"{d}:{i}", s.strip()) for d in label.gold_doc_ids for i, s in enumerate(docs[d].sentences)]
    return {"question": task.question, "evidence": evidence, "mode": "decision", "memory_items": [],
            "budget_left": 4096, **extra}


def _generate(backend, role: str, obs: dict, max_tokens: int = 1024):
    request = GenerationRequest(role=role, sampling=SamplingParams(max_tokens=max_tokens),
                                observation=Observation.from_json(obs))
    (result,) = asyncio.run(backend.generate([request]))
    return result


def test_budget_keeps_first_shown_facts_and_the_batch_is_accepted(hotpot_train):
    dataset, tok = load_dataset(hotpot_train), load_tokenizer("lexical")
    oracle = OracleBackend(dataset, tok)
    obs = _obs(dataset)
    gold_shown = [eid for eid, _ in obs["evidence"] if eid in set(dataset.labels[0].supporting_facts)]
    assert len(gold_shown) >= 2
    full = parse_ops(_generate(oracle, "memory", obs).text).ops
    assert [op.sources[0] for op in full] == gold_shown
    # Room for the first fact only: the store (same tokenizer, same budget) must accept the batch.
    one = Memory(tok, 10**6)
    one.apply(full[:1], set(gold_shown))
    budget = one.tokens()
    obs = _obs(dataset, budget_left=budget - tok.count("(empty)"))
    text = _generate(oracle, "memory", obs).text
    store = Memory(tok, budget)
    result = store.apply_text(text, {eid for eid, _ in obs["evidence"]})
    assert result.applied, result.reason
    assert [item.sources[0] for item in store.items] == gold_shown[:1]
    # No room at all: a lone NOOP, still a valid batch.
    assert _generate(oracle, "memory", _obs(dataset, budget_left=0)).text == '{"ops": [{"op": "NOOP"}]}'
    # The completion limit is respected too.
    limit = tok.count(format_ops(full[:1]))
    assert parse_ops(_generate(oracle, "memory", _obs(dataset), max_tokens=limit).text).ops == full[:1]


def test_noop_when_no_gold_sentence_is_shown(hotpot_train):
    dataset = load_dataset(hotpot_train)
    oracle = OracleBackend(dataset, load_tokenizer("lexical"))
    gold_docs = set(dataset.labels[0].gold_doc_ids)
    other = next(d for d in dataset.tasks[0].doc_ids if d not in gold_docs)
    doc = dataset.documents_by_id()[other]
    obs = _obs(dataset, evidence=[(f"{other}:{i}", s.strip()) for i, s in enumerate(doc.sentences)])
    assert _generate(oracle, "memory", obs).text == '{"ops": [{"op": "NOOP"}]}'


def test_summary_mode_and_unknown_questions_are_error_results(hotpot_train):
    dataset = load_dataset(hotpot_train)
    oracle = OracleBackend(dataset, load_tokenizer("lexical"))
    result = _generate(oracle, "memory", {**_obs(dataset, memory_items=None), "mode": "summary", "memory_text": ""})
    assert result.finish_reason == "error" and "oracle supports decision mode only" in result.error
    unknown = {"question": "Who wrote a question that is not in the data?", "memory_items": []}
    result = _generate(oracle, "reader", unknown)
    assert result.finish_reason == "error" and "not in the train dataset" in result.error


def test_refuses_an_evaluation_split(hotpot_dev_dir):
    dataset = load_dataset(hotpot_dev_dir)
    tok = load_tokenizer("lexical")
    message = "oracle backend refuses a 'dev' split: .* labels of an evaluation split must never produce training data"
    with pytest.raises(ValueError, match=message):
        OracleBackend(dataset, tok)
    with pytest.raises(ValueError, match=message):
        make_backend(load_config(RULES, ORACLE).backends.memory, tok, dataset)


def test_duplicate_question_is_resolved_by_candidate_documents(hotpot_train, tmp_path, rewrite_data_file):
    # Twins: task 0 and a task j with another answer and disjoint candidates, now sharing task 0's
    # question. j is one whose best passage for that question is gold, so both twins' memories
    # hold a gold fact that tells the reader call which twin it serves.
    data = tmp_path / "dup"
    shutil.copytree(hotpot_train, data)
    tasks, labels = _lines(data / "tasks.jsonl"), _lines(data / "labels.jsonl")
    retriever = BM25Retriever.build(load_dataset(data).documents)

    def top_is_gold(k: int) -> bool:
        found = retriever.search(tasks[0]["question"], k=1, candidates=tasks[k]["doc_ids"])
        return bool(found) and found[0].doc_id in labels[k]["gold_doc_ids"]

    assert top_is_gold(0)
    j = next(
        k
        for k in range(1, len(tasks))
        if top_is_gold(k)
        and labels[k]["answers"][0] != labels[0]["answers"][0]
        and not set(tasks[k]["doc_ids"]) & set(tasks[0]["doc_ids"])
    )
    tasks[j]["question"] = tasks[0]["question"]
    rewrite_data_file(data, "tasks.jsonl", tasks)
    _, rows, summary = _run(data, tmp_path / "run", *ROOMY, f"limit={j + 1}")
    assert summary.complete and summary.metrics["invalid_action_rate"] == 0
    by_id = {r["task_id"]: r for r in rows}
    for k in (0, j):
        assert by_id[tasks[k]["id"]]["f1"] == 1.0, "each twin gets its own gold answer"
        assert by_id[tasks[k]["id"]]["memory_support_recall"] == by_id[tasks[k]["id"]]["retrieval_support_recall"]
    # With nothing in memory the twins cannot be told apart: an error naming both, never a guess.
    oracle = OracleBackend(load_dataset(data), load_tokenizer("lexical"))
    result = _generate(oracle, "reader", {"question": tasks[0]["question"], "memory_items": [], "mode": "decision"})
    assert result.finish_reason == "error"
    assert tasks[0]["id"] in result.error and tasks[j]["id"] in result.error


# --- open sub-questions (backends.memory.open_items, the open-items control) ---------------------

OPEN = ["backends.memory.open_items=true"]
RULES_CONTROLLER = ['agent.controller="policy"', 'backends.controller.kind="rules"']


def _memory_steps(traj: dict) -> list[tuple[int, list, set[str]]]:
    """(step, ops, doc ids shown up to and including that step) of each memory call."""
    shown_by_step, docs = {}, set()
    for event in traj["events"]:
        if event["type"] == "search":
            docs |= {eid.rsplit(":", 1)[0] for eid in event["shown"]}
            shown_by_step[event["step"]] = set(docs)
    return [(c["step"], list(parse_ops(c["text"]).ops), shown_by_step[c["step"]]) for c in _calls(traj, "memory")]


def test_open_items_on_hotpot_train_name_the_bridge_paragraph_and_steer_the_rules_controller(hotpot_train, tmp_path):
    """On the shipped HotpotQA train sample: "Find: <title>" for the gold paragraph the question does
    not name, citing the shown gold sentence that names it, deleted once that paragraph is shown;
    the rules controller queries it next, which finds more gold evidence than without open items."""
    dataset = load_dataset(hotpot_train)
    labels, docs, tasks = dataset.labels_by_id(), dataset.documents_by_id(), {t.id: t for t in dataset.tasks}
    by_title = {d.title: d for d in docs.values()}
    trajectories, rows, summary = _run(hotpot_train, tmp_path / "open", *ROOMY, *OPEN, *RULES_CONTROLLER)
    assert summary.complete and summary.metrics["invalid_action_rate"] == 0
    written = deleted = queried = 0
    for traj in trajectories:
        label, question = labels[traj["task_id"]], tasks[traj["task_id"]].question
        open_items: dict[str, str] = {}  # text -> id, following the store's numbering
        next_id = 1
        queries = [e["query"] for e in traj["events"] if e["type"] == "search"]
        for step, ops, shown_docs in _memory_steps(traj):
            for op in ops:
                if op.name == "ADD" and op.kind == "open":
                    title = op.text.removeprefix("Find: ")
                    target = by_title[title]
                    assert op.text.startswith("Find: ") and target.doc_id in label.gold_doc_ids
                    assert not mentions_title(question, title) and target.doc_id not in shown_docs
                    (source,) = op.sources
                    source_doc, index = source.rsplit(":", 1)
                    assert source in label.supporting_facts and source_doc != target.doc_id
                    assert mentions_title(
                        docs[source_doc].sentences[int(index)], title
                    )  # the evidence it was inferred from
                    open_items[op.text] = f"m{next_id}"
                    written += 1
                    # The rules controller's next query is the open item (unless the plan is over).
                    if step + 1 < len(queries):
                        assert queries[step + 1] == op.text.rstrip(")")
                        queried += 1
                if op.name == "DELETE":
                    text = next(t for t, i in open_items.items() if i == op.id)
                    assert (
                        by_title[text.removeprefix("Find: ")].doc_id in shown_docs
                    )  # resolved: its paragraph was shown
                    del open_items[text]
                    deleted += 1
                next_id += op.name == "ADD"
    # 18 of the 60 questions get one: each is the controller's next query and is resolved by it.
    assert written == queried == deleted == 18
    without = _run(hotpot_train, tmp_path / "closed", *ROOMY, *RULES_CONTROLLER)[2].metrics
    assert summary.metrics["retrieval_support_recall"] == pytest.approx(0.8986, abs=1e-4)
    assert without["retrieval_support_recall"] == pytest.approx(0.8597, abs=1e-4)
    assert summary.metrics["memory_support_recall"] == summary.metrics["retrieval_support_recall"]


def test_open_items_leave_the_facts_of_a_fixed_plan_unchanged(hotpot_train, tmp_path):
    """Same plan, roomy budget: with or without open items the oracle adds the same facts."""

    def facts(trajectories):
        return {
            t["task_id"]: [
                op.sources for _, ops, _ in _memory_steps(t) for op in ops if op.name == "ADD" and op.kind == "fact"
            ]
            for t in trajectories
        }

    with_open = _run(hotpot_train, tmp_path / "open", *ROOMY, *OPEN)[0]
    assert facts(with_open) == facts(_run(hotpot_train, tmp_path / "closed", *ROOMY)[0])
    assert any(op.kind == "open" for t in with_open for _, ops, _ in _memory_steps(t) for op in ops if op.name == "ADD")


def test_open_items_on_musique_train_are_the_next_decomposition_subquestions(musique_train, tmp_path):
    dataset = load_dataset(musique_train)
    labels, docs = dataset.labels_by_id(), dataset.documents_by_id()
    trajectories, _, summary = _run(musique_train, tmp_path / "open", *ROOMY, *OPEN, *RULES_CONTROLLER)
    assert summary.complete and summary.metrics["invalid_action_rate"] == 0
    written = 0
    for traj in trajectories:
        steps = labels[traj["task_id"]].decomposition
        for _, ops, _ in _memory_steps(traj):
            for op in (o for o in ops if o.name == "ADD" and o.kind == "open"):
                # A later sub-question with the earlier answers filled in, citing the paragraph holding one.
                filled = [
                    s
                    for s in steps[1:]
                    if "#" in s["question"]
                    and all(a["answer"] in op.text for a in steps if f"#{steps.index(a) + 1}" in s["question"])
                ]
                assert filled, (op.text, steps)
                (source,) = op.sources
                assert source in labels[traj["task_id"]].supporting_facts
                assert any(a["answer"].lower() in docs[source.rsplit(":", 1)[0]].text.lower() for a in steps)
                written += 1
    assert written == 40


def test_open_items_is_an_oracle_option():
    with pytest.raises(Exception, match=r"backends\.memory\.open_items: read by kind 'oracle' only \(the gold teacher: "
                       r"it reads labels\); kind is 'rules'"):
        load_config(RULES, ["backends.memory.open_items=true"])


def test_hidden_sources_budget_is_judged_on_the_hidden_rendering(hotpot_train):
    """The no-sources control: the oracle's scratch copy renders as the agent's memory does."""
    dataset, tok = load_dataset(hotpot_train), load_tokenizer("lexical")
    oracle = OracleBackend(dataset, tok)
    obs = _obs(dataset)
    gold = [(eid, s) for eid, s in obs["evidence"] if eid in set(dataset.labels[0].supporting_facts)][:1]
    (add,) = parse_ops(_generate(oracle, "memory", {**obs, "evidence": gold}).text).ops
    hidden_line = tok.count(f"[m1] (fact) {add.text}")
    left = hidden_line - tok.count("(empty)")  # room for the item without its "; d..:.." tag only
    assert tok.count(f"[m1] (fact; {add.sources[0]}) {add.text}") > hidden_line
    tight = {**obs, "evidence": gold, "budget_left": left}
    assert parse_ops(_generate(oracle, "memory", tight).text).ops[0].name == "NOOP"
    assert parse_ops(_generate(oracle, "memory", {**tight, "sources_shown": False}).text).ops == (add,)

"""Contract of the MemAgent track (stream evidence + overwrite memory + exhaust controller, as
``configs/memagent.toml``), on a real RULER-HQA-style set built from the shipped dev sample:

- the long context is cut at token boundaries: nothing lost or repeated, and chunks cut off by
  ``max_chunks`` are counted, never silent;
- the overwrite memory is hard-limited to ``memory_tokens`` (re-tokenized) whatever the policy
  writes;
- the reader sees the question and the final memory only;
- the boxed exact-match reward takes the last ``\\boxed{}`` against every gold answer;
- a failed reader request scores 0, stays in the denominator and makes the run unusable.

The engine, the tokenizers and the rules backend are real; the only test doubles are policy
*outputs* (a memory policy that writes too much, a memo writer, a reader whose request fails).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from pathlib import Path

import pytest

from memsearch.backends.base import GenerationResult
from memsearch.data.dataset import load_dataset
from memsearch.data.records import evidence_id
from memsearch.data.ruler import prepare_ruler, render_context
from memsearch.engine import prompts
from memsearch.engine.episode import run_episode
from memsearch.engine.evidence import chunk_context
from memsearch.engine.parsing import evidence_ids_in, parse_reader
from memsearch.eval.metrics import boxed_em, exact_match, sub_em
from memsearch.eval.runner import build_environment, data_fingerprint, software_versions, summarize
from memsearch.eval.score import score_trajectory
from memsearch.pipelines.config import load_run_config
from memsearch.records.events import PolicyCall
from memsearch.records.trajectory import Trajectory
from memsearch.tokenizer import load_tokenizer

MEMAGENT = Path(__file__).resolve().parents[2] / "configs" / "memagent.toml"
ROLES = ("memory", "controller", "reader")
CANARY = "Zqxv Canary Answer 7731"



@pytest.fixture(scope="module")
def ruler_dir(hotpot_dev_dir, tmp_path_factory):
    """docs50 for the first 3 real dev questions (their own paragraphs among 40-ish others)."""
    out = tmp_path_factory.mktemp("ruler") / "ruler"
    prepare_ruler(hotpot_dev_dir, out, [50], limit=3, tokenizer=None, show_progress=False)
    return out / "docs50"


@pytest.fixture(scope="module")
def ruler(ruler_dir):
    return load_dataset(ruler_dir)


def memagent_config(tokenizer: str, *extra: str):
    """configs/memagent.toml with the rules backend in every role (no model) and overrides."""
    return load_run_config(
        MEMAGENT, [f'tokenizer="{tokenizer}"', *[f'backends.{r}.kind="rules"' for r in ROLES], *extra]
    )


def environment(dataset, config, **backends):
    """The eval runner's environment, with some roles answered by the given backends."""
    env = build_environment(config, dataset)
    return dataclasses.replace(env, backends={**env.backends, **backends})


def run(task, env) -> Trajectory:
    return asyncio.run(run_episode(task, env))


def calls(traj: Trajectory, role: str) -> list[PolicyCall]:
    return traj.policy_calls([role])


class FixedOutputs:
    """A real ``PolicyBackend`` whose completions are given in advance: ``outputs(k)`` is the
    text of its k-th call. It stands for what a model writes; the engine around it is real."""

    def __init__(self, outputs, name: str = "fixed-outputs", error: str | None = None) -> None:
        self.outputs, self.name, self.error, self.n = outputs, name, error, 0

    async def generate(self, requests):
        out = []
        for _ in requests:
            if self.error:
                out.append(GenerationResult("", "error", error=self.error))
            else:
                out.append(GenerationResult(self.outputs(self.n), "length"))
            self.n += 1
        return out

    async def aclose(self) -> None:
        return None


# --------------------------------------------------------------------------- chunking


@pytest.mark.parametrize("tok_name", ["lexical", "embedded"])
def test_chunks_partition_the_context_and_the_cut_is_counted(ruler, tok_name):
    tok = load_tokenizer(tok_name)
    docs = ruler.documents_by_id()
    task = ruler.tasks[0]
    n_tokens = tok.count(render_context(task.doc_ids, docs))
    for size in (97, 512, 2048):
        total = math.ceil(n_tokens / size)
        context, full = chunk_context(task.doc_ids, docs, tok, size, max_chunks=10**6)
        assert context == render_context(task.doc_ids, docs)  # the prepared set's context, exactly
        assert "".join(full.chunks) == context  # no character lost or repeated
        assert full.total_chunks == len(full.chunks) == total and full.cut_off == 0
        _, cut = chunk_context(task.doc_ids, docs, tok, size, max_chunks=2)
        assert cut.chunks == full.chunks[:2]
        assert cut.total_chunks == total and cut.cut_off == total - 2


@pytest.mark.parametrize("tok_name", ["lexical", "embedded"])
def test_chunks_retokenize_to_exactly_the_context_tokens(ruler, tok_name):
    """The strict contract: the chunks' own token ids, concatenated, are the context's token
    ids (the model sees chunk text, so a chunk re-tokenized alone must give back its slice),
    and every chunk holds at most ``chunk_tokens`` of them; a cut moves back a token or two
    where BPE would merge across it (white space runs, multi-byte characters)."""
    tok = load_tokenizer(tok_name)
    docs = ruler.documents_by_id()
    for task in ruler.tasks[:2]:
        context_ids = tok.encode(render_context(task.doc_ids, docs))
        for size in (7, 97, 2048):
            _, chunked = chunk_context(task.doc_ids, docs, tok, size, max_chunks=10**6)
            ids = [tok.encode(c) for c in chunked.chunks]
            assert [i for piece in ids for i in piece] == context_ids
            assert all(0 < len(piece) <= size for piece in ids)
            assert all(len(piece) >= size - 3 for piece in ids[:-1])  # moved back a little, never far


def test_episode_counts_the_chunks_cut_off_by_max_chunks(ruler):
    config = memagent_config("lexical", "budgets.chunk_tokens=512", "budgets.max_chunks=3")
    env = environment(ruler, config)
    task = ruler.tasks[0]
    total = math.ceil(env.tokenizer.count(render_context(task.doc_ids, ruler.documents_by_id())) / 512)
    assert total > 3
    traj = run(task, env)
    assert traj.counts.chunks == 3 and traj.counts.chunks_cut == total - 3
    assert len(traj.chunks) == len(calls(traj, "memory")) == 3
    row = score_trajectory(traj, ruler.labels_by_id()[task.id])
    assert row.truncated_by_chunk_limit is True and row.chunks_cut == total - 3


# --------------------------------------------------------------------------- memory limit


@pytest.mark.parametrize("tok_name", ["lexical", "embedded"])
@pytest.mark.parametrize("memory_tokens", [8, 64, 300])
def test_overwrite_memory_never_exceeds_its_budget(ruler, tok_name, memory_tokens):
    """Each memory call writes several times the budget (real paragraphs, non-Latin text and
    runs of white space); after every update the memory is the output's prefix cut to
    ``memory_tokens`` tokens, and it replaces the previous memory instead of growing."""
    tok = load_tokenizer(tok_name)
    body = "\n\n".join(d.text for d in ruler.documents[:40]) + " ティマニ 너), 櫻井 敦  \n\n\n  END-OF-OUTPUT"
    assert tok.count(body) > 5 * memory_tokens
    outputs = lambda k: f"Note {k}: {body}"  # noqa: E731
    config = memagent_config(tok_name, "budgets.chunk_tokens=2048", f"budgets.memory_tokens={memory_tokens}")
    traj = run(ruler.tasks[0], environment(ruler, config, memory=FixedOutputs(outputs)))
    updates = traj.memory_events
    assert len(updates) == traj.counts.chunks == traj.counts.memory_truncations > 1
    for k, update in enumerate(updates):
        assert update.valid and update.truncated
        assert tok.count(update.after) <= memory_tokens
        assert update.after == tok.truncate(outputs(k), memory_tokens)  # overwritten, not appended
    assert traj.memory_final == updates[-1].after
    # The next call sees the cut memory, never the full output.
    later = calls(traj, "memory")[1].messages[-1]["content"]
    assert updates[0].after in later and "END-OF-OUTPUT" not in later


# --------------------------------------------------------------------------- reader isolation


def test_reader_sees_only_the_question_and_the_final_memory(ruler):
    labels = {lab.id: lab.model_copy(update={"answers": [CANARY, *lab.answers]}) for lab in ruler.labels}
    dataset = dataclasses.replace(ruler, labels=list(labels.values()))  # a label that must never surface
    config = memagent_config("lexical", "budgets.chunk_tokens=512")
    docs = ruler.documents_by_id()
    for task in ruler.tasks:
        env = environment(dataset, config, memory=FixedOutputs(lambda k: f"memo {k}: still looking"))
        traj = run(task, env)
        assert CANARY not in json.dumps(traj.to_json())
        (reader,) = calls(traj, "reader")
        assert traj.events[-1] is reader  # after the last chunk
        n = traj.counts.chunks
        assert traj.memory_final == f"memo {n - 1}: still looking"
        assert list(reader.messages) == list(
            prompts.reader(task.question, traj.memory_final, boxed=True, template=config.prompts.overwrite_final)
        )
        assert reader.messages[1]["content"] == config.prompts.overwrite_final.format(
            question=task.question, memory=traj.memory_final
        )
        content = "\n".join(m["content"] for m in reader.messages)
        _, chunked = chunk_context(task.doc_ids, docs, env.tokenizer, 512, 10**6)
        lines = {ln.strip() for chunk in chunked.chunks for ln in chunk.splitlines() if len(ln.strip()) > 20}
        assert not [ln for ln in lines if ln in content]  # no chunk text
        context_ids = {evidence_id(d, j) for d in task.doc_ids for j in range(len(docs[d].sentences))}
        assert not set(evidence_ids_in(content)) & context_ids  # no evidence ids, gold or not
        label = labels[task.id]
        assert not [f for f in label.supporting_facts if f in content]
        assert not [f"Document {p}:" for p in label.gold_positions if f"Document {p}:" in content]


# --------------------------------------------------------------------------- reward


def test_boxed_em_takes_the_last_box_against_every_gold(ruler):
    label = ruler.labels_by_id()[ruler.tasks[1].id]
    assert label.answers == ["Chief of Protocol"]
    golds = [*label.answers, "Chief of Protocol of the United States"]
    assert boxed_em(r"\boxed{Ambassador} on reflection \boxed{chief of protocol}", golds) == 1.0
    assert boxed_em(r"\boxed{Chief of Protocol} no: \boxed{Ambassador}", golds) == 0.0  # only the last counts
    assert boxed_em(r"\boxed{x}, \boxed{\text{the Chief of Protocol of the United States.}}", golds) == 1.0
    assert boxed_em(r"\boxed{Chief of Protocol} then \boxed{Chief", golds) == 0.0  # an unfinished last box
    assert boxed_em("Chief of Protocol", golds) == 0.0  # no box
    # sub_em both ways: gold inside the prediction, and the prediction inside a gold.
    assert sub_em("She was Chief of Protocol.", golds) == 1.0
    assert sub_em("protocol of the united states", golds) == 1.0
    assert sub_em("Ambassador", golds) == 0.0
    for empty in (None, "", "  ", "the", r"\boxed{}"):
        assert sub_em(empty, golds) == exact_match(empty, golds) == boxed_em(empty, golds) == 0.0
    # What the engine reads as the prediction and what the reward scores agree.
    text = r"Maybe \boxed{Ambassador}. Final: \boxed{\text{Chief of Protocol}}"
    traj = Trajectory(task_id=label.id, prediction=parse_reader(text).answer, reader_text=text)
    row = score_trajectory(traj, label)
    scores = row.scores
    assert (row.prediction, scores["boxed_em"], scores["em"], scores["sub_em"]) == ("Chief of Protocol", 1.0, 1.0, 1.0)


def test_a_reader_asked_for_a_box_scores_the_box_only(ruler):
    """MemAgent's evaluator: a reply without a box scores 0, however its first line hedges
    around the gold answer. em/f1/sub_em follow the box; sub_em_lenient keeps the tolerant
    parse (first line, Answer: line) for comparison."""
    label = ruler.labels_by_id()[ruler.tasks[1].id]
    assert label.answers == ["Chief of Protocol"]
    config = memagent_config("lexical", "budgets.chunk_tokens=2048")
    replies = {
        "hedge": ("Maybe Chief of Protocol, or an ambassador; I cannot tell.", (0.0, 0.0, 0.0, 0.0, 1.0)),
        "boxed": (r"She became \boxed{\text{Chief of Protocol}}", (1.0, 1.0, 1.0, 1.0, 1.0)),
        "space box": (r"So $\boxed Chief of Protocol$", (1.0, 1.0, 1.0, 1.0, 1.0)),
        "fbox": (r"\fbox{Chief of Protocol}", (1.0, 1.0, 1.0, 1.0, 1.0)),
        "wrong box": (r"Chief of Protocol? No: \boxed{Ambassador}", (0.0, 0.0, 0.0, 0.0, 0.0)),
        "box with a hedge": (r"\boxed{Chief of Protocol or Ambassador}", (0.0, 0.75, 1.0, 0.0, 1.0)),
    }
    for name, (reply, expected) in replies.items():
        env = environment(ruler, config, reader=FixedOutputs(lambda k, r=reply: r))
        traj = run(ruler.tasks[1], env)
        assert traj.answer_format == "boxed", name
        row = score_trajectory(traj, label)
        got = tuple(row.column(k) for k in ("em", "f1", "sub_em", "boxed_em", "sub_em_lenient"))
        assert got == pytest.approx(expected), name
    # The same hedge from a reader that was not asked for a box keeps the tolerant parse.
    free = Trajectory(task_id=label.id, answer_format="free", reader_text=replies["hedge"][0],
                      prediction=parse_reader(replies["hedge"][0]).answer)
    row = score_trajectory(free, label)
    assert (row.scores["sub_em"], row.scores["sub_em_lenient"], row.scores["em"]) == (1.0, 1.0, 0.0)


# --------------------------------------------------------------------------- failures


def test_failed_reader_request_scores_zero_and_stays_in_the_denominator(ruler, ruler_dir):
    config = memagent_config("lexical")
    labels = ruler.labels_by_id()
    ok_env = environment(ruler, config)
    failing = environment(ruler, config, reader=FixedOutputs(None, "failing", error="HTTP 500: injected"))
    trajs = [run(ruler.tasks[0], ok_env), run(ruler.tasks[1], failing), run(ruler.tasks[2], ok_env)]
    failed = trajs[1]
    (reader,) = calls(failed, "reader")
    assert reader.error == "HTTP 500: injected" and reader.valid is None  # not judged: no completion
    assert reader.invalid_reason.startswith("request failed")
    assert failed.prediction is None and failed.status == "error" and failed.counts.request_errors == 1
    rows = [score_trajectory(t, labels[t.task_id]) for t in trajs]
    assert all(rows[1].column(k) == 0.0 for k in ("em", "f1", "sub_em", "boxed_em"))
    run_info = {"data": data_fingerprint(ruler_dir, ruler), "software": software_versions()}
    summary = summarize(config, run_info, rows, len(rows), {})
    assert summary.metric_counts["sub_em"] == summary.metric_counts["boxed_em"] == 3
    assert summary.metrics["sub_em"] == pytest.approx((rows[0].scores["sub_em"] + rows[2].scores["sub_em"]) / 3)
    assert summary.request_errors == 1 and summary.tasks.failed_ids == (failed.task_id,)
    assert summary.usable_for_comparison is False and summary.note.startswith("INCOMPLETE")


# --------------------------------------------------------------------------- prompts from the config


def test_configured_wording_reaches_every_prompt_and_is_versioned(ruler):
    """The recipe's initial memory and update template make the memory calls' messages; the
    version names the wording, and unset wording falls back to the built-in prompts."""
    config = memagent_config("lexical", "budgets.chunk_tokens=512", "budgets.max_chunks=2")
    wording = config.prompts
    task = ruler.tasks[0]
    traj = run(task, environment(ruler, config, memory=FixedOutputs(lambda k: f"memo {k}")))
    first, second = calls(traj, "memory")
    _, chunked = chunk_context(task.doc_ids, ruler.documents_by_id(), load_tokenizer("lexical"), 512, 2)
    assert first.messages[1]["content"] == wording.overwrite_update.format(
        question=task.question, memory=wording.initial_memory, chunk=chunked.chunks[0]
    )
    assert second.messages[1]["content"] == wording.overwrite_update.format(
        question=task.question, memory="memo 0", chunk=chunked.chunks[1]
    )
    builtin = load_run_config(
        MEMAGENT,
        [
            'tokenizer="lexical"',
            *[f'backends.{r}.kind="rules"' for r in ROLES],
            'prompts.initial_memory="(empty)"',
            'prompts.overwrite_update="Q {question} M {memory} C {chunk}"',
        ],
    )
    versions = {prompts.prompt_version(c.prompts.model_dump()) for c in (config, builtin)}
    assert len(versions) == 2 and prompts.prompt_version({}) == prompts.PROMPT_VERSION
    assert prompts.prompt_version({"initial_memory": None}) == prompts.PROMPT_VERSION

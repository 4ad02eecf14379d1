"""Evidence within budget, sentence-exact ids, and long-context chunks that lose nothing."""

from __future__ import annotations

from memsearch.data.dataset import load_dataset
from memsearch.data.ruler import render_context
from memsearch.engine.evidence import chunk_context, render_evidence
from memsearch.retrieval import BM25Retriever
from memsearch.tokenizer import LexicalTokenizer


def test_evidence_respects_budget_and_ids(hotpot_dev_dir):
    ds = load_dataset(hotpot_dev_dir)
    retriever = BM25Retriever.build(ds.documents)
    tok = LexicalTokenizer()
    task = ds.tasks[0]
    passages = retriever.search(task.question, k=3, candidates=task.doc_ids)
    full = render_evidence(passages, tok, 10_000)
    assert full.cut_sentences == 0
    for budget in (5, 20, 40, 80, 160):
        ev = render_evidence(passages, tok, budget)
        assert tok.count(ev.text) == ev.tokens <= budget
        assert list(ev.ids) == list(full.ids[: len(ev.ids)])  # a prefix, whole sentences only
        assert ev.cut_sentences == len(full.ids) - len(ev.ids)
        docs = ds.documents_by_id()
        for eid in ev.ids:
            doc_id, i = eid.split(":")
            assert f"[{eid}] {docs[doc_id].sentences[int(i)].strip()}" in ev.text


def test_chunks_cover_the_context_exactly(hotpot_dev_dir):
    ds = load_dataset(hotpot_dev_dir)
    docs = ds.documents_by_id()
    tok = LexicalTokenizer()
    task = ds.tasks[0]
    context, chunked = chunk_context(task.doc_ids, docs, tok, chunk_tokens=50, max_chunks=1000)
    assert context == render_context(task.doc_ids, docs)
    assert "".join(chunked.chunks) == context  # no token lost or repeated
    assert all(tok.count(c) == 50 for c in chunked.chunks[:-1]) and tok.count(chunked.chunks[-1]) <= 50
    assert chunked.cut_off == 0
    limited = chunk_context(task.doc_ids, docs, tok, chunk_tokens=50, max_chunks=3)[1]
    assert len(limited.chunks) == 3 and limited.cut_off == chunked.total_chunks - 3
    # Shown evidence grows with the chunks read and ends with every sentence of every document.
    assert len(chunked.shown_after[-1]) == sum(len(docs[d].sentences) for d in task.doc_ids)
    assert list(limited.shown_after) == list(chunked.shown_after[:3])


def test_a_sentence_is_shown_only_once_read_to_its_end(hotpot_dev_dir):
    """Cut by max_chunks in the middle of a document: the sentences before the cut are shown,
    the rest of that document is not (it was never read)."""
    ds = load_dataset(hotpot_dev_dir)
    docs = ds.documents_by_id()
    task = ds.tasks[0]
    context, chunked = chunk_context(task.doc_ids, docs, LexicalTokenizer(), chunk_tokens=37, max_chunks=4)
    read = "".join(chunked.chunks)
    assert context.startswith(read) and len(read) < len(context)
    shown = set(chunked.shown_after[-1])
    for i, doc_id in enumerate(task.doc_ids, start=1):
        at = context.index(f"Document {i}:\n{docs[doc_id].title}\n") + len(f"Document {i}:\n{docs[doc_id].title}\n")
        for j, sentence in enumerate(docs[doc_id].sentences):
            at += len(sentence)
            assert (f"{doc_id}:{j}" in shown) == (at <= len(read)), (doc_id, j)
    partly_read = [d for d in task.doc_ids if 0 < sum(f"{d}:{j}" in shown for j in range(len(docs[d].sentences)))
                   < len(docs[d].sentences)]
    assert partly_read  # the case this is about: the cut falls inside a document

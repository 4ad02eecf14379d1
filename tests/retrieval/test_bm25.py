"""BM25 retrieval on a slice of the shipped HotpotQA dev sample (about 300 real paragraphs)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from memsearch.data.records import Document, split_evidence_id
from memsearch.errors import InputError
from memsearch.retrieval import BM25Retriever, BM25Settings, Passage, Retriever

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "samples" / "hotpotqa" / "dev_distractor_sample.json"
N_EXAMPLES = 30


@pytest.fixture(scope="module")
def examples() -> list[dict]:
    return json.loads(SAMPLE.read_text(encoding="utf-8"))[:N_EXAMPLES]


@pytest.fixture(scope="module")
def documents(examples) -> list[Document]:
    """Every context paragraph once, ids d0, d1, ... in order of first appearance."""
    ids: dict[tuple[str, tuple[str, ...]], str] = {}
    for ex in examples:
        for title, sentences in ex["context"]:
            ids.setdefault((title, tuple(sentences)), f"d{len(ids)}")
    return [Document(doc_id=i, title=t, sentences=list(s)) for (t, s), i in ids.items()]


@pytest.fixture(scope="module")
def index(documents) -> BM25Retriever:
    return BM25Retriever.build(documents)


@pytest.fixture(scope="module")
def saved(index, tmp_path_factory) -> Path:
    return index.save(tmp_path_factory.mktemp("bm25") / "index")


def _task_candidates(examples: list[dict], documents: list[Document]) -> list[list[str]]:
    """Each question's own 10 paragraphs as doc ids (the distractor setting)."""
    ids = {(d.title, tuple(d.sentences)): d.doc_id for d in documents}
    return [[ids[(t, tuple(s))] for t, s in ex["context"]] for ex in examples]


def _by_title(documents: list[Document], title: str) -> Document:
    return next(d for d in documents if d.title == title)


def test_is_a_retriever(index):
    assert isinstance(index, Retriever)
    assert index.name == "bm25"


def test_distinctive_title_words_find_their_document(index, documents):
    for title in ["Animorphs", "Shirley Temple", "Meet Corliss Archer (TV series)", "Woodson, Arkansas"]:
        doc = _by_title(documents, title)
        top = index.search(title, k=3)
        assert top[0].doc_id == doc.doc_id, (title, [p.title for p in top])


def test_results_sorted_ranked_and_bounded(index, examples):
    results = index.search(examples[0]["question"], k=7)
    assert len(results) == 7
    assert [p.rank for p in results] == list(range(7))
    assert all(a.score >= b.score > 0 for a, b in zip(results, results[1:]))
    # k beyond the number of matching documents: fewer results, no error
    everything = index.search(examples[0]["question"], k=10_000)
    assert 7 < len(everything) < 10_000 and everything[:7] == results


def test_search_many_matches_search(index, examples):
    questions = [ex["question"] for ex in examples]
    assert index.search_many(questions, k=4) == [index.search(q, k=4) for q in questions]


def test_no_known_term_returns_nothing(index):
    assert index.search("qwxzy blorptangle") == []
    assert index.search("the of and is") == []  # stop words only
    assert index.search("") == []


def test_ties_broken_by_corpus_order(documents):
    twin = documents[3].model_copy(update={"doc_id": "twin"})
    idx = BM25Retriever.build([*documents, twin])
    query = documents[3].title
    top = idx.search(query, k=2)
    assert [p.doc_id for p in top] == [documents[3].doc_id, "twin"] and top[0].score == top[1].score
    # the tie sits at the cut-off: corpus order decides which one is returned
    assert [p.doc_id for p in idx.search(query, k=1)] == [documents[3].doc_id]
    assert [p.doc_id for p in idx.search_many([query, query], k=1)[1]] == [documents[3].doc_id]


def test_save_load_mmap_identical(index, saved, examples):
    loaded = BM25Retriever.load(saved, mmap=True)
    assert loaded.settings == index.settings and loaded.fingerprint == index.fingerprint
    assert loaded.documents == index.documents
    questions = [ex["question"] for ex in examples]
    assert loaded.search_many(questions, k=10) == index.search_many(questions, k=10)
    cands = _task_candidates(examples, index.documents)
    assert loaded.search_many(questions, k=3, candidates=cands) == index.search_many(questions, k=3, candidates=cands)


def test_index_folder_contents(saved, index):
    names = {p.name for p in saved.iterdir()}
    assert {"memsearch_index.json", "documents.jsonl", "params.index.json", "vocab.index.json",
            "data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy"} == names
    meta = json.loads((saved / "memsearch_index.json").read_text())
    assert meta["num_docs"] == len(index.documents)
    assert meta["settings"] == index.settings.model_dump()
    assert "the" in meta["stopwords"] and meta["bm25s_version"]


def test_candidate_scope(index, examples, documents):
    question = examples[0]["question"]
    corpus_top = index.search(question, k=1)[0]
    candidates = [d.doc_id for d in documents if d.doc_id != corpus_top.doc_id][:150]
    scoped = index.search(question, k=5, candidates=candidates)
    assert scoped and all(p.doc_id in candidates for p in scoped)
    # the best candidate is the best-scoring candidate of the full ranking, with the same score
    full = index.search(question, k=len(documents))
    best = next(p for p in full if p.doc_id in candidates)
    assert (scoped[0].doc_id, scoped[0].score) == (best.doc_id, best.score)
    assert index.search(question, k=5, candidates=[]) == []


def test_candidates_per_query_in_batch(index, examples, documents):
    questions = [ex["question"] for ex in examples[:6]]
    allowed = [[d.doc_id for d in documents[i * 40:(i + 1) * 40]] for i in range(5)] + [None]
    batch = index.search_many(questions, k=3, candidates=allowed)
    for q, cands, got in zip(questions, allowed, batch):
        assert got == index.search(q, k=3, candidates=cands)
        assert cands is None or all(p.doc_id in cands for p in got)
    with pytest.raises(ValueError, match="one list"):
        index.search_many(questions, k=3, candidates=allowed[:2])


def test_unknown_candidate_ids(index):
    with pytest.raises(ValueError, match=r"unknown candidate doc ids.*'nope-1', 'nope-2'"):
        index.search("Ed Wood", candidates=["d0", "nope-2", "nope-1"])
    with pytest.raises(TypeError, match="not one string"):
        index.search("Ed Wood", candidates="d0")


def test_query_tokenized_with_saved_settings(documents, tmp_path):
    corpus_words = set(re.findall(r"\w\w+", " ".join(d.title + " " + d.text for d in documents).lower()))
    assert "studied" in corpus_words and "studying" not in corpus_words
    stemmed = BM25Retriever.build(documents, BM25Settings(stemmer="english")).save(tmp_path / "stemmed")
    plain = BM25Retriever.build(documents, BM25Settings(stemmer=None, k1=1.2)).save(tmp_path / "plain")

    stemmed, plain = BM25Retriever.load(stemmed), BM25Retriever.load(plain)
    assert plain.settings.stemmer is None and plain.settings.k1 == 1.2
    assert stemmed.tokenize("Studying") == stemmed.tokenize("studied") == ["studi"]
    assert plain.tokenize("Studying") == ["studying"]
    hits = stemmed.search("studying", k=50)
    assert hits and all("studi" in stemmed.tokenize(f"{p.title}\n{p.text}") for p in hits)
    assert any("studied" in p.text for p in hits)
    assert plain.search("studying") == []


def test_evidence_ids_map_to_sentences(index, examples):
    by_id = {d.doc_id: d for d in index.documents}
    for passage in index.search(examples[1]["question"], k=5):
        doc = by_id[passage.doc_id]
        assert passage.title == doc.title and passage.text == doc.text
        assert passage.evidence_ids == [f"{doc.doc_id}:{i}" for i in range(len(doc.sentences))]
        for eid, sentence in passage.sentences:
            doc_id, i = split_evidence_id(eid)
            assert by_id[doc_id].sentences[i] == sentence


def test_passage_round_trips_through_json(index):
    passage = index.search("Ed Wood", k=1)[0]
    assert Passage.model_validate_json(passage.model_dump_json()) == passage


def test_save_refuses_existing_folder(index, tmp_path):
    target = tmp_path / "exists"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="already exists"):
        index.save(target)
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    assert (target / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists"]  # no temporary folder left


@pytest.mark.parametrize(
    "missing", ["memsearch_index.json", "vocab.index.json", "indptr.csc.index.npy", "documents.jsonl"]
)
def test_load_names_missing_file(saved, tmp_path, missing):
    broken = tmp_path / "broken"
    shutil.copytree(saved, broken)
    (broken / missing).unlink()
    with pytest.raises(InputError, match=re.escape(missing)):
        BM25Retriever.load(broken)


def test_load_rejects_non_index_and_altered_documents(saved, tmp_path):
    with pytest.raises(InputError, match="no such index folder"):
        BM25Retriever.load(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="not a memsearch BM25 index"):
        BM25Retriever.load(tmp_path / "empty")
    altered = tmp_path / "altered"
    shutil.copytree(saved, altered)
    docs = altered / "documents.jsonl"
    docs.write_text(docs.read_text().replace("Ed Wood", "Ed Would"))
    with pytest.raises(InputError, match="documents.jsonl: content does not match"):
        BM25Retriever.load(altered)
    garbled = tmp_path / "garbled"
    shutil.copytree(saved, garbled)
    (garbled / "memsearch_index.json").write_text("{not json")
    with pytest.raises(InputError, match="memsearch_index.json: unreadable"):
        BM25Retriever.load(garbled)


def test_settings_validation(documents):
    with pytest.raises(ValueError, match="unknown stemmer"):
        BM25Settings(stemmer="klingon")
    with pytest.raises(ValueError, match="capturing groups"):
        BM25Settings(token_pattern=r"(\w+)")
    with pytest.raises(ValueError, match="duplicate doc ids"):
        BM25Retriever.build([documents[0], documents[0]])


def test_the_word_memo_of_query_analysis_is_bounded_in_characters(documents):
    """Queries go through the analyzer's word memo (a retrieval service sees any client's words):
    unique long words must not grow it past its character bound, and results stay the same."""
    index = BM25Retriever.build(documents)
    analyzer = index._analyze
    analyzer._CACHE_CHARS = 100_000  # the default (32 M characters) scaled down to the test
    before = index.search("Broad Peak mountain", k=3)
    for n in range(100):
        index.search(f"{n:04d}" + "x" * 3996, k=3)  # 100 unique words of 4,000 characters
    held = sum(len(word) + len(term) for word, term in analyzer._terms.items())
    assert held <= 100_000 + 2 * 4000  # one word past the bound at most before the memo is cleared
    assert index.search("Broad Peak mountain", k=3) == before

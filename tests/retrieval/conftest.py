"""Session fixtures for the dense and service tests: the real MiniLM encoder (loaded once) and
index folders over the first 40 shipped dev questions (391 real paragraphs, ~15 s to embed on
2 CPU cores, once per session)."""

from __future__ import annotations

import pytest

from memsearch.data.dataset import load_dataset


@pytest.fixture(scope="session")
def encoder():
    from memsearch.retrieval.encoder import MiniLMEncoder

    return MiniLMEncoder()


@pytest.fixture(scope="session")
def dev40(hotpot_dev_dir):
    return load_dataset(hotpot_dev_dir)


@pytest.fixture(scope="session")
def dense_dir(tmp_path_factory, dev40, encoder):
    """A flat dense index folder (with its BM25 twin) over the 40-question corpus."""
    from memsearch.retrieval.dense import DenseRetriever

    out = tmp_path_factory.mktemp("indexes") / "dense"
    DenseRetriever.build(dev40.documents, encoder=encoder).save(out)
    return out


@pytest.fixture(scope="session")
def dense(dense_dir, encoder):
    from memsearch.retrieval.dense import DenseRetriever

    return DenseRetriever.load(dense_dir, encoder=encoder)


@pytest.fixture(scope="session")
def bm25_dir(tmp_path_factory, dev40):
    from memsearch.retrieval.index import build_index

    out = tmp_path_factory.mktemp("indexes") / "bm25"
    build_index(dev40.documents, "bm25", out)
    return out

"""Tokenizers used for budgets: exact prefixes, counts within budget, the embedded model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsearch.tokenizer import LexicalTokenizer, Tokenizer, load_tokenizer

SENTENCE = "Scott Derrickson (born July 16, 1966) is an American director."


def test_lexical_counts_words_and_punctuation():
    tok = LexicalTokenizer()
    assert tok.count(SENTENCE) == 14
    assert tok.truncate(SENTENCE, 3) == "Scott Derrickson ("
    assert tok.truncate(SENTENCE, 0) == ""
    assert tok.truncate("  \n", 0) == "  \n"  # no token: it fits in a budget of 0
    assert tok.truncate(SENTENCE, 100) == SENTENCE
    assert tok.decode(tok.encode(SENTENCE)) == SENTENCE
    assert isinstance(tok, Tokenizer)


@settings(max_examples=200, deadline=None)
@given(text=st.text(), n=st.integers(min_value=0, max_value=40))
def test_lexical_truncate_is_a_prefix_within_budget(text, n):
    tok = LexicalTokenizer()
    cut = tok.truncate(text, n)
    assert text.startswith(cut)
    assert tok.count(cut) == min(n, tok.count(text))


def test_unknown_tokenizer_lists_valid_names():
    with pytest.raises(ValueError, match=r"expected one of \['embedded', 'lexical'\]"):
        load_tokenizer("bpe-ish")


@pytest.fixture(scope="module")
def embedded():
    return load_tokenizer("embedded")


@pytest.mark.slow
def test_embedded_tokenizer_matches_smollm2(embedded):
    assert embedded.name == "hf:embedded:SmolLM2-135M-Instruct"
    # Ids of SmolLM2's BPE vocabulary (checked against the GGUF's own tokenizer).
    assert embedded.encode("Hello world, how are you?") == [19556, 905, 28, 638, 359, 346, 47]
    assert embedded.hf.eos_token == "<|im_end|>"
    assert embedded.count(SENTENCE) == len(embedded.encode(SENTENCE))
    assert embedded.decode(embedded.encode(SENTENCE)) == SENTENCE


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet=st.characters(codec="utf-8"), max_size=80), n=st.integers(min_value=0, max_value=30))
def test_embedded_truncate_is_a_prefix_within_budget(embedded, text, n):
    cut = embedded.truncate(text, n)
    assert text.startswith(cut)
    assert embedded.count(cut) <= n
    if embedded.count(text) <= n:
        assert cut == text


@pytest.mark.slow
def test_embedded_truncate_keeps_a_text_of_no_token_whole(embedded):
    """Found by the property test above in CI: a control character the tokenizer drops counts 0
    tokens, so it fits in a budget of 0 and must come back whole, not cut to nothing."""
    assert embedded.count("\x06") == 0
    assert embedded.truncate("\x06", 0) == "\x06" and embedded.truncate("a", 0) == ""


@pytest.mark.slow
def test_embedded_conversion_is_cached(tmp_path, monkeypatch):
    """First use converts the GGUF into a tokenizer folder; later uses read that folder."""
    from memsearch.assets import embedded as emb
    from memsearch.tokenizer import HFTokenizer

    monkeypatch.setenv("MEMSEARCH_CACHE_DIR", str(tmp_path))
    folder = emb.tokenizer_dir()
    assert folder.is_relative_to(tmp_path)
    assert (folder / "tokenizer.json").is_file()
    assert not list(folder.parent.glob("*.tmp-*")), "temporary build folders must not be left behind"
    assert emb.tokenizer_dir() == folder
    assert HFTokenizer(folder).encode("Hello world") == [19556, 905]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
def test_embedded_chunks_reencode_to_the_text_ids_on_hard_edges(size):
    """White space runs (the pre-tokenizer looks ahead past them), characters split over several
    byte tokens and emoji: every piece re-encodes to its own slice of the text's ids."""
    tok = load_tokenizer("embedded")
    text = "Sr.\n\n\nDocument 12:\n  ティマニ 너), 櫻井 敦 🧪🧪  end.\n\n \t\nDone  "
    pieces = tok.chunks(text, size)
    assert "".join(pieces) == text
    ids = [tok.encode(p) for p in pieces]
    assert [i for piece in ids for i in piece] == tok.encode(text)
    # A piece cannot hold part of a character: below its byte tokens (3 here) a piece grows.
    assert all(0 < len(piece) <= max(size, 3) for piece in ids)

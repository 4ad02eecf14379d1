"""The faithfulness rule (``memory.faithfulness``): which memory items' sources memory support
recall counts. Hand-made examples, the threshold boundary included."""

from __future__ import annotations

from memsearch.memory.faithfulness import FAITHFUL_SHARE, content_words, faithful_sources, is_faithful

PARIS = "Paris is the capital of Germany."  # content words: paris, capital, germany


def test_content_words_lower_case_alphanumeric_two_chars_no_stop_words():
    words = {"eiffel", "tower", "paris", "opened", "1889"}
    assert content_words("The Eiffel Tower, in PARIS, opened in 1889.") == words
    assert content_words("x y 7 U.S.") == set()  # one-character tokens are not content words
    assert content_words("it was of the and 42") == {"42"}  # stop words out, numbers in
    assert content_words("Café_Noir co-op") == {"café", "noir", "co", "op"}  # "_" and "-" split tokens
    assert content_words("") == set()


def test_threshold_is_one_half():
    assert FAITHFUL_SHARE == 0.5


def test_exactly_half_supported_is_faithful():
    # {paris, capital, france, europe}: paris and capital supported, 2 / 4
    assert is_faithful("Paris is the capital of France, Europe.", [PARIS])
    # {berlin, paris}: 1 / 2
    assert is_faithful("Berlin and Paris", [PARIS])


def test_below_half_is_not_faithful():
    # {paris, capital, france, europe, city}: 2 / 5
    assert not is_faithful("Paris is the capital city of France, Europe.", [PARIS])
    # {paris, france, europe}: 1 / 3
    assert not is_faithful("Paris, France, Europe", [PARIS])


def test_no_content_word_or_no_cited_text_is_not_faithful():
    assert not is_faithful("x", [PARIS])
    assert not is_faithful("the of it", [PARIS])
    assert not is_faithful("", [PARIS])
    assert not is_faithful("Paris is the capital of Germany.", [])
    assert is_faithful("Paris is the capital of Germany.", [PARIS])  # a copied sentence: 3 / 3


def test_unrelated_text_is_not_supported_and_support_is_pooled_over_cited_texts():
    assert not is_faithful("the quick brown fox", [PARIS, "Berlin is a city."])
    # {paris, berlin, city}: pooled over both cited sentences, 3 / 3
    assert is_faithful("Paris, Berlin: city", [PARIS, "Berlin is a city."])
    assert is_faithful("PARIS CAPITAL", [PARIS])  # case does not matter
    assert is_faithful("born 1966", ["He was born in 1966."])
    assert not is_faithful("1967", ["He was born in 1966."])  # a number is a content word: 0 / 1
    assert not is_faithful("1967 Ohio born", ["He was born in 1966."])  # 1 / 3


def test_faithful_sources_keeps_only_faithful_items_and_known_ids():
    texts = {"d1:0": PARIS, "d1:1": "Berlin is a city.", "d2:0": "The Seine flows through Paris."}
    items = [
        ("x", ["d1:0", "d1:1", "d2:0"]),  # no content word
        ("the quick brown fox", ["d1:0", "d1:1", "d2:0"]),  # unrelated
        ("Which river flows through Paris?", []),  # an open item without sources
        ("The Seine flows through Paris.", ["d2:0", "d9:9"]),  # faithful; d9:9 was never shown
        ("Berlin is a city.", ["d1:1", "d2:0"]),  # faithful
    ]
    assert faithful_sources(items, texts) == ["d2:0", "d1:1"]
    assert faithful_sources([], texts) == []

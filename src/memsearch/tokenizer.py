"""Token counting for budgets: one small protocol, two implementations.

Every budget in memsearch (evidence per step, memory, answer) is counted with a ``Tokenizer``
and the tokenizer's ``name`` is recorded next to the budget, so numbers from runs with different
tokenizers are never compared by accident.

- ``HFTokenizer``: a Hugging Face tokenizer from a local folder, or the embedded
  SmolLM2-135M-Instruct tokenizer (``load_tokenizer("embedded")``).
- ``LexicalTokenizer``: words and punctuation marks, each with its leading white space; no
  model needed, fast, a proxy for rule-only runs and tests.

``truncate`` always returns a prefix of the original text (never re-decoded text), so what an
agent is shown is exactly a piece of the source.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Protocol, runtime_checkable

from memsearch.errors import InputValueError


@runtime_checkable
class Tokenizer(Protocol):
    """What budgets need from a tokenizer."""

    name: str

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text of token ids."""
        ...

    def count(self, text: str) -> int:
        """Number of tokens in ``text``."""
        ...

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of ``text`` made of at most ``max_tokens`` whole tokens."""
        ...

    def chunks(self, text: str, size: int) -> list[str]:
        """``text`` cut at token boundaries into pieces of ``size`` tokens (the last may be
        shorter); ``"".join(chunks) == text``, so no token is lost or repeated."""
        ...


class LexicalTokenizer:
    """Words and single punctuation marks, each token keeping the white space before it.

    ``decode(encode(t))`` gives back ``t`` without its trailing white space. Ids come from a
    vocabulary that grows as text is seen, so they are stable only within one instance.
    """

    name = "lexical-v1"
    _pattern = re.compile(r"\s*(?:\w+|[^\w\s])", re.UNICODE)

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._pieces: list[str] = []

    def _spans(self, text: str) -> list[re.Match[str]]:
        return list(self._pattern.finditer(text))

    def encode(self, text: str) -> list[int]:
        ids = []
        for match in self._pattern.finditer(text):
            piece = match.group(0)
            if piece not in self._ids:
                self._ids[piece] = len(self._pieces)
                self._pieces.append(piece)
            ids.append(self._ids[piece])
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self._pieces[i] for i in ids)

    def count(self, text: str) -> int:
        return sum(1 for _ in self._pattern.finditer(text))

    def truncate(self, text: str, max_tokens: int) -> str:
        if max_tokens <= 0:  # white space alone is no token: it fits in 0
            return "" if self._pattern.search(text) else text
        end = None
        for i, match in enumerate(self._pattern.finditer(text)):
            if i == max_tokens:
                return text[: end]
            end = match.end()
        return text


    def chunks(self, text: str, size: int) -> list[str]:
        starts = [m.start() for m in self._pattern.finditer(text)]
        return _cut(text, starts, size)


def _cut(text: str, starts: list[int], size: int) -> list[str]:
    """Cut ``text`` before every ``size``-th token start; leftovers join the last piece."""
    if size < 1:
        raise ValueError(f"chunk size must be positive, got {size}")
    if not text:
        return []
    bounds = [0] + [starts[i] for i in range(size, len(starts), size)] + [len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


class HFTokenizer:
    """A Hugging Face (fast) tokenizer loaded from a local folder."""

    def __init__(self, path: str | Path, name: str | None = None) -> None:
        from transformers import AutoTokenizer

        self.path = Path(path)
        if not self.path.is_dir():
            raise FileNotFoundError(
                f"{path}: no such tokenizer folder (expected a Hugging Face model or tokenizer folder)"
            )
        self._tok = AutoTokenizer.from_pretrained(str(self.path))
        self.name = name or f"hf:{self.path.name}"

    @property
    def hf(self):
        """The underlying ``transformers`` tokenizer (chat templates, special tokens)."""
        return self._tok

    def encode(self, text: str) -> list[int]:
        return self._tok(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def count_many(self, texts: list[str]) -> list[int]:
        """Token counts of many texts in one batched (parallel, Rust-side) call."""
        if not texts:
            return []
        return [len(ids) for ids in self._tok(texts, add_special_tokens=False)["input_ids"]]

    def truncate(self, text: str, max_tokens: int) -> str:
        enc = self._tok(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
        # A text of no token (e.g. a control character the tokenizer drops) fits in any budget.
        if len(offsets) <= max(max_tokens, 0):
            return text
        if max_tokens <= 0:
            return ""
        # Cut where token max_tokens begins (not where token max_tokens-1 ends) so white
        # space and bytes that belong to the kept tokens are kept. Byte-level BPE may split
        # one character over two tokens; both then share a start offset, and the cut falls
        # before that character, keeping the count within budget.
        return text[: offsets[max_tokens][0]]

    def chunks(self, text: str, size: int) -> list[str]:
        """Pieces whose own token ids, concatenated, are exactly the ids of ``text``.

        Cutting where a token of the whole text starts is not enough: a piece tokenized alone
        can differ at its edges (the byte-level pre-tokenizer looks ahead past white space, so
        ``"\\n\\n"`` cut after the first newline re-tokenizes differently; a character split over
        several byte tokens shares one start offset). So each cut is checked by re-encoding, and
        moved back a token at a time until the piece re-encodes to its slice and the text after
        the cut starts with the next tokens. A piece then holds at most ``size`` tokens (for any
        ``size`` of at least the few byte tokens of one character).
        """
        if size < 1:
            raise ValueError(f"chunk size must be positive, got {size}")
        if not text:
            return []
        enc = self._tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, starts = enc["input_ids"], [start for start, _ in enc["offset_mapping"]]
        n = len(ids)

        def char_at(k: int) -> int:
            return len(text) if k >= n else starts[k]

        def clean(i: int, j: int, begin: int) -> bool:
            at = char_at(j)
            if at <= begin or self.encode(text[begin:at]) != ids[i:j]:
                return False
            ahead = min(j + 16, n)  # merges are local: 8 tokens after the cut must survive it
            return self.encode(text[at : char_at(ahead)])[:8] == ids[j : min(j + 8, n)]

        pieces, i, begin = [], 0, 0
        while i + size < n:
            back = (j for j in range(i + size, i, -1) if clean(i, j, begin))
            # Only a size below one character's byte tokens (a few) finds no clean cut going
            # back; the piece then grows to the next clean cut rather than corrupt the ids.
            ahead = (j for j in range(i + size + 1, n) if clean(i, j, begin))
            cut = next(back, None) or next(ahead, n)
            pieces.append(text[begin : char_at(cut)])
            i, begin = cut, char_at(cut)
        if begin < len(text):
            pieces.append(text[begin:])
        return pieces


def _embedded() -> HFTokenizer:
    from memsearch.assets.embedded import EMBEDDED_NAME, tokenizer_dir

    return HFTokenizer(tokenizer_dir(), name=f"hf:embedded:{EMBEDDED_NAME}")


TOKENIZERS = {"embedded": _embedded, "lexical": LexicalTokenizer}


@lru_cache(maxsize=8)
def load_tokenizer(spec: str = "embedded") -> Tokenizer:
    """``"embedded"``, ``"lexical"``, or the path of a local Hugging Face tokenizer folder."""
    if spec in TOKENIZERS:
        return TOKENIZERS[spec]()
    if Path(spec).is_dir():
        return HFTokenizer(spec)
    raise InputValueError(
        f"unknown tokenizer {spec!r}: expected one of {sorted(TOKENIZERS)} or a local Hugging Face tokenizer folder"
    )

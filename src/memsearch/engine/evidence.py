"""What an agent is shown: passages cut to the evidence budget, and long contexts in chunks.

Evidence is rendered sentence by sentence with its evidence id, and a sentence is either shown
whole or not at all, so the set of shown evidence ids is exact (citations and memory sources
are checked against it).
"""

from __future__ import annotations

from dataclasses import dataclass

from memsearch.data.records import Document, evidence_id
from memsearch.data.ruler import CONTEXT_SEPARATOR, context_blocks
from memsearch.retrieval import Passage
from memsearch.tokenizer import Tokenizer


@dataclass(frozen=True)
class Evidence:
    """One step's evidence: the text shown, the ids in it, and what the budget cut."""

    text: str
    ids: tuple[str, ...]
    doc_ids: tuple[str, ...]
    tokens: int
    cut_sentences: int

    def items(self) -> list[tuple[str, str]]:
        """(evidence id, sentence) pairs, for structured observations."""
        out = []
        for line in self.text.splitlines():
            if line.startswith("[") and "] " in line:
                eid, sentence = line[1:].split("] ", 1)
                out.append((eid, sentence))
        return out


def render_evidence(passages: list[Passage], tokenizer: Tokenizer, budget: int) -> Evidence:
    """Passages as ``title`` lines followed by ``[doc:i] sentence`` lines, within ``budget``
    tokens of the whole text. Stops at the first sentence that does not fit."""
    lines: list[str] = []
    ids: list[str] = []
    docs: list[str] = []
    total = 0
    cut = 0
    stopped = False
    for passage in passages:
        header = f"{passage.title}"
        for eid, sentence in passage.sentences:
            if stopped:
                cut += 1
                continue
            new = ([header] if passage.doc_id not in docs else []) + [f"[{eid}] {sentence.strip()}"]
            candidate = "\n".join(lines + new)
            count = tokenizer.count(candidate)
            if count > budget:
                stopped = True
                cut += 1
                continue
            lines += new
            ids.append(eid)
            if passage.doc_id not in docs:
                docs.append(passage.doc_id)
            total = count
    return Evidence("\n".join(lines), tuple(ids), tuple(docs), total, cut)


@dataclass(frozen=True)
class Chunked:
    """A long context cut into chunks: those that will be read and how many were cut off."""

    chunks: list[str]
    total_chunks: int
    # For each read chunk, the evidence ids of the sentences read whole by the end of it.
    shown_after: list[tuple[str, ...]]

    @property
    def cut_off(self) -> int:
        return self.total_chunks - len(self.chunks)


def chunk_context(
    doc_ids: list[str], documents: dict[str, Document], tokenizer: Tokenizer, chunk_tokens: int, max_chunks: int
) -> tuple[str, Chunked]:
    """Render the long context (``data.ruler.render_context``) and cut it into token chunks.

    A sentence counts as shown once its last character has been read, so a run cut by
    ``max_chunks`` never claims the unread end of a document it started."""
    blocks = context_blocks(doc_ids, documents)
    sentence_ends: list[tuple[int, str]] = []  # (offset just after the sentence, evidence id)
    pos = 0
    for block, doc_id in zip(blocks, doc_ids):
        doc = documents[doc_id]
        end = pos + len(block) - len(doc.text)  # the block ends with the document's text
        for j, sentence in enumerate(doc.sentences):
            end += len(sentence)
            sentence_ends.append((end, evidence_id(doc_id, j)))
        pos += len(block) + len(CONTEXT_SEPARATOR)
    context = CONTEXT_SEPARATOR.join(blocks)
    pieces = tokenizer.chunks(context, chunk_tokens)
    read = pieces[:max_chunks]
    shown_after, read_to, k = [], 0, 0
    seen: list[str] = []
    for piece in read:
        read_to += len(piece)
        while k < len(sentence_ends) and sentence_ends[k][0] <= read_to:
            seen.append(sentence_ends[k][1])
            k += 1
        shown_after.append(tuple(seen))
    return context, Chunked(read, len(pieces), shown_after)

"""What an agent is shown: passages cut to the evidence budget, and long contexts in chunks.

Evidence is rendered sentence by sentence with its evidence id, and a sentence is either shown
whole or not at all, so the set of shown evidence ids is exact (citations and memory sources
are checked against it).
"""

from __future__ import annotations

from dataclasses import dataclass

from memsearch.data.records import Document, evidence_id
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
    # For each read chunk, the evidence ids of documents whose block starts in it or before it.
    shown_after: list[tuple[str, ...]]

    @property
    def cut_off(self) -> int:
        return self.total_chunks - len(self.chunks)


def chunk_context(doc_ids: list[str], documents: dict[str, Document], tokenizer: Tokenizer, chunk_tokens: int, max_chunks: int) -> tuple[str, Chunked]:
    """Render the long context (``Document {i}:`` blocks) and cut it into token chunks."""
    blocks, starts, pos = [], [], 0
    for i, doc_id in enumerate(doc_ids, start=1):
        doc = documents[doc_id]
        block = f"Document {i}:\n{doc.title}\n{doc.text}"
        starts.append(pos)
        blocks.append(block)
        pos += len(block) + 2
    context = "\n\n".join(blocks)
    pieces = tokenizer.chunks(context, chunk_tokens)
    read = pieces[:max_chunks]
    shown_after, end, k = [], 0, 0
    seen: list[str] = []
    for piece in read:
        end += len(piece)
        while k < len(doc_ids) and starts[k] < end:
            doc = documents[doc_ids[k]]
            seen.extend(evidence_id(doc.doc_id, j) for j in range(len(doc.sentences)))
            k += 1
        shown_after.append(tuple(seen))
    return context, Chunked(read, len(pieces), shown_after)

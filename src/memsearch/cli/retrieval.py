"""``memsearch retrieval``: build BM25/dense index folders, search one, serve one over HTTP
(docs/design.md §8).

Every command imports what it needs inside its body, so ``memsearch --help`` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from memsearch.cli.common import add_renamed, command_group, friendly, renamed

retrieval_app = command_group("Build, search and serve index folders (BM25, dense, hybrid).")
# The old `memsearch index build`, hidden: `retrieval build --method bm25` does the same job.
index_app = command_group("Replaced by `memsearch retrieval build --method bm25`.", hidden=True)

IndexData = Annotated[Path, typer.Option(help="A prepared data folder (its corpus.jsonl is indexed).")]
NewIndex = Annotated[Path, typer.Option(help="New index folder (must not exist).")]


def _build(data: Path, method: str, out: Path, index_type: str) -> tuple[int, float]:
    """Build the index folder; the number of documents and the seconds it took."""
    import time

    from memsearch.data.dataset import load_dataset
    from memsearch.retrieval.index import build_index, check_new_index_folder

    check_new_index_folder(out)  # before reading the data: a refused folder costs no work
    start = time.perf_counter()
    retriever = build_index(load_dataset(data).documents, method, out, index_type=index_type, show_progress=True)
    return len(retriever), time.perf_counter() - start


@retrieval_app.command("build")
@friendly
def build(
    data: IndexData,
    method: Annotated[str, typer.Option(help="bm25, or dense (MiniLM + faiss; also serves hybrid).")],
    out: NewIndex,
    index_type: Annotated[str, typer.Option(help="dense: flat (exact inner product) or hnsw (approximate).")] = "flat",
) -> None:
    """Build an index folder over a prepared corpus, with its manifest."""
    documents, seconds = _build(data, method, out, index_type)
    typer.echo(f"wrote {out}: {method} index of {documents} documents in {seconds:.1f}s")


@index_app.command("build", cls=renamed("index build", "retrieval build --method bm25"))
@friendly
def index_build(data: IndexData, out: NewIndex) -> None:
    """Build a BM25 index folder over a prepared corpus (what `retrieval build --method bm25` does)."""
    documents, seconds = _build(data, "bm25", out, "flat")
    typer.echo(f"wrote {out}: {documents} documents in {seconds:.1f}s")  # the line this name always printed


@retrieval_app.command("search")
@friendly
def search(
    query: Annotated[str, typer.Argument(help="Query text.")],
    index: Annotated[Path, typer.Option(help="An index folder from `memsearch retrieval build`.")],
    k: Annotated[int, typer.Option("-k", min=1, help="Number of passages.")] = 5,
    data: Annotated[Optional[Path], typer.Option(help="With --task: the prepared folder holding the task.")] = None,
    task: Annotated[Optional[str], typer.Option(
        help="Restrict to this task's candidate documents (scope 'candidates').")] = None,
    method: Annotated[Optional[str], typer.Option(
        help="bm25, dense or hybrid (a dense folder serves all three); default: the folder's own.")] = None,
) -> None:
    """Search an index (BM25 or dense folder) and print passages with their evidence ids."""
    from memsearch.errors import InputError
    from memsearch.retrieval.index import open_index

    candidates = None
    if task is not None:
        if data is None:
            raise InputError("--task needs --data, the prepared folder that holds the task")
        from memsearch.data.dataset import load_dataset

        found = [t for t in load_dataset(data).tasks if t.id == task]
        if not found:
            raise InputError(f"--task {task!r}: not in {data}/tasks.jsonl")
        candidates = found[0].doc_ids
    retriever = open_index(index, method)
    for passage in retriever.search(query, k=k, candidates=candidates):
        typer.echo(f"#{passage.rank + 1}  {passage.doc_id}  {passage.title}  (score {passage.score:.2f})")
        for eid, sentence in passage.sentences:
            typer.echo(f"    [{eid}] {sentence.strip()}")


@retrieval_app.command("serve")
@friendly
def serve(
    index: Annotated[Path, typer.Option(help="An index folder from `memsearch retrieval build`.")],
    method: Annotated[Optional[str], typer.Option(
        help="bm25, dense or hybrid; default: the folder's own method.")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port, printed).")] = 8000,
    max_batch: Annotated[int, typer.Option(help="Queries merged into one encode + search (1: no batching).")] = 64,
    max_wait_ms: Annotated[float, typer.Option(help="How long a batch waits for more queries.")] = 5.0,
    cache_size: Annotated[int, typer.Option(help="LRU cache entries (0: no cache).")] = 10_000,
    cache_mb: Annotated[float, typer.Option(help="And at most this many MiB of cached hits (0: no cache).")] = 64.0,
    max_queries: Annotated[int, typer.Option(help="Queries in one request.")] = 1024,
    max_topk: Annotated[int, typer.Option(help="Largest topk.")] = 1000,
    max_hits: Annotated[int, typer.Option(help="Queries x topk (plus excluded ids) in one request.")] = 16_384,
    max_query_chars: Annotated[int, typer.Option(help="Characters of one query.")] = 4096,
    max_body_mb: Annotated[float, typer.Option(help="Request body, MiB.")] = 16.0,
    timeout_s: Annotated[float, typer.Option(
        help="A client must send its request head, then its body, and read its answer within this each.")] = 30.0,
    max_connections: Annotated[Optional[int], typer.Option(
        help="Open connections (default: what the open-file limit leaves room for).")] = None,
    quote_titles: Annotated[bool, typer.Option(
        help="Search-R1 'contents' as its wiki corpus writes them: the title in double quotes.")] = False,
) -> None:
    """Serve an index: Search-R1-compatible POST /retrieve, GET /health, GET /info.

    A request over a limit is refused (400, or 413 for the body) with an error naming it; the
    limits and why: docs/results/retrieval_service.md "Limits"."""
    from memsearch.retrieval.server import ServiceSettings, check_port, load_service
    from memsearch.retrieval.server import serve as serve_forever

    # Settings and port are checked before the index is loaded (a dense one takes seconds).
    settings = ServiceSettings(
        max_batch=max_batch, max_wait_ms=max_wait_ms, cache_size=cache_size, cache_mb=cache_mb,
        max_queries=max_queries, max_topk=max_topk, max_hits=max_hits, max_query_chars=max_query_chars,
        max_body_mb=max_body_mb, timeout_s=timeout_s, max_connections=max_connections, quote_titles=quote_titles,
    )
    check_port(port)
    serve_forever(load_service(str(index), method, settings), host, port, announce=typer.echo)
    typer.echo("stopped")


def add_renamed_retrieval_commands(root: typer.Typer) -> None:
    """The old names: top-level ``search`` and the ``index build`` group, hidden."""
    add_renamed(root, "search", "retrieval search", search)
    root.add_typer(index_app, name="index", hidden=True)

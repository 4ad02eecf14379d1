"""``memsearch retrieval``: build dense/BM25 index folders and serve one over HTTP (docs/design.md §8).

Kept apart from ``cli.py`` so the retrieval commands live in one place; like every command they
import what they need inside their body, so ``memsearch --help`` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

retrieval_app = typer.Typer(help="Dense/BM25 index folders and the shared retrieval service.", no_args_is_help=True)


def _friendly(fn):
    # Imported here, not at module level: cli.py imports this module.
    from memsearch.cli.app import _friendly as friendly

    return friendly(fn)


@retrieval_app.command("build")
def build(
    data: Annotated[Path, typer.Option(help="A prepared data folder (its corpus.jsonl is indexed).")],
    method: Annotated[str, typer.Option(help="bm25, or dense (MiniLM + faiss; also serves hybrid).")],
    out: Annotated[Path, typer.Option(help="New index folder (must not exist).")],
    index_type: Annotated[str, typer.Option(help="dense: flat (exact inner product) or hnsw (approximate).")] = "flat",
) -> None:
    """Build an index folder over a prepared corpus, with its manifest."""

    @_friendly
    def run() -> None:
        import time

        from memsearch.data.dataset import load_dataset
        from memsearch.retrieval.index import build_index

        start = time.perf_counter()
        retriever = build_index(load_dataset(data).documents, method, out, index_type=index_type, show_progress=True)
        typer.echo(f"wrote {out}: {method} index of {len(retriever)} documents in {time.perf_counter() - start:.1f}s")

    run()


@retrieval_app.command("serve")
def serve(
    index: Annotated[Path, typer.Option(help="An index folder from `memsearch retrieval build`.")],
    method: Annotated[Optional[str], typer.Option(help="bm25, dense or hybrid; default: the folder's own method.")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port, printed).")] = 8000,
    max_batch: Annotated[int, typer.Option(help="Queries merged into one encode + search (1: no batching).")] = 64,
    max_wait_ms: Annotated[float, typer.Option(help="How long a batch waits for more queries.")] = 5.0,
    cache_size: Annotated[int, typer.Option(help="LRU cache entries (0: no cache).")] = 10_000,
) -> None:
    """Serve an index: Search-R1-compatible POST /retrieve, GET /health, GET /info."""

    @_friendly
    def run() -> None:
        from memsearch.retrieval.server import ServiceSettings, load_service
        from memsearch.retrieval.server import serve as serve_forever

        settings = ServiceSettings(max_batch=max_batch, max_wait_ms=max_wait_ms, cache_size=cache_size)
        serve_forever(load_service(str(index), method, settings), host, port, announce=typer.echo)
        typer.echo("stopped")

    run()

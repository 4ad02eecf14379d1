"""The retrieval service on a loopback ephemeral port (real aiohttp server, real indexes), and the
``HttpRetriever`` client, including an eval run through the service."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from memsearch.config import load_config
from memsearch.errors import InputError
from memsearch.eval.matrix import check_comparable
from memsearch.eval.runner import run_eval
from memsearch.io import iter_jsonl
from memsearch.retrieval import BM25Retriever
from memsearch.retrieval.client import HttpRetriever, RetrievalRequestError
from memsearch.retrieval.hybrid import HybridRetriever
from memsearch.retrieval.server import RetrievalService, ServiceSettings, load_service, running_service

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "configs" / "rules.toml"


def post(url: str, body, raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(url + "/retrieve", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def post_many(url: str, bodies: list[dict]) -> list[dict]:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async def one(body):
            async with session.post(url + "/retrieve", json=body) as response:
                assert response.status == 200
                return await response.json()

        return await asyncio.gather(*(one(b) for b in bodies))


def dead_url() -> str:
    """A loopback url nothing listens on (a port the OS just handed out and took back)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_search_r1_response_shape_is_golden(bm25_dir):
    with running_service(load_service(str(bm25_dir))) as url:
        status, body = post(url, {"queries": ["Ed Wood film director"], "topk": 2, "return_scores": True})
        assert status == 200
        (hits,) = body["result"]
        # Golden: the two Ed Wood paragraphs, person first, with their BM25 (lucene) scores.
        assert [h["document"]["id"] for h in hits] == ["d4", "d0"]
        assert hits[0]["document"]["contents"].startswith("Ed Wood\nEdward Davis Wood Jr. (October 10, 1924")
        assert hits[1]["document"]["contents"].startswith("Ed Wood (film)\nEd Wood is a 1994 American biographical")
        assert [round(h["score"], 4) for h in hits] == [7.3989, 7.3256]
        assert set(hits[0]) == {"document", "score"} and set(hits[0]["document"]) == {"id", "contents"}
        # Without scores Search-R1 returns the documents themselves.
        _, plain = post(url, {"queries": ["Ed Wood film director"], "topk": 2})
        assert plain["result"] == [[h["document"] for h in hits]]
        with urllib.request.urlopen(url + "/health") as response:
            assert json.loads(response.read()) == {"status": "ok"}
        with urllib.request.urlopen(url + "/info") as response:
            info = json.loads(response.read())
        assert (
            info["method"] == "bm25"
            and info["num_docs"] == 391
            and info["manifest"]["format"] == "memsearch-bm25-index"
        )


@pytest.mark.parametrize("method", ["dense", "hybrid"])
def test_service_answers_exactly_as_the_in_process_retriever(dense, dense_dir, dev40, method):
    local = dense if method == "dense" else HybridRetriever.from_dense(dense)
    service = RetrievalService(local, ServiceSettings(max_wait_ms=20))
    tasks = dev40.tasks[:8]
    with running_service(service) as url:
        client = HttpRetriever(url)
        for scope in (None, [t.doc_ids for t in tasks]):
            remote = client.search_many([t.question for t in tasks], 4, scope)
            assert remote == local.search_many([t.question for t in tasks], 4, scope)
        # exclude: the next best ones, as the engine's "not shown before" would ask.
        first = local.search(tasks[0].question, k=6)
        _, body = post(
            url,
            {
                "queries": [tasks[0].question],
                "topk": 4,
                "format": "memsearch",
                "exclude": [first[0].doc_id, first[2].doc_id],
            },
        )
        assert [p["doc_id"] for p in body["result"][0]] == [first[i].doc_id for i in (1, 3, 4, 5)]


def test_batcher_merges_concurrent_requests_into_one_encode(dense, dev40):
    questions = [t.question for t in dev40.tasks[:16]]
    for settings, expected_batches in (
        (ServiceSettings(max_batch=64, max_wait_ms=300, cache_size=0), (1, 2)),
        (ServiceSettings(max_batch=1, cache_size=0), (16, 16)),
    ):
        service = RetrievalService(dense, settings)
        with running_service(service) as url:
            before = dense.encoder.encode_calls
            answers = asyncio.run(
                post_many(url, [{"queries": [q], "topk": 3, "format": "memsearch"} for q in questions])
            )
            encodes = dense.encoder.encode_calls - before
        assert expected_batches[0] <= service.counts["batches"] <= expected_batches[1], dict(service.counts)
        assert encodes == service.counts["batches"] and service.counts["searched"] == 16
        assert [a["result"][0][0]["doc_id"] for a in answers] == [dense.search(q, 1)[0].doc_id for q in questions]


def test_cache_and_coalescing_answer_repeats_without_searching(bm25_dir):
    service = load_service(str(bm25_dir), settings=ServiceSettings(max_wait_ms=100))
    with running_service(service) as url:
        # A GRPO group: the same query 8 times at once -> one search, the others share it.
        answers = asyncio.run(post_many(url, [{"queries": ["Ed Wood"], "topk": 3}] * 8))
        assert service.counts["searched"] == 1 and service.counts["coalesced"] == 7
        assert all(a == answers[0] for a in answers)
        _, again = post(url, {"queries": ["Ed Wood"], "topk": 3})
        assert again == answers[0] and service.counts["cache_hits"] == 1 and service.counts["searched"] == 1


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "body is not JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"queries": []}', "'queries' must be a non-empty list of strings"),
        (b'{"queries": ["a"], "topk": 0}', "'topk' must be an integer from 1 to 1000"),
        (b'{"queries": ["a"], "topk": true}', "'topk' must be an integer"),
        (b'{"queries": ["a"], "format": "xml"}', "'format' must be"),
        (b'{"queries": ["a"], "candidates": ["d0", "zz"]}', "'candidates': unknown doc ids ['zz']"),
        (b'{"queries": ["a", "b"], "exclude": [["d0"]]}', "'exclude' must be a list of doc ids or one list"),
        (b'{"queries": ["a"], "mode": 1}', "unknown fields ['mode']"),
    ],
)
def test_bad_requests_get_400_with_a_reason(bm25_dir, body, reason):
    service = load_service(str(bm25_dir))
    with running_service(service) as url:
        status, answer = post(url, None, raw=body)
        assert status == 400 and reason in answer["error"], answer
        assert post(url, {"queries": ["a"]})[0] == 200  # and the service keeps answering


def test_client_retries_5xx_and_reports_a_dead_server(bm25_dir):
    from aiohttp import web

    service = load_service(str(bm25_dir))
    calls = {"n": 0}

    async def flaky(request):  # a real server that fails twice, then answers as the service does
        calls["n"] += 1
        if calls["n"] <= 2:
            return web.Response(status=503, text="warming up")
        return await service._retrieve(request)

    app = service.app()
    app.router.add_post("/flaky/retrieve", flaky)
    with running_service(service, app=app) as url:
        client = HttpRetriever(url + "/flaky", backoff_base_s=0.01, seed=0)
        hits = client.search("Ed Wood", k=2)
        assert [p.doc_id for p in hits] == [p.doc_id for p in service.retriever.search("Ed Wood", k=2)]
        assert client.stats() == {"searches": 1, "attempts": 3, "retries": 2}
    dead = HttpRetriever(dead_url(), max_retries=2, backoff_base_s=0.01, timeout_s=2)
    with pytest.raises(RetrievalRequestError, match="connection error.* after 3 attempts"):
        dead.search("Ed Wood")
    assert dead.stats()["attempts"] == 3 and dead.stats()["failed"] == 1


def test_eval_through_the_service_equals_the_eval_in_process(hotpot_dev_dir, bm25_dir, dense_dir, tmp_path):
    base = ["limit=4", "retrieval.method=hybrid"]
    local = run_eval(
        load_config(RULES, base + [f"retrieval.index={dense_dir}"]),
        hotpot_dev_dir,
        tmp_path / "local",
        show_progress=False,
    )
    with running_service(load_service(str(dense_dir), "hybrid")) as url:
        remote = run_eval(
            load_config(RULES, base + [f"retrieval.url={url}"]),
            hotpot_dev_dir,
            tmp_path / "remote",
            show_progress=False,
        )
    strip = ("latency_s",)
    rows = {
        name: [
            {k: v for k, v in t.items() if k not in strip}
            for _, t in iter_jsonl(tmp_path / name / "trajectories.jsonl")
        ]
        for name in ("local", "remote")
    }
    key = lambda t: t["task_id"]  # noqa: E731 - trajectories are appended as episodes finish
    assert [(t["shown_evidence"], t["prediction"]) for t in sorted(rows["local"], key=key)] == [
        (t["shown_evidence"], t["prediction"]) for t in sorted(rows["remote"], key=key)
    ]
    assert local.metrics["f1"] == remote.metrics["f1"] and remote.request_errors == 0
    run_local = json.loads((tmp_path / "local" / "run.json").read_text())
    run_remote = json.loads((tmp_path / "remote" / "run.json").read_text())
    assert run_local["retrieval"]["method"] == "hybrid" and run_local["retrieval"]["index_type"] == "flat"
    assert run_remote["retrieval"]["url"] == url and run_remote["retrieval"]["info"]["method"] == "hybrid"
    assert run_remote["retrieval"]["info"]["documents_sha256"] == run_local["retrieval"]["documents_sha256"]
    assert BM25Retriever.load(bm25_dir).fingerprint == run_local["retrieval"]["documents_sha256"]


def test_a_dead_service_is_a_request_error_in_the_trajectory_not_a_crash(hotpot_dev_dir, tmp_path):
    summary = run_eval(
        load_config(RULES, ["limit=2", f"retrieval.url={dead_url()}"]),
        hotpot_dev_dir,
        tmp_path / "run",
        show_progress=False,
    )
    assert summary.tasks.scored == 2 and summary.request_errors == 2 and not summary.usable_for_comparison
    for _, traj in iter_jsonl(tmp_path / "run" / "trajectories.jsonl"):
        (search,) = [e for e in traj["events"] if e["type"] == "search"]
        assert "connection error" in search["error"] and traj["status"] == "error"
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["retrieval"]["info"] is None and "info" in run["retrieval"]["error"]


def test_matrix_refuses_groups_with_different_retrieval():
    base = load_config(RULES)
    other = load_config(RULES, ["retrieval.method=dense"])
    with pytest.raises(InputError, match="retrieval settings"):
        check_comparable({"A": base, "B": other})


@pytest.mark.slow
def test_cli_builds_and_serves_and_sigterm_stops_gracefully(hotpot_dev_dir, tmp_path):
    import signal
    import subprocess
    import sys

    cli = [sys.executable, "-m", "memsearch.cli.app", "retrieval"]
    built = subprocess.run(
        cli + ["build", "--data", str(hotpot_dev_dir), "--method", "bm25", "--out", str(tmp_path / "ix")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0 and "bm25 index of 391 documents" in built.stdout, built.stderr
    refused = subprocess.run(
        cli + ["build", "--data", str(hotpot_dev_dir), "--method", "tfidf", "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "--method 'tfidf'" in refused.stderr
    server = subprocess.Popen(
        cli + ["serve", "--index", str(tmp_path / "ix"), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = server.stdout.readline()
        assert line.startswith("serving on http://127.0.0.1:"), (
            line,
            server.stderr.read() if server.poll() is not None else "",
        )
        url = line.split()[-1]
        assert post(url, {"queries": ["Ed Wood"], "topk": 1})[1]["result"][0][0]["id"] in {"d0", "d4"}
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
        assert "stopped" in server.stdout.read()
    finally:
        if server.poll() is None:
            server.kill()


def test_client_survives_a_new_event_loop_per_step(bm25_dir):
    # GRPO runs each step's episodes in a fresh event loop: the pool of the old loop is dropped
    # (not reported as leaked) and a new one answers.
    import warnings

    with running_service(load_service(str(bm25_dir))) as url:
        client = HttpRetriever(url)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)
            first = asyncio.run(client.asearch("Ed Wood", k=2))
            second = asyncio.run(client.asearch("Ed Wood", k=2))
            asyncio.run(client.aclose())
    assert first == second and client.stats()["searches"] == 2

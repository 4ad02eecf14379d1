"""RULER-HQA-style long contexts built from a prepared folder of 30 real HotpotQA dev examples
(291 distinct paragraphs): sizes, gold positions, exact rendering, determinism, refusals and
the token-length statistics in the manifest."""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path

import pytest

from memsearch.data.dataset import Dataset, load_dataset, save_dataset
from memsearch.data.hotpot import convert_hotpot
from memsearch.data.records import Document, Task
from memsearch.data.ruler import context_token_lengths, prepare_ruler, render_context
from memsearch.errors import InputError
from memsearch.io import iter_jsonl
from memsearch.tokenizer import LexicalTokenizer

ROOT = Path(__file__).resolve().parents[2]
DEV_SAMPLE = ROOT / "data" / "samples" / "hotpotqa" / "dev_distractor_sample.json"
TRAIN_SAMPLE = ROOT / "data" / "samples" / "hotpotqa" / "train_sample.json"
N_EXAMPLES = 30
POOL = 291  # 29 examples with 10 paragraphs, one with 2, one paragraph shared


@pytest.fixture(scope="module")
def raw_dev() -> list[dict]:
    return json.loads(DEV_SAMPLE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def dev_dir(raw_dev, tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("ruler-dev")
    src = base / "dev30.json"
    src.write_text(json.dumps(raw_dev[:N_EXAMPLES]), encoding="utf-8")
    return save_dataset(convert_hotpot(src, split="dev"), base / "dev")


@pytest.fixture(scope="module")
def dev(dev_dir) -> Dataset:
    return load_dataset(dev_dir)


@pytest.fixture(scope="module")
def built(dev_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ruler-out") / "ruler"
    manifests = prepare_ruler(dev_dir, out, [20, 50], seed=42, tokenizer=LexicalTokenizer(), show_progress=False)
    return out, manifests


def tree_hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def lines(path: Path) -> list[dict]:
    return [obj for _, obj in iter_jsonl(path)]


def test_folders_and_counts(built, dev):
    out, manifests = built
    assert sorted(p.name for p in out.iterdir()) == ["docs20", "docs50"]
    assert list(manifests) == [20, 50]
    for n in (20, 50):
        ds = load_dataset(out / f"docs{n}")
        assert [t.id for t in ds.tasks] == [t.id for t in dev.tasks]
        assert len(ds.labels) == N_EXAMPLES
        used = {d for t in ds.tasks for d in t.doc_ids}
        assert {d.doc_id for d in ds.documents} == used  # corpus holds exactly the documents used
        assert ds.documents == [d for d in dev.documents if d.doc_id in used]  # same ids and text as the dev folder
        assert manifests[n] == json.loads((out / f"docs{n}" / "manifest.json").read_text())


def test_each_task_has_n_unique_docs_including_its_own(built, dev):
    out, _ = built
    own = {t.id: t.doc_ids for t in dev.tasks}
    for n in (20, 50):
        for task in load_dataset(out / f"docs{n}").tasks:
            assert len(task.doc_ids) == len(set(task.doc_ids)) == n
            assert set(own[task.id]) <= set(task.doc_ids)
    # the example with only 2 paragraphs gets 18 / 48 others
    short = dev.tasks[26]
    assert len(short.doc_ids) == 2


def test_labels_keep_dev_labels_and_add_gold_positions(built, dev):
    out, _ = built
    dev_labels = dev.labels_by_id()
    for n in (20, 50):
        ds = load_dataset(out / f"docs{n}")
        for task, label in zip(ds.tasks, ds.labels):
            assert label.id == task.id
            assert label.model_copy(update={"gold_positions": None}) == dev_labels[task.id]
            assert label.gold_positions == [task.doc_ids.index(d) + 1 for d in label.gold_doc_ids]


def test_gold_positions_point_at_gold_titles_in_the_rendered_context(built, raw_dev):
    out, _ = built
    ds = load_dataset(out / "docs50")
    docs = ds.documents_by_id()
    for ex, task, label in zip(raw_dev, ds.tasks, ds.labels):
        blocks = render_context(task.doc_ids, docs).split("\n\n")
        assert len(blocks) == 50
        gold_titles = list(dict.fromkeys(t for t, _ in ex["supporting_facts"]))
        shown = []
        for pos in label.gold_positions:
            head, title, _text = blocks[pos - 1].split("\n")
            assert head == f"Document {pos}:"
            shown.append(title)
        assert shown == gold_titles


def test_render_format_exact(dev):
    docs = dev.documents_by_id()
    d1, d4 = docs["d1"], docs["d4"]
    text = render_context(["d1", "d4"], docs)
    assert (
        text
        == f"Document 1:\nScott Derrickson\n{''.join(d1.sentences)}\n\nDocument 2:\nEd Wood\n{''.join(d4.sentences)}"
    )
    assert text.startswith(
        "Document 1:\nScott Derrickson\nScott Derrickson (born July 16, 1966) is an American director, screenwriter "
        "and producer."
        " He lives in Los Angeles, California."
    )
    assert render_context(["d4"], docs) == f"Document 1:\nEd Wood\n{d4.text}"
    assert render_context([], docs) == ""


def test_manifest(built, dev_dir, dev):
    out, manifests = built
    m = manifests[50]
    ds = load_dataset(out / "docs50")
    docs = ds.documents_by_id()
    digest = hashlib.sha256()
    for task in ds.tasks:
        digest.update(render_context(task.doc_ids, docs).encode("utf-8") + b"\0")
    assert m["context_sha256"] == digest.hexdigest()
    assert {k: v for k, v in m.items() if k not in ("context_sha256", "context_tokens", "files", "counts")} == {
        "format": "memsearch-data/1",
        "kind": "ruler-hqa",
        "split": "dev",
        "layout": "long-context",
        "evidence_granularity": "sentence",
        "builder": "ruler-hqa-1",
        "num_docs": 50,
        "seed": 42,
        "pool_size": POOL,
        "render": "Document {i}:\\n{title}\\n{text}, i from 1, joined by blank lines",
        "source": {"kind": "hotpotqa", "files": dev.manifest["files"]},
        "options": {"limit": None},
    }
    assert m["counts"] == {"documents": len(ds.documents), "tasks": N_EXAMPLES, "labels": N_EXAMPLES}


def test_deterministic_byte_identical(built, dev_dir, tmp_path):
    out, _ = built
    again = tmp_path / "again"
    prepare_ruler(
        dev_dir, again, [50, 20], seed=42, tokenizer=LexicalTokenizer(), show_progress=False
    )  # N order differs
    assert tree_hashes(again) == tree_hashes(out)
    assert len(tree_hashes(out)) == 8


def test_task_results_do_not_depend_on_limit(built, dev_dir, tmp_path):
    out, _ = built
    prepare_ruler(dev_dir, tmp_path / "lim", [50], seed=42, limit=7, tokenizer=None, show_progress=False)
    small = tmp_path / "lim" / "docs50"
    assert lines(small / "tasks.jsonl") == lines(out / "docs50" / "tasks.jsonl")[:7]
    assert lines(small / "labels.jsonl") == lines(out / "docs50" / "labels.jsonl")[:7]
    manifest = json.loads((small / "manifest.json").read_text())
    assert manifest["options"] == {"limit": 7} and "context_tokens" not in manifest


def test_other_seed_changes_order(built, dev_dir, tmp_path):
    out, _ = built
    prepare_ruler(dev_dir, tmp_path / "s", [50], seed=7, tokenizer=None, show_progress=False)
    a = load_dataset(out / "docs50").tasks
    b = load_dataset(tmp_path / "s" / "docs50").tasks
    assert sum(x.doc_ids != y.doc_ids for x, y in zip(a, b)) == N_EXAMPLES
    assert all(set(x.doc_ids) != set(y.doc_ids) for x, y in zip(a, b))  # other distractors drawn too
    own = {t.id: set(t.doc_ids) for t in load_dataset(dev_dir).tasks}
    assert all(own[y.id] <= set(y.doc_ids) for y in b)


def test_n_equal_to_pool_uses_every_paragraph(dev_dir, tmp_path):
    prepare_ruler(dev_dir, tmp_path / "all", [POOL], limit=2, tokenizer=None, show_progress=False)
    ds = load_dataset(tmp_path / "all" / f"docs{POOL}")
    assert all(sorted(t.doc_ids) == sorted(f"d{i}" for i in range(POOL)) for t in ds.tasks)


def test_n_larger_than_pool_refused(dev_dir, tmp_path):
    out = tmp_path / "big"
    with pytest.raises(InputError) as info:
        prepare_ruler(dev_dir, out, [50, POOL + 1, 1000], tokenizer=None, show_progress=False)
    assert str(info.value) == (
        f"--docs [{POOL + 1}, 1000]: larger than the dev pool of {POOL} distinct paragraphs in {dev_dir}; "
        "prepare more dev examples or choose a smaller N"
    )
    assert not out.exists()


def test_n_smaller_than_own_paragraphs_refused_and_nothing_written(dev_dir, tmp_path):
    out = tmp_path / "small"
    with pytest.raises(InputError) as info:
        prepare_ruler(dev_dir, out, [20, 5], tokenizer=None, show_progress=False)
    assert (
        str(info.value) == "--docs 5: task 5a8b57f25542995d1e6f1371 already has 10 paragraphs; N must be at least that"
    )
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # docs20 was written in a temporary folder that is gone


@pytest.mark.parametrize(
    "docs, message",
    [
        ([], "--docs []: expected distinct positive numbers of documents, e.g. 50,200,800"),
        ([20, 20], "--docs [20, 20]: expected distinct positive numbers of documents, e.g. 50,200,800"),
        ([0], "--docs [0]: expected distinct positive numbers of documents, e.g. 50,200,800"),
    ],
)
def test_bad_docs_refused(dev_dir, tmp_path, docs, message):
    with pytest.raises(InputError) as info:
        prepare_ruler(dev_dir, tmp_path / "x", docs, tokenizer=None, show_progress=False)
    assert str(info.value) == message


def test_train_folder_refused(tmp_path):
    train = save_dataset(convert_hotpot(TRAIN_SAMPLE, split="train", limit=5), tmp_path / "train")
    with pytest.raises(InputError) as info:
        prepare_ruler(train, tmp_path / "out", [20], tokenizer=None, show_progress=False)
    assert (
        str(info.value) == f"{train}: manifest split is 'train'; RULER-HQA sets are built from a prepared dev set only"
    )
    assert not (tmp_path / "out").exists()


def test_train_contexts_only_when_asked_and_only_from_train(tmp_path):
    """The MemAgent pipeline's long training contexts: questions and distractors from train,
    split kept "train" (so GRPO accepts it and eval never mistakes it for dev)."""
    train = save_dataset(convert_hotpot(TRAIN_SAMPLE, split="train", limit=5), tmp_path / "train")
    (manifest,) = prepare_ruler(
        train, tmp_path / "out", [20], tokenizer=None, show_progress=False, allow_train=True
    ).values()
    assert manifest["split"] == "train" and manifest["num_docs"] == 20
    built = load_dataset(tmp_path / "out" / "docs20")
    pool = {d.doc_id for d in load_dataset(train).documents}
    assert all(len(t.doc_ids) == 20 and set(t.doc_ids) <= pool for t in built.tasks)


def test_existing_output_refused(built, dev_dir):
    out, _ = built
    with pytest.raises(InputError) as info:
        prepare_ruler(dev_dir, out, [20], tokenizer=None, show_progress=False)
    assert str(info.value) == f"{out}: output folder already exists; choose a new folder (nothing was written)"


# --------------------------------------------------------------------------- token statistics


def full_stats(folder: Path, tokenizer) -> dict:
    ds = load_dataset(folder)
    docs = ds.documents_by_id()
    lengths = [tokenizer.count(render_context(t.doc_ids, docs)) for t in ds.tasks]
    return {"mean": round(statistics.fmean(lengths), 1), "min": min(lengths), "max": max(lengths)}


def test_lexical_token_stats_equal_a_full_count(built):
    out, manifests = built
    tok = LexicalTokenizer()
    for n in (20, 50):
        stats = manifests[n]["context_tokens"]
        assert {k: stats[k] for k in ("mean", "min", "max")} == full_stats(out / f"docs{n}", tok)
        assert stats["tokenizer"] == "lexical-v1"
        assert stats["counted_as"] == "sum of per-block counts, equal to a full count on the first 3 contexts"
    assert 4000 < manifests[50]["context_tokens"]["min"] < manifests[50]["context_tokens"]["max"] < 12000


@pytest.fixture(scope="module")
def embedded():
    from memsearch.tokenizer import load_tokenizer

    return load_tokenizer("embedded")


@pytest.mark.slow
def test_embedded_token_stats_equal_a_full_count(dev_dir, embedded, tmp_path):
    manifests = prepare_ruler(dev_dir, tmp_path / "emb", [20, 50], tokenizer=embedded, show_progress=False)
    for n in (20, 50):
        stats = manifests[n]["context_tokens"]
        assert {k: stats[k] for k in ("mean", "min", "max")} == full_stats(tmp_path / "emb" / f"docs{n}", embedded)
        assert stats["tokenizer"] == "hf:embedded:SmolLM2-135M-Instruct"


def _dataset_with_trailing_space_paragraph(raw_dev, dev) -> Dataset:
    """Three ordinary contexts, then one where a real paragraph that ends in a space ('Kravitz
    Design', dev example 322) is followed by another block."""
    title, sentences = raw_dev[322]["context"][5]
    assert title == "Kravitz Design" and "".join(sentences).endswith("1960s. ")
    kravitz = Document(doc_id="k", title=title, sentences=sentences)
    tasks = [Task(id=t.id, question=t.question, doc_ids=t.doc_ids) for t in dev.tasks[:3]]
    tasks.append(Task(id="t-k", question="q", doc_ids=["k", "d1", "d4"]))
    return Dataset(dev.documents + [kravitz], tasks, [])


def _full_counts(ds: Dataset, tokenizer) -> list[int]:
    docs = ds.documents_by_id()
    return [tokenizer.count(render_context(t.doc_ids, docs)) for t in ds.tasks]


def test_lexical_block_sum_exact_with_trailing_space_paragraph(raw_dev, dev):
    ds = _dataset_with_trailing_space_paragraph(raw_dev, dev)
    tok = LexicalTokenizer()
    lengths, how = context_token_lengths(ds, tok)
    assert how.startswith("sum of per-block counts")
    assert lengths == _full_counts(ds, tok)


@pytest.mark.slow
def test_embedded_block_sum_exact_with_trailing_space_paragraph(raw_dev, dev, embedded):
    ds = _dataset_with_trailing_space_paragraph(raw_dev, dev)
    lengths, _ = context_token_lengths(ds, embedded)
    assert lengths == _full_counts(ds, embedded)

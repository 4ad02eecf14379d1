"""Shared fixtures: small real prepared data folders built from the shipped samples, and a tiny
*real* Llama (random weights, the embedded tokenizer) for fast training and pipeline tests."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from memsearch.assets.samples import HOTPOT_DEV, samples_dir
from memsearch.data.dataset import save_dataset
from memsearch.data.hotpot import convert_hotpot


def pytest_configure(config):
    """Under pytest-xdist (pyproject addopts), split the cores between the workers: each worker's
    torch, and every subprocess it starts, gets cores // workers threads, so two workers on two cores
    do not each spin two OpenMP threads. A test that pins its own thread count still wins."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    threads = str(max(1, len(os.sched_getaffinity(0)) // workers))
    os.environ["OMP_NUM_THREADS"] = threads
    os.environ["MKL_NUM_THREADS"] = threads
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))


# The reliability ledger (tests/reliability/report.py) is loaded here, in the root conftest: under
# pytest-xdist the controller runs no test and loads no conftest below the paths it was given
# (`uv run pytest` gives `tests`), so hooks in tests/reliability/conftest.py never ran there and
# the full suite printed no reliability table. Workers record rows; the controller prints them.
_spec = importlib.util.spec_from_file_location(
    "memsearch_reliability_report", Path(__file__).parent / "reliability" / "report.py")
reliability = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
if not hasattr(reliability, "LEDGER"):
    _spec.loader.exec_module(reliability)


def pytest_sessionfinish(session):
    # Under pytest-xdist each worker holds the rows of its own tests: hand them to the controller.
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["reliability_ledger"] = reliability.LEDGER.dump()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent with -p no:xdist
def pytest_testnodedown(node, error):
    reliability.LEDGER.merge(getattr(node, "workeroutput", {}).get("reliability_ledger", {}))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not reliability.LEDGER.rows:
        return
    terminalreporter.section("reliability")
    terminalreporter.write_line(reliability.LEDGER.table())
    terminalreporter.write_line(reliability.LEDGER.result_line())


@pytest.fixture(scope="session")
def hotpot_dev_dir(tmp_path_factory):
    """The first 40 real dev questions, prepared (a real data folder, shared by the session)."""
    out = tmp_path_factory.mktemp("data") / "hotpot-dev-40"
    save_dataset(convert_hotpot(samples_dir() / HOTPOT_DEV, split="dev", limit=40), out)
    return out


def make_tiny_model(seed: int = 0):
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from memsearch.assets.embedded import tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
                         initializer_range=0.2)  # spread-out logits, so a LoRA can move them visibly
    return LlamaForCausalLM(config).eval(), tokenizer


def write_short_sft_rows(path, n: int = 12):
    """Real SFT rows (the export-sft format) with short prompts, so an SFT step on the tiny model
    takes a fraction of a second."""
    import json

    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            ops = {"ops": [{"op": "ADD", "text": f"Author {i} wrote book {i}.", "sources": [f"d{i}:0"],
                            "kind": "fact"}]}
            fh.write(json.dumps({
                "messages": [{"role": "user", "content": f"Question: who wrote book {i}? Evidence: [d{i}:0] "
                                                          f"Author {i} wrote book {i}."}],
                "completion": json.dumps(ops), "source": {"split": "train"}}) + "\n")
    return path


@pytest.fixture(scope="session")
def short_sft_rows(tmp_path_factory):
    """``write_short_sft_rows``: 12 rows in a session file."""
    return write_short_sft_rows(tmp_path_factory.mktemp("rows") / "short.jsonl")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer, 32-wide Llama with random weights and the embedded tokenizer, saved as a local folder."""
    model, tokenizer = make_tiny_model()
    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def rewrite_data_file():
    """``rewrite(folder, name, records)``: replace one data file of a prepared folder and record
    its new SHA-256 in the manifest, as a re-run of `prepare-*` would (a folder edited without
    that is refused at load)."""
    return _rewrite_data_file


def _rewrite_data_file(folder, name: str, records) -> None:
    import json

    from memsearch.io import sha256_file, write_json, write_jsonl

    write_jsonl(folder / name, records)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    manifest["files"][name] = sha256_file(folder / name)
    write_json(folder / "manifest.json", manifest)


def make_embedded_lora_adapter(out, seed: int = 0):
    """A real PEFT LoRA adapter for the embedded model (r=2 on the trainer's target modules,
    random init: A random, B zero, so the model starts as the base), saved with the fingerprint
    ``memsearch.assets.adapter.write_fingerprint`` writes: a stand-in for the shipped adapter."""
    import torch
    from peft import LoraConfig, get_peft_model

    from memsearch.assets.adapter import write_fingerprint
    from memsearch.backends.hf.model import load_model
    from memsearch.train.config import LoraSettings

    base, _, _ = load_model("embedded", device="cpu", dtype="float32")
    torch.manual_seed(seed)
    peft = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=list(LoraSettings().target_modules),
                                           bias="none", task_type="CAUSAL_LM"))
    peft.save_pretrained(str(out))
    (out / "README.md").unlink(missing_ok=True)  # peft's model card: not an adapter file
    write_fingerprint(out, "embedded", {"test": "random-init LoRA r=2", "seed": seed})
    return out


@pytest.fixture(scope="session")
def embedded_lora_adapter(tmp_path_factory):
    """A fingerprinted random-init LoRA adapter for the embedded model (``make_embedded_lora_adapter``)."""
    return make_embedded_lora_adapter(tmp_path_factory.mktemp("adapters") / "memory-policy-test")

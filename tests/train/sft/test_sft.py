"""LoRA SFT on oracle-teacher rows (tiny real Llama, real exported rows) and adapter merging."""

from __future__ import annotations

import json

import pytest
import torch

from memsearch.config import load_config
from memsearch.errors import InputError
from memsearch.train.config import SFTConfig
from memsearch.train.log import read_log
from memsearch.train.merge import merge_adapter
from memsearch.train.sft.trainer import chat_prompt_ids, load_sft_rows, train_sft


@pytest.fixture(scope="module")
def sft_rows_file(hotpot_train_dir, tmp_path_factory):
    """Memory-role rows exported from a real oracle run on the train sample."""
    from memsearch.eval.runner import run_eval
    from memsearch.train.sft.export import export_sft

    root = tmp_path_factory.mktemp("sft")
    cfg = load_config(None, [
        "tokenizer=\"embedded\"", "backends.memory.kind=\"oracle\"", "backends.reader.kind=\"oracle\"",
        "budgets.max_searches=1", "budgets.evidence_tokens=96", "budgets.memory_tokens=96"])
    run_eval(cfg, hotpot_train_dir, root / "oracle", show_progress=False)
    out = root / "memory.jsonl"
    export_sft(root / "oracle" / "trajectories.jsonl", root / "oracle" / "metrics.jsonl", "memory", out)
    return out


def sft_config(model, data, **extra) -> SFTConfig:
    sets = [f"model={json.dumps(str(model))}", f"data=[{json.dumps(str(data))}]"] + [
        f"{k}={json.dumps(v)}" for k, v in extra.items()
    ]
    return load_config(None, sets, model=SFTConfig)


def test_rows_are_the_backend_prompt_plus_completion_and_end_of_turn(tiny_model_dir, sft_rows_file):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    rows = load_sft_rows([str(sft_rows_file)], tok, 4096)
    first = json.loads(sft_rows_file.read_text().splitlines()[0])
    assert rows[0].prompt_ids == chat_prompt_ids(tok, first["messages"])
    assert rows[0].completion_ids[-1] == tok.eos_token_id
    assert tok.decode(rows[0].completion_ids[:-1]) == first["completion"]


def test_sft_lowers_the_completion_loss_and_checkpoints(tiny_model_dir, sft_rows_file, tmp_path):
    cfg = sft_config(
        tiny_model_dir,
        sft_rows_file,
        epochs=6.0,
        micro_batch_rows=2,
        grad_accumulation=2,
        checkpoint_every=10,
        **{"optim.lr": 1e-2, "optim.warmup_steps": 0, "optim.schedule": "constant", "lora.r": 8},
    )
    summary = train_sft(cfg, tmp_path / "sft", echo=lambda m: None)
    log = read_log(tmp_path / "sft" / "train_log.jsonl")
    assert [r["step"] for r in log] == list(range(1, summary["steps"] + 1))
    first, last = sum(r["loss"] for r in log[:3]) / 3, sum(r["loss"] for r in log[-3:]) / 3
    assert last < 0.85 * first, (first, last)  # a random tiny model does learn the teacher's format
    assert (tmp_path / "sft" / "adapter" / "adapter_config.json").is_file()
    with pytest.raises(InputError, match="already exists"):
        train_sft(cfg, tmp_path / "sft")


def test_bad_sft_lines_name_file_and_line(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    bad = tmp_path / "bad.jsonl"
    train = '"source": {"split": "train"}'
    bad.write_text(
        '{"messages": [{"role": "user", "content": "q"}], "completion": "a", %s}\n'
        '{"messages": [], "completion": "b", %s}\n' % (train, train)
    )
    with pytest.raises(InputError, match=r"bad.jsonl:2: messages: expected a non-empty list"):
        load_sft_rows([str(bad)], AutoTokenizer.from_pretrained(str(tiny_model_dir)), 4096)


def test_rows_without_a_train_provenance_are_refused(tiny_model_dir, tmp_path):
    """SFT on rows exported from a dev run would train on the evaluation questions."""
    from transformers import AutoTokenizer

    rows = tmp_path / "rows.jsonl"
    row = '{"messages": [{"role": "user", "content": "q"}], "completion": "a"'
    rows.write_text(row + ', "source": {"split": "train"}}\n' + row + ', "source": {"split": "dev"}}\n' + row + "}\n")
    with pytest.raises(InputError) as exc:
        load_sft_rows([str(rows)], AutoTokenizer.from_pretrained(str(tiny_model_dir)), 4096)
    assert str(exc.value).splitlines() == [
        f"{rows}:2: source.split: got 'dev', expected 'train' (rows written by `memsearch export-sft` from a run on a "
        "train split)",
        f"{rows}:3: source.split: got None, expected 'train' (rows written by `memsearch export-sft` from a run on a "
        "train split)",
    ]


def test_merged_checkpoint_equals_the_adapter_model(tiny_model_dir, tiny_adapter_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from memsearch.backends.hf.model import load_model

    out = merge_adapter(str(tiny_model_dir), tiny_adapter_dir, tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(str(out)).eval()  # plain transformers, no peft
    peft_model, _, _ = load_model(str(tiny_model_dir), adapter=tiny_adapter_dir, device="cpu", merge_adapter=False)
    ids = torch.tensor([[1, 50, 300, 7, 9000, 12]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, peft_model(ids).logits, atol=1e-5)
    assert not any("lora" in k for k in merged.state_dict())
    with pytest.raises(InputError, match="already exists"):
        merge_adapter(str(tiny_model_dir), tiny_adapter_dir, out)


def test_periodic_evaluation_goes_through_the_eval_runner(tiny_model_dir, sft_rows_file, hotpot_dev_dir, tmp_path):
    """The adapter is evaluated with `run_eval` (same code path as `memsearch eval`): a run folder
    per evaluation, with the adapter in the configured role, and eval_* figures in the log."""
    from memsearch.assets.samples import config_path

    cfg = sft_config(
        tiny_model_dir,
        sft_rows_file,
        epochs=0.5,
        micro_batch_rows=2,
        grad_accumulation=2,
        eval_config=str(config_path("rules.toml")),
        **{"eval.data": str(hotpot_dev_dir), "eval.limit": 2, "eval.at_start": True, "lora.r": 4},
    )
    summary = train_sft(cfg, tmp_path / "sft", echo=lambda m: None)
    log = read_log(tmp_path / "sft" / "train_log.jsonl")
    assert log[0]["step"] == 0 and "eval_f1" in log[0]
    assert "eval_f1" in log[-1] and log[-1]["step"] == summary["steps"]
    run = json.loads((tmp_path / "sft" / "eval" / f"step-{summary['steps']:06d}" / "config.json").read_text())
    assert run["backends"]["memory"]["kind"] == "hf" and run["backends"]["memory"]["adapter"].endswith("adapter")
    assert run["limit"] == 2


@pytest.mark.slow
def test_torchrun_ranks_wait_for_rank_zero_evaluation_explicitly(
    tiny_model_dir, sft_rows_file, hotpot_dev_dir, tmp_path, torchrun
):
    """Rank 0 evaluates alone; the other rank waits at an explicit barrier bounded by
    eval.wait_s (docs/design.md §7): evaluating 3 memory calls of 512 sampled tokens per task
    takes several seconds, so a 1 s bound fails the run and says why (before, rank 1 went on and
    waited inside the next collective)."""
    from memsearch.assets.samples import config_path

    eval_config = tmp_path / "eval.toml"  # the rules config, with long memory calls
    eval_config.write_text(config_path("rules.toml").read_text().replace("policy_tokens = 256", "policy_tokens = 512"))
    assert "policy_tokens = 512" in eval_config.read_text()
    sets = [
        f"model={json.dumps(str(tiny_model_dir))}",
        f"data=[{json.dumps(str(sft_rows_file))}]",
        "epochs=0.5",
        "micro_batch_rows=2",
        "grad_accumulation=2",
        "lora.r=4",
        f"eval_config={json.dumps(str(eval_config))}",
        f"eval.data={json.dumps(str(hotpot_dev_dir))}",
        "eval.limit=4",
        "eval.at_start=true",
        "eval.wait_s=1",
    ]
    (tmp_path / "sft.toml").write_text("")  # every field from --set
    proc = torchrun(
        "-m",
        "memsearch.cli.app",
        "train",
        "sft",
        "--config",
        tmp_path / "sft.toml",
        "--out",
        tmp_path / "run",
        *[a for s in sets for a in ("--set", s)],
        timeout=400,
    )
    assert proc.returncode != 0
    assert "rank 1 waited more than 1 s for rank 0 (evaluation at step 0); raise eval.wait_s" in proc.stderr, (
        proc.stderr[-3000:]
    )

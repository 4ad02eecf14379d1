"""What a run's numbers are not (``eval.caveats``): only the caveats that apply, said once."""

from __future__ import annotations

import json
from pathlib import Path

from memsearch.config import group_config, load_config
from memsearch.eval.caveats import backend_trained, caveats, run_caveats

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "configs" / "rules.toml"
SCOPE = "Retrieval is candidate-scope (each task's own candidate paragraphs): not open-domain full-wiki retrieval."


def _matrix(*sets: str) -> dict[str, dict]:
    cfg = load_config(RULES, list(sets))
    return {g: group_config(cfg, g).model_dump(mode="json") for g in "ABCD"}


def test_what_counts_as_trained(tmp_path):
    merged = tmp_path / "stage1-merged"
    merged.mkdir()
    (merged / "memsearch_merge.json").write_text(json.dumps({"base": "embedded"}))
    assert backend_trained({"kind": "hf", "model": "embedded", "adapter": "runs/a"}) is True
    assert backend_trained({"kind": "hf", "model": str(merged)}) is True
    assert backend_trained({"kind": "openai", "model": str(merged)}) is True  # a server given the merged folder
    assert backend_trained({"kind": "hf", "model": "embedded"}) is False
    assert backend_trained({"kind": "rules", "model": "embedded", "adapter": None}) is False
    assert backend_trained({"kind": "openai", "model": "served-model"}) is None  # cannot be traced


def test_a_trained_pipeline_matrix_says_cross_ablation_and_teacher_caveats_not_prompt_baseline():
    notes = caveats(_matrix('backends.memory.kind="hf"', 'backends.memory.adapter="runs/stage1"',
                            'backends.controller.kind="hf"', 'backends.controller.adapter="runs/stage2"'))
    assert notes == [
        "C is a cross-ablation: a controller trained with decision (memory-policy) memory, run here with summary "
        "memory.",
        "Trained policies: teacher rows selected by their answers (export-sft --min-f1) or validity are no content "
        "audit: a right answer does not show that the memory behind it was true.",
        SCOPE,
    ]


def test_untrained_rows_are_prompt_baselines_and_corpus_scope_drops_the_scope_caveat():
    # Stage 1 trained (B/D memory), stage 2 skipped: C's controller is the untrained base.
    notes = caveats(_matrix('backends.memory.kind="hf"', 'backends.memory.adapter="runs/stage1"',
                            'backends.controller.kind="hf"', 'agent.retrieval_scope="corpus"'))
    assert notes[0].startswith("C: no trained policy") and "cross-ablation" not in " ".join(notes)
    assert notes[1].startswith("Trained policies:") and SCOPE not in notes
    # One run on its own: "this run"; a summary-memory fixed-plan run calls no policy.
    assert run_caveats(load_config(RULES))[0].startswith("this run: no trained policy")
    assert run_caveats(load_config(RULES, ['agent.memory="summary"'])) == [SCOPE]

"""What the memory action format itself buys: the same memory policies, budgets and questions in
the ``text`` and ``extractive`` formats (``agent.memory_format``, docs/design.md §5).

    uv run python -m studies.memory_policy.compare_memory_formats --out runs/formats \
        [--config studies/memory_policy/configs/memory_policy_cpu_v2.toml]

Reads the recipe's *validation* questions only (the ``data.val_questions`` dev questions after the
held-out ones; never a held-out question) and its episode (budgets, fixed plan, rules reader).
Policies, each in both formats: ``rules`` (the heuristic) and ``base`` (the untrained embedded
model in schema mode: under the text format's JSON constraint, or the extractive per-call one).
Each run is an ordinary eval run folder under ``--out``; ``comparison.json`` holds per run the
metrics, the memory calls by op and invalid cause, and the per-call decision rates
(``studies.memory_policy.pilot.run_record``), and a Markdown table is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORMATS = ("text", "extractive")
COLUMNS = ("memory_support_recall", "memory_support_precision", "f1", "em")


def main(argv: list[str] | None = None) -> int:
    """``python -m studies.memory_policy.compare_memory_formats --out DIR [--config FILE] [--policies rules,base]``."""
    from memsearch.config import RunConfig, load_config
    from memsearch.data.dataset import save_dataset
    from memsearch.errors import InputError
    from memsearch.eval.runner import run_eval
    from memsearch.pipelines.memory_policy.config import MemoryPolicyPipeline
    from memsearch.pipelines.memory_policy.heldout import gold_facts, policy_config
    from memsearch.pipelines.memory_policy.pipeline import validation_split
    from studies.memory_policy.pilot import run_record

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the runs and comparison.json")
    parser.add_argument("--config", type=Path, default=ROOT / "studies" / "memory_policy" / "configs"
                        / "memory_policy_cpu_v2.toml")
    parser.add_argument("--policies", default="rules,base", help="comma-separated: rules, base")
    args = parser.parse_args(argv)
    try:
        if args.out.exists():
            raise InputError(f"{args.out} exists; choose another --out (nothing is overwritten)")
        policies = [p for p in args.policies.split(",") if p]
        unknown = sorted(set(policies) - {"rules", "base"})
        if unknown:
            raise InputError(f"--policies: unknown {', '.join(unknown)}; expected rules and/or base")
        cfg = load_config(args.config, None, model=MemoryPolicyPipeline)
        if not cfg.data.val_questions:
            raise InputError(f"{args.config}: data.val_questions is 0: there are no validation questions to compare on")
        args.out.mkdir(parents=True)
        data = args.out / "val"
        save_dataset(validation_split(cfg), data)
        gold = gold_facts(data)
        record: dict[str, dict] = {}
        for policy in policies:
            for fmt in FORMATS:
                run_cfg = policy_config(cfg, policy).model_dump(mode="json")
                run_cfg["agent"]["memory_format"] = fmt
                run = args.out / f"{policy}-{fmt}"
                print(f"{policy} ({fmt}) on {data} ...", flush=True)
                run_eval(RunConfig.model_validate(run_cfg), data, run, show_progress=True)
                record[f"{policy}-{fmt}"] = run_record(run, gold)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    (args.out / "comparison.json").write_text(json.dumps(record, indent=2) + "\n")
    print("| run | " + " | ".join(COLUMNS) + " | invalid rate | over budget | ADD / NOOP calls | gold kept share |")
    print("|---" * (len(COLUMNS) + 5) + "|")
    for name, r in record.items():
        calls = r["memory_calls"]
        print(f"| {name} | " + " | ".join(f"{r['metrics'][m]:.3f}" for m in COLUMNS)
              + f" | {calls['invalid_rate']} | {calls['invalid']['over_budget']} | "
              f"{calls['calls_with']['ADD']} / {calls['calls_with']['NOOP']} | {r['decisions']['gold_kept_share']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

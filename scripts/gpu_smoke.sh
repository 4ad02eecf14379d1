#!/usr/bin/env bash
# GPU smoke test (issue 51): device, NCCL probe, two bf16 GRPO steps of the built-in trainer at the
# Qwen2.5-0.5B and 7B shapes (random init, no weights, no network), one JSON record per part in
# docs/results/gpu/ (or --out DIR); exit 0 only when every part passed. What each record holds and
# how each figure is measured: bench/gpu_smoke.py's docstring.
#
# 1. Here, once (network): the tokenizer and the wheels the device image lacks, into the
#    git-ignored .gpu/ (`du -sh .gpu` is what the carry costs; it must stay under 64 MiB):
#        scripts/prepare_gpu_bench.sh
# 2. One device call, nothing prepared there (it has torch, transformers, peft, accelerate):
#        run(command='set -o pipefail; scripts/gpu_smoke.sh --out "$OUT/gpu" 2>&1 | tee "$OUT/gpu_smoke.log"',
#            carry=[".gpu"], timeout_s=540)
#    then copy the returned gpu/*.json into docs/results/gpu/. The parts share a 465 s budget
#    (--budget-s), each with its own limit, so the call ends in under 8 minutes.
# CPU dry run (tiny shapes, float32, records into DIR or a new temporary folder; CI runs it in
# tests/bench/test_gpu_smoke.py):
#        scripts/gpu_smoke.sh --dry-run --out DIR
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [[ " $* " == *" --dry-run "* ]]; then
  exec "$PYTHON" bench/gpu_smoke.py "$@"
fi
exec "$PYTHON" bench/gpu_smoke.py --tokenizer .gpu/tokenizer --wheels .gpu/wheels "$@"

#!/usr/bin/env bash
# memsearch's memory policy (decision memory, fixed search plan: group B) trained with GRPO on
# upstream verl 0.9.1: one node, 8 GPUs, vLLM rollouts, HotpotQA train. docs/verl.md explains
# every step; the reference trainer's recipe is configs/train/grpo_gpu.toml.
#
#   MODEL=/models/Qwen2.5-7B-Instruct HOTPOT_TRAIN=hotpot_train_v1.1.json HOTPOT_DEV=hotpot_dev_distractor_v1.json \
#     bash scripts/verl/memory_policy_hotpot.sh [extra Hydra overrides...]
#
# The reader is the recipe's frozen model behind an OpenAI-compatible server
# (episode.backends.reader in grpo_gpu.toml: http://127.0.0.1:8000/v1, model "reader"); start
# it first, e.g. `vllm serve $MODEL --served-model-name reader --port 8000` on a GPU of its own
# (then give verl one GPU less: GPUS=7).
set -euo pipefail
MODEL=${MODEL:?set MODEL to a local Hugging Face model folder}
OUT=${OUT:-runs/verl-memory}
CONFIG=${CONFIG:-configs/train/grpo_gpu.toml}
GPUS=${GPUS:-8}

[ -d "$OUT/data/train" ] || memsearch data prepare-hotpot --input "${HOTPOT_TRAIN:?}" --split train --out "$OUT/data/train"
[ -d "$OUT/data/dev" ] || memsearch data prepare-hotpot --input "${HOTPOT_DEV:?}" --split dev --limit 200 --out "$OUT/data/dev"
memsearch verl export-data --data "$OUT/data/train" --out "$OUT/train.parquet" --role memory
memsearch verl export-data --data "$OUT/data/dev" --out "$OUT/dev.parquet" --role memory

# verl aggregates per token or per row (not per trajectory): token-mean is the closest.
memsearch verl config --config "$CONFIG" --data "$OUT/data/train" \
  --train-files "$OUT/train.parquet" --val-files "$OUT/dev.parquet" --agent-loops "$OUT/agent_loops.yaml" \
  --gpus "$GPUS" --set "model=$MODEL" --set "episode.tokenizer=$MODEL" --set aggregation=token \
  > "$OUT/overrides.txt"

# shellcheck disable=SC2046  # one override per line
python -m verl.trainer.main_ppo $(cat "$OUT/overrides.txt") \
  trainer.project_name=memsearch trainer.experiment_name=memory-policy \
  trainer.default_local_dir="$OUT/checkpoints" "$@"

#!/usr/bin/env bash
# memsearch's memory policy (decision memory, fixed search plan: group B) trained with GRPO on
# upstream verl 0.9.1: one node, vLLM rollouts, HotpotQA train. docs/verl.md explains every step;
# the reference trainer's recipe is configs/train/grpo_gpu.toml.
#
#   MODEL=/models/Qwen2.5-7B-Instruct HOTPOT_TRAIN=hotpot_train_v1.1.json HOTPOT_DEV=hotpot_dev_distractor_v1.json \
#     bash scripts/verl/memory_policy_hotpot.sh [extra Hydra overrides...]
#
# The reader is the recipe's frozen model behind an OpenAI-compatible server
# (episode.backends.reader in grpo_gpu.toml: http://127.0.0.1:8000/v1, model "reader") on a GPU of
# its own, named in the config's [devices] layout (verl trains on devices.train); start it first:
#   CUDA_VISIBLE_DEVICES=$(memsearch devices --config "$CONFIG" $SET --for reader) \
#     vllm serve "$MODEL" --served-model-name reader --port 8000
# The recipe's layout trains on GPU 0, the reader on GPU 1; on an 8-GPU node, e.g.
#   SET="--set devices.train=[0,1,2,3,4,5,6] --set devices.services.reader=[7]"
# The training GPU count must divide by the rollout TP size: ROLLOUT_TP is 1 here (any count works,
# a 7B policy fits one GPU's rollouts); ROLLOUT_TP=2 needs an even count. Without a [devices]
# table verl trains on GPUS (default 8). LOGGER=console,wandb adds W&B (needs WANDB_API_KEY).
set -euo pipefail
MODEL=${MODEL:?set MODEL to a local Hugging Face model folder}
OUT=${OUT:-runs/verl-memory}
CONFIG=${CONFIG:-configs/train/grpo_gpu.toml}
read -r -a SETS <<< "--set model=$MODEL --set episode.tokenizer=$MODEL --set loss.aggregation=token ${SET:-}"

# The layout's training GPUs are verl's (a --gpus other than their number is refused); a config
# without devices.train is refused by `memsearch devices --for train`: GPUS then.
LAUNCH=(--rollout-tp "${ROLLOUT_TP:-1}" --logger "${LOGGER:-console}")
if TRAIN_GPUS=$(memsearch devices --config "$CONFIG" "${SETS[@]}" --for train 2>/dev/null); then
  export CUDA_VISIBLE_DEVICES="$TRAIN_GPUS"
  if [ -n "${GPUS:-}" ]; then LAUNCH+=(--gpus "$GPUS"); fi
else
  LAUNCH+=(--gpus "${GPUS:-8}")
fi

[ -d "$OUT/data/train" ] || memsearch data prepare-hotpot --input "${HOTPOT_TRAIN:?}" --split train --out "$OUT/data/train"
[ -d "$OUT/data/dev" ] || memsearch data prepare-hotpot --input "${HOTPOT_DEV:?}" --split dev --limit 200 --out "$OUT/data/dev"
memsearch verl export-data --data "$OUT/data/train" --out "$OUT/train.parquet" --role memory
memsearch verl export-data --data "$OUT/data/dev" --out "$OUT/dev.parquet" --role memory

# verl aggregates per token or per row (not per trajectory): token-mean is the closest.
memsearch verl config --config "$CONFIG" --data "$OUT/data/train" \
  --train-files "$OUT/train.parquet" --val-files "$OUT/dev.parquet" --agent-loops "$OUT/agent_loops.yaml" \
  "${LAUNCH[@]}" "${SETS[@]}" > "$OUT/overrides.txt"

# One override a line, passed as one argument each: never word-split or globbed ([...] lists).
mapfile -t OVERRIDES < "$OUT/overrides.txt"
python -m verl.trainer.main_ppo "${OVERRIDES[@]}" \
  trainer.project_name=memsearch trainer.experiment_name=memory-policy \
  trainer.default_local_dir="$OUT/checkpoints" "$@"

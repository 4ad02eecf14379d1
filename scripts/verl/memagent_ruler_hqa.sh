#!/usr/bin/env bash
# MemAgent (overwrite memory over 2048-token chunks, boxed answer; memory updates and answer
# trained together) with GRPO on upstream verl 0.9.1: one node, 8 GPUs, vLLM rollouts,
# RULER-HQA-style training contexts built from HotpotQA train. docs/verl.md explains every step;
# the reference trainer's recipe is configs/memagent.toml.
#
#   MODEL=/models/Qwen2.5-7B-Instruct bash scripts/verl/memagent_ruler_hqa.sh [extra Hydra overrides...]
#
# configs/memagent.toml reads the HotpotQA sample files; point [data] at the full files with
# SET="--set data.train=... --set data.dev=..." for a real run. GPUs: the config's [devices]
# training GPUs when it has them, else GPUS (default 8); their number must divide by the rollout
# TP size (ROLLOUT_TP, verl's 2 by default). LOGGER=console,wandb adds W&B (needs WANDB_API_KEY).
set -euo pipefail
MODEL=${MODEL:?set MODEL to a local Hugging Face model folder}
OUT=${OUT:-runs/verl-memagent}
CONFIG=${CONFIG:-configs/memagent.toml}

# The recipe's credit ("split": each row a share of its session's advantage) runs on memsearch's
# trainer registered with verl: the overrides name it and the module that registers it (docs/verl.md).
read -r -a SETS <<< "--set model=$MODEL ${SET:-}"

# The layout's training GPUs are verl's (a --gpus other than their number is refused); a config
# without devices.train is refused by `memsearch devices --for train`: GPUS then.
LAUNCH=(--rollout-tp "${ROLLOUT_TP:-2}" --logger "${LOGGER:-console}")
if TRAIN_GPUS=$(memsearch devices --config "$CONFIG" "${SETS[@]}" --for train 2>/dev/null); then
  export CUDA_VISIBLE_DEVICES="$TRAIN_GPUS"
  if [ -n "${GPUS:-}" ]; then LAUNCH+=(--gpus "$GPUS"); fi
else
  LAUNCH+=(--gpus "${GPUS:-8}")
fi

# The pipeline's own prepare stage: dev RULER sets and the long training contexts (resumable).
python - "$CONFIG" "$OUT" "${SETS[@]}" <<'PY'
import sys
from pathlib import Path
from memsearch.config import load_config
from memsearch.pipelines.memagent.config import MemAgentPipeline
from memsearch.pipelines.memagent.pipeline import prepare_stage

config, out, *rest = sys.argv[1:]
overrides = [rest[i + 1] for i in range(0, len(rest), 2)]
paths = prepare_stage(load_config(config, overrides, model=MemAgentPipeline), Path(out))
Path(out, "train_data.txt").write_text(str(paths["train_data"]))
PY
TRAIN=$(cat "$OUT/train_data.txt")
memsearch verl export-data --data "$TRAIN" --out "$OUT/train.parquet" --role memagent
memsearch verl export-data --data "$OUT/prepare/ruler/docs50" --out "$OUT/dev.parquet" --role memagent

# The mini-batch is sized from the chunks of the training contexts (counted with MODEL's
# tokenizer): the notes on stderr state the optimizer steps a training step makes.
memsearch verl config --config "$CONFIG" --data "$TRAIN" \
  --train-files "$OUT/train.parquet" --val-files "$OUT/dev.parquet" --agent-loops "$OUT/agent_loops.yaml" \
  "${LAUNCH[@]}" "${SETS[@]}" > "$OUT/overrides.txt"

# verl's validation (dev.parquet: rows name their own data folder) is a training signal only;
# report numbers from `memsearch eval` on merged checkpoints (docs/verl.md).
# One override a line, passed as one argument each: never word-split or globbed ([...] lists).
mapfile -t OVERRIDES < "$OUT/overrides.txt"
python -m verl.trainer.main_ppo "${OVERRIDES[@]}" \
  trainer.project_name=memsearch trainer.experiment_name=memagent \
  trainer.default_local_dir="$OUT/checkpoints" "$@"

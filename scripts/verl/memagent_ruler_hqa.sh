#!/usr/bin/env bash
# MemAgent (overwrite memory over 2048-token chunks, boxed answer; memory updates and answer
# trained together) with GRPO on upstream verl 0.9.1: one node, 8 GPUs, vLLM rollouts,
# RULER-HQA-style training contexts built from HotpotQA train. docs/verl.md explains every step;
# the reference trainer's recipe is configs/memagent.toml.
#
#   MODEL=/models/Qwen2.5-7B-Instruct bash scripts/verl/memagent_ruler_hqa.sh [extra Hydra overrides...]
#
# configs/memagent.toml reads the HotpotQA sample files; point [data] at the full files with
# SET="--set data.train=... --set data.dev=..." for a real run.
set -euo pipefail
MODEL=${MODEL:?set MODEL to a local Hugging Face model folder}
OUT=${OUT:-runs/verl-memagent}
CONFIG=${CONFIG:-configs/memagent.toml}
GPUS=${GPUS:-8}
# verl broadcasts one advantage to every row of a session: credit "share" (the recipe's
# "split" has no verl equivalent and is refused).
read -r -a SETS <<< "--set model=$MODEL --set train.credit=share ${SET:-}"

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
memsearch verl export-data --data "$TRAIN" --out "$OUT/train.parquet" --role overwrite
memsearch verl export-data --data "$OUT/prepare/ruler/docs50" --out "$OUT/dev.parquet" --role overwrite

memsearch verl config --config "$CONFIG" --data "$TRAIN" \
  --train-files "$OUT/train.parquet" --val-files "$OUT/dev.parquet" --agent-loops "$OUT/agent_loops.yaml" \
  --gpus "$GPUS" "${SETS[@]}" > "$OUT/overrides.txt"

# verl's validation (dev.parquet: rows name their own data folder) is a training signal only;
# report numbers from `memsearch eval` on merged checkpoints (docs/verl.md).
# shellcheck disable=SC2046  # one override per line
python -m verl.trainer.main_ppo $(cat "$OUT/overrides.txt") \
  trainer.project_name=memsearch trainer.experiment_name=memagent \
  trainer.default_local_dir="$OUT/checkpoints" "$@"

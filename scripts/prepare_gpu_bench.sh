#!/usr/bin/env bash
# What bench/grpo_gpu.py needs on a device machine, prepared here once (about 10 MB, in the
# git-ignored .gpu/): the embedded model's tokenizer (the 98 MB GGUF cannot travel) and the wheels
# of TRL and of memsearch's small dependencies that the device image lacks (docs/training.md,
# "GPU throughput check"). Then one device call with carry = [".gpu"].
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu/wheels
[ -d .gpu/tokenizer ] || uv run python -c "import shutil; from memsearch.assets.embedded import tokenizer_dir; \
shutil.copytree(tokenizer_dir(), '.gpu/tokenizer')"
uv run --with pip python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .gpu/wheels \
    trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection typing-extensions \
    platformdirs bm25s PyStemmer

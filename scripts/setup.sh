#!/usr/bin/env bash
# Set up hanlm in ./.venv: torch (a CPU build where there is no NVIDIA GPU), then hanlm itself.
#   bash scripts/setup.sh          # for running hanlm
#   bash scripts/setup.sh --dev    # also the test and lint tools, and SkyPilot in .venv-sky
# HANLM_TORCH overrides the torch requirement (default: torch==2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
extras="hf"
[ "${1:-}" = "--dev" ] && extras="hf,dev"

if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)

torch_req=${HANLM_TORCH:-torch==2.13.0}
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: NVIDIA GPU found, installing $torch_req (CUDA build)"
    "${pip[@]}" install "$torch_req"
  else
    # Without a GPU the multi-GB CUDA wheel is dead weight: take the CPU build from PyTorch's
    # CPU index when it is reachable (else pip's own configuration decides, e.g. a local mirror).
    echo "setup: no NVIDIA GPU, installing $torch_req (CPU build)"
    cpu_index=https://download.pytorch.org/whl/cpu
    if .venv/bin/python -c "import urllib.request as u; u.urlopen('$cpu_index/', timeout=5)" 2>/dev/null; then
      "${pip[@]}" install "$torch_req" --extra-index-url "$cpu_index"
    else
      "${pip[@]}" install "$torch_req"
    fi
  fi
fi
if [ "${1:-}" = "--dev" ] && ! .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
  # llama-cpp-python (hanlm serve's engine; its tests) builds llama.cpp from source: PyPI has no
  # wheels. Without its multimodal library (mtmd), which hanlm does not use, it builds faster.
  echo "setup: building llama.cpp for llama-cpp-python (hanlm serve): many minutes on 2 cores"
  export CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF}"
fi
"${pip[@]}" install -e ".[$extras]"
if [ "${1:-}" = "--dev" ] && [ ! -x .venv-sky/bin/sky ]; then
  # SkyPilot in an environment of its own, as its docs advise (it pins click below what
  # huggingface_hub and wandb need): the launch tests validate tasks with its parser
  echo "setup: SkyPilot for the launch tests in .venv-sky"
  "$python" -m venv .venv-sky
  .venv-sky/bin/python -m pip --disable-pip-version-check -q install "skypilot>=0.10,<0.15"
fi
echo "setup: done; run .venv/bin/hanlm --help"

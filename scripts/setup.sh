#!/usr/bin/env bash
# Installs every Debian package autoshard needs (idempotent: fast when all are present)
# and the test-only Python tools from PyPI. CUDA/NCCL come with the CUDA toolkit and are
# only detected, never installed.
set -euo pipefail
pkgs=(build-essential cmake ninja-build clang libclang-rt-14-dev
      libeigen3-dev libboost-graph-dev libglpk-dev glpk-utils doctest-dev nlohmann-json3-dev
      libgloo-dev libbenchmark-dev libcli11-dev graphviz time python3 python3-pip python3-venv
      libonnx-dev libprotobuf-dev python3-onnx)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Test-only Python tools (interop with Hugging Face's safetensors; jsonschema checks every plan
# file the tool tests write against docs/plan.schema.json).
py=$(command -v python3)
if ! "$py" -c 'import safetensors, numpy, jsonschema' 2>/dev/null; then
  echo "setup: installing safetensors, numpy and jsonschema from PyPI"
  "$py" -m pip install -q safetensors numpy jsonschema 2>/dev/null || "$py" -m pip install -q --break-system-packages safetensors numpy jsonschema
fi
# The real client of the exports (PyTorch, transformers) gets an environment of its own, made
# once per machine by scripts/client_env.sh when the tests first need it (scripts/test.sh starts
# it early); the C++ build never needs it.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: CUDA toolkit found; CUDA parts will be built"
else
  echo "setup: no nvcc; CUDA parts are skipped"
fi

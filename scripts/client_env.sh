#!/usr/bin/env bash
# The real client of the exports, for the tests: a Python virtual environment with the
# pinned PyTorch, transformers, accelerate, safetensors, onnx, onnxscript and megatron-core of
# tests/client/requirements.txt.
# Created once per machine and per requirements file, outside the checkout:
#   ${AUTOSHARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/autoshard}/client-<sha256 of the file, 16 hex>
# so a rerun (or another clone on the same machine) downloads nothing; changing a pin makes a
# new one. Prints the environment's python on stdout; progress goes to stderr. Exits non-zero
# when the environment cannot be made: the tests that need it fail, they never skip.
# Usage: bash scripts/client_env.sh        # -> /root/.cache/autoshard/client-0123456789abcdef/bin/python
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
req=$root/tests/client/requirements.txt
cache=${AUTOSHARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/autoshard}
key=$(sha256sum "$req" | cut -c1-16)
env=$cache/client-$key
if [ ! -f "$env/.complete" ]; then
  mkdir -p "$cache"
  exec 9>"$cache/client-$key.lock"
  flock 9  # one creator at a time; the others wait and reuse its environment
  if [ ! -f "$env/.complete" ]; then
    rm -rf "$env"  # a half-made one (an interrupted install)
    echo "client_env: creating $env from tests/client/requirements.txt (about 5.7 GB, once per machine)" >&2
    start=$(date +%s)
    # -I: isolated from the caller's directory and PYTHON* variables (a types.py beside it would
    # shadow the standard library's).
    (cd "$cache" && python3 -I -m venv "$env") >&2
    # --no-cache-dir: the wheels are not kept twice (the environment is the cache).
    (cd "$cache" && "$env/bin/python" -I -m pip install -q --disable-pip-version-check --no-cache-dir -r "$req") >&2
    (cd "$cache" && "$env/bin/python" -I -c 'import torch, transformers, accelerate, safetensors, onnx, onnxscript, megatron.core, torch.distributed as d; assert d.is_gloo_available()') >&2
    cp "$req" "$env/requirements.txt"
    echo "client_env: created in $(( $(date +%s) - start )) s, $(du -sh "$env" | cut -f1)" >&2
    touch "$env/.complete"
  fi
fi
echo "$env/bin/python"

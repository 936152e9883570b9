#!/usr/bin/env bash
# The whole test suite from a fresh machine: setup, then GCC 12 and Clang 14 builds with
# -Wall -Wextra -Wpedantic -Werror (every header verified standalone, the installed package
# consumed by tests/package), then the suite once more under ASan + UBSan, then a fuzz smoke
# (every libFuzzer target in fuzz/ for 20,000 executions, scripts/fuzz.sh).
# Usage: bash scripts/test.sh [gcc|clang|asan|fuzz ...]   (default: gcc asan fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
presets=("$@")
# The asan preset builds everything with Clang 14 and -Werror, so it is also the Clang
# warning build; `bash scripts/test.sh clang` runs a plain Clang build on request.
[ ${#presets[@]} -eq 0 ] && presets=(gcc asan fuzz)
for p in "${presets[@]}"; do
  if [ "$p" = fuzz ]; then
    echo "=== autoshard: fuzz smoke ==="
    bash scripts/fuzz.sh -p "$jobs"
    continue
  fi
  echo "=== autoshard: $p build ==="
  start=$(date +%s)
  cmake --preset "$p" >/dev/null
  cmake --build --preset "$p" -j "$jobs"
  if [ "$p" != asan ]; then
    cmake --build --preset "$p" -j "$jobs" --target all_verify_interface_header_sets
  fi
  ctest --preset "$p" -j "$jobs" --timeout 600
  echo "=== autoshard: $p done in $(( $(date +%s) - start )) s ==="
done

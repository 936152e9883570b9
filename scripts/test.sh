#!/usr/bin/env bash
# The whole test suite from a fresh machine: setup, then GCC 12 and Clang 14 builds with
# -Wall -Wextra -Wpedantic -Werror (every header verified standalone, the installed package
# consumed by tests/package), then the suite once more under ASan + UBSan, then a fuzz smoke
# (every libFuzzer target in fuzz/ for 20,000 executions, scripts/fuzz.sh).
# Usage: bash scripts/test.sh [gcc|clang|asan|fuzz ...]   (default: gcc asan fuzz)
#
# Build time: the presets compile each test executable and the tool as
# one translation unit (AUTOSHARD_UNITY_BUILD) with line tables only; when the fuzz smoke
# runs after other steps, its targets are built from the start at the lowest CPU priority
# (nice 19), so they take only the cores the GCC and ASan steps leave idle.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
presets=("$@")
# The asan preset builds everything with Clang 14 and -Werror, so it is also the Clang
# warning build; `bash scripts/test.sh clang` runs a plain Clang build on request.
[ ${#presets[@]} -eq 0 ] && presets=(gcc asan fuzz)

fuzz_pid="" fuzz_log=build/fuzz-build.log
if [ ${#presets[@]} -gt 1 ] && [[ " ${presets[*]} " == *" fuzz "* ]]; then
  mkdir -p build
  # Its own process group (setsid), so that a failing step stops the whole background build.
  # A new session is also a new scheduler autogroup where the kernel has them, and nice only
  # counts inside one: the autogroup is niced to 19 as well.
  FUZZ_BUILD_JOBS=$jobs setsid -w bash -c '{ echo 19 >/proc/self/autogroup; } 2>/dev/null
    exec nice -n 19 bash scripts/fuzz.sh -b' >"$fuzz_log" 2>&1 &
  fuzz_pid=$!
  trap '[ -n "$fuzz_pid" ] && kill -- -"$fuzz_pid" 2>/dev/null; true' EXIT
fi

for p in "${presets[@]}"; do
  if [ "$p" = fuzz ]; then
    echo "=== autoshard: fuzz smoke ==="
    if [ -n "$fuzz_pid" ]; then
      rc=0; wait "$fuzz_pid" || rc=$?
      fuzz_pid=""
      if [ "$rc" != 0 ]; then
        cat "$fuzz_log"
        echo "=== autoshard: the background fuzz build failed (exit $rc) ===" >&2
        exit "$rc"
      fi
      grep '=== fuzz: built' "$fuzz_log" | sed 's/=== fuzz: built/=== fuzz: built in the background/' || true
    fi
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
  echo "=== autoshard: $p built in $(( $(date +%s) - start )) s ==="
  ctest --preset "$p" -j "$jobs" --timeout 600
  echo "=== autoshard: $p done in $(( $(date +%s) - start )) s ==="
done

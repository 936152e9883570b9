#!/usr/bin/env bash
# The whole test suite from a fresh machine: setup, then GCC 12 and Clang 14 builds with
# -Wall -Wextra -Wpedantic -Werror (every header verified standalone, the installed package
# consumed by tests/package), then the suite once more under ASan + UBSan, then a fuzz smoke
# (every libFuzzer target in fuzz/ for 20,000 executions, scripts/fuzz.sh).
# Usage: bash scripts/test.sh [gcc|clang|asan|fuzz ...]   (default: gcc asan fuzz; a step
# given alone builds and runs everything it can)
#
# Build time (CI has 2 cores and 15 minutes): the presets compile each test executable and
# the tool as one translation unit (AUTOSHARD_UNITY_BUILD) with line tables only. Nothing
# is compiled or run twice for the same proof: when the run has both, the ASan build (-O0)
# runs the unit and tool tests and the GCC build compiles those (and the benches) only for
# GCC's warnings (-fsyntax-only) and runs the rest (docs, package, examples, compile-fail,
# ODR); the ASan build compiles the examples and benches for Clang's warnings only; every header is
# checked on its own once (autoshard_header_checks, under Clang when the run has it). When
# the fuzz smoke runs after other steps, its targets (-O0) are built from the start at the
# lowest CPU priority (nice 19), so they take only the cores the other steps leave idle.
# The GCC build compiles the tool at -O1 (AUTOSHARD_TOOL_OPTIMIZATION, CMakePresets.json): the
# docs, client and limits tests it runs call it hundreds of times, 2 to 5 times faster than at
# -O0, for 27 s more of compiling.
# The ASan build links without PIE (-no-pie, CMakePresets.json): a PIE tool applied 545,000
# relocations at every start (a write, and a page copied, across its 8 MB of data), and the ASan
# tool tests start it about 1,300 times: tool.hardening's 630 runs took 56 and 59 s of CPU
# instead of 66 and 66.
#
# What does not pay (measured 2026-12-07 on the CI machine, 2 cores, CPU seconds user + sys from
# /usr/bin/time, each pair back to back; ci100's clean run used 36.7 of its 37.9 core-minutes and
# each ctest run ended within 1 % of its tests' CPU spread over 2 cores, so reordering gains
# nothing: only less CPU makes CI shorter):
# - The ASan tool at -O1 (AUTOSHARD_TOOL_OPTIMIZATION): it compiles in 270 s instead of 64
#   (-O1 -fno-inline-functions: 280), and tool.cli, tool.hardening, tool.hf and tool.onnx take
#   47, 41, 32 and 13 s instead of 95, 77, 54 and 38: 129 s saved for 206 s more compiling. (The
#   unit tests were not tried: at the same 4x, test_exec's 47 s of compiling would grow by more
#   than its 137 s of tests could shrink.)
# - The fuzz targets at -O1: fuzz_all compiles in 167 s instead of 52, and the smoke's 9 x 20,000
#   executions take 47 s instead of 152: even, so the smoke stays at -O0.
# - The header checks are 286 s of the ASan build's 654 (98 headers, ci100's .ninja_log): Clang
#   instantiates what each header's inline functions use (exec/verify.hpp alone: 12 s, most
#   of it instantiating the executor's templates for float and double). Checked as precompiled
#   headers they skip those instantiations (a quarter less) and with them the lookups a header
#   alone makes when instantiating: not done.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
# The real client of the exports (PyTorch, transformers): its environment is made once per
# machine (scripts/client_env.sh, cached outside the checkout); on a fresh machine it downloads
# while the builds run, and the client tests wait for it.
mkdir -p build
bash scripts/client_env.sh >/dev/null 2>build/client-env.log &
presets=("$@")
# The asan preset builds everything with Clang 14 and -Werror, so it is also the Clang
# warning build; `bash scripts/test.sh clang` runs a plain Clang build on request.
[ ${#presets[@]} -eq 0 ] && presets=(gcc asan fuzz)
has_asan=0
[[ " ${presets[*]} " == *" asan "* ]] && has_asan=1
header_step=""  # the build that checks every header on its own: asan's, else the first build
for p in "${presets[@]}"; do
  if [ "$p" = asan ] || { [ -z "$header_step" ] && [ "$p" != fuzz ]; }; then header_step=$p; fi
done

fuzz_pid="" fuzz_log=build/fuzz-build.log
if [ ${#presets[@]} -gt 1 ] && [[ " ${presets[*]} " == *" fuzz "* ]]; then
  mkdir -p build
  # Its own process group (setsid), so that a failing step stops the whole background build.
  # A new session is also a new scheduler autogroup where the kernel has them, and nice only
  # counts inside one: the autogroup is niced to 19 as well.
  FUZZ_OPT=-O0 FUZZ_BUILD_JOBS=$jobs setsid -w bash -c '{ echo 19 >/proc/self/autogroup; } 2>/dev/null
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
    FUZZ_OPT=-O0 bash scripts/fuzz.sh -p "$jobs"
    continue
  fi
  echo "=== autoshard: $p build ==="
  start=$(date +%s)
  # The unit tests run under ASan when the run has it; GCC or Clang then checks their warnings.
  only_warnings=OFF tests=()
  if [ "$has_asan" = 1 ] && [ "$p" != asan ]; then
    only_warnings=ON
    tests=(-L '^(compile_fail|package|docs|gpu|example|odr|tool_native|client)$')
  elif [ "$p" = asan ] && [ ${#presets[@]} -gt 1 ] && [[ " ${presets[*]} " =~ " "(gcc|clang)" " ]]; then
    # The real client (PyTorch) runs once, in the GCC or Clang step. Not with -LE: ctest ANDs a
    # -LE given here with the test preset's label exclusion (a test is left out only when each
    # of them matches one of its labels), so '-LE client' let the docs, package and compile-fail
    # tests back in (4 minutes), and a -LE repeating the preset's labels kept the client in
    # (54 s of CI's ASan step). A name filter (-E) applies on top of the preset's labels.
    tests=(-E '^client\.')
  fi
  cmake --preset "$p" -DAUTOSHARD_UNIT_TESTS_WARNINGS_ONLY=$only_warnings -DAUTOSHARD_BENCH_WARNINGS_ONLY=$only_warnings >/dev/null
  # One build for everything, the header checks included: Ninja then fills each core to the
  # end (they were a second build, which waited for the first one's last, longest file).
  targets=(all)
  [ "$p" = "$header_step" ] && targets+=(autoshard_header_checks)
  cmake --build --preset "$p" -j "$jobs" --target "${targets[@]}"
  echo "=== autoshard: $p built in $(( $(date +%s) - start )) s ==="
  ctest --preset "$p" -j "$jobs" --timeout 600 "${tests[@]}"
  echo "=== autoshard: $p done in $(( $(date +%s) - start )) s ==="
done

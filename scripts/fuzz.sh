#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, Clang 14, ASan + UBSan) and runs each one for a fixed
# number of executions over its seed corpus (fuzz/corpus/<target>) with its dictionary
# (fuzz/dict/<target>.dict). Prints one line per target: executions, cov, ft, corpus, time.
# Any crash, leak, timeout or uncaught exception fails the script; the input is saved under
# fuzz/corpus-run/crashes/<target>-crash-* (or -leak-, -timeout-, -oom-).
#
#   bash scripts/fuzz.sh                     # smoke: 20,000 executions per target (CI)
#   bash scripts/fuzz.sh -n 10000000         # long campaign (docs/fuzzing.md)
#   bash scripts/fuzz.sh -n 10000000 -p 2 safetensors spec   # 2 targets at a time, a subset
#
# Options: -n RUNS (default 20000), -p PARALLEL targets at once (default 1),
#          -t SECONDS cap per target (default none), -k keep the corpus a run grows in
#          fuzz/corpus-run/<target> (git-ignored; default for -n above 20000) instead of a
#          fresh temporary folder, -b build only.
# Environment: FUZZ_OPT, the targets' optimization level (default -O1; the CI smoke uses -O0).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
runs=20000 parallel=1 max_time=0 keep="" build_only=0
while getopts "n:p:t:kb" opt; do
  case $opt in
    n) runs=$OPTARG ;;
    p) parallel=$OPTARG ;;
    t) max_time=$OPTARG ;;
    k) keep=1 ;;
    b) build_only=1 ;;
    *) sed -n 2,17p "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ -z "$keep" ] && { [ "$runs" -gt 20000 ] && keep=1 || keep=0; }

build=$root/build/fuzz
start=$(date +%s)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only \
  -DAUTOSHARD_BUILD_FUZZ=ON -DAUTOSHARD_BUILD_TESTS=OFF -DAUTOSHARD_BUILD_EXAMPLES=OFF \
  -DAUTOSHARD_BUILD_BENCH=OFF -DAUTOSHARD_BUILD_TOOLS=OFF -DAUTOSHARD_BUILD_PACKAGE_TEST=OFF \
  -DAUTOSHARD_ENABLE_CUDA=OFF -DAUTOSHARD_FUZZ_OPT="${FUZZ_OPT:--O1}" >/dev/null
cmake --build "$build" -j "${FUZZ_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}" --target autoshard_fuzz_all
echo "=== fuzz: built in $(( $(date +%s) - start )) s ==="
[ "$build_only" = 1 ] && exit 0

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for exe in "$build"/fuzz/fuzz_*; do [ -x "$exe" ] && [ "$exe" != "$build/fuzz/fuzz_all" ] && targets+=("$(basename "$exe" | sed 's/^fuzz_//')"); done
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/autoshard-fuzz.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

run_one() {  # target -> writes $tmp/<target>.log and $tmp/<target>.rc
  local t=$1 work
  if [ "$keep" = 1 ]; then work=$root/fuzz/corpus-run/$t; else work=$tmp/corpus-$t; fi
  mkdir -p "$work" "$root/fuzz/corpus-run/crashes"
  local args=(-runs="$runs" -seed=1 -timeout=10 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1
              -artifact_prefix="$root/fuzz/corpus-run/crashes/$t-")
  [ -f "$root/fuzz/dict/$t.dict" ] && args+=(-dict="$root/fuzz/dict/$t.dict")
  [ "$max_time" != 0 ] && args+=(-max_total_time="$max_time")
  # The JSON readers run on a 512 KiB stack (8 MiB by default): recursion that grows with the
  # input's nesting then crashes on the corpus's depth bombs (2,000 arrays, 600 objects) instead of fitting
  # by luck. Every reader refuses more than 128 levels before parsing (io/json.hpp).
  local stack=unlimited
  case $t in hf_config | index_json | iopddl | model_json | plan_json | readers | safetensors) stack=512 ;; esac
  local s=$(date +%s) rc=0
  (cd "$work" && { [ "$stack" = unlimited ] || ulimit -s "$stack"; } &&
    "$build/fuzz/fuzz_$t" "${args[@]}" "$work" "$root/fuzz/corpus/$t") >"$tmp/$t.log" 2>&1 || rc=$?
  echo "$rc $(( $(date +%s) - s ))" >"$tmp/$t.rc"
}

for t in "${targets[@]}"; do
  if [ ! -x "$build/fuzz/fuzz_$t" ]; then echo "fuzz: no target fuzz_$t" >&2; exit 2; fi
done
# A pool of `parallel` slots: the next target starts as soon as any running one ends (wait -n),
# not when the oldest does (the targets take 1 to 21 s each at -O0: waiting for the oldest left
# a core idle for a tenth of the smoke). run_one records each target's own exit status.
running=0
for t in "${targets[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$parallel" ]; then wait -n || true; running=$((running - 1)); fi
done
wait

failed=0
printf '%-12s %10s %6s %7s %6s %6s %s\n' target executions cov ft corpus secs result
for t in "${targets[@]}"; do
  read -r rc secs <"$tmp/$t.rc"
  final=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$tmp/$t.log" | tail -1 || true)
  execs=$(grep -oE '^stat::number_of_executed_units: [0-9]+' "$tmp/$t.log" | awk '{print $2}' | tail -1)
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$final")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$final")
  corp=$(sed -nE 's/.* corp: ([0-9]+)\/.*/\1/p' <<<"$final")
  result=ok
  if [ "$rc" != 0 ]; then
    result="FAILED (exit $rc)"
    failed=1
  fi
  printf '%-12s %10s %6s %7s %6s %6s %s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$secs" "$result"
  if [ "$rc" != 0 ]; then
    grep -E 'ERROR|SUMMARY|runtime error|terminate|fuzz_|Test unit written|^    #[0-9] ' "$tmp/$t.log" | head -30 >&2
  fi
done
echo "=== fuzz: $runs executions per target, $(( $(date +%s) - start )) s in all ==="
exit $failed

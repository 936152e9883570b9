#!/usr/bin/env bash
# Lists every function in include/autoshard/ longer than a limit (default 80 lines, the
# body with its blank lines and comments), with clang-tidy's readability-function-size
# over one translation unit that includes every header of include/autoshard/ (an umbrella
# leaves some out: pass/pipelined.hpp), the device area's too when the CUDA toolkit's
# headers are found (CUDA_HOME, else /usr/local/cuda; without them it says it left device/
# out). Exits 1 when any is found.
#   bash scripts/function_lengths.sh        # the limit the design sets: 80
#   bash scripts/function_lengths.sh 60
# About a minute of CPU (the whole library is parsed once).
set -euo pipefail
cd "$(dirname "$0")/.."
limit=${1:-80}
tidy=$(command -v clang-tidy-14 || command -v clang-tidy || true)
if [[ -z "$tidy" ]]; then
  echo "function_lengths: clang-tidy not found (apt-get install clang-tidy)" >&2
  exit 2
fi
cuda=${CUDA_HOME:-/usr/local/cuda}
cuda_flags=()
if [[ -f "$cuda/include/cuda_runtime_api.h" && -f "$cuda/include/nccl.h" ]]; then
  cuda_flags=(-isystem "$cuda/include")
else
  echo "function_lengths: no CUDA toolkit headers in $cuda/include: include/autoshard/device/ is not checked" >&2
fi
log=$(mktemp)
tu=$(mktemp --suffix=.cpp)
trap 'rm -f "$log" "$tu"' EXIT
# Every header, each on its own line, in path order (each compiles alone: the header checks).
for h in $(cd include && find autoshard -name '*.hpp' | LC_ALL=C sort); do
  [[ $h == autoshard/device/* && ${#cuda_flags[@]} -eq 0 ]] && continue
  echo "#include <$h>"
done >"$tu"
# clang-tidy exits non-zero on compiler errors: those are reported below, not hidden.
"$tidy" --quiet -checks='-*,readability-function-size' \
  -config="{CheckOptions: [{key: readability-function-size.LineThreshold, value: $limit}]}" \
  -header-filter="$PWD/include/autoshard/.*" "$tu" -- \
  -std=c++20 -DBOOST_ALL_NO_LIB -DONNX_ML=1 -DONNX_NAMESPACE=onnx \
  -I"$PWD/include" -isystem /usr/include/eigen3 "${cuda_flags[@]}" >"$log" 2>&1 || true
if grep -q "error:" "$log"; then
  grep "error:" "$log" >&2
  exit 2
fi
# "file:line:col: warning: function 'f' exceeds ..." then "file:line:col: note: N lines ..." (none:
# grep's status 1 is no failure, or set -e would end the script silently with 1).
found=$(grep -E "warning: function|note: [0-9]+ lines" "$log" | sed -E "s|$PWD/||; :a; s#include/autoshard/[a-z_]+/\.\./#include/autoshard/#; ta" |
        paste - - | sed -E "s/^([^ ]+): warning: function '([^']+)'.* note: ([0-9]+) lines.*/\3 \1 \2/" | sort -rn | uniq || true)
if [[ -n "$found" ]]; then
  echo "functions over $limit lines (lines, where, name):"
  echo "$found"
  exit 1
fi
echo "no function in include/autoshard/ is over $limit lines"

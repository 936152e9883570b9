#!/usr/bin/env bash
# Lists every function in include/autoshard/ longer than a limit (default 80 lines, the
# body with its blank lines and comments), with clang-tidy's readability-function-size
# over one translation unit that includes every area's umbrella (tests/odr/all.hpp; the
# device area needs the CUDA toolkit and is left out). Exits 1 when any is found.
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
areas=()
for a in IO GRAPH ONNX PLAN GLPK PASS TENSOR COMM GLOO EXEC; do areas+=("-DHAVE_AUTOSHARD_$a=1"); done
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# clang-tidy exits non-zero on compiler errors: those are reported below, not hidden.
"$tidy" --quiet -checks='-*,readability-function-size' \
  -config="{CheckOptions: [{key: readability-function-size.LineThreshold, value: $limit}]}" \
  -header-filter="$PWD/include/autoshard/.*" tests/odr/a.cpp -- \
  -std=c++20 -DHAVE_AUTOSHARD=1 "${areas[@]}" -DBOOST_ALL_NO_LIB -DONNX_ML=1 -DONNX_NAMESPACE=onnx \
  -I"$PWD/include" -isystem /usr/include/eigen3 >"$log" 2>&1 || true
if grep -q "error:" "$log"; then
  grep "error:" "$log" >&2
  exit 2
fi
# "file:line:col: warning: function 'f' exceeds ..." then "file:line:col: note: N lines ..."
found=$(grep -E "warning: function|note: [0-9]+ lines" "$log" | sed -E "s|$PWD/||; :a; s#include/autoshard/[a-z_]+/\.\./#include/autoshard/#; ta" |
        paste - - | sed -E "s/^([^ ]+): warning: function '([^']+)'.* note: ([0-9]+) lines.*/\3 \1 \2/" | sort -rn | uniq)
if [[ -n "$found" ]]; then
  echo "functions over $limit lines (lines, where, name):"
  echo "$found"
  exit 1
fi
echo "no function in include/autoshard/ is over $limit lines"

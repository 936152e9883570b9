# Sourced first by every tool test (tests/tool/*.sh): strict mode, the tool under test ($1), the
# tests' directory, a scratch directory removed on exit, the pass/fail counters, and the summary
# that ends each test with its exit status.
#   source "$(dirname "$0")/common.sh" "$1"
#   ... ok, or bad "what went wrong" ...
#   finish name
# and the checks most tests share: run_rc, expect (exit status and stderr), one_error (exit 1, one line
# with a kind).
set -uo pipefail
tool=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fails=0; passes=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ok()  { passes=$((passes+1)); }
bad() { echo "FAIL: $*"; fails=$((fails+1)); }
# run cmd...: its stdout in $tmp/out, its stderr in $tmp/err; returns its exit status.
run() { "$@" >"$tmp/out" 2>"$tmp/err"; }
# finish NAME: the summary line; the exit status is 0 when nothing failed.
finish() { echo "$1: $passes passed, $fails failed"; [ "$fails" -eq 0 ]; }
# run_rc cmd...: as run, within 60 s, printing the exit status.
run_rc() { timeout 60 "$@" >"$tmp/out" 2>"$tmp/err"; echo $?; }
# expect LABEL CODE REGEX cmd...: exit CODE and stderr matching REGEX (extended).
expect() {
  local label=$1 want=$2 re=$3; shift 3
  local rc; rc=$(run_rc "$@")
  if [ "$rc" -eq "$want" ] && { [ -z "$re" ] || grep -Eq -- "$re" "$tmp/err"; }; then ok
  else bad "$label: $* -> exit $rc (wanted $want), stderr: $(head -c 600 "$tmp/err")"; fi
}
# one_error LABEL cmd...: exit 1 and exactly one stderr line with a documented kind.
kinds='^autoshard: (spec|shape|graph|solver|io|comm|device|execution|resource) error: '
one_error() {
  local label=$1; shift
  local rc; rc=$(run_rc "$@")
  if [ "$rc" -eq 1 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -Eq "$kinds" "$tmp/err"; then ok
  else bad "$label: $* -> exit $rc, stderr: $(head -c 600 "$tmp/err")"; fi
}

# Sourced first by every tool test (tests/tool/*.sh): strict mode, the tool under test ($1), the
# tests' directory, a scratch directory removed on exit, the pass/fail counters, and the summary
# that ends each test with its exit status.
#   source "$(dirname "$0")/common.sh" "$1"
#   ... ok, or bad "what went wrong" ...
#   finish name
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

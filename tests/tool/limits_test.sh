#!/usr/bin/env bash
# Resource limits the machine imposes (an address-space limit, `ulimit -v`) end in the tool's
# own one-line errors, never in SIGABRT or a bare "std::bad_alloc", and write no file.
# Needs a build without sanitizers (they reserve terabytes of address space, so such a build
# cannot start under any limit): CTest label tool_native, run by the GCC build in CI. A build
# that cannot start under the limit fails this test instead of skipping it.
source "$(dirname "$0")/common.sh" "$1"
limited() {  # limited KB cmd...: run under an address-space limit of KB kilobytes
  local kb=$1; shift
  bash -c 'ulimit -v "$0" && exec "$@"' "$kb" "$@" >"$tmp/out" 2>"$tmp/err"
}

if ! limited 400000 "$tool" --version; then
  echo "FAIL: '$tool --version' does not start under ulimit -v 400000 (a sanitizer build?):" \
       "this test needs a build without sanitizers"
  exit 1
fi

if "$tool" --help | grep -q ' calibrate'; then
  # Rank threads that cannot be created end in a clear error, not "terminate called without
  # an active exception".
  limited 400000 "$tool" calibrate --mesh 8x8 --max-bytes 65536 --repeats 1 --out "$tmp/never.json"
  rc=$?
  [ "$rc" = 1 ] && grep -q "cannot start the thread of rank" "$tmp/err" && ok ||
    bad "calibrate under ulimit -v -> exit $rc: $(cat "$tmp/err")"
  test ! -e "$tmp/never.json" && ok || bad "a failed calibrate wrote its file"
fi

if "$tool" --help | grep -q ' solve'; then
  # A valid 150,000-node problem (12 MB of JSON) whose parsed tree alone needs several times
  # the limit is refused before parsing, with the estimate and the limit (running out of
  # memory inside the parser once ended in SIGABRT: the tree's destructor allocates).
  python3 - "$tmp/big.json" "$tmp/ones.json" <<'PY'
import json, sys
n = 150_000
nodes = {"intervals": [[i, i + 2] for i in range(n)], "costs": [[3, 1, 2]] * n, "usages": [[1, 1, 1]] * n}
edges = {"nodes": [[i, i + 1] for i in range(n - 1)], "costs": [[0, 1, 1, 1, 0, 1, 1, 1, 0]] * (n - 1)}
json.dump({"problem": {"name": "big", "nodes": nodes, "edges": edges, "usage_limit": 10}}, open(sys.argv[1], "w"))
json.dump([1] * n, open(sys.argv[2], "w"))
PY
  limited 120000 "$tool" solve "$tmp/big.json" --time-limit 5 --solution-out "$tmp/sol.json"
  rc=$?
  [ "$rc" = 1 ] && grep -q "^autoshard: resource error: IOPDDL problem '.*big.json' has 12.0. MiB of JSON, whose tree may take up to .*; this process can allocate .* more (the address-space limit, ulimit -v)" "$tmp/err" && ok ||
    bad "solve under ulimit -v 120000 -> exit $rc: $(head -c 600 "$tmp/err")"
  test ! -e "$tmp/sol.json" && ok || bad "solve out of memory wrote its solution file"
  # Without the limit the same file is read and evaluated (the limit, not the input, made
  # it fail): all ones cost 150,000, each node's 1 and no edge cost between equal choices.
  "$tool" solve "$tmp/big.json" --evaluate "$tmp/ones.json" --json >"$tmp/out" 2>"$tmp/err" &&
    python3 -c "import json,sys; d=json.load(open('$tmp/out')); sys.exit(0 if d['objective'] == 150000 else 1)" && ok ||
    bad "evaluate without the limit: $(head -c 600 "$tmp/out") $(head -c 600 "$tmp/err")"
fi

finish limits

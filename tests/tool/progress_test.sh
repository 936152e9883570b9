#!/usr/bin/env bash
# Progress lines of long commands: on stderr only when asked (--progress) or when stderr is a
# terminal, with each phase's counts, and never in a --json document on stdout.
source "$(dirname "$0")/common.sh" "$1"

if "$tool" --help | grep -q ' verify'; then
  m=(--model gpt2 --layers 1 --hidden 16 --heads 2 --vocab 32 --seq 8 --batch 4 --mesh 2x2 --quiet)
  "$tool" plan "${m[@]}" --out "$tmp/train.json" >/dev/null && "$tool" plan "${m[@]}" --mode infer --out "$tmp/infer.json" >/dev/null \
    && ok || bad "plans to verify"
  # Training: the reference step, the ranks' pieces (one per operator per rank, and a gradient
  # and an update per parameter per rank), the comparison; counts from the report itself.
  if "$tool" verify --plan "$tmp/train.json" --json --progress >"$tmp/out" 2>"$tmp/err"; then ok; else bad "verify --progress"; cat "$tmp/err"; fi
  python3 - "$tmp/out" "$tmp/err" <<'PY' && ok || bad "verify --progress lines: $(cat "$tmp/err")"
import json, re, sys
d = json.load(open(sys.argv[1]))  # stdout is exactly one JSON document
err = open(sys.argv[2]).read()
ops, grads, ranks = len(d["operators"]), len(d["gradients"]), d["ranks"]
pieces, tensors = ranks * (ops + 2 * grads), ops + 2 * grads
want = [f"verify: reference: 0/{ops} operators", f"verify: reference: {ops}/{ops} operators",
        f"verify: ranks: 0/{pieces} pieces", f"verify: ranks: {pieces}/{pieces} pieces",
        f"verify: comparison: 0/{tensors} tensors", f"verify: comparison: {tensors}/{tensors} tensors"]
missing = [w for w in want if w not in err]
order = [err.find(w) for w in want]
lines = [l for l in err.splitlines() if l.startswith("verify: ")]
done = [tuple(map(int, re.search(r"(\d+)/(\d+)", l).groups())) for l in lines if l.startswith("verify: ranks")]
sys.exit(0 if ops > 0 and grads > 0 and not missing and order == sorted(order) and all(a <= b for a, b in done)
         and [a for a, _ in done] == sorted(a for a, _ in done) else 1)
PY
  # Inference: no reference phase (the unsharded values are computed inside the ranks' run).
  "$tool" verify --plan "$tmp/infer.json" --progress >"$tmp/out" 2>"$tmp/err" && ok || bad "verify --progress, inference"
  ! grep -q "verify: reference" "$tmp/err" && grep -q "verify: ranks: .* pieces compared" "$tmp/err" && ok || bad "inference progress: $(cat "$tmp/err")"
  grep -q "^PASS" "$tmp/out" && ! grep -q "verify: " "$tmp/out" && ok || bad "progress on stdout: $(cat "$tmp/out")"
  # Not asked and stderr not a terminal: no progress lines.
  "$tool" verify --plan "$tmp/train.json" --json >"$tmp/out" 2>"$tmp/err" && ok || bad "verify --json"
  ! grep -q "^verify: " "$tmp/err" && ok || bad "progress without --progress on a non-terminal: $(cat "$tmp/err")"
  # On a terminal (script(1) gives the command one), the line is redrawn in place.
  if command -v script >/dev/null; then
    script -qec "\"$tool\" verify --plan \"$tmp/infer.json\"" /dev/null >"$tmp/tty" 2>&1
    grep -q $'\r\033\\[Kverify: ranks: ' "$tmp/tty" && ok || bad "no redrawn progress line on a terminal: $(head -c 600 "$tmp/tty" | cat -v)"
  fi
fi

# plan: the phases around the solve with their counts (operators, edges, baselines); --quiet
# silences them; stdout stays one JSON document.
if "$tool" --help | grep -q ' plan'; then
  if "$tool" plan --model llama-7b --layers 2 --mesh 2x2 --out "$tmp/p.json" --json --progress >"$tmp/out" 2>"$tmp/err"; then ok; else bad "plan --progress"; cat "$tmp/err"; fi
  python3 - "$tmp/out" "$tmp/err" "$tmp/p.json" <<'PY' && ok || bad "plan --progress lines: $(cat "$tmp/err")"
import json, sys
json.load(open(sys.argv[1]))
err = open(sys.argv[2]).read()
plan = json.load(open(sys.argv[3]))
n = len(plan["tensors"])  # one per vertex
edges = sum(len(t["inputs"]) for t in plan["tensors"])  # one edge per operand
want = [f"plan: strategies: 0/{n} ", f"plan: strategies: {n}/{n} ", f"plan: pricing: 0/{edges} ",
        f"plan: pricing: {edges}/{edges} ", "plan: baselines: 0/4 ", "plan: baselines: 4/4 "]
missing = [w for w in want if w not in err]
order = [err.find(w) for w in want]
sys.exit(0 if not missing and order == sorted(order) else 1)
PY
  "$tool" plan --model llama-7b --layers 2 --mesh 2x2 --out "$tmp/p.json" --progress --quiet >/dev/null 2>"$tmp/err" && ok || bad "plan --quiet"
  ! grep -q "^plan: " "$tmp/err" && ok || bad "plan --quiet still shows progress: $(cat "$tmp/err")"
fi

finish progress

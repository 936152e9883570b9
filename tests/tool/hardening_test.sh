#!/usr/bin/env bash
# Regressions of the third hostile-input battery (issue 30, docs/reliability.md "Hardening round
# three"): each check is labelled "class<N>:" after the issue's numbered classes, and failed on
# the tree before the fix of its class.
source "$(dirname "$0")/common.sh" "$1"
data=$(cd "$here/../data" && pwd)
cd "$tmp"  # a command that ignores an empty path writes into the working directory
small=(--model gpt2 --layers 1 --hidden 32 --heads 4 --vocab 128 --seq 16 --batch 8)
"$tool" plan "${small[@]}" --mesh 2x2 --algo megatron --out "$tmp/p.json" --quiet >/dev/null 2>&1 || bad "the test plan"
"$tool" synth "${small[@]}" --out "$tmp/ck" >/dev/null 2>&1 || bad "the test checkpoint"

# class1: JSON nested 100,000 deep (arrays or objects) crashed every reader (nlohmann's recursive
# dump() of the value in the error message); now one line naming the file and the depth.
python3 - "$tmp" <<'PY'
import os, struct, sys
t = sys.argv[1]
bombs = {"arr": "[" * 100000 + "]" * 100000, "obj": '{"a":' * 100000 + "1" + "}" * 100000}
for kind, text in bombs.items():
    open(f"{t}/deep-{kind}.json", "w").write(text)
    os.makedirs(f"{t}/cfg-{kind}", exist_ok=True)
    open(f"{t}/cfg-{kind}/config.json", "w").write(text)
    os.makedirs(f"{t}/idx-{kind}", exist_ok=True)
    open(f"{t}/idx-{kind}/model.safetensors.index.json", "w").write(text)
    header = '{"__metadata__":' + text + "}"
    open(f"{t}/st-{kind}.safetensors", "wb").write(struct.pack("<Q", len(header)) + header.encode())
PY
deep="nested deeper than 128 levels \(arrays and objects\) at "
for k in arr obj; do
  d=$tmp/deep-$k.json
  for cmd in "verify --plan $d" "export --plan $d --to hf-tp-plan" "show --plan $d" "plan --model $d --out $tmp/o1.json" \
             "plan --model $tmp/cfg-$k --out $tmp/o1.json" "synth --model $tmp/cfg-$k --out $tmp/o1" "solve $d" \
             "solve $data/solve/example.json --evaluate $d" "plan ${small[*]} --calibration $d --out $tmp/o1.json" \
             "shard $tmp/idx-$k --policy gpt2 --tp 2 --config $tmp/ck/config.json --out $tmp/o1" \
             "shard $tmp/st-$k.safetensors --policy gpt2 --tp 2 --config $tmp/ck/config.json --out $tmp/o1"; do
    # shellcheck disable=SC2086
    one_error "class1 ($k)" "$tool" $cmd
    grep -Eq "$deep" "$tmp/err" || bad "class1 ($k): $cmd: $(head -c 300 "$tmp/err")"
  done
done
test ! -e "$tmp/o1.json" && test ! -e "$tmp/o1" && ok || bad "class1: a refused reader wrote an output"

# class2: an output that is a FIFO or a symbolic link was replaced by a regular file (the node or
# link gone, exit 0). Every writer refuses it and leaves it as it was; --follow-symlinks writes
# the file a link points to.
"$tool" solve "$data/solve/example.json" --quiet --solution-out "$tmp/sol.json" >/dev/null 2>&1 || bad "class2: the test solution"
"$tool" calibrate --mesh 2 --max-bytes 65536 --repeats 1 --out "$tmp/links.json" >/dev/null 2>&1 || bad "class2: the test calibration"
# writers NAME OUT: each writing command with its output at OUT (a file path, or for synth and
# shard the directory that holds FILE as their output).
refuse_writers() {
  local o=$1
  mkdir -p "$o.d"
  cat <<CMDS
plan|$o|plan ${small[*]} --mesh 2x2 --algo megatron --quiet --out $o --dot $o.d/p.dot
plan --dot|$o|plan ${small[*]} --mesh 2x2 --algo megatron --quiet --out $o.d/p.json --dot $o
export|$o|export --plan $tmp/p.json --to hf-tp-plan --out $o
solve|$o|solve $data/solve/example.json --quiet --solution-out $o
show|$o|show --mesh 2x2 --shape 8,8 --spec S0S1 --svg $o
show --plan|$o|show --plan $tmp/p.json --tensor lm_head --svg $o
calibrate|$o|calibrate --mesh 2 --max-bytes 65536 --repeats 1 --out $o
synth|$o.d/config.json|synth ${small[*]} --out $o.d
shard|$o.d/rank-1.safetensors|shard $tmp/ck --policy gpt2 --tp 2 --out $o.d
shard index|$o.d/index.json|shard $tmp/ck --policy gpt2 --tp 2 --out $o.d
CMDS
}
echo precious >"$tmp/victim"
n=0
while IFS='|' read -r name out cmd; do
  for kind in fifo link; do
    n=$((n + 1)); o=$tmp/w$n
    while IFS='|' read -r name2 out2 cmd2; do [ "$name2" = "$name" ] && { out=$out2; cmd=$cmd2; }; done < <(refuse_writers "$o")
    rm -f "$out"
    if [ $kind = fifo ]; then mkfifo "$out"; else ln -s "$tmp/victim" "$out"; fi
    # shellcheck disable=SC2086
    one_error "class2 ($name, $kind)" "$tool" $cmd
    grep -q "not a regular file: refusing to replace it" "$tmp/err" || bad "class2 ($name, $kind): $(cat "$tmp/err")"
    if [ $kind = fifo ]; then test -p "$out" && ok || bad "class2 ($name): the FIFO was replaced"
    else test -L "$out" && [ "$(cat "$tmp/victim")" = precious ] && ok || bad "class2 ($name): the link or its target changed"; fi
    [ -z "$(find "$tmp" -name '*.tmp.*')" ] && ok || bad "class2 ($name, $kind): temporaries left: $(find "$tmp" -name '*.tmp.*')"
  done
done < <(refuse_writers "$tmp/w0")
# --follow-symlinks: the link stays, the file it points to is written (a regular file only).
ln -s "$tmp/victim" "$tmp/follow.json"
expect "class2 (--follow-symlinks)" 0 "" "$tool" export --plan "$tmp/p.json" --to hf-tp-plan --out "$tmp/follow.json" --follow-symlinks
test -L "$tmp/follow.json" && python3 -c "import json,sys; json.load(open(sys.argv[1]))['tp_plan']" "$tmp/victim" && ok \
  || bad "class2: --follow-symlinks did not write the link's target"
mkfifo "$tmp/fifo-target" && ln -s "$tmp/fifo-target" "$tmp/follow2.json"
one_error "class2 (--follow-symlinks to a FIFO)" "$tool" export --plan "$tmp/p.json" --to hf-tp-plan --out "$tmp/follow2.json" --follow-symlinks
test -p "$tmp/fifo-target" && ok || bad "class2: a FIFO behind a followed link was replaced"

# class3: the picture's temporary was the fixed name <plan>.svg.tmp, opened through a link planted
# there; now every temporary is created exclusively under an unpredictable name.
echo precious >"$tmp/victim3"
ln -s "$tmp/victim3" "$tmp/p3.svg.tmp"
expect class3 0 "" "$tool" plan "${small[@]}" --mesh 2x2 --algo megatron --out "$tmp/p3.json" --quiet
[ "$(cat "$tmp/victim3")" = precious ] && ok || bad "class3: the link's target was overwritten"
grep -q "<svg" "$tmp/p3.svg" && ok || bad "class3: no SVG was written"
# --no-svg skips Graphviz.
expect class6 0 "" "$tool" plan "${small[@]}" --mesh 2x2 --algo megatron --out "$tmp/p6.json" --quiet --no-svg
test ! -e "$tmp/p6.svg" && test -e "$tmp/p6.dot" && ok || bad "class6: --no-svg wrote an SVG (or no DOT)"

# class10: a 240-byte file name (Linux allows 255) was refused: its temporary's suffix pushed it over.
long=$(printf 'a%.0s' $(seq 1 235)).json
expect class10 0 "" "$tool" plan "${small[@]}" --mesh 2x2 --algo megatron --out "$tmp/$long" --quiet --no-svg
test -s "$tmp/$long" && ok || bad "class10: no plan under a 240-byte name"
expect class10 0 "" "$tool" export --plan "$tmp/p.json" --to hf-tp-plan --out "$tmp/${long%.json}.dtensor"

finish hardening

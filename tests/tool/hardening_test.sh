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

finish hardening

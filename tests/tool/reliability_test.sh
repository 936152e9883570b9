#!/usr/bin/env bash
# Regressions of the hostile-input battery (issue 17, docs/reliability.md): each check feeds the
# tool what crashed it, hung it, overwrote an input or gave a silently wrong result before, and
# requires a clear one-line error now (exit 1 with `autoshard: <kind> error: `, or exit 2 for a
# usage error) and the files it must leave alone left alone. Each check is labelled
# "item<N>:" after the issue's numbered list.
source "$(dirname "$0")/common.sh" "$1"
small=(--model gpt2 --layers 2 --hidden 64 --heads 4 --vocab 512 --seq 64 --batch 8)
"$tool" synth "${small[@]}" --out "$tmp/ck" >/dev/null 2>&1 || bad "synth of the test checkpoint"

# item1: an index with an empty weight_map beside a config.json segfaulted (exit 139).
mkdir -p "$tmp/empty" && cp "$tmp/ck/config.json" "$tmp/empty/"
echo '{"weight_map":{}}' >"$tmp/empty/model.safetensors.index.json"
expect item1 1 "io error: index '.*' has an empty weight_map" "$tool" shard "$tmp/empty" --policy gpt2 --tp 2 --out "$tmp/o1"
test ! -e "$tmp/o1" && ok || bad "item1: output written"

# item10: silent wrong results.
expect item10 1 "spec error: policy 'llama' does not fit this checkpoint: .* says model_type 'gpt2'" \
  "$tool" shard "$tmp/ck" --policy llama --tp 2 --out "$tmp/o10a"
mkdir -p "$tmp/noconf" && cp "$tmp/ck/model.safetensors" "$tmp/noconf/"
expect item10 1 "spec error: policy 'bert' matches none of the checkpoint's [0-9]+ tensors" \
  "$tool" shard "$tmp/noconf" --policy bert --tp 2 --out "$tmp/o10b"
test ! -e "$tmp/o10a" && test ! -e "$tmp/o10b" && ok || bad "item10: a refused shard wrote its output"
# a 1-layer plan on a 2-layer checkpoint
"$tool" plan --model gpt2 --layers 1 --hidden 64 --heads 4 --vocab 512 --seq 64 --batch 8 --mesh 2x2 \
  --algo megatron --out "$tmp/p1.json" --quiet >/dev/null 2>&1 || bad "item10: 1-layer plan"
expect item10 1 "io error: plan file '.*' has 1 layer of 'h.N.' but the checkpoint has 2" \
  "$tool" shard "$tmp/ck" --plan "$tmp/p1.json" --out "$tmp/o10c"
# a tensor in a shard file that the weight_map does not list; a checkpoint missing one tensor
python3 - "$tmp" <<'PY'
import json, os, sys
from safetensors.numpy import load_file, save_file
t = sys.argv[1]
d = load_file(f"{t}/ck/model.safetensors")
for name, sub, drop in (("unlisted", "ck.safetensors", None), ("missing", "model.safetensors", "h.0.attn.c_attn.bias")):
    os.makedirs(f"{t}/{name}", exist_ok=True)
    save_file({k: v for k, v in d.items() if k != drop}, f"{t}/{name}/{sub}", metadata={"format": "pt"})
    os.system(f"cp {t}/ck/config.json {t}/{name}/")
wm = {k: "ck.safetensors" for k in d if k != "h.1.mlp.c_fc.weight"}
json.dump({"weight_map": wm}, open(f"{t}/unlisted/model.safetensors.index.json", "w"))
PY
expect item10 1 "holds tensor 'h.1.mlp.c_fc.weight', which the weight_map does not list" \
  "$tool" shard "$tmp/unlisted" --policy gpt2 --tp 2 --out "$tmp/o10d"
expect item10 1 "has no tensor 'h.0.attn.c_attn.bias' but has 'h.1.attn.c_attn.bias'" \
  "$tool" shard "$tmp/missing" --policy gpt2 --tp 2 --out "$tmp/o10e"
# issue 18 item 5: --policy auto picks gpt2 from config.json
expect item18.5 0 "" "$tool" shard "$tmp/ck" --policy auto --tp 2 --out "$tmp/auto" --quiet
grep -q "by policy gpt2, tp 2" "$tmp/out" && ok || bad "item18.5: --policy auto: $(cat "$tmp/out")"
expect item18.5 1 "spec error: --policy auto reads model_type from config.json, but there is none" \
  "$tool" shard "$tmp/noconf" --policy auto --tp 2 --out "$tmp/o18"

# item11: sizes of 0 or below are usage errors, not the preset's value.
for f in "--layers 0" "--layers -1" "--hidden 0" "--heads 0" "--heads -8" "--vocab 0" "--seq 0" "--batch 0"; do
  # shellcheck disable=SC2086
  expect item11 2 "Value -?[0-9]+ not in range 1 to 2147483647" "$tool" synth --model gpt2 $f --out "$tmp/o11"
done
test ! -e "$tmp/o11" && ok || bad "item11: synth wrote a model"
expect item11 2 "not in range" "$tool" plan --model gpt2 --layers -1 --out "$tmp/o11.json"
expect item11 2 "not in range" "$tool" shard "$tmp/ck" --policy gpt2 --tp 0 --out "$tmp/o11b"

# item9: integer overflow is an error naming the quantity, never a negative number.
one_error item9 "$tool" explain --mesh 2x2 --shape 1000000000000,1000000000000 --from S0S1 --to RR --dtype f64
grep -q "exceeds 2^63-1" "$tmp/err" && ok || bad "item9: explain overflow message: $(cat "$tmp/err")"
one_error item9 "$tool" show --mesh 65536x65536 --shape 8,8 --spec S0S1
grep -q "has more than 1048576 ranks" "$tmp/err" && ok || bad "item9: show 65536x65536: $(cat "$tmp/err")"
one_error item9 "$tool" explain --mesh 46341x46341 --shape 8,8 --from S0S1 --to RR
grep -q "has more than 1048576 ranks" "$tmp/err" && ok || bad "item9: 46341x46341: $(cat "$tmp/err")"
one_error item9 "$tool" plan --model gpt2 --layers 1 --batch 2147483647 --seq 2147483647 --mesh 2x2 --out "$tmp/o9.json" --quiet
grep -q "negative" "$tmp/err" && bad "item9: plan says negative: $(cat "$tmp/err")" || ok
"$tool" plan --model gpt2 --layers 1 --hidden 32 --heads 4 --vocab 128 --seq 16 --batch 8 --mesh 2x2 --algo megatron \
  --out "$tmp/v.json" --quiet >/dev/null 2>&1
expect item9 2 "--timeout: inf is not a finite number" "$tool" verify --plan "$tmp/v.json" --timeout inf

# item2: a plan file's mesh is bounded before anything is sized by it ([99999999,99999999] grew
# memory until bad_alloc in shard --plan and spun forever in verify).
python3 -c "
import json; d = json.load(open('$tmp/v.json'))
for a in d['mesh']['axes']: a['size'] = 99999999
json.dump(d, open('$tmp/huge.json', 'w'))"
one_error item2 "$tool" verify --plan "$tmp/huge.json"
grep -Eq "99999999(, not an integer in| is not in)" "$tmp/err" && ok || bad "item2: verify message: $(cat "$tmp/err")"
one_error item2 "$tool" shard "$tmp/ck" --plan "$tmp/huge.json" --out "$tmp/o2"
one_error item2 "$tool" show --plan "$tmp/huge.json"

# item12: messages with their kind; NaN and out-of-range numbers refused.
expect item12 2 "--memory-budget: '1e400' is not a size from 1 byte to 9e18" "$tool" plan --model gpt2 --layers 1 --memory-budget 1e400 --out "$tmp/o12.json"
one_error item12 "$tool" solve "$tmp"
grep -q "is a directory, not a regular file" "$tmp/err" && ok || bad "item12: solve DIR: $(cat "$tmp/err")"
# Once a std::filesystem error (kind io, "Not a directory: '/dev/null/x'"); now refused before
# anything is made, naming the flag and what is in the way (round seven's out-not-dir).
one_error item12 "$tool" synth "${small[@]}" --out /dev/null/x
grep -q "^autoshard: io error: --out checkpoint '/dev/null/x/model.safetensors': '/dev/null' is a character device, not a directory" "$tmp/err" &&
  ok || bad "item12: an output under a device: $(cat "$tmp/err")"
for bad_flag in "--inter-bw nan" "--intra-bw inf" "--intra-lat nan" "--inter-lat -1" "--intra-bw 0"; do
  # shellcheck disable=SC2086
  expect item12 2 "is not a finite number in" "$tool" explain --mesh 2x2 --shape 8,4 --from S0R --to RR $bad_flag
done
expect item12 2 "--rtol: -1 is not a finite number in \[0, 1\]" "$tool" verify --plan "$tmp/v.json" --rtol -1
expect item12 2 "--rtol: nan is not a finite number" "$tool" verify --plan "$tmp/v.json" --rtol nan
expect item12 2 "--seed: -1 is not a seed" "$tool" verify --plan "$tmp/v.json" --seed -1
expect item12 2 "--seed: -1 is not a seed" "$tool" synth "${small[@]}" --seed -1 --out "$tmp/o12s"
expect item12 2 "--mip-rel-gap: inf is not a finite number in \[0, 1\]" "$tool" plan --model gpt2 --mip-rel-gap inf
expect item12 2 "--mip-rel-gap: 1.5 is not a finite number in \[0, 1\]" "$tool" plan --model gpt2 --mip-rel-gap 1.5
expect item12 2 "--mip-rel-gap: nan is not" "$tool" solve "$tmp/v.json" --mip-rel-gap nan

# item8: an output that is an input, or two outputs that are one file: refused, inputs intact.
cp "$tmp/v.json" "$tmp/keep.json"
expect item8 1 "io error: --svg '.*' is the --plan '.*': refusing to overwrite its input" \
  "$tool" show --plan "$tmp/v.json" --tensor lm_head --svg "$tmp/v.json"
cmp -s "$tmp/v.json" "$tmp/keep.json" && ok || bad "item8: show --svg replaced the plan"
expect item8 1 "io error: --dot '.*' and --out '.*' are the same file" \
  "$tool" plan --model gpt2 --layers 1 --out "$tmp/x8.json" --dot "$tmp/x8.json"
test ! -e "$tmp/x8.json" && ok || bad "item8: plan --out X --dot X wrote X"
python3 -c "
import json; d = json.load(open('$tmp/v.json')); json.dump(d['graph'], open('$tmp/model8.json', 'w'))"
cp "$tmp/model8.json" "$tmp/model8.keep"
expect item8 1 "io error: --out '.*' is the --model '.*': refusing to overwrite its input" \
  "$tool" plan --model "$tmp/model8.json" --mesh 2x2 --out "$tmp/model8.json" --quiet
cmp -s "$tmp/model8.json" "$tmp/model8.keep" && ok || bad "item8: plan --out replaced the model"
ln -s "$tmp/v.json" "$tmp/link8.svg"
expect item8 1 "refusing to overwrite its input" "$tool" show --plan "$tmp/v.json" --tensor lm_head --svg "$tmp/link8.svg"
cmp -s "$tmp/v.json" "$tmp/keep.json" && ok || bad "item8: show --svg through a symlink replaced the plan"
cp "$tmp/ck/model.safetensors" "$tmp/rank-0.safetensors"
expect item8 1 "refusing to overwrite its input" "$tool" shard "$tmp/rank-0.safetensors" --policy gpt2 --tp 2 \
  --config "$tmp/ck/config.json" --out "$tmp"

# item13: a FIFO is refused at once, never read (that would block); show --svg DIR leaves no DIR.tmp.
mkfifo "$tmp/fifo.json" "$tmp/fifo.safetensors"
expect item13 1 "is a FIFO" "$tool" solve "$tmp/fifo.json"
expect item13 1 "is a FIFO" "$tool" verify --plan "$tmp/fifo.json"
expect item13 1 "is a FIFO" "$tool" shard "$tmp/fifo.safetensors" --policy gpt2 --tp 2 --config "$tmp/ck/config.json" --out "$tmp/o13"
mkdir -p "$tmp/svgdir"
one_error item13 "$tool" show --mesh 2x2 --shape 8,8 --spec S0S1 --svg "$tmp/svgdir"
test ! -e "$tmp/svgdir.tmp" && ok || bad "item13: show --svg DIR left DIR.tmp"

# item13: SIGINT or SIGTERM while shard writes removes its live temporaries (it left ~50 MB).
"$tool" synth --model gpt2 --layers 4 --hidden 512 --heads 8 --vocab 4096 --seq 64 --batch 8 \
  --out "$tmp/big" >/dev/null 2>&1 || bad "item13: synth of the big checkpoint"
set -m  # background jobs get SIGINT (a non-interactive shell's jobs ignore it otherwise)
for sig in TERM INT; do
  rm -rf "$tmp/sig"
  "$tool" shard "$tmp/big" --policy gpt2 --tp 4 --dtype bf16 --out "$tmp/sig" --quiet >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 2000); do  # until a temporary exists (or the run is over)
    compgen -G "$tmp/sig/*.tmp.*" >/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.005
  done
  kill -s "$sig" "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null; rc=$?
  left=$(find "$tmp/sig" -name '*.tmp.*' 2>/dev/null | wc -l)
  if [ "$rc" -eq 0 ]; then echo "note: item13 SIG$sig came after the run ended; nothing to check"
  elif [ "$rc" -gt 128 ] && [ "$left" -eq 0 ]; then ok
  else bad "item13: SIG$sig: exit $rc, $left temporaries left"; fi
done
set +m

# item4: a symbolic link planted at a temporary's name is never followed (plan used the fixed
# name X.tmp, O_CREAT|O_TRUNC without O_EXCL|O_NOFOLLOW: the link's target was overwritten).
echo "precious" >"$tmp/victim"
ln -s "$tmp/victim" "$tmp/p4.json.tmp"
expect item4 0 "" "$tool" plan --model gpt2 --layers 1 --hidden 32 --heads 4 --vocab 128 --seq 16 --batch 8 \
  --mesh 2x2 --out "$tmp/p4.json" --quiet
[ "$(cat "$tmp/victim")" = precious ] && ok || bad "item4: the link's target was overwritten"
python3 -c "import json; assert json.load(open('$tmp/p4.json'))['format'] == 'autoshard.plan'" && ok \
  || bad "item4: the plan file does not hold the plan"

finish reliability

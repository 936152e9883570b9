#!/usr/bin/env bash
# End-to-end checks of the autoshard tool: outputs, JSON documents and exit codes
# (0 success, 1 user error with one message on stderr, 2 usage error, 3 a plan that does not
# fit the device's memory).
source "$(dirname "$0")/common.sh" "$1"
expect_rc() {  # expect_rc CODE cmd...
  local want=$1; shift
  "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  if [ "$rc" -eq "$want" ]; then ok; else bad "$* -> exit $rc, wanted $want"; cat "$tmp/err"; fi
}
json_check() {  # json_check 'python expression over d' cmd...
  local expr=$1; shift
  if "$@" >"$tmp/j" 2>"$tmp/err" && python3 -c "import json,sys; d=json.load(open('$tmp/j')); sys.exit(0 if ($expr) else 1)"; then ok
  else bad "json check '$expr' on: $*"; head -c 2000 "$tmp/j"; cat "$tmp/err"; fi
}

expect_rc 0 "$tool" --version
expect_rc 0 "$tool" --help
expect_rc 0 "$tool" explain --help
expect_rc 0 "$tool" show --help
expect_rc 2 "$tool"
expect_rc 2 "$tool" explain --mesh 2x2
expect_rc 2 "$tool" no-such-command
# Every subcommand's --help ends with examples.
for sub in $("$tool" --help | awk '/^Subcommands:/{f=1; next} f && NF {print $1}'); do
  "$tool" "$sub" --help 2>&1 | tail -4 | grep -q "  autoshard " && ok || bad "$sub --help ends without an example"
done
# The bash completion is generated from the options: subcommands, options, fixed choices.
"$tool" completion > "$tmp/completion.bash" && ok || bad "completion"
comp() { bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _autoshard; echo "${COMPREPLY[*]}"' _ "$tmp/completion.bash" "$@"; }
[ "$(comp autoshard expl)" = "explain" ] && ok || bad "completion of a subcommand: $(comp autoshard expl)"
[ "$(comp autoshard export --tr)" = "--transformers" ] && ok || bad "completion of an option: $(comp autoshard export --tr)"
[ "$(comp autoshard export --to hf)" = "hf-tp-plan" ] && ok || bad "completion of a choice: $(comp autoshard export --to hf)"
[ "$(comp autoshard plan --mode i)" = "infer" ] && ok || bad "completion of --mode: $(comp autoshard plan --mode i)"
# The tool's defaults are the library's (issue 18): --mode and --time-limit start from
# default_run_mode and default_time_limit_s, read here from their one home, the headers.
inc="$here/../../include/autoshard"
lib_mode=$(sed -n 's/^inline constexpr run_mode default_run_mode = run_mode::\([a-z]*\);.*/\1/p' "$inc/graph/pricing.hpp")
lib_limit=$(sed -n 's/^inline constexpr double default_time_limit_s = \([0-9.]*\);.*/\1/p' "$inc/solve/ilp.hpp")
[ -n "$lib_mode" ] && [ -n "$lib_limit" ] && ok || bad "default_run_mode / default_time_limit_s not found in the headers"
"$tool" plan --model gpt2 --layers 1 --hidden 16 --heads 2 --vocab 32 --seq 8 --batch 4 --mesh 2 \
  --out "$tmp/default-mode.json" --json --quiet > "$tmp/default-mode.out" 2>"$tmp/err" || bad "plan with the defaults: $(cat "$tmp/err")"
python3 - "$tmp/default-mode.json" "$tmp/default-mode.out" "$lib_mode" "$lib_limit" <<'PY' && ok || bad "plan's default mode and time limit are not the library's ($lib_mode, $lib_limit s)"
import json, sys
plan, out, mode, limit = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3], float(sys.argv[4])
flag = {"training": "train", "inference": "infer"}[mode]
sys.exit(0 if plan["pricing"]["mode"] == mode and out["mode"] == flag and plan["options"]["time_limit"] == limit
         and any(v["name"] == "loss" for v in plan["graph"]["nodes"]) == (mode == "training") else 1)
PY
for sub in plan solve; do  # --help shows the defaults it uses: the same ones
  "$tool" $sub --help | grep -- "--time-limit" | grep -qE "=${lib_limit%.0}( |\$)" && ok || bad "$sub --help: --time-limit's default is not ${lib_limit%.0}"
done
"$tool" plan --help | grep -- "--mode" | grep -qE "=$([ "$lib_mode" = training ] && echo train || echo infer)( |\$)" && ok || bad "plan --help: --mode's default"
# --gradient-overlap's default is default_gradient_overlap's, and the plan file records it.
lib_overlap=$(sed -n 's/^inline constexpr gradient_overlap_model default_gradient_overlap = gradient_overlap_model::\([a-z_]*\)();.*/\1/p' "$inc/graph/pricing.hpp")
[ "$lib_overlap" = behind_backward ] && ok || bad "default_gradient_overlap is not behind_backward() in graph/pricing.hpp ('$lib_overlap')"
"$tool" plan --help | grep -- "--gradient-overlap" | grep -qE "=backward( |\$)" && ok || bad "plan --help: --gradient-overlap's default"
python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["pricing"]["gradient_overlap"] != "backward")' \
  "$tmp/default-mode.json" && ok || bad "a plan with the defaults does not record gradient_overlap \"backward\""
# plan says whether each export writes the plan it wrote: exactly what `export` then does (exit
# 0, or 1 naming the first problem), for a plan each target refuses and one they all write.
"$tool" plan --model llama-7b --layers 2 --hidden 64 --heads 4 --ffn 128 --vocab 64 --seq 8 --batch 4 --mesh tp=2 --algo megatron \
  --out "$tmp/exports-megatron.json" --json --quiet > "$tmp/exports-megatron.out" 2>"$tmp/err" || bad "plan --algo megatron: $(cat "$tmp/err")"
"$tool" plan --model gpt2 --layers 1 --hidden 16 --heads 2 --vocab 32 --seq 8 --batch 4 --mesh tp=2 --algo megatron --mode infer \
  --out "$tmp/exports-gpt2.json" --json --quiet > "$tmp/exports-gpt2.out" 2>"$tmp/err" || bad "plan gpt2 --algo megatron: $(cat "$tmp/err")"
python3 - "$tool" "$tmp" <<'PY' && ok || bad "plan's exports verdicts are not what export does"
import json, subprocess, sys
tool, tmp = sys.argv[1], sys.argv[2]
verdicts = {}
for name in ("exports-megatron", "default-mode", "exports-gpt2"):
    verdicts[name] = json.load(open(f"{tmp}/{name}.out"))["exports"]
    for target, v in verdicts[name].items():
        r = subprocess.run([tool, "export", "--plan", f"{tmp}/{name}.json", "--to", target], capture_output=True, text=True)
        if v["exports"] != (r.returncode == 0) or (not v["exports"] and (r.returncode != 1 or not v["problems"] or
                                                                         v["problems"][0].split("\n")[0] not in r.stderr)):
            sys.exit(f"{name} --to {target}: plan says {v}, export exited {r.returncode}: {r.stderr[:500]}")
# Both kinds of verdict met: the Megatron LLaMA plan exports to all three, GPT-2's Conv1D split is refused.
sys.exit(0 if all(v["exports"] for v in verdicts["exports-megatron"].values()) and sorted(verdicts["exports-megatron"]) ==
         ["dtensor", "hf-tp-plan", "megatron"] and not verdicts["exports-gpt2"]["dtensor"]["exports"] else f"verdicts: {verdicts}")
PY
"$tool" plan --model gpt2 --layers 1 --hidden 16 --heads 2 --vocab 32 --seq 8 --batch 4 --mesh tp=2 --algo megatron --mode infer \
  --out "$tmp/exports-gpt2.json" --quiet > "$tmp/exports-gpt2.txt" 2>&1
grep -q "^  dtensor     no: 'transformer.h.0.attn.c_attn' (linear): its weight is stored \[in,out\]" "$tmp/exports-gpt2.txt" &&
  grep -q "^exports (autoshard export --plan .*exports-gpt2.json --to FORMAT)" "$tmp/exports-gpt2.txt" && ok ||
  bad "plan's exports lines: $(grep -A3 '^exports' "$tmp/exports-gpt2.txt")"
# export --to megatron describes the layout the plan priced or refuses it: alpa's GPT-2 on four
# ranks splits its MLP over columns (tensor parallel for Megatron-LM) but its attention core,
# head and loss on the batch, which Megatron-LM never does; each is named with the plan's
# strategy and what Megatron-LM does. (Before, only the block linears were checked.)
"$tool" plan --model gpt2 --layers 2 --hidden 1024 --heads 16 --vocab 4096 --seq 256 --batch 4 --mesh 1x4 --mode train \
  --out "$tmp/alpa-tp.json" --quiet --no-svg > /dev/null 2>&1 || bad "plan gpt2 alpa on 1x4"
expect_rc 1 "$tool" export --plan "$tmp/alpa-tp.json" --to megatron
grep -q "^  'transformer.h.0.attn.attention': the plan does not split it as Megatron-LM does on the tensor-parallel mesh axis 1 ([^)]*): Megatron-LM splits the attention core over its heads$" "$tmp/err" &&
  grep -q "^  'lm_head': .*: Megatron-LM's output layer is column-parallel over the vocabulary" "$tmp/err" &&
  grep -q "^  'loss': .*: Megatron-LM's vocab_parallel_cross_entropy takes the logits split on the vocabulary" "$tmp/err" && ok ||
  bad "export --to megatron of alpa's plan: $(head -c 1500 "$tmp/err")"
# synth says the dtype it writes; options that change nothing it writes are not offered.
"$tool" synth --help | grep -q "f32 (the default)" && ok || bad "synth --help names its dtype"
"$tool" synth --help | grep -q -- "--batch" && bad "synth shows --batch" || ok

# S(0),S(1) -> S(1),S(0) on 2x2: all-gather inner, all-to-all outer, slice inner (DTensor's order).
json_check "[s['collective'] for s in d['steps']] == ['all-gather','all-to-all','local-slice'] and [s['mesh_axis'] for s in d['steps']] == [1,0,1]" \
  "$tool" explain --mesh 2x2 --shape 8,4 --from "[S(0),S(1)]" --to "[S(1),S(0)]" --json
# all-gather of a [768,2304] f32 over 4 ranks on the intra-node axis: B = 768*2304*4 bytes,
# time = alpha + 3 hops + 3/4 * B / beta with the given link (hop: NCCL's 0.6 us by default).
json_check "d['steps'][0]['bytes'] == 768*2304*4 and abs(d['steps'][0]['seconds'] - (5e-6 + 3*0.6e-6 + 0.75*768*2304*4/300e9)) < 1e-12" \
  "$tool" explain --mesh 2x4 --intra-bw 300e9 --intra-lat 5e-6 --shape 768,2304 --from "RS1" --to "S0R" --json
# [P,P] -> [R,R] on 2 nodes x 4: hierarchical (docs/specs.md's worked example): reduce-scatter
# inside the node, all-reduce of a quarter across nodes, all-gather; within 10% of the hand
# formula without hops, and exact with them.
json_check "[(s['mesh_axis'], s['collective']) for s in d['steps']] == [(1,'reduce-scatter'),(0,'all-reduce'),(1,'all-gather')] and abs(d['total_seconds'] - (2*(5e-6+0.75*2**27/300e9) + 2e-5 + 2*0.5*2**25/25e9)) < 0.1*d['total_seconds'] and abs(d['total_seconds'] - (2*(5e-6+3*0.6e-6+0.75*2**27/300e9) + 2e-5+2*2.7e-6 + 2*0.5*2**25/25e9)) < 1e-9" \
  "$tool" explain --mesh 2x4 --inter-bw 25e9 --intra-bw 300e9 --shape 1024,1024,64 --dtype bf16 --from "[P,P]" --to "[R,R]" --json
json_check "abs(d['steps'][0]['seconds'] - (5e-6 + 0.75*768*2304*4/300e9)) < 1e-12" \
  "$tool" explain --mesh 2x4 --intra-hop 0 --shape 768,2304 --from "RS1" --to "S0R" --json
expect_rc 2 "$tool" explain --mesh 2x4 --intra-hop -1 --shape 8,4 --from "RR" --to "RR"  # a usage error, as every number out of range
# Uneven: 5 rows over 4 ranks -> 2,2,1,0; the empty shard sits at offset 5.
json_check "[r['after']['shape'][0] for r in d['ranks']] == [2,2,1,0] and d['ranks'][3]['after']['offset'][0] == 5" \
  "$tool" explain --mesh 4 --shape 5,3 --from "[R]" --to "[S(0)]" --json
# Alpa and DTensor notations agree.
json_check "d['from']['dtensor'] == '[S(0),R]' and d['to']['alpa'] == 'RS01'" \
  "$tool" explain --mesh 2x2 --shape 8,8 --from "S0R" --to "[S(1),S(1)]" --json
# User errors: exit 1, one message naming the problem.
expect_rc 1 "$tool" explain --mesh 2x2 --shape 8,4 --from "S00R" --to "RR"
grep -q "mesh axis 0 used twice" "$tmp/err" && ok || bad "message for S00R: $(cat "$tmp/err")"
expect_rc 1 "$tool" explain --mesh 2x2 --shape 8,4 --from "[S(0),R]" --to "[P(max),P]"
expect_rc 1 "$tool" explain --mesh 2x2 --shape 8,4 --from "[S(0),R]" --to "[P,R]"
grep -q "Shard to Partial" "$tmp/err" && ok || bad "message for S->P: $(cat "$tmp/err")"
expect_rc 1 "$tool" explain --mesh 2x0 --shape 8,4 --from "RR" --to "RR"
expect_rc 1 "$tool" explain --mesh 2x2 --shape 8,x --from "RR" --to "RR"
expect_rc 1 "$tool" show --mesh 2x2 --shape 8,4 --spec "S5R"
# A 3-D tensor split on its leading dim: one map per block of the leading dims, every rank in one.
json_check "len(d['maps']) == 2 and [m['leading'] for m in d['maps']] == [[[0,2]],[[2,4]]] and sorted(r for m in d['maps'] for row in m['owners'] for c in row for r in c) == [0,1,2,3]" \
  "$tool" show --mesh 2x2 --shape 4,6,8 --spec "[S(0),S(2)]" --json
json_check "len(d['maps']) == 1 and d['maps'][0]['leading'] == [[2,4]] and d['owners'] == [[[2],[3]]]" \
  "$tool" show --mesh 2x2 --shape 4,6,8 --spec "[S(0),S(2)]" --slice 3 --json
expect_rc 0 "$tool" show --mesh 2x2 --shape 4,6,8 --spec "[S(0),S(2)]"
grep -q "^dim 0 \[2,4):" "$tmp/out" && ok || bad "show prints a map per leading block: $(cat "$tmp/out")"
expect_rc 1 "$tool" show --mesh 2x2 --shape 4,6,8 --spec "[S(0),S(2)]" --slice 4
expect_rc 1 "$tool" show --mesh 2x2 --shape 6,8 --spec "[S(0),S(1)]" --slice 0
# PyTorch's printed placements and named mesh axes (names appear in reports and JSON).
json_check "d['from']['dtensor'] == '[R,S(1)]' and d['to']['alpa'] == 'S0R' and d['mesh']['axis_names'] == ['dp','tp']" \
  "$tool" explain --mesh dp=2,tp=4 --shape 768,2304 --from "(Replicate(), Shard(dim=-1))" --to "[Shard(0), Replicate()]" --json
expect_rc 0 "$tool" show --mesh dp=2,tp=2 --shape 8,4 --spec "(Partial(sum), Shard(dim=1))"
grep -q "mesh axis 0 (dp) is Partial(sum)" "$tmp/out" && ok || bad "show names the Partial axis by its name: $(cat "$tmp/out")"
expect_rc 1 "$tool" explain --mesh 2x2 --shape 8,4 --from "[P(avg),R]" --to "RR"
grep -q "supported reduce ops are sum, max and min" "$tmp/err" && ok || bad "message for P(avg): $(cat "$tmp/err")"
# --mip-rel-gap is a fraction: above 1 is a usage error.
expect_rc 2 "$tool" plan --model gpt2 --mip-rel-gap 5
grep -q "5 is not a finite number in \[0, 1\]" "$tmp/err" && ok || bad "--mip-rel-gap 5 says its range: $(cat "$tmp/err")"
expect_rc 1 "$tool" explain --mesh dp=2,4 --shape 8,4 --from "RR" --to "RR"
grep -q "name every axis or none" "$tmp/err" && ok || bad "message for a half-named mesh: $(cat "$tmp/err")"
# show: block map owners and the SVG file.
json_check "d['owners'][0][0] == [0] and d['owners'][1][1] == [3] and d['row_cuts'] == [0,4,8]" \
  "$tool" show --mesh 2x2 --shape 8,8 --spec "S0S1" --json
expect_rc 0 "$tool" show --mesh 2x4 --shape 768,2304 --spec "[R,S(1)]" --svg "$tmp/m.svg"
grep -q "<svg" "$tmp/m.svg" && grep -q "ranks 0,4" "$tmp/m.svg" && ok || bad "svg content"

# solve: the IOPDDL example, checked against exhaustive enumeration done here in Python.
if "$tool" --help | grep -q ' solve'; then
  src=$(dirname "$0")/../data/solve/example.json
  brute=$(python3 - "$src" <<'PY'
import itertools, json, sys
p = json.load(open(sys.argv[1]))["problem"]
n, e = p["nodes"], p["edges"]
best = None
for ch in itertools.product(*[range(len(c)) for c in n["costs"]]):
    peak = 0
    for t in sorted({a for a, b in n["intervals"]}):
        peak = max(peak, sum(n["usages"][v][ch[v]] for v, (a, b) in enumerate(n["intervals"]) if a <= t < b))
    if p.get("usage_limit") is not None and peak > p["usage_limit"]:
        continue
    c = sum(n["costs"][v][ch[v]] for v in range(len(ch)))
    for (u, v), m in zip(e["nodes"], e["costs"]):
        c += m[ch[u] * len(n["costs"][v]) + ch[v]]
    best = c if best is None else min(best, c)
print(best)
PY
)
  json_check "d['status'] == 'optimal' and abs(d['objective'] - $brute) < 1e-9 and d['peak_usage'] <= 50" \
    "$tool" solve "$src" --json --quiet
  # --cutoff: above the optimum it changes nothing; far below it the solve stops at once with a
  # true bound at or above the cutoff; a cutoff that is not a whole number in int64 is a usage error.
  json_check "d['status'] == 'optimal' and d['objective'] == $brute" "$tool" solve "$src" --json --quiet --cutoff $((brute + 1))
  json_check "d['stop'] == 'cutoff' and 1 <= d['bound'] <= $brute <= d['objective']" "$tool" solve "$src" --json --quiet --cutoff 1
  for cut in -1 9223372036854775808; do
    expect_rc 2 "$tool" solve "$src" --cutoff "$cut"
    grep -q "is not a cutoff (an integer in \\[0, 9223372036854775807\\])" "$tmp/err" && ok || bad "--cutoff $cut: $(cat "$tmp/err")"
  done
  # --time-limit is the whole command's: the solve gets what reading the problem left, and a
  # limit that passes while reading (a 3 MB problem in a millisecond) ends there, exit 1.
  json_check "0 <= d['read_seconds'] and d['seconds'] + d['read_seconds'] <= 2.5" "$tool" solve "$src" --json --quiet --time-limit 2
  python3 -c "
import json, sys
n = 40000
json.dump({'problem': {'nodes': {'intervals': [[i, i + 2] for i in range(n)], 'costs': [[3, 1, 2]] * n, 'usages': [[1, 1, 1]] * n},
                       'edges': {'nodes': [[i, i + 1] for i in range(n - 1)], 'costs': [[0, 1, 1, 1, 0, 1, 1, 1, 0]] * (n - 1)}}}, open(sys.argv[1], 'w'))
" "$tmp/chain.json"
  expect_rc 1 "$tool" solve "$tmp/chain.json" --time-limit 0.001 --solution-out "$tmp/never.json"
  grep -q "^autoshard: solver error: --time-limit of 1.0* ms passed while the problem was read (.*): no time was left to solve it" "$tmp/err" &&
    test ! -e "$tmp/never.json" && ok || bad "--time-limit 0.001 on a 3 MB problem: $(cat "$tmp/err")"
  echo '{"problem": {"nodes": {"intervals": [[0,1]], "costs": [[1, 2, 3]], "usages": [[1]]}, "edges": {"nodes": [], "costs": []}}}' > "$tmp/bad.json"
  expect_rc 1 "$tool" solve "$tmp/bad.json"
  grep -q "usages" "$tmp/err" && ok || bad "message for a bad problem: $(cat "$tmp/err")"
  expect_rc 1 "$tool" solve "$tmp/missing.json"
  # --solution-out writes the contest's list of indices; --evaluate scores it exactly.
  expect_rc 0 "$tool" solve "$src" --quiet --solution-out "$tmp/answer.json"
  python3 -c "import json,sys; sys.exit(0 if json.load(open('$tmp/answer.json')) == [0, 0, 2, 1, 0] else 1)" && ok || bad "solution file: $(cat "$tmp/answer.json")"
  json_check "d['feasible'] and d['objective'] == $brute" "$tool" solve "$src" --evaluate "$tmp/answer.json" --json
  echo '[0, 0, 1, 0, 0]' > "$tmp/over.json"
  expect_rc 1 "$tool" solve "$src" --evaluate "$tmp/over.json"
  grep -q "exceeds usage_limit 50" "$tmp/out" && ok || bad "message for an over-limit solution: $(cat "$tmp/out")"
fi

# plan + synth + shard: a small GPT-2 planned on 2x4, a checkpoint of its layout, sharded by
# policy and by plan, every rank file checked against the original with numpy.
if "$tool" --help | grep -q ' plan' && "$tool" --help | grep -q ' synth'; then
  :
  small=(--model gpt2 --layers 2 --hidden 64 --heads 4 --vocab 512 --seq 64 --batch 8)
  expect_rc 0 "$tool" synth "${small[@]}" --out "$tmp/ck"
  # synth's values, computed here on their own (docs/cli.md): value k of a tensor is
  # SplitMix64 over the FNV-1a hash of its name keyed by the seed and k, on a grid of 2^-26 in
  # [-0.125, 0.125),
  # norm weights around 1; the same seed writes the same bytes, another seed other values.
  expect_rc 0 "$tool" synth "${small[@]}" --out "$tmp/ck-again"
  cmp -s "$tmp/ck/model.safetensors" "$tmp/ck-again/model.safetensors" && ok || bad "synth twice at seed 1 wrote different bytes"
  expect_rc 0 "$tool" synth "${small[@]}" --seed 7 --out "$tmp/ck-seed7"
  python3 - "$tmp/ck/model.safetensors" 1 "$tmp/ck-seed7/model.safetensors" 7 <<'PY' && ok || bad "synth's values are not SplitMix64 of the seed, the name and the index"
import json, struct, sys
M = 2**64 - 1
def mix(x):
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & M
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & M
    return x ^ (x >> 31)
def expected(seed, name, k, centre):
    h = 1469598103934665603 ^ seed
    for ch in name.encode():
        h = ((h ^ ch) * 1099511628211) & M
    step = (mix((mix(h) + (k + 1) * 0x9e3779b97f4a7c15) & M) >> 40) - 2**23
    return struct.unpack("<f", struct.pack("<f", centre + step * 2.0**-26))[0]  # exact in a double, rounded once
for path, seed in zip(sys.argv[1::2], map(int, sys.argv[2::2])):
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
        base = 8 + n
        for name in ("wte.weight", "h.1.ln_2.weight", "h.0.mlp.c_fc.weight"):
            begin, end = header[name]["data_offsets"]
            count = (end - begin) // 4
            for k in (0, 1, count - 1):
                fh.seek(base + begin + 4 * k)
                got = struct.unpack("<f", fh.read(4))[0]
                want = expected(seed, name, k, 1.0 if "ln" in name else 0.0)
                assert got == want, (path, name, k, got, want)
PY
  json_check "d['plan']['feasible'] and all(d['plan']['step_seconds'] <= b['step_seconds'] * (1 + 1e-9) for b in d['baselines'] if b['feasible']) and d['solver']['status'] == 'optimal'" \
    "$tool" plan "${small[@]}" --mesh 2x4 --mode train --out "$tmp/plan.json" --json --quiet
  test -s "$tmp/plan.json" && test -s "$tmp/plan.dot" && ok || bad "plan files missing"
  obj=$(python3 -c "import json; print(json.load(open('$tmp/plan.json'))['cost']['objective'])")
  json_check "abs(d['plan']['step_seconds'] - $obj) <= 1e-12 * max(1.0, abs($obj))" \
    "$tool" plan "${small[@]}" --mesh 2x4 --mode train --out "$tmp/plan.json" --preload --json
  expect_rc 1 "$tool" plan --model gpt2 --layers 2 --hidden 128 --heads 4 --vocab 512 --seq 64 --batch 8 \
    --mesh 2x4 --mode train --out "$tmp/plan.json" --preload
  grep -qi "plan file" "$tmp/err" && ok || bad "preload mismatch message: $(cat "$tmp/err")"
  expect_rc 1 "$tool" plan --model no-such-model
  # --device: the preset's numbers and links, its memory less the runtime reserve the default
  # budget (a CUDA context of 400 MiB and, on 2x4, communicators of 2 and 4 ranks: 544 + 688
  # MiB, nccl issue 964). A model of about
  # 100 GiB of activations on one device: under the default budget an error naming the
  # smallest budget; with none, the plan is written and exit 3 says it does not fit.
  json_check "d['device']['name'] == 'h100-80g' and d['device']['peak_flops'] == 989.4e12 and d['memory_budget'] == (81559 - 400 - 544 - 688) * 2**20 and d['plan']['runtime_reserve']['communicators'] == 2 and d['plan']['runtime_reserve']['bytes'] == (400 + 544 + 688) * 2**20 and d['mesh']['axes'][0]['bandwidth_Bps'] == 50e9 and d['mesh']['axes'][1]['bandwidth_Bps'] == 450e9 and d['plan']['fits']" \
    "$tool" plan "${small[@]}" --mesh 2x4 --device h100-80g --out "$tmp/h100.json" --json --quiet
  json_check "d['mesh']['axes'][1]['bandwidth_Bps'] == 100e9 and d['memory_budget'] == 2**30" \
    "$tool" plan "${small[@]}" --mesh 2x4 --device h100-80g --intra-bw 100e9 --memory-budget 1GiB --out "$tmp/h100.json" --json --quiet
  expect_rc 2 "$tool" plan "${small[@]}" --device h100 --out "$tmp/never.json"
  grep -q "unknown device 'h100'; presets: a100-80g, h100-80g, h200-141g" "$tmp/err" && ok || bad "--device h100: $(cat "$tmp/err")"
  big=(--model gpt2 --layers 1 --batch 1024 --mesh 1 --mode infer)
  expect_rc 1 "$tool" plan "${big[@]}" --out "$tmp/big.json" --quiet
  grep -q "memory budget of 80.00 GiB .* per device: with every operator at the most memory-frugal strategy.* is at least 99.74 GiB" "$tmp/err" && ok || bad "default budget: $(cat "$tmp/err")"
  test ! -e "$tmp/big.json" && ok || bad "an infeasible plan wrote its file"
  expect_rc 3 "$tool" plan "${big[@]}" --memory-budget none --out "$tmp/big.json"
  grep -q "the plan does not fit: its peak memory is 99.74 GiB" "$tmp/err" && grep -q "DOES NOT FIT" "$tmp/out" && test -s "$tmp/big.json" \
    && ok || bad "a plan above the device's memory: $(cat "$tmp/err")"
  expect_rc 0 "$tool" shard "$tmp/ck/model.safetensors" --plan "$tmp/plan.json" --out "$tmp/by-plan" --quiet
  test -f "$tmp/by-plan/rank-7.safetensors" && ok || bad "plan shards: no rank-7 file"
  python3 "$here/check_shards.py" "$tmp/ck/model.safetensors" "$tmp/by-plan" >/dev/null && ok || bad "plan shards differ"
  # A pipelined plan (docs/pipelines.md): its file records the stages and the schedule, show
  # prints them, shard writes each stage's tensors alone (one rank file per (stage, tensor-
  # parallel) coordinate), export --to megatron gives the stages; the rest refuse it by name.
  pipe=(--model gpt2 --layers 4 --hidden 64 --heads 4 --vocab 512 --seq 64 --batch 16)
  expect_rc 0 "$tool" synth "${pipe[@]}" --out "$tmp/ck4"
  expect_rc 0 "$tool" plan "${pipe[@]}" --mesh 2x4 --mode train --device a100-80g --algo megatron --tp 2 --pp 2 --micro-batch 2 \
    --quiet --no-svg --out "$tmp/pp.json"
  python3 - "$tmp/pp.json" <<'PY' && ok || bad "pipelined plan file: $(head -c 600 "$tmp/pp.json")"
import json, sys
d = json.load(open(sys.argv[1]))
p = d["pipeline"]
assert d["version"] == 5 and p["schedule"] == "1f1b", p
assert [(s["first_layer"], s["layers"]) for s in p["stages"]] == [(0, 2), (2, 2)], p["stages"]
assert [a["size"] for a in d["mesh"]["axes"]] == [2, 2]  # one stage: dp 2 x tp 2
assert d["pricing"]["micro_batches"] == 4 and d["pricing"]["micro_batch"] == 2
PY
  # One byte below that plan's largest stage: the stages' fastest plan does not fit its even
  # split, and a stage plan solved within a limit of memory keeps it (0.48 ms a step, where
  # moving a layer off the first stage costs 0.52 ms); the report and the JSON say so.
  peak=$(python3 -c "import json,sys; print(max(s['memory_bytes'] for s in json.load(open(sys.argv[1]))['pipeline']['stages']))" "$tmp/pp.json")
  expect_rc 0 "$tool" plan "${pipe[@]}" --mesh 2x4 --mode train --device a100-80g --algo megatron --tp 2 --pp 2 --micro-batch 2 \
    --no-svg --memory-budget $((peak - 1)) --out "$tmp/pp-lean.json"
  grep -q "stage plan solved within .* per device of its two-layer model (the fastest plan's stages do not fit" "$tmp/out" \
    && ok || bad "--pp 2 one byte under its peak: $(cat "$tmp/out")"
  expect_rc 0 "$tool" plan "${pipe[@]}" --mesh 2x4 --mode train --device a100-80g --algo megatron --tp 2 --pp 2 --micro-batch 2 \
    --quiet --no-svg --json --memory-budget $((peak - 1)) --out "$tmp/pp-lean.json"
  python3 - "$tmp/out" "$peak" <<'PY' && ok || bad "--pp 2 one byte under its peak: $(head -c 600 "$tmp/out")"
import json, sys
r, peak = json.load(open(sys.argv[1]))["plan"], int(sys.argv[2])
assert r["within_budget"] and r["peak_memory_bytes"] < peak, r
assert r["stage_plan_limit_bytes"] is not None and r["stage_plan_limit_bytes"] < peak, r["stage_plan_limit_bytes"]
assert [s["unit_count"] for s in r["stages"]] == [3, 3], r["stages"]  # 2 layers each, with the embedding and the head
PY
  # A stated budget tightens the stages' (never loosens them past the device); none is refused.
  expect_rc 3 "$tool" plan "${pipe[@]}" --mesh 2x4 --mode train --device a100-80g --algo megatron --tp 2 --pp 2 --micro-batch 2 \
    --quiet --no-svg --memory-budget 1KiB --out "$tmp/pp-1k.json"
  grep -q "OVER THE MEMORY BUDGET of 1.00 KiB (1024 bytes)" "$tmp/out" && ok || bad "--pp 2 over its budget: $(cat "$tmp/out")"
  expect_rc 1 "$tool" plan "${pipe[@]}" --mesh 2x2 --mode train --device a100-80g --pp auto --quiet --no-svg --memory-budget 1KiB \
    --out "$tmp/pp-auto-1k.json"
  grep -q "no pipelined configuration fits .* and the memory budget of 1.00 KiB (1024 bytes); the closest, .*, over the memory budget of 1.00 KiB" "$tmp/err" \
    && test ! -e "$tmp/pp-auto-1k.json" && ok || bad "--pp auto under 1 KiB: $(cat "$tmp/err")"
  expect_rc 1 "$tool" plan "${pipe[@]}" --mesh 2x4 --mode train --device a100-80g --pp 2 --quiet --no-svg --memory-budget none \
    --out "$tmp/never.json"
  grep -q "\-\-memory-budget none does not apply with --pp" "$tmp/err" && ok || bad "--pp with no budget: $(cat "$tmp/err")"
  # --algo megatron --pp auto searches the configurations Megatron-LM runs as its arguments say:
  # under a budget that needs stages, its layout in each, the layers split as its arguments can
  # (the stages between the first and the last as many each), never slower
  # than Megatron-LM's configuration as people run it where that fits, and exported.
  expect_rc 0 "$tool" plan "${pipe[@]}" --mesh 2x4 --mode train --device a100-80g --algo megatron --pp auto --memory-budget 2MiB \
    --quiet --no-svg --json --out "$tmp/pp-meg.json"
  python3 - "$tmp/out" "$tmp/pp-meg.json" <<'PY' && ok || bad "--algo megatron --pp auto: $(head -c 600 "$tmp/out")"
import json, sys
r, d = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert r["search"]["configurations"] > 1 and r["search"]["priced"] >= 1, r["search"]
assert r["plan"]["stage_layout"] == "megatron" and r["plan"]["parallelism"]["pp"] > 1, r["plan"]["parallelism"]
counts = [s["layers"] for s in d["pipeline"]["stages"]]
assert len(counts) == r["plan"]["parallelism"]["pp"] and len(set(counts[1:-1])) <= 1 and min(counts) >= 1 and sum(counts) == 4, counts
base = r["baselines"]["megatron"]
assert not base.get("within_budget", False) or r["plan"]["step_seconds"] <= base["step_seconds"], (r["plan"], base)
PY
  expect_rc 0 "$tool" export --plan "$tmp/pp-meg.json" --to megatron
  grep -q -- "--pipeline-model-parallel-size $(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['pipeline']['stages']))" "$tmp/pp-meg.json")" "$tmp/out" \
    && ok || bad "--algo megatron --pp auto's export: $(cat "$tmp/out" "$tmp/err")"
  # A stage count that does not divide the layers: Megatron Core's first and last stage counts
  # (4 layers in 3 stages: 1, 2, 1, the head's and the embedding's stages lighter).
  expect_rc 0 "$tool" plan "${pipe[@]}" --mesh 1x3 --mode train --device a100-80g --algo megatron --tp 1 --pp 3 --quiet --no-svg \
    --out "$tmp/pp3.json"
  expect_rc 0 "$tool" export --plan "$tmp/pp3.json" --to megatron
  grep -q -- "--pipeline-model-parallel-size 3" "$tmp/out" && grep -q -- "--decoder-first-pipeline-num-layers 1" "$tmp/out" &&
    grep -q -- "--decoder-last-pipeline-num-layers 1" "$tmp/out" && ok || bad "--algo megatron --pp 3 of 4 layers: $(cat "$tmp/out" "$tmp/err")"
  # alpa's search may keep Megatron-LM's layout of a configuration: the JSON names the stages'
  # layout, and the text says so exactly when it is not the algo asked for.
  ppa=("${pipe[@]}" --mesh 2x4 --mode train --device a100-80g --pp 2 --micro-batch 1 --quiet --no-svg --out "$tmp/pp-layout.json")
  expect_rc 0 "$tool" plan "${ppa[@]}" --json
  cp "$tmp/out" "$tmp/pp-layout.out"
  layout=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['plan']['stage_layout'])" "$tmp/out")
  expect_rc 0 "$tool" plan "${ppa[@]}"
  if [ "$layout" = megatron ]; then grep -q "^  each stage in megatron's layout: its step is faster than the alpa ILP's plan" "$tmp/out"
  else [ "$layout" = alpa ] && ! grep -q "each stage in" "$tmp/out"; fi && ok || bad "stage layout '$layout' and the report: $(head -3 "$tmp/out")"
  # Its stage 0 holds the embedding alone, which Megatron-LM cannot run: the report shows the
  # fastest plan Megatron-LM runs, the one --algo megatron finds with the same flags.
  cp "$tmp/out" "$tmp/pp-layout.txt"
  # It is the best of the configurations --algo megatron prices one by one (pp 2: tp 1, 2 or 4,
  # no recomputation, micro-batches of 1), and the flags it names price it.
  for tp in 1 2 4; do
    expect_rc 0 "$tool" plan "${pipe[@]}" --mesh 2x4 --mode train --device a100-80g --algo megatron --pp 2 --tp $tp --micro-batch 1 \
      --recompute none --quiet --no-svg --json --out "$tmp/pp-meg-tp$tp.json"
    cp "$tmp/out" "$tmp/pp-meg-tp$tp.out"
  done
  python3 - "$tmp/pp-layout.out" "$tmp/pp-layout.txt" "$tmp"/pp-meg-tp{1,2,4}.out <<'PY' && ok || bad "the fastest plan Megatron-LM runs beside alpa's: $(tail -4 "$tmp/pp-layout.txt")"
import json, sys
a, text = json.load(open(sys.argv[1])), open(sys.argv[2]).read()
each = [json.load(open(f)) for f in sys.argv[3:]]
assert not a["exports"]["megatron"]["exports"], a["exports"]["megatron"]
assert all(m["exports"]["megatron"]["exports"] and "megatron_runnable" not in m for m in each), [m["exports"]["megatron"] for m in each]
best = min((m["plan"] for m in each if m["plan"]["within_budget"]), key=lambda p: p["step_seconds"])
r = a["megatron_runnable"]
assert r["parallelism"] == best["parallelism"] and r["step_seconds"] == best["step_seconds"], (r, best)
par = r["parallelism"]
slower = 100 * (r["step_seconds"] / a["plan"]["step_seconds"] - 1)
line = (f"  the fastest plan Megatron-LM runs: pp {par['pp']}, tp {par['tp']}, dp {par['dp']}, micro-batch {par['micro_batch']} x "
        f"{par['micro_batches']}, recompute {par['recompute']}, 1f1b, ")
flags = f"--algo megatron --pp {par['pp']} --tp {par['tp']} --micro-batch {par['micro_batch']} --recompute {par['recompute']}"
assert line in text and f"({abs(slower):.1f} % {'faster' if slower < 0 else 'slower'}): plan with {flags} writes it" in text, text
PY
  expect_rc 0 "$tool" show --plan "$tmp/pp.json"
  grep -q "pipeline of 2 stages, 1f1b: embedding + layers 0-1 | layers 2-3 + head" "$tmp/out" && ok || bad "show --plan of a pipelined plan: $(head -5 "$tmp/out")"
  json_check "[s['holds'] for s in d['pipeline']['stages']] == ['embedding + layers 0-1', 'layers 2-3 + head']" "$tool" show --plan "$tmp/pp.json" --json
  # The stage times and the step shown are priced again from the plan's strategies and stages:
  # a hand-edited step is shown as the file's figure beside the priced one, never as the plan's.
  python3 -c "import json, sys; d = json.load(open(sys.argv[1])); d['pipeline']['step_seconds'] /= 100; d['pipeline']['stages'][0]['seconds'] = 1.0; json.dump(d, open(sys.argv[2], 'w'))" \
    "$tmp/pp.json" "$tmp/pp-edited.json"
  expect_rc 0 "$tool" show --plan "$tmp/pp.json" --json
  step=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pipeline']['step_seconds'])" "$tmp/out")
  json_check "d['pipeline']['step_seconds'] == $step and d['pipeline']['stages'][0]['seconds'] < 1e-3 and len(d['pipeline']['recorded_differs']) == 2" \
    "$tool" show --plan "$tmp/pp-edited.json" --json
  expect_rc 0 "$tool" show --plan "$tmp/pp-edited.json"
  grep -q "^  (priced again: the file records step .* (priced .*), stage 0 per micro-batch 1.00 s (priced .* us); another pricing wrote it, or an edit)" "$tmp/out" &&
    ! grep -q "stage 0: .*, 1.00 s per micro-batch" "$tmp/out" && ok || bad "show --plan of an edited pipeline: $(head -6 "$tmp/out")"
  python3 -c "import json, sys; d = json.load(open(sys.argv[1])); d['pipeline']['stages'][1]['layers'] = 5; json.dump(d, open(sys.argv[2], 'w'))" \
    "$tmp/pp.json" "$tmp/pp-7-layers.json"
  expect_rc 1 "$tool" show --plan "$tmp/pp-7-layers.json"
  grep -q "the plan's 2 stages hold 7 layers, but its graph has 4" "$tmp/err" && ok || bad "show of stages holding 7 of 4 layers: $(cat "$tmp/err")"
  expect_rc 0 "$tool" shard "$tmp/ck4/model.safetensors" --plan "$tmp/pp.json" --out "$tmp/by-stage" --quiet
  for k in 0 1; do
    python3 "$here/check_shards.py" "$tmp/ck4/model.safetensors" "$tmp/by-stage/stage-$k" --subset >/dev/null && ok || bad "stage $k shards differ"
  done
  python3 - "$tmp/ck4/model.safetensors" "$tmp/by-stage" <<'PY' && ok || bad "the stages' files do not hold the model, each stage its own layers"
import json, re, sys
from safetensors.numpy import load_file
orig = set(load_file(sys.argv[1]))
held = []
for k, layers in enumerate([{0, 1}, {2, 3}]):
    index = json.load(open(f"{sys.argv[2]}/stage-{k}/index.json"))
    assert index["world_size"] == 2, index["world_size"]  # tp 2; the data-parallel replicas written once
    names = set(index["tensors"])
    for n in names:
        m = re.search(r"\.(\d+)\.", n)
        assert m is None or int(m.group(1)) in layers, (k, n)
    for f in index["files"]:
        assert set(load_file(f"{sys.argv[2]}/stage-{k}/{f}")) == names, f
    held.append(names)
assert held[0] | held[1] == orig, orig - (held[0] | held[1])
assert "wte.weight" in held[0] and "wte.weight" in held[1]  # tied to the head on the last stage
assert "ln_f.weight" in held[1] and "ln_f.weight" not in held[0] and "wpe.weight" not in held[1]
PY
  expect_rc 0 "$tool" export --plan "$tmp/pp.json" --to megatron
  grep -q -- "--pipeline-model-parallel-size 2" "$tmp/out" && grep -q -- "--tensor-model-parallel-size 2" "$tmp/out" \
    && grep -q -- "--global-batch-size 16" "$tmp/out" && ok || bad "megatron export of a pipelined plan: $(cat "$tmp/out")"
  expect_rc 1 "$tool" export --plan "$tmp/pp.json" --to dtensor
  grep -q "the plan is pipelined (2 stages)" "$tmp/err" && ok || bad "dtensor export of a pipelined plan: $(cat "$tmp/err")"
  # verify runs the stages on 2 x (2x2) Gloo ranks, the transfers point to point in 1F1B, and
  # audits them against the pipelined pricing (a shorter sequence: the plan's strategies).
  json_check "d['passed'] and d['stages'] == 2 and d['ranks'] == 8 and d['micro_batches'] == 4 and d['training'] and d['communication']['passed'] and sum(l['kind'] == 'send' and l['site'].startswith('transfer of ') and l['matches'] for l in d['communication']['lines']) >= 2" \
    "$tool" verify --plan "$tmp/pp.json" --seq 8 --json
  expect_rc 1 "$tool" plan "${pipe[@]}" --mesh 2x4 --mode train --out "$tmp/pp.json" --preload
  grep -q "is pipelined (2 stages): the pass prices one mesh" "$tmp/err" && ok || bad "preloading a pipelined plan: $(cat "$tmp/err")"
  expect_rc 0 "$tool" shard "$tmp/ck/model.safetensors" --policy gpt2 --tp 4 --out "$tmp/by-policy" --quiet
  python3 "$here/check_shards.py" "$tmp/ck/model.safetensors" "$tmp/by-policy" >/dev/null && ok || bad "policy shards differ"
  # c_attn [64,192] column-parallel over 4: each rank holds 16 columns of each of q, k, v.
  python3 -c "
from safetensors.numpy import load_file
import numpy as np
g = load_file('$tmp/ck/model.safetensors')['h.0.attn.c_attn.weight']
r1 = load_file('$tmp/by-policy/rank-1.safetensors')['h.0.attn.c_attn.weight']
want = np.concatenate([g[:, 16:32], g[:, 80:96], g[:, 144:160]], axis=1)
assert np.array_equal(r1, want)" && ok || bad "fused QKV split"
  # A Megatron plan (head-parallel attention after the fused QKV split), sharded by plan on a
  # checkpoint whose c_attn values are labels (weight: the column index, bias: 10000 + it): rank
  # r holds columns [16r, 16r + 16) of q, of k and of v, concatenated, as --policy gpt2 cuts them.
  expect_rc 0 "$tool" plan "${small[@]}" --mesh 1x4 --mode infer --algo megatron --out "$tmp/tp.json" --quiet
  grep -q "attn.q  *split  *RRS1 -> RRS1" "$tmp/out" && ok || bad "megatron's q is not head-parallel: $(grep attn.q "$tmp/out")"
  python3 -c "
from safetensors.numpy import load_file, save_file
import numpy as np
t = load_file('$tmp/ck/model.safetensors')
for l in (0, 1):
    w = t[f'h.{l}.attn.c_attn.weight']
    t[f'h.{l}.attn.c_attn.weight'] = np.broadcast_to(np.arange(w.shape[1], dtype=w.dtype), w.shape).copy()
    t[f'h.{l}.attn.c_attn.bias'] = 10000 + np.arange(w.shape[1], dtype=w.dtype)
save_file(t, '$tmp/labelled.safetensors')" && ok || bad "labelled checkpoint"
  expect_rc 0 "$tool" shard "$tmp/labelled.safetensors" --plan "$tmp/tp.json" --out "$tmp/by-tp-plan" --quiet
  python3 -c "
from safetensors.numpy import load_file
import json, numpy as np
for r in range(4):
    s = load_file(f'$tmp/by-tp-plan/rank-{r}.safetensors')
    cols = np.concatenate([np.arange(p * 64 + 16 * r, p * 64 + 16 * r + 16) for p in range(3)])
    for l in (0, 1):
        w, b = s[f'h.{l}.attn.c_attn.weight'], s[f'h.{l}.attn.c_attn.bias']
        assert w.shape == (64, 48) and (w == cols).all(), (r, l, w[0])
        assert (b == 10000 + cols).all(), (r, l, b)
assert json.load(open('$tmp/by-tp-plan/index.json'))['tensors']['h.0.attn.c_attn.weight']['fused'] == '3 equal parts'" \
    && ok || bad "plan shards of the fused QKV are not cut per part"
  python3 "$here/check_shards.py" "$tmp/labelled.safetensors" "$tmp/by-tp-plan" >/dev/null && ok || bad "tp plan shards differ"
  if "$tool" --help | grep -q ' verify'; then
    json_check "d['passed']" "$tool" verify --plan "$tmp/tp.json" --json
  fi
  # a plan for another model, and a policy that does not divide: exit 1, output untouched.
  "$tool" plan --model gpt2 --layers 2 --hidden 128 --heads 4 --vocab 512 --seq 64 --batch 8 --mesh 2x4 \
    --out "$tmp/other.json" --quiet >/dev/null 2>&1
  expect_rc 1 "$tool" shard "$tmp/ck/model.safetensors" --plan "$tmp/other.json" --out "$tmp/never"
  test ! -e "$tmp/never" && ok || bad "a failed shard left $tmp/never behind"
  expect_rc 1 "$tool" shard "$tmp/ck/model.safetensors" --policy gpt2 --tp 3 --out "$tmp/never3"
  test ! -e "$tmp/never3" && ok || bad "a failed shard left $tmp/never3 behind"
  expect_rc 2 "$tool" shard "$tmp/ck/model.safetensors" --out "$tmp/x" --tp 4
fi

# show: Partial blocks are labelled by the rank groups holding one partial value each;
# uneven splits name the ranks that hold nothing (10 rows nested over 2x4: 5 = 2+2+1+0).
json_check "d['labels'] == [['0,1+2,3']] and d['partial'] == [{'mesh_axis': 0, 'op': 'sum'}] and d['owners'] == [[[0,1,2,3]]]" \
  "$tool" show --mesh 2x2 --shape 4,8 --spec "[P,R]" --json
json_check "d['empty_ranks'] == [3,7] and d['row_cuts'] == [0,2,4,5,7,9,10] and not d['even']" \
  "$tool" show --mesh 2x4 --shape 10,4 --spec S01R --json
expect_rc 0 "$tool" show --mesh 2x4 --shape 10,4 --spec S01R
grep -q "ranks 3,7 hold nothing" "$tmp/out" && ok || bad "show: empty ranks note: $(cat "$tmp/out")"
expect_rc 2 "$tool" show --mesh 2x2
expect_rc 2 "$tool" show --tensor x

# show --plan: a plan file's tensors with their specs and local shapes, and one tensor's
# block map. The Megatron baseline's specs are known: the batch split over the data-parallel
# mesh axis 0, c_attn's output [8,64,192] column-split over mesh axis 1 (4 ranks, 48 columns
# each), c_proj's Partial over axis 1.
if "$tool" --help | grep -q ' plan'; then
  sm=(--model gpt2 --layers 2 --hidden 64 --heads 4 --vocab 512 --seq 64 --batch 8)
  "$tool" plan "${sm[@]}" --mesh 2x4 --algo megatron --out "$tmp/meg.json" --quiet >/dev/null 2>&1
  expect_rc 0 "$tool" show --plan "$tmp/meg.json"
  grep -Eq '^  transformer\.h\.0\.attn\.c_attn +linear +\[8,64,192\] +\[S\(0\),S\(2\)\] +S0RS1 +\[4,64,48\] \(dim 2: 3 fused parts, each cut\)$' "$tmp/out" && ok \
    || bad "show --plan: c_attn row: $(grep 'attn.c_attn ' "$tmp/out")"
  grep -Eq '^  transformer\.h\.0\.attn\.c_proj +linear +\[8,64,64\] +\[S\(0\),P\] +S0RRP1 +\[4,64,64\]$' "$tmp/out" && ok \
    || bad "show --plan: c_proj row: $(grep 'attn.c_proj ' "$tmp/out")"
  # every operator of the plan, with the plan's own output spec and shape
  json_check "[(t['name'], t['alpa'], t['shape']) for t in d['tensors']] == [(o['name'], o['output'], o['shape']) for o in json.load(open('$tmp/meg.json'))['tensors']] and d['mesh']['shape'] == [2,4]" \
    "$tool" show --plan "$tmp/meg.json" --json
  # q | k | v cut per part: the map is one part's, which every part shares (the first batch
  # block's: ranks 0-3)
  json_check "d['tensor'] == 'transformer.h.0.attn.c_attn' and d['col_cuts'] == [0,16,32,48,64] and d['owners'] == [[[0],[1],[2],[3]]] and d['local_shape'] == [4,64,48] and d['fused'] == {'dim': 2, 'parts': 3} and d['global_shape'] == [8,64,192]" \
    "$tool" show --plan "$tmp/meg.json" --tensor transformer.h.0.attn.c_attn --json
  # the checkpoint spelling (without "transformer.") finds it too; Partial is labelled
  json_check "d['tensor'] == 'transformer.h.1.attn.c_proj' and d['labels'] == [['0+1+2+3']]" \
    "$tool" show --plan "$tmp/meg.json" --tensor h.1.attn.c_proj --json
  expect_rc 0 "$tool" show --plan "$tmp/meg.json" --tensor transformer.h.0.mlp.c_fc --svg "$tmp/fc.svg"
  grep -Fq "[S(0),S(2)] (S0RS1) of [8,64,256] on mesh(2,4)" "$tmp/out" && grep -q "0:64 " "$tmp/out" && ok \
    || bad "show --plan --tensor: terminal map: $(cat "$tmp/out")"
  grep -q "rank 3" "$tmp/fc.svg" && grep -q "transformer.h.0.mlp.c_fc" "$tmp/fc.svg" && ok || bad "show --plan svg content"
  # an unknown tensor: exit 1, one line naming it and suggesting the close names
  expect_rc 1 "$tool" show --plan "$tmp/meg.json" --tensor transformer.h.0.attn.c_atn
  [ "$(wc -l < "$tmp/err")" -eq 1 ] && grep -q "no tensor 'transformer.h.0.attn.c_atn'; did you mean 'transformer.h.0.attn.c_attn'" "$tmp/err" \
    && ok || bad "show: unknown tensor message: $(cat "$tmp/err")"
  expect_rc 2 "$tool" show --plan "$tmp/meg.json" --spec RR
  expect_rc 2 "$tool" show --plan "$tmp/meg.json" --svg "$tmp/never.svg"
  expect_rc 1 "$tool" show --plan "$tmp/no-such-plan.json"
  echo '{"format": "something else"}' > "$tmp/notaplan.json"
  expect_rc 1 "$tool" show --plan "$tmp/notaplan.json"
  # a version-1 plan (before plans carried their links and local shapes): refused, naming both versions
  python3 -c "
import json; d = json.load(open('$tmp/meg.json')); d['version'] = 1
json.dump(d, open('$tmp/v1.json', 'w'))"
  expect_rc 1 "$tool" show --plan "$tmp/v1.json"
  grep -q "has version 1, an older format this build no longer reads (it reads versions 2 to 5)" "$tmp/err" && ok \
    || bad "show: version 1 message: $(cat "$tmp/err")"
fi

# calibrate: a 2x2 mesh of Gloo ranks on loopback, fitted links written and used by plan.
if "$tool" --help | grep -q ' calibrate'; then
  json_check "len(d['axes']) == 2 and all(a['measured'] for a in d['axes']) and all(a['bandwidth_Bps'] > 0 and a['latency_s'] >= 0 for a in d['mesh']['axes'])" \
    "$tool" calibrate --mesh 2x2 --max-bytes 65536 --repeats 2 --out "$tmp/links.json" --json
  test -s "$tmp/links.json" && ok || bad "calibration file missing"
  if "$tool" --help | grep -q ' plan'; then
    expect_rc 0 "$tool" plan --model gpt2 --layers 1 --hidden 64 --heads 4 --vocab 256 --seq 32 --batch 4 \
      --mesh 2x2 --calibration "$tmp/links.json" --out "$tmp/cal-plan.json" --quiet
  fi
  expect_rc 2 "$tool" calibrate --mesh 2x2 --max-bytes 10 --out "$tmp/never.json"
  expect_rc 2 "$tool" calibrate --mesh 2x2 --repeats 0 --out "$tmp/never.json"
  # --max-bytes is bounded before anything is allocated (1e30 once reached 24 GB; nan passed):
  # a usage error, as every number out of its range.
  for mb in 1e30 nan inf 2147483648; do
    expect_rc 2 "$tool" calibrate --mesh 2x2 --max-bytes "$mb" --out "$tmp/never.json"
    grep -q "max-bytes: must be a number of bytes from 65536 (64 KiB) to 1073741824 (1 GiB), got $mb" "$tmp/err" && ok ||
      bad "calibrate --max-bytes $mb: $(cat "$tmp/err")"
  done
  test ! -e "$tmp/never.json" && ok || bad "a refused calibrate wrote its file"
  # (Rank threads under an address-space limit: tests/tool/limits_test.sh, without sanitizers.)
  # Launched like torchrun: two "nodes" (each its own process group), two ranks each, every
  # process given only torchrun's variables, meeting at MASTER_ADDR:MASTER_PORT on loopback.
  launch_node() {  # launch_node NODE PORT OUT
    local node=$1 port=$2 out=$3 lr r
    for lr in 0 1; do
      r=$((2 * node + lr))
      env -u AUTOSHARD_STORE RANK=$r LOCAL_RANK=$lr WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
        MASTER_PORT="$port" AUTOSHARD_TIMEOUT_MS=30000 \
        "$tool" calibrate --mesh 2x2 --from-env --max-bytes 65536 --repeats 2 --out "$out" >"$out.$r.log" 2>&1 &
    done
    local rc=0
    wait -n || rc=1
    wait -n || rc=1
    return $rc
  }
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  ( set -m; launch_node 0 "$port" "$tmp/env-links.json" & n0=$!; launch_node 1 "$port" "$tmp/env-links.json" & n1=$!
    wait $n0 && wait $n1 ) && ok || { bad "calibrate --from-env on two local nodes"; cat "$tmp"/env-links.json.*.log; }
  python3 -c "import json,sys; d=json.load(open('$tmp/env-links.json')); sys.exit(0 if d['version'] == 3 and [a['size'] for a in d['mesh']['axes']] == [2,2] and all(a['measured'] for a in d['axes']) else 1)" \
    && ok || bad "calibrate --from-env: the file of rank 0"
  grep -q "4 ranks, one process each" "$tmp/env-links.json.0.log" && ok || bad "calibrate --from-env: rank 0's report"
  # Launch variables that cannot be used: errors naming the variable.
  expect_rc 1 env RANK=x WORLD_SIZE=4 "$tool" calibrate --mesh 2x2 --from-env --out "$tmp/never.json"
  grep -q "RANK='x' is not an integer" "$tmp/err" && ok || bad "RANK=x: $(cat "$tmp/err")"
  expect_rc 1 env RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 "$tool" calibrate --mesh 2x2 --from-env --out "$tmp/never.json"
  grep -q "the launch has 3 ranks (WORLD_SIZE=3) but mesh(2,2) needs 4" "$tmp/err" && ok || bad "WORLD_SIZE=3: $(cat "$tmp/err")"
  expect_rc 1 env RANK=0 WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=70000 "$tool" calibrate --mesh 2x2 --from-env --out "$tmp/never.json"
  grep -q "MASTER_PORT=70000 is outside \[1, 65535\]" "$tmp/err" && ok || bad "MASTER_PORT=70000: $(cat "$tmp/err")"
  expect_rc 1 env -u RANK -u SLURM_PROCID -u OMPI_COMM_WORLD_RANK "$tool" calibrate --mesh 2x2 --from-env --out "$tmp/never.json"
  grep -q "no rank in the environment" "$tmp/err" && ok || bad "no RANK: $(cat "$tmp/err")"
fi

# A calibration of a 3-axis mesh (a version-2 file: the mesh a list of sizes, the links beside
# each axis's fit, as calibrate wrote them before version 3): plan, show and verify use all
# three axes' measured links (none collapses into another), and another mesh shape or backend
# needs --force.
if "$tool" --help | grep -q ' plan' && "$tool" --help | grep -q ' calibrate'; then
  python3 - "$tmp/cal3.json" <<'PY'
import json, sys
axes = [{"axis": a, "group_size": 2, "measured": True, "latency_s": lat, "bandwidth_Bps": bw,
         "holdout_bytes": 0.0, "holdout_relative_error": 0.0, "samples": []}
        for a, (lat, bw) in enumerate([(3e-5, 2e10), (7e-6, 1.5e11), (2e-6, 4.5e11)])]
json.dump({"format": "autoshard-calibration", "version": 2, "backend": "gloo-tcp", "mesh": [2, 2, 2], "axes": axes},
          open(sys.argv[1], "w"))
PY
  c3=(--model gpt2 --layers 1 --hidden 32 --heads 4 --vocab 128 --seq 16 --batch 8 --mode train --mesh 2x2x2)
  links="[(a['latency_s'], a['bandwidth_Bps']) for a in d['mesh']['axes']] == [(3e-5, 2e10), (7e-6, 1.5e11), (2e-6, 4.5e11)]"
  json_check "$links" "$tool" plan "${c3[@]}" --algo data_parallel --calibration "$tmp/cal3.json" --out "$tmp/cal3-plan.json" --json --quiet
  json_check "$links" python3 -c "import json; print(json.dumps(json.load(open('$tmp/cal3-plan.json'))))"
  json_check "$links" "$tool" show --plan "$tmp/cal3-plan.json" --json
  json_check "$links" "$tool" plan "${c3[@]}" --algo data_parallel --preload --out "$tmp/cal3-plan.json" --json
  if "$tool" --help | grep -q ' verify'; then
    json_check "d['passed'] and $links" "$tool" verify --plan "$tmp/cal3-plan.json" --json
  fi
  expect_rc 1 "$tool" plan "${c3[@]/2x2x2/2x4}" --calibration "$tmp/cal3.json" --out "$tmp/never.json" --quiet
  grep -q "measured on mesh 2x2x2, not 2x4 (--force uses it anyway)" "$tmp/err" && ok || bad "calibration shape: $(cat "$tmp/err")"
  expect_rc 1 "$tool" plan "${c3[@]}" --backend nccl --calibration "$tmp/cal3.json" --out "$tmp/never.json" --quiet
  grep -q "measured on gloo-tcp, not nccl" "$tmp/err" && ok || bad "calibration backend: $(cat "$tmp/err")"
  expect_rc 0 "$tool" plan "${c3[@]}" --backend nccl --force --calibration "$tmp/cal3.json" --out "$tmp/forced.json" --quiet
  grep -q "note: --force" "$tmp/err" && ok || bad "--force says so: $(cat "$tmp/err")"
fi

# verify: a plan file (it embeds its graph) executed on 8 Gloo ranks against the unsharded run
# (22 operators: the training graph of one GPT-2 layer has its two dropouts).
if "$tool" --help | grep -q ' verify'; then
  vp=(--model gpt2 --layers 1 --hidden 32 --heads 4 --vocab 128 --seq 16 --batch 8 --mode train --mesh 2x4)
  "$tool" plan "${vp[@]}" --algo megatron --out "$tmp/v.json" --quiet >/dev/null 2>&1
  json_check "d['passed'] and d['ranks'] == 8 and d['failed'] == 0 and d['first_failed'] is None and len(d['operators']) == 22 and d['max_rel_diff'] < 1e-12 and any('P' in o['spec'] for o in d['operators'])" \
    "$tool" verify --plan "$tmp/v.json" --json
  json_check "d['passed'] and d['dtype'] == 'f32' and d['rtol'] == 1e-3" "$tool" verify --plan "$tmp/v.json" --dtype f32 --json
  # The communication audit: what the ranks issued is what the plan was priced, beside what
  # docs/execution.md documents (megatron's vocab-parallel loss: its backward's recomputed row
  # max and sum, listed with the reason).
  json_check "d['checked'] and d['passed'] and d['executed_bytes'] == d['priced_bytes'] + d['documented_bytes'] and d['priced_bytes'] > 0 and d['documented_bytes'] > 0 and all(l['matches'] or l['documented'] for l in d['lines'])" \
    python3 -c "import json,subprocess,sys; d=json.loads(subprocess.run(sys.argv[1:],capture_output=True).stdout); print(json.dumps(d['communication']))" \
    "$tool" verify --plan "$tmp/v.json" --json
  # --batch/--seq: the plan's strategies at other sizes, re-priced and audited; a batch that a
  # plan's data-parallel split leaves empty shards at is refused naming the tensor.
  json_check "d['passed'] and len(d['operators']) == 22 and d['communication']['passed'] and d['communication']['priced_bytes'] > 0" \
    "$tool" verify --plan "$tmp/v.json" --seq 8 --json
  # (The data-parallel plan with its loss pinned split over all 8 ranks: priced as training is
  # now, this tiny model's plans keep the batch whole, its compute being worth less than the
  # gradient sync.)
  "$tool" plan "${vp[@]}" --algo data_parallel --pin loss=P01 --out "$tmp/dp8.json" --quiet >/dev/null 2>&1
  expect_rc 1 "$tool" verify --plan "$tmp/dp8.json" --batch 2 --seq 8
  grep -q "at --batch 2 --seq 8 the plan no longer fits its graph: .*tensor '[a-z_.0-9]*' has strategy 'S01R[R,S01]*->[PS]01[R]*', which it does not offer" "$tmp/err" \
    && ok || bad "verify --batch 2: $(cat "$tmp/err")"
  expect_rc 0 "$tool" verify --plan "$tmp/v.json"
  grep -q "^PASS: largest difference" "$tmp/out" && grep -q "8 Gloo ranks" "$tmp/out" && ok || bad "verify text report"
  # A strategy the operator does not offer, a graph that does not match the plan, no file, bad options.
  python3 - "$tmp/v.json" "$tmp/v-bad.json" "$tmp/v-graph.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
op = next(o for o in d['tensors'] if o['name'] == 'transformer.h.0.mlp.c_fc')
op['strategy'] = 'RRR,RR,R->RRR?'
json.dump(d, open(sys.argv[2], 'w'))
d = json.load(open(sys.argv[1]))
v = next(v for v in d['graph']['nodes'] if v['name'] == 'transformer.wte.weight')
v['shape'] = [64, 32]
json.dump(d, open(sys.argv[3], 'w'))
PY
  expect_rc 1 "$tool" verify --plan "$tmp/v-bad.json"
  grep -q "transformer.h.0.mlp.c_fc" "$tmp/err" && ok || bad "verify names the operator whose strategy is not offered"
  expect_rc 1 "$tool" verify --plan "$tmp/v-graph.json"
  grep -q "its graph is invalid: graph error: vertex 'lm_head'" "$tmp/err" && ok || bad "verify names the vertex whose shape no longer fits"
  expect_rc 1 "$tool" verify --plan "$tmp/none.json"
  expect_rc 2 "$tool" verify --plan "$tmp/v.json" --dtype bf16
  expect_rc 2 "$tool" verify
  # Tensor names in Hugging Face's state-dict spelling: GPT-2's lm_head.weight is the tied wte.
  expect_rc 0 "$tool" show --plan "$tmp/v.json" --tensor lm_head.weight
  grep -q "note: 'lm_head.weight' is 'transformer.wte.weight' (tied" "$tmp/out" && ok || bad "show resolves the tied lm_head.weight: $(cat "$tmp/out" "$tmp/err")"
  json_check "d['tensor'] == 'transformer.wte.weight'" "$tool" show --plan "$tmp/v.json" --tensor wte.weight --json
  # plan --pin takes the same spellings (one resolver): the tied name pins the embedding table,
  # the checkpoint spelling a layer's weight; a name nothing fits gets the closest names.
  "$tool" plan "${vp[@]}" --pin lm_head.weight=S0R --pin h.0.attn.c_attn.weight=RS0 --out "$tmp/pinned.json" --quiet >/dev/null 2>"$tmp/err" \
    && grep -q "note: --pin 'lm_head.weight' is 'transformer.wte.weight' (tied" "$tmp/err" && ok || bad "plan --pin in state-dict spelling: $(cat "$tmp/err")"
  json_check "{t['name']: t['output'] for t in d['tensors']}['transformer.wte.weight'] == 'S0R' and {t['name']: t['output'] for t in d['tensors']}['transformer.h.0.attn.c_attn.weight'] == 'RS0'" \
    cat "$tmp/pinned.json"
  expect_rc 1 "$tool" plan "${vp[@]}" --pin h.0.attn.c_atn.weight=RR --out "$tmp/never.json" --quiet
  grep -q "no tensor named 'h.0.attn.c_atn.weight'; did you mean 'transformer.h.0.attn.c_attn.weight'" "$tmp/err" && ok || bad "--pin did-you-mean: $(cat "$tmp/err")"
  # The plan's picture: tied layers once with their count, a legend; dot runs without a shell,
  # so a directory whose name has quotes and a $(...) keeps its files and runs nothing.
  q="$tmp/it's a \"quoted\" \$(touch $tmp/pwned) dir"
  mkdir -p "$q"
  expect_rc 0 "$tool" plan --model gpt2 --layers 3 --hidden 32 --heads 4 --vocab 128 --seq 16 --batch 8 --mesh 2x4 --algo megatron --out "$q/p.json" --quiet
  grep -q "layers 0-2 (x 3, tied" "$q/p.dot" && grep -q "cluster_legend" "$q/p.dot" && ok || bad "plan DOT collapses tied layers and has a legend"
  if command -v dot >/dev/null 2>&1; then
    [ -s "$q/p.svg" ] && [ ! -e "$q/p.svg.tmp" ] && ok || bad "the SVG beside a quoted path"
  fi
  [ ! -e "$tmp/pwned" ] && ok || bad "a path ran a command"
  # export: the Megatron plan of a small LLaMA as transformers' tp_plan and PyTorch's styles
  # (its vocabulary as Megatron-LM's: embed_tokens split on the vocabulary, lm_head column-parallel).
  lp=(--model llama-7b --layers 2 --hidden 256 --heads 8 --kv-heads 8 --ffn 688 --vocab 512 --seq 64 --batch 8 --mesh dp=2,tp=4)
  "$tool" plan "${lp[@]}" --algo megatron --out "$tmp/l.json" --quiet >/dev/null 2>&1
  json_check "d['base_model_tp_plan'] == {'embed_tokens': 'embedding_rowwise', 'layers.*.self_attn.q_proj': 'colwise', 'layers.*.self_attn.k_proj': 'colwise', 'layers.*.self_attn.v_proj': 'colwise', 'layers.*.self_attn.o_proj': 'rowwise', 'layers.*.mlp.gate_proj': 'colwise', 'layers.*.mlp.up_proj': 'colwise', 'layers.*.mlp.down_proj': 'rowwise'} and d['tp_plan']['lm_head'] == 'colwise_gather_output' and d['tp_axis_name'] == 'tp' and d['transformers'] == 5" \
    "$tool" export --plan "$tmp/l.json" --to hf-tp-plan
  expect_rc 0 "$tool" export --plan "$tmp/l.json" --to dtensor --out "$tmp/l-dt.json"
  python3 -c "import json; d=json.load(open('$tmp/l-dt.json')); p=d['plan']; assert p['model.layers.1.mlp.up_proj']['style']=='ColwiseParallel' and p['model.layers.1.mlp.down_proj']['kwargs']['input_layouts']=='Shard(-1)'" && ok || bad "dtensor export content"
  expect_rc 1 "$tool" export --plan "$tmp/l.json" --to dtensor --out "$tmp/l.json"   # never overwrites its input
  grep -q "is the --plan .*: refusing to overwrite its input" "$tmp/err" && ok || bad "export refuses to overwrite the plan: $(cat "$tmp/err")"
  expect_rc 1 "$tool" export --plan "$tmp/l.json" --to dtensor --axis pp
  # GPT-2's Conv1D weights: PyTorch's styles take nn.Linear only, so the dtensor export is refused, naming the modules.
  expect_rc 1 "$tool" export --plan "$tmp/v.json" --to dtensor
  grep -q "transformer.h.0.attn.c_attn' (linear): its weight is stored \[in,out\]" "$tmp/err" && ok || bad "export names the Conv1D modules: $(cat "$tmp/err")"
  json_check "d['transformers'] == 4" "$tool" export --plan "$tmp/l.json" --to hf-tp-plan --transformers 4
  expect_rc 2 "$tool" export --plan "$tmp/l.json" --to hf-tp-plan --transformers 3
  expect_rc 2 "$tool" export --plan "$tmp/l.json" --to onnx
  expect_rc 2 "$tool" export --plan "$tmp/l.json"
fi

# Every plan file this test wrote validates against the published schema (docs/plan.schema.json),
# and the schema rejects a plan with a missing member or an out-of-range size.
plans=()
for f in "$tmp"/*.json; do
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); v=json.load(open(sys.argv[2]))['properties']['version']['const']; sys.exit(0 if isinstance(d, dict) and d.get('format') == 'autoshard.plan' and d.get('version') == v else 1)" "$f" "$here/../../docs/plan.schema.json" 2>/dev/null \
    && plans+=("$f")
done
# The plans this test writes are of the version the schema describes: none would be a schema
# check that checks nothing (it filtered on version 3 while plans were written as version 4).
[ "${#plans[@]}" -ge 3 ] && ok || bad "only ${#plans[@]} plan files of the schema's version were written"
if [ "${#plans[@]}" -gt 0 ]; then
  python3 "$here/check_plan_schema.py" "$here/../../docs/plan.schema.json" "${plans[@]}" && ok || bad "plan files do not match docs/plan.schema.json"
  python3 - "${plans[0]}" "$tmp/schema-bad1.json" "$tmp/schema-bad2.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); del d['tensors'][0]['local_shape']; json.dump(d, open(sys.argv[2], 'w'))
d = json.load(open(sys.argv[1])); d['mesh']['axes'][0]['size'] = 99999999; json.dump(d, open(sys.argv[3], 'w'))
PY
  python3 "$here/check_plan_schema.py" --expect-invalid "$here/../../docs/plan.schema.json" "$tmp/schema-bad1.json" "$tmp/schema-bad2.json" \
    && ok || bad "the schema accepts an invalid plan"
fi

# A decode step after a key/value cache (--kv-cache): refused in training, for BERT (an encoder)
# and for a model file; a small LLaMA's decode step holds its cache split as its keys and runs on
# its ranks, also with another count of new tokens after the same cache. GPT-2's and OPT's Hugging
# Face configs decode too, their position tables read from the past on (within max_positions).
kv=(--model llama-7b --layers 2 --hidden 64 --heads 8 --kv-heads 4 --ffn 96 --vocab 128 --mesh 1x4 --batch 2 --seq 2 --kv-cache 5)
expect_rc 2 "$tool" plan "${kv[@]}" --mode train --out "$tmp/kv.json"
grep -q "a decode step, which is inference: give --mode infer" "$tmp/err" && ok || bad "--kv-cache in training: $(cat "$tmp/err")"
expect_rc 1 "$tool" plan --model bert-base --layers 1 --mode infer --kv-cache 8 --mesh 1x2 --out "$tmp/kv.json"
grep -q "bert config: a key/value cache (past 8) is for a decoder's step after cached tokens, but bert is an encoder" "$tmp/err" &&
  ok || bad "--kv-cache on bert: $(cat "$tmp/err")"
hf_data=$(cd "$here/../data/hf" && pwd)
for m in gpt2 opt-125m; do
  expect_rc 0 "$tool" plan --model "$hf_data/$m.json" --layers 2 --hidden 64 --heads 4 --vocab 128 --mode infer --mesh 1x2 --batch 2 \
    --seq 1 --kv-cache 6 --quiet --no-svg --out "$tmp/kv-$m.json"
  grep -qE "^decode  2 sequences x 1 token after 6 cached: " "$tmp/out" && ok || bad "$m's decode line: $(grep ^decode "$tmp/out")"
  expect_rc 0 "$tool" verify --plan "$tmp/kv-$m.json" --seq 2
done
# A decode plan exports as its prefill plan: GPT-2's position embedding reads a slice of its table
# (rows 6.. after 6 cached), where the model's module indexes the whole table, so the exports name
# it as the prefill's does (hf: "transformer.wpe": "replicate"; its table split on the hidden dim:
# embedding_colwise); a table stored with its rows split is refused, naming the rows. (One
# sequence: with more, the planner splits the batch, which a learned-positions model's DTensor
# export refuses, cache or not.)
for pin in "" "--pin transformer.wpe.weight=RS0"; do
  for past in 0 6; do
    expect_rc 0 "$tool" plan --model "$hf_data/gpt2.json" --layers 2 --hidden 64 --heads 4 --vocab 128 --mode infer --mesh tp=2 --batch 1 \
      --seq 1 $([ "$past" -gt 0 ] && echo --kv-cache $past) $pin --quiet --no-svg --out "$tmp/kvx-$past.json"
    for to in dtensor hf-tp-plan; do expect_rc 0 "$tool" export --plan "$tmp/kvx-$past.json" --to $to --out "$tmp/kvx-$past-$to.json"; done
  done
  python3 - "$tmp" "$pin" <<'PY' && ok || bad "the decode plan's exports differ from the prefill plan's (pin '$pin')"
import json, sys
t, pin = sys.argv[1], sys.argv[2]
for to in ("dtensor", "hf-tp-plan"):
    a, b = (json.load(open(f"{t}/kvx-{p}-{to}.json")) for p in (0, 6))
    a.pop("notes", None), b.pop("notes", None)
    if a != b:
        sys.exit(f"{to}: {a} != {b}")
plan = json.load(open(f"{t}/kvx-6-hf-tp-plan.json"))["tp_plan"]
sys.exit(0 if plan["transformer.wpe"] == ("embedding_colwise" if pin else "replicate") else f"wpe: {plan}")
PY
done
expect_rc 0 "$tool" plan --model "$hf_data/gpt2.json" --layers 2 --hidden 64 --heads 4 --vocab 128 --mode infer --mesh tp=2 --batch 1 \
  --seq 1 --kv-cache 6 --pin transformer.wpe.weight=S0R --quiet --no-svg --out "$tmp/kvx-rows.json"
expect_rc 1 "$tool" export --plan "$tmp/kvx-rows.json" --to hf-tp-plan --out "$tmp/kvx-rows-hf.json"
grep -q "'transformer.wpe' (embedding): it reads the rows 6.. of 'transformer.wpe.weight' (past the table's offset and a key/value cache's tokens), where the model's module indexes the whole table, and the plan splits the rows over" "$tmp/err" &&
  ok || bad "a decode plan's row-split position table exported: $(cat "$tmp/err")"
# A preset's table grows to hold the step after the cache (as it grows for a --seq past it); a
# Hugging Face config's is the checkpoint's, and past it is refused, naming the numbers.
expect_rc 0 "$tool" plan --model gpt2 --layers 1 --hidden 64 --heads 4 --vocab 128 --mode infer --mesh 1x2 --seq 1 --kv-cache 2000 --quiet \
  --no-svg --out "$tmp/kv-grown.json"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
sys.exit(0 if [n["shape"] for n in d["graph"]["nodes"] if n["name"] == "transformer.wpe.weight"] == [[2001, 64]] else 1)' "$tmp/kv-grown.json" &&
  ok || bad "the gpt2 preset's position table did not grow to the step after a cache of 2000"
expect_rc 1 "$tool" plan --model "$hf_data/gpt2.json" --layers 1 --mode infer --mesh 1x2 --seq 2 --kv-cache 1023 --out "$tmp/kv.json"
grep -q "gpt2 config: past 1023 + seq 2 = 1025 exceeds max_positions 1024, the rows of the learned position table" "$tmp/err" &&
  ok || bad "--kv-cache past gpt2's positions: $(cat "$tmp/err")"
expect_rc 0 "$tool" plan "${kv[@]}" --mode infer --algo megatron --quiet --no-svg --out "$tmp/kv.json"
grep -qE "^decode  2 sequences x 2 tokens after 5 cached: [0-9]+ tokens/s \(a step .*\); the key/value cache 640 B per device$" "$tmp/out" &&
  ok || bad "plan's decode line: $(grep ^decode "$tmp/out")"
json_check 'd["decode"]["past"] == 5 and d["decode"]["cache_bytes_per_device"] == 640 and abs(d["decode"]["tokens_per_second"] * d["plan"]["step_seconds"] - 4) < 1e-9' \
  "$tool" plan "${kv[@]}" --mode infer --algo megatron --json --no-svg --out "$tmp/kv-j.json"
json_check 'd["decode"] is None' "$tool" plan "${kv[@]:0:${#kv[@]}-2}" --mode infer --json --no-svg --out "$tmp/kv-j.json"  # no --kv-cache 5
python3 - "$tmp/kv.json" "$tmp/kv-graph.json" <<'PY' && ok || bad "the decode plan's cache is not split as its keys"
import json, sys
d = json.load(open(sys.argv[1]))
json.dump(d["graph"], open(sys.argv[2], "w"))  # its graph as a model file: kv_cache inputs and rotary offsets
t = {x["name"]: x["strategy"] for x in d["tensors"]}
sys.exit(0 if t["past_key_values.1.key"] == "->RRS1" and t["model.layers.1.self_attn.attention"] == "RRS1,RRS1,RRS1,RRS1,RRS1->RRS1" else 1)
PY
expect_rc 1 "$tool" plan --model "$tmp/kv-graph.json" --mode infer --kv-cache 8 --mesh 1x2 --out "$tmp/kv-again.json"
grep -q "a model JSON file's graph is its own" "$tmp/err" && ok || bad "--kv-cache on a model file: $(cat "$tmp/err")"
expect_rc 0 "$tool" plan --model "$tmp/kv-graph.json" --mode infer --mesh 1x2 --quiet --no-svg --out "$tmp/kv-again.json"
expect_rc 0 "$tool" verify --plan "$tmp/kv.json"
expect_rc 0 "$tool" verify --plan "$tmp/kv.json" --seq 1 --batch 4

finish cli

#!/usr/bin/env bash
# ONNX models end to end: tests/onnx/make_models.py writes them with python3-onnx's helper API.
# (a) a GPT-2 model as torch.onnx.export writes it (decomposed layer norms, gelu_new's tanh
#     pattern, attention as MatMul/Softmax over Reshape+Transpose heads with GPT-2's Where causal
#     mask; the opset 17 form with LayerNormalization and an additive mask; and the opset 18 form
#     with attention as torch's dynamo exporter writes it, its mask built from positions) plans, under
#     memory budgets that make it cut weights, with the same spec for every parameter as the
#     built-in GPT-2 builder given the same sizes (its Hugging Face config) in inference; in
#     training (the CLI's default) the builder's graph also has the labels and the cross_entropy
#     loss, which the export has not, and the loss keeps its logits for the backward, so the two
#     graphs are priced apart: there every operator of the export is one of the builder's (kind
#     and shape), the builder's others are the labels and the loss, and the export's plan under a
#     budget that binds cuts weights; a mask that is not causal is not fused into attention;
#     a LLaMA-style block (RMSNorm, exact GELU, Where, Expand) maps with no opaque operator
#     and `verify` runs its training step sharded, also with its padding fill marked as a buffer
#     (an input: three parameter gradients, not four); (b) a model with a custom-domain operator and a CumSum gets a plan
#     whose report names both, and `verify` says why it cannot run it, and names with an ESC and a
#     newline come out escaped in the plan's and show's tables; (c) hostile files:
#     truncated, a dim of 2^62, raw_data that disagrees with the shape, a cycle: a clear error each.
source "$(dirname "$0")/common.sh" "$1"

py=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import onnx, numpy' 2>/dev/null; then py=$p; break; fi
done
[ -n "$py" ] || { echo "SKIP: no python3 with onnx (Debian's python3-onnx)"; exit 0; }
"$py" "$here/../onnx/make_models.py" "$tmp" || { echo "FAIL: make_models.py"; exit 1; }
run "$tool" plan --model "$tmp/small.onnx" --mesh 2 --quiet --out "$tmp/small.json"
grep -q "built without ONNX" "$tmp/err" && { echo "SKIP: autoshard built without ONNX"; exit 0; }

# (a) The builder's GPT-2 of the same sizes, read from a Hugging Face config whose dropout
# probabilities are 0 (the ONNX file is exported in eval mode: it has no dropout).
cat >"$tmp/gpt2-config.json" <<'EOF'
{"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 512, "n_positions": 128,
 "resid_pdrop": 0, "embd_pdrop": 0, "attn_pdrop": 0}
EOF
compare() {  # compare ONNX_JSON BUILDER_JSON: every parameter's spec equal, some cut
  "$py" - "$1" "$2" <<'EOF'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
spec = lambda j: {o["name"]: o["output"] for o in j["operators"] if o["kind"] == "parameter"}
sa, sb = spec(a), spec(b)
if set(sa) != set(sb):
    sys.exit(f"parameters differ: only ONNX {sorted(set(sa) - set(sb))[:5]}, only builder {sorted(set(sb) - set(sa))[:5]}")
diff = [(n, sa[n], sb[n]) for n in sorted(sa) if sa[n] != sb[n]]
if diff:
    sys.exit(f"{len(diff)} parameters differ (name, ONNX, builder): {diff[:5]}")
if not any("S" in s for s in sa.values()):
    sys.exit("no parameter is cut: the budget did not bind, the comparison proves little")
if len(sa) != 28:
    sys.exit(f"{len(sa)} parameters, expected 28 (2 layers x 12 + wte, wpe, ln_f weight and bias)")
EOF
}
same_graph() {  # same_graph ONNX_PLAN BUILDER_PLAN: the builder's operators are the export's, plus labels and loss
  "$py" - "$1" "$2" <<'EOF'
import collections, json, sys
a, b = (collections.Counter((t["kind"], tuple(t["shape"])) for t in json.load(open(f))["tensors"]) for f in sys.argv[1:3])
if a - b:
    sys.exit(f"operators of the export the builder has not: {sorted(a - b)[:5]}")
if sorted(k for k, _ in (b - a).elements()) != ["cross_entropy", "input"]:
    sys.exit(f"the builder's operators beyond the export's: {sorted((b - a).elements())}, expected the labels and the loss")
if not any("S" in t["output"] for t in json.load(open(sys.argv[1]))["tensors"] if t["kind"] == "parameter"):
    sys.exit("no parameter is cut: the budget did not bind")
EOF
}
# The training budget binds with no gradient sync hidden (--gradient-overlap 0), in one step with
# nothing recomputed (hidden behind the backward, ZeRO-2 alone meets it; so do micro-batches).
# The builder's plan of each budget is made once and compared with each of the three ONNX forms
# (it was planned again for each: 6 of the test's 63 tool runs, 10 s of CPU under ASan).
budgets=("--mesh 2x4 --batch 2 --seq 128 --mode infer --memory-budget 1MiB"
         "--mesh 4 --batch 8 --seq 128 --mode infer --memory-budget 1MiB"
         "--mesh 2x4 --batch 2 --seq 128 --memory-budget 3MiB --gradient-overlap 0 --micro-batches 1 --recompute none")
for k in "${!budgets[@]}"; do
  # shellcheck disable=SC2086
  run "$tool" plan --model "$tmp/gpt2-config.json" ${budgets[$k]} --dtype bf16 --json --quiet --out "$tmp/builder-$k.json" &&
    cp "$tmp/out" "$tmp/builder-$k.out" || { bad "${budgets[$k]}: builder plan"; cat "$tmp/err"; }
done
for f in gpt2-block gpt2-block-fused gpt2-dynamo; do
  for k in "${!budgets[@]}"; do
    args=${budgets[$k]}
    [ -s "$tmp/builder-$k.out" ] || continue  # its builder plan failed, reported above
    # shellcheck disable=SC2086
    run "$tool" plan --model "$tmp/$f.onnx" $args --dtype bf16 --json --quiet --out "$tmp/p1.json" || { bad "$f $args: plan"; cat "$tmp/err"; continue; }
    case "$args" in
      *infer*) compare "$tmp/out" "$tmp/builder-$k.out" && ok || bad "$f $args: specs differ from the GPT-2 builder's" ;;
      *) same_graph "$tmp/p1.json" "$tmp/builder-$k.json" && ok || bad "$f $args: the training graph differs from the GPT-2 builder's" ;;
    esac
  done
done
# The attention, norms, GELU and linears were recognised: no opaque operator, the builder's kinds.
run "$tool" plan --model "$tmp/gpt2-block.onnx" --mesh 2 --batch 2 --seq 16 --json --quiet --out "$tmp/p3.json"
"$py" - "$tmp/out" <<'EOF' && ok || bad "gpt2-block.onnx: operator kinds"
import json, sys, collections
j = json.load(open(sys.argv[1]))
kinds = collections.Counter(o["kind"] for o in j["operators"])
want = {"attention": 2, "layer_norm": 5, "gelu": 2, "linear": 9, "split": 6, "embedding": 2, "dropout": 0,  # eval mode: the identity
        "where": 0, "softmax": 0, "matmul": 0, "tanh": 0, "mul": 0}
bad = {k: (kinds[k], n) for k, n in want.items() if kinds[k] != n}
if bad or j["opaque"]:
    sys.exit(f"kinds (got, want): {bad}, opaque: {j['opaque']}")
EOF
# One mask entry above the diagonal: not causal, so the scores stay matmul/where/softmax.
run "$tool" plan --model "$tmp/gpt2-block-leaky.onnx" --mesh 2 --batch 2 --seq 16 --json --quiet --out "$tmp/p4.json"
"$py" - "$tmp/out" <<'EOF' && ok || bad "gpt2-block-leaky.onnx: operator kinds"
import json, sys, collections
j = json.load(open(sys.argv[1]))
kinds = collections.Counter(o["kind"] for o in j["operators"])
want = {"attention": 0, "where": 2, "softmax": 2, "matmul": 4, "gelu": 2}
bad = {k: (kinds[k], n) for k, n in want.items() if kinds[k] != n}
if bad or j["opaque"]:
    sys.exit(f"kinds (got, want): {bad}, opaque: {j['opaque']}")
EOF

# torch's dynamo export of the attention (the mask built from positions at run time, q and k^T
# scaled apart, k^T over a 3-D view, the softmax guarded): the mask evaluates causal, and the
# plan has the opset 17 form's kinds, nothing opaque; it runs on 2 ranks.
run "$tool" plan --model "$tmp/gpt2-dynamo.onnx" --mesh 2 --batch 2 --seq 16 --json --quiet --out "$tmp/p5.json"
"$py" - "$tmp/out" <<'EOF' && ok || bad "gpt2-dynamo.onnx: operator kinds"
import json, sys, collections
j = json.load(open(sys.argv[1]))
kinds = collections.Counter(o["kind"] for o in j["operators"])
want = {"attention": 2, "layer_norm": 5, "gelu": 2, "linear": 9, "where": 0, "softmax": 0, "matmul": 0, "mul": 0, "transpose": 0}
bad = {k: (kinds[k], n) for k, n in want.items() if kinds[k] != n}
if bad or j["opaque"]:
    sys.exit(f"kinds (got, want): {bad}, opaque: {j['opaque']}")
EOF
run "$tool" verify --plan "$tmp/p5.json" --forward-only
[ $? -eq 0 ] && grep -q "^PASS" "$tmp/out" && ok || bad "gpt2-dynamo.onnx: verify: $(tail -3 "$tmp/out") $(cat "$tmp/err")"

# LLaMA's attention as torch's dynamo exporter writes it (rotary in the heads' layout from the
# inv_freq buffer, key/value heads repeated): one grouped-query attention, the rotary of q's
# and of k's projection at the buffer's base (Hugging Face's rotate_half), nothing opaque; it runs.
for f in llama-dynamo:500000 llama-dynamo-10k:10000; do
  run "$tool" plan --model "$tmp/${f%%:*}.onnx" --mesh 2 --batch 2 --seq 16 --quiet --no-svg --out "$tmp/l.json"
  "$py" - "$tmp/l.json" "${f##*:}" <<'EOF' && ok || bad "${f%%:*}.onnx: the fused attention: $(cat "$tmp/err")"
import collections, json, sys
g = json.load(open(sys.argv[1]))["graph"]["nodes"]
kinds = collections.Counter(n["kind"] for n in g)
want = {"attention": 1, "rotary": 2, "linear": 4, "opaque": 0, "matmul": 0, "softmax": 0, "expand": 0}
bad = {k: (kinds[k], n) for k, n in want.items() if kinds[k] != n}
att = [n for n in g if n["kind"] == "attention"][0]["attrs"]
rot = [n["attrs"] for n in g if n["kind"] == "rotary"]
if bad or att.get("heads") != 4 or att.get("kv_heads") != 2:
    sys.exit(f"kinds (got, want): {bad}, attention {att}")
if sorted(r["heads"] for r in rot) != [2, 4] or not all(r.get("rotary_half") and abs(r.get("rotary_base", 1e4) / float(sys.argv[2]) - 1) < 1e-5 for r in rot):
    sys.exit(f"rotaries {rot}, expected q's (4 heads) and k's (2) in rotate_half pairs at base {sys.argv[2]}")
EOF
  run "$tool" verify --plan "$tmp/l.json" --forward-only
  [ $? -eq 0 ] && grep -q "^PASS" "$tmp/out" && ok || bad "${f%%:*}.onnx: verify: $(tail -3 "$tmp/out") $(cat "$tmp/err")"
done

# Llama-3.1's scaled frequencies (rope_scaling llama3) in the buffer: the same fusion, the
# rotaries carrying the buffer's frequencies (transformers' formula, make_models.py's
# llama3_inv_freq); it runs. With YaRN's attention factor on cos and sin it stays unfused.
run "$tool" plan --model "$tmp/llama-dynamo-llama3.onnx" --mesh 2 --batch 2 --seq 16 --quiet --no-svg --out "$tmp/l3.json"
"$py" - "$tmp/l3.json" "$here/../onnx" <<'EOF' && ok || bad "llama-dynamo-llama3.onnx: the fused attention: $(cat "$tmp/err")"
import collections, json, sys
sys.path.insert(0, sys.argv[2])
from make_models import llama3_inv_freq
g = json.load(open(sys.argv[1]))["graph"]["nodes"]
kinds = collections.Counter(n["kind"] for n in g)
want = {"attention": 1, "rotary": 2, "linear": 4, "opaque": 0, "matmul": 0, "softmax": 0}
bad = {k: (kinds[k], n) for k, n in want.items() if kinds[k] != n}
want_f = llama3_inv_freq(500000.0, 16)
rot = [n["attrs"] for n in g if n["kind"] == "rotary"]
off = [r.get("rotary_frequencies") for r in rot
       if len(r.get("rotary_frequencies", [])) != 8 or any(abs(a / b - 1) > 1e-5 for a, b in zip(r["rotary_frequencies"], want_f))]
if bad or off:
    sys.exit(f"kinds (got, want): {bad}; rotary frequencies {off}, expected {list(want_f)}")
EOF
run "$tool" verify --plan "$tmp/l3.json" --forward-only
[ $? -eq 0 ] && grep -q "^PASS" "$tmp/out" && ok || bad "llama-dynamo-llama3.onnx: verify: $(tail -3 "$tmp/out") $(cat "$tmp/err")"
run "$tool" plan --model "$tmp/llama-dynamo-yarn.onnx" --mesh 2 --batch 2 --seq 16 --quiet --no-svg --out "$tmp/ly.json"
"$py" - "$tmp/ly.json" <<'EOF' && ok || bad "llama-dynamo-yarn.onnx: an attention factor must stay unfused: $(cat "$tmp/err")"
import collections, json, sys
kinds = collections.Counter(n["kind"] for n in json.load(open(sys.argv[1]))["graph"]["nodes"])
if kinds["rotary"] or kinds["attention"] or not kinds["softmax"]:
    sys.exit(f"kinds {dict(kinds)}")
EOF

# A LLaMA-style block: RMSNorm, the exact GELU, Where and Expand are kinds with kernels, so a
# sharded training step runs and matches the unsharded one.
run "$tool" plan --model "$tmp/rms-mlp.onnx" --mesh 2x2 --batch 4 --seq 8 --memory-budget 200KiB --json --quiet --out "$tmp/r.json"
"$py" - "$tmp/out" <<'EOF' && ok || bad "rms-mlp.onnx: operator kinds"
import json, sys, collections
j = json.load(open(sys.argv[1]))
kinds = collections.Counter(o["kind"] for o in j["operators"])
want = {"rms_norm": 1, "gelu_erf": 1, "linear": 2, "where": 1, "expand": 1, "reduce_mean": 1, "mul": 0, "sqrt": 0}
bad = {k: (kinds[k], n) for k, n in want.items() if kinds[k] != n}
if bad or j["opaque"]:
    sys.exit(f"kinds (got, want): {bad}, opaque: {j['opaque']}")
if not any("S" in o["output"] for o in j["operators"] if o["kind"] in ("where", "expand")):
    sys.exit("where / expand are not sharded: the verify below would prove little")
EOF
# Its RMSNorm adds the model's epsilon, the float32 constant 1e-6 the file holds, as written.
"$py" - "$tmp/r.json" <<'EOF' && ok || bad "rms-mlp.onnx: the norm's epsilon"
import json, sys
norms = [n["attrs"] for n in json.load(open(sys.argv[1]))["graph"]["nodes"] if n["kind"] == "rms_norm"]
if [a.get("epsilon") for a in norms] != [1e-06]:
    sys.exit(f"rms_norm attrs {norms}")
EOF
run "$tool" verify --plan "$tmp/r.json"
[ $? -eq 0 ] && grep -q "^PASS" "$tmp/out" && ok || bad "rms-mlp.onnx: verify: $(tail -3 "$tmp/out") $(cat "$tmp/err")"

# The same block as torch's dynamo exporter marks its initializers: the padding fill a BUFFER
# (value_info metadata), so an input, not a parameter; the rest PARAMETER. The step trains
# the three parameters only, sharded.
run "$tool" plan --model "$tmp/rms-mlp-buffers.onnx" --mesh 2x2 --batch 4 --seq 8 --memory-budget 200KiB --json --quiet --out "$tmp/rb.json"
"$py" - "$tmp/out" <<'EOF' && ok || bad "rms-mlp-buffers.onnx: the buffer"
import json, sys
j = json.load(open(sys.argv[1]))
kinds = {o["name"]: o["kind"] for o in j["operators"]}
if kinds.get("model.pad_fill") != "input" or kinds.get("model.norm.weight") != "parameter":
    sys.exit(f"pad_fill is {kinds.get('model.pad_fill')}, norm.weight {kinds.get('model.norm.weight')}")
if j["parameters"] != 64 + 2 * 64 * 256:
    sys.exit(f"{j['parameters']} parameters, expected {64 + 2 * 64 * 256} (norm, up, down; not the fill)")
EOF
run "$tool" verify --plan "$tmp/rb.json"
[ $? -eq 0 ] && grep -q "^PASS" "$tmp/out" && grep -q "3 parameter gradients" "$tmp/out" && ok ||
  bad "rms-mlp-buffers.onnx: verify: $(tail -3 "$tmp/out") $(cat "$tmp/err")"
# Its fill is [64] and the batch 64: held, the fill is no batch input, and the graph of one
# micro-batch of 32 keeps it [64] (taken for the batch, it was re-sized to [32], which the
# Where could not broadcast).
run "$tool" plan --model "$tmp/rms-mlp-buffers.onnx" --mesh 2 --batch 64 --seq 8 --micro-batches 2 --quiet --no-svg --out "$tmp/rb2.json"
[ $? -eq 0 ] && ok || bad "rms-mlp-buffers.onnx: 2 micro-batches of 32: $(cat "$tmp/err")"

# (b) Unmapped operators: a plan, and a report line naming each.
run "$tool" plan --model "$tmp/unmapped.onnx" --mesh 2x2 --batch 8 --quiet --out "$tmp/u.json" || { bad "unmapped: plan"; cat "$tmp/err"; }
grep -q '^opaque operators' "$tmp/out" && ok || bad "unmapped: no opaque section in: $(cat "$tmp/out")"
grep -Eq '^  fancy +com\.example\.FancyNorm -> RR$' "$tmp/out" && ok || bad "unmapped: FancyNorm not named"
grep -Eq '^  cumsum +CumSum -> RR$' "$tmp/out" && ok || bad "unmapped: CumSum not named"
run "$tool" verify --plan "$tmp/u.json"
[ $? -eq 1 ] && grep -q "opaque operator.*'fancy' ('com.example.FancyNorm')" "$tmp/err" && ok || bad "unmapped: verify: $(cat "$tmp/err")"

# Names with an ESC sequence and a newline (a MatMul's, the custom operator's name and op_type, a
# weight's) were printed raw in the report's tables: they recoloured the terminal and forged a
# line "c ...". Escaped as messages escape them, unquoted, the columns as for any name.
run "$tool" plan --model "$tmp/hostile-names.onnx" --mesh 2x2 --batch 8 --quiet --no-svg --out "$tmp/h.json" ||
  bad "hostile-names: plan: $(cat "$tmp/err")"
grep -Eq '^  fc1a\\x1B\[31mb\\x0Ac +linear +RR,RR -> RR$' "$tmp/out" && ok || bad "hostile-names: the MatMul's row: $(cat -v "$tmp/out")"
grep -Eq '^  fancya\\x1B\[31mb\\x0Ac +com\.example\.Fancya\\x1B\[31mb\\x0Ac -> RR$' "$tmp/out" && ok ||
  bad "hostile-names: the opaque row: $(cat -v "$tmp/out")"
hostile_free() {  # LABEL: no ESC and no line the names forged in $tmp/out
  if grep -q $'\x1b' "$tmp/out" || grep -Eq '^c( |$)' "$tmp/out"; then bad "$1: a raw name: $(cat -v "$tmp/out")"; else ok; fi
}
hostile_free "hostile-names: plan"
run "$tool" show --plan "$tmp/h.json"  # the tensors' table, the weight's name among them
grep -Eq '^  wa\\x1B\[31mb\\x0Ac +parameter ' "$tmp/out" && ok || bad "hostile-names: show's row of the weight: $(cat -v "$tmp/out")"
hostile_free "hostile-names: show --plan"
run "$tool" show --plan "$tmp/h.json" --tensor $'wa\x1b[31mb\nc'  # the tensor's heading
grep -q '^wa\\x1B\[31mb\\x0Ac: parameter' "$tmp/out" && ok || bad "hostile-names: show's heading: $(cat -v "$tmp/out") $(cat "$tmp/err")"
hostile_free "hostile-names: show --tensor"

# (c) Hostile files: exit 1 (never a crash), a message with the numbers.
expect_error() {  # FILE REGEX
  run "$tool" plan --model "$tmp/$1" --mesh 2 --batch 2 --quiet --out "$tmp/never.json"
  local rc=$?
  if [ $rc -ne 1 ] || ! grep -Eq "$2" "$tmp/err" || [ -e "$tmp/never.json" ]; then
    bad "$1: exit $rc, message: $(cat "$tmp/err")"
  else
    ok
  fi
}
expect_error bad-truncated.onnx "not an ONNX model: the protobuf does not parse"
expect_error bad-huge-dim.onnx "input 'x' dim 1 is 4611686018427387904, outside \[0, 2\^40\]"
expect_error bad-raw-data.onnx "initializer 'w' raw_data holds 224 bytes, but its shape \[8,8\] of f32 needs 256"
expect_error bad-cycle.onnx "the graph has a cycle.*'first' \('MatMul'\).*'second' \('Relu'\)"
# ONNX's inference names a failing node by its name only: an unnamed one is named by its index (issue 30 class 11).
expect_error bad-inference.onnx "node 1 '' \('Relu'\): ONNX shape inference failed: .*Inferred shape and existing shape differ in dimension 1: \(8\) vs \(9\)"
# Sizes of presets do not apply to an ONNX model; a symbolic dim without a size is named.
run "$tool" plan --model "$tmp/small.onnx" --hidden 64 --mesh 2 --out "$tmp/never.json"
[ $? -ne 0 ] && grep -q "only --batch, --seq and --dtype apply" "$tmp/err" && ok || bad "small.onnx --hidden: $(cat "$tmp/err")"
run "$tool" plan --model "$tmp/unmapped.onnx" --mesh 2 --out "$tmp/never.json"
[ $? -eq 1 ] && grep -q "graph input 'x' dim 0 is symbolic ('batch'); give its size" "$tmp/err" && ok || bad "unmapped.onnx without --batch: $(cat "$tmp/err")"
# A --batch or --seq the model has no symbolic dim for was ignored: small.onnx's fixed [4,8] was
# planned at batch 4 for --batch 7 without a word (the hostile-input audit, docs/reliability.md).
run "$tool" plan --model "$tmp/small.onnx" --batch 7 --mesh 2 --out "$tmp/never.json"
[ $? -eq 1 ] && grep -q "spec error: --batch 7 sizes nothing: no graph input of ONNX model '.*small.onnx' has a symbolic dim 0" "$tmp/err" &&
  [ ! -e "$tmp/never.json" ] && ok || bad "small.onnx --batch 7: $(cat "$tmp/err")"
run "$tool" plan --model "$tmp/unmapped.onnx" --batch 8 --seq 4 --mesh 2 --out "$tmp/never.json"
[ $? -eq 1 ] && grep -q "spec error: --seq 4 sizes nothing: .* has a symbolic dim 1" "$tmp/err" && ok || bad "unmapped.onnx --seq 4: $(cat "$tmp/err")"
# --kv-cache sizes the past of a decode step's cache inputs (tests/client/onnx_import_test.py
# plans such exports): a model with no rank-4 input has none to size.
run "$tool" plan --model "$tmp/small.onnx" --mode infer --kv-cache 5 --mesh 2 --out "$tmp/never.json"
[ $? -eq 1 ] && grep -q "spec error: --kv-cache 5 sizes nothing: .* has a symbolic dim 2 of four (a key/value cache)" "$tmp/err" &&
  [ ! -e "$tmp/never.json" ] && ok || bad "small.onnx --kv-cache 5: $(cat "$tmp/err")"
run "$tool" plan --model "$tmp/small.onnx" --batch 4 --mesh 2 --out "$tmp/same.json"  # its own size: fine
[ $? -eq 0 ] && ok || bad "small.onnx --batch 4: $(cat "$tmp/err")"

finish onnx_test

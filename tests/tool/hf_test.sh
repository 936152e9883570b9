#!/usr/bin/env bash
# Hugging Face directories end to end, for every supported model_type: `synth` writes a small
# directory (config.json + model.safetensors) from the published config in tests/data/hf, then
# `plan --model DIR` (under a memory budget tight enough to make it shard weights),
# `shard DIR --plan`, `show --plan` and `verify --plan` run on it with no other flag; every rank
# file is checked against the original with numpy, and every parameter's blocks against the
# plan's spec. Then the errors: weights that do not match the config, an unsupported model_type.
source "$(dirname "$0")/common.sh" "$1"
data="$here/../data/hf"

"$tool" --help | grep -q ' synth' || { echo "SKIP: no synth"; exit 0; }
small=(--layers 2 --hidden 64 --heads 4 --vocab 256)
for cfg in gpt2 bert-base-uncased roberta-base opt-125m pythia-160m bloom-560m qwen2-0.5b mistral-7b-v0.1 \
           llama-2-7b gemma-2b falcon-7b phi-3-mini-4k llama-3.1-8b; do
  d="$tmp/$cfg"
  extra=()
  case $cfg in qwen2*|mistral*|llama*|phi*) extra=(--kv-heads 2 --ffn 128);; bloom*) ;; *) extra=(--ffn 128);; esac
  # --mode infer: the base models (BertModel with its pooler) that the plans below are made for
  run "$tool" synth --model "$data/$cfg.json" "${small[@]}" "${extra[@]}" --mode infer --out "$d" || { bad "$cfg: synth"; cat "$tmp/err"; continue; }
  # The tightest budget the solver can meet (its own lower bound), with a quarter of the way to
  # data parallel's peak on top: weights must be cut.
  run "$tool" plan --model "$d" --mesh 2 --seq 8 --batch 2 --mode infer --memory-budget 1 --out "$d/x.json"
  low=$(grep -o 'peak memory per device is [^(]*([0-9]* bytes)' "$tmp/err" | grep -o '([0-9]*' | tr -d '(')
  [ -n "$low" ] || { bad "$cfg: no lower bound in: $(cat "$tmp/err")"; continue; }
  run "$tool" plan --model "$d" --mesh 2 --seq 8 --batch 2 --mode infer --json --quiet --out "$d/y.json" || { bad "$cfg: plan"; cat "$tmp/err"; continue; }
  dp=$(python3 -c "import json; print([b['peak_memory_bytes'] for b in json.load(open('$tmp/out'))['baselines'] if b['algo'] == 'data_parallel'][0])")
  run "$tool" plan --model "$d" --mesh 2 --seq 8 --batch 2 --mode infer --quiet --out "$d/plan.json" \
    --memory-budget $(( low + (dp - low) / 4 )) && ok || { bad "$cfg: plan under a budget"; cat "$tmp/err"; continue; }
  # The config file itself names the same model as its directory (one model type: the path is
  # the tool's, not the reader's): the same plan, operator for operator.
  if [ "$cfg" = gpt2 ]; then
    run "$tool" plan --model "$d/config.json" --mesh 2 --seq 8 --batch 2 --mode infer --quiet --out "$d/same.json" &&
      python3 -c "import json, sys; s = [[(t['name'], t['output']) for t in json.load(open(f))['tensors']] for f in sys.argv[1:]]; sys.exit(s[0] != s[1] or not s[0])" \
        "$d/y.json" "$d/same.json" && ok || bad "$cfg: plan --model DIR/config.json is not the plan of DIR"
  fi
  run "$tool" shard "$d" --plan "$d/plan.json" --out "$d/shards" --quiet && ok || { bad "$cfg: shard --plan"; cat "$tmp/err"; continue; }
  python3 "$here/check_shards.py" "$d/model.safetensors" "$d/shards" >/dev/null && ok || bad "$cfg: shards differ from the checkpoint"
  # Each parameter's blocks follow its spec in the plan: split where the spec shards, whole where it replicates.
  python3 - "$d/plan.json" "$d/shards/index.json" <<'EOF' && ok || bad "$cfg: blocks do not follow the plan"
import json, sys
plan, index = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))["tensors"]
split = 0
for op in plan["tensors"]:
    if op["kind"] != "parameter": continue
    name = op["name"] if op["name"] in index else op["name"].split(".", 1)[1]
    if name not in index: continue  # a tied table used twice is one tensor
    whole = all(s["shape"] == index[name]["global_shape"] for s in index[name]["shards"])
    assert whole == ("S" not in op["output"]), (name, op["output"], index[name]["shards"])
    split += not whole
assert split > 0, "the budget cut no weight"
EOF
  run "$tool" show --plan "$d/plan.json" && ok || bad "$cfg: show --plan"
  # The plan run on its ranks against the unsharded run, with the checkpoint's own weights
  # (converted to f64; the seeded values proved nothing more), its logits written out.
  run "$tool" verify --plan "$d/plan.json" --weights "$d" --outputs "$d/outputs.safetensors" && grep -q "^PASS" "$tmp/out" &&
    [ -s "$d/outputs.safetensors" ] && ok || { bad "$cfg: verify --weights"; tail -3 "$tmp/out" "$tmp/err"; }
done

# verify --weights/--tokens/--outputs: the values run are the checkpoint's and the tokens', and
# every refusal comes before a rank starts and leaves no file (tests/client/real_weights_test.py
# compares the outputs with transformers).
d="$tmp/gpt2"
python3 - "$d" "$tmp/wrong" <<'PY' && ok || bad "verify --outputs: the logits are not the checkpoint's model's"
import sys, os, numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file
def load(path):
    with safe_open(path, "np") as f:
        return load_file(path), f.metadata()
ck, _ = load(sys.argv[1] + "/model.safetensors")
ck = {("transformer." + k if not k.startswith("transformer.") and k != "lm_head.weight" else k): v for k, v in ck.items()}
out, meta = load(sys.argv[1] + "/outputs.safetensors")
assert sorted(out) == ["input.input_ids", "input.position_ids", "sharded.lm_head", "unsharded.lm_head"], sorted(out)
assert meta["outputs"] == "lm_head" and meta["passed"] == "true", meta
# GPT-2 by hand from the checkpoint (layer norms, causal attention, gelu_new, tied head): the logits
x = ck["transformer.wte.weight"].astype(np.float64)[out["input.input_ids"]] + ck["transformer.wpe.weight"].astype(np.float64)[out["input.position_ids"]]
def ln(x, p): m = x.mean(-1, keepdims=True); v = ((x - m) ** 2).mean(-1, keepdims=True); return (x - m) / np.sqrt(v + 1e-5) * ck[p + ".weight"] + ck[p + ".bias"]
def lin(x, p): return x @ ck[p + ".weight"].astype(np.float64) + ck[p + ".bias"]
B, S, H = x.shape
heads = 4
for i in range(2):
    p = f"transformer.h.{i}"
    q, k, v = np.split(lin(ln(x, p + ".ln_1"), p + ".attn.c_attn"), 3, axis=-1)
    q, k, v = (t.reshape(B, S, heads, H // heads).transpose(0, 2, 1, 3) for t in (q, k, v))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(H // heads) + np.triu(np.full((S, S), -np.inf), 1)
    a = np.exp(s - s.max(-1, keepdims=True)); a /= a.sum(-1, keepdims=True)
    x = x + lin((a @ v).transpose(0, 2, 1, 3).reshape(B, S, H), p + ".attn.c_proj")
    h = lin(ln(x, p + ".ln_2"), p + ".mlp.c_fc")
    h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
    x = x + lin(h, p + ".mlp.c_proj")
logits = ln(x, "transformer.ln_f") @ ck["transformer.wte.weight"].astype(np.float64).T
for name in ("unsharded.lm_head", "sharded.lm_head"):
    d = np.abs(out[name] - logits).max() / max(1, np.abs(logits).max())
    assert d < 1e-9, (name, d)
# Checkpoints that are not the plan's model: a tensor missing, one of another shape.
os.makedirs(sys.argv[2] + "/missing"); os.makedirs(sys.argv[2] + "/shape")
save_file({k: v for k, v in ck.items() if k != "transformer.h.1.mlp.c_fc.bias"}, sys.argv[2] + "/missing/model.safetensors")
save_file({k: (np.ascontiguousarray(v.T) if k == "transformer.h.0.mlp.c_fc.weight" else v) for k, v in ck.items()},
          sys.argv[2] + "/shape/model.safetensors")
PY
run "$tool" verify --plan "$d/plan.json" --weights "$tmp/wrong/missing" --outputs "$tmp/wrong/o.safetensors"
[ $? -eq 1 ] && grep -q "1 parameter is not in the checkpoint: 'transformer.h.1.mlp.c_fc.bias'" "$tmp/err" && ! grep -q running "$tmp/err" &&
  [ ! -e "$tmp/wrong/o.safetensors" ] && ok || bad "verify --weights of a checkpoint missing a tensor: $(cat "$tmp/err")"
run "$tool" verify --plan "$d/plan.json" --weights "$tmp/wrong/shape"
[ $? -eq 1 ] && grep -qF "1 differs: 'transformer.h.0.mlp.c_fc.weight' (checkpoint [128,64] f32, config [64,128] f32)" "$tmp/err" && ok ||
  bad "verify --weights of a tensor of another shape: $(cat "$tmp/err")"
# Token ids: given ones are run (their batch and sequence the run's); one past the vocabulary is
# refused naming it, and the outputs file of an earlier run stays whole.
echo '[[5, 6, 7, 8], [255, 0, 1, 2]]' > "$tmp/tokens.json"
run "$tool" verify --plan "$d/plan.json" --weights "$d" --tokens "$tmp/tokens.json" --outputs "$tmp/tok.safetensors" && grep -q "^PASS" "$tmp/out" &&
  python3 -c "
import sys
from safetensors.numpy import load_file
t = load_file(sys.argv[1])
assert t['input.input_ids'].tolist() == [[5, 6, 7, 8], [255, 0, 1, 2]], t['input.input_ids']
assert t['unsharded.lm_head'].shape == (2, 4, 256), t['unsharded.lm_head'].shape" "$tmp/tok.safetensors" && ok ||
  bad "verify --tokens: $(cat "$tmp/err")"
sum=$(md5sum < "$tmp/tok.safetensors")
echo '[[5, 6, 7, 8], [256, 0, 1, 2]]' > "$tmp/tokens.json"
run "$tool" verify --plan "$d/plan.json" --weights "$d" --tokens "$tmp/tokens.json" --outputs "$tmp/tok.safetensors"
[ $? -eq 1 ] && grep -q "source 'input_ids' holds 256 at \[1,0\], outside 0 to 255: 'transformer.wte' (embedding) looks it up in a table of 256 rows" "$tmp/err" &&
  [ "$(md5sum < "$tmp/tok.safetensors")" = "$sum" ] && ok || bad "verify --tokens past the vocabulary: $(cat "$tmp/err")"
echo '[[5, 6, 7], [1, 2]]' > "$tmp/ragged.json"
run "$tool" verify --plan "$d/plan.json" --tokens "$tmp/ragged.json"
[ $? -eq 1 ] && grep -q "sequence 1 has 2 ids, the first 3" "$tmp/err" && ok || bad "verify --tokens ragged: $(cat "$tmp/err")"
echo '[[5, 6, 7, 8]]' > "$tmp/one.json"
run "$tool" verify --plan "$d/plan.json" --tokens "$tmp/one.json" --batch 2
[ $? -eq 1 ] && grep -q "holds 1 sequence of 4 ids, but --batch 2 --seq 4 were given" "$tmp/err" && ok || bad "verify --tokens with --batch: $(cat "$tmp/err")"
# A training step of 2 micro-batches of 1 runs the global batch of 2: tokens of 1 are refused
# naming both, before the memory check (--max-memory 1KiB would refuse the run otherwise), and
# tokens of 2 are run.
run "$tool" plan --model "$d" --mesh 2 --seq 4 --batch 2 --mode train --micro-batches 2 --quiet --no-svg --out "$tmp/micro.json" &&
run "$tool" verify --plan "$tmp/micro.json" --tokens "$tmp/one.json" --max-memory 1KiB
[ $? -eq 1 ] && grep -q "holds 1 sequence, but the training step of .* runs 2 micro-batches of 1 sequence: give its whole global batch, 2 sequences" "$tmp/err" &&
  ! grep -q "verify would need" "$tmp/err" && ok || bad "verify --tokens of a micro-batched training plan: $(cat "$tmp/err")"
echo '[[5, 6, 7, 8], [9, 10, 11, 12]]' > "$tmp/two.json"
run "$tool" verify --plan "$tmp/micro.json" --tokens "$tmp/two.json" && grep -q "^PASS" "$tmp/out" && ok ||
  bad "verify --tokens of a micro-batched training plan's global batch: $(cat "$tmp/err")"
# The memory check counts the checkpoint's weights as they are read and the outputs kept.
run "$tool" verify --plan "$d/plan.json" --weights "$d" --outputs "$tmp/mem.safetensors" --max-memory 1MiB
[ $? -eq 1 ] && grep -q "the outputs kept and the sources' making [0-9.]* KiB" "$tmp/err" && [ ! -e "$tmp/mem.safetensors" ] && ok ||
  bad "verify --weights --max-memory: $(cat "$tmp/err")"
# Refused at f64, the f32 offered is what f32 takes, the kept outputs at f32 too: what a refused
# f32 run of the same check needs.
run "$tool" verify --plan "$d/plan.json" --weights "$d" --outputs "$tmp/mem.safetensors" --max-memory 1KiB --dtype f64
offer=$(grep -o 'use --dtype f32 (about [0-9.]* [KMGT]*i*B)' "$tmp/err" | grep -o '[0-9.]* [KMGT]*i*B')
run "$tool" verify --plan "$d/plan.json" --weights "$d" --outputs "$tmp/mem.safetensors" --max-memory 1KiB --dtype f32
need=$(grep -o 'verify would need about [0-9.]* [KMGT]*i*B' "$tmp/err" | grep -o '[0-9.]* [KMGT]*i*B')
[ -n "$offer" ] && [ "$offer" = "$need" ] && ok || bad "verify --dtype f64 refused offers f32 at $offer, but f32 needs $need"
# --outputs never writes over the checkpoint (or the plan).
sum=$(md5sum < "$d/model.safetensors")
run "$tool" verify --plan "$d/plan.json" --weights "$d" --outputs "$d/model.safetensors"
[ $? -eq 1 ] && grep -q "refusing to overwrite its input" "$tmp/err" && [ "$(md5sum < "$d/model.safetensors")" = "$sum" ] && ok ||
  bad "verify --outputs over the checkpoint: $(cat "$tmp/err")"

# Llama-3.1's rope_scaling survives synth (the rotaries' frequencies are its llama3 ones: the plan
# of the written directory has them, and verify above ran them).
python3 - "$tmp/llama-3.1-8b" <<'EOF' && ok || bad "llama-3.1-8b: rope_scaling after synth"
import json, sys
c = json.load(open(sys.argv[1] + "/config.json"))["rope_scaling"]
assert c["rope_type"] == "llama3" and c["factor"] == 8.0 and c["original_max_position_embeddings"] == 8192, c
rot = [n["attrs"] for n in json.load(open(sys.argv[1] + "/plan.json"))["graph"]["nodes"] if n["kind"] == "rotary"]
assert rot and all(len(r.get("rotary_frequencies", [])) == 8 for r in rot), rot
EOF

# Pythia's partial rotary survives synth: rotary_pct 0.25 written back, the rotaries of the
# written directory's plan turning int(16 x 0.25) = 4 of each head's 16 dims (verify above ran them).
python3 - "$tmp/pythia-160m" <<'EOF' && ok || bad "pythia-160m: rotary_pct after synth"
import json, sys
assert json.load(open(sys.argv[1] + "/config.json"))["rotary_pct"] == 0.25
rot = [n["attrs"] for n in json.load(open(sys.argv[1] + "/plan.json"))["graph"]["nodes"] if n["kind"] == "rotary"]
assert rot and all(r.get("rotary_dims") == 4 for r in rot), rot
EOF

# The norms' epsilon survives synth: Qwen2-0.5B's rms_norm_eps 1e-6 and bert-base-uncased's
# layer_norm_eps 1e-12 written back, every norm of the written directory's plan adding it (verify
# above ran them so); gpt2's 1e-5, the default, is written and not said on a norm.
python3 - "$tmp" <<'EOF' && ok || bad "the norms' epsilon after synth"
import json, sys
for d, key, eps in (("qwen2-0.5b", "rms_norm_eps", 1e-6), ("bert-base-uncased", "layer_norm_eps", 1e-12), ("gpt2", "layer_norm_epsilon", 1e-5)):
    assert json.load(open(f"{sys.argv[1]}/{d}/config.json"))[key] == eps, (d, key)
    norms = [n.get("attrs", {}) for n in json.load(open(f"{sys.argv[1]}/{d}/plan.json"))["graph"]["nodes"] if n["kind"].endswith("_norm")]
    assert norms and all(a.get("epsilon", 1e-5) == eps for a in norms), (d, norms)
    assert (eps == 1e-5) == all("epsilon" not in a for a in norms), (d, norms)
EOF
# Sliding windows survive synth: Mistral-7B's 4096 and Phi-3-mini-4k's 2047 written back, every
# attention of the written directory's plan carrying it (kept above the sequence: it is the model).
python3 - "$tmp/mistral-7b-v0.1" 4096 "$tmp/phi-3-mini-4k" 2047 <<'EOF' && ok || bad "mistral, phi3: sliding_window after synth"
import json, sys
for d, w in ((sys.argv[1], int(sys.argv[2])), (sys.argv[3], int(sys.argv[4]))):
    assert json.load(open(d + "/config.json"))["sliding_window"] == w, d
    att = [n["attrs"] for n in json.load(open(d + "/plan.json"))["graph"]["nodes"] if n["kind"] == "attention"]
    assert len(att) == 2 and all(a.get("window") == w for a in att), (d, att)
EOF
# Qwen2's window on the layers from max_window_layers on, shorter than the sequence: synth writes
# it back, the plan's second layer alone slides, and verify runs it on 2 ranks.
mkdir -p "$tmp/qwen2-window"
python3 - "$data/qwen2-0.5b.json" "$tmp/qwen2-window/in.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(use_sliding_window=True, sliding_window=3, max_window_layers=1)
json.dump(c, open(sys.argv[2], "w"))
EOF
run "$tool" synth --model "$tmp/qwen2-window/in.json" "${small[@]}" --kv-heads 2 --ffn 128 --mode infer --out "$tmp/qwen2-window/m" &&
run "$tool" plan --model "$tmp/qwen2-window/m" --mesh 2 --seq 8 --batch 2 --mode infer --quiet --out "$tmp/qwen2-window/plan.json" &&
run "$tool" verify --plan "$tmp/qwen2-window/plan.json" && grep -q "^PASS" "$tmp/out" &&
python3 - "$tmp/qwen2-window" <<'EOF' && ok || { bad "qwen2: sliding window after synth"; cat "$tmp/err"; }
import json, sys
c = json.load(open(sys.argv[1] + "/m/config.json"))
assert c["use_sliding_window"] is True and c["sliding_window"] == 3 and c["max_window_layers"] == 1, c
att = [n["attrs"].get("window", 0) for n in json.load(open(sys.argv[1] + "/plan.json"))["graph"]["nodes"] if n["kind"] == "attention"]
assert att == [0, 3], att
EOF
# A layer_types names its sliding layers one by one: --layers of another count is refused, not guessed.
python3 - "$tmp/qwen2-window/in.json" "$tmp/qwen2-window/typed.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(num_hidden_layers=3, layer_types=["full_attention", "sliding_attention", "sliding_attention"])
json.dump(c, open(sys.argv[2], "w"))
EOF
[ "$(run_rc "$tool" plan --model "$tmp/qwen2-window/typed.json" --layers 2 "${small[@]:2}" --kv-heads 2 --ffn 128 --mesh 2 --seq 8 --batch 2 --quiet --out "$tmp/qwen2-window/t.json")" = 1 ] &&
  grep -q "layer_types names the sliding-window layers of 3 layers one by one" "$tmp/err" && ok || bad "qwen2: --layers against layer_types: $(cat "$tmp/err")"

# A rope type autoshard does not compute (Phi-3's older su here) plans as its model, the
# rotaries at base^(-2i/D), with a note; synth writes the member back as given. (It was refused
# before it was read, then read as the default without a word.) YaRN's context extension is
# computed (docs/graph.md): no note, its attention factor on the rotaries, and synth writes it
# back as given too.
mkdir -p "$tmp/yarn" "$tmp/su"
python3 - "$data/llama-3.1-8b.json" "$tmp" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
json.dump(c, open(sys.argv[2] + "/yarn/config.json", "w"))
c["rope_scaling"] = {"rope_type": "su", "factor": 4.0, "original_max_position_embeddings": 32768}
json.dump(c, open(sys.argv[2] + "/su/config.json", "w"))
EOF
run "$tool" plan --model "$tmp/su" --layers 1 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 256 --seq 16 --mesh 2 \
  --quiet --no-svg --out "$tmp/su-plan.json" && grep -q "^note: rope type 'su' (rope_scaling) is not computed: the rotaries turn at rope_theta^(-2i/D)" "$tmp/err" &&
  ok || bad "su: plan: $(head -c 300 "$tmp/err")"
run "$tool" synth --model "$tmp/su" --layers 1 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 256 --out "$tmp/su-synth" &&
  python3 -c "import json, sys; c = json.load(open(sys.argv[1]))['rope_scaling']; assert c == {'rope_type': 'su', 'factor': 4.0, 'original_max_position_embeddings': 32768}, c" \
    "$tmp/su-synth/config.json" && ok || bad "su: synth: $(head -c 300 "$tmp/err")"
run "$tool" plan --model "$tmp/yarn" --layers 1 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 256 --seq 16 --mesh 2 \
  --quiet --no-svg --out "$tmp/yarn-plan.json" && ! grep -q "note: rope type" "$tmp/err" &&
  python3 -c "import json, sys; r = [n for n in json.load(open(sys.argv[1]))['graph']['nodes'] if n['kind'] == 'rotary']; assert r and all(abs(n['attrs']['scale'] - 1.138629436111989) < 1e-15 for n in r), r" \
    "$tmp/yarn-plan.json" && ok || bad "yarn: plan: $(head -c 300 "$tmp/err")"
run "$tool" synth --model "$tmp/yarn" --layers 1 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 256 --out "$tmp/yarn-synth" &&
  python3 -c "import json, sys; c = json.load(open(sys.argv[1]))['rope_scaling']; assert c == {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 32768}, c" \
    "$tmp/yarn-synth/config.json" && ok || bad "yarn: synth: $(head -c 300 "$tmp/err")"

# A checkpoint split over two files with an index (as large models ship) plans and shards the same.
d="$tmp/qwen2-0.5b"
mkdir -p "$tmp/split" && cp "$d/config.json" "$tmp/split/"
python3 - "$d/model.safetensors" "$tmp/split" <<'EOF'
import json, sys
from safetensors.numpy import load_file, save_file
t = load_file(sys.argv[1]); names = sorted(t)
parts = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
for f, ns in parts.items(): save_file({n: t[n] for n in ns}, f"{sys.argv[2]}/{f}", metadata={"format": "pt"})
json.dump({"metadata": {}, "weight_map": {n: f for f, ns in parts.items() for n in ns}},
          open(f"{sys.argv[2]}/model.safetensors.index.json", "w"))
EOF
run "$tool" plan --model "$tmp/split" --mesh 2 --seq 8 --batch 2 --quiet --out "$tmp/split/plan.json" && ok || bad "plan of an indexed checkpoint: $(cat "$tmp/err")"
run "$tool" shard "$tmp/split" --plan "$d/plan.json" --out "$tmp/split/shards" --quiet && ok || bad "shard of an indexed checkpoint: $(cat "$tmp/err")"
python3 "$here/check_shards.py" "$d/model.safetensors" "$tmp/split/shards" >/dev/null && ok || bad "indexed checkpoint's shards differ"
# The config's torch_dtype must be the weights' dtype; --dtype plans in another one on purpose.
sed -i 's/"float32"/"bfloat16"/' "$tmp/split/config.json"
run "$tool" plan --model "$tmp/split" --mesh 2 --out "$tmp/never.json"
[ $? -eq 1 ] && grep -q "'model.embed_tokens.weight' (checkpoint \[256,64\] f32, config \[256,64\] bf16)" "$tmp/err" && ok || bad "dtype mismatch: $(cat "$tmp/err")"
run "$tool" plan --model "$tmp/split" --mesh 2 --seq 8 --batch 2 --dtype bf16 --quiet --out "$tmp/split/bf16.json" && ok || bad "--dtype over the checkpoint's: $(cat "$tmp/err")"
# A tied head the checkpoint saved anyway is the embedding, not an extra tensor.
python3 - "$d/model.safetensors" <<'EOF'
import sys
from safetensors.numpy import load_file, save_file
t = load_file(sys.argv[1]); t["lm_head.weight"] = t["model.embed_tokens.weight"].copy()
save_file(t, sys.argv[1], metadata={"format": "pt"})
EOF
run "$tool" plan --model "$d" --mesh 2 --seq 8 --batch 2 --quiet --out "$tmp/tied.json" && ok || bad "saved tied head: $(cat "$tmp/err")"

# bert-base-uncased as Hugging Face ships it (BertForPreTraining): "bert."-prefixed names, the
# legacy LayerNorm.gamma/.beta spelling, the pooler, the masked-LM head (its decoder saved beside
# the word embeddings it is tied to) and the next-sentence head. Both modes plan it: inference
# (BertModel) notes the cls.* head unused, training (BertForMaskedLM) the pooler and
# cls.seq_relationship; shard --plan finds the gamma/beta tensors.
d="$tmp/bert-pt"
run "$tool" synth --model "$data/bert-base-uncased.json" "${small[@]}" --ffn 128 --mode infer --out "$d" || bad "bert-pt: synth"
python3 - "$d/model.safetensors" <<'EOF'
import sys, numpy as np
from safetensors.numpy import load_file, save_file
t = load_file(sys.argv[1]); out = {}
for n, v in t.items():
    m = "bert." + n if not n.startswith("bert.") else n
    out[m.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")] = v
H, V = 64, 256
full = lambda v, *s: np.full(s, v, np.float32)
out.update({"cls.predictions.bias": full(0.5, V), "cls.predictions.transform.dense.weight": full(0.01, H, H),
            "cls.predictions.transform.dense.bias": full(0, H), "cls.predictions.transform.LayerNorm.gamma": full(1, H),
            "cls.predictions.transform.LayerNorm.beta": full(0, H), "cls.seq_relationship.weight": full(0.1, 2, H),
            "cls.seq_relationship.bias": full(0, 2)})
out["cls.predictions.decoder.weight"] = out["bert.embeddings.word_embeddings.weight"].copy()
out["cls.predictions.decoder.bias"] = out["cls.predictions.bias"].copy()
save_file(out, sys.argv[1], metadata={"format": "pt"})
EOF
run "$tool" plan --model "$d" --mesh 2 --seq 8 --batch 2 --mode infer --quiet --out "$d/infer.json" \
  && grep -q "note: 9 tensors of '$d' belong to task heads this model does not build, and are not planned: 'cls.predictions.bias'" "$tmp/err" \
  && ok || bad "pre-training BERT, inference: $(cat "$tmp/err")"
run "$tool" plan --model "$d" --mesh 2 --seq 8 --batch 2 --mode train --quiet --out "$d/train.json" \
  && grep -q "note: 4 tensors of '$d' belong to task heads this model does not build, and are not planned: 'bert.pooler.dense.bias', 'bert.pooler.dense.weight', 'cls.seq_relationship.bias', 'cls.seq_relationship.weight'$" "$tmp/err" \
  && ok || bad "pre-training BERT, training: $(cat "$tmp/err")"
run "$tool" shard "$d" --plan "$d/train.json" --out "$d/shards" --quiet && python3 - "$d/shards/index.json" <<'EOF' && ok || bad "pre-training BERT, shard --plan: $(cat "$tmp/err")"
import json, sys
index = json.load(open(sys.argv[1]))["tensors"]
assert "bert.encoder.layer.1.output.LayerNorm.gamma" in index and "cls.seq_relationship.weight" in index, sorted(index)[:8]
EOF
python3 "$here/check_shards.py" "$d/model.safetensors" "$d/shards" >/dev/null && ok || bad "pre-training BERT: shards differ from the checkpoint"
run "$tool" verify --plan "$d/train.json" && grep -q "^PASS" "$tmp/out" && ok || bad "pre-training BERT: verify --plan: $(tail -3 "$tmp/out" "$tmp/err")"
# A layer the config lacks is a mismatch, never a task head.
python3 - "$d/model.safetensors" <<'EOF'
import sys
from safetensors.numpy import load_file, save_file
t = load_file(sys.argv[1]); t["bert.encoder.layer.2.output.dense.bias"] = t["bert.encoder.layer.1.output.dense.bias"].copy()
save_file(t, sys.argv[1], metadata={"format": "pt"})
EOF
run "$tool" plan --model "$d" --mesh 2 --mode infer --out "$tmp/never.json"
[ $? -eq 1 ] && grep -q "1 checkpoint tensor is not a parameter: 'bert.encoder.layer.2.output.dense.bias'" "$tmp/err" && ok || bad "extra layer in a pre-training BERT: $(cat "$tmp/err")"

# Weights that do not match the config: the error names the first tensors that differ.
d="$tmp/gpt2"
python3 - "$d/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1])); c["n_layer"] = 3; c["n_inner"] = 96
json.dump(c, open(sys.argv[1], "w"))
EOF
run "$tool" plan --model "$d" --mesh 2 --out "$tmp/never.json"
[ $? -eq 1 ] && grep -q "do not match its config.json" "$tmp/err" && grep -q "'h.0.mlp.c_fc.weight' (checkpoint \[64,128\] f32, config \[64,96\] f32)" "$tmp/err" \
  && grep -q "not in the checkpoint: 'transformer.h.2.ln_1.weight'" "$tmp/err" && ok || bad "mismatched weights: $(cat "$tmp/err")"
test ! -e "$tmp/never.json" && ok || bad "a failed plan wrote its output"
# An unsupported model_type names the supported ones.
mkdir -p "$tmp/t5" && echo '{"model_type": "t5", "d_model": 512}' >"$tmp/t5/config.json"
run "$tool" plan --model "$tmp/t5" --mesh 2
[ $? -eq 1 ] && grep -q "model_type 't5' is not supported (supported: gpt2, bert, roberta, llama, mistral, qwen2, gemma, phi3, opt, gpt_neox, bloom, falcon)" "$tmp/err" \
  && ok || bad "unsupported model_type: $(cat "$tmp/err")"
# synth keeps the model: every field of the template that no option changes is written back as
# it was (the numbers PyTorch computes with: rope_theta, sliding_window, the norm epsilon, the
# token ids, the context), the fields the options change are replaced (a spelling of one
# not left beside another), and the dtype is the weights'.
python3 - "$data/mistral-7b-v0.1.json" "$tmp/tmpl.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d.update(rope_theta=500000.0, rms_norm_eps=2e-6, sliding_window=1024, bos_token_id=1, eos_token_id=2,
         initializer_range=0.02, use_cache=True, attention_dropout=0.0, n_head=32, dtype="bfloat16")
json.dump(d, open(sys.argv[2], "w"))
PY
run "$tool" synth --model "$tmp/tmpl.json" --layers 2 --hidden 64 --heads 8 --kv-heads 2 --ffn 128 --vocab 256 --seq 16 --out "$tmp/kept" && ok || bad "synth from a full template: $(cat "$tmp/err")"
python3 - "$tmp/tmpl.json" "$tmp/kept/config.json" <<'PY' && ok || bad "synth drops or changes template fields"
import json, sys
t, o = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
changed = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 2,
           "intermediate_size": 128, "vocab_size": 256, "torch_dtype": "float32", "dtype": "float32"}
for k, v in t.items():
    if k == "n_head":
        assert k not in o, "n_head left beside num_attention_heads"
        continue
    assert o[k] == changed.get(k, v), (k, o.get(k), changed.get(k, v))
for k, v in changed.items():
    assert o[k] == v, (k, o[k])
PY
# A preset with as many key/value heads as heads keeps it under --heads (llama-7b has 32 and 32).
run "$tool" synth --model llama-7b --layers 1 --hidden 64 --heads 8 --ffn 128 --vocab 256 --out "$tmp/l7" && ok || bad "synth --model llama-7b --heads 8: $(cat "$tmp/err")"
json_field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$@"; }
[ "$(json_field "$tmp/l7/config.json" num_key_value_heads)" = 8 ] && [ "$(json_field "$tmp/l7/config.json" eos_token_id)" = 2 ] \
  && [ "$(json_field "$tmp/l7/config.json" rms_norm_eps)" = 1e-05 ] && ok || bad "llama-7b --heads 8: $(cat "$tmp/l7/config.json")"
run "$tool" synth --model gpt2 --layers 1 --hidden 64 --heads 4 --vocab 256 --out "$tmp/g2" && ok || bad "synth gpt2"
[ "$(json_field "$tmp/g2/config.json" eos_token_id)" = 255 ] && [ "$(json_field "$tmp/g2/config.json" bos_token_id)" = 255 ] \
  && ok || bad "gpt2's config names its end-of-text token: $(cat "$tmp/g2/config.json")"

# synth never writes over the config it reads.
run "$tool" synth --model "$tmp/qwen2-0.5b" --layers 1 --out "$tmp/qwen2-0.5b"
[ $? -eq 1 ] && grep -q "overwrite its input" "$tmp/err" && ok || bad "synth over its input: $(cat "$tmp/err")"

finish hf

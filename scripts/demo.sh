#!/usr/bin/env bash
# The main job, from a fresh machine: set up, build the autoshard tool (release), then
# plan GPT-2 training on a 2x4 mesh, shard a GPT-2-layout checkpoint by a solved plan into
# 8 rank files, and verify a plan numerically on 8 Gloo ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
echo "building the autoshard tool (release) ..."
cmake --preset release >/dev/null
cmake --build --preset release -j "$jobs" --target autoshard_tool >/dev/null
built=$(date +%s)
tool=build/release/tools/autoshard
out=${AUTOSHARD_DEMO_OUT:-out/demo}
rm -rf "$out"
mkdir -p "$out"
mesh=(--mesh 2x4 --inter-bw 25e9 --intra-bw 300e9)

echo
echo "== 1. Auto-shard GPT-2 (124M) for training on a 2x4 mesh: 2 nodes x 4 GPUs,"
echo "==    inter-node 25 GB/s, intra-node 300 GB/s; the ILP's plan next to the baselines"
"$tool" plan --model gpt2 "${mesh[@]}" --mode train --out "$out/gpt2-plan.json"

echo
echo "== 2. How the first layer's fused QKV weight would sit on the mesh, column-parallel in each node"
"$tool" show --mesh 2x4 --shape 768,2304 --spec "[R,S(1)]" --svg "$out/c_attn.svg"
echo
echo "== 3. Moving it to a row split across nodes: the redistribute plan and its modeled cost"
"$tool" explain "${mesh[@]}" --shape 768,2304 --dtype f32 --from "[R,S(1)]" --to "[S(0),R]"

small=(--model gpt2 --layers 2 --hidden 256 --heads 8 --vocab 8192 --seq 256 --batch 16)
echo
echo "== 4. A small GPT-2 (2 layers, width 256) with a 30 MiB-per-device budget, so weights must be split,"
echo "==    and a checkpoint of exactly its layout (Hugging Face names, seeded values)"
"$tool" plan "${small[@]}" "${mesh[@]}" --mode train --memory-budget 30MiB --out "$out/small-plan.json" --quiet \
  | sed -n '/^modeled step/,/^$/p'
"$tool" synth "${small[@]}" --out "$out/checkpoint"
echo
echo "== 5. Shard the checkpoint by the plan into one safetensors file per rank"
"$tool" shard "$out/checkpoint/model.safetensors" --plan "$out/small-plan.json" --out "$out/shards" --quiet
echo
echo "== 6. Verify the plan numerically: 8 Gloo ranks each compute only their shards and run the"
echo "==    plan's collectives; every operator is compared with the unsharded run"
"$tool" verify --plan "$out/small-plan.json"
echo
echo "demo done in $(( $(date +%s) - built )) s after setup and build ($(( built - start )) s). Files in $out/:"
echo "  gpt2-plan.json (the plan), gpt2-plan.dot / .svg (the graph coloured by spec), c_attn.svg (a block map),"
echo "  small-plan.json (the small GPT-2's plan, verified above), checkpoint/ (a GPT-2-layout checkpoint),"
echo "  shards/rank-0..7.safetensors and shards/index.json"

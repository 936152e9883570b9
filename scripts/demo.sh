#!/usr/bin/env bash
# The main job, from a fresh machine: set up, build the autoshard tool (release), and run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake --preset release >/dev/null
cmake --build --preset release -j "$jobs" --target autoshard_tool >/dev/null
tool=build/release/tools/autoshard
out=${AUTOSHARD_DEMO_OUT:-out/demo}
mkdir -p "$out"

echo "== 1. A GPT-2 attention weight (transformer.h.0.attn.c_attn, [768,2304] f32) on a 2x4 mesh"
echo "==    (2 nodes x 4 GPUs, inter-node 25 GB/s, intra-node 300 GB/s), column-parallel inside each node:"
"$tool" show --mesh 2x4 --shape 768,2304 --spec "[R,S(1)]" --svg "$out/c_attn.svg"
echo
echo "== 2. Moving it to a row split across nodes: the redistribute plan, each rank's shard, the modeled cost"
"$tool" explain --mesh 2x4 --inter-bw 25e9 --intra-bw 300e9 --shape 768,2304 --dtype f32 \
  --from "[R,S(1)]" --to "[S(0),R]"
echo
echo "demo done: the block map picture is $out/c_attn.svg"

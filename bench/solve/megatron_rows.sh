#!/usr/bin/env bash
# Megatron-LM's published weak-scaling runs without pipelines (Narayanan et al. 2021, Table 1:
# GPT, sequence 2048, vocabulary 51,200, A100-80GB, 8 per node on NVLink, 8 x 200 Gb/s
# InfiniBand per node), priced by `autoshard plan` as they ran: `--algo megatron --tp T`, full
# recomputation, the unfused attention core of 2021. Prints per row the published and the
# modeled TFLOP/s per GPU (eq. 3) and, beside them, the planner's own plan on the same mesh
# and prices (step, TFLOP/s, MFU, peak memory, parallelism). Nothing is asserted: the figures
# are measured, and docs/training.md quotes them.
#   bash bench/solve/megatron_rows.sh [path/to/autoshard]
set -euo pipefail
tool=${1:-build/release/tools/autoshard}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# name heads hidden layers nodes tp batch published
rows=(
  "1.7B 24 2304 24 4 1 512 137"
  "3.6B 32 3072 30 8 2 512 138"
  "7.5B 32 4096 36 16 4 512 142"
  "18.4B 48 6144 40 32 8 1024 135"
)
printf '%-6s %-9s %9s %9s %7s | %-10s %9s %7s %10s  %s\n' model mesh published megatron diff plan step TFLOP/s "MFU" "peak" parallelism
for row in "${rows[@]}"; do
  read -r name heads hidden layers nodes tp batch published <<<"$row"
  common=(--model gpt2 --heads "$heads" --hidden "$hidden" --layers "$layers" --seq 2048 --vocab 51200 --batch "$batch"
          --mesh "${nodes}x8" --device a100-80g --attention unfused --quiet --no-svg --json)
  "$tool" plan "${common[@]}" --algo megatron --tp "$tp" --recompute full --out "$tmp/m.json" >"$tmp/m.out"
  "$tool" plan "${common[@]}" --out "$tmp/a.json" >"$tmp/a.out"
  python3 - "$name" "${nodes}x8" "$published" "$tmp/m.out" "$tmp/a.out" <<'PY'
import json, sys
name, mesh, published, m, a = sys.argv[1], sys.argv[2], float(sys.argv[3]), json.load(open(sys.argv[4])), json.load(open(sys.argv[5]))
mp, ap = m["plan"], a["plan"]
par = ap["parallelism"]
print(f"{name:<6} {mesh:<9} {published:9.1f} {mp['tflops_per_device']:9.1f} {100 * (mp['tflops_per_device'] / published - 1):+6.1f}% | "
      f"{'alpa':<10} {ap['step_seconds']:8.3f}s {ap['tflops_per_device']:7.1f} {100 * ap['mfu']:6.1f}% {ap['peak_memory_bytes'] / 2**30:7.2f} GiB  "
      f"tp {par['tp']}, dp {par['dp']}, micro-batch {par['micro_batch']} x {par['micro_batches']}, recompute {par['recompute']}, ZeRO-{par['zero']}"
      f"  (megatron: {mp['step_seconds']:.3f} s, {mp['peak_memory_bytes'] / 2**30:.2f} GiB)")
PY
done

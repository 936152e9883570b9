#!/usr/bin/env bash
# The pipeline search on Megatron-LM's published pipelined GPTs (Narayanan et al. 2021, Table 1:
# sequence 2048, vocabulary 51,200, A100-80GB, 8 per node): `autoshard plan --pp auto` over
# (pp, tp, dp, micro-batch, recomputation) with each stage planned by the ILP, timed (median
# of RUNS runs, wall seconds and peak resident memory), next to the published configuration
# priced by the tool (`--algo megatron --tp 8 --pp P --micro-batch 1 --recompute full`) and its
# published TFLOP/s per GPU. Nothing is asserted: the figures are measured (issue 31's target:
# the 1 T model on 384x8 in under 60 s on the developer's machine).
#   bash bench/solve/pipeline_search.sh [path/to/autoshard] [RUNS]
set -euo pipefail
tool=${1:-build/release/tools/autoshard}
runs=${2:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# name heads hidden layers nodes pp batch published
rows=(
  "39.1B 64 8192 48 64 2 1536 138"
  "1T 160 25600 128 384 64 3072 163"
)
for row in "${rows[@]}"; do
  read -r name heads hidden layers nodes pp batch published <<<"$row"
  common=(--model gpt2 --heads "$heads" --hidden "$hidden" --layers "$layers" --seq 2048 --vocab 51200 --batch "$batch"
          --mesh "${nodes}x8" --device a100-80g --attention unfused --quiet --no-svg --json --out "$tmp/p.json")
  "$tool" plan "${common[@]}" --algo megatron --tp 8 --pp "$pp" --micro-batch 1 --recompute full >"$tmp/m.json"
  times=()
  for ((k = 0; k < runs; ++k)); do
    /usr/bin/time -f "%e %M" -o "$tmp/time" "$tool" plan "${common[@]}" --pp auto >"$tmp/a.json"
    times+=("$(cat "$tmp/time")")
  done
  python3 - "$name" "$published" "$tmp/m.json" "$tmp/a.json" "${times[@]}" <<'PY'
import json, statistics, sys
name, published, m, a = sys.argv[1], float(sys.argv[2]), json.load(open(sys.argv[3])), json.load(open(sys.argv[4]))
runs = [tuple(map(float, t.split())) for t in sys.argv[5:]]
wall = statistics.median(r[0] for r in runs)
rss = max(r[1] for r in runs) / 1024
mp, ap, s = m["plan"], a["plan"], a["search"]
def par(p):
    q = p["parallelism"]
    return f"pp {q['pp']}, tp {q['tp']}, dp {q['dp']}, micro-batch {q['micro_batch']} x {q['micro_batches']}, recompute {q['recompute']}"
print(f"{name}: published {published:.0f} TFLOP/s, priced {mp['tflops_per_device']:.1f} ({100 * (mp['tflops_per_device'] / published - 1):+.1f}%) for {par(mp)}")
print(f"  search: {par(ap)}: {ap['step_seconds']:.2f} s, {ap['tflops_per_device']:.1f} TFLOP/s, MFU {100 * ap['mfu']:.1f}%, "
      f"{ap['peak_memory_bytes'] / 2**30:.1f} GiB; {s['configurations']} configurations, {s['priced']} planned; "
      f"median {wall:.1f} s wall over {len(runs)} runs, peak RSS {rss:.0f} MiB")
PY
done

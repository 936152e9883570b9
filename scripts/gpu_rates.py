#!/usr/bin/env python3
"""What one GPU reaches on the work the device presets price (include/autoshard/graph/device.hpp:
achievable_rates), measured with PyTorch on the GPU machine by scripts/gpu_check.sh:

  large_matmul   bf16 GEMMs (fp32 accumulate, cuBLAS through torch.matmul) of whole
                 transformer-layer shapes: 8192^3, LLaMA-70B's and GPT-3 18.4B's projections
                 for 4096 tokens
  sliced_matmul  the same layers cut 8 ways by tensor parallelism, and issue 33's two slices
  memory         a 4 GiB device-to-device copy, bytes read + written

Inputs are random normal (zeros run about 10 % faster and are not what training sees). Each
shape: 3 warm-up products, then the median of 15 timed with CUDA events. Prints one JSON
object; exits 3 without PyTorch or a GPU (gpu_check.sh then reports the figures missing).

    python3 scripts/gpu_rates.py > rates.json
"""
import json
import statistics
import sys

try:
    import torch
except ImportError:
    print(json.dumps({"error": "PyTorch is not installed"}))
    sys.exit(3)

# class, m, k, n ([m, k] x [k, n], 4096 tokens), what the shape is. Tensor-parallel slices
# are the layers above them cut 8 ways, and issue 33's two.
SHAPE_TABLE = """
large_matmul   8192  8192  8192  square
large_matmul   4096  8192 28672  llama-70b up/gate
large_matmul   4096 28672  8192  llama-70b down
large_matmul   4096  8192 10240  llama-70b qkv
large_matmul   4096  6144 24576  gpt-18.4b fc1
large_matmul   4096 24576  6144  gpt-18.4b fc2
sliced_matmul  4096  8192  3584  llama-70b up/gate / 8
sliced_matmul  4096  3584  8192  llama-70b down / 8
sliced_matmul  4096  8192  1280  llama-70b qkv / 8
sliced_matmul  4096  6144  3072  gpt-18.4b fc1 / 8
sliced_matmul  4096  1024  4096  issue 33
sliced_matmul  4096  8192  1024  issue 33
"""
SHAPES = {}
for line in SHAPE_TABLE.strip().splitlines():
    cls, m, k, n, name = line.split(maxsplit=4)
    SHAPES.setdefault(cls, {})[f"{name} ({m}x{k}x{n})"] = (int(m), int(k), int(n))


def timed(fn, warmup=3, reps=15):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    return statistics.median(times), min(times), max(times)


def gemm(m, k, n):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    med, lo, hi = timed(lambda: torch.matmul(a, b, out=c))
    flops = 2.0 * m * k * n
    return {"shape": [m, k, n], "median_flops": flops / med, "best_flops": flops / lo, "worst_flops": flops / hi}


def main():
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device visible to PyTorch"}))
        return 3
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False  # fp32 accumulate
    props = torch.cuda.get_device_properties(0)
    out = {"gpu": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
           "inputs": "random normal bf16", "method": "3 warm-ups, median of 15 CUDA-event timings per shape"}
    for cls, shapes in SHAPES.items():
        rows = {name: gemm(*mkn) for name, mkn in shapes.items()}
        meds = sorted(r["median_flops"] for r in rows.values())
        out[cls] = {"shapes": rows, "min_median_flops": meds[0], "median_of_medians_flops": statistics.median(meds)}
    n = (4 << 30) // 2
    a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    med, lo, hi = timed(lambda: b.copy_(a), warmup=3, reps=15)
    moved = 2.0 * a.numel() * a.element_size()
    out["memory"] = {"copy_bytes": a.numel() * a.element_size(), "median_bytes_per_second": moved / med,
                     "best_bytes_per_second": moved / lo, "counting": "bytes read + written"}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

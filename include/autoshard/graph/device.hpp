#pragma once
/// What one device can do, and the GPUs people train on as presets: the one home of their
/// numbers (peak FLOP/s, HBM bandwidth and capacity, NVLink and network bandwidth per GPU, and
/// what real GEMMs and copies were measured to reach, each with its source).
///   const autoshard::device_preset* p = autoshard::find_device_preset("h100-80g");
///   o.pricing.device = p->device;  // autosharding_options: compute prices and the memory budget
///   o.mesh = autoshard::make_cluster_mesh({2, 8}, {.inter_node_bandwidth = p->inter_node_bandwidth,
///                                                  .intra_node_bandwidth = p->intra_node_bandwidth});
#include <array>        // std::array
#include <cstdint>      // std::int64_t
#include <string>       // std::string
#include <string_view>  // std::string_view

namespace autoshard {

/// What one device can do. Defaults: an A100-class GPU, 312 TFLOP/s (bf16 tensor cores),
/// 2 TB/s of HBM bandwidth and 80 GiB.
struct device_model {
  double peak_flops = 312e12;              ///< FLOP/s
  double memory_bandwidth = 2.0e12;        ///< bytes/s
  std::int64_t memory_bytes = 80LL << 30;  ///< capacity: a plan's peak above it does not fit
  friend constexpr bool operator==(const device_model&, const device_model&) = default;
};

/// A rate real kernels reach on a device, and where the figure comes from (who measured
/// it, on what, how, when; or the publication). value 0: no figure yet.
struct sourced_rate {
  double value = 0;         ///< FLOP/s or bytes/s
  std::string_view source;  ///< "" when value is 0

  /// value over `peak`: the achievable fraction a price can scale the peak by; 1 without a figure.
  constexpr double fraction_of(double peak) const noexcept { return value > 0 && peak > 0 ? value / peak : 1.0; }
};

/// What real work reaches on a device, by shape class, next to its data-sheet peaks
/// (device_model): the achievable-compute model prices with these where they exist.
struct achievable_rates {
  sourced_rate large_matmul;   ///< dense bf16 GEMMs of whole transformer-layer shapes, fp32 accumulate (FLOP/s)
  sourced_rate sliced_matmul;  ///< the same layers' tensor-parallel slices (one dimension cut 4-8 ways) (FLOP/s)
  sourced_rate memory;         ///< memory-bound work: a large device-to-device copy, bytes read + written (bytes/s)
};

/// A GPU as its vendor's data sheet describes it, inside a node of 8 like it (NVLink) and
/// one network port per GPU between nodes, with what real kernels were measured to reach.
struct device_preset {
  std::string_view name;         ///< what `--device` takes: "h100-80g"
  std::string_view description;  ///< "NVIDIA H100 80GB SXM5"
  device_model device;           ///< dense bf16 tensor-core FLOP/s, HBM bytes/s, memory as nvidia-smi totals it
  double intra_node_bandwidth;   ///< bytes/s per GPU and direction over NVLink (half the bidirectional figure)
  double inter_node_bandwidth;   ///< bytes/s per GPU between nodes (its InfiniBand port)
  std::string_view peak_source;  ///< where `device`'s peaks and the links come from
  achievable_rates achievable;   ///< measured or published; zero where there is no figure yet
};

/// The peaks are the vendors' data sheets (peak_source). Achievable figures: the H200's were
/// measured on one H200 SXM by scripts/gpu_rates.py (bench/device/results, docs/devices.md);
/// the A100's and H100's are left to published measurements (issue 28) and are zero until then.
inline constexpr std::array<device_preset, 3> device_presets{{
    {"a100-80g", "NVIDIA A100 80GB SXM4", {312e12, 2.039e12, 81920LL << 20}, 300e9, 25e9,
     "NVIDIA A100 data sheet: 312 TFLOP/s bf16 dense, 2,039 GB/s HBM2e, 81920 MiB; NVLink 3 600 GB/s "
     "bidirectional; HDR 200 Gb/s",
     {}},
    {"h100-80g", "NVIDIA H100 80GB SXM5", {989.4e12, 3.35e12, 81559LL << 20}, 450e9, 50e9,
     "NVIDIA H100 data sheet: 989.4 TFLOP/s bf16 dense (1,979 with sparsity), 3.35 TB/s HBM3, 81559 MiB; "
     "NVLink 4 900 GB/s bidirectional; NDR 400 Gb/s",
     {}},
    {"h200-141g", "NVIDIA H200 141GB SXM", {989.4e12, 4.8e12, 143771LL << 20}, 450e9, 50e9,
     "NVIDIA H200 data sheet: H100's compute (989.4 TFLOP/s bf16 dense), 4.8 TB/s HBM3e, 143771 MiB "
     "(141 GB); NVLink 4 900 GB/s bidirectional; NDR 400 Gb/s",
     {{714e12, "measured 2026-12-04 on one H200 SXM (driver 580.159.04, PyTorch 2.11 / CUDA 13.0 cuBLAS, "
               "scripts/gpu_rates.py, 5 runs): bf16 GEMMs, fp32 accumulate, random inputs, 4096 tokens x LLaMA-70B "
               "and GPT-3 18.4B layer shapes and 8192^3; the median over shapes of each shape's median, 714 "
               "TFLOP/s (shapes 675-766; zero-filled inputs run about 10 % faster)"},
      {593e12, "measured as above: the same layers cut 8 ways by tensor parallelism (4096x8192x3584, "
               "4096x3584x8192, 4096x8192x1280, 4096x6144x3072) and 4096x1024x4096, 4096x8192x1024; 593 TFLOP/s "
               "(shapes 423-626)"},
      {4.24e12, "measured as above: a 4 GiB device-to-device copy, bytes read + written, 4.22-4.26 TB/s"}}},
}};

/// The preset named `name`, or nullptr.
constexpr const device_preset* find_device_preset(std::string_view name) noexcept {
  for (const device_preset& p : device_presets)
    if (p.name == name) return &p;
  return nullptr;
}

/// The preset names, comma-separated, for messages and help.
inline std::string device_preset_names() {
  std::string s;
  for (const device_preset& p : device_presets) s += (s.empty() ? "" : ", ") + std::string(p.name);
  return s;
}

}  // namespace autoshard

#pragma once
/// What one device can do, and the GPUs people train on as presets: the one home of their
/// numbers (peak FLOP/s, HBM bandwidth and capacity, NVLink and network bandwidth per GPU, and
/// what real GEMMs, copies and NCCL collectives were measured to reach, each with its source).
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
/// 2 TB/s of HBM bandwidth and 80 GiB, with no achievable figures (priced at those peaks).
/// The achievable rates are what real kernels reach (0: no figure); step_pricing::achievable
/// decides whether compute is priced at them (matmul_flops, memory_rate) or at the peaks.
struct device_model {
  double peak_flops = 312e12;              ///< FLOP/s
  double memory_bandwidth = 2.0e12;        ///< bytes/s
  std::int64_t memory_bytes = 80LL << 30;  ///< capacity: a plan's peak above it does not fit
  double large_matmul_flops = 0;           ///< achievable on GEMMs of whole transformer-layer shapes (FLOP/s)
  double sliced_matmul_flops = 0;          ///< achievable on their tensor-parallel slices; 0: the large figure
  double achievable_memory_bandwidth = 0;  ///< achievable on memory-bound work, bytes read + written (bytes/s)

  /// FLOP/s of a GEMM whose smallest local dimension is `smallest`: the large-GEMM figure from
  /// large_matmul_dim on, the sliced one below (never above the large one); the peak without
  /// figures, or when `achievable` is false.
  constexpr double matmul_flops(double smallest, bool achievable) const noexcept {
    if (!achievable || large_matmul_flops <= 0) return peak_flops;
    const double sliced = sliced_matmul_flops > 0 && sliced_matmul_flops < large_matmul_flops ? sliced_matmul_flops
                                                                                              : large_matmul_flops;
    return smallest >= large_matmul_dim ? large_matmul_flops : sliced;
  }
  /// Bytes/s of memory-bound work: the achievable figure, or the peak.
  constexpr double memory_rate(bool achievable) const noexcept {
    return achievable && achievable_memory_bandwidth > 0 ? achievable_memory_bandwidth : memory_bandwidth;
  }
  /// The smallest GEMM dimension of the large-GEMM class: the whole-layer shapes the figures
  /// were measured on have every dimension >= 4096 (4096 tokens x hidden 6144..8192 x
  /// 8192..28672), their tensor-parallel slices a dimension of 1024..3584 (scripts/gpu_rates.py).
  static constexpr double large_matmul_dim = 4096;
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
/// (device_model), and what NCCL reaches on its links.
struct achievable_rates {
  sourced_rate large_matmul;   ///< dense bf16 GEMMs of whole transformer-layer shapes, fp32 accumulate (FLOP/s)
  sourced_rate sliced_matmul;  ///< the same layers' tensor-parallel slices (one dimension cut 4-8 ways) (FLOP/s)
  sourced_rate memory;         ///< memory-bound work: a large device-to-device copy, bytes read + written (bytes/s)
  /// NCCL's all-reduce bus bandwidth per GPU (nccl-tests' busbw: the B / t·2(k-1)/k the
  /// alpha-beta model's beta is) inside a node (NVLink) and between nodes (bytes/s).
  sourced_rate intra_node_link;
  sourced_rate inter_node_link;
};

/// A GPU as its vendor's data sheet describes it, inside a node of 8 like it (NVLink) and
/// one network port per GPU between nodes, with what real kernels were measured to reach.
struct device_preset {
  std::string_view name;         ///< what `--device` takes: "h100-80g"
  std::string_view description;  ///< "NVIDIA H100 80GB SXM5"
  /// Dense bf16 tensor-core FLOP/s, HBM bytes/s, memory as nvidia-smi totals it, and the
  /// achievable compute figures of `achievable` (filled from them: one home for each number).
  device_model device;
  double intra_node_bandwidth;   ///< bytes/s per GPU and direction over NVLink (half the bidirectional figure)
  double inter_node_bandwidth;   ///< bytes/s per GPU between nodes (its InfiniBand port)
  std::string_view peak_source;  ///< where `device`'s peaks and the links come from
  achievable_rates achievable;   ///< measured or published, each with its source; zero where there is none

  /// The link bandwidths to price with: what NCCL reaches where the preset has a figure and
  /// `achievable` is asked for, the nominal link otherwise.
  constexpr double intra_node_link(bool use_achievable) const noexcept {
    return use_achievable && achievable.intra_node_link.value > 0 ? achievable.intra_node_link.value : intra_node_bandwidth;
  }
  constexpr double inter_node_link(bool use_achievable) const noexcept {
    return use_achievable && achievable.inter_node_link.value > 0 ? achievable.inter_node_link.value : inter_node_bandwidth;
  }
};

namespace detail {
/// A preset whose device carries its achievable compute figures.
constexpr device_preset make_preset(std::string_view name, std::string_view description, device_model peaks, double intra,
                                    double inter, std::string_view source, achievable_rates a) {
  peaks.large_matmul_flops = a.large_matmul.value;
  peaks.sliced_matmul_flops = a.sliced_matmul.value;
  peaks.achievable_memory_bandwidth = a.memory.value;
  return {name, description, peaks, intra, inter, source, a};
}
}  // namespace detail

/// The peaks are the vendors' data sheets (peak_source). Achievable figures: the H200's were
/// measured on one H200 SXM by scripts/gpu_rates.py (bench/device/results, docs/devices.md);
/// the A100's and H100's GEMM figures are Stas Bekman's published MAMF measurements, the
/// A100's links NCCL's on DGX-class A100 nodes (docs/devices.md lists them with what is not
/// measured).
inline constexpr std::array<device_preset, 3> device_presets{{
    detail::make_preset(
        "a100-80g", "NVIDIA A100 80GB SXM4", {312e12, 2.039e12, 81920LL << 20}, 300e9, 25e9,
        "NVIDIA A100 data sheet: 312 TFLOP/s bf16 dense, 2,039 GB/s HBM2e, 81920 MiB; NVLink 3 600 GB/s "
        "bidirectional; HDR 200 Gb/s",
        {{271.2e12, "Stas Bekman, Machine Learning Engineering Open Book, compute/accelerator 'Maximum Achievable Matmul "
                    "FLOPS comparison table' (mamf-finder.py, PyTorch 2.6.0+cu126, bf16, mean of 100 iterations after 50 "
                    "warm-ups, cache reset between shapes): NVIDIA A100 SXM 271.2 TFLOP/s, 86.9 % of 312, best of a sweep "
                    "of shapes (1024x10240x5120)"},
         {},
         {1.80e12, "NVIDIA developer forums, 'Trouble to Reach Peak Bandwidth of A100' (2025): a read kernel on an "
                   "A100 80GB SXM reaches 1.80 TB/s, 88 % of 2.039, which Nsight Compute confirms; the poster cites a "
                   "GTC 2025 talk in which no kernel exceeded about 90 %"},
         {200e9, "NVIDIA/nccl-tests issue 149 (2023): all_reduce_perf on 8 A100-SXM4-80GB over NVLink/NVSwitch "
                 "(HPE Apollo 6500, NCCL 2.18.1), bus bandwidth about 200 GB/s at 1 GiB, against 300 GB/s per "
                 "direction nominal"},
         {24e9, "NVIDIA/nccl issue 812, an NCCL maintainer (quoted in issue 1576): 'On an Nvidia DGX-A100 system we "
                "have 8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW', 24 GB/s per GPU against 25 "
                "nominal"}}),
    detail::make_preset(
        "h100-80g", "NVIDIA H100 80GB SXM5", {989.4e12, 3.35e12, 81559LL << 20}, 450e9, 50e9,
        "NVIDIA H100 data sheet: 989.4 TFLOP/s bf16 dense (1,979 with sparsity), 3.35 TB/s HBM3, 81559 MiB; "
        "NVLink 4 900 GB/s bidirectional; NDR 400 Gb/s",
        {{794.5e12, "Stas Bekman, Machine Learning Engineering Open Book, compute/accelerator 'Maximum Achievable Matmul "
                    "FLOPS comparison table' (mamf-finder.py, PyTorch 2.7.0+cu126, bf16, mean of 100 iterations after 50 "
                    "warm-ups, cache reset between shapes): NVIDIA H100 SXM 794.5 TFLOP/s, 80.3 % of 989, best of a sweep "
                    "of shapes (2048x2048x13312); an upper bound for layer shapes (the H200's median over them is 714)"},
         {},
         {},
         {},
         {}}),
    detail::make_preset(
        "h200-141g", "NVIDIA H200 141GB SXM", {989.4e12, 4.8e12, 143771LL << 20}, 450e9, 50e9,
        "NVIDIA H200 data sheet: H100's compute (989.4 TFLOP/s bf16 dense), 4.8 TB/s HBM3e, 143771 MiB "
        "(141 GB); NVLink 4 900 GB/s bidirectional; NDR 400 Gb/s",
        {{714e12, "measured 2026-12-04 on one H200 SXM (driver 580.159.04, PyTorch 2.11 / CUDA 13.0 cuBLAS, "
                  "scripts/gpu_rates.py, 5 runs): bf16 GEMMs, fp32 accumulate, random inputs, 4096 tokens x LLaMA-70B "
                  "and GPT-3 18.4B layer shapes and 8192^3; the median over shapes of each shape's median, 714 "
                  "TFLOP/s (shapes 675-766; zero-filled inputs run about 10 % faster)"},
         {593e12, "measured as above: the same layers cut 8 ways by tensor parallelism (4096x8192x3584, "
                  "4096x3584x8192, 4096x8192x1280, 4096x6144x3072) and 4096x1024x4096, 4096x8192x1024; 593 TFLOP/s "
                  "(shapes 423-626)"},
         {4.24e12, "measured as above: a 4 GiB device-to-device copy, bytes read + written, 4.22-4.26 TB/s"},
         {},
         {}}),
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

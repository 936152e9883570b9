#pragma once
/// What one device can do, and the GPUs people train on as presets: the one home of their
/// numbers (peak FLOP/s, HBM bandwidth and capacity, NVLink and network bandwidth per GPU, and
/// what real GEMMs, copies and NCCL collectives were measured to reach, each with its source).
///   const autoshard::device_preset* p = autoshard::find_device_preset("h100-80g");
///   o.pricing.device = p->device;  // autosharding_options: compute prices and the memory budget
///   o.mesh = autoshard::make_cluster_mesh({2, 8}, {.inter_node_bandwidth = p->inter_node_bandwidth,
///                                                  .intra_node_bandwidth = p->intra_node_bandwidth});
///   autoshard::runtime_reserve r = autoshard::runtime_reserve_of(p->device, o.mesh);  // CUDA context + NCCL
#include <array>        // std::array
#include <cstddef>      // std::size_t
#include <cstdint>      // std::int64_t
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "../core/dtype.hpp"  // human_bytes
#include "../core/mesh.hpp"   // device_mesh

namespace autoshard {

/// What one device can do. Defaults: an A100-class GPU, 312 TFLOP/s (bf16 tensor cores),
/// 2 TB/s of HBM bandwidth and 80 GiB, with no achievable figures (priced at those peaks).
/// The achievable rates are what real kernels reach (0: no figure); step_pricing::achievable
/// decides whether compute is priced at them (matmul_flops, memory_rate) or at the peaks.
/// The runtime figures are what a training process holds on the device outside the plan's
/// tensors (runtime_reserve_of); the plain model has none (0: an abstract device, no runtime
/// assumed, so its examples and tests count tensors alone), the presets carry sourced figures.
struct device_model {
  double peak_flops = 312e12;              ///< FLOP/s
  double memory_bandwidth = 2.0e12;        ///< bytes/s
  std::int64_t memory_bytes = 80LL << 30;  ///< capacity: a plan's peak above it does not fit
  double large_matmul_flops = 0;           ///< achievable on GEMMs of whole transformer-layer shapes (FLOP/s)
  double sliced_matmul_flops = 0;          ///< achievable on their tensor-parallel slices; 0: the large figure
  double achievable_memory_bandwidth = 0;  ///< achievable on memory-bound work, bytes read + written (bytes/s)
  std::int64_t context_bytes = 0;            ///< the CUDA context of one process
  std::int64_t communicator_bytes = 0;       ///< the buffers of one NCCL communicator of more than 2 ranks
  std::int64_t pair_communicator_bytes = 0;  ///< of one of 2 ranks; 0: communicator_bytes

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

/// A number of bytes a process holds on a device, and where the figure comes from.
struct sourced_bytes {
  std::int64_t value = 0;
  std::string_view source;  ///< "" when value is 0
};

/// What a training process holds on its device beside the plan's tensors: the CUDA context,
/// and the buffers of every NCCL communicator its rank belongs to (runtime_reserve_of counts
/// them).
struct runtime_figures {
  sourced_bytes context;            ///< one process's CUDA context
  sourced_bytes communicator;       ///< one communicator of more than 2 ranks
  sourced_bytes pair_communicator;  ///< one communicator of 2 ranks
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
  runtime_figures runtime;       ///< what a process holds beside the plan's tensors, each with its source

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
                                    double inter, std::string_view source, achievable_rates a, runtime_figures r) {
  peaks.large_matmul_flops = a.large_matmul.value;
  peaks.sliced_matmul_flops = a.sliced_matmul.value;
  peaks.achievable_memory_bandwidth = a.memory.value;
  peaks.context_bytes = r.context.value;
  peaks.communicator_bytes = r.communicator.value;
  peaks.pair_communicator_bytes = r.pair_communicator.value;
  return {name, description, peaks, intra, inter, source, a, r};
}

/// One CUDA context: the same on every preset (the figure names no GPU).
inline constexpr sourced_bytes cuda_context{
    400LL << 20,
    "pytorch/pytorch issue 109888 (ptrblck, 2023): 'The first CUDA operation will create the CUDA context which uses "
    "around 400MB if CUDA >= 11.7 is used and lazy module loading enabled (default in PyTorch)'; issue 107667 "
    "(ptrblck): about 300 MB, and before CUDA 11.7, which loaded every kernel, more than 1000 MB. 400 MB read as MiB, "
    "the larger reading"};

/// NCCL's buffers per communicator, measured on A100s: the only published per-communicator
/// figures found. NCCL's memory grows with its channels (NVIDIA/nccl issue 986, sjeaugey: more
/// of them to reach H100's NVLink bandwidth), so on H100 and H200 they are a lower bound.
inline constexpr sourced_bytes a100_communicator{
    688LL << 20,
    "NVIDIA/nccl issue 964 (2023): 4 A100 with NVLink, PyTorch, a 4 MB all-reduce on each process group: 688 MB per "
    "group of more than 2 ranks (MB read as MiB); per communicator, as issue 986 (sjeaugey) says: 'More communicators = "
    "more memory used, except if communicators are created with ncclCommSplit and the flag to share resources is set'"};
inline constexpr sourced_bytes a100_pair_communicator{
    544LL << 20, "NVIDIA/nccl issue 964 (2023), as above: 544 MB per group of 2 ranks (MB read as MiB)"};
/// The A100's figures on the H100 and H200, which have none of their own.
inline constexpr runtime_figures a100_runtime_stands_in{
    cuda_context,
    {a100_communicator.value,
     "the A100's figure stands in (no published per-communicator figure for this GPU): NVIDIA/nccl issue 964, 688 MB "
     "per group of more than 2 ranks on 4 A100 with NVLink (MB read as MiB); a lower bound, NCCL using more channels, "
     "and memory linear in them, to reach H100 NVLink bandwidth (issue 986, sjeaugey)"},
    {a100_pair_communicator.value,
     "the A100's figure stands in, as above: NVIDIA/nccl issue 964, 544 MB per group of 2 ranks (MB read as MiB)"}};
}  // namespace detail

/// What one rank's process holds on its device outside the plan's tensors: the CUDA context
/// and the buffers of each NCCL communicator it belongs to.
struct runtime_reserve {
  std::int64_t context_bytes = 0;
  int communicators = 0;                ///< NCCL communicators the rank belongs to
  std::int64_t communicator_bytes = 0;  ///< all of their buffers
  constexpr std::int64_t bytes() const noexcept { return context_bytes + communicator_bytes; }
  /// The bytes a plan's tensors may use on `d`: its memory less this reserve (>= 0).
  constexpr std::int64_t left_on(const device_model& d) const noexcept {
    return d.memory_bytes > bytes() ? d.memory_bytes - bytes() : 0;
  }
  /// Whether a plan peaking at `peak` bytes of tensors per device fits `d` with this reserve.
  constexpr bool fits(std::int64_t peak, const device_model& d) const noexcept { return peak <= d.memory_bytes - bytes(); }
  friend constexpr bool operator==(const runtime_reserve&, const runtime_reserve&) = default;
};

/// The reserve of a rank of `mesh` on device `d` when the plan runs in `pipeline_stages` stages
/// of that mesh (1: no pipeline): d's CUDA context, and one NCCL communicator per mesh axis of
/// more than one rank (PyTorch's DeviceMesh creates one process group per mesh dimension, and a
/// plan's collectives on an axis run on that axis's group; Megatron-LM has one for tensor and
/// one for data parallelism), plus one of `pipeline_stages` ranks for the stages' point-to-
/// point sends when there is more than one stage; a group of 2 ranks at d's pair figure.
/// What it does not count: groups a framework creates beyond these (Megatron-LM's embedding
/// group, a flattened data x context group), communicators made with ncclCommSplit sharing
/// their parent's resources (less), the caching allocator's fragmentation, and that the
/// figures were measured inside a node (between nodes NCCL's buffers differ; issue 986: beyond
/// 2 nodes they should no longer grow).
///   runtime_reserve_of(find_device_preset("h100-80g")->device, device_mesh{8, 8}, 16).communicators == 3
inline runtime_reserve runtime_reserve_of(const device_model& d, const device_mesh& mesh, int pipeline_stages = 1) {
  runtime_reserve r;
  r.context_bytes = d.context_bytes;
  const auto add = [&](int ranks) {
    if (ranks <= 1) return;
    ++r.communicators;
    r.communicator_bytes += ranks == 2 && d.pair_communicator_bytes > 0 ? d.pair_communicator_bytes : d.communicator_bytes;
  };
  for (std::size_t a = 0; a < mesh.ndim(); ++a) add(mesh.size(a));
  add(pipeline_stages);
  return r;
}

/// runtime_reserve_of's bytes.
inline std::int64_t runtime_reserve_bytes(const device_model& d, const device_mesh& mesh, int pipeline_stages = 1) {
  return runtime_reserve_of(d, mesh, pipeline_stages).bytes();
}

/// "2.12 GiB runtime (CUDA context, 3 NCCL communicators)"; "" when there is none.
inline std::string to_string(const runtime_reserve& r) {
  if (r.bytes() == 0) return {};
  return human_bytes(static_cast<double>(r.bytes())) + " runtime (CUDA context, " + std::to_string(r.communicators) +
         (r.communicators == 1 ? " NCCL communicator)" : " NCCL communicators)");
}

/// "peak 71.20 GiB per device + 2.12 GiB runtime (CUDA context, 3 NCCL communicators) of 79.65
/// GiB": a peak of tensors with the reserve beside it; the peak alone where there is none.
inline std::string describe_peak(std::int64_t peak, const runtime_reserve& r, const device_model& d) {
  std::string s = "peak " + human_bytes(static_cast<double>(peak)) + " per device";
  if (r.bytes() > 0) s += " + " + to_string(r) + " of " + human_bytes(static_cast<double>(d.memory_bytes));
  return s;
}

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
                "nominal"}},
        {detail::cuda_context, detail::a100_communicator, detail::a100_pair_communicator}),
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
         {}},
        detail::a100_runtime_stands_in),
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
         {}},
        detail::a100_runtime_stands_in),
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

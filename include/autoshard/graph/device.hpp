#pragma once
/// What one device can do, and the GPUs people train on as presets: the one home of their
/// numbers (peak FLOP/s, HBM bandwidth and capacity, NVLink and network bandwidth per GPU).
///   const autoshard::device_preset* p = autoshard::find_device_preset("h100-80g");
///   o.device = p->device;  // autosharding_options: compute prices and the memory budget
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
};

/// A GPU as its vendor's data sheet describes it, inside a node of 8 like it (NVLink) and
/// one network port per GPU between nodes.
struct device_preset {
  std::string_view name;         ///< what `--device` takes: "h100-80g"
  std::string_view description;  ///< "NVIDIA H100 80GB SXM5"
  device_model device;           ///< dense bf16 tensor-core FLOP/s, HBM bytes/s, memory as nvidia-smi totals it
  double intra_node_bandwidth;   ///< bytes/s per GPU and direction over NVLink (half the bidirectional figure)
  double inter_node_bandwidth;   ///< bytes/s per GPU between nodes (its InfiniBand port)
};

/// A100: 312 TFLOP/s bf16, 2,039 GB/s HBM2e, 81920 MiB, NVLink 3 600 GB/s bidirectional,
/// HDR 200 Gb/s. H100 SXM5: 989.4 TFLOP/s bf16 dense (1,979 with sparsity), 3.35 TB/s HBM3,
/// 81559 MiB, NVLink 4 900 GB/s bidirectional, NDR 400 Gb/s. H200: H100's compute, 4.8 TB/s
/// HBM3e, 143771 MiB (141 GB), NVLink 4, NDR 400 Gb/s.
inline constexpr std::array<device_preset, 3> device_presets{{
    {"a100-80g", "NVIDIA A100 80GB SXM4", {312e12, 2.039e12, 81920LL << 20}, 300e9, 25e9},
    {"h100-80g", "NVIDIA H100 80GB SXM5", {989.4e12, 3.35e12, 81559LL << 20}, 450e9, 50e9},
    {"h200-141g", "NVIDIA H200 141GB SXM", {989.4e12, 4.8e12, 143771LL << 20}, 450e9, 50e9},
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

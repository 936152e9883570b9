#pragma once
/// Placing shards on CUDA devices: each rank's shards of a checkpoint (by tensor-parallel
/// policy, by solved plan, or from a sharded directory) go to the device chosen for that
/// rank; replicated tensors go to every device. Bytes move once from the memory map (or one
/// block copy for strided shards) into pinned staging buffers, two per device, and on with
/// cudaMemcpyAsync on one stream per device, so copies to several devices overlap.
///   autoshard::checkpoint in("gpt2");
///   std::vector<int> devices{0, 1, 2, 3};                       // rank r -> cuda:devices[r]
///   auto ranks = autoshard::upload_shards(in, autoshard::policies::gpt2(), 4, cfg, devices);
///   const autoshard::device_tensor& w = ranks[2].tensors.at("transformer.h.0.attn.c_attn.weight");
/// Without a device or driver, every entry point throws autoshard::device_error.
#include <algorithm>    // std::min, std::max
#include <cstddef>      // std::size_t, std::byte
#include <cstring>      // std::memcpy
#include <map>          // std::map
#include <optional>     // std::optional
#include <span>         // std::span
#include <string>       // std::string
#include <utility>      // std::exchange
#include <vector>       // std::vector

#include <cuda_runtime_api.h>  // cudaMalloc, cudaMallocHost, cudaMemcpyAsync, cudaStream_t, cudaEvent_t

#include "../core/error.hpp"                // device_error
#include "../tensor/host_tensor.hpp"        // host_tensor, convert_into
#include "../tensor/policy.hpp"             // tp_policy, plan_policy, shards_of
#include "../tensor/safetensors.hpp"        // checkpoint
#include "../tensor/shard_checkpoint.hpp"   // sharded_checkpoint
#include "../tensor/slice.hpp"              // extract, contiguous_span

namespace autoshard {

namespace detail {
inline void cuda_check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw device_error(what + " failed (" + cudaGetErrorName(e) + ": " + cudaGetErrorString(e) + ")");
  }
}
}  // namespace detail

/// Number of visible CUDA devices; 0 without devices or a driver (never throws).
inline int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

/// Throws device_error unless `device` is a visible CUDA device.
inline void require_cuda_device(int device) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw device_error(std::string("no CUDA device: cudaGetDeviceCount failed (") + cudaGetErrorName(e) + ": " +
                       cudaGetErrorString(e) + ")");
  }
  if (device < 0 || device >= n)
    throw device_error("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n) +
                       " visible)");
}

/// A dense tensor in one device's memory; freed with its device current. Move-only.
class device_tensor {
 public:
  device_tensor() = default;
  device_tensor(int device, dtype type, tensor_shape shape) : device_(device), shape_(shape), type_(type) {
    require_cuda_device(device);
    detail::cuda_check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
    detail::cuda_check(cudaMalloc(&ptr_, nbytes() == 0 ? 1 : nbytes()),
                       "cudaMalloc of " + std::to_string(nbytes()) + " bytes on cuda:" + std::to_string(device));
  }
  device_tensor(device_tensor&& o) noexcept
      : device_(o.device_), ptr_(std::exchange(o.ptr_, nullptr)), shape_(o.shape_), type_(o.type_) {}
  device_tensor& operator=(device_tensor&& o) noexcept {
    if (this != &o) {
      release();
      device_ = o.device_;
      ptr_ = std::exchange(o.ptr_, nullptr);
      shape_ = o.shape_;
      type_ = o.type_;
    }
    return *this;
  }
  device_tensor(const device_tensor&) = delete;
  device_tensor& operator=(const device_tensor&) = delete;
  ~device_tensor() { release(); }

  int device() const noexcept { return device_; }
  void* data() const noexcept { return ptr_; }
  const tensor_shape& shape() const noexcept { return shape_; }
  dtype type() const noexcept { return type_; }
  std::size_t nbytes() const noexcept { return static_cast<std::size_t>(shape_.numel()) * dtype_size(type_); }

  /// A host copy (synchronous).
  host_tensor download() const {
    host_tensor h(type_, shape_);
    detail::cuda_check(cudaSetDevice(device_), "cudaSetDevice(" + std::to_string(device_) + ")");
    if (nbytes()) detail::cuda_check(cudaMemcpy(h.data(), ptr_, nbytes(), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return h;
  }

 private:
  void release() noexcept {
    if (ptr_ && cudaSetDevice(device_) == cudaSuccess) (void)cudaFree(ptr_);
    ptr_ = nullptr;
  }
  int device_ = -1;
  void* ptr_ = nullptr;
  tensor_shape shape_{};
  dtype type_ = dtype::f32;
};

/// One rank's tensors, on its device.
struct device_shards {
  int rank = 0;
  int device = 0;
  std::map<std::string, device_tensor> tensors;
};

struct upload_options {
  std::size_t staging_bytes = std::size_t{32} << 20;  ///< each of the two pinned buffers per device
  std::optional<dtype> convert_to;                    ///< float tensors only, as in shard_options
};

/// Streams host bytes to devices through pinned double buffers, one stream per device.
/// Destroying it synchronises and frees everything.
class device_uploader {
 public:
  device_uploader(std::span<const int> devices, std::size_t staging_bytes) : staging_(staging_bytes) {
    if (staging_ < 4096) staging_ = 4096;
    for (int d : devices) {
      require_cuda_device(d);
      if (lanes_.count(d)) continue;
      lane& l = lanes_[d];
      l.device = d;
      detail::cuda_check(cudaSetDevice(d), "cudaSetDevice(" + std::to_string(d) + ")");
      detail::cuda_check(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking), "cudaStreamCreate");
      for (int b = 0; b < 2; ++b) {
        detail::cuda_check(cudaMallocHost(&l.pinned[b], staging_),
                           "cudaMallocHost of " + std::to_string(staging_) + " staging bytes");
        detail::cuda_check(cudaEventCreateWithFlags(&l.done[b], cudaEventDisableTiming), "cudaEventCreate");
      }
    }
  }
  device_uploader(const device_uploader&) = delete;
  device_uploader& operator=(const device_uploader&) = delete;
  ~device_uploader() {
    for (auto& [d, l] : lanes_) {
      if (cudaSetDevice(d) != cudaSuccess) continue;
      if (l.stream) (void)cudaStreamSynchronize(l.stream);
      for (int b = 0; b < 2; ++b) {
        if (l.done[b]) (void)cudaEventDestroy(l.done[b]);
        if (l.pinned[b]) (void)cudaFreeHost(l.pinned[b]);
      }
      if (l.stream) (void)cudaStreamDestroy(l.stream);
    }
  }
  std::size_t staging_bytes() const noexcept { return staging_; }

  /// Copies `n` elements of `from` (contiguous at `src`) to `dst` as `to`, converting floats.
  void copy(const std::byte* src, dtype from, device_tensor& dst) {
    lane& l = lanes_.at(dst.device());
    detail::cuda_check(cudaSetDevice(l.device), "cudaSetDevice(" + std::to_string(l.device) + ")");
    const std::size_t in_es = dtype_size(from), out_es = dtype_size(dst.type());
    const std::size_t per_chunk = staging_ / out_es;
    const auto n = static_cast<std::size_t>(dst.shape().numel());
    auto* out = static_cast<std::byte*>(dst.data());
    for (std::size_t i = 0; i < n; i += per_chunk) {
      const std::size_t k = std::min(per_chunk, n - i);
      const int b = l.next;
      l.next ^= 1;
      detail::cuda_check(cudaEventSynchronize(l.done[b]), "cudaEventSynchronize");  // buffer b is free again
      convert_into(src + i * in_es, from, static_cast<std::byte*>(l.pinned[b]), dst.type(), static_cast<std::int64_t>(k));
      detail::cuda_check(cudaMemcpyAsync(out + i * out_es, l.pinned[b], k * out_es, cudaMemcpyHostToDevice, l.stream),
                         "cudaMemcpyAsync H2D to cuda:" + std::to_string(l.device));
      detail::cuda_check(cudaEventRecord(l.done[b], l.stream), "cudaEventRecord");
    }
  }
  /// Waits for every copy.
  void synchronize() {
    for (auto& [d, l] : lanes_) {
      detail::cuda_check(cudaSetDevice(d), "cudaSetDevice(" + std::to_string(d) + ")");
      detail::cuda_check(cudaStreamSynchronize(l.stream), "cudaStreamSynchronize on cuda:" + std::to_string(d));
    }
  }

 private:
  struct lane {
    int device = 0;
    cudaStream_t stream = nullptr;
    void* pinned[2] = {nullptr, nullptr};
    cudaEvent_t done[2] = {nullptr, nullptr};
    int next = 0;
  };
  std::size_t staging_;
  std::map<int, lane> lanes_;
};

/// Uploads one host tensor to `device` (synchronous).
inline device_tensor upload(const_tensor_view t, int device) {
  device_tensor d(device, t.type(), t.shape());
  const int devs[1] = {device};
  device_uploader up(devs, std::max<std::size_t>(t.nbytes(), 4096));
  up.copy(t.data(), t.type(), d);
  up.synchronize();
  return d;
}

/// Uploads every rank's shards of `in` to `devices[r]` as `plans` say (one plan per tensor).
inline std::vector<device_shards> upload_shards(const checkpoint& in, const std::vector<tensor_shards>& plans,
                                                std::span<const int> devices, const upload_options& opts = {}) {
  if (plans.empty()) return {};
  const int N = plans.front().mesh.num_ranks();
  if (static_cast<int>(devices.size()) != N)
    throw device_error(std::to_string(devices.size()) + " device ids for " + std::to_string(N) +
                       " ranks: name one device per rank");
  for (int d : devices) require_cuda_device(d);
  for (const auto& p : plans)
    if (static_cast<int>(p.ranks.size()) != N || !in.contains(p.name))
      throw shape_error("tensor '" + p.name + "': not in the checkpoint or not planned for " + std::to_string(N) + " ranks");
  device_uploader up(devices, opts.staging_bytes);
  std::vector<device_shards> out(static_cast<std::size_t>(N));
  for (int r = 0; r < N; ++r) out[static_cast<std::size_t>(r)] = {r, devices[static_cast<std::size_t>(r)], {}};
  std::vector<std::byte> scratch;
  for (const auto& p : plans) {
    const auto& file = in.file_of(p.name);
    const auto& entry = in.entry(p.name);
    const_tensor_view src = file.view(entry);
    const dtype to = opts.convert_to && detail::is_float(p.type) && detail::is_float(*opts.convert_to) ? *opts.convert_to
                                                                                                      : p.type;
    for (int r = 0; r < N; ++r) {
      const shard_layout& l = p.ranks[static_cast<std::size_t>(r)];
      device_tensor dst(devices[static_cast<std::size_t>(r)], to, l.shape);
      const std::byte* bytes = nullptr;
      if (auto span = contiguous_span(l, p.global, p.type)) {
        bytes = src.data() + span->first;  // straight from the map
      } else {
        const std::size_t nb = static_cast<std::size_t>(l.shape.numel()) * dtype_size(p.type);
        if (scratch.size() < nb) scratch.resize(nb);
        extract(src, l, tensor_view(scratch.data(), l.shape, p.type));
        bytes = scratch.data();
      }
      up.copy(bytes, p.type, dst);
      out[static_cast<std::size_t>(r)].tensors.emplace(p.name, std::move(dst));
    }
    file.release(entry);  // copy() has read the bytes into pinned memory already
  }
  up.synchronize();
  return out;
}

/// Uploads by tensor-parallel policy over devices.size() ranks.
inline std::vector<device_shards> upload_shards(const checkpoint& in, const tp_policy& policy, const model_config& config,
                                                std::span<const int> devices, const upload_options& opts = {}) {
  const int tp = static_cast<int>(devices.size());
  (void)rescale_attributes(policy, config, tp);  // heads and widths must divide before anything moves
  std::vector<tensor_shards> plans;
  for (const auto& n : in.names()) plans.push_back(shards_of(policy, n, in.entry(n).shape, in.entry(n).type, tp, config));
  return upload_shards(in, plans, devices, opts);
}

/// Uploads by a solved plan; devices[r] receives rank r of the plan's mesh.
inline std::vector<device_shards> upload_shards(const checkpoint& in, const plan_policy& plan, std::span<const int> devices,
                                                const upload_options& opts = {}) {
  std::vector<tensor_shards> plans;
  for (const auto& n : in.names()) plans.push_back(shards_of(plan, n, in.entry(n).shape, in.entry(n).type));
  return upload_shards(in, plans, devices, opts);
}

/// Uploads rank `rank`'s file of a sharded directory to `device`.
inline device_shards upload_rank(const sharded_checkpoint& sc, int rank, int device, const upload_options& opts = {}) {
  require_cuda_device(device);
  const int devs[1] = {device};
  device_uploader up(devs, opts.staging_bytes);
  device_shards out{rank, device, {}};
  const auto& f = sc.rank(rank);
  for (const auto& e : f.entries()) {
    const dtype to = opts.convert_to && detail::is_float(e.type) && detail::is_float(*opts.convert_to) ? *opts.convert_to
                                                                                                      : e.type;
    device_tensor dst(device, to, e.shape);
    up.copy(f.bytes(e).data(), e.type, dst);
    out.tensors.emplace(e.name, std::move(dst));
  }
  up.synchronize();
  return out;
}

}  // namespace autoshard

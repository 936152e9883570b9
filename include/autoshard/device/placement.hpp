#pragma once
/// Placing shards on CUDA devices: each rank's shards of a checkpoint (by tensor-parallel
/// policy, by solved plan, or from a sharded directory) go to the device chosen for that
/// rank; replicated tensors go to every device. Bytes move once from the memory map (or one
/// block copy for strided shards) into pinned staging, filled by several host threads
/// (device/staging.hpp), and on with cudaMemcpyAsync on one stream per device, chunk by
/// chunk as they are staged, so the copy engine does not wait and copies to several devices
/// overlap. The staging is pooled per device: a second upload allocates nothing. A dtype
/// conversion runs on the device (device/convert.hpp) or on the staging threads.
///   autoshard::checkpoint in("gpt2");
///   std::vector<int> devices{0, 1, 2, 3};                       // rank r -> cuda:devices[r]
///   auto ranks = autoshard::upload_shards(in, autoshard::policies::gpt2(), 4, cfg, devices);
///   const autoshard::device_tensor& w = ranks[2].tensors.at("transformer.h.0.attn.c_attn.weight");
/// Without a device or driver, every entry point throws autoshard::device_error.
#include <algorithm>    // std::min, std::max
#include <cstddef>      // std::size_t, std::byte
#include <cstring>      // std::memcpy
#include <map>          // std::map
#include <memory>       // std::unique_ptr, std::make_unique
#include <optional>     // std::optional
#include <span>         // std::span
#include <string>       // std::string
#include <utility>      // std::exchange, std::pair
#include <vector>       // std::vector

#include <cuda_runtime_api.h>  // cudaMalloc, cudaHostAlloc, cudaMemcpyAsync, cudaStream_t, cudaEvent_t

#include "../core/error.hpp"                // device_error
#include "../tensor/host_tensor.hpp"        // host_tensor, convert_into
#include "../tensor/policy.hpp"             // tp_policy, plan_policy, shards_of
#include "../tensor/safetensors.hpp"        // checkpoint
#include "../tensor/shard_checkpoint.hpp"   // sharded_checkpoint
#include "../tensor/slice.hpp"              // extract, contiguous_span
#include "convert.hpp"                      // convert_on_device, device_converts
#include "staging.hpp"                      // staging_team, staging_ring, stage_through, reuse_pool

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

/// Where a dtype conversion during an upload runs.
enum class convert_site {
  automatic,  ///< on the device where its kernel loaded (f32, f16, bf16), else on the host
  host,       ///< the staging threads convert; PCIe carries the converted bytes
  device,     ///< PCIe carries the source bytes, a kernel converts them (device_error if it cannot)
};

struct upload_options {
  std::size_t staging_bytes = std::size_t{64} << 20;  ///< pinned staging per device, in 8 slots
  std::optional<dtype> convert_to;                    ///< float tensors only, as in shard_options
  unsigned staging_threads = 0;  ///< host threads that fill the staging: 0, the process's shared team (default_staging_threads())
  convert_site convert_on = convert_site::automatic;
  /// How the staging threads write pinned staging: ordinary stores, or non-temporal ones that
  /// bypass the CPU caches (docs/devices.md: which one the copy engine reads faster is measured
  /// by bench_device_upload_bandwidth's `streaming` rows).
  staging_stores stores = staging_stores::cached;
};

namespace detail {

/// One device's staging, kept between uploads (cuda_staging_pool): pinned slots (a ring),
/// a stream, an event per slot, and device scratch for conversions, made on first need.
class cuda_staging {
 public:
  static constexpr std::size_t slots = 8;

  cuda_staging(int device, std::size_t bytes) : device_(device) {
    const std::size_t slot_bytes = std::max<std::size_t>(bytes / slots, 64) / 64 * 64;
    cuda_check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
    try {
      cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
      cuda_check(cudaHostAlloc(&pinned_, slot_bytes * slots, cudaHostAllocPortable),
                 "cudaHostAlloc of " + std::to_string(slot_bytes * slots) + " pinned staging bytes");
      for (cudaEvent_t& e : done_) cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      ring_ = std::make_unique<staging_ring>(static_cast<std::byte*>(pinned_), slot_bytes, slots);
    } catch (...) {
      release();
      throw;
    }
  }
  cuda_staging(const cuda_staging&) = delete;
  cuda_staging& operator=(const cuda_staging&) = delete;
  ~cuda_staging() { release(); }

  int device() const noexcept { return device_; }
  cudaStream_t stream() const noexcept { return stream_; }
  staging_ring& ring() noexcept { return *ring_; }
  cudaEvent_t done(std::size_t s) const noexcept { return done_[s]; }
  /// Device memory as large as the ring, for source bytes a kernel converts (made once).
  std::byte* scratch() {
    if (scratch_ == nullptr)
      cuda_check(cudaMalloc(&scratch_, ring_->slot_bytes() * slots),
                 "cudaMalloc of " + std::to_string(ring_->slot_bytes() * slots) + " conversion bytes on cuda:" +
                     std::to_string(device_));
    return static_cast<std::byte*>(scratch_);
  }

 private:
  void release() noexcept {
    if (cudaSetDevice(device_) != cudaSuccess) return;
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : done_)
      if (e != nullptr) (void)cudaEventDestroy(e);
    if (scratch_ != nullptr) (void)cudaFree(scratch_);
    if (pinned_ != nullptr) (void)cudaFreeHost(pinned_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }
  int device_;
  cudaStream_t stream_ = nullptr;
  void* pinned_ = nullptr;
  void* scratch_ = nullptr;
  cudaEvent_t done_[slots] = {};
  std::unique_ptr<staging_ring> ring_;
};

using staging_key = std::pair<int, std::size_t>;  // device, staging bytes

/// The process's staging, per device and size: an upload takes one and gives it back, so
/// the next upload allocates nothing (at most 2 idle per device and size are kept; made at
/// first use, never destroyed: release_upload_staging() frees the idle ones).
inline reuse_pool<cuda_staging, staging_key>& cuda_staging_pool() {
  static auto* pool = new reuse_pool<cuda_staging, staging_key>(
      [](const staging_key& k) { return std::make_unique<cuda_staging>(k.first, k.second); }, 2);
  return *pool;
}

/// What stage_through hands chunks to: the copy engine (and the conversion kernel).
struct cuda_staging_sink {
  cuda_staging& staging;
  std::byte* out;
  dtype from, to;
  bool on_device;

  void wait_slot(std::size_t s) const { cuda_check(cudaEventSynchronize(staging.done(s)), "cudaEventSynchronize"); }
  bool done(std::size_t s) const {
    const cudaError_t e = cudaEventQuery(staging.done(s));
    if (e == cudaErrorNotReady) return false;
    cuda_check(e, "cudaEventQuery");
    return true;
  }
  /// On the thread that called copy(), whose device is current.
  void issue(std::size_t s, std::size_t first, std::size_t count) const {
    const int d = staging.device();
    const std::byte* slot = staging.ring().slot(s);
    const cudaStream_t stream = staging.stream();
    std::byte* dst = out + first * dtype_size(to);
    if (on_device) {
      std::byte* bytes = staging.scratch() + s * staging.ring().slot_bytes();
      cuda_check(cudaMemcpyAsync(bytes, slot, count * dtype_size(from), cudaMemcpyHostToDevice, stream),
                 "cudaMemcpyAsync H2D to cuda:" + std::to_string(d));
      cuda_check(convert_on_device(bytes, from, dst, to, count, stream),
                 "the conversion kernel on cuda:" + std::to_string(d));
    } else {
      cuda_check(cudaMemcpyAsync(dst, slot, count * dtype_size(to), cudaMemcpyHostToDevice, stream),
                 "cudaMemcpyAsync H2D to cuda:" + std::to_string(d));
    }
    cuda_check(cudaEventRecord(staging.done(s), stream), "cudaEventRecord");
  }
};

}  // namespace detail

/// Frees the pinned staging that uploads keep for the next one (only what no upload uses).
inline void release_upload_staging() { detail::cuda_staging_pool().trim(); }

/// Streams host bytes to devices: staging threads copy (or convert) parts of each tensor
/// into pinned slots, and the calling thread hands each finished chunk to its device's copy
/// engine while the next is staged, so the copy engine does not wait for one host thread. The staging
/// comes from a per-device pool, so a new uploader allocates nothing. copy() returns once
/// the source was read (it may be freed or reused then); synchronize() waits for the
/// devices. Destroying it synchronises and gives the staging back. Not thread-safe.
class device_uploader {
 public:
  device_uploader(std::span<const int> devices, const upload_options& opts = {})
      : site_(opts.convert_on), stores_(opts.stores) {
    if (site_ == convert_site::device && !device_conversion_error().empty())
      throw device_error("conversion on the device asked for, but " + device_conversion_error());
    if (opts.staging_threads != 0) own_team_ = std::make_unique<staging_team>(opts.staging_threads);
    team_ = own_team_ ? own_team_.get() : &shared_staging_team();
    const std::size_t bytes = std::max<std::size_t>(opts.staging_bytes, detail::cuda_staging::slots * 64);
    for (int d : devices) {
      require_cuda_device(d);
      if (lanes_.count(d)) continue;
      lanes_.emplace(d, detail::cuda_staging_pool().acquire({d, bytes}));
    }
  }
  /// The older form: `staging_bytes` of pinned staging per device.
  device_uploader(std::span<const int> devices, std::size_t staging_bytes)
      : device_uploader(devices, with_staging(staging_bytes)) {}
  device_uploader(const device_uploader&) = delete;
  device_uploader& operator=(const device_uploader&) = delete;
  ~device_uploader() {
    for (auto& [d, l] : lanes_) {
      // Staging whose stream failed is not given back: a later upload would inherit the failure.
      if (cudaSetDevice(d) != cudaSuccess || cudaStreamSynchronize(l->stream()) != cudaSuccess) {
        (void)cudaGetLastError();
        l.discard();
      }
    }
  }
  /// Pinned staging bytes per device, and the host threads that fill it.
  std::size_t staging_bytes() const noexcept {
    return lanes_.empty() ? 0 : lanes_.begin()->second->ring().slot_bytes() * detail::cuda_staging::slots;
  }
  unsigned staging_threads() const noexcept { return team_->threads(); }
  /// Whether copy() converts `from` to `to` with the device's kernel (else on the host).
  bool converts_on_device(dtype from, dtype to) const {
    return from != to && site_ != convert_site::host && device_converts(from, to);
  }

  /// Copies the dst.numel() elements of `from` at `src` (contiguous host memory) into
  /// `dst`, converting float dtypes where they differ; asynchronous for the device.
  void copy(const std::byte* src, dtype from, device_tensor& dst) {
    auto it = lanes_.find(dst.device());
    if (it == lanes_.end())
      throw device_error("upload to cuda:" + std::to_string(dst.device()) + ", a device this uploader was not made for");
    if (from != dst.type() && (!detail::is_float(from) || !detail::is_float(dst.type())))
      throw device_error("cannot upload " + std::string(to_string(from)) + " as " + std::string(to_string(dst.type())) +
                         ": only float dtypes (f32, f64, f16, bf16) convert");
    detail::cuda_staging& st = *it->second;
    const bool on_device = converts_on_device(from, dst.type());
    detail::cuda_check(cudaSetDevice(st.device()), "cudaSetDevice(" + std::to_string(st.device()) + ")");
    if (on_device) (void)st.scratch();  // made here, not by several staging threads at once
    detail::cuda_staging_sink sink{st, static_cast<std::byte*>(dst.data()), from, dst.type(), on_device};
    stage_through(*team_, st.ring(), src, from, on_device ? from : dst.type(), static_cast<std::size_t>(dst.shape().numel()),
                  sink, stores_);
  }
  /// Waits for every copy.
  void synchronize() {
    for (auto& [d, l] : lanes_) {
      detail::cuda_check(cudaSetDevice(d), "cudaSetDevice(" + std::to_string(d) + ")");
      detail::cuda_check(cudaStreamSynchronize(l->stream()), "cudaStreamSynchronize on cuda:" + std::to_string(d));
    }
  }

 private:
  static upload_options with_staging(std::size_t bytes) {
    upload_options o;
    o.staging_bytes = bytes;
    return o;
  }
  convert_site site_;
  staging_stores stores_;
  std::unique_ptr<staging_team> own_team_;
  staging_team* team_ = nullptr;
  std::map<int, reuse_pool<detail::cuda_staging, detail::staging_key>::lease> lanes_;
};

/// Uploads one host tensor to `device` (synchronous), converted to opts.convert_to if
/// that is set and both are float dtypes. Staging comes from the per-device pool.
inline device_tensor upload(const_tensor_view t, int device, const upload_options& opts = {}) {
  const dtype to = opts.convert_to && detail::is_float(t.type()) && detail::is_float(*opts.convert_to) ? *opts.convert_to
                                                                                                   : t.type();
  device_tensor d(device, to, t.shape());
  const int devs[1] = {device};
  device_uploader up(devs, opts);
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
      throw shape_error("tensor " + quoted_text(p.name) + ": not in the checkpoint or not planned for " + std::to_string(N) + " ranks");
  device_uploader up(devices, opts);
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
    file.release(entry);  // copy() has read the bytes into pinned staging already
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
  device_uploader up(devs, opts);
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

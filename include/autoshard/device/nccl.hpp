#pragma once
/// The NCCL backend: the communicator concept of comm/communicator.hpp on CUDA device
/// buffers. One CUDA device and one stream per communicator; the NCCL unique id travels
/// through the same rendezvous store the Gloo backend uses (a FileStore directory shared
/// by the processes of a run); sub-communicators per mesh axis come from ncclCommSplit.
///   auto store = autoshard::gloo_store::file("/tmp/run1");        // or nccl_memory_store
///   auto world = autoshard::nccl_communicator::connect(store, rank, 8, {.timeout = 10s});
///   autoshard::nccl_mesh_communicator mc(std::move(world), autoshard::device_mesh{2, 4});
///   mc.axis(1).all_reduce(dev_ptr, n, autoshard::dtype::bf16, autoshard::reduce_op::sum);
/// Communicators are non-blocking NCCL communicators: every call polls the stream and
/// ncclCommGetAsyncError until the work is done, the communicator reports an error, or
/// the timeout passes; the last two abort the communicator (ncclCommAbort) and throw
/// comm_error naming the rank, the group, the call and NCCL's message (NCCL's own error for
/// the call that failed). A split group of one rank (a mesh axis of size 1: 1x8, a data-
/// parallel axis of 1) has no NCCL communicator: its collectives are local. Missing CUDA
/// devices or drivers, and CUDA failures, throw device_error; nothing crashes.
#include <algorithm>           // std::min_element
#include <chrono>              // std::chrono::milliseconds, steady_clock
#include <concepts>            // std::convertible_to
#include <condition_variable>  // std::condition_variable
#include <cstddef>             // std::size_t
#include <cstdint>             // std::uintptr_t
#include <cstdio>              // std::snprintf
#include <cstring>             // std::memcpy
#include <exception>           // std::exception
#include <map>                 // std::map
#include <memory>              // std::unique_ptr
#include <mutex>               // std::mutex
#include <string>              // std::string
#include <thread>              // std::this_thread
#include <utility>             // std::exchange, std::move
#include <vector>              // std::vector

#include <cuda_runtime_api.h>  // cudaStream_t, cudaGetDeviceCount, cudaStreamQuery, ...
#include <nccl.h>              // ncclComm_t, ncclCommInitRankConfig, ncclAllReduce, ...

#include "../comm/communicator.hpp"       // communicator concept
#include "../comm/mesh_communicator.hpp"  // basic_mesh_communicator, detail::check_split, detail::rank_list
#include "../core/dtype.hpp"         // dtype, dtype_size, to_string
#include "../core/error.hpp"         // comm_error, device_error
#include "../core/mesh.hpp"          // device_mesh
#include "../core/placement.hpp"     // reduce_op

namespace autoshard {

/// How an NCCL rank picks its device and how long it waits.
struct nccl_options {
  int device = -1;                           ///< CUDA device ordinal; -1: rank % device count
  std::chrono::milliseconds timeout{30000};  ///< per operation, and for connecting
  std::string name = "nccl";                 ///< store key prefix: tells worlds in one store apart
};

/// A key-value store the ranks of one run share: what gloo::rendezvous::Store offers.
template <class S>
concept rendezvous_store = requires(S& s, const std::string& k, const std::vector<char>& v,
                                    const std::vector<std::string>& ks, std::chrono::milliseconds t) {
  s.set(k, v);
  { s.get(k) } -> std::convertible_to<std::vector<char>>;
  s.wait(ks, t);
};

/// A store wrapper whose get() hands out the store (autoshard::gloo_store does).
template <class W>
concept rendezvous_store_wrapper = requires(const W& w) {
  { w.get() } -> rendezvous_store;
};

/// An in-process store, for ranks that are threads of one process (one GPU each).
class nccl_memory_store {
 public:
  void set(const std::string& key, const std::vector<char>& value) {
    {
      std::lock_guard lock(m_);
      kv_[key] = value;
    }
    cv_.notify_all();
  }
  /// Waits (at most 30 s, as gloo's stores do) for the key.
  std::vector<char> get(const std::string& key) {
    wait({key}, std::chrono::seconds(30));
    std::lock_guard lock(m_);
    return kv_.at(key);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    std::unique_lock lock(m_);
    const bool ok = cv_.wait_for(lock, timeout, [&] {
      for (const auto& k : keys)
        if (kv_.find(k) == kv_.end()) return false;
      return true;
    });
    if (!ok) throw comm_error("in-process store: keys not set within " + std::to_string(timeout.count()) + " ms");
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> kv_;
};

namespace detail {

inline std::string nccl_cuda_message(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

inline void nccl_cuda_check(cudaError_t e, const std::string& who, const char* call) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky error so later calls are not blamed
  throw device_error(who + ": " + call + " failed (" + nccl_cuda_message(e) + ")");
}

/// Makes `device` current for a scope and restores the caller's device after.
class nccl_device_scope {
 public:
  nccl_device_scope(int device, const std::string& who) {
    nccl_cuda_check(cudaGetDevice(&previous_), who, "cudaGetDevice");
    if (previous_ != device) nccl_cuda_check(cudaSetDevice(device), who, "cudaSetDevice");
  }
  nccl_device_scope(const nccl_device_scope&) = delete;
  nccl_device_scope& operator=(const nccl_device_scope&) = delete;
  ~nccl_device_scope() { (void)cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

inline ncclDataType_t nccl_type(dtype t) {
  switch (t) {
    case dtype::f32: return ncclFloat32;
    case dtype::f16: return ncclFloat16;
    case dtype::bf16: return ncclBfloat16;
    case dtype::f64: return ncclFloat64;
    case dtype::i32: return ncclInt32;
    case dtype::i64: return ncclInt64;
    case dtype::u8:
    case dtype::boolean: return ncclUint8;
  }
  return ncclUint8;
}

/// As reduce_elements: on booleans (stored 0/1) sum and max are "or", min is "and".
inline ncclRedOp_t nccl_op(reduce_op op, dtype t) {
  switch (op) {
    case reduce_op::sum: return t == dtype::boolean ? ncclMax : ncclSum;
    case reduce_op::max: return ncclMax;
    case reduce_op::min: return ncclMin;
  }
  return ncclSum;
}

template <class S>
auto& nccl_store_ref(S& s) {
  if constexpr (rendezvous_store<S>)
    return s;
  else
    return s.get();
}

}  // namespace detail

/// A group of ranks, one CUDA device each, with a connected NCCL communicator and its own
/// stream. Buffers are device (or managed) memory on this communicator's device. Movable,
/// not copyable; the destructor finalizes the communicator (aborting it past the timeout).
class nccl_communicator {
 public:
  nccl_communicator() = default;
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  nccl_communicator(nccl_communicator&& o) noexcept { take(o); }
  nccl_communicator& operator=(nccl_communicator&& o) noexcept {
    if (this != &o) {
      close();
      take(o);
    }
    return *this;
  }
  ~nccl_communicator() { close(); }

  /// CUDA devices this process sees; 0 when there is no device or no driver (never throws).
  static int device_count() noexcept {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  }

  /// The version of the NCCL library linked at run time, e.g. 22809 for 2.28.9.
  static int library_version() {
    int v = 0;
    if (ncclResult_t r = ncclGetVersion(&v); r != ncclSuccess)
      throw device_error(std::string("ncclGetVersion failed: ") + ncclGetErrorString(r));
    return v;
  }

  /// Joins the world of `size` ranks as `rank`. Rank 0 draws the NCCL unique id and
  /// publishes it in `store` (a gloo_store, gloo::rendezvous::Store or nccl_memory_store,
  /// fresh per run) under "<name>/unique-id"; the others wait for it up to the timeout.
  template <class Store>
    requires rendezvous_store<Store> || rendezvous_store_wrapper<Store>
  static nccl_communicator connect(Store& store, int rank, int size, const nccl_options& opts = {}) {
    const std::string me = "rank " + std::to_string(rank);
    if (size < 1 || rank < 0 || rank >= size)
      throw comm_error(me + " is outside a world of " + std::to_string(size));
    const int device = pick_device(rank, opts.device, me);
    ncclUniqueId id{};
    const std::string key = opts.name + "/unique-id";
    auto& s = detail::nccl_store_ref(store);
    if (rank == 0) {
      if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
        throw comm_error(me + ": ncclGetUniqueId failed: " + ncclGetErrorString(r));
      if (size > 1) {
        try {
          s.set(key, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
        } catch (const std::exception& e) {
          throw comm_error(me + ": publishing the NCCL unique id under " + quoted_text(key) + " failed: " + e.what());
        }
      }
    } else {
      std::vector<char> bytes;
      try {
        s.wait({key}, opts.timeout);
        bytes = s.get(key);
      } catch (const std::exception& e) {
        throw comm_error(me + ": no NCCL unique id under " + quoted_text(key) + " within " + std::to_string(opts.timeout.count()) +
                         " ms (rank 0 never published one): " + e.what());
      }
      if (bytes.size() != sizeof(id.internal))
        throw comm_error(me + ": the NCCL unique id under " + quoted_text(key) + " holds " + std::to_string(bytes.size()) +
                         " bytes, expected " + std::to_string(sizeof(id.internal)));
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    std::vector<int> members(static_cast<std::size_t>(size));
    for (int i = 0; i < size; ++i) members[static_cast<std::size_t>(i)] = i;
    nccl_communicator c(device, opts.timeout, std::move(members), rank, rank, {});
    c.init_rank(id, opts.name);
    return c;
  }

  /// A sub-communicator of the ranks `members` (ranks of this communicator, in the new
  /// group's order; this rank must be one of them). Every rank of this communicator calls
  /// split at the same point, each with its own group, and the groups must not overlap
  /// (mesh axes partition the ranks): NCCL splits by colour (the group's lowest member).
  /// A group of one rank gets no NCCL communicator: its collectives are local (a copy on
  /// the stream, or nothing), and it takes part in the parent's ncclCommSplit with
  /// NCCL_SPLIT_NOCOLOR, as every rank of the parent must; a one-rank parent calls nothing.
  nccl_communicator split(const std::vector<int>& members, const std::string& name) {
    require_open("split");
    detail::split_group g = detail::check_split(members, rank(), members_, who(), name);
    const int my = g.index;
    const bool alone = g.world_ranks.size() == 1;
    const int color = alone ? NCCL_SPLIT_NOCOLOR : *std::min_element(members.begin(), members.end());
    nccl_communicator c(device_, timeout_, std::move(g.world_ranks), my, global_rank_, name);
    c.nccl_name_ = std::make_unique<std::string>((nccl_name_ ? *nccl_name_ : std::string("nccl")) + "/" + name);
    c.local_ = c.local_open_ = alone;
    if (alone && (local_ || size() == 1)) return c;  // nobody to split with
    detail::nccl_device_scope scope(device_, who());
    ncclConfig_t config = make_config(*c.nccl_name_);
    // Non-blocking: NCCL writes the new handle only once the split completed, which the
    // parent's state tells (it stays ncclInProgress until then); the slot lives on the heap
    // so that a split abandoned at the timeout never writes into a dead stack frame.
    auto* slot = new ncclComm_t(nullptr);
    const ncclResult_t r = ncclCommSplit(comm_, color, my, slot, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      delete slot;
      fail("ncclCommSplit", r);  // NCCL's own error for the split, then the parent is aborted
    }
    // On failure or timeout this aborts the parent (which stops the split) and throws; the
    // slot is then left to NCCL, never freed.
    wait_state(comm_, "ncclCommSplit");
    c.comm_ = std::exchange(*slot, nullptr);
    delete slot;
    if (alone) {
      if (c.comm_ != nullptr) {  // NCCL_SPLIT_NOCOLOR makes none; never leak one
        c.abort();
        throw comm_error(c.who() + ": ncclCommSplit with NCCL_SPLIT_NOCOLOR returned a communicator");
      }
      return c;
    }
    if (c.comm_ == nullptr)
      throw comm_error(c.who() + ": ncclCommSplit " + quoted_text(name) + " completed without a communicator for a group of " +
                       std::to_string(c.size()) + " ranks");
    c.wait_state(c.comm_, "ncclCommSplit (the new communicator)");
    int count = 0, user_rank = -1;
    c.check_nccl(ncclCommCount(c.comm_, &count), "ncclCommCount");
    c.check_nccl(ncclCommUserRank(c.comm_, &user_rank), "ncclCommUserRank");
    if (count != c.size() || user_rank != my) {
      c.abort();
      throw comm_error(c.who() + ": split " + quoted_text(name) + " made a group of " + std::to_string(count) + " ranks (rank " +
                       std::to_string(user_rank) + ") where " + std::to_string(c.size()) + " (rank " +
                       std::to_string(my) + ") were asked for: the groups of the ranks overlap or differ");
    }
    return c;
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return static_cast<int>(members_.size()); }
  /// Rank in the world this communicator was split from.
  int global_rank() const noexcept { return global_rank_; }
  /// World ranks of the members, in group order.
  const std::vector<int>& members() const noexcept { return members_; }
  /// The CUDA device every buffer must live on.
  int device() const noexcept { return device_; }
  /// The stream the collectives run on (work the caller queues there runs in order with them).
  cudaStream_t stream() const noexcept { return stream_; }
  /// The NCCL communicator; nullptr for a one-rank group (is_local()) and once aborted.
  ncclComm_t native_handle() const noexcept { return comm_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) noexcept { timeout_ = t; }
  /// False before connect and after a failure aborted the communicator.
  bool is_open() const noexcept { return comm_ != nullptr || local_open_; }
  /// A group of one rank made by split: no NCCL communicator, every collective local.
  bool is_local() const noexcept { return local_; }
  /// "rank 5 (axis1 group [4,5,6,7], cuda:1)": how errors name this end.
  std::string who() const {
    return "rank " + std::to_string(global_rank_) + " (" +
           (label_.empty() ? std::string() : label_ + " group " + detail::rank_list(members_) + ", ") + "cuda:" +
           std::to_string(device_) + ")";
  }

  void all_reduce(void* buf, std::size_t n, dtype t, reduce_op op) {
    require_open("all-reduce");
    if (n == 0) return;  // nothing moves; NCCL is not asked about empty buffers
    check_buffer("all-reduce", buf, n, t);
    if (local_) return;  // one rank's reduction is its own data
    run("ncclAllReduce", n, t, [&] {
      return ncclAllReduce(buf, buf, n, detail::nccl_type(t), detail::nccl_op(op, t), comm_, stream_);
    });
  }

  void all_gather(const void* in, void* out, std::size_t n, dtype t) {
    require_open("all-gather");
    if (n == 0) return;
    check_buffer("all-gather input", in, n, t);
    check_buffer("all-gather output", out, n * static_cast<std::size_t>(size()), t);
    if (local_) return local_copy("all-gather", in, out, n, t);
    run("ncclAllGather", n, t, [&] { return ncclAllGather(in, out, n, detail::nccl_type(t), comm_, stream_); });
  }

  void reduce_scatter(const void* in, void* out, std::size_t n, dtype t, reduce_op op) {
    require_open("reduce-scatter");
    if (n == 0) return;
    check_buffer("reduce-scatter input", in, n * static_cast<std::size_t>(size()), t);
    check_buffer("reduce-scatter output", out, n, t);
    if (local_) return local_copy("reduce-scatter", in, out, n, t);
    run("ncclReduceScatter", n, t, [&] {
      return ncclReduceScatter(in, out, n, detail::nccl_type(t), detail::nccl_op(op, t), comm_, stream_);
    });
  }

  /// Grouped ncclSend/ncclRecv pairs (one per peer); the local block is a device copy.
  void all_to_all(const void* in, void* out, std::size_t n, dtype t) {
    require_open("all-to-all");
    if (n == 0) return;
    const std::size_t total = n * static_cast<std::size_t>(size());
    check_buffer("all-to-all input", in, total, t);
    check_buffer("all-to-all output", out, total, t);
    if (in == out && size() > 1 && n != 0)
      throw comm_error(who() + ": all-to-all needs distinct input and output buffers");
    if (local_) return local_copy("all-to-all", in, out, n, t);
    const std::size_t bytes = n * dtype_size(t);
    const auto* src = static_cast<const std::byte*>(in);
    auto* dst = static_cast<std::byte*>(out);
    run("all-to-all (ncclSend/ncclRecv)", n, t, [&] {
      if (bytes != 0 && in != out) {
        const std::size_t me = static_cast<std::size_t>(rank_);
        if (cudaError_t e = cudaMemcpyAsync(dst + me * bytes, src + me * bytes, bytes, cudaMemcpyDeviceToDevice, stream_);
            e != cudaSuccess)
          detail::nccl_cuda_check(e, who(), "cudaMemcpyAsync (all-to-all local block)");
      }
      if (size() == 1 || n == 0) return ncclSuccess;
      if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) return r;
      ncclResult_t first = ncclSuccess;
      for (int p = 0; p < size() && first == ncclSuccess; ++p) {
        if (p == rank_) continue;
        const std::size_t off = static_cast<std::size_t>(p) * bytes;
        first = ncclSend(src + off, n, detail::nccl_type(t), p, comm_, stream_);
        if (first == ncclSuccess) first = ncclRecv(dst + off, n, detail::nccl_type(t), p, comm_, stream_);
      }
      const ncclResult_t end = ncclGroupEnd();
      return first != ncclSuccess ? first : end;
    });
  }

  void broadcast(void* buf, std::size_t n, dtype t, int root) {
    require_open("broadcast");
    if (root < 0 || root >= size())
      throw comm_error(who() + ": broadcast from root " + std::to_string(root) + " outside the group of " +
                       std::to_string(size()));
    if (n == 0) return;
    check_buffer("broadcast", buf, n, t);
    if (local_) return;  // the root's data is already everywhere
    run("ncclBroadcast", n, t,
        [&] { return ncclBroadcast(buf, buf, n, detail::nccl_type(t), root, comm_, stream_); });
  }

  /// NCCL has no barrier: an all-reduce of one integer, waited for on the host (a one-rank
  /// group waits for its stream).
  void barrier() {
    require_open("barrier");
    if (local_) return synchronize();
    run("barrier (ncclAllReduce)", 1, dtype::i32,
        [&] { return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_); });
  }

  /// Runs f() between ncclGroupStart and ncclGroupEnd: the collectives f calls on this
  /// communicator are launched together (one step of several buffers) and waited for
  /// once, at the end. Groups nest. If f throws (a refused buffer, a failed call), the
  /// group is closed and the communicator aborted: part of the step may be on its way.
  ///   comm.group([&] { for (auto& g : grads) comm.all_reduce(g.data, g.n, dtype::bf16, reduce_op::sum); });
  template <class F>
  void group(F&& f) {
    require_open("group");
    detail::nccl_device_scope scope(device_, who());
    if (!local_) check_nccl(ncclGroupStart(), "ncclGroupStart");
    ++group_depth_;
    try {
      f();
    } catch (...) {
      // Part of the step may be queued: close NCCL's group (the first error is the one
      // worth reporting), then abort, since the peers now wait for calls that never come.
      --group_depth_;
      if (!local_) (void)ncclGroupEnd();
      if (group_depth_ == 0) abort();
      throw;
    }
    --group_depth_;
    if (!local_) {
      const ncclResult_t r = ncclGroupEnd();
      if (r != ncclSuccess && r != ncclInProgress) fail("ncclGroupEnd", r);
      if (r == ncclInProgress) wait_state(comm_, "ncclGroupEnd");
    }
    if (group_depth_ == 0) wait_stream("group", 0, dtype::u8);
  }

  /// Waits for everything queued on this communicator's stream (timeout and abort as above).
  void synchronize() {
    require_open("synchronize");
    detail::nccl_device_scope scope(device_, who());
    wait_stream("synchronize", 0, dtype::u8);
  }

  /// Aborts the communicator now (peers blocked in a collective with it fail too).
  void abort() noexcept {
    local_open_ = false;
    if (comm_ == nullptr) return;
    int prev = 0;
    const bool restore = cudaGetDevice(&prev) == cudaSuccess;
    (void)cudaSetDevice(device_);
    (void)ncclCommAbort(std::exchange(comm_, nullptr));
    if (restore) (void)cudaSetDevice(prev);
  }

 private:
  nccl_communicator(int device, std::chrono::milliseconds timeout, std::vector<int> members, int rank, int global_rank,
                    std::string label)
      : timeout_(timeout), label_(std::move(label)), members_(std::move(members)),
        device_(device), rank_(rank), global_rank_(global_rank) {
    detail::nccl_device_scope scope(device_, who());
    detail::nccl_cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), who(), "cudaStreamCreateWithFlags");
    if (cudaError_t e = cudaMalloc(&scratch_, sizeof(int)); e != cudaSuccess) {
      (void)cudaStreamDestroy(std::exchange(stream_, nullptr));
      detail::nccl_cuda_check(e, who(), "cudaMalloc (barrier scratch)");
    }
    if (cudaError_t e = cudaMemset(scratch_, 0, sizeof(int)); e != cudaSuccess) {
      release_cuda();
      detail::nccl_cuda_check(e, who(), "cudaMemset (barrier scratch)");
    }
  }

  static int pick_device(int rank, int wanted, const std::string& me) {
    int count = 0;
    if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
      (void)cudaGetLastError();
      throw device_error(me + ": cudaGetDeviceCount failed (" + detail::nccl_cuda_message(e) +
                         "): NCCL needs a CUDA device and driver");
    }
    if (count == 0) throw device_error(me + ": no CUDA device is visible: NCCL needs one per rank");
    const int device = wanted >= 0 ? wanted : rank % count;
    if (device >= count)
      throw device_error(me + ": CUDA device " + std::to_string(device) + " asked for, but only " +
                         std::to_string(count) + " are visible");
    return device;
  }

  /// `name` must outlive the communicator: NCCL keeps the pointer (nccl_name_ holds it).
  static ncclConfig_t make_config(const std::string& name) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // calls return at once; wait_state/wait_stream poll with the timeout
    config.commName = name.c_str();
    return config;
  }

  void init_rank(const ncclUniqueId& id, const std::string& name) {
    detail::nccl_device_scope scope(device_, who());
    nccl_name_ = std::make_unique<std::string>(name);
    ncclConfig_t config = make_config(*nccl_name_);
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, size(), id, rank_, &config);
    comm_ = comm;
    if (r != ncclSuccess && r != ncclInProgress) {
      abort();
      throw comm_error(who() + ": ncclCommInitRankConfig of " + std::to_string(size()) + " ranks failed: " +
                       ncclGetErrorString(r) + last_error(nullptr));
    }
    if (r == ncclInProgress) wait_state(comm_, "ncclCommInitRankConfig");
  }

  void take(nccl_communicator& o) noexcept {
    comm_ = std::exchange(o.comm_, nullptr);
    stream_ = std::exchange(o.stream_, nullptr);
    scratch_ = std::exchange(o.scratch_, nullptr);
    nccl_name_ = std::move(o.nccl_name_);
    timeout_ = o.timeout_;
    label_ = std::move(o.label_);
    members_ = std::move(o.members_);
    device_ = o.device_;
    rank_ = o.rank_;
    global_rank_ = o.global_rank_;
    group_depth_ = std::exchange(o.group_depth_, 0);
    local_ = std::exchange(o.local_, false);
    local_open_ = std::exchange(o.local_open_, false);
  }

  void release_cuda() noexcept {
    if (scratch_ != nullptr) (void)cudaFree(std::exchange(scratch_, nullptr));
    if (stream_ != nullptr) (void)cudaStreamDestroy(std::exchange(stream_, nullptr));
  }

  /// Finalize (flushes queued work, bounded by the timeout), then destroy; abort on failure.
  void close() noexcept {
    local_open_ = false;
    if (comm_ == nullptr && stream_ == nullptr && scratch_ == nullptr) return;
    int prev = 0;
    const bool restore = cudaGetDevice(&prev) == cudaSuccess;
    (void)cudaSetDevice(device_);
    if (comm_ != nullptr) {
      ncclResult_t r = ncclCommFinalize(comm_);
      const auto deadline = std::chrono::steady_clock::now() + timeout_;
      while (r == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) r = ncclInternalError;
      }
      if (r == ncclSuccess)
        (void)ncclCommDestroy(std::exchange(comm_, nullptr));
      else
        (void)ncclCommAbort(std::exchange(comm_, nullptr));
    }
    release_cuda();
    if (restore) (void)cudaSetDevice(prev);
  }

  void require_open(const char* op) const {
    if (members_.empty()) throw comm_error(std::string(op) + " on an NCCL communicator that was never connected");
    if (!is_open()) throw comm_error(who() + ": " + op + " on an NCCL communicator an earlier failure aborted");
  }

  std::string last_error(ncclComm_t c) const {
    const char* s = ncclGetLastError(c);
    return s != nullptr && *s != '\0' ? std::string(" (") + s + ")" : std::string();
  }

  /// Aborts and throws comm_error for a failed NCCL call.
  [[noreturn]] void fail(const std::string& call, ncclResult_t r, std::size_t n = 0, dtype t = dtype::u8) {
    std::string what = who() + ": " + call;
    if (n != 0) what += " of " + std::to_string(n) + " " + std::string(to_string(t)) + " elements";
    what += " failed: " + std::string(ncclGetErrorString(r)) + last_error(comm_);
    if (group_depth_ == 0) abort();  // inside group(), only after ncclGroupEnd has let go of the calls
    throw comm_error(what);
  }

  void check_nccl(ncclResult_t r, const char* call) {
    if (r != ncclSuccess) fail(call, r);
  }

  /// Polls the non-blocking communicator `handle` (this one's, or the parent's during a
  /// split) until its last call left ncclInProgress; NCCL's own error for `call` if it failed.
  void wait_state(ncclComm_t handle, const char* call) {
    if (handle == nullptr) {  // never a follow-on NCCL call on a null handle
      abort();
      throw comm_error(who() + ": " + call + " returned ncclInProgress without a communicator to wait on");
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (unsigned spin = 0;; ++spin) {
      ncclResult_t state = ncclSuccess;
      if (ncclResult_t r = ncclCommGetAsyncError(handle, &state); r != ncclSuccess) fail("ncclCommGetAsyncError", r);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(call, state);
      if (std::chrono::steady_clock::now() > deadline) {
        abort();
        throw comm_error(who() + ": " + call + " did not complete within " + std::to_string(timeout_.count()) +
                         " ms (a peer never joined, died or is stuck); the communicator was aborted");
      }
      backoff(spin);
    }
  }

  /// Polls the stream and the communicator until the queued work is done.
  void wait_stream(const char* op, std::size_t n, dtype t) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (unsigned spin = 0;; ++spin) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        abort();
        detail::nccl_cuda_check(q, who(), (std::string("cudaStreamQuery after ") + op).c_str());
      }
      if (comm_ != nullptr) {  // a one-rank group has only its stream to watch
        ncclResult_t state = ncclSuccess;
        if (ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess) fail("ncclCommGetAsyncError", r);
        if (state != ncclSuccess && state != ncclInProgress) fail(op, state, n, t);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        const std::string what = who() + ": " + op + (n ? " of " + std::to_string(n) + " " + std::string(to_string(t)) + " elements" : std::string()) +
                                 " did not finish within " + std::to_string(timeout_.count()) +
                                 " ms (a peer is missing, died or called a different collective); the communicator was aborted";
        abort();
        throw comm_error(what);
      }
      backoff(spin);
    }
  }

  static void backoff(unsigned spin) {
    if (spin < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(spin < 1024 ? 20 : 200));
  }

  /// Launches one call (enqueue returns its ncclResult_t), then waits unless inside group().
  template <class F>
  void run(const char* call, std::size_t n, dtype t, F&& enqueue) {
    require_open(call);
    detail::nccl_device_scope scope(device_, who());
    const ncclResult_t r = enqueue();
    if (r != ncclSuccess && r != ncclInProgress) fail(call, r, n, t);
    if (r == ncclInProgress) wait_state(comm_, call);
    if (group_depth_ == 0) wait_stream(call, n, t);
  }

  /// A one-rank group's all-gather, reduce-scatter or all-to-all: `n` elements from `in`
  /// to `out` on the stream (nothing when they are the same buffer), waited for unless
  /// inside group().
  void local_copy(const char* op, const void* in, void* out, std::size_t n, dtype t) {
    detail::nccl_device_scope scope(device_, who());
    if (in != out)
      detail::nccl_cuda_check(cudaMemcpyAsync(out, in, n * dtype_size(t), cudaMemcpyDeviceToDevice, stream_), who(),
                              (std::string("cudaMemcpyAsync (one-rank ") + op + ")").c_str());
    if (group_depth_ == 0) wait_stream(op, n, t);
  }

  /// Buffers must be device or managed memory on this device: a host pointer would fault
  /// inside a kernel, far from the call that passed it.
  void check_buffer(const char* what, const void* p, std::size_t n, dtype t) const {
    if (n == 0) return;
    if (p == nullptr) throw comm_error(who() + ": " + what + " buffer is null for " + std::to_string(n) + " elements");
    cudaPointerAttributes a{};
    if (cudaError_t e = cudaPointerGetAttributes(&a, p); e != cudaSuccess) {
      (void)cudaGetLastError();
      throw comm_error(who() + ": " + what + " buffer: cudaPointerGetAttributes failed (" +
                       detail::nccl_cuda_message(e) + ")");
    }
    const bool ok = a.type == cudaMemoryTypeManaged || (a.type == cudaMemoryTypeDevice && a.device == device_);
    if (!ok) {
      char addr[32];
      std::snprintf(addr, sizeof addr, "%p", p);
      const std::string where = a.type == cudaMemoryTypeDevice ? "device memory of cuda:" + std::to_string(a.device)
                                : a.type == cudaMemoryTypeHost ? std::string("pinned host memory")
                                                               : std::string("host memory");
      throw comm_error(who() + ": " + what + " buffer " + addr + " of " + std::to_string(n) + " " +
                       std::string(to_string(t)) + " elements is " + where + "; NCCL needs device memory on cuda:" +
                       std::to_string(device_));
    }
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;  // one int for barrier()
  std::unique_ptr<std::string> nccl_name_;  // ncclConfig_t::commName: NCCL keeps the pointer
  std::chrono::milliseconds timeout_{30000};
  std::string label_;  // what errors call the group
  std::vector<int> members_;
  int device_ = -1;
  int rank_ = 0;
  int global_rank_ = 0;
  int group_depth_ = 0;
  bool local_ = false;       // a one-rank group made by split: no NCCL communicator
  bool local_open_ = false;  // such a group, until aborted or closed
};

static_assert(communicator<nccl_communicator>);

/// The NCCL world plus one sub-communicator per mesh axis (comm/mesh_communicator.hpp, the
/// same class the Gloo backend uses): axis(a) holds the ranks that share this rank's other
/// coordinates, ordered by coordinate a (device_mesh::group).
using nccl_mesh_communicator = basic_mesh_communicator<nccl_communicator>;

}  // namespace autoshard

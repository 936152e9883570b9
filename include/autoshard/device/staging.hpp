#pragma once
/// The host side of uploads, with no CUDA in it: a pool that keeps per-device resources
/// (pinned staging, streams, events) for the next upload instead of allocating them anew,
/// a team of threads that fill staging buffers together, and the pipeline that streams a
/// tensor through a ring of staging slots to whatever moves the bytes on (the copy engine
/// in device/placement.hpp; a host copy in the tests).
///   autoshard::staging_team team(8);                    // the caller and 7 threads
///   autoshard::staging_ring ring(arena, 8 << 20, 8);    // 8 slots of 8 MiB
///   autoshard::stage_through(team, ring, src, dtype::f32, dtype::bf16, n, sink);
/// Why several threads: one thread copies 6-8 GB/s into pinned memory, a PCIe 5 copy
/// engine reads 50 GB/s from it (issue 33, H200); the copy engine must never wait.
#include <algorithm>           // std::min, std::max
#include <atomic>              // std::atomic
#include <chrono>              // std::chrono::steady_clock
#include <condition_variable>  // std::condition_variable
#include <cstddef>             // std::size_t, std::byte
#include <cstdint>             // std::uint64_t, std::int64_t, std::uintptr_t
#include <cstring>             // std::memcpy
#include <exception>           // std::exception_ptr
#include <functional>          // std::function
#include <map>                 // std::map
#include <memory>              // std::unique_ptr
#include <mutex>               // std::mutex
#include <stdexcept>           // std::logic_error
#include <thread>              // std::thread
#include <type_traits>         // std::remove_reference_t
#include <utility>             // std::exchange
#include <vector>              // std::vector

#if defined(__SSE2__)
#include <emmintrin.h>  // _mm_loadu_si128, _mm_stream_si128, _mm_sfence
#endif

#include "../core/dtype.hpp"          // dtype, dtype_size
#include "../core/error.hpp"          // error
#include "../core/machine.hpp"        // available_cores
#include "../tensor/host_tensor.hpp"  // convert_into

namespace autoshard {

/// How the staging threads write the staging slots.
enum class staging_stores {
  cached,     ///< ordinary stores (memcpy): the bytes stay in the writing cores' caches
  streaming,  ///< non-temporal stores (x86 SSE2; memcpy elsewhere): the bytes go to memory, past the
              ///< caches, so a device reading them does not snoop the cores that wrote them
};

/// Copies `n` bytes with non-temporal stores where the CPU has them (x86-64: SSE2), then
/// fences them (`sfence`), so they are visible to any thread or device that learns of the
/// copy through a later release (an atomic store, a CUDA call). Elsewhere, memcpy.
inline void stream_copy(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
#if defined(__SSE2__)
  std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(dst) & 15)) & 15;  // to 16-byte aligned stores
  head = std::min(head, n);
  if (head) std::memcpy(dst, src, head);
  std::size_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i_u*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i_u*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i_u*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i_u*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  for (; i + 16 <= n; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_loadu_si128(reinterpret_cast<const __m128i_u*>(src + i)));
  if (i < n) std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();
#else
  if (n) std::memcpy(dst, src, n);
#endif
}

/// Keeps objects made per key (a device and a size) for reuse: acquire() hands out an idle
/// one or makes a new one, and the lease gives it back when destroyed. At most `max_idle`
/// idle objects per key are kept; a lease returned beyond that destroys its object. The
/// pool must outlive its leases. Thread-safe.
template <class T, class Key = int>
class reuse_pool {
 public:
  using factory = std::function<std::unique_ptr<T>(const Key&)>;

  /// An object out of the pool, given back on destruction. Move-only.
  class lease {
   public:
    lease() = default;
    lease(lease&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)), key_(o.key_), obj_(std::move(o.obj_)) {}
    lease& operator=(lease&& o) noexcept {
      if (this != &o) {
        give_back();
        pool_ = std::exchange(o.pool_, nullptr);
        key_ = o.key_;
        obj_ = std::move(o.obj_);
      }
      return *this;
    }
    lease(const lease&) = delete;
    lease& operator=(const lease&) = delete;
    ~lease() { give_back(); }
    T& operator*() const noexcept { return *obj_; }
    T* operator->() const noexcept { return obj_.get(); }
    T* get() const noexcept { return obj_.get(); }
    /// Destroys the object instead of giving it back (it is broken: a failed stream, say).
    void discard() noexcept {
      obj_.reset();
      pool_ = nullptr;
    }

   private:
    friend class reuse_pool;
    lease(reuse_pool* p, Key k, std::unique_ptr<T> o) : pool_(p), key_(std::move(k)), obj_(std::move(o)) {}
    void give_back() noexcept {
      if (pool_ != nullptr && obj_) pool_->put(key_, std::move(obj_));
      pool_ = nullptr;
    }
    reuse_pool* pool_ = nullptr;
    Key key_{};
    std::unique_ptr<T> obj_;
  };

  explicit reuse_pool(factory make, std::size_t max_idle = 2) : make_(std::move(make)), max_idle_(max_idle) {}
  reuse_pool(const reuse_pool&) = delete;
  reuse_pool& operator=(const reuse_pool&) = delete;

  /// An idle object of `key`, or a new one (made outside the lock: making may be slow).
  lease acquire(const Key& key) {
    {
      std::lock_guard lock(m_);
      auto it = idle_.find(key);
      if (it != idle_.end() && !it->second.empty()) {
        std::unique_ptr<T> o = std::move(it->second.back());
        it->second.pop_back();
        ++reused_;
        return lease(this, key, std::move(o));
      }
    }
    std::unique_ptr<T> o = make_(key);
    std::lock_guard lock(m_);
    ++made_;
    return lease(this, key, std::move(o));
  }
  /// Objects made so far, and acquisitions served by an idle one.
  std::size_t made() const {
    std::lock_guard lock(m_);
    return made_;
  }
  std::size_t reused() const {
    std::lock_guard lock(m_);
    return reused_;
  }
  /// Idle objects kept for `key`.
  std::size_t idle(const Key& key) const {
    std::lock_guard lock(m_);
    auto it = idle_.find(key);
    return it == idle_.end() ? 0 : it->second.size();
  }
  /// Destroys every idle object (leased ones come back later as usual).
  void trim() {
    std::map<Key, std::vector<std::unique_ptr<T>>> drop;
    {
      std::lock_guard lock(m_);
      drop.swap(idle_);
    }
  }

 private:
  void put(const Key& key, std::unique_ptr<T> o) noexcept {
    std::unique_ptr<T> drop;  // destroyed outside the lock
    try {
      std::lock_guard lock(m_);
      auto& v = idle_[key];
      if (v.size() < max_idle_) {
        v.push_back(std::move(o));
        return;
      }
    } catch (...) {  // no memory for the bookkeeping: destroy the object instead
    }
    drop = std::move(o);
  }

  mutable std::mutex m_;
  factory make_;
  std::size_t max_idle_;
  std::map<Key, std::vector<std::unique_ptr<T>>> idle_;
  std::size_t made_ = 0, reused_ = 0;
};

/// Threads for staging copies: min(available_cores(), 8), at least 1. Eight copy threads
/// fill pinned memory faster than one PCIe 5 copy engine drains it.
inline unsigned default_staging_threads() noexcept { return std::max(1u, std::min(available_cores(), 8u)); }

/// A team of threads that runs one job at a time: fn(part) for every part in [0, parts),
/// the parts claimed in increasing order by the caller and the team's threads together
/// (so a part may wait for an earlier one: the earliest unfinished part always runs).
/// The first exception stops the claiming and is rethrown to the caller; failed() tells
/// parts that wait on others to give up. Jobs from several threads run one after another.
class staging_team {
 public:
  /// `threads` in all, the caller included: 1 runs every part on the caller.
  explicit staging_team(unsigned threads) {
    threads = std::max(threads, 1u);
    workers_.reserve(threads - 1);
    try {
      for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this] { worker(); });
    } catch (...) {
      stop();
      throw;
    }
  }
  staging_team(const staging_team&) = delete;
  staging_team& operator=(const staging_team&) = delete;
  ~staging_team() { stop(); }

  unsigned threads() const noexcept { return static_cast<unsigned>(workers_.size()) + 1; }
  /// True once a part of the running job threw: parts waiting for others should stop.
  bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }

  template <class F>
  void run(std::size_t parts, F&& fn) {
    if (parts == 0) return;
    std::lock_guard job(job_mutex_);
    if (workers_.empty() || parts == 1) {  // no one to wake: run here
      failed_.store(false, std::memory_order_relaxed);
      for (std::size_t p = 0; p < parts; ++p) fn(p);
      return;
    }
    start(parts, fn);
    work();
    finish();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  /// As run(), but the caller has a job of its own: it calls step() over and over, taking
  /// a part (the next in order) only when may_take(part) allows it, until step() returns
  /// true; then it waits for the others. The team's threads take every part they reach.
  /// How the staging pipeline keeps every CUDA call on one thread: step() hands staged
  /// chunks to the copy engine and notes finished transfers, the parts only copy bytes.
  template <class F, class Step, class MayTake>
  void run_with_caller(std::size_t parts, F&& fn, Step&& step, MayTake&& may_take) {
    std::lock_guard job(job_mutex_);
    const bool helpers = !workers_.empty() && parts > 1;
    if (helpers) {
      start(parts, fn);
    } else {
      parts_ = parts;
      next_.store(0, std::memory_order_relaxed);
      failed_.store(false, std::memory_order_relaxed);
      error_ = nullptr;
    }
    std::exception_ptr mine;
    try {
      for (;;) {
        if (step() || failed_.load(std::memory_order_acquire)) break;
        std::size_t p = next_.load(std::memory_order_relaxed);
        if (p < parts && may_take(p) && next_.compare_exchange_strong(p, p + 1, std::memory_order_relaxed))
          fn(p);
        else
          std::this_thread::yield();
      }
    } catch (...) {
      mine = std::current_exception();
      failed_.store(true, std::memory_order_release);
    }
    if (helpers) finish();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    if (mine) std::rethrow_exception(mine);
  }

 private:
  template <class F>
  void start(std::size_t parts, F& fn) {
    using Fn = std::remove_reference_t<F>;
    {
      std::lock_guard lock(m_);
      call_ = [](void* f, std::size_t p) { (*static_cast<Fn*>(f))(p); };
      fn_ = const_cast<void*>(static_cast<const void*>(&fn));
      parts_ = parts;
      next_.store(0, std::memory_order_relaxed);
      failed_.store(false, std::memory_order_relaxed);
      error_ = nullptr;
      open_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
  }

  /// Closes the job to late wakers and waits for the threads in it (spinning a while first:
  /// they are finishing their last part).
  void finish() {
    std::unique_lock lock(m_);
    open_ = false;
    lock.unlock();
    const auto until = std::chrono::steady_clock::now() + spin_for;
    for (unsigned i = 0; busy_.load(std::memory_order_acquire) != 0; ++i) {
      if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) break;
      std::this_thread::yield();
    }
    lock.lock();
    done_.wait(lock, [&] { return busy_.load(std::memory_order_acquire) == 0; });
  }

  void work() noexcept {
    for (;;) {
      if (failed_.load(std::memory_order_relaxed)) return;
      const std::size_t p = next_.fetch_add(1, std::memory_order_relaxed);
      if (p >= parts_) return;
      try {
        call_(fn_, p);
      } catch (...) {
        std::lock_guard lock(m_);
        if (!error_) error_ = std::current_exception();
        failed_.store(true, std::memory_order_release);
      }
    }
  }

  void worker() {
    std::uint64_t seen = 0;
    for (;;) {
      // Spin for the next job (a copy often follows a copy, and waking a sleeping thread in
      // a VM takes tens of microseconds, as long as a megabyte's transfer), then sleep.
      const auto until = std::chrono::steady_clock::now() + spin_for;
      for (unsigned i = 0; generation_.load(std::memory_order_acquire) == seen && !stopping_.load(std::memory_order_relaxed); ++i) {
        if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) break;
        std::this_thread::yield();
      }
      std::unique_lock lock(m_);
      wake_.wait(lock, [&] { return stopping_.load(std::memory_order_relaxed) || generation_.load(std::memory_order_relaxed) != seen; });
      if (stopping_.load(std::memory_order_relaxed)) return;
      seen = generation_.load(std::memory_order_relaxed);
      if (!open_) continue;
      busy_.fetch_add(1, std::memory_order_relaxed);  // under the lock: the caller closes the job under it
      lock.unlock();
      work();
      if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard done(m_);
        done_.notify_all();
      }
    }
  }

  void stop() noexcept {
    {
      std::lock_guard lock(m_);
      stopping_.store(true, std::memory_order_relaxed);
    }
    wake_.notify_all();
    for (auto& t : workers_)
      if (t.joinable()) t.join();
  }

  static constexpr std::chrono::microseconds spin_for{1000};
  std::mutex job_mutex_;  // one job at a time
  std::mutex m_;
  std::condition_variable wake_, done_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> failed_{false};
  std::atomic<std::size_t> next_{0};
  void (*call_)(void*, std::size_t) = nullptr;
  void* fn_ = nullptr;
  std::size_t parts_ = 0;
  bool open_ = false;
  std::atomic<unsigned> busy_{0};
  std::exception_ptr error_;
  std::vector<std::thread> workers_;
};

/// The process's shared staging team (default_staging_threads() threads), made at first
/// use and kept until the process ends.
inline staging_team& shared_staging_team() {
  static staging_team* team = new staging_team(default_staging_threads());  // never destroyed: threads outlive static destructors
  return *team;
}

class staging_ring;
template <class Sink>
void stage_through(staging_team& team, staging_ring& ring, const std::byte* src, dtype from, dtype staged, std::size_t n,
                   Sink& sink, staging_stores stores = staging_stores::cached);

/// A ring of equal staging slots over one arena (pinned memory for the copy engine), and
/// what the pipeline knows about them across copies: slot s serves chunks s, s + slots, ...;
/// a chunk is staged into its slot once the slot's previous chunk's transfer is known to
/// be done (free(s)), which only the thread that issues transfers finds out and publishes.
class staging_ring {
 public:
  staging_ring(std::byte* arena, std::size_t slot_bytes, std::size_t slots)
      : arena_(arena), slot_bytes_(slot_bytes), slots_(slots), free_(new std::atomic<std::uint64_t>[slots]) {
    if (arena == nullptr || slots == 0 || slot_bytes < 64)
      throw error("staging ring: " + std::to_string(slots) + " slots of " + std::to_string(slot_bytes) +
                  " bytes (at least one slot of 64 bytes over an arena)");
    for (std::size_t s = 0; s < slots; ++s) free_[s].store(0, std::memory_order_relaxed);
  }
  std::byte* slot(std::size_t s) const noexcept { return arena_ + s * slot_bytes_; }
  std::size_t slot_bytes() const noexcept { return slot_bytes_; }
  std::size_t slots() const noexcept { return slots_; }
  /// Chunks staged and issued so far through this ring (the next chunk's sequence number).
  std::uint64_t chunks() const noexcept { return next_; }

 private:
  template <class Sink>
  friend void stage_through(staging_team&, staging_ring&, const std::byte*, dtype, dtype, std::size_t, Sink&,
                            staging_stores);
  /// Whether chunk `seq` may be staged: its slot's previous chunk's transfer is done.
  bool slot_free(std::uint64_t seq) const noexcept {
    return seq < slots_ || free_[seq % slots_].load(std::memory_order_acquire) >= seq - slots_ + 1;
  }
  std::byte* arena_;
  std::size_t slot_bytes_, slots_;
  std::uint64_t next_ = 0;    // chunks issued (every copy issues all of its chunks)
  std::uint64_t oldest_ = 0;  // the first chunk whose transfer is not known to be done
  std::unique_ptr<std::atomic<std::uint64_t>[]> free_;  // per slot: one more than its last chunk known done
};

/// How one copy of `n` elements is cut: chunks that fit one slot, each cut into parts for
/// the team. About 16 chunks per copy (the first chunk's staging is the only time the copy
/// engine waits: 1/16 of the copy), at least 256 KiB of source each unless the copy is
/// smaller, at most a slot; parts of at least 64 KiB, one per thread.
struct staging_cut {
  std::size_t elements = 0;
  std::size_t chunk_elements = 0;
  std::size_t part_elements = 0;

  std::size_t chunks() const noexcept { return elements == 0 ? 0 : (elements + chunk_elements - 1) / chunk_elements; }
  std::size_t chunk_size(std::size_t c) const noexcept { return std::min(chunk_elements, elements - c * chunk_elements); }
  std::size_t parts_of(std::size_t c) const noexcept { return (chunk_size(c) + part_elements - 1) / part_elements; }
  std::size_t parts() const noexcept {
    const std::size_t k = chunks();
    return k == 0 ? 0 : (k - 1) * parts_of(0) + parts_of(k - 1);
  }
};

inline staging_cut cut_for_staging(std::size_t n, std::size_t in_size, std::size_t staged_size, std::size_t slot_bytes,
                                   unsigned threads) {
  staging_cut c;
  c.elements = n;
  if (n == 0) return c;
  const std::size_t widest = std::max(in_size, staged_size);
  const std::size_t fit = slot_bytes / widest;  // elements a slot holds
  if (fit == 0)
    throw error("staging slots of " + std::to_string(slot_bytes) + " bytes cannot hold one element of " +
                std::to_string(widest) + " bytes");
  const std::size_t least = (std::size_t{256} << 10) / in_size;
  const std::size_t want = std::max((n + 15) / 16, least);
  c.chunk_elements = std::min({want, fit, n});
  const std::size_t min_part = (std::size_t{64} << 10) / in_size;
  const std::size_t per_thread = (c.chunk_elements + threads - 1) / std::max(threads, 1u);
  const std::size_t part = (std::max(per_thread, min_part) + 63) / 64 * 64;  // whole cache lines of source
  c.part_elements = std::min(c.chunk_elements, part);
  return c;
}

/// Streams `n` elements of `from` at `src` through `ring` as `staged` (a conversion on the
/// host when they differ). The team's threads stage parts; the calling thread alone talks
/// to the sink, so the device's API is called from one thread only:
///   sink.issue(s, first, count)  moves slot s's staged elements [first, first + count) on
///   sink.done(s)                 whether the transfer last issued from slot s finished (no wait)
///   sink.wait_slot(s)            waits for it (used to clean up after a failure)
/// Chunks are issued in order as their last part is staged. Returns once every chunk was
/// staged and issued (the source may be reused then; the transfers may still run). Throws
/// what a part or the sink threw. `stores`: how parts that need no conversion are written
/// (conversions always use ordinary stores).
template <class Sink>
void stage_through(staging_team& team, staging_ring& ring, const std::byte* src, dtype from, dtype staged, std::size_t n,
                   Sink& sink, staging_stores stores) {
  const std::size_t in_size = dtype_size(from), out_size = dtype_size(staged);
  const staging_cut cut = cut_for_staging(n, in_size, out_size, ring.slot_bytes(), team.threads());
  const std::size_t chunks = cut.chunks();
  if (chunks == 0) return;
  const std::size_t per_chunk = cut.parts_of(0);
  std::vector<std::atomic<std::size_t>> left(chunks);
  for (std::size_t c = 0; c < chunks; ++c) left[c].store(cut.parts_of(c), std::memory_order_relaxed);
  const std::uint64_t first_seq = ring.next_;
  const std::size_t slots = ring.slots();
  const bool streaming = stores == staging_stores::streaming && from == staged;
  auto stage = [&](std::size_t p) {
    const std::size_t c = p / per_chunk, j = p % per_chunk;
    const std::uint64_t seq = first_seq + c;
    for (unsigned spin = 0; !ring.slot_free(seq); ++spin) {  // the issuing thread publishes it
      if (team.failed()) return;  // it never will: the job is failing anyway
      if (spin < 4096)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    const std::size_t chunk_first = c * cut.chunk_elements;
    const std::size_t first = chunk_first + j * cut.part_elements;
    const std::size_t count = std::min(cut.part_elements, chunk_first + cut.chunk_size(c) - first);
    std::byte* to = ring.slot(static_cast<std::size_t>(seq % slots)) + (first - chunk_first) * out_size;
    if (streaming)
      stream_copy(to, src + first * in_size, count * in_size);
    else
      convert_into(src + first * in_size, from, to, staged, static_cast<std::int64_t>(count));
    left[c].fetch_sub(1, std::memory_order_release);
  };
  std::size_t issued = 0;
  auto step = [&]() -> bool {
    // Publish the transfers that finished, oldest first (one stream: they finish in order).
    while (ring.oldest_ < ring.next_ && sink.done(static_cast<std::size_t>(ring.oldest_ % slots))) {
      ring.free_[ring.oldest_ % slots].store(ring.oldest_ + 1, std::memory_order_release);
      ++ring.oldest_;
    }
    // Hand on, in order, the chunks whose parts are all staged.
    while (issued < chunks && left[issued].load(std::memory_order_acquire) == 0) {
      sink.issue(static_cast<std::size_t>(ring.next_ % slots), issued * cut.chunk_elements, cut.chunk_size(issued));
      ++ring.next_;
      ++issued;
    }
    return issued == chunks;
  };
  auto may_take = [&](std::size_t p) { return ring.slot_free(first_seq + p / per_chunk); };
  try {
    team.run_with_caller(cut.parts(), stage, step, may_take);
  } catch (...) {
    // Some chunks were issued and some never will be: wait for every slot's last transfer,
    // then go on after this copy's chunks with every slot free, so no later copy waits for
    // a chunk that never came or writes into a slot still being read.
    for (std::size_t s = 0; s < slots; ++s) {
      try {
        sink.wait_slot(s);
      } catch (...) {  // the first failure is the one reported
      }
    }
    ring.next_ = ring.oldest_ = first_seq + chunks;
    for (std::size_t s = 0; s < slots; ++s) ring.free_[s].store(ring.next_, std::memory_order_release);
    throw;
  }
}

}  // namespace autoshard

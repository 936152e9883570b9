// The host side of uploads (include/autoshard/device/staging.hpp), with no device: the pool
// hands the same resources back instead of making new ones, the team runs every part once,
// and the staging pipeline streams tensors through a ring of slots into ordinary memory
// through a slow "copy engine" thread, converting dtypes on the way, bit for bit.
#include <doctest/doctest.h>

#include <algorithm>           // std::fill
#include <atomic>              // std::atomic
#include <bit>                 // std::bit_cast
#include <chrono>              // std::chrono
#include <condition_variable>  // std::condition_variable
#include <cstdint>             // std::uint64_t
#include <cstring>             // std::memcpy
#include <deque>               // std::deque
#include <mutex>               // std::mutex
#include <stdexcept>           // std::runtime_error
#include <string>              // std::string
#include <thread>              // std::thread
#include <vector>              // std::vector

#include <autoshard/device/staging.hpp>
#include <autoshard/tensor/host_tensor.hpp>  // host_tensor, convert, bitwise_equal

using namespace autoshard;

namespace {

struct counted {
  static inline std::atomic<int> alive{0};
  int key;
  explicit counted(int k) : key(k) { ++alive; }
  ~counted() { --alive; }
};

/// A copy engine on a thread of its own: issue() queues a transfer from a slot into `dst`,
/// done later (after a pause, so that a slot overwritten too early would show in the
/// result); done() says whether the slot's queued transfers are done, wait_slot() waits.
/// issue() and done() must come from the thread that called stage_through.
class slow_engine {
 public:
  slow_engine(const staging_ring& ring, std::byte* dst, std::size_t out_size)
      : ring_(ring), dst_(dst), out_size_(out_size), issued_(ring.slots()), done_(ring.slots()) {
    thread_ = std::thread([this] { loop(); });
  }
  ~slow_engine() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void issue(std::size_t s, std::size_t first, std::size_t count) {
    if (std::this_thread::get_id() != owner_) ++foreign_;
    std::lock_guard lock(m_);
    if (fail_at_ >= 0 && transfers_.load() == static_cast<std::uint64_t>(fail_at_))
      throw std::runtime_error("transfer " + std::to_string(fail_at_) + " refused");
    ++transfers_;
    ++issued_[s];
    queue_.push_back({s, first, count});
    cv_.notify_all();
  }
  void wait_slot(std::size_t s) {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return done_[s] == issued_[s]; });
  }
  bool done(std::size_t s) {
    std::lock_guard lock(m_);
    return done_[s] == issued_[s];
  }
  void drain() {
    for (std::size_t s = 0; s < issued_.size(); ++s) wait_slot(s);
  }
  void retarget(std::byte* dst, std::size_t out_size) {
    drain();
    dst_ = dst;
    out_size_ = out_size;
  }
  std::uint64_t transfers() const { return transfers_.load(); }
  /// Transfers issued from another thread than the one that made the engine: should be none.
  int foreign() const { return foreign_.load(); }
  int fail_at_ = -1;  // the transfer that throws instead

 private:
  struct job {
    std::size_t slot, first, count;
  };
  void loop() {
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      const job j = queue_.front();
      queue_.pop_front();
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(30));
      std::memcpy(dst_ + j.first * out_size_, ring_.slot(j.slot), j.count * out_size_);
      lock.lock();
      ++done_[j.slot];
      cv_.notify_all();
    }
  }
  const staging_ring& ring_;
  std::byte* dst_;
  std::size_t out_size_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<job> queue_;
  std::vector<std::uint64_t> issued_, done_;
  std::atomic<std::uint64_t> transfers_{0};
  std::atomic<int> foreign_{0};
  std::thread::id owner_ = std::this_thread::get_id();
  bool stop_ = false;
  std::thread thread_;
};

/// Labels with every kind of float bit pattern: small integers, fractions that round,
/// huge and tiny values, infinities and NaNs with payloads.
host_tensor labels(dtype t, std::int64_t n, std::uint64_t seed) {
  host_tensor f(dtype::f32, {n});
  float* v = f.as<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    const auto r = static_cast<std::uint32_t>(seed >> 32);
    switch (i % 5) {
      case 0: v[i] = static_cast<float>(i % 1000) - 500.0f; break;
      case 1: v[i] = std::bit_cast<float>(r); break;  // any pattern: NaNs, subnormals, infinities included
      case 2: v[i] = std::bit_cast<float>((r & 0x807fffffu) | (0x7f800000u * ((r >> 8) & 1u))); break;  // inf/NaN or subnormal
      default: v[i] = static_cast<float>(r) * 1e-7f; break;
    }
  }
  return t == dtype::f32 ? std::move(f) : convert(f.view(), t);
}

}  // namespace

TEST_SUITE("no_device") {
  TEST_CASE("staging: the pool hands back the same objects instead of making new ones") {
    int made = 0;
    {
      reuse_pool<counted> pool([&](const int& k) {
        ++made;
        return std::make_unique<counted>(k);
      });
      counted* first = nullptr;
      {
        auto a = pool.acquire(0);
        first = a.get();
        CHECK(a->key == 0);
      }
      CHECK(pool.idle(0) == 1);
      {
        auto again = pool.acquire(0);  // reused, not made
        CHECK(again.get() == first);
        CHECK(made == 1);
        CHECK(pool.reused() == 1);
        auto second = pool.acquire(0);  // the first is leased: a new one
        CHECK(second.get() != first);
        auto third = pool.acquire(0);
        auto other = pool.acquire(1);  // keys do not share
        CHECK(other->key == 1);
        CHECK(made == 4);
        auto moved = std::move(third);  // a moved lease gives back once
        CHECK(third.get() == nullptr);
      }
      CHECK(pool.idle(0) == 2);  // at most two idle per key: the third was destroyed
      CHECK(pool.idle(1) == 1);
      CHECK(counted::alive == 3);
      CHECK(pool.made() == 4);
      pool.trim();
      CHECK(pool.idle(0) == 0);
      CHECK(counted::alive == 0);
      auto fresh = pool.acquire(0);
      CHECK(made == 5);
      CHECK(counted::alive == 1);
    }
    CHECK(counted::alive == 0);  // the pool destroys what it keeps
  }

  TEST_CASE("staging: a team runs every part once, in claiming order, and reports the first failure") {
    for (unsigned threads : {1u, 2u, 5u}) {
      CAPTURE(threads);
      staging_team team(threads);
      CHECK(team.threads() == threads);
      for (int round = 0; round < 20; ++round) {  // many jobs: workers sleep and wake between them
        const std::size_t parts = 1 + static_cast<std::size_t>(round) * 37;
        std::vector<std::atomic<int>> hits(parts);
        std::vector<std::atomic<bool>> done(parts);
        team.run(parts, [&](std::size_t p) {
          // Part p waits for part p - 3: claimed earlier, so the team never deadlocks.
          if (p >= 3)
            while (!done[p - 3].load()) std::this_thread::yield();
          ++hits[p];
          done[p] = true;
        });
        bool once = true;
        for (auto& h : hits) once = once && h.load() == 1;
        CHECK(once);
      }
      std::atomic<int> ran{0};
      CHECK_THROWS_WITH(team.run(100,
                                 [&](std::size_t p) {
                                   ++ran;
                                   if (p == 17) throw std::runtime_error("part 17 failed");
                                   // Later parts wait for a part that never comes unless they give up.
                                   if (p > 17)
                                     while (!team.failed()) std::this_thread::yield();
                                 }),
                        "part 17 failed");
      CHECK(ran.load() >= 18);
      std::atomic<int> after{0};
      team.run(10, [&](std::size_t) { ++after; });  // usable after a failure
      CHECK(after.load() == 10);
    }
  }

  TEST_CASE("staging: with a job of its own, the caller takes only the parts it may, the team the rest") {
    for (unsigned threads : {1u, 4u}) {
      CAPTURE(threads);
      staging_team team(threads);
      const std::size_t parts = 200;
      std::vector<std::atomic<int>> hits(parts);
      std::atomic<std::size_t> finished{0};
      const auto caller = std::this_thread::get_id();
      std::atomic<int> odd_by_caller{0};
      int steps = 0;
      team.run_with_caller(
          parts,
          [&](std::size_t p) {
            if (std::this_thread::get_id() == caller && p % 2 == 1) ++odd_by_caller;
            ++hits[p];
            ++finished;
          },
          [&] {
            ++steps;
            return finished.load() == parts;
          },
          [&](std::size_t p) { return threads == 1 || p % 2 == 0; });
      bool once = true;
      for (auto& h : hits) once = once && h.load() == 1;
      CHECK(once);
      CHECK(steps > 0);
      if (threads > 1) CHECK(odd_by_caller.load() == 0);
      CHECK_THROWS_WITH(team.run_with_caller(
                            10, [](std::size_t) {}, [&]() -> bool { throw std::runtime_error("step failed"); },
                            [](std::size_t) { return true; }),
                        "step failed");
    }
  }

  TEST_CASE("staging: the cut makes about 16 chunks of a copy, each fitting a slot, in parts per thread") {
    const staging_cut c = cut_for_staging(std::size_t{4} << 20, 4, 4, std::size_t{8} << 20, 8);  // 16 MiB of f32
    CHECK(c.chunk_elements == (std::size_t{1} << 18));                                            // 1 MiB chunks
    CHECK(c.chunks() == 16);
    CHECK(c.part_elements == (std::size_t{1} << 15));  // 128 KiB parts, one per thread
    CHECK(c.parts() == 128);
    const staging_cut mib = cut_for_staging(std::size_t{1} << 18, 4, 4, std::size_t{8} << 20, 8);  // 1 MiB
    CHECK(mib.chunks() == 4);  // 256 KiB at least
    CHECK(mib.part_elements == (std::size_t{1} << 14));  // 64 KiB at least
    const staging_cut big = cut_for_staging(std::size_t{64} << 20, 4, 2, std::size_t{8} << 20, 8);  // 256 MiB
    CHECK(big.chunk_elements == (std::size_t{2} << 20));  // a slot's worth of f32
    CHECK(big.chunks() == 32);
    const staging_cut small = cut_for_staging(1000, 2, 4, 4096, 8);  // a small tensor: one part
    CHECK(small.chunks() == 1);
    CHECK(small.parts() == 1);
    const staging_cut odd = cut_for_staging(1001, 4, 4, 256, 3);  // uneven last chunk and part
    CHECK(odd.chunk_elements == 64);
    CHECK(odd.chunks() == 16);
    CHECK(odd.chunk_size(15) == 1001 - 15 * 64);
    CHECK_THROWS_AS((void)cut_for_staging(10, 8, 8, 4, 1), error);  // a slot smaller than one element
  }

  TEST_CASE("staging: tensors stream through the slots into ordinary memory, converted bit for bit") {
    struct conversion {
      dtype from, to;
    };
    for (unsigned threads : {1u, 3u, 8u}) {
      staging_team team(threads);
      for (std::size_t slot_bytes : {std::size_t{256}, std::size_t{4096}, std::size_t{1} << 20}) {
        std::vector<std::byte> arena(slot_bytes * 4);
        staging_ring ring(arena.data(), slot_bytes, 4);
        std::vector<std::byte> sink_bytes(8);
        slow_engine engine(ring, sink_bytes.data(), 1);
        // One ring for many copies: its slots' chunk numbers carry over from copy to copy. bf16
        // parts start and end off 16-byte boundaries; streaming stores apply to copies only.
        for (conversion k : {conversion{dtype::f32, dtype::f32}, conversion{dtype::bf16, dtype::bf16},
                             conversion{dtype::f32, dtype::bf16}, conversion{dtype::bf16, dtype::f32},
                             conversion{dtype::f16, dtype::f32}, conversion{dtype::f32, dtype::f16},
                             conversion{dtype::f64, dtype::bf16}}) {
          for (staging_stores stores : {staging_stores::cached, staging_stores::streaming}) {
            for (std::int64_t n : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{20001}}) {
              CAPTURE(threads);
              CAPTURE(slot_bytes);
              CAPTURE(to_string(k.from));
              CAPTURE(to_string(k.to));
              CAPTURE(stores == staging_stores::streaming);
              CAPTURE(n);
              const host_tensor src = labels(k.from, n, static_cast<std::uint64_t>(n) * 31 + threads);
              host_tensor out(k.to, {n});
              std::memset(out.data(), 0xA5, out.nbytes());  // poisoned: every element must be written
              engine.retarget(out.data(), dtype_size(k.to));
              const std::uint64_t before = engine.transfers();
              stage_through(team, ring, src.data(), k.from, k.to, static_cast<std::size_t>(n), engine, stores);
              engine.drain();
              const staging_cut cut = cut_for_staging(static_cast<std::size_t>(n), dtype_size(k.from),
                                                      dtype_size(k.to), slot_bytes, threads);
              CHECK(engine.transfers() - before == cut.chunks());
              CHECK(engine.foreign() == 0);  // only the calling thread hands chunks on
              CHECK(bitwise_equal(out.view(), convert(src.view(), k.to).view()));
            }
          }
        }
      }
    }
  }

  TEST_CASE("staging: stream_copy copies every byte and no other, at every alignment") {
    std::vector<std::byte> src(4096 + 64), dst(4096 + 96);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>((i * 131 + 7) & 0xFF);
    for (std::size_t so = 0; so < 16; so += 3) {
      for (std::size_t dof = 0; dof < 16; ++dof) {
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17},
                              std::size_t{63}, std::size_t{64}, std::size_t{65}, std::size_t{127}, std::size_t{1000},
                              std::size_t{4096}}) {
          CAPTURE(so);
          CAPTURE(dof);
          CAPTURE(n);
          std::fill(dst.begin(), dst.end(), std::byte{0xA5});
          stream_copy(dst.data() + 32 + dof, src.data() + so, n);
          CHECK(std::memcmp(dst.data() + 32 + dof, src.data() + so, n) == 0);
          bool guards = true;  // nothing before or after the copy was written
          for (std::size_t i = 0; i < dst.size(); ++i)
            if ((i < 32 + dof || i >= 32 + dof + n) && dst[i] != std::byte{0xA5}) guards = false;
          CHECK(guards);
        }
      }
    }
  }

  TEST_CASE("staging: a transfer that fails is reported, and the ring serves the next copy") {
    staging_team team(4);
    std::vector<std::byte> arena(4 * 1024);
    staging_ring ring(arena.data(), 1024, 4);
    const host_tensor src = labels(dtype::f32, 5000, 7);
    host_tensor out(dtype::f32, {5000});
    slow_engine engine(ring, out.data(), 4);
    engine.fail_at_ = 6;  // the 7th chunk of the 20
    CHECK_THROWS_WITH(stage_through(team, ring, src.data(), dtype::f32, dtype::f32, 5000, engine),
                      "transfer 6 refused");
    engine.fail_at_ = -1;
    std::memset(out.data(), 0, out.nbytes());
    stage_through(team, ring, src.data(), dtype::f32, dtype::f32, 5000, engine);
    engine.drain();
    CHECK(bitwise_equal(out.view(), src.view()));
  }
}

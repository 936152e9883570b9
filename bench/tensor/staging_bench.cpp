// The host side of uploads (include/autoshard/device/staging.hpp, no CUDA in it): a tensor
// staged through the ring of slots by a team of threads, with cached or streaming stores,
// handed to nobody, next to its peer measured in the same run, one thread's memcpy of the
// same bytes into the same kind of memory. Runs on any machine; the device side is
// bench/device/upload_bandwidth.cpp.
//   bench_tensor_staging_bench
//   stage/B/T/W   B bytes of f32 through 8 slots of 8 MiB (the uploader's ring) by T threads
//                 (the caller included) with W stores (1 cached, 2 streaming)
//   memcpy/B      the peer: std::memcpy of B bytes, one thread
//   overlap/B/F   the pipeline with a timer for a copy engine: each chunk handed on "moves" at
//                 F percent of the staging threads' own rate (measured first, default team,
//                 cached stores) and is done when its time has passed; no memory traffic.
//                 vs_engine is the timer's time alone over the copy's: 1.0 when staging and
//                 transfers overlap completely, about F/(100+F) when one waits for the other.
// vs_memcpy is bytes_per_second over the peer's at the same size.
#include <benchmark/benchmark.h>

#include <algorithm>  // std::min
#include <chrono>     // std::chrono::steady_clock
#include <cstddef>  // std::size_t, std::byte
#include <cstdint>  // std::int64_t
#include <cstring>  // std::memcpy
#include <map>      // std::map
#include <set>      // std::set
#include <vector>   // std::vector

#include <autoshard/device/staging.hpp>

using namespace autoshard;

namespace {

constexpr std::size_t kArena = std::size_t{64} << 20, kSlot = std::size_t{8} << 20;

/// The source of `bytes` bytes (kept per size), labelled, touched before any row uses it.
const std::vector<float>& source(std::size_t bytes) {
  static std::map<std::size_t, std::vector<float>> cache;
  auto& v = cache[bytes];
  if (v.empty()) {
    v.resize(bytes / 4);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 100003) * 0.25f;
  }
  return v;
}

/// One thread's memcpy of `bytes` into the arena, as the stages write it (slot by slot), in bytes/s.
double memcpy_rate(std::size_t bytes) {
  static std::map<std::size_t, double> cache;
  if (auto it = cache.find(bytes); it != cache.end()) return it->second;
  const auto& src = source(bytes);
  std::vector<std::byte> arena(kArena, std::byte{1});
  auto copy = [&] {
    for (std::size_t off = 0; off < bytes; off += kSlot) {
      const std::size_t n = std::min(kSlot, bytes - off);
      std::memcpy(arena.data() + (off / kSlot % 8) * kSlot, reinterpret_cast<const std::byte*>(src.data()) + off, n);
    }
    benchmark::DoNotOptimize(arena.data());
  };
  copy();
  const int reps = bytes >= (std::size_t{1} << 26) ? 5 : 50;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) copy();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return cache[bytes] = static_cast<double>(bytes) * reps / s;
}

struct no_sink {
  void wait_slot(std::size_t) const noexcept {}
  bool done(std::size_t) const noexcept { return true; }
  void issue(std::size_t, std::size_t, std::size_t) const noexcept {}
};

void BM_stage(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const auto threads = static_cast<unsigned>(state.range(1));
  const staging_stores stores = state.range(2) == 2 ? staging_stores::streaming : staging_stores::cached;
  state.SetLabel(stores == staging_stores::streaming ? "streaming" : "cached");
  const auto& src = source(bytes);
  std::vector<std::byte> arena(kArena, std::byte{1});
  staging_ring ring(arena.data(), kSlot, kArena / kSlot);
  staging_team team(threads);
  no_sink sink;
  for (auto _ : state) {
    stage_through(team, ring, reinterpret_cast<const std::byte*>(src.data()), dtype::f32, dtype::f32, src.size(), sink,
                  stores);
    benchmark::DoNotOptimize(arena.data());
  }
  const auto it = static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
  state.counters["vs_memcpy"] =
      benchmark::Counter(it * static_cast<double>(bytes) / memcpy_rate(bytes), benchmark::Counter::kIsRate);
}

/// A copy engine made of a clock: a chunk issued starts when the previous one ends (or now)
/// and takes count * 4 / rate seconds.
struct timer_sink {
  double rate = 1;  // bytes per second
  std::vector<std::chrono::steady_clock::time_point> end = std::vector<std::chrono::steady_clock::time_point>(8);
  std::chrono::steady_clock::time_point last{};

  void wait_slot(std::size_t s) const {
    while (std::chrono::steady_clock::now() < end[s]) {
    }
  }
  bool done(std::size_t s) const { return std::chrono::steady_clock::now() >= end[s]; }
  void issue(std::size_t s, std::size_t, std::size_t count) {
    const auto start = std::max(std::chrono::steady_clock::now(), last);
    last = end[s] = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(static_cast<double>(count) * 4 / rate));
  }
};

void BM_overlap(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const double fraction = static_cast<double>(state.range(1)) / 100;
  const auto& src = source(bytes);
  std::vector<std::byte> arena(kArena, std::byte{1});
  staging_ring ring(arena.data(), kSlot, kArena / kSlot);
  staging_team& team = shared_staging_team();
  const auto* p = reinterpret_cast<const std::byte*>(src.data());
  no_sink nobody;  // the staging side's own rate first
  for (int i = 0; i < 3; ++i) stage_through(team, ring, p, dtype::f32, dtype::f32, src.size(), nobody);
  const int reps = bytes >= (std::size_t{1} << 26) ? 5 : 50;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) stage_through(team, ring, p, dtype::f32, dtype::f32, src.size(), nobody);
  const double staging = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
  timer_sink engine;
  engine.rate = fraction * static_cast<double>(bytes) / staging;
  for (auto _ : state) {
    stage_through(team, ring, p, dtype::f32, dtype::f32, src.size(), engine);
    while (std::chrono::steady_clock::now() < engine.last) {
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
  state.counters["vs_engine"] = benchmark::Counter(static_cast<double>(state.iterations()) * static_cast<double>(bytes) /
                                                       engine.rate,
                                                   benchmark::Counter::kIsRate);
}

void BM_memcpy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) state.SetIterationTime(static_cast<double>(bytes) / memcpy_rate(bytes));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

constexpr std::int64_t k16 = std::int64_t{1} << 24, k256 = std::int64_t{1} << 28;

}  // namespace

BENCHMARK(BM_memcpy)->Arg(k16)->Arg(k256)->UseManualTime()->Iterations(1);
BENCHMARK(BM_stage)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (std::int64_t bytes : {k16, k256})
        for (unsigned threads : std::set<unsigned>{1, 2, default_staging_threads()})
          for (std::int64_t stores : {1, 2}) b->Args({bytes, static_cast<std::int64_t>(threads), stores});
    })
    ->UseRealTime()
    ->MinWarmUpTime(0.05);

BENCHMARK(BM_overlap)->ArgsProduct({{k16, k256}, {50, 80}})->UseRealTime()->MinWarmUpTime(0.05);

BENCHMARK_MAIN();

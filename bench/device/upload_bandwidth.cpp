// Host-to-device upload bandwidth (include/autoshard/device/placement.hpp) on cuda:0, next
// to its peer, cudaMemcpy from pinned memory of the same bytes, measured in the same run.
//   memcpy_pinned       the peer: cudaMemcpy H2D from cudaMallocHost memory
//   memcpy_pageable     cudaMemcpy from ordinary memory (the driver stages it, one thread)
//   register_copy       cudaHostRegister of ordinary memory + cudaMemcpy + unregister, per
//                       call: what registering a checkpoint's range instead of staging costs
//   upload_tensor       autoshard::upload(view, 0): device allocation + staging + copy per call
//   uploader/copy       a reused device_uploader into a reused device_tensor (upload_shards'
//                       steady state), staging by the shared team (default_staging_threads())
//   dma_chunks/B/C/S    the copy engine's side alone: B bytes from pinned memory in chunks of
//                       C (a cudaMemcpyAsync and an event record each) on S streams
//   staging_only/B      the staging threads' side alone: B bytes into the pinned slots
//   uploader_threads/N  the same at 16 and 256 MiB with N staging threads
//   uploader/<a>_to_<b>_<site>  with a dtype conversion on the device or on the host threads
//   uploader/copy_streaming     the reused uploader writing its staging with non-temporal stores
// Why the pipeline is slower than either of its sides at 16 MiB (docs/devices.md), one row
// per hypothesis:
//   dma_after_write/W   the copy engine alone on 16 MiB in 1 MiB chunks, device-timed, right
//                       after the staging threads wrote the bytes with W stores (cached,
//                       streaming) or not at all (none): does the copy engine read bytes still
//                       in the writing cores' caches slower?
//   dma_under_load/W    the same while the staging threads copy into other memory without
//                       pause: does the host's memory traffic slow the copy engine?
//   pipeline_trace/B/S/W  a copy of B bytes through S slots of 64 MiB / S with W stores, each
//                       chunk's transfer timed on the device: ce_busy (the copy engine's share of
//                       the copy's time), ce_GBps (its rate while busy), first/last_issue_us
//                       (when the first and last chunk were handed on): is the copy engine
//                       starved, or slow while it runs?
// bytes_per_second counts host (source) bytes; device_bytes_per_second the bytes written on
// the device; vs_pinned is bytes_per_second over the peer's at the same size (1.0: as fast
// as a pinned copy of the same source bytes). Every row warms up first (the CUDA context,
// the pooled staging, the conversion kernel's compilation are never timed).
// Without a CUDA device it prints why and exits 0.
#include <benchmark/benchmark.h>

#include <algorithm>  // std::min
#include <atomic>   // std::atomic
#include <chrono>   // std::chrono::steady_clock
#include <cstddef>  // std::size_t, std::byte
#include <cstdint>  // std::int64_t
#include <cstdio>   // std::printf, std::fprintf
#include <cstdlib>  // std::exit
#include <cstring>  // std::memset
#include <map>      // std::map
#include <string>   // std::string
#include <thread>   // std::thread
#include <utility>  // std::pair
#include <vector>   // std::vector

#include <cuda_runtime_api.h>  // cudaMallocHost, cudaMemcpyAsync, cudaEvent_t, cudaHostRegister

#include <autoshard/device/placement.hpp>  // upload, device_tensor, device_uploader, cuda_device_count

namespace {

using namespace autoshard;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

/// A host tensor of `bytes` bytes of dtype `t` (kept per size and dtype), labelled with
/// values that need rounding when narrowed.
const host_tensor& host_source(std::size_t bytes, dtype t) {
  static std::map<std::pair<std::size_t, dtype>, host_tensor> cache;
  auto it = cache.find({bytes, t});
  if (it == cache.end()) {
    host_tensor f(dtype::f32, {static_cast<std::int64_t>(bytes / dtype_size(t))});
    float* p = f.as<float>();
    for (std::int64_t i = 0; i < f.numel(); ++i) p[i] = static_cast<float>(i % 100003) * 0.001953125f + 0.1f;
    it = cache.emplace(std::pair{bytes, t}, t == dtype::f32 ? std::move(f) : convert(f.view(), t)).first;
  }
  return it->second;
}

/// cudaMemcpy H2D bandwidth from pinned memory (bytes/s), measured once per size with events
/// after a warm-up copy.
double pinned_bandwidth(std::size_t bytes) {
  static std::map<std::size_t, double> cache;
  if (auto it = cache.find(bytes); it != cache.end()) return it->second;
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  void *host = nullptr, *dev = nullptr;
  cuda_ok(cudaMallocHost(&host, bytes), "cudaMallocHost");
  cuda_ok(cudaMalloc(&dev, bytes), "cudaMalloc");
  cudaEvent_t start, stop;
  cuda_ok(cudaEventCreate(&start), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&stop), "cudaEventCreate");
  cuda_ok(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");  // warm-up
  const int reps = bytes >= (std::size_t{1} << 26) ? 10 : 50;
  cuda_ok(cudaEventRecord(start, nullptr), "cudaEventRecord");
  for (int i = 0; i < reps; ++i) cuda_ok(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, nullptr), "cudaMemcpyAsync");
  cuda_ok(cudaEventRecord(stop, nullptr), "cudaEventRecord");
  cuda_ok(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  cuda_ok(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  (void)cudaFree(dev);
  (void)cudaFreeHost(host);
  return cache[bytes] = static_cast<double>(bytes) * reps / (static_cast<double>(ms) * 1e-3);
}

/// Host bytes/s, device bytes/s, and the ratio to the pinned peer of the same host bytes.
void finish(benchmark::State& state, std::size_t host_bytes, std::size_t device_bytes) {
  const auto it = static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(host_bytes));
  state.counters["device_bytes_per_second"] =
      benchmark::Counter(it * static_cast<double>(device_bytes), benchmark::Counter::kIsRate);
  state.counters["vs_pinned"] =
      benchmark::Counter(it * static_cast<double>(host_bytes) / pinned_bandwidth(host_bytes), benchmark::Counter::kIsRate);
}

void BM_memcpy(benchmark::State& state, bool pinned) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  void* host = nullptr;
  std::vector<std::byte> pageable;
  if (pinned) {
    cuda_ok(cudaMallocHost(&host, bytes), "cudaMallocHost");
  } else {
    pageable.assign(bytes, std::byte{1});
    host = pageable.data();
  }
  device_tensor dst(0, dtype::u8, {static_cast<std::int64_t>(bytes)});
  for (auto _ : state) cuda_ok(cudaMemcpy(dst.data(), host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  finish(state, bytes, bytes);
  if (pinned) (void)cudaFreeHost(host);
}

void BM_register_copy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const host_tensor& h = host_source(bytes, dtype::f32);
  device_tensor dst(0, dtype::f32, h.shape());
  auto* p = const_cast<std::byte*>(h.data());
  for (auto _ : state) {
    if (cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault); e != cudaSuccess) {
      (void)cudaGetLastError();
      state.SkipWithError((std::string("cudaHostRegister failed: ") + cudaGetErrorString(e)).c_str());
      return;
    }
    cuda_ok(cudaMemcpy(dst.data(), p, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    cuda_ok(cudaHostUnregister(p), "cudaHostUnregister");
  }
  finish(state, bytes, bytes);
}

void BM_upload_tensor(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const host_tensor& h = host_source(bytes, dtype::f32);
  for (auto _ : state) {
    device_tensor d = upload(h.view(), 0);
    benchmark::DoNotOptimize(d.data());
  }
  finish(state, bytes, bytes);
}

/// A reused uploader from `from` to `to`; `threads` 0: the shared team.
void run_uploader(benchmark::State& state, dtype from, dtype to, convert_site site, unsigned threads,
                  staging_stores stores = staging_stores::cached) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const host_tensor& h = host_source(bytes, from);
  const int devices[1] = {0};
  upload_options o;
  o.convert_on = site;
  o.staging_threads = threads;
  o.stores = stores;
  device_uploader up(devices, o);
  device_tensor dst(0, to, h.shape());
  if (from != to) state.SetLabel(up.converts_on_device(from, to) ? "converted on the device" : "converted on the host");
  for (auto _ : state) {
    up.copy(h.data(), from, dst);
    up.synchronize();
  }
  finish(state, bytes, dst.nbytes());
}

void BM_uploader(benchmark::State& state, dtype from, dtype to, convert_site site) {
  run_uploader(state, from, to, site, 0);
}

void BM_uploader_streaming(benchmark::State& state) {
  run_uploader(state, dtype::f32, dtype::f32, convert_site::automatic, 0, staging_stores::streaming);
}

/// The copy engine's side alone: `bytes` from pinned memory in chunks of range(1) bytes, each
/// its own cudaMemcpyAsync and event record as the uploader issues them, alternating
/// between range(2) streams, from one thread.
void BM_dma_chunks(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0)), chunk = static_cast<std::size_t>(state.range(1));
  const auto nstreams = static_cast<std::size_t>(state.range(2));
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  void* host = nullptr;
  cuda_ok(cudaMallocHost(&host, bytes), "cudaMallocHost");
  std::memset(host, 1, bytes);
  device_tensor dst(0, dtype::u8, {static_cast<std::int64_t>(bytes)});
  cudaStream_t streams[2];
  cudaEvent_t events[8];
  for (auto& st : streams) cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
  for (auto& e : events) cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  for (auto _ : state) {
    std::size_t i = 0;
    for (std::size_t off = 0; off < bytes; off += chunk, ++i) {
      cudaStream_t st = streams[i % nstreams];
      cuda_ok(cudaMemcpyAsync(static_cast<std::byte*>(dst.data()) + off, static_cast<std::byte*>(host) + off,
                              std::min(chunk, bytes - off), cudaMemcpyHostToDevice, st),
              "cudaMemcpyAsync");
      cuda_ok(cudaEventRecord(events[i % 8], st), "cudaEventRecord");
    }
    for (auto& st : streams) cuda_ok(cudaStreamSynchronize(st), "cudaStreamSynchronize");
  }
  finish(state, bytes, bytes);
  for (auto& e : events) (void)cudaEventDestroy(e);
  for (auto& st : streams) (void)cudaStreamDestroy(st);
  (void)cudaFreeHost(host);
}

/// A sink that hands chunks on to nobody (the staging threads' side alone).
struct no_sink {
  void wait_slot(std::size_t) const noexcept {}
  bool done(std::size_t) const noexcept { return true; }
  void issue(std::size_t, std::size_t, std::size_t) const noexcept {}
};

staging_stores stores_of(std::int64_t w) { return w == 2 ? staging_stores::streaming : staging_stores::cached; }
const char* stores_name(std::int64_t w) { return w == 0 ? "none" : w == 1 ? "cached" : "streaming"; }

/// The staging threads' side alone: `bytes` of f32 staged through a ring of 8 pinned slots
/// of 8 MiB by the shared team with range(1) stores (1 cached, 2 streaming), handed to nobody.
void BM_staging_only(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::int64_t w = state.range(1);
  state.SetLabel(stores_name(w));
  const host_tensor& h = host_source(bytes, dtype::f32);
  void* arena = nullptr;
  cuda_ok(cudaMallocHost(&arena, std::size_t{64} << 20), "cudaMallocHost");
  staging_ring ring(static_cast<std::byte*>(arena), std::size_t{8} << 20, 8);
  no_sink sink;
  for (auto _ : state)
    stage_through(shared_staging_team(), ring, h.data(), dtype::f32, dtype::f32, bytes / 4, sink, stores_of(w));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
  (void)cudaFreeHost(arena);
}

/// Device milliseconds between two recorded events.
double elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  cuda_ok(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  return static_cast<double>(ms);
}

constexpr std::size_t kChunk = std::size_t{1} << 20, kProbe = std::size_t{1} << 24;

/// kProbe bytes of pinned memory (filled with `fill`) and the copy engine timing their
/// transfer to the device in chunks of kChunk on a stream of its own.
class dma_probe {
 public:
  explicit dma_probe(int fill) : dst_(0, dtype::u8, {static_cast<std::int64_t>(kProbe)}) {
    cuda_ok(cudaHostAlloc(&pinned_, kProbe, cudaHostAllocPortable), "cudaHostAlloc");
    std::memset(pinned_, fill, kProbe);
    cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_ok(cudaEventCreate(&a_), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&b_), "cudaEventCreate");
  }
  dma_probe(const dma_probe&) = delete;
  dma_probe& operator=(const dma_probe&) = delete;
  ~dma_probe() {
    (void)cudaEventDestroy(a_);
    (void)cudaEventDestroy(b_);
    (void)cudaStreamDestroy(stream_);
    (void)cudaFreeHost(pinned_);
  }
  std::byte* pinned() const noexcept { return static_cast<std::byte*>(pinned_); }
  /// One transfer of the kProbe bytes, device-timed, in seconds.
  double run() {
    cuda_ok(cudaEventRecord(a_, stream_), "cudaEventRecord");
    for (std::size_t off = 0; off < kProbe; off += kChunk)
      cuda_ok(cudaMemcpyAsync(static_cast<std::byte*>(dst_.data()) + off, pinned() + off, kChunk, cudaMemcpyHostToDevice,
                              stream_),
              "cudaMemcpyAsync");
    cuda_ok(cudaEventRecord(b_, stream_), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(b_), "cudaEventSynchronize");
    return elapsed_ms(a_, b_) * 1e-3;
  }

 private:
  device_tensor dst_;
  void* pinned_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t a_ = nullptr, b_ = nullptr;
};

/// Hypothesis: the copy engine reads bytes that the staging threads just wrote (and that sit
/// in their caches) slower. range(0): 0 nobody writes them, 1 cached stores, 2 streaming.
void BM_dma_after_write(benchmark::State& state) {
  const std::int64_t w = state.range(0);
  state.SetLabel(stores_name(w));
  const host_tensor& h = host_source(kProbe, dtype::f32);
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  dma_probe probe(0);
  staging_ring ring(probe.pinned(), kChunk, kProbe / kChunk);  // each copy fills it once, in order
  no_sink sink;
  for (auto _ : state) {
    if (w != 0) stage_through(shared_staging_team(), ring, h.data(), dtype::f32, dtype::f32, kProbe / 4, sink, stores_of(w));
    state.SetIterationTime(probe.run());
  }
  finish(state, kProbe, kProbe);
}

/// Hypothesis: the host's memory traffic (the staging threads copying 64 MiB over and over into
/// ordinary memory, range(0) 1 cached or 2 streaming stores) slows the copy engine.
void BM_dma_under_load(benchmark::State& state) {
  const std::int64_t w = state.range(0);
  state.SetLabel(stores_name(w));
  const host_tensor& h = host_source(std::size_t{64} << 20, dtype::f32);
  std::vector<std::byte> arena(std::size_t{64} << 20);
  staging_ring ring(arena.data(), std::size_t{8} << 20, 8);
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  dma_probe probe(1);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> staged{0};
  std::thread load([&] {
    no_sink sink;
    while (!stop.load(std::memory_order_relaxed)) {
      stage_through(shared_staging_team(), ring, h.data(), dtype::f32, dtype::f32, static_cast<std::size_t>(h.numel()), sink,
                    stores_of(w));
      staged.fetch_add(h.nbytes(), std::memory_order_relaxed);
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  const std::uint64_t s0 = staged.load();
  for (auto _ : state) state.SetIterationTime(probe.run());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  state.counters["load_GBps"] = static_cast<double>(staged.load() - s0) / secs / 1e9;  // the staging meanwhile
  stop = true;
  load.join();
  finish(state, kProbe, kProbe);
}

/// The uploader's sink (one stream, an event per slot) that also times each chunk's transfer
/// on the device and notes when the host handed it on.
struct trace_sink {
  cudaStream_t stream = nullptr;
  std::byte* dst = nullptr;
  const staging_ring* ring = nullptr;
  std::vector<cudaEvent_t> slot_done, begin, end;  // per slot; per chunk of one copy (timing)
  std::vector<double> issued_us;
  std::chrono::steady_clock::time_point t0;
  std::size_t chunk = 0;

  void wait_slot(std::size_t s) const { cuda_ok(cudaEventSynchronize(slot_done[s]), "cudaEventSynchronize"); }
  bool done(std::size_t s) const {
    const cudaError_t e = cudaEventQuery(slot_done[s]);
    if (e == cudaErrorNotReady) return false;
    cuda_ok(e, "cudaEventQuery");
    return true;
  }
  void issue(std::size_t s, std::size_t first, std::size_t count) {
    issued_us[chunk] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    cuda_ok(cudaEventRecord(begin[chunk], stream), "cudaEventRecord");
    cuda_ok(cudaMemcpyAsync(dst + first * 4, ring->slot(s), count * 4, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    cuda_ok(cudaEventRecord(end[chunk], stream), "cudaEventRecord");
    cuda_ok(cudaEventRecord(slot_done[s], stream), "cudaEventRecord");
    ++chunk;
  }
};

/// Hypotheses together: a copy of range(0) bytes of f32 through range(1) slots (64 MiB of
/// pinned staging in all) with range(2) stores (1 cached, 2 streaming), every chunk's
/// transfer timed on the device.
void BM_pipeline_trace(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const auto slots = static_cast<std::size_t>(state.range(1));
  const std::int64_t w = state.range(2);
  state.SetLabel(stores_name(w));
  const std::size_t arena_bytes = std::size_t{64} << 20;
  const host_tensor& h = host_source(bytes, dtype::f32);
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  void* pinned = nullptr;
  cuda_ok(cudaHostAlloc(&pinned, arena_bytes, cudaHostAllocPortable), "cudaHostAlloc");
  staging_ring ring(static_cast<std::byte*>(pinned), arena_bytes / slots, slots);
  staging_team& team = shared_staging_team();
  const std::size_t chunks = cut_for_staging(bytes / 4, 4, 4, ring.slot_bytes(), team.threads()).chunks();
  device_tensor dst(0, dtype::f32, h.shape());
  trace_sink sink;
  sink.dst = static_cast<std::byte*>(dst.data());
  sink.ring = &ring;
  sink.issued_us.resize(chunks);
  cuda_ok(cudaStreamCreateWithFlags(&sink.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  auto events = [](std::vector<cudaEvent_t>& v, std::size_t n, unsigned flags) {
    v.resize(n);
    for (auto& e : v) cuda_ok(cudaEventCreateWithFlags(&e, flags), "cudaEventCreate");
  };
  events(sink.slot_done, slots, cudaEventDisableTiming);
  events(sink.begin, chunks, cudaEventDefault);
  events(sink.end, chunks, cudaEventDefault);
  cudaEvent_t start;
  cuda_ok(cudaEventCreate(&start), "cudaEventCreate");
  double busy = 0, span = 0, first = 0, last = 0;
  for (auto _ : state) {
    sink.chunk = 0;
    cuda_ok(cudaEventRecord(start, sink.stream), "cudaEventRecord");
    sink.t0 = std::chrono::steady_clock::now();
    stage_through(team, ring, h.data(), dtype::f32, dtype::f32, bytes / 4, sink, stores_of(w));
    cuda_ok(cudaStreamSynchronize(sink.stream), "cudaStreamSynchronize");
    state.PauseTiming();
    for (std::size_t c = 0; c < chunks; ++c) busy += elapsed_ms(sink.begin[c], sink.end[c]);
    span += elapsed_ms(start, sink.end[chunks - 1]);
    first += sink.issued_us.front();
    last += sink.issued_us.back();
    state.ResumeTiming();
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["ce_busy"] = busy / span;
  state.counters["ce_GBps"] = n * static_cast<double>(bytes) / (busy * 1e-3) / 1e9;
  state.counters["first_issue_us"] = first / n;
  state.counters["last_issue_us"] = last / n;
  state.counters["span_us"] = span * 1e3 / n;
  finish(state, bytes, bytes);
  for (auto* v : {&sink.slot_done, &sink.begin, &sink.end})
    for (cudaEvent_t e : *v) (void)cudaEventDestroy(e);
  (void)cudaEventDestroy(start);
  (void)cudaStreamDestroy(sink.stream);
  (void)cudaFreeHost(pinned);
}

void BM_uploader_threads(benchmark::State& state) {
  run_uploader(state, dtype::f32, dtype::f32, convert_site::automatic, static_cast<unsigned>(state.range(1)));
}

constexpr std::int64_t kMin = std::int64_t{1} << 20, kMax = std::int64_t{1} << 28;
constexpr double kWarmUp = 0.05;  // seconds per row before timing

}  // namespace

BENCHMARK_CAPTURE(BM_memcpy, pinned, true)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime()->MinWarmUpTime(kWarmUp);
BENCHMARK_CAPTURE(BM_memcpy, pageable, false)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime()->MinWarmUpTime(kWarmUp);
BENCHMARK(BM_register_copy)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime()->MinWarmUpTime(kWarmUp);
BENCHMARK(BM_upload_tensor)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime()->MinWarmUpTime(kWarmUp);
BENCHMARK_CAPTURE(BM_uploader, copy, dtype::f32, dtype::f32, convert_site::automatic)
    ->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime()->MinWarmUpTime(kWarmUp);
BENCHMARK(BM_dma_chunks)
    ->ArgsProduct({{std::int64_t{1} << 24, kMax}, {std::int64_t{1} << 18, std::int64_t{1} << 20, std::int64_t{1} << 23}, {1, 2}})
    ->UseRealTime()->MinWarmUpTime(kWarmUp);
BENCHMARK(BM_staging_only)->ArgsProduct({{std::int64_t{1} << 24, kMax}, {1, 2}})->UseRealTime()->MinWarmUpTime(kWarmUp);
BENCHMARK(BM_uploader_streaming)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime()->MinWarmUpTime(kWarmUp);
BENCHMARK(BM_dma_after_write)->DenseRange(0, 2)->UseManualTime()->MinWarmUpTime(kWarmUp);
BENCHMARK(BM_dma_under_load)->DenseRange(1, 2)->UseManualTime()->MinWarmUpTime(kWarmUp);
BENCHMARK(BM_pipeline_trace)->ArgsProduct({{std::int64_t{1} << 24, kMax}, {8, 64}, {1, 2}})->UseRealTime()->MinWarmUpTime(kWarmUp);
BENCHMARK(BM_uploader_threads)->ArgsProduct({{std::int64_t{1} << 24, kMax}, {1, 2, 4, 8, 16}})->UseRealTime()->MinWarmUpTime(kWarmUp);
BENCHMARK_CAPTURE(BM_uploader, f32_to_bf16_device, dtype::f32, dtype::bf16, convert_site::device)
    ->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime()->MinWarmUpTime(kWarmUp);
BENCHMARK_CAPTURE(BM_uploader, f32_to_bf16_host, dtype::f32, dtype::bf16, convert_site::host)
    ->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime()->MinWarmUpTime(kWarmUp);
BENCHMARK_CAPTURE(BM_uploader, bf16_to_f32_device, dtype::bf16, dtype::f32, convert_site::device)
    ->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime()->MinWarmUpTime(kWarmUp);
BENCHMARK_CAPTURE(BM_uploader, bf16_to_f32_host, dtype::bf16, dtype::f32, convert_site::host)
    ->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime()->MinWarmUpTime(kWarmUp);

int main(int argc, char** argv) {
  if (autoshard::cuda_device_count() == 0) {
    std::printf("skipped: no CUDA device (or no driver) visible; nothing to measure\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // The CUDA context and the conversion kernel before any row (each row also warms up).
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  cuda_ok(cudaFree(nullptr), "cudaFree(nullptr)");
  std::printf("conversion kernel: %s; staging threads: %u\n",
              autoshard::device_converts(dtype::f32, dtype::bf16) ? "loaded" : autoshard::device_conversion_error().c_str(),
              autoshard::default_staging_threads());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// The NCCL backend (include/autoshard/device/nccl.hpp) measured as a user calls it: launch,
// NCCL, and the host's wait with its polling. Every row warms up before it is timed.
//   memcpy_d2d          the device's own copy (cudaMemcpyAsync on cuda:0): bytes_per_second
//                       counts the bytes copied, hbm_bytes_per_second read + written
// With several GPUs, one rank per device (up to 8), each a thread of this process:
//   <collective>/N      algbw and busbw as nccl-tests defines them (doc/PERFORMANCE.md):
//                       algbw = S / t with S the per-rank buffer (all-reduce, broadcast), the
//                       whole output (all-gather) or the whole input (reduce-scatter,
//                       all-to-all); busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for
//                       all-gather, reduce-scatter and all-to-all, x 1 for broadcast;
//                       busbw_vs_p2p: busbw over a cudaMemcpyPeer of S bytes from cuda:0 to
//                       cuda:1 (the bytes one link carries, moved by the copy engine)
// With one GPU no byte crosses a link: the collectives run on a one-rank NCCL world and on
// a one-rank mesh axis (no NCCL communicator) and report only their time per call, labelled
// as such; there is no bandwidth and no ratio to report.
// Without a CUDA device it prints why and exits 0.
#include <benchmark/benchmark.h>

#include <cstddef>    // std::size_t, std::byte
#include <cstdint>    // std::int64_t
#include <cstdio>     // std::printf, std::fprintf
#include <cstdlib>    // std::exit
#include <exception>  // std::exception
#include <map>        // std::map
#include <mutex>      // std::mutex, std::lock_guard
#include <string>     // std::string
#include <thread>     // std::thread
#include <utility>    // std::pair
#include <vector>     // std::vector

#include <cuda_runtime_api.h>  // cudaMalloc, cudaMemcpyAsync, cudaMemcpyPeerAsync, cudaEvent_t

#include <autoshard/device/nccl.hpp>  // nccl_communicator, nccl_memory_store

namespace {

using autoshard::dtype;
using autoshard::nccl_communicator;
using autoshard::reduce_op;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

/// The ranks: one communicator per device of the world (made in main), and for one device,
/// a one-rank mesh axis split from it.
std::vector<nccl_communicator>& ranks() {
  static std::vector<nccl_communicator> r;
  return r;
}
nccl_communicator& local_axis() {
  static nccl_communicator c;
  return c;
}

/// Two device buffers of `bytes` on `device`, kept across rows of the same size.
struct buffers {
  void* a = nullptr;
  void* b = nullptr;
};
buffers& device_buffers(int device, std::size_t bytes) {
  static std::mutex m;
  static std::map<std::pair<int, std::size_t>, buffers> cache;
  std::lock_guard lock(m);
  buffers& b = cache[{device, bytes}];
  if (b.a == nullptr) {
    cuda_ok(cudaSetDevice(device), "cudaSetDevice");
    cuda_ok(cudaMalloc(&b.a, bytes), "cudaMalloc");
    cuda_ok(cudaMalloc(&b.b, bytes), "cudaMalloc");
    cuda_ok(cudaMemset(b.a, 0, bytes), "cudaMemset");
    cuda_ok(cudaMemset(b.b, 0, bytes), "cudaMemset");
  }
  return b;
}

/// cudaMemcpyPeer bandwidth (bytes/s) of `bytes` from cuda:0 to cuda:1, once per size,
/// timed with events after a warm-up copy.
double p2p_bandwidth(std::size_t bytes) {
  static std::map<std::size_t, double> cache;
  if (auto it = cache.find(bytes); it != cache.end()) return it->second;
  buffers& src = device_buffers(0, bytes);
  buffers& dst = device_buffers(1, bytes);
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  int access = 0;
  if (cudaDeviceCanAccessPeer(&access, 0, 1) == cudaSuccess && access != 0) {
    const cudaError_t e = cudaDeviceEnablePeerAccess(1, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) cuda_ok(e, "cudaDeviceEnablePeerAccess");
    (void)cudaGetLastError();
  }
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t start, stop;
  cuda_ok(cudaEventCreate(&start), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&stop), "cudaEventCreate");
  cuda_ok(cudaMemcpyPeerAsync(dst.a, 1, src.a, 0, bytes, s), "cudaMemcpyPeerAsync");  // warm-up
  const int reps = bytes >= (std::size_t{1} << 26) ? 10 : 50;
  cuda_ok(cudaEventRecord(start, s), "cudaEventRecord");
  for (int i = 0; i < reps; ++i) cuda_ok(cudaMemcpyPeerAsync(dst.a, 1, src.a, 0, bytes, s), "cudaMemcpyPeerAsync");
  cuda_ok(cudaEventRecord(stop, s), "cudaEventRecord");
  cuda_ok(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  cuda_ok(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  (void)cudaStreamDestroy(s);
  return cache[bytes] = static_cast<double>(bytes) * reps / (static_cast<double>(ms) * 1e-3);
}

void BM_memcpy_d2d(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  buffers& b = device_buffers(0, bytes);
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t s = ranks().front().stream();
  for (auto _ : state) {
    cuda_ok(cudaMemcpyAsync(b.b, b.a, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
    cuda_ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }
  const auto it = static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
  state.counters["hbm_bytes_per_second"] = benchmark::Counter(it * 2.0 * static_cast<double>(bytes), benchmark::Counter::kIsRate);
}

enum class coll { all_reduce_f32, all_reduce_bf16, all_gather, reduce_scatter, all_to_all, broadcast, grouped_all_reduce, barrier };

/// One call of `c` on `comm` with buffers of `bytes` (the per-rank buffer; all-gather's
/// output and reduce-scatter's and all-to-all's input are the whole n x, cut to fit).
void call(nccl_communicator& comm, coll c, buffers& b, std::size_t bytes) {
  const auto n = static_cast<std::size_t>(comm.size());
  switch (c) {
    case coll::all_reduce_f32: comm.all_reduce(b.a, bytes / 4, dtype::f32, reduce_op::sum); break;
    case coll::all_reduce_bf16: comm.all_reduce(b.a, bytes / 2, dtype::bf16, reduce_op::sum); break;
    case coll::all_gather: comm.all_gather(b.a, b.b, bytes / 4 / n, dtype::f32); break;
    case coll::reduce_scatter: comm.reduce_scatter(b.a, b.b, bytes / 2 / n, dtype::bf16, reduce_op::sum); break;
    case coll::all_to_all: comm.all_to_all(b.a, b.b, bytes / 4 / n, dtype::f32); break;
    case coll::broadcast: comm.broadcast(b.a, bytes / 4, dtype::f32, 0); break;
    case coll::grouped_all_reduce: {
      const std::size_t quarter = bytes / 4;
      comm.group([&] {
        for (std::size_t i = 0; i < 4; ++i)
          comm.all_reduce(static_cast<std::byte*>(b.a) + i * quarter, quarter / 2, dtype::bf16, reduce_op::sum);
      });
      break;
    }
    case coll::barrier: comm.barrier(); break;
  }
}

/// nccl-tests' bus-bandwidth factor of `c` on n ranks.
double bus_factor(coll c, int n) {
  const double f = static_cast<double>(n - 1) / n;
  switch (c) {
    case coll::all_reduce_f32:
    case coll::all_reduce_bf16:
    case coll::grouped_all_reduce: return 2 * f;
    case coll::broadcast: return 1;
    default: return f;
  }
}

/// Rank thread_index() of a world of several GPUs, all threads calling together.
void BM_collective(benchmark::State& state, coll c) {
  nccl_communicator& comm = ranks().at(static_cast<std::size_t>(state.thread_index()));
  const auto bytes = c == coll::barrier ? std::size_t{4} : static_cast<std::size_t>(state.range(0));
  buffers& b = device_buffers(comm.device(), bytes);
  for (auto _ : state) call(comm, c, b, bytes);
  if (c == coll::barrier) return;
  const double it = static_cast<double>(state.iterations()), s = static_cast<double>(bytes);
  const double bus = bus_factor(c, comm.size());
  using C = benchmark::Counter;
  state.counters["algbw"] = C(it * s, C::kIsRate | C::kAvgThreads);
  state.counters["busbw"] = C(it * s * bus, C::kIsRate | C::kAvgThreads);
  state.counters["busbw_vs_p2p"] = C(it * s * bus / p2p_bandwidth(bytes), C::kIsRate | C::kAvgThreads);
}

/// One GPU: the call on the one-rank world (NCCL) or the one-rank mesh axis (no NCCL).
void BM_one_rank(benchmark::State& state, coll c, bool axis) {
  nccl_communicator& comm = axis ? local_axis() : ranks().front();
  const auto bytes = c == coll::barrier ? std::size_t{4} : static_cast<std::size_t>(state.range(0));
  buffers& b = device_buffers(comm.device(), bytes);
  for (auto _ : state) call(comm, c, b, bytes);
  state.SetLabel(axis ? "1 rank, mesh axis without NCCL: no bytes cross a link; time per call only"
                      : "1 rank, NCCL world: no bytes cross a link; time per call only");
}

constexpr std::int64_t kMin = std::int64_t{1} << 20, kMax = std::int64_t{1} << 28;
constexpr double kWarmUp = 0.05;  // seconds per row before timing

const std::pair<const char*, coll> kCollectives[] = {
    {"all_reduce_f32", coll::all_reduce_f32}, {"all_reduce_bf16", coll::all_reduce_bf16},
    {"all_gather", coll::all_gather},         {"reduce_scatter", coll::reduce_scatter},
    {"all_to_all", coll::all_to_all},         {"broadcast", coll::broadcast},
    {"grouped_all_reduce", coll::grouped_all_reduce}, {"barrier", coll::barrier}};

/// Connects one rank per device (threads through an in-process store).
void connect(int n) {
  autoshard::nccl_memory_store store;
  ranks().resize(static_cast<std::size_t>(n));
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        ranks()[static_cast<std::size_t>(r)] = nccl_communicator::connect(store, r, n, {.device = r});
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (!e.empty()) {
      std::fprintf(stderr, "connecting %d ranks failed: %s\n", n, e.c_str());
      std::exit(1);
    }
}

}  // namespace

int main(int argc, char** argv) {
  const int devices = nccl_communicator::device_count();
  if (devices == 0) {
    std::printf("skipped: no CUDA device (or no driver) visible; nothing to measure\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const int n = devices < 8 ? devices : 8;
  connect(n);
  std::printf("NCCL %d, %d rank(s), one per device%s\n", nccl_communicator::library_version(), n,
              n == 1 ? ": collectives report their time per call only (no bytes cross a link)" : "");
  benchmark::RegisterBenchmark("memcpy_d2d", BM_memcpy_d2d)
      ->RangeMultiplier(16)->Range(kMin, kMax)->Arg(std::int64_t{1} << 32)->UseRealTime()->MinWarmUpTime(kWarmUp);
  if (n > 1) {
    for (const auto& [name, c] : kCollectives) {
      auto* b = benchmark::RegisterBenchmark((std::string(name) + "/ranks:" + std::to_string(n)).c_str(), BM_collective, c)
                    ->Threads(n)->UseRealTime()->MinWarmUpTime(kWarmUp);
      if (c != coll::barrier) b->RangeMultiplier(16)->Range(kMin, kMax);
    }
  } else {
    local_axis() = ranks().front().split({0}, "axis");  // what a 1xN mesh's one-rank axis holds
    for (bool axis : {false, true})
      for (const auto& [name, c] : kCollectives) {
        const std::string row = std::string(axis ? "one_rank_axis/" : "one_rank_nccl/") + name;
        auto* b = benchmark::RegisterBenchmark(row.c_str(), BM_one_rank, c, axis)->UseRealTime()->MinWarmUpTime(kWarmUp);
        if (c != coll::barrier) b->Arg(kMin)->Arg(kMax);
      }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  local_axis() = nccl_communicator();
  ranks().clear();
  return 0;
}

// Device bandwidth of the NCCL path on one rank (one communicator on cuda:0), next to a
// plain cudaMemcpy device-to-device copy (upload_bandwidth.cpp has the host-to-device
// side). Every collective call is measured end to end as a user sees it: launch, NCCL,
// and the host-side wait with its polling.
// bytes_per_second counts the bytes of one rank's buffer (algorithm bandwidth);
// vs_memcpy is that bandwidth over the cudaMemcpy D2D bandwidth of the same size.
// Without a CUDA device it prints why and exits 0.
#include <benchmark/benchmark.h>

#include <cstddef>  // std::size_t, std::byte
#include <cstdint>  // std::int64_t
#include <cstdlib>  // std::exit
#include <cstdio>   // std::printf
#include <map>      // std::map

#include <cuda_runtime_api.h>  // cudaMalloc, cudaMemcpyAsync, cudaEvent_t

#include <autoshard/device/nccl.hpp>  // nccl_communicator

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

nccl_communicator& comm() {
  static autoshard::nccl_memory_store store;
  static nccl_communicator c = nccl_communicator::connect(store, 0, 1, {.device = 0});
  return c;
}

/// Two device buffers of `bytes`, kept across benchmarks of the same size.
struct buffers {
  void* a = nullptr;
  void* b = nullptr;
};
buffers& device_buffers(std::size_t bytes) {
  static std::map<std::size_t, buffers> cache;
  buffers& b = cache[bytes];
  if (b.a == nullptr) {
    cuda_ok(cudaMalloc(&b.a, bytes), "cudaMalloc");
    cuda_ok(cudaMalloc(&b.b, bytes), "cudaMalloc");
    cuda_ok(cudaMemset(b.a, 0, bytes), "cudaMemset");
    cuda_ok(cudaMemset(b.b, 0, bytes), "cudaMemset");
  }
  return b;
}

/// cudaMemcpy D2D bandwidth (bytes/s) for `bytes`, measured once per size.
double memcpy_bandwidth(std::size_t bytes) {
  static std::map<std::size_t, double> cache;
  if (auto it = cache.find(bytes); it != cache.end()) return it->second;
  buffers& b = device_buffers(bytes);
  cudaStream_t s = comm().stream();
  cudaEvent_t start, stop;
  cuda_ok(cudaEventCreate(&start), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&stop), "cudaEventCreate");
  cuda_ok(cudaMemcpyAsync(b.b, b.a, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");  // warm-up
  const int reps = bytes >= (std::size_t{1} << 26) ? 10 : 50;
  cuda_ok(cudaEventRecord(start, s), "cudaEventRecord");
  for (int i = 0; i < reps; ++i)
    cuda_ok(cudaMemcpyAsync(b.b, b.a, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
  cuda_ok(cudaEventRecord(stop, s), "cudaEventRecord");
  cuda_ok(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  cuda_ok(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  return cache[bytes] = static_cast<double>(bytes) * reps / (static_cast<double>(ms) * 1e-3);
}

void finish(benchmark::State& state, std::size_t bytes) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
  state.counters["vs_memcpy"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * static_cast<double>(bytes) / memcpy_bandwidth(bytes),
      benchmark::Counter::kIsRate);
}

void BM_cuda_memcpy_d2d(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  buffers& b = device_buffers(bytes);
  for (auto _ : state) {
    cuda_ok(cudaMemcpyAsync(b.b, b.a, bytes, cudaMemcpyDeviceToDevice, comm().stream()), "cudaMemcpyAsync");
    cuda_ok(cudaStreamSynchronize(comm().stream()), "cudaStreamSynchronize");
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

void BM_nccl_all_reduce(benchmark::State& state, dtype t) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  buffers& b = device_buffers(bytes);
  for (auto _ : state) comm().all_reduce(b.a, bytes / autoshard::dtype_size(t), t, reduce_op::sum);
  finish(state, bytes);
}

void BM_nccl_all_gather(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  buffers& b = device_buffers(bytes);
  for (auto _ : state) comm().all_gather(b.a, b.b, bytes / 4, dtype::f32);
  finish(state, bytes);
}

void BM_nccl_reduce_scatter(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  buffers& b = device_buffers(bytes);
  for (auto _ : state) comm().reduce_scatter(b.a, b.b, bytes / 2, dtype::bf16, reduce_op::sum);
  finish(state, bytes);
}

void BM_nccl_all_to_all(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  buffers& b = device_buffers(bytes);
  for (auto _ : state) comm().all_to_all(b.a, b.b, bytes / 4, dtype::f32);
  finish(state, bytes);
}

void BM_nccl_broadcast(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  buffers& b = device_buffers(bytes);
  for (auto _ : state) comm().broadcast(b.a, bytes / 4, dtype::f32, 0);
  finish(state, bytes);
}

/// Four buffers of bytes/4 in one ncclGroupStart/End step.
void BM_nccl_grouped_all_reduce(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  buffers& b = device_buffers(bytes);
  const std::size_t quarter = bytes / 4;
  for (auto _ : state)
    comm().group([&] {
      for (int i = 0; i < 4; ++i)
        comm().all_reduce(static_cast<std::byte*>(b.a) + static_cast<std::size_t>(i) * quarter, quarter / 2,
                          dtype::bf16, reduce_op::sum);
    });
  finish(state, bytes);
}

void BM_nccl_barrier(benchmark::State& state) {
  for (auto _ : state) comm().barrier();
}

constexpr std::int64_t kMin = std::int64_t{1} << 20, kMax = std::int64_t{1} << 28;

}  // namespace

BENCHMARK(BM_cuda_memcpy_d2d)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime();
BENCHMARK_CAPTURE(BM_nccl_all_reduce, f32, dtype::f32)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime();
BENCHMARK_CAPTURE(BM_nccl_all_reduce, bf16, dtype::bf16)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime();
BENCHMARK_CAPTURE(BM_nccl_all_reduce, f16, dtype::f16)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime();
BENCHMARK(BM_nccl_all_gather)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime();
BENCHMARK(BM_nccl_reduce_scatter)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime();
BENCHMARK(BM_nccl_all_to_all)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime();
BENCHMARK(BM_nccl_broadcast)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime();
BENCHMARK(BM_nccl_grouped_all_reduce)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime();
BENCHMARK(BM_nccl_barrier)->UseRealTime();

int main(int argc, char** argv) {
  if (nccl_communicator::device_count() == 0) {
    std::printf("skipped: no CUDA device (or no driver) visible; nothing to measure\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

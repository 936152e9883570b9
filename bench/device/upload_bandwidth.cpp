// Shard upload bandwidth (include/autoshard/device/placement.hpp) against plain
// cudaMemcpy from pinned memory, on cuda:0. vs_pinned is the upload's bandwidth over the
// pinned-cudaMemcpy bandwidth of the same size (1.0: as fast as a pinned copy).
//   upload_tensor     autoshard::upload(view, 0): allocation + staging + copy, per call
//   uploader_copy     a reused device_uploader (32 MiB double buffers) into a reused
//                     device_tensor: the steady state of upload_shards
//   uploader_to_bf16  the same with f32 -> bf16 conversion in the staging step
//   memcpy_pinned / memcpy_pageable   the baselines
// bytes_per_second counts host bytes read. Without a CUDA device it prints why and exits 0.
#include <benchmark/benchmark.h>

#include <cstddef>  // std::size_t, std::byte
#include <cstdint>  // std::int64_t
#include <cstdio>   // std::printf, std::fprintf
#include <cstdlib>  // std::exit
#include <map>      // std::map
#include <vector>   // std::vector

#include <cuda_runtime_api.h>  // cudaMallocHost, cudaMemcpyAsync, cudaEvent_t

#include <autoshard/device/placement.hpp>  // upload, device_tensor, device_uploader, cuda_device_count

namespace {

using namespace autoshard;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

/// A host f32 tensor of `bytes` (kept per size), filled with labels.
const host_tensor& host_source(std::size_t bytes) {
  static std::map<std::size_t, host_tensor> cache;
  auto it = cache.find(bytes);
  if (it == cache.end()) {
    host_tensor h(dtype::f32, {static_cast<std::int64_t>(bytes / 4)});
    float* p = h.as<float>();
    for (std::int64_t i = 0; i < h.numel(); ++i) p[i] = static_cast<float>(i);
    it = cache.emplace(bytes, std::move(h)).first;
  }
  return it->second;
}

/// cudaMemcpy H2D bandwidth from pinned memory (bytes/s), measured once per size with events.
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
  const int reps = bytes >= (std::size_t{1} << 26) ? 5 : 30;
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

void finish(benchmark::State& state, std::size_t bytes) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
  state.counters["vs_pinned"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * static_cast<double>(bytes) / pinned_bandwidth(bytes),
      benchmark::Counter::kIsRate);
}

void BM_upload_tensor(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const host_tensor& h = host_source(bytes);
  for (auto _ : state) {
    device_tensor d = upload(h.view(), 0);
    benchmark::DoNotOptimize(d.data());
  }
  finish(state, bytes);
}

void BM_uploader(benchmark::State& state, dtype to) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const host_tensor& h = host_source(bytes);
  const int devices[1] = {0};
  device_uploader up(devices, upload_options{}.staging_bytes);
  device_tensor dst(0, to, h.shape());
  for (auto _ : state) {
    up.copy(h.data(), dtype::f32, dst);
    up.synchronize();
  }
  finish(state, bytes);
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
  finish(state, bytes);
  if (pinned) (void)cudaFreeHost(host);
}

constexpr std::int64_t kMin = std::int64_t{1} << 20, kMax = std::int64_t{1} << 28;

}  // namespace

BENCHMARK(BM_upload_tensor)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime();
BENCHMARK_CAPTURE(BM_uploader, copy, dtype::f32)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime();
BENCHMARK_CAPTURE(BM_uploader, to_bf16, dtype::bf16)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime();
BENCHMARK_CAPTURE(BM_memcpy, pinned, true)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime();
BENCHMARK_CAPTURE(BM_memcpy, pageable, false)->RangeMultiplier(16)->Range(kMin, kMax)->UseRealTime();

int main(int argc, char** argv) {
  if (autoshard::cuda_device_count() == 0) {
    std::printf("skipped: no CUDA device (or no driver) visible; nothing to measure\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

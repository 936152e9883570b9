#pragma once
// Helpers of the GPU tests: an owning device buffer, copies that throw, and running one
// rank per visible device as threads of this process.
#include <chrono>     // std::chrono::milliseconds
#include <cstddef>    // std::size_t
#include <exception>  // std::exception_ptr
#include <string>     // std::string
#include <thread>     // std::thread
#include <utility>    // std::exchange
#include <vector>     // std::vector

#include <cuda_runtime_api.h>  // cudaMalloc, cudaMemcpy

#include <autoshard/core/error.hpp>    // device_error
#include <autoshard/device/nccl.hpp>  // nccl_communicator, nccl_memory_store

namespace autoshard::gpu_test {

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw device_error(std::string(what) + " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

/// cudaMalloc'd bytes on the current device, freed on destruction.
class device_bytes {
 public:
  explicit device_bytes(std::size_t bytes) : bytes_(bytes) {
    if (bytes_ != 0) cuda_ok(cudaMalloc(&p_, bytes_), "cudaMalloc");
  }
  device_bytes(const device_bytes&) = delete;
  device_bytes& operator=(const device_bytes&) = delete;
  device_bytes(device_bytes&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  ~device_bytes() {
    if (p_ != nullptr) (void)cudaFree(p_);
  }
  void* get() const noexcept { return p_; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(p_);
  }
  std::size_t size() const noexcept { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

template <class T>
device_bytes upload(const std::vector<T>& host) {
  device_bytes d(host.size() * sizeof(T));
  if (!host.empty()) cuda_ok(cudaMemcpy(d.get(), host.data(), d.size(), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  return d;
}

template <class T>
std::vector<T> download(const device_bytes& d, std::size_t n) {
  std::vector<T> host(n);
  if (n != 0) cuda_ok(cudaMemcpy(host.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return host;
}

/// Runs fn(comm) on one rank per visible device (at most max_ranks), each a thread with its
/// own device, connected through an in-process store; returns each rank's exception.
template <class Fn>
std::vector<std::exception_ptr> run_device_ranks(int n, Fn&& fn, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  nccl_memory_store store;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        cuda_ok(cudaSetDevice(r), "cudaSetDevice");
        nccl_communicator c = nccl_communicator::connect(store, r, n, {.device = r, .timeout = timeout});
        fn(c);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

/// The message of the lowest rank's exception, or "" when every rank succeeded.
inline std::string first_error(const std::vector<std::exception_ptr>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      return "rank " + std::to_string(r) + ": " + e.what();
    } catch (...) {
      return "rank " + std::to_string(r) + ": unknown exception";
    }
  }
  return {};
}

/// Ranks for the multi-rank tests: every visible device, at most 8.
inline int test_ranks() {
  const int n = nccl_communicator::device_count();
  return n < 8 ? n : 8;
}

}  // namespace autoshard::gpu_test

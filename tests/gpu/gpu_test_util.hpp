#pragma once
// Helpers of the GPU tests: an owning device buffer, copies that throw, running one rank
// per visible device as threads of this process, and scenarios in a child process.
#include <fcntl.h>     // O_WRONLY, O_CREAT, O_TRUNC
#include <spawn.h>     // posix_spawn
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // getpid

#include <chrono>     // std::chrono::milliseconds
#include <csignal>    // kill, SIGKILL
#include <filesystem> // std::filesystem::temp_directory_path
#include <fstream>    // std::ifstream
#include <iterator>   // std::istreambuf_iterator
#include <cstddef>    // std::size_t
#include <exception>  // std::exception_ptr
#include <stdexcept>  // std::runtime_error
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

/// What a child process of this test binary did.
struct child_result {
  int exit_code = -1;  ///< -1: killed after the limit, or ended by a signal
  bool timed_out = false;
  std::string output;  ///< stdout and stderr
};

/// Runs this test binary again as `test_gpu --autoshard-child=<what>` in a fresh process
/// (CUDA state is not inherited across fork; a fresh exec is clean), killing it after
/// `limit`: scenarios that could hang (an abort during init) cannot hang the suite.
inline child_result run_child(const std::string& what, std::chrono::seconds limit) {
  child_result res;
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("autoshard-gpu-child-" + std::to_string(::getpid()) + "-" + what + ".log")).string();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::string self = "/proc/self/exe", flag = "--autoshard-child=" + what;
  char* argv[] = {self.data(), flag.data(), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, self.c_str(), &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("posix_spawn of " + self + " failed: " + std::to_string(rc));
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  for (;;) {
    const pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      res.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!res.timed_out && WIFEXITED(status)) res.exit_code = WEXITSTATUS(status);
  std::ifstream in(out);
  res.output.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  std::error_code ec;
  std::filesystem::remove(out, ec);
  return res;
}

/// Ranks for the multi-rank tests: every visible device, at most 8.
inline int test_ranks() {
  const int n = nccl_communicator::device_count();
  return n < 8 ? n : 8;
}

}  // namespace autoshard::gpu_test

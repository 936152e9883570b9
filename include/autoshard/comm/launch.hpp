#pragma once
/// Starting ranks: as threads of this process (tests, examples), or as forked processes
/// that meet through a FileStore named by the environment (RANK, WORLD_SIZE, AUTOSHARD_STORE).
///   autoshard::run_ranks(8, [](autoshard::gloo_communicator& c) { c.barrier(); });
///   int failed = autoshard::spawn_ranks(4, [](int rank) { auto c = autoshard::connect_from_env(); ...; return 0; });
#include <sys/types.h>  // pid_t
#include <sys/wait.h>   // waitpid
#include <unistd.h>     // fork, _exit

#include <chrono>       // std::chrono
#include <csignal>      // kill, SIGKILL
#include <cstdio>       // std::fprintf
#include <cstdlib>      // std::getenv, mkdtemp, setenv
#include <exception>    // std::exception_ptr
#include <filesystem>   // std::filesystem
#include <functional>   // std::function
#include <stdexcept>    // std::invalid_argument
#include <string>       // std::string
#include <thread>       // std::thread
#include <type_traits>  // std::is_invocable_v
#include <vector>       // std::vector

#include "../core/error.hpp"  // comm_error
#include "gloo.hpp"           // gloo_communicator, gloo_store, gloo_options

namespace autoshard {

/// A fresh, empty directory under the system temp dir (for a FileStore); removed by ~temp_dir.
class temp_dir {
 public:
  explicit temp_dir(const std::string& stem = "autoshard") {
    std::string pattern = (std::filesystem::temp_directory_path() / (stem + "-XXXXXX")).string();
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) throw comm_error("cannot create a temporary directory from " + pattern);
    path_ = buf.data();
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

/// The outcome of each rank of run_ranks_collect: null, or the exception it ended with.
using rank_results = std::vector<std::exception_ptr>;

/// Runs `fn` on n ranks, each a thread with its own TCP device, connected through one
/// in-process store. `fn` takes either (gloo_communicator&) — connected before the call —
/// or (int rank, const gloo_store&, const gloo_options&) to connect itself (or not: a
/// rank that never joins). Joins every thread, then returns each rank's exception.
template <class Fn>
rank_results run_ranks_collect(int n, Fn&& fn, const gloo_options& opts = {}) {
  constexpr bool connected = std::is_invocable_v<Fn&, gloo_communicator&>;
  static_assert(connected || std::is_invocable_v<Fn&, int, const gloo_store&, const gloo_options&>,
                "autoshard: run_ranks takes fn(gloo_communicator&) or fn(int rank, const gloo_store&, "
                "const gloo_options&)");
  if (n < 1) throw comm_error("run_ranks needs at least one rank, got " + std::to_string(n));
  gloo_store store = gloo_store::in_process();
  rank_results results(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        if constexpr (connected) {
          gloo_communicator c = gloo_communicator::connect(store, r, n, opts);
          fn(c);
        } else {
          fn(r, store, opts);
        }
      } catch (...) {
        results[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return results;
}

/// run_ranks_collect, rethrowing the lowest rank's exception after every thread has ended.
template <class Fn>
void run_ranks(int n, Fn&& fn, const gloo_options& opts = {}) {
  for (auto& e : run_ranks_collect(n, std::forward<Fn>(fn), opts))
    if (e) std::rethrow_exception(e);
}

/// Connects to the world the environment describes: RANK, WORLD_SIZE and AUTOSHARD_STORE
/// (a FileStore directory), plus optional AUTOSHARD_HOSTNAME, AUTOSHARD_IFACE and
/// AUTOSHARD_TIMEOUT_MS. What spawn_ranks sets, and what a cluster launcher can set.
inline gloo_communicator connect_from_env(gloo_options opts = {}) {
  auto need = [](const char* k) -> std::string {
    const char* v = std::getenv(k);
    if (v == nullptr || *v == '\0') throw comm_error(std::string("environment variable ") + k + " is not set");
    return v;
  };
  auto to_int = [](const std::string& k, const std::string& v) {
    try {
      std::size_t used = 0;
      long long x = std::stoll(v, &used);
      if (used != v.size()) throw std::invalid_argument(v);
      return x;
    } catch (const std::exception&) {
      throw comm_error("environment variable " + k + "='" + v + "' is not an integer");
    }
  };
  const int rank = static_cast<int>(to_int("RANK", need("RANK")));
  const int size = static_cast<int>(to_int("WORLD_SIZE", need("WORLD_SIZE")));
  if (const char* h = std::getenv("AUTOSHARD_HOSTNAME")) opts.hostname = h;
  if (const char* i = std::getenv("AUTOSHARD_IFACE")) opts.iface = i;
  if (const char* t = std::getenv("AUTOSHARD_TIMEOUT_MS"))
    opts.timeout = std::chrono::milliseconds(to_int("AUTOSHARD_TIMEOUT_MS", t));
  return gloo_communicator::connect(gloo_store::file(need("AUTOSHARD_STORE")), rank, size, opts);
}

/// Forks n processes; child r gets RANK=r, WORLD_SIZE=n and AUTOSHARD_STORE (a fresh FileStore
/// directory) in its environment, runs fn(r) and exits with its result (1 if it throws).
/// Waits for all, killing any still running after `limit`. Returns the number of ranks that
/// failed (non-zero exit, a signal, or killed). Call it before this process starts threads.
inline int spawn_ranks(int n, const std::function<int(int rank)>& fn,
                       std::chrono::milliseconds limit = std::chrono::minutes(10)) {
  if (n < 1) throw comm_error("spawn_ranks needs at least one rank, got " + std::to_string(n));
  temp_dir dir("autoshard-store");
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (pid_t p : pids) kill(p, SIGKILL);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      throw comm_error("fork failed for rank " + std::to_string(r));
    }
    if (pid == 0) {
      int code = 1;
      try {
        setenv("RANK", std::to_string(r).c_str(), 1);
        setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
        setenv("AUTOSHARD_STORE", dir.path().c_str(), 1);
        code = fn(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "autoshard: rank %d failed: %s\n", r, e.what());
      } catch (...) {
        std::fprintf(stderr, "autoshard: rank %d failed\n", r);
      }
      std::fflush(nullptr);
      _exit(code);  // skip the parent's atexit handlers and destructors (temp_dir among them)
    }
    pids.push_back(pid);
  }
  int failed = 0;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<bool> done(pids.size(), false);
  for (std::size_t left = pids.size(); left > 0;) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      const pid_t got = waitpid(pids[i], &status, WNOHANG);
      if (got == 0) continue;
      done[i] = true;
      --left;
      if (got < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (!done[i]) {
          kill(pids[i], SIGKILL);
          waitpid(pids[i], nullptr, 0);
          ++failed;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return failed;
}

}  // namespace autoshard

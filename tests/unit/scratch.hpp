// Temporary paths of the unit tests. ctest runs test cases as separate processes, two at a
// time, and several checkouts may run the same suite at once on one machine: a fixed name in
// the temp dir would let one process read another's half-written file. Every name carries the
// process id (and a counter), so no two processes share one.
#pragma once
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

namespace autoshard_test {

/// A path in the system temp dir that no other process uses: "<pid>-<n>-<name>".
inline std::filesystem::path unique_temp_path(const std::string& name) {
  static std::atomic<int> counter{0};
  return std::filesystem::temp_directory_path() /
         ("autoshard-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" + name);
}

/// A fresh directory under the system temp dir, removed with everything in it.
struct scratch_dir {
  std::filesystem::path path;
  scratch_dir() : path(unique_temp_path("dir")) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ec;  // a test may have taken the write permission away
    std::filesystem::permissions(path, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path, ec);
  }
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
};

/// A pid that is certainly gone: a child that has exited and been reaped (a killed writer's,
/// for the stale-temporary tests).
inline pid_t dead_pid() {
  const pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  ::waitpid(p, nullptr, 0);
  return p;
}

/// This thread's CPU time in seconds: what a growth test compares (other processes' load on a
/// shared machine does not count, as it would in wall time).
inline double thread_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace autoshard_test

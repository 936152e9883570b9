#pragma once
/// What this process and machine give, read before work that could exhaust them starts:
/// memory (MemAvailable in /proc/meminfo), threads (RLIMIT_NPROC, kernel.threads-max), file
/// descriptors (RLIMIT_NOFILE) and address space (RLIMIT_AS less what the process maps).
///   const autoshard::machine_limits m = autoshard::machine_limits::here();
///   if (need > m.memory()) throw autoshard::resource_error(...);
/// The rank-thread estimates of the executor (exec/resources.hpp) and the JSON reader's
/// bound (io/json.hpp) compare against it.
#include <sys/resource.h>  // getrlimit

#include <algorithm>  // std::min
#include <cstdint>    // std::uint64_t
#include <fstream>    // std::ifstream
#include <limits>     // std::numeric_limits
#include <string>     // std::string

namespace autoshard {

/// Limits of this process and machine; `unlimited` where there is none.
struct machine_limits {
  static constexpr std::uint64_t unlimited = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t mem_available = unlimited;  ///< bytes (MemAvailable)
  std::uint64_t threads = unlimited;        ///< threads this process may still start
  std::uint64_t files = unlimited;          ///< file descriptors this process may still open
  std::uint64_t address_space = unlimited;  ///< bytes of address space it may still map
  std::uint64_t stack = 8u << 20;           ///< bytes a new thread reserves for its stack

  /// Reads /proc and the resource limits (a limit that cannot be read stays unlimited).
  static machine_limits here() {
    machine_limits m;
    const auto soft = [](int what) -> std::uint64_t {
      rlimit r{};
      if (getrlimit(what, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return unlimited;
      return static_cast<std::uint64_t>(r.rlim_cur);
    };
    const auto proc_value = [](const char* file, const std::string& key) -> std::uint64_t {
      std::ifstream in(file);
      std::string k;
      std::uint64_t v = 0;
      while (in >> k) {
        if (k == key && in >> v) return v;
        in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
      }
      return unlimited;
    };
    if (const std::uint64_t kb = proc_value("/proc/meminfo", "MemAvailable:"); kb != unlimited) m.mem_available = kb * 1024;
    const std::uint64_t used_threads = proc_value("/proc/self/status", "Threads:");
    std::uint64_t tmax = soft(RLIMIT_NPROC);
    if (std::ifstream in("/proc/sys/kernel/threads-max"); in) {
      std::uint64_t v = 0;
      if (in >> v) tmax = std::min(tmax, v);
    }
    // RLIMIT_NPROC counts every thread of the user, not only ours: keep half for the others.
    if (tmax != unlimited && used_threads != unlimited) m.threads = tmax / 2 > used_threads ? tmax / 2 - used_threads : 0;
    const std::uint64_t nofile = soft(RLIMIT_NOFILE);
    if (nofile != unlimited) {
      std::uint64_t open = 0;
      for (int fd = 0; fd < 4096; ++fd) {  // the descriptors the tool holds are few and low
        std::ifstream probe("/proc/self/fdinfo/" + std::to_string(fd));
        if (probe) ++open;
      }
      m.files = nofile > open ? nofile - open : 0;
    }
    const std::uint64_t as = soft(RLIMIT_AS);
    if (as != unlimited) {
      const std::uint64_t vm = proc_value("/proc/self/status", "VmSize:");
      const std::uint64_t used = vm == unlimited ? 0 : vm * 1024;
      m.address_space = as > used ? as - used : 0;
    }
    if (const std::uint64_t st = soft(RLIMIT_STACK); st != unlimited && st > 0) m.stack = st;
    return m;
  }
  /// Bytes a new allocation can still take: the smaller of MemAvailable and the address
  /// space left under RLIMIT_AS.
  std::uint64_t memory() const noexcept { return std::min(mem_available, address_space); }
};

}  // namespace autoshard

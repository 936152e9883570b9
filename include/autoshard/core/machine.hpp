#pragma once
/// What this process and machine give, read before work that could exhaust them starts:
/// memory (MemAvailable in /proc/meminfo), threads (RLIMIT_NPROC less the threads the user
/// already runs, kernel.threads-max less the machine's, the cgroup's pids.max less its
/// pids.current), file descriptors (RLIMIT_NOFILE) and address space (RLIMIT_AS less what the
/// process maps).
///   const autoshard::machine_limits m = autoshard::machine_limits::here();
///   if (need > m.memory()) throw autoshard::resource_error(... + m.memory_source() + ...);
/// The rank-thread estimates of the executor (exec/resources.hpp) and the JSON reader's
/// bound (io/json.hpp) compare against it. available_cores() is how many threads of work the
/// process can run at once (the solver's and the upload staging's defaults).
#include <dirent.h>        // opendir, readdir: /proc
#include <sched.h>         // sched_getaffinity, CPU_COUNT
#include <sys/resource.h>  // getrlimit
#include <unistd.h>        // getuid

#include <algorithm>  // std::min
#include <cstdint>    // std::uint64_t
#include <fstream>    // std::ifstream
#include <limits>     // std::numeric_limits
#include <sstream>    // std::istringstream
#include <string>     // std::string
#include <thread>     // std::thread::hardware_concurrency

namespace autoshard {

/// The cores the calling thread may run on: its CPU affinity (sched_getaffinity: what taskset,
/// numactl or a container's cpuset leave it), else std::thread::hardware_concurrency(), which
/// counts every core of the machine; at least 1. On a 64-core machine, a job pinned to 2 cores
/// started 64 solver threads (and 8 staging threads) on them.
inline unsigned available_cores() noexcept {
#if defined(__linux__) && defined(CPU_COUNT)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return static_cast<unsigned>(CPU_COUNT(&set));
#endif
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1u : hw;
}

/// Limits of this process and machine; `unlimited` where there is none.
struct machine_limits {
  static constexpr std::uint64_t unlimited = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t mem_available = unlimited;  ///< bytes (MemAvailable)
  std::uint64_t threads = unlimited;        ///< threads this process may still start
  std::uint64_t files = unlimited;          ///< file descriptors this process may still open
  std::uint64_t address_space = unlimited;  ///< bytes of address space it may still map
  std::uint64_t stack = 8u << 20;           ///< bytes a new thread reserves for its stack
  /// The cgroup limit file that bounds mem_available (".../memory.max", ".../memory.high",
  /// ".../memory.limit_in_bytes"); empty where MemAvailable does.
  std::string mem_available_file;

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
    m.threads = threads_left(soft(RLIMIT_NPROC));
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

  /// What bounds mem_available, as refusals name it: "MemAvailable", or "the cgroup's limit,
  /// /sys/fs/cgroup/.../memory.max".
  std::string mem_available_source() const {
    return mem_available_file.empty() ? "MemAvailable" : "the cgroup's limit, " + mem_available_file;
  }
  /// What bounds memory(), as refusals name it: mem_available_source(), or "the address-space
  /// limit, ulimit -v".
  std::string memory_source() const {
    return address_space < mem_available ? "the address-space limit, ulimit -v" : mem_available_source();
  }
  /// Whether memory() is bounded by a limit someone set (ulimit -v, a cgroup's), which can be
  /// raised, rather than by the memory the machine has free.
  bool memory_limited() const noexcept { return address_space < mem_available || !mem_available_file.empty(); }

  /// The threads this process may still start: the least of what RLIMIT_NPROC (`nproc`)
  /// leaves the real user beside every thread of theirs already running (the kernel exempts
  /// root), what kernel.threads-max leaves the machine, and what the pids.max of this
  /// process's cgroup and its ancestors leave (cgroup v2, or v1's pids controller). Half of
  /// RLIMIT_NPROC used to be reserved for the others without counting them: under a limit
  /// nearly used up, verify started and its ranks waited their whole time-out for peers that
  /// could not start.
  static std::uint64_t threads_left(std::uint64_t nproc) {
    const auto left = [](std::uint64_t limit, std::uint64_t used) { return limit > used ? limit - used : 0; };
    const auto read_number = [](const std::string& file) -> std::uint64_t {
      std::ifstream in(file);
      std::uint64_t v = 0;
      return in >> v ? v : unlimited;  // "max" (no limit) or unreadable
    };
    std::uint64_t out = unlimited;
    if (nproc != unlimited && ::getuid() != 0) out = std::min(out, left(nproc, user_threads(::getuid())));
    if (const std::uint64_t tmax = read_number("/proc/sys/kernel/threads-max"); tmax != unlimited) {
      std::ifstream in("/proc/loadavg");  // "0.1 0.2 0.3 running/total last-pid": total threads now
      std::string a, b, c, tasks;
      if (in >> a >> b >> c >> tasks && tasks.find('/') != std::string::npos)
        out = std::min(out, left(tmax, std::stoull(tasks.substr(tasks.find('/') + 1))));
    }
    std::ifstream cg("/proc/self/cgroup");
    for (std::string line; std::getline(cg, line);) {  // "0::/path" (v2) or "N:pids:/path" (v1)
      const std::size_t a = line.find(':'), b = line.find(':', a + 1);
      if (a == std::string::npos || b == std::string::npos) continue;
      const std::string controllers = line.substr(a + 1, b - a - 1);
      const std::string root = controllers.empty() ? "/sys/fs/cgroup" : controllers == "pids" ? "/sys/fs/cgroup/pids" : "";
      if (root.empty()) continue;
      for (std::string path = line.substr(b + 1);; path = path.substr(0, path.rfind('/'))) {
        const std::uint64_t max = read_number(root + path + "/pids.max");
        const std::uint64_t current = read_number(root + path + "/pids.current");
        if (max != unlimited && current != unlimited) out = std::min(out, left(max, current));
        if (path.empty() || path == "/") break;
      }
    }
    return out;
  }

  /// The threads every process of real user `uid` runs now (what RLIMIT_NPROC counts).
  static std::uint64_t user_threads(uid_t uid) {
    std::uint64_t total = 0;
    DIR* proc = ::opendir("/proc");
    if (proc == nullptr) return 0;
    while (const dirent* e = ::readdir(proc)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      std::ifstream status(std::string("/proc/") + e->d_name + "/status");
      bool mine = false;
      for (std::string line; std::getline(status, line);) {
        std::istringstream f(line);
        std::string key;
        f >> key;
        if (key == "Uid:") {
          std::uint64_t real = 0;
          f >> real;
          mine = real == uid;
          if (!mine) break;
        } else if (key == "Threads:" && mine) {
          std::uint64_t n = 0;
          if (f >> n) total += n;
          break;
        }
      }
    }
    ::closedir(proc);
    return total;
  }
};

}  // namespace autoshard

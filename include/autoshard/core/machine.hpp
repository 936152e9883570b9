#pragma once
/// What this process and machine give, read before work that could exhaust them starts:
/// memory (MemAvailable in /proc/meminfo, or less where a cgroup's memory limit leaves less),
/// threads (RLIMIT_NPROC less the threads the user already runs, kernel.threads-max less the
/// machine's, the cgroup's pids.max less its pids.current), file descriptors (RLIMIT_NOFILE)
/// and address space (RLIMIT_AS less what the process maps).
///   const autoshard::machine_limits m = autoshard::machine_limits::here();
///   if (need > m.memory()) throw autoshard::resource_error(... + m.memory_source() + ...);
/// The rank-thread estimates of the executor (exec/resources.hpp) and the JSON reader's
/// bound (io/json.hpp) compare against it. available_cores() is how many threads of work the
/// process can run at once (the solver's and the upload staging's defaults).
#include <dirent.h>        // opendir, readdir: /proc
#include <sched.h>         // sched_getaffinity, CPU_COUNT
#include <sys/resource.h>  // getrlimit
#include <unistd.h>        // getuid, access

#include <algorithm>  // std::min
#include <cstdint>    // std::uint64_t
#include <fstream>    // std::ifstream
#include <limits>     // std::numeric_limits
#include <sstream>    // std::istringstream
#include <string>     // std::string
#include <thread>     // std::thread::hardware_concurrency
#include <vector>     // std::vector

namespace autoshard {

namespace detail {

inline constexpr std::uint64_t machine_unlimited = std::numeric_limits<std::uint64_t>::max();

/// The number a file of /proc or /sys holds; machine_unlimited where it holds none ("max") or
/// cannot be read.
inline std::uint64_t read_proc_number(const std::string& file) {
  std::ifstream in(file);
  std::uint64_t v = 0;
  return in >> v ? v : machine_unlimited;
}

/// The number after `key` in a file of "key value" lines (/proc/meminfo's "MemAvailable:",
/// memory.stat's "inactive_file"); machine_unlimited where there is none.
inline std::uint64_t read_proc_keyed(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  std::string k;
  std::uint64_t v = 0;
  while (in >> k) {
    if (k == key && in >> v) return v;
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return machine_unlimited;
}

/// One directory of the cgroup hierarchy a process belongs to.
struct cgroup_dir {
  std::string path;  ///< e.g. /sys/fs/cgroup/user.slice (v2), /sys/fs/cgroup/memory/docker (v1)
  bool v2 = false;   ///< the unified hierarchy (its files are named differently)
};

/// The directories of the cgroup of this process (as `proc_self_cgroup`, normally
/// /proc/self/cgroup, names it) and of each of its ancestors up to the root, the process's own
/// first: in the unified hierarchy ("0::/path", under `sys_fs_cgroup`), and in v1's hierarchy
/// of `v1_controller` ("N:memory:/path" or "N:cpu,cpuacct:/path", under
/// `sys_fs_cgroup`/`v1_controller`). Walking up to the root also finds a container's own limit
/// where its runtime mounts the container's cgroup as the root of /sys/fs/cgroup but
/// /proc/self/cgroup still names the host's path (the deeper directories then do not exist).
inline std::vector<cgroup_dir> cgroup_dirs(const std::string& proc_self_cgroup, const std::string& sys_fs_cgroup,
                                           const std::string& v1_controller) {
  std::vector<cgroup_dir> out;
  std::ifstream cg(proc_self_cgroup);
  for (std::string line; std::getline(cg, line);) {
    const std::size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    if (path.empty() || path[0] != '/') continue;  // the kernel writes "/" for the root
    std::string root = sys_fs_cgroup;
    if (!controllers.empty()) {
      if (("," + controllers + ",").find("," + v1_controller + ",") == std::string::npos) continue;
      root += "/" + v1_controller;  // systemd links each of a joint mount's controllers to it
      if (::access(root.c_str(), F_OK) != 0) root = sys_fs_cgroup + "/" + controllers;
    }
    for (;;) {  // "/a/b", then "/a", then "" (the root)
      while (!path.empty() && path.back() == '/') path.pop_back();
      out.push_back({root + path, controllers.empty()});
      if (path.empty()) break;
      path.resize(path.rfind('/'));
    }
  }
  return out;
}

/// What the cgroups of a process leave it to allocate before one of them OOM-kills it.
struct cgroup_memory {
  std::uint64_t left = machine_unlimited;  ///< bytes: the least headroom of any level
  std::string file;               ///< the limit file of that level; empty where none limits
};

/// The least headroom under the memory limit of the process's cgroup and every ancestor's:
/// the limit less the usage the kernel cannot simply reclaim, the usage less its inactive page
/// cache (memory.stat's inactive_file; v1: total_inactive_file, the level and its children),
/// the working set as Kubernetes and cAdvisor count it. A level whose limit file is missing or
/// holds no number is not limited; one whose usage cannot be read has its whole limit left.
/// v2 (memory.max, memory.current): memory.high counts too where it is lower. Past it the
/// kernel never OOM-kills but throttles every allocation of the cgroup and puts it under
/// heavy reclaim (since Linux 5.4 it sleeps allocators when reclaim fails), and its
/// documentation pairs it with an external monitor (systemd-oomd, oomd) that kills or relieves
/// the cgroup: work that needs more than memory.high crawls or is killed, which is what the
/// refusal up front exists to prevent. Unset, it is "max" and changes nothing.
/// v1 (memory.limit_in_bytes, memory.usage_in_bytes): "no limit" reads as the largest page
/// count in bytes (9223372036854771712 with 4 KiB pages), so a limit from 2^62 counts as none.
/// Swap is not counted: a cgroup that may swap past its limit thrashes rather than fits.
inline cgroup_memory cgroup_memory_left(const std::string& proc_self_cgroup, const std::string& sys_fs_cgroup) {
  cgroup_memory out;
  for (const cgroup_dir& d : cgroup_dirs(proc_self_cgroup, sys_fs_cgroup, "memory")) {
    std::string file = d.path + (d.v2 ? "/memory.max" : "/memory.limit_in_bytes");
    std::uint64_t limit = read_proc_number(file);
    if (const std::uint64_t high = d.v2 ? read_proc_number(d.path + "/memory.high") : machine_unlimited; high < limit)
      limit = high, file = d.path + "/memory.high";
    if (limit >= std::uint64_t{1} << 62) continue;
    std::uint64_t used = read_proc_number(d.path + (d.v2 ? "/memory.current" : "/memory.usage_in_bytes"));
    if (used == machine_unlimited) used = 0;
    const std::uint64_t inactive = read_proc_keyed(d.path + "/memory.stat", d.v2 ? "inactive_file" : "total_inactive_file");
    if (inactive != machine_unlimited) used = used > inactive ? used - inactive : 0;
    const std::uint64_t left = limit > used ? limit - used : 0;
    if (left < out.left) out = {left, file};
  }
  return out;
}

}  // namespace detail

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
  static constexpr std::uint64_t unlimited = detail::machine_unlimited;
  std::uint64_t mem_available = unlimited;  ///< bytes: MemAvailable, or less under a cgroup's limit
  std::uint64_t threads = unlimited;        ///< threads this process may still start
  std::uint64_t files = unlimited;          ///< file descriptors this process may still open
  std::uint64_t address_space = unlimited;  ///< bytes of address space it may still map
  std::uint64_t stack = 8u << 20;           ///< bytes a new thread reserves for its stack
  /// The cgroup limit file that bounds mem_available (".../memory.max", ".../memory.high",
  /// ".../memory.limit_in_bytes"); empty where MemAvailable does.
  std::string mem_available_file;

  /// Reads /proc, the cgroups (/proc/self/cgroup, /sys/fs/cgroup) and the resource limits (a
  /// limit that cannot be read stays unlimited).
  static machine_limits here() {
    machine_limits m = memory_here();
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
    if (const std::uint64_t st = soft(RLIMIT_STACK); st != unlimited && st > 0) m.stack = st;
    return m;
  }
  /// The memory figures of here() alone (mem_available, its source, address_space), the others
  /// left unlimited: a few small files, where here() also counts the open descriptors (about
  /// 7 ms), for checks made once per solve or while a file is read.
  static machine_limits memory_here() {
    machine_limits m;
    if (const std::uint64_t kb = detail::read_proc_keyed("/proc/meminfo", "MemAvailable:"); kb != unlimited) m.mem_available = kb * 1024;
    // Inside a container MemAvailable is the host's: the cgroup's limit ends the process first.
    if (const detail::cgroup_memory cg = detail::cgroup_memory_left("/proc/self/cgroup", "/sys/fs/cgroup"); cg.left < m.mem_available)
      m.mem_available = cg.left, m.mem_available_file = cg.file;
    if (const std::uint64_t as = soft(RLIMIT_AS); as != unlimited) {
      const std::uint64_t vm = detail::read_proc_keyed("/proc/self/status", "VmSize:");
      const std::uint64_t used = vm == unlimited ? 0 : vm * 1024;
      m.address_space = as > used ? as - used : 0;
    }
    return m;
  }
  /// Memory mappings this process may still make: vm.max_map_count less the mappings it has
  /// now (the lines of /proc/self/maps); unlimited where either cannot be read. A mapping past
  /// it fails with ENOMEM, as the allocator's own do then: a checkpoint keeps each of its
  /// safetensors files mapped while it is open.
  static std::uint64_t maps_left() {
    const std::uint64_t max = detail::read_proc_number("/proc/sys/vm/max_map_count");
    std::ifstream maps("/proc/self/maps");
    if (max == unlimited || !maps) return unlimited;
    std::uint64_t n = 0;
    for (std::string line; std::getline(maps, line);) ++n;
    return max > n ? max - n : 0;
  }
  /// A soft resource limit (getrlimit), unlimited when none or unreadable.
  static std::uint64_t soft(int what) {
    rlimit r{};
    if (getrlimit(what, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return unlimited;
    return static_cast<std::uint64_t>(r.rlim_cur);
  }
  /// Bytes a new allocation can still take: the smaller of mem_available and the address
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
    using detail::read_proc_number;
    std::uint64_t out = unlimited;
    if (nproc != unlimited && ::getuid() != 0) out = std::min(out, left(nproc, user_threads(::getuid())));
    if (const std::uint64_t tmax = read_proc_number("/proc/sys/kernel/threads-max"); tmax != unlimited) {
      std::ifstream in("/proc/loadavg");  // "0.1 0.2 0.3 running/total last-pid": total threads now
      std::string a, b, c, tasks;
      if (in >> a >> b >> c >> tasks && tasks.find('/') != std::string::npos)
        out = std::min(out, left(tmax, std::stoull(tasks.substr(tasks.find('/') + 1))));
    }
    for (const detail::cgroup_dir& d : detail::cgroup_dirs("/proc/self/cgroup", "/sys/fs/cgroup", "pids")) {
      const std::uint64_t max = read_proc_number(d.path + "/pids.max");
      const std::uint64_t current = read_proc_number(d.path + "/pids.current");
      if (max != unlimited && current != unlimited) out = std::min(out, left(max, current));
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

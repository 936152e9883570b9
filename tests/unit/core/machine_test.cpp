// machine_limits' memory inside a container: the headroom a cgroup's memory limit leaves (v1
// and v2, at every level up to the root), read from fake /proc/self/cgroup and /sys/fs/cgroup
// trees, and the name the refusals give the figure.
#include <autoshard/core/machine.hpp>
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "unit/scratch.hpp"

using namespace autoshard;
namespace fs = std::filesystem;

namespace {
/// A fake /proc/self/cgroup and /sys/fs/cgroup under a scratch directory.
struct cgroup_tree {
  autoshard_test::scratch_dir dir;
  std::string self() const { return (dir / "self_cgroup").string(); }
  std::string sys() const { return (dir / "sys").string(); }
  void put(const std::string& path, const std::string& text) const {
    const fs::path p = dir.path / path;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  /// A level's limit, usage and memory.stat ("" leaves a file out), under sys/`cgroup` in v2's
  /// names, or under sys/memory/`cgroup` in v1's.
  void v2(const std::string& cgroup, const std::string& max, const std::string& current, const std::string& stat = "") const {
    level("sys/" + cgroup, "memory.max", max, "memory.current", current, stat);
  }
  void v1(const std::string& cgroup, const std::string& limit, const std::string& usage, const std::string& stat = "") const {
    level("sys/memory/" + cgroup, "memory.limit_in_bytes", limit, "memory.usage_in_bytes", usage, stat);
  }
  detail::cgroup_memory left() const { return detail::cgroup_memory_left(self(), sys()); }

 private:
  void level(const std::string& at, const std::string& limit_file, const std::string& limit, const std::string& usage_file,
             const std::string& usage, const std::string& stat) const {
    if (!limit.empty()) put(at + "/" + limit_file, limit + "\n");
    if (!usage.empty()) put(at + "/" + usage_file, usage + "\n");
    if (!stat.empty()) put(at + "/memory.stat", stat + "\n");
  }
};
}  // namespace

TEST_CASE("cgroup v2: the least headroom of every level, each limit less its working set") {
  cgroup_tree t;
  t.put("self_cgroup", "0::/kubepods/pod1\n");
  // The pod: 2000 limit, 1500 used of which 1000 inactive page cache: 1500 left.
  t.v2("kubepods/pod1", "2000", "1500", "anon 400\nfile 1100\nactive_file 100\ninactive_file 1000");
  // Its parent: 1000 limit, 400 used, 100 inactive: 700 left, the least.
  t.v2("kubepods", "1000", "400", "anon 300\ninactive_file 100\nactive_anon 5");
  t.v2("", "", "999999");  // the root has no memory.max
  detail::cgroup_memory m = t.left();
  CHECK(m.left == 700);
  CHECK(m.file == t.sys() + "/kubepods/memory.max");

  SUBCASE("\"max\" is no limit") {
    t.put("sys/kubepods/memory.max", "max\n");
    m = t.left();
    CHECK(m.left == 1500);
    CHECK(m.file == t.sys() + "/kubepods/pod1/memory.max");
  }
  SUBCASE("memory.high counts where it is below memory.max") {
    t.put("sys/kubepods/pod1/memory.high", "600\n");  // 600 - (1500 - 1000) = 100
    m = t.left();
    CHECK(m.left == 100);
    CHECK(m.file == t.sys() + "/kubepods/pod1/memory.high");
    t.put("sys/kubepods/pod1/memory.high", "max\n");
    CHECK(t.left().left == 700);
    t.put("sys/kubepods/pod1/memory.high", "3000\n");  // above memory.max: the max binds
    CHECK(t.left().file == t.sys() + "/kubepods/memory.max");
  }
  SUBCASE("usage above the limit leaves nothing") {
    t.put("sys/kubepods/pod1/memory.current", "5000\n");  // 5000 - 1000 inactive > 2000
    m = t.left();
    CHECK(m.left == 0);
    CHECK(m.file == t.sys() + "/kubepods/pod1/memory.max");
  }
  SUBCASE("a memory.stat without inactive_file: the whole usage counts") {
    t.put("sys/kubepods/memory.stat", "anon 300\nactive_file 100\n");
    CHECK(t.left().left == 600);
    fs::remove(t.dir / "sys/kubepods/memory.stat");
    CHECK(t.left().left == 600);
  }
  SUBCASE("more inactive cache than usage (the counters are read apart): nothing used") {
    t.put("sys/kubepods/memory.stat", "inactive_file 500\n");
    CHECK(t.left().left == 1000);
  }
  SUBCASE("a usage that cannot be read leaves the whole limit") {
    fs::remove(t.dir / "sys/kubepods/memory.current");
    CHECK(t.left().left == 1000);
  }
  SUBCASE("a missing or unreadable limit file is no limit") {
    fs::remove(t.dir / "sys/kubepods/memory.max");
    CHECK(t.left().left == 1500);
    fs::create_directories(t.dir / "sys/kubepods/memory.max");  // opens, but reads nothing (even as root)
    CHECK(t.left().left == 1500);
    fs::remove(t.dir / "sys/kubepods/pod1/memory.max");
    m = t.left();
    CHECK(m.left == machine_limits::unlimited);
    CHECK(m.file.empty());
  }
  SUBCASE("no /proc/self/cgroup: no limit") {
    fs::remove(t.dir / "self_cgroup");
    CHECK(t.left().left == machine_limits::unlimited);
  }
}

TEST_CASE("cgroup v1: memory.limit_in_bytes less the working set, the huge default is no limit") {
  cgroup_tree t;
  t.put("self_cgroup", "9:name=systemd:/\n5:pids:/x\n4:memory:/docker/abc\n0::/\n");
  t.v1("docker/abc", "9223372036854771712", "3403776", "inactive_file 69632\ntotal_inactive_file 69632");
  t.v1("", "9223372036854771712", "");
  CHECK(t.left().left == machine_limits::unlimited);

  SUBCASE("a limit at one level") {
    // total_inactive_file (the level and its children) counts, not inactive_file.
    t.v1("docker", "1073741824", "536870912", "cache 1\ninactive_file 5\ntotal_cache 9\ntotal_inactive_file 268435456");
    const detail::cgroup_memory m = t.left();
    CHECK(m.left == 805306368);  // 1 GiB - (512 MiB - 256 MiB)
    CHECK(m.file == t.sys() + "/memory/docker/memory.limit_in_bytes");
  }
  SUBCASE("a container whose own cgroup is mounted as the root: the deeper paths do not exist") {
    fs::remove_all(t.dir / "sys/memory/docker");
    t.v1("", "1000", "1200");
    const detail::cgroup_memory m = t.left();
    CHECK(m.left == 0);
    CHECK(m.file == t.sys() + "/memory/memory.limit_in_bytes");
  }
  SUBCASE("memory in a list of controllers, and a v2 limit beside it (hybrid): the least") {
    t.put("self_cgroup", "4:memory,hugetlb:/docker/abc\n0::/user\n");
    t.v1("docker/abc", "5000", "1000", "total_inactive_file 0");
    t.v2("user", "3000", "1000");
    CHECK(t.left().left == 2000);
    CHECK(t.left().file == t.sys() + "/user/memory.max");
    t.v2("user", "9000", "100");
    CHECK(t.left().left == 4000);
    CHECK(t.left().file == t.sys() + "/memory/docker/abc/memory.limit_in_bytes");
  }
}

TEST_CASE("cgroup_dirs: the process's cgroup up to the root, in each hierarchy that holds the controller") {
  cgroup_tree t;
  // A line without two colons or a path without its leading '/' (never the kernel's) is skipped.
  t.put("self_cgroup", "0::/a/b\n8:pids:/p/\n3:cpu,cpuacct:/c\nbroken line\n2:pids:relative\n");
  std::vector<std::string> got;
  for (const detail::cgroup_dir& d : detail::cgroup_dirs(t.self(), t.sys(), "pids")) got.push_back(d.path + (d.v2 ? " v2" : " v1"));
  const std::string s = t.sys();
  CHECK(got == std::vector<std::string>{s + "/a/b v2", s + "/a v2", s + " v2", s + "/pids/p v1", s + "/pids v1"});
  got.clear();
  t.put("sys/cpu,cpuacct/c/cpu.shares", "1024\n");  // a joint mount without the per-controller link
  for (const detail::cgroup_dir& d : detail::cgroup_dirs(t.self(), t.sys(), "cpuacct")) got.push_back(d.path);
  CHECK(got == std::vector<std::string>{s + "/a/b", s + "/a", s, s + "/cpu,cpuacct/c", s + "/cpu,cpuacct"});
}

TEST_CASE("machine_limits names what bounds its memory, as the refusals print it") {
  machine_limits m;
  m.mem_available = 8u << 20;
  CHECK(m.memory_source() == "MemAvailable");
  CHECK(m.mem_available_source() == "MemAvailable");
  CHECK_FALSE(m.memory_limited());
  m.mem_available_file = "/sys/fs/cgroup/kubepods/memory.max";
  CHECK(m.memory_source() == "the cgroup's limit, /sys/fs/cgroup/kubepods/memory.max");
  CHECK(m.memory_limited());
  m.address_space = 1u << 20;
  CHECK(m.memory() == 1u << 20);
  CHECK(m.memory_source() == "the address-space limit, ulimit -v");
  CHECK(m.mem_available_source() == "the cgroup's limit, /sys/fs/cgroup/kubepods/memory.max");
  m.mem_available_file.clear();
  CHECK(m.memory_limited());

  const machine_limits here = machine_limits::here();
  CHECK(here.mem_available > 0);
  if (here.mem_available_file.empty()) CHECK(here.mem_available_source() == "MemAvailable");
  else CHECK(here.mem_available_source().find("the cgroup's limit, /sys/fs/cgroup/") == 0);
}

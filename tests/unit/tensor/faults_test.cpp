// Fault injection for the checkpoint sharder: a disk that fills up (RLIMIT_FSIZE in a forked
// child, with SIGXFSZ ignored so write() fails with EFBIG), an output directory the process
// cannot write (a child that drops root), and a process killed mid-write (SIGKILL). After each:
// no rank file or index.json exists under its final name unless complete, and a rerun succeeds
// (and removes the temporaries a killed run left, but nothing else).
// docs/reliability.md records what each one shows the user.
#include <autoshard/tensor/tensor.hpp>
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "unit/scratch.hpp"

using namespace autoshard;
namespace fs = std::filesystem;
using autoshard_test::scratch_dir;

namespace {

// Two f32 tensors, 256 KiB and 1 KiB, labelled with their index; saved as model.safetensors.
void write_fault_model(const fs::path& file) {
  host_tensor a(dtype::f32, {512, 128}), b(dtype::f32, {256});
  for (std::int64_t i = 0; i < a.numel(); ++i) a.as<float>()[i] = static_cast<float>(i);
  for (std::int64_t i = 0; i < b.numel(); ++i) b.as<float>()[i] = static_cast<float>(-i);
  save_safetensors(file, {{"a", a}, {"b", b}});
}

plan_policy fault_plan() {
  plan_policy p{device_mesh{2}, {}, split_rule::chunk};
  p.specs["a"] = parse_spec("S0R", 1, 2);
  return p;
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> n;
  if (!fs::exists(dir)) return n;
  for (const auto& e : fs::directory_iterator(dir)) n.push_back(e.path().filename().string());
  std::sort(n.begin(), n.end());
  return n;
}

// Runs `body` in a forked child; returns its wait status. The child never returns into doctest.
template <class F>
int in_child(F&& body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 99;
    try {
      code = body();
    } catch (...) {
      code = 98;
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

// The rerun the tests end with: it succeeds and every tensor gathers back exactly.
void check_rerun(const fs::path& model, const fs::path& out) {
  checkpoint in(model);
  shard_checkpoint(in, fault_plan(), out);
  sharded_checkpoint sc(out);
  CHECK(sc.world_size() == 2);
  CHECK(bitwise_equal(sc.gather("a").view(), in.view("a")));
  CHECK(bitwise_equal(sc.gather("b").view(), in.view("b")));
}

}  // namespace

TEST_CASE("faults: disk full (RLIMIT_FSIZE) is an io_error and leaves no file behind") {
  scratch_dir dir;
  write_fault_model(dir / "model.safetensors");
  const fs::path out = dir / "out";
  const int status = in_child([&] {
    ::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG instead of killing the process
    struct rlimit lim {64 * 1024, 64 * 1024};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 97;
    checkpoint in(dir / "model.safetensors");
    try {
      shard_checkpoint(in, fault_plan(), out);
    } catch (const io_error& e) {
      // "io error: cannot write '.../rank-0.safetensors.tmp.<pid>': File too large"
      return std::strstr(e.what(), "cannot write") && std::strstr(e.what(), "File too large") ? 0 : 2;
    }
    return 1;
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(names_in(out).empty());  // the temporaries were removed on the way out
  check_rerun(dir / "model.safetensors", out);
  CHECK(names_in(out) == std::vector<std::string>{"index.json", "rank-0.safetensors", "rank-1.safetensors"});
}

TEST_CASE("faults: an output directory that is not writable is an io_error and nothing is written") {
  scratch_dir dir;
  write_fault_model(dir / "model.safetensors");
  const fs::path out = dir / "out";
  fs::create_directories(out);
  ::chmod(out.c_str(), 0555);
  const int status = in_child([&] {
    // Root ignores permissions: drop to 'nobody' first (the scratch dir is world-searchable).
    if (::geteuid() == 0 && ::setresuid(65534, 65534, 65534) != 0) return 97;
    checkpoint in(dir / "model.safetensors");
    try {
      shard_checkpoint(in, fault_plan(), out);
    } catch (const io_error& e) {
      // "io error: cannot create '.../rank-0.safetensors.tmp.<pid>': Permission denied"
      return std::strstr(e.what(), "cannot create") && std::strstr(e.what(), "Permission denied") ? 0 : 2;
    }
    return 1;
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(names_in(out).empty());
  ::chmod(out.c_str(), 0755);
  check_rerun(dir / "model.safetensors", out);
}

TEST_CASE("faults: a sharder killed mid-write leaves no file under a final name, and a rerun cleans up and succeeds") {
  scratch_dir dir;
  write_fault_model(dir / "model.safetensors");
  const fs::path out = dir / "out";
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(ready[0]);
    checkpoint in(dir / "model.safetensors");
    shard_options o;
    o.progress = [&](const shard_progress&) {  // after the first tensor: tell the parent, then hang
      const char c = 'x';
      (void)!::write(ready[1], &c, 1);
      for (;;) ::pause();
    };
    try {
      shard_checkpoint(in, fault_plan(), out, o);
    } catch (...) {
    }
    ::_exit(1);
  }
  ::close(ready[1]);
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  ::close(ready[0]);
  const auto during = names_in(out);
  REQUIRE(::kill(pid, SIGKILL) == 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status));
  // Mid-write the directory holds only temporaries ("rank-0.safetensors.tmp.<pid>.<random>", ...).
  CHECK(!during.empty());
  const auto after = names_in(out);
  const std::string mark = ".tmp." + std::to_string(pid) + ".";
  for (const auto& n : after) {
    CAPTURE(n);
    const auto at = n.find(mark);
    REQUIRE(at != std::string::npos);
    CHECK(n.size() - at - mark.size() == 16);  // the unpredictable part: 16 hex digits
  }
  CHECK(!fs::exists(out / "index.json"));
  // SIGKILL runs no destructor: the killed run's temporaries stay until the next run into the
  // same directory, which removes them (their writer is gone) and writes its own files.
  CHECK(!after.empty());
  checkpoint in(dir / "model.safetensors");
  const shard_report rep = shard_checkpoint(in, fault_plan(), out);
  CHECK(rep.removed_stale.size() == after.size());
  for (const auto& n : after) CHECK(!fs::exists(out / n));
  // Nothing but the complete outputs: no "*.tmp.*" of either run.
  CHECK(names_in(out) == std::vector<std::string>{"index.json", "rank-0.safetensors", "rank-1.safetensors"});
  sharded_checkpoint sc(out);
  CHECK(sc.world_size() == 2);
  CHECK(bitwise_equal(sc.gather("a").view(), in.view("a")));
  CHECK(bitwise_equal(sc.gather("b").view(), in.view("b")));
}

TEST_CASE("faults: only the sharder's own temporaries of a dead writer are removed, nothing else") {
  scratch_dir dir;
  write_fault_model(dir / "model.safetensors");
  const fs::path out = dir / "out";
  fs::create_directories(out / "rank-1.safetensors.tmp.77");  // a directory: not a file we wrote
  const pid_t dead = autoshard_test::dead_pid();
  REQUIRE(dead > 0);
  const std::string d = std::to_string(dead);
  const std::vector<std::string> stale = {"rank-0.safetensors.tmp." + d, "rank-1.safetensors.tmp." + d,
                                          "index.json.tmp." + d + ".0123456789abcdef"};
  const std::vector<std::string> keep = {
      "rank-0.safetensors.tmp.1",           // pid 1 is alive (init): a writer still at work
      "rank-2.safetensors.tmp." + d,        // a rank this run does not write (2 ranks)
      "model.safetensors.tmp." + d,         // not a name the sharder writes
      "notes.txt.tmp." + d,                 // nor this
      "rank-0.safetensors.tmp." + d + "x",  // not a pid
      "rank-0.safetensors.tmp." + d + ".0123456789abcdeX",  // not 16 hex digits after the pid
      "rank-0.safetensors.tmp." + d + ".0123",              //
      "rank-0.safetensors.tmp.0",           // pid 0 would mean the process group: never
      "rank-0.safetensors.tmp.-5",          //
      "rank-0.safetensors.tmp.",            //
      "rank-0.safetensors.tmp.99999999999", // beyond any pid
      "xrank-0.safetensors.tmp." + d,       //
  };
  for (const auto& n : stale) std::ofstream(out / n) << "half a file";
  for (const auto& n : keep) std::ofstream(out / n) << "not ours";
  // A symbolic link under a stale-looking name (the pid ten times a dead one): not a file we wrote.
  const std::string link = "index.json.tmp." + d + "0";
  fs::create_symlink(out / ("notes.txt.tmp." + d), out / link);
  checkpoint in(dir / "model.safetensors");
  const shard_report rep = shard_checkpoint(in, fault_plan(), out);
  CHECK(rep.removed_stale.size() == stale.size());
  for (const auto& n : stale) CHECK(!fs::exists(out / n));
  for (const auto& n : keep) {
    CAPTURE(n);
    CHECK(fs::is_regular_file(out / n));
  }
  CHECK(fs::is_directory(out / "rank-1.safetensors.tmp.77"));
  CHECK(fs::is_symlink(out / link));
  sharded_checkpoint sc(out);
  CHECK(bitwise_equal(sc.gather("a").view(), in.view("a")));
}

// The generation index.json names (every file of one sharding run carries it).
std::string generation_of(const fs::path& dir) {
  return nlohmann::json::parse(std::ifstream(dir / "index.json")).at("generation").get<std::string>();
}

TEST_CASE("faults: a prepared shard left uncommitted leaves the directory as it was, an older output included") {
  scratch_dir dir;
  write_fault_model(dir / "model.safetensors");
  checkpoint in(dir / "model.safetensors");
  const fs::path out = dir / "out";
  shard_checkpoint(in, fault_plan(), out);  // the older run
  const std::string old_generation = generation_of(out);
  const std::vector<std::string> before = names_in(out);
  std::map<std::string, std::uintmax_t> sizes;
  for (const auto& n : before) sizes[n] = fs::file_size(out / n);
  {
    pending_shard_checkpoint p = prepare_shard_checkpoint(in, fault_plan(), {"a", "b"}, out);
    CHECK(p.report().world_size == 2);
    CHECK(p.report().bytes_written > 0);
    CHECK(names_in(out).size() == before.size() + 3);  // two rank files and the index, under temporary names
    CHECK(generation_of(out) == old_generation);
  }  // destroyed uncommitted: the failure of a later stage
  CHECK(names_in(out) == before);
  for (const auto& n : before) CHECK(fs::file_size(out / n) == sizes[n]);
  CHECK(generation_of(out) == old_generation);
  // A directory it made, left uncommitted: removed with its temporaries.
  const fs::path fresh = dir / "fresh/stage-0";
  { pending_shard_checkpoint p = prepare_shard_checkpoint(in, fault_plan(), {"a"}, fresh); }
  CHECK(!fs::exists(fresh));
  // Moved (as into a vector of stages) and committed: the new output, in place once.
  std::vector<pending_shard_checkpoint> stages;
  stages.push_back(prepare_shard_checkpoint(in, fault_plan(), {"a", "b"}, out));
  CHECK(generation_of(out) == old_generation);
  const shard_report rep = stages.front().commit();
  CHECK(rep.world_size == 2);
  CHECK_THROWS_AS(stages.front().commit(), io_error);
  sharded_checkpoint sc(out);
  CHECK(generation_of(out) != old_generation);
  CHECK(bitwise_equal(sc.gather("a").view(), in.view("a")));
  CHECK(names_in(out) == before);
}

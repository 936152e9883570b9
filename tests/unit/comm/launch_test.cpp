// Launching like torchrun, Slurm and mpirun (comm/launch_env.hpp, gloo/launch.hpp): the
// standard variables read and validated, the store address derived from them, and two
// local "nodes" (separate process groups, two ranks each, every process given only the
// variables torchrun gives it, on loopback) that meet and run a redistribute; and run_ranks
// refusing cleanly when its threads cannot be created.
#include <doctest/doctest.h>

#include <autoshard/gloo/gloo.hpp>

#include <sys/resource.h>  // setrlimit
#include <sys/wait.h>      // waitpid
#include <unistd.h>        // fork, setpgid, _exit

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

using namespace autoshard;

namespace {

env_lookup vars(std::map<std::string, std::string> m) {
  return [m = std::move(m)](const char* k) -> const char* {
    auto it = m.find(k);
    return it == m.end() ? nullptr : it->second.c_str();
  };
}

std::string error_of(const std::map<std::string, std::string>& m) {
  try {
    (void)read_launch_env(vars(m));
  } catch (const comm_error& e) {
    return e.what();
  }
  return "no error";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Waits for pid up to `limit`, then kills its process group; true if it exited 0.
bool wait_ok(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    int status = 0;
    const pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid) return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (got < 0) return false;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(-pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

TEST_CASE("launch variables: torchrun's, Open MPI's and Slurm's, in that order") {
  launch_env t = read_launch_env(vars({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                       {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}}));
  CHECK(t.launcher == "torchrun");
  CHECK(t.rank == 5);
  CHECK(t.world_size == 8);
  CHECK(t.local_rank == 1);
  CHECK(t.local_world_size == 4);
  CHECK(t.master_addr == "node0");
  CHECK(t.master_port == 29500);
  launch_env o = read_launch_env(vars({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"SLURM_PROCID", "0"},
                                       {"SLURM_NTASKS", "1"}}));
  CHECK(o.launcher == "open mpi");
  CHECK(o.rank == 3);
  CHECK(o.world_size == 4);
  CHECK(o.local_rank == 1);
  CHECK(o.master_port == 0);
  launch_env s = read_launch_env(vars({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"},
                                       {"SLURM_NTASKS_PER_NODE", "4(x2)"}}));
  CHECK(s.launcher == "slurm");
  CHECK(s.rank == 6);
  CHECK(s.local_rank == 2);
  CHECK(s.local_world_size == -1);  // "4(x2)" is not a plain count
  // torchrun under Slurm: torchrun's RANK wins over the Slurm task id.
  CHECK(read_launch_env(vars({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}))
            .rank == 3);
}

TEST_CASE("launch variables that cannot be used are refused, naming the variable") {
  CHECK(contains(error_of({}), "no rank in the environment: set RANK and WORLD_SIZE"));
  CHECK(contains(error_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}}), "environment variable RANK='x' is not an integer"));
  CHECK(contains(error_of({{"RANK", "1.5"}, {"WORLD_SIZE", "2"}}), "RANK='1.5' is not an integer"));
  CHECK(contains(error_of({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}), "RANK=-1 is outside [0, 1048576]"));
  CHECK(contains(error_of({{"RANK", "0"}}), "RANK is set but WORLD_SIZE is not"));
  CHECK(contains(error_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}}), "RANK=4 is outside WORLD_SIZE=4 (ranks are 0..3)"));
  CHECK(contains(error_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), "WORLD_SIZE=0 is outside [1, 1048576]"));
  CHECK(contains(error_of({{"RANK", "0"}, {"WORLD_SIZE", "99999999999999999999"}}), "is outside [1, 1048576]"));
  CHECK(contains(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}),
                 "MASTER_PORT=70000 is outside [1, 65535]"));
  CHECK(contains(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "0"}}), "MASTER_PORT=0 is outside"));
  CHECK(contains(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "http"}}),
                 "MASTER_PORT='http' is not an integer"));
  CHECK(contains(error_of({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
                 "LOCAL_RANK=2 is outside LOCAL_WORLD_SIZE=2"));
  CHECK(contains(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "-3"}}), "SLURM_NTASKS=-3 is outside"));
  const launch_env e = read_launch_env(vars({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "6"}}));
  CHECK_THROWS_WITH_AS(e.check_mesh(device_mesh{2, 4}),
                       doctest::Contains("the launch has 6 ranks (SLURM_NTASKS=6) but mesh(2,4) needs 8"), comm_error);
  CHECK_NOTHROW(e.check_mesh(device_mesh{2, 3}));
}

TEST_CASE("the store of a launch: MASTER_ADDR and MASTER_PORT, next to torchrun's own store, or AUTOSHARD_STORE") {
  const std::map<std::string, std::string> base{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"},
                                                {"MASTER_PORT", "29500"}};
  auto with = [&](std::map<std::string, std::string> extra) {
    auto m = base;
    for (auto& [k, v] : extra) m[k] = v;
    return m;
  };
  auto address = [](const std::map<std::string, std::string>& m) {
    const env_lookup get = vars(m);
    return launch_store_address(read_launch_env(get), get);
  };
  CHECK(address(base) == "tcp://node0:29500");
  CHECK(address(with({{"TORCHELASTIC_USE_AGENT_STORE", "True"}})) == "tcp://node0:29501");
  CHECK(address(with({{"TORCHELASTIC_USE_AGENT_STORE", "False"}})) == "tcp://node0:29500");
  CHECK(address(with({{"AUTOSHARD_MASTER_PORT", "31000"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}})) ==
        "tcp://node0:31000");
  CHECK(address(with({{"AUTOSHARD_STORE", "/shared/run1"}})) == "/shared/run1");
  CHECK(address(with({{"MASTER_ADDR", "::1"}})) == "tcp://[::1]:29500");
  CHECK_THROWS_WITH_AS(address({{"RANK", "0"}, {"WORLD_SIZE", "2"}}), doctest::Contains("MASTER_ADDR is not set"),
                       comm_error);
  CHECK_THROWS_WITH_AS(address({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"}}),
                       doctest::Contains("MASTER_ADDR is set but MASTER_PORT is not"), comm_error);
  CHECK_THROWS_WITH_AS(address(with({{"AUTOSHARD_MASTER_PORT", "65536"}})),
                       doctest::Contains("AUTOSHARD_MASTER_PORT=65536 is outside [1, 65535]"), comm_error);
  CHECK_THROWS_WITH_AS(address(with({{"MASTER_PORT", "65535"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}})),
                       doctest::Contains("set AUTOSHARD_MASTER_PORT"), comm_error);
}

TEST_CASE("two local nodes started like torchrun meet through MASTER_ADDR and MASTER_PORT and redistribute") {
  const std::string port = std::to_string(detail::free_tcp_port());
  const device_mesh mesh{2, 2};
  const tensor_shape global{6, 5};
  std::fflush(nullptr);
  std::vector<pid_t> nodes;
  for (int node = 0; node < 2; ++node) {
    const pid_t agent = fork();
    REQUIRE(agent >= 0);
    if (agent == 0) {  // the node's "agent": its own process group, one child per local rank
      setpgid(0, 0);
      std::vector<pid_t> ranks;
      for (int local = 0; local < 2; ++local) {
        const pid_t p = fork();
        if (p < 0) _exit(3);
        if (p == 0) {
          int code = 1;
          try {
            for (const char* k : {"AUTOSHARD_STORE", "AUTOSHARD_MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
                                  "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"})
              unsetenv(k);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            setenv("MASTER_PORT", port.c_str(), 1);
            setenv("WORLD_SIZE", "4", 1);
            setenv("LOCAL_WORLD_SIZE", "2", 1);
            setenv("RANK", std::to_string(2 * node + local).c_str(), 1);
            setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
            setenv("AUTOSHARD_TIMEOUT_MS", "20000", 1);
            const launch_env env = read_launch_env();
            env.check_mesh(mesh);
            mesh_communicator mc(connect_from_env(), mesh);
            // Labelled global tensor (value = row-major index): S0S1 shard -> replicated.
            const sharding_spec src = parse_spec("S0S1", 2, 2), dst = parse_spec("RR", 2, 2);
            const shard_box b = local_box(mesh, src, global, mc.rank());
            std::vector<double> mine;
            for (std::int64_t i = 0; i < b.shape[0]; ++i)
              for (std::int64_t j = 0; j < b.shape[1]; ++j)
                mine.push_back(static_cast<double>((b.offset[0] + i) * global[1] + b.offset[1] + j));
            const std::vector<double> out = redistribute(mc, std::span<const double>(mine), global, src, dst);
            bool right = out.size() == 30;
            for (std::size_t i = 0; right && i < out.size(); ++i) right = out[i] == static_cast<double>(i);
            mc.world().barrier();  // rank 0 hosts the store: nobody leaves before everyone is done
            code = right && env.local_rank == local && env.launcher == "torchrun" ? 0 : 2;
          } catch (const std::exception& e) {
            std::fprintf(stderr, "rank %d: %s\n", 2 * node + local, e.what());
          }
          std::fflush(nullptr);
          _exit(code);
        }
        ranks.push_back(p);
      }
      int failed = 0;
      for (pid_t p : ranks) {
        int status = 0;
        if (waitpid(p, &status, 0) != p || !WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
      }
      _exit(failed);
    }
    nodes.push_back(agent);
  }
  for (pid_t n : nodes) CHECK(wait_ok(n, std::chrono::seconds(60)));
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
TEST_CASE("run_ranks under an address-space limit: a clear comm_error, the created threads joined, no abort") {
  // A child process, so the limit binds nothing else: 64 ranks need 64 thread stacks (8 MiB
  // each by default) beyond what is left under the limit.
  std::fflush(nullptr);
  const pid_t p = fork();
  REQUIRE(p >= 0);
  if (p == 0) {
    int code = 1;
    rlimit stack{};
    getrlimit(RLIMIT_STACK, &stack);
    std::size_t vm_kb = 0;
    if (FILE* f = std::fopen("/proc/self/status", "r")) {
      char line[256];
      while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "VmSize: %zu kB", &vm_kb) == 1) break;
      std::fclose(f);
    }
    const rlim_t cap = static_cast<rlim_t>(vm_kb) * 1024 + (rlim_t{64} << 20);  // room for a few threads only
    const rlimit as{cap, cap};
    if (vm_kb == 0 || setrlimit(RLIMIT_AS, &as) != 0) _exit(77);
    try {
      (void)run_ranks_collect(64, [](gloo_communicator& c) { c.barrier(); });
      code = 3;  // all 64 started: the limit did not bind
    } catch (const comm_error& e) {
      const std::string w = e.what();
      code = contains(w, "run_ranks: cannot start the thread of rank") && contains(w, "were stopped before they ran")
                 ? 0
                 : 4;
      if (code != 0) std::fprintf(stderr, "%s\n", w.c_str());
    } catch (...) {
      code = 5;
    }
    std::fflush(nullptr);
    _exit(code);
  }
  int status = 0;
  REQUIRE(waitpid(p, &status, 0) == p);
  REQUIRE_FALSE(WIFSIGNALED(status));  // before: SIGABRT, "terminate called without an active exception"
  if (WEXITSTATUS(status) == 77) return;  // the limit could not be set here
  CHECK(WEXITSTATUS(status) == 0);
}
#endif

TEST_CASE("run_ranks refuses more rank threads than it can hold before creating any") {
  CHECK_THROWS_WITH_AS(run_ranks(max_rank_threads + 1, [](gloo_communicator&) {}),
                       doctest::Contains("ranks as threads of one process is above the limit of 1024"), comm_error);
}

#pragma once
/// Starting ranks: as threads of this process (tests, examples), as forked processes that
/// meet through the store the environment names (RANK, WORLD_SIZE, AUTOSHARD_STORE: a
/// FileStore directory, or tcp://HOST:PORT for a TCP store hosted by rank 0), or as the
/// processes a cluster launcher started (torchrun, srun, mpirun: connect_from_env).
///   autoshard::run_ranks(8, [](autoshard::gloo_communicator& c) { c.barrier(); });
///   int failed = autoshard::spawn_ranks(4, [](int rank) { auto c = autoshard::connect_from_env(); ...; return 0; });
///   // on each of two machines, 4 ranks each, meeting at node0:29500:
///   autoshard::spawn_ranks(4, fn, {.store = "tcp://node0:29500", .world_size = 8, .first_rank = 4 * machine});
#include <netinet/in.h>  // sockaddr_in
#include <sys/socket.h>  // socket, bind, getsockname
#include <sys/types.h>  // pid_t
#include <sys/wait.h>   // waitpid
#include <unistd.h>     // fork, _exit, gethostname

#include <chrono>       // std::chrono
#include <condition_variable>  // std::condition_variable
#include <csignal>      // kill, SIGKILL
#include <cstring>      // strsignal
#include <cstdio>       // std::fprintf
#include <cstdlib>      // mkdtemp, setenv
#include <exception>    // std::exception_ptr
#include <filesystem>   // std::filesystem
#include <functional>   // std::function
#include <mutex>        // std::mutex
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <thread>       // std::thread
#include <type_traits>  // std::is_invocable_v
#include <vector>       // std::vector

#include "../comm/launch_env.hpp"  // launch_env, read_launch_env
#include "../core/error.hpp"        // comm_error
#include "communicator.hpp"         // gloo_communicator, gloo_store, gloo_options
#include "tcp_store.hpp"            // tcp_store, parse_tcp_store_url

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

/// The most ranks run_ranks starts as threads of one process (each rank is two threads,
/// its own and its TCP device's, and holds a socket to every peer).
inline constexpr int max_rank_threads = 1024;

/// Runs `fn` on n ranks, each a thread with its own TCP device, connected through one
/// in-process store. `fn` takes either (gloo_communicator&) — connected before the call —
/// or (int rank, const gloo_store&, const gloo_options&) to connect itself (or not: a
/// rank that never joins). Joins every thread, then returns each rank's exception.
/// Every thread is created before any rank starts: when one cannot be created (a thread
/// or address-space limit), the ones already created are told to stop, joined, and
/// comm_error says how many ranks could start; n above max_rank_threads is refused first.
template <class Fn>
rank_results run_ranks_collect(int n, Fn&& fn, const gloo_options& opts = {}) {
  constexpr bool connected = std::is_invocable_v<Fn&, gloo_communicator&>;
  static_assert(connected || std::is_invocable_v<Fn&, int, const gloo_store&, const gloo_options&>,
                "autoshard: run_ranks takes fn(gloo_communicator&) or fn(int rank, const gloo_store&, "
                "const gloo_options&)");
  if (n < 1) throw comm_error("run_ranks needs at least one rank, got " + std::to_string(n));
  if (n > max_rank_threads)
    throw comm_error("run_ranks: " + std::to_string(n) + " ranks as threads of one process is above the limit of " +
                     std::to_string(max_rank_threads) + " (each rank is two threads and a socket per peer)");
  gloo_store store = gloo_store::in_process();
  rank_results results(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  // The start gate: 0 while threads are being created, 1 to run, -1 to stop unstarted.
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  int gate = 0;
  const auto open_gate = [&](int value) {
    {
      std::lock_guard<std::mutex> lock(gate_mu);
      gate = value;
    }
    gate_cv.notify_all();
  };
  try {
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        {
          std::unique_lock<std::mutex> lock(gate_mu);
          gate_cv.wait(lock, [&] { return gate != 0; });
          if (gate < 0) return;
        }
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
  } catch (const std::exception& e) {  // std::system_error (EAGAIN), or bad_alloc
    const std::size_t started = threads.size();
    open_gate(-1);
    for (auto& t : threads) t.join();
    throw comm_error("run_ranks: cannot start the thread of rank " + std::to_string(started) + " of " +
                     std::to_string(n) + " (" + e.what() + "; a thread, process or address-space limit, e.g. ulimit " +
                     "-v or -u); the " + std::to_string(started) + " ranks created were stopped before they ran");
  }
  open_gate(1);
  for (auto& t : threads) t.join();
  return results;
}

/// run_ranks_collect, rethrowing the lowest rank's exception after every thread has ended.
template <class Fn>
void run_ranks(int n, Fn&& fn, const gloo_options& opts = {}) {
  for (auto& e : run_ranks_collect(n, std::forward<Fn>(fn), opts))
    if (e) std::rethrow_exception(e);
}

/// The store a rank meets the others in: `where` is tcp://HOST:PORT (a TCP store; rank 0
/// hosts the server, listening on every interface, and every rank connects to HOST:PORT)
/// or a FileStore directory (optionally written file://DIR). `timeout` bounds every store call.
inline gloo_store open_store(const std::string& where, int rank, std::chrono::milliseconds timeout) {
  if (auto tcp = parse_tcp_store_url(where)) {
    if (tcp->second == 0)
      throw comm_error("store address " + quoted_text(where) +
                       ": every rank needs the real port (0 only works inside spawn_ranks)");
    tcp_store_options o;
    o.timeout = timeout;
    o.is_server = rank == 0;
    return gloo_store::tcp(tcp->first, tcp->second, o);
  }
  const std::string file = "file://";
  return gloo_store::file(where.compare(0, file.size(), file) == 0 ? where.substr(file.size()) : where);
}

/// Where the ranks of a launched run meet (an address for open_store): AUTOSHARD_STORE when
/// set (a FileStore directory, or tcp://HOST:PORT); else the TCP store at MASTER_ADDR, hosted
/// by rank 0, on AUTOSHARD_MASTER_PORT if set, else on MASTER_PORT, or on MASTER_PORT + 1
/// under torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True: torchrun itself serves
/// a PyTorch TCPStore on MASTER_PORT). comm_error naming what is missing or out of range.
inline std::string launch_store_address(const launch_env& env, const env_lookup& get = process_env) {
  if (const char* s = detail::env_value(get, "AUTOSHARD_STORE")) return s;
  if (env.master_addr.empty())
    throw comm_error("environment: MASTER_ADDR is not set: the ranks meet at MASTER_ADDR:MASTER_PORT (a TCP store "
                     "that rank 0 hosts), or in AUTOSHARD_STORE (tcp://HOST:PORT or a shared directory)");
  int port = 0;
  if (const char* p = detail::env_value(get, "AUTOSHARD_MASTER_PORT")) {
    port = detail::env_integer("AUTOSHARD_MASTER_PORT", p, 1, 65535);
  } else {
    if (env.master_port == 0) throw comm_error("environment: MASTER_ADDR is set but MASTER_PORT is not");
    port = env.master_port;
    const char* agent = detail::env_value(get, "TORCHELASTIC_USE_AGENT_STORE");
    if (agent != nullptr && std::string_view(agent) == "True") {
      if (port == 65535)
        throw comm_error("environment: MASTER_PORT=65535 is torchrun's own store, and the port after it (where "
                         "autoshard's store goes) does not exist: set AUTOSHARD_MASTER_PORT");
      ++port;
    }
  }
  return "tcp://" + detail::tcp::host_port(env.master_addr, static_cast<std::uint16_t>(port));
}

namespace detail {
inline bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}
}  // namespace detail

/// Connects rank env.rank of env.world_size through launch_store_address(env). The Gloo
/// device listens on AUTOSHARD_IFACE or GLOO_SOCKET_IFNAME (an interface, as PyTorch's
/// Gloo backend reads it) or AUTOSHARD_HOSTNAME when set; else on this machine's host name
/// when MASTER_ADDR is another machine, on 127.0.0.1 when it is this one.
/// AUTOSHARD_TIMEOUT_MS sets the timeout of connecting and of every operation (and of
/// the store). Rank 0's communicator (and every one split from it) keeps the TCP store's
/// server alive: end with a collective (a barrier) before rank 0 lets it go.
inline gloo_communicator connect_launch(const launch_env& env, gloo_options opts = {},
                                        const env_lookup& get = process_env) {
  if (const char* h = detail::env_value(get, "AUTOSHARD_HOSTNAME")) {
    opts.hostname = h;
  } else if (!env.master_addr.empty() && !detail::is_loopback(env.master_addr)) {
    char name[256] = {};
    if (gethostname(name, sizeof name - 1) == 0 && name[0] != '\0') opts.hostname = name;
  }
  if (const char* i = detail::env_value(get, "GLOO_SOCKET_IFNAME")) opts.iface = i;
  if (const char* i = detail::env_value(get, "AUTOSHARD_IFACE")) opts.iface = i;
  if (const char* t = detail::env_value(get, "AUTOSHARD_TIMEOUT_MS"))
    opts.timeout = std::chrono::milliseconds(detail::env_integer("AUTOSHARD_TIMEOUT_MS", t, 1, 86400000));
  const std::string where = launch_store_address(env, get);
  return gloo_communicator::connect(open_store(where, env.rank, opts.timeout), env.rank, env.world_size, opts);
}

/// Connects to the world the environment describes (read_launch_env: torchrun's RANK and
/// WORLD_SIZE, Slurm's or Open MPI's equivalents; then connect_launch). What spawn_ranks
/// sets (RANK, WORLD_SIZE, AUTOSHARD_STORE), and what torchrun, srun or mpirun set with
/// MASTER_ADDR and MASTER_PORT.
inline gloo_communicator connect_from_env(gloo_options opts = {}, const env_lookup& get = process_env) {
  return connect_launch(read_launch_env(get), std::move(opts), get);
}

/// How spawn_ranks starts its ranks.
struct spawn_options {
  /// Where the ranks meet (AUTOSHARD_STORE of every child): empty = a fresh FileStore
  /// directory for this call (one machine); "tcp://HOST:PORT" = the TCP store at HOST:PORT,
  /// hosted by rank 0 (give every machine the same address; port 0 = a free port, when
  /// every rank runs here); anything else = a FileStore directory every rank can see.
  std::string store;
  int world_size = 0;  ///< ranks in the whole run; 0 = n (every rank runs here)
  int first_rank = 0;  ///< this machine runs ranks first_rank .. first_rank + n - 1
  /// Ranks still running after this are killed (and counted as failed).
  std::chrono::milliseconds limit = std::chrono::minutes(10);
};

namespace detail {
// A TCP port nobody listens on right now (bound to port 0, read, released). Another program
// may take it before rank 0 binds it; then rank 0 fails with a clear comm_error.
inline std::uint16_t free_tcp_port() {
  tcp::fd_handle s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (!s || ::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw comm_error("spawn_ranks: cannot find a free TCP port: " + tcp::errno_text(errno));
  return ntohs(a.sin_port);
}
}  // namespace detail

/// Forks n processes; child i runs rank r = o.first_rank + i with RANK=r, WORLD_SIZE and
/// AUTOSHARD_STORE (see spawn_options::store) in its environment, runs fn(r) and exits with
/// its result (1 if it throws). Waits for all, killing any still running after o.limit.
/// Returns the number of ranks here that failed (non-zero exit, a signal, or killed). Call
/// it before this process starts threads.
inline int spawn_ranks(int n, const std::function<int(int rank)>& fn, const spawn_options& o) {
  if (n < 1) throw comm_error("spawn_ranks needs at least one rank, got " + std::to_string(n));
  const int world = o.world_size == 0 ? n : o.world_size;
  if (o.first_rank < 0 || world < 1 || o.first_rank + n > world)
    throw comm_error("spawn_ranks: ranks " + std::to_string(o.first_rank) + ".." +
                     std::to_string(o.first_rank + n - 1) + " do not fit in a world of " + std::to_string(world));
  const bool all_here = o.first_rank == 0 && world == n;
  std::optional<temp_dir> dir;
  std::string store = o.store;
  if (store.empty()) {
    if (!all_here)
      throw comm_error("spawn_ranks: ranks on several machines need a store they all reach: tcp://HOST:PORT, or a "
                       "shared directory");
    dir.emplace("autoshard-store");
    store = dir->path();
  } else if (auto tcp = parse_tcp_store_url(store); tcp && tcp->second == 0) {
    if (!all_here) throw comm_error("spawn_ranks: store " + quoted_text(store) + ": port 0 only works when every rank runs here");
    store = "tcp://" + detail::tcp::host_port(tcp->first, detail::free_tcp_port());
  }
  std::vector<pid_t> pids;
  std::fflush(nullptr);  // or each child writes out a copy of what this process has buffered
  for (int i = 0; i < n; ++i) {
    const int r = o.first_rank + i;
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
        setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
        setenv("AUTOSHARD_STORE", store.c_str(), 1);
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
  const auto deadline = std::chrono::steady_clock::now() + o.limit;
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
      if (got > 0 && WIFSIGNALED(status))
        std::fprintf(stderr, "autoshard: rank %d was killed by signal %d (%s)\n", o.first_rank + static_cast<int>(i),
                     WTERMSIG(status), strsignal(WTERMSIG(status)));
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

/// spawn_ranks with every rank here, meeting in a fresh FileStore directory.
inline int spawn_ranks(int n, const std::function<int(int rank)>& fn,
                       std::chrono::milliseconds limit = std::chrono::minutes(10)) {
  spawn_options o;
  o.limit = limit;
  return spawn_ranks(n, fn, o);
}

}  // namespace autoshard

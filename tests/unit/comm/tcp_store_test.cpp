// The TCP rendezvous store (gloo/tcp_store.hpp) and the launcher's tcp:// path: set / get /
// wait across threads and processes, 8 processes that meet over TCP and all-reduce, and the
// faults docs/reliability.md lists: a key that never appears, a server that is killed, a
// client that sends junk, a server that answers junk, a port already in use.
#include <autoshard/gloo/gloo.hpp>
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

using namespace autoshard;
using namespace std::chrono_literals;

namespace {

using steady = std::chrono::steady_clock;

std::size_t tcp_live_threads() {
  // TSan starts a helper thread with a process's first thread: let that happen before counting.
  static const bool warmed = (std::thread([] {}).join(), true);
  (void)warmed;
  std::size_t n = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

doctest::Contains contains(const std::string& s) { return doctest::Contains(s.c_str()); }
std::vector<char> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string text_of(const std::vector<char>& v) { return {v.begin(), v.end()}; }

tcp_store_options server_opts(std::chrono::milliseconds t = 5000ms) {
  tcp_store_options o;
  o.timeout = t;
  o.is_server = true;
  return o;
}
tcp_store_options client_opts(std::chrono::milliseconds t = 5000ms) {
  tcp_store_options o;
  o.timeout = t;
  return o;
}

// A plain blocking TCP connection to 127.0.0.1:port, for speaking junk to a server.
detail::tcp::fd_handle raw_connect(std::uint16_t port) {
  detail::tcp::fd_handle s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(s);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return s;
}
void raw_send(int fd, const std::string& b) {
  REQUIRE(::send(fd, b.data(), b.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(b.size()));
}
// Whether the peer closes the connection within `t` (reading and dropping anything it sends).
bool closed_by_peer(int fd, std::chrono::milliseconds t) {
  const auto end = steady::now() + t;
  char buf[256];
  while (steady::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t k = ::recv(fd, buf, sizeof buf, 0);
    if (k <= 0) return true;
  }
  return false;
}

// A fake store server on 127.0.0.1: serves connections one after another; connection i
// answers its j-th request with replies[i][j] (the bytes as given; "hang" = nothing, and
// the connection stays open for two seconds), then it is closed. For clients fed junk replies.
class fake_server {
 public:
  explicit fake_server(std::vector<std::vector<std::string>> replies) {
    listener_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(listener_);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listener_.get(), 8) == 0);
    REQUIRE(::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, replies = std::move(replies)] {
      for (const auto& conn : replies) {
        pollfd p{listener_.get(), POLLIN, 0};
        if (::poll(&p, 1, 5000) <= 0) return;
        detail::tcp::fd_handle c(::accept(listener_.get(), nullptr, nullptr));
        if (!c) return;
        for (const auto& r : conn) {
          char buf[4096];
          pollfd q{c.get(), POLLIN, 0};
          if (::poll(&q, 1, 5000) <= 0 || ::recv(c.get(), buf, sizeof buf, 0) <= 0) break;
          if (r == "hang") {
            std::this_thread::sleep_for(2000ms);
            break;
          }
          (void)::send(c.get(), r.data(), r.size(), MSG_NOSIGNAL);
        }
      }
    });
  }
  ~fake_server() { thread_.join(); }
  std::uint16_t port() const { return port_; }

 private:
  detail::tcp::fd_handle listener_;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

// Rank r's value of element i: says which rank and which element it came from.
std::int64_t label(int r, std::size_t i) { return static_cast<std::int64_t>(r) * 1000 + static_cast<std::int64_t>(i); }

// What every spawned rank runs: connect through the environment's store, all-reduce
// labelled values, check the sum. 0 when right.
int allreduce_rank(int rank, int world) {
  gloo_options o;
  o.timeout = 10000ms;
  gloo_communicator c = connect_from_env(o);
  if (c.rank() != rank || c.size() != world) return 2;
  constexpr std::size_t len = 33;
  std::vector<std::int64_t> v(len);
  for (std::size_t i = 0; i < len; ++i) v[i] = label(rank, i);
  all_reduce(c, std::span<std::int64_t>(v));
  for (std::size_t i = 0; i < len; ++i) {
    std::int64_t want = 0;
    for (int r = 0; r < world; ++r) want += label(r, i);
    if (v[i] != want) return 3;
  }
  c.barrier();  // rank 0 hosts the store: nobody may still need it when it leaves
  return 0;
}

}  // namespace

TEST_CASE("tcp store: set, get and wait across threads, and the server thread ends with the store") {
  const std::size_t threads_before = tcp_live_threads();
  {
    tcp_store server("127.0.0.1", 0, server_opts());
    REQUIRE(server.is_server());
    const std::uint16_t port = server.port();
    REQUIRE(port != 0);
    CHECK(server.address() == "127.0.0.1:" + std::to_string(port));
    server.set("from/server", bytes_of("hello"));  // the server's own object is a client too

    constexpr int n = 4;
    std::atomic<int> bad{0};
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        try {
          tcp_store c("127.0.0.1", port, client_opts());
          c.set("rank/" + std::to_string(r), bytes_of("value of rank " + std::to_string(r)));
          std::vector<std::string> keys;
          for (int q = 0; q < n; ++q) keys.push_back("rank/" + std::to_string(q));
          c.wait(keys);
          for (int q = 0; q < n; ++q)
            if (text_of(c.get(keys[static_cast<std::size_t>(q)])) != "value of rank " + std::to_string(q)) ++bad;
          if (text_of(c.get("from/server")) != "hello") ++bad;
          if (text_of(c.get("late")) != "set after 100 ms") ++bad;  // get waits for it
        } catch (const std::exception& e) {
          MESSAGE(e.what());
          ++bad;
        }
      });
    std::this_thread::sleep_for(100ms);
    server.set("late", bytes_of("set after 100 ms"));
    for (auto& t : ts) t.join();
    CHECK(bad == 0);

    // Binary values, an empty one, a 3 MiB one, and overwriting.
    tcp_store c("localhost", port, client_opts());
    std::vector<char> big(3u << 20);
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 % 251);
    c.set("big", big);
    c.set("empty", {});
    c.set("zeros", std::vector<char>{'\0', 'a', '\0'});
    CHECK(server.get("big") == big);
    CHECK(server.get("empty").empty());
    CHECK(server.get("zeros") == std::vector<char>{'\0', 'a', '\0'});
    c.set("zeros", bytes_of("over"));
    CHECK(text_of(server.get("zeros")) == "over");
    CHECK(c.check({"big", "empty"}));
    CHECK(!c.check({"big", "nope"}));
  }
  CHECK(tcp_live_threads() == threads_before);  // the server thread was joined
}

TEST_CASE("tcp store: set, get and wait across processes (spawn_ranks with tcp://)") {
  spawn_options o;
  o.store = "tcp://127.0.0.1:0";  // spawn_ranks picks a free port; rank 0 hosts the server
  o.limit = 30s;
  const int failed = spawn_ranks(
      4,
      [](int rank) {
        const char* where = std::getenv("AUTOSHARD_STORE");
        if (where == nullptr || std::string(where).rfind("tcp://127.0.0.1:", 0) != 0) return 2;
        gloo_store s = open_store(where, rank, 5000ms);
        s.get().set("p/" + std::to_string(rank), bytes_of("process " + std::to_string(rank)));
        std::vector<std::string> keys;
        for (int q = 0; q < 4; ++q) keys.push_back("p/" + std::to_string(q));
        s.get().wait(keys, 5000ms);
        for (int q = 0; q < 4; ++q)
          if (text_of(s.get().get(keys[static_cast<std::size_t>(q)])) != "process " + std::to_string(q)) return 3;
        s.get().set("done/" + std::to_string(rank), {});
        if (rank == 0) s.get().wait({"done/1", "done/2", "done/3"}, 5000ms);  // the host leaves last
        return 0;
      },
      o);
  CHECK(failed == 0);
}

TEST_CASE("tcp store: 8 processes rendezvous over TCP and all-reduce labelled values") {
  spawn_options o;
  o.store = "tcp://127.0.0.1:0";
  o.limit = 60s;
  const auto start = steady::now();
  CHECK(spawn_ranks(8, [](int rank) { return allreduce_rank(rank, 8); }, o) == 0);
  CHECK(steady::now() - start < 30s);
}

TEST_CASE("tcp store: two launchers, as on two machines, each start half the ranks at one address") {
  const std::string addr = "tcp://127.0.0.1:" + std::to_string(detail::free_tcp_port());
  auto launch = [&](int first) {
    spawn_options o;
    o.store = addr;  // the same address on every "machine"
    o.world_size = 4;
    o.first_rank = first;
    o.limit = 30s;
    return spawn_ranks(2, [](int rank) { return allreduce_rank(rank, 4); }, o);
  };
  const pid_t other = ::fork();
  REQUIRE(other >= 0);
  if (other == 0) {
    int code = 1;
    try {
      code = launch(2);  // the second "machine": ranks 2 and 3
    } catch (...) {
    }
    ::_exit(code);
  }
  CHECK(launch(0) == 0);  // this "machine": ranks 0 (the store's host) and 1
  int status = 0;
  REQUIRE(::waitpid(other, &status, 0) == other);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("tcp store: spawn_ranks checks its rank range and that several machines share a store") {
  auto noop = [](int) { return 0; };
  spawn_options o;
  o.world_size = 4;
  CHECK_THROWS_WITH_AS(spawn_ranks(2, noop, o), doctest::Contains("need a store they all reach"), comm_error);
  o.store = "tcp://127.0.0.1:0";
  CHECK_THROWS_WITH_AS(spawn_ranks(2, noop, o), doctest::Contains("port 0 only works when every rank runs here"),
                       comm_error);
  o.first_rank = 3;
  CHECK_THROWS_WITH_AS(spawn_ranks(2, noop, o), doctest::Contains("do not fit in a world of 4"), comm_error);
}

TEST_CASE("tcp store: tcp:// addresses parse, and malformed ones are comm_error") {
  CHECK(!parse_tcp_store_url("/tmp/store").has_value());
  CHECK(*parse_tcp_store_url("tcp://node0:29500") == std::make_pair(std::string("node0"), std::uint16_t{29500}));
  CHECK(*parse_tcp_store_url("tcp://[::1]:7") == std::make_pair(std::string("::1"), std::uint16_t{7}));
  for (const char* bad : {"tcp://node0", "tcp://:80", "tcp://h:", "tcp://h:x1", "tcp://h:70000", "tcp://::1:80",
                          "tcp://[::1]80"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(parse_tcp_store_url(bad), doctest::Contains("is not tcp://HOST:PORT"), comm_error);
  }
  CHECK_THROWS_WITH_AS(open_store("tcp://h:0", 1, 100ms), doctest::Contains("needs the real port"), comm_error);
  CHECK_THROWS_WITH_AS(tcp_store("127.0.0.1", 0, client_opts()), doctest::Contains("needs the server's port"),
                       comm_error);
}

TEST_CASE("tcp store: a host, an address or a key with control characters is escaped in messages, never raw") {
  const std::string hostile = "a\x1B[31mb\nc";
  const auto message = [](auto&& f) {
    try {
      f();
    } catch (const comm_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // The host is refused before any connection: every later message of the store names it.
  const std::string host = message([&] { tcp_store s(hostile, 1, client_opts()); });
  CHECK(host.find("the server's host name 'a\\x1B[31mb\\x0Ac' holds a control character") != std::string::npos);
  const std::string url = message([&] { (void)parse_tcp_store_url("tcp://h:1" + hostile); });
  CHECK(url.find("store address 'tcp://h:1a\\x1B[31mb\\x0Ac' is not tcp://HOST:PORT: port '1a\\x1B[31mb\\x0Ac' is not a number") !=
        std::string::npos);
  // Keys: a peer's server sends back the missing ones.
  CHECK(detail::tcp::key_list({"ok", hostile}) == "'ok', 'a\\x1B[31mb\\x0Ac'");
  for (const std::string& m : {host, url}) CHECK(m.find_first_of("\x1B\n") == std::string::npos);
}

TEST_CASE("tcp store: a host name longer than a resolver looks up is refused, quoted cut, before anything else") {
  // AUTOSHARD_STORE=tcp://<100 KB>:1 was carried whole into every message about the store (200 KB).
  const std::string host(100000, 'a');
  std::string m;
  try {
    tcp_store s(host, 1, client_opts());
  } catch (const comm_error& e) {
    m = e.what();
  }
  CHECK(m == "comm error: tcp store: the server's host name '" + std::string(80, 'a') +
                 "...' (100000 bytes) is longer than a host name may be (253 bytes, RFC 1035)");
  CHECK_THROWS_WITH_AS(open_store("tcp://" + host + ":1", 1, 100ms), doctest::Contains("(100000 bytes) is longer than"), comm_error);
}

TEST_CASE("a file store that is not a directory is refused when it is opened, not blamed on the peers") {
  // Gloo opened a regular file as a FileStore and failed at the first write: each rank then
  // said its peers "did not join within 30000 ms".
  const std::filesystem::path f = std::filesystem::temp_directory_path() / ("autoshard-store-file-" + std::to_string(::getpid()));
  { std::ofstream(f) << "not a directory"; }
  std::string m;
  try {
    (void)open_store(f.string(), 0, 100ms);
  } catch (const comm_error& e) {
    m = e.what();
  }
  std::filesystem::remove(f);
  CHECK(m == "comm error: cannot open the file store '" + f.string() +
                 "': it is not a directory (a file store is a directory every rank of the run shares)");
}

TEST_CASE("tcp store: a key that never appears is a comm_error within the timeout, naming the key") {
  tcp_store server("127.0.0.1", 0, server_opts(300ms));
  const std::string where = "127.0.0.1:" + std::to_string(server.port());
  tcp_store c("127.0.0.1", server.port(), client_opts(300ms));
  c.set("here", bytes_of("x"));
  auto start = steady::now();
  CHECK_THROWS_WITH_AS(c.wait({"here", "never/set"}),
                       contains("tcp store " + where + ": wait for key(s) 'here', 'never/set' timed out after"),
                       comm_error);
  CHECK(steady::now() - start < 3s);
  try {
    c.get("never/set");
    FAIL("no error");
  } catch (const comm_error& e) {
    const std::string m = e.what();
    CAPTURE(m);
    CHECK(m.find(where) != std::string::npos);
    CHECK(m.find("still missing: 'never/set'") != std::string::npos);
    CHECK(m.find("(timeout 0.30 s)") != std::string::npos);
  }
  start = steady::now();
  CHECK_THROWS_WITH_AS(c.wait({"other"}, 150ms), doctest::Contains("(timeout 0.15 s)"), comm_error);
  CHECK(steady::now() - start < 2s);
  CHECK(text_of(c.get("here")) == "x");  // the connection is still good after a timed-out wait

  // A client whose server never comes: comm_error after its timeout, naming the address.
  const std::uint16_t nobody = detail::free_tcp_port();
  tcp_store lonely("127.0.0.1", nobody, client_opts(300ms));
  start = steady::now();
  CHECK_THROWS_WITH_AS(lonely.set("k", {}), contains("tcp store 127.0.0.1:" + std::to_string(nobody) +
                                                              ": set of key 'k': cannot connect to the server within"),
                       comm_error);
  CHECK(steady::now() - start < 3s);
}

TEST_CASE("tcp store: a Gloo rank that never joins through a TCP store is named, within the timeout") {
  tcp_store server("127.0.0.1", 0, server_opts());
  const std::uint16_t port = server.port();
  gloo_options o;
  o.timeout = 1000ms;
  const std::size_t threads_before = tcp_live_threads();
  const auto start = steady::now();
  std::vector<std::string> errors(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)  // ranks 0 and 1 of 3; rank 2 never comes
    ts.emplace_back([&, r] {
      try {
        gloo_communicator::connect(gloo_store::tcp("127.0.0.1", port, client_opts(1000ms)), r, 3, o);
      } catch (const comm_error& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  CHECK(steady::now() - start < 5s);
  for (int r = 0; r < 2; ++r) {
    const std::string& m = errors[static_cast<std::size_t>(r)];
    CAPTURE(m);
    CHECK(m.find("rank " + std::to_string(r) + ": connecting 3 ranks through the tcp store 127.0.0.1:" +
                 std::to_string(port)) != std::string::npos);
    CHECK(m.find("rank(s) [2] did not join") != std::string::npos);
  }
  CHECK(tcp_live_threads() == threads_before);
}

TEST_CASE("tcp store: a server that is killed makes its clients fail with comm_error within their timeout") {
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // the server process: host the store, report the port, wait to be killed
    ::close(pipefd[0]);
    try {
      tcp_store s("127.0.0.1", 0, server_opts());
      const std::uint16_t port = s.port();
      (void)!::write(pipefd[1], &port, sizeof port);
      for (;;) ::pause();
    } catch (...) {
    }
    ::_exit(1);
  }
  ::close(pipefd[1]);
  std::uint16_t port = 0;
  REQUIRE(::read(pipefd[0], &port, sizeof port) == static_cast<ssize_t>(sizeof port));
  ::close(pipefd[0]);
  tcp_store c("127.0.0.1", port, client_opts(1500ms));
  c.set("a", bytes_of("1"));
  std::thread killer([pid] {
    std::this_thread::sleep_for(200ms);
    ::kill(pid, SIGKILL);
  });
  const auto start = steady::now();
  std::string m;
  try {
    c.wait({"never"}, 4000ms);  // in progress when the server dies
  } catch (const comm_error& e) {
    m = e.what();
  }
  const auto took = steady::now() - start;
  killer.join();
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CAPTURE(m);
  CHECK(took < 3s);  // at once, not after the wait's 4 s
  CHECK(m.find("tcp store 127.0.0.1:" + std::to_string(port) + ": wait for key(s) 'never'") != std::string::npos);
  CHECK(m.find("the server closed the connection before answering (did it die?)") != std::string::npos);
  // The next call tries to reconnect and gives up after the store's 1.5 s timeout.
  const auto again = steady::now();
  CHECK_THROWS_WITH_AS(c.get("a"), doctest::Contains("cannot connect to the server"), comm_error);
  CHECK(steady::now() - again < 4s);
}

TEST_CASE("tcp store: a client sending junk is dropped while the server and other clients carry on") {
  const std::size_t threads_before = tcp_live_threads();
  {
    tcp_store server("127.0.0.1", 0, server_opts());
    const std::uint16_t port = server.port();
    tcp_store good("127.0.0.1", port, client_opts());
    good.set("before", bytes_of("1"));
    auto idle = raw_connect(port);  // connected, says nothing: must not block anyone

    auto le32 = [](std::uint32_t v) { std::string s; detail::tcp::put_u32(s, v); return s; };
    auto le64 = [](std::uint64_t v) { std::string s; detail::tcp::put_u64(s, v); return s; };
    const std::vector<std::string> junk = {
        std::string("\xff\xfe garbage \x00\x01", 14),                 // unknown request type
        std::string("\x01", 1) + le32(0xFFFFFFFFu),                   // set with a 4 GiB key
        std::string("\x01", 1) + le32(1) + "k" + le64(1ull << 40),    // set with a 1 TiB value
        std::string("\x03", 1) + le64(10) + le32(1u << 30),           // wait for 2^30 keys
        std::string("\x04", 1) + le32(2) + le32(1) + "a" + le32(70000),  // check, second key too long
    };
    for (const auto& j : junk) {
      CAPTURE(j.size());
      auto s = raw_connect(port);
      raw_send(s.get(), j);
      CHECK(closed_by_peer(s.get(), 3000ms));  // the server hangs up on it
      CHECK(text_of(good.get("before")) == "1");
    }
    {
      // A truncated request, then the peer goes away: nothing is set.
      auto s = raw_connect(port);
      raw_send(s.get(), std::string("\x01", 1) + le32(3) + "tru" + le64(100) + "only a part");
    }
    {
      // A valid request from a raw client works: the protocol is what the header says.
      auto s = raw_connect(port);
      raw_send(s.get(), std::string("\x01", 1) + le32(3) + "raw" + le64(2) + "ok");
      char st = 9;
      pollfd p{s.get(), POLLIN, 0};
      REQUIRE(::poll(&p, 1, 3000) == 1);
      REQUIRE(::recv(s.get(), &st, 1, 0) == 1);
      CHECK(st == 0);
    }
    good.set("after", bytes_of("2"));
    CHECK(text_of(server.get("after")) == "2");
    CHECK(text_of(good.get("raw")) == "ok");
    CHECK(!good.check({"tru"}));
  }
  CHECK(tcp_live_threads() == threads_before);
}

TEST_CASE("tcp store: a server that answers junk, hangs up mid-reply or hangs gives comm_error, not a crash") {
  auto le32 = [](std::uint32_t v) { std::string s; detail::tcp::put_u32(s, v); return s; };
  auto le64 = [](std::uint64_t v) { std::string s; detail::tcp::put_u64(s, v); return s; };
  const std::string ok("\x00", 1), missing("\x01", 1);
  fake_server fake({
      {std::string("\x07", 1)},                  // set: an unknown status
      {missing + le32(0)},                        // wait: "missing", but no key
      {missing + le32(1) + le32(1u << 20)},       // wait: a 1 MiB missing key
      {ok, ok + le64(10) + "abc"},                // get (a wait, then a get): the value cut short
      {ok, ok + le64(1ull << 40)},                // get: a 1 TiB value
      {"hang"},                                   // set: no answer at all
  });
  tcp_store c("127.0.0.1", fake.port(), client_opts(2000ms));
  const std::string where = "tcp store 127.0.0.1:" + std::to_string(fake.port());
  try {
    c.set("k", bytes_of("v"));
    FAIL("no error");
  } catch (const comm_error& e) {
    const std::string m = e.what();
    CAPTURE(m);
    CHECK(m.find(where + ": set of key 'k' failed after") != std::string::npos);
    CHECK(m.find("malformed reply: status byte 7") != std::string::npos);
  }
  CHECK_THROWS_WITH_AS(c.wait({"k"}), doctest::Contains("malformed reply: 0 missing keys"), comm_error);
  CHECK_THROWS_WITH_AS(c.wait({"k"}), doctest::Contains("malformed reply: a key of 1048576 bytes"), comm_error);
  CHECK_THROWS_WITH_AS(c.get("k"), doctest::Contains("closed the connection mid-reply"), comm_error);
  CHECK_THROWS_WITH_AS(c.get("k"), doctest::Contains("malformed reply: a value of 1099511627776 bytes"), comm_error);
  tcp_store quick("127.0.0.1", fake.port(), client_opts(300ms));
  const auto start = steady::now();
  CHECK_THROWS_WITH_AS(quick.set("k", {}), doctest::Contains("no answer from the server"), comm_error);
  CHECK(steady::now() - start < 1500ms);  // the store's timeout, not the fake's 2 s
}

TEST_CASE("tcp store: a port already in use is a clear comm_error") {
  tcp_store first("127.0.0.1", 0, server_opts());
  const std::string port = std::to_string(first.port());
  try {
    tcp_store second("127.0.0.1", first.port(), server_opts());
    FAIL("the second server started");
  } catch (const comm_error& e) {
    const std::string m = e.what();
    CAPTURE(m);
    CHECK(m.find("tcp store server: cannot bind") != std::string::npos);
    CHECK(m.find("port " + port + " is in use") != std::string::npos);
  }
  tcp_store_options o = server_opts();
  o.listen_host = "127.0.0.1";
  CHECK_THROWS_WITH_AS(tcp_store("127.0.0.1", first.port(), o), contains("127.0.0.1:" + port + "): "),
                       comm_error);
  // The first server is unharmed.
  first.set("k", bytes_of("v"));
  CHECK(text_of(first.get("k")) == "v");
}

#pragma once
/// The TCP store's implementation (gloo/tcp_store.hpp declares it). By default
/// tcp_store.hpp includes this file and every function here is inline, as in any header;
/// a program that defines AUTOSHARD_TCP_STORE_SEPARATE for all its translation units
/// includes it in exactly one of them instead, which then compiles the store once
/// (the autoshard tool does: tools/autoshard/tcp_store.cpp).
#include <arpa/inet.h>    // inet_ntop
#include <fcntl.h>        // O_CLOEXEC, O_NONBLOCK
#include <netdb.h>        // getaddrinfo
#include <netinet/in.h>   // sockaddr_in, sockaddr_in6
#include <netinet/tcp.h>  // TCP_NODELAY
#include <poll.h>         // poll
#include <sys/socket.h>   // socket, bind, listen, accept4, connect, send, recv
#include <unistd.h>       // close, pipe2, read, write

#include <algorithm>  // std::min, std::max, std::clamp
#include <cerrno>     // errno
#include <cstdio>     // std::snprintf
#include <exception>  // std::exception
#include <map>        // std::map
#include <thread>     // std::thread

#include "tcp_store.hpp"

#if defined(AUTOSHARD_TCP_STORE_SEPARATE)
#define AUTOSHARD_TCP_INLINE
#else
#define AUTOSHARD_TCP_INLINE inline
#endif

namespace autoshard {

namespace detail::tcp {

inline constexpr std::uint64_t max_value_bytes = std::uint64_t{1} << 30;  // 1 GiB
inline constexpr std::uint32_t max_key_bytes = std::uint32_t{1} << 16;    // 64 KiB
inline constexpr std::uint32_t max_keys = std::uint32_t{1} << 16;         // per wait / check

enum : std::uint8_t { op_set = 1, op_get = 2, op_wait = 3, op_check = 4 };
enum : std::uint8_t { status_ok = 0, status_missing = 1 };

using clock = std::chrono::steady_clock;

AUTOSHARD_TCP_INLINE std::string seconds(std::chrono::nanoseconds d) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", std::chrono::duration<double>(d).count());
  return std::string(b) + " s";
}

/// "'a'", "'a', 'b'", "'a', 'b', ... (7 keys)": how messages name keys, each as quoted_text
/// quotes it (a key the server sends back is a peer's bytes).
AUTOSHARD_TCP_INLINE std::string key_list(const std::vector<std::string>& keys) {
  std::string s;
  for (std::size_t i = 0; i < keys.size() && i < 4; ++i) s += (i ? ", " : "") + quoted_text(keys[i]);
  if (keys.size() > 4) s += ", ... (" + std::to_string(keys.size()) + " keys)";
  return s.empty() ? "(no key)" : s;
}

/// Whether quoted_text would print `host` as it is: valid UTF-8 with no control character. No
/// host name that resolves is otherwise, and every message of a store names its host raw
/// (address()), so a store refuses another at once.
AUTOSHARD_TCP_INLINE bool plain_host(std::string_view host) {
  for (std::size_t i = 0; i < host.size();) {
    const std::size_t n = utf8_char_length(host, i);
    const auto c = static_cast<unsigned char>(host[i]);
    if (n == 0 || (n == 1 && (c < 0x20 || c == 0x7F))) return false;
    i += n;
  }
  return true;
}

AUTOSHARD_TCP_INLINE void set_nodelay(int fd) {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/// Milliseconds left until `deadline`, rounded up, at least 0 (for poll).
AUTOSHARD_TCP_INLINE int ms_left(clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

// ---- encoding: little-endian integers, length-prefixed strings ----
AUTOSHARD_TCP_INLINE void put_u8(std::string& b, std::uint8_t v) { b.push_back(static_cast<char>(v)); }
AUTOSHARD_TCP_INLINE void put_u32(std::string& b, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
AUTOSHARD_TCP_INLINE void put_u64(std::string& b, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
AUTOSHARD_TCP_INLINE void put_key(std::string& b, const std::string& k) {
  put_u32(b, static_cast<std::uint32_t>(k.size()));
  b += k;
}
AUTOSHARD_TCP_INLINE void put_keys(std::string& b, const std::vector<std::string>& keys) {
  put_u32(b, static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) put_key(b, k);
}
AUTOSHARD_TCP_INLINE std::uint64_t get_le(const char* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

/// Reads a request out of a buffer that may hold only part of it: each read returns
/// false while the bytes are not there yet; a size above its cap sets `bad`.
struct reader {
  const std::string& buf;
  std::size_t at = 0;
  std::string bad;  // why the message is malformed; empty while it is fine

  bool u8(std::uint8_t& v) {
    if (buf.size() - at < 1) return false;
    v = static_cast<std::uint8_t>(buf[at++]);
    return true;
  }
  bool u32(std::uint32_t& v) {
    if (buf.size() - at < 4) return false;
    v = static_cast<std::uint32_t>(get_le(buf.data() + at, 4));
    at += 4;
    return true;
  }
  bool u64(std::uint64_t& v) {
    if (buf.size() - at < 8) return false;
    v = get_le(buf.data() + at, 8);
    at += 8;
    return true;
  }
  bool key(std::string& k) {
    std::uint32_t n = 0;
    const std::size_t start = at;
    if (!u32(n)) return false;
    if (n > max_key_bytes) {
      bad = "a key of " + std::to_string(n) + " bytes (at most " + std::to_string(max_key_bytes) + ")";
      return false;
    }
    if (buf.size() - at < n) {
      at = start;
      return false;
    }
    k.assign(buf, at, n);
    at += n;
    return true;
  }
  bool keys(std::vector<std::string>& ks) {
    std::uint32_t n = 0;
    if (!u32(n)) return false;
    if (n > max_keys) {
      bad = std::to_string(n) + " keys in one request (at most " + std::to_string(max_keys) + ")";
      return false;
    }
    ks.clear();
    for (std::uint32_t i = 0; i < n; ++i) {
      ks.emplace_back();
      if (!key(ks.back())) return false;
    }
    return true;
  }
};

/// One parsed request.
struct request {
  std::uint8_t op = 0;
  std::vector<std::string> keys;
  std::vector<char> value;
  std::uint64_t timeout_ms = 0;
};

/// Parses the request at the front of `buf`: the bytes it took, 0 while incomplete.
/// A malformed request (unknown op, a size above its cap) sets `bad`.
AUTOSHARD_TCP_INLINE std::size_t parse_request(const std::string& buf, request& rq, std::string& bad) {
  reader r{buf, 0, {}};
  if (!r.u8(rq.op)) return 0;
  rq.keys.clear();
  switch (rq.op) {
    case op_set: {
      rq.keys.emplace_back();
      std::uint64_t n = 0;
      if (!r.key(rq.keys.back()) || !r.u64(n)) break;
      if (n > max_value_bytes) {
        r.bad = "a value of " + std::to_string(n) + " bytes (at most " + std::to_string(max_value_bytes) + ")";
        break;
      }
      if (buf.size() - r.at < n) break;
      rq.value.assign(buf.data() + r.at, buf.data() + r.at + n);
      return r.at + n;
    }
    case op_get:
      rq.keys.emplace_back();
      if (r.key(rq.keys.back())) return r.at;
      break;
    case op_wait:
      if (r.u64(rq.timeout_ms) && r.keys(rq.keys)) return r.at;
      break;
    case op_check:
      if (r.keys(rq.keys)) return r.at;
      break;
    default:
      r.bad = "unknown request type " + std::to_string(rq.op);
  }
  bad = r.bad;
  return 0;
}

/// The key/value server: a listening socket and one thread that serves every connection
/// with poll(). Only that thread touches the map. Destruction wakes it, joins it and closes
/// every socket.
class server {
 public:
  server(const std::string& listen_host, std::uint16_t port) {
    std::string err;
    if (listen_host.empty()) {
      // Every interface: IPv6 with IPv4-mapped addresses where the kernel has IPv6, else IPv4.
      int e = listen_any(AF_INET6, port, err);
      if (e != 0 && e != EADDRINUSE && e != EACCES) e = listen_any(AF_INET, port, err);
      if (e != 0) throw comm_error(err);
    } else if (listen_resolved(listen_host, port, err) != 0) {
      throw comm_error(err);
    }
    int p[2];
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0)
      throw comm_error("tcp store server: cannot create a pipe: " + errno_text(errno));
    wake_read_.reset(p[0]);
    wake_write_.reset(p[1]);
    thread_ = std::thread([this] { run(); });
  }
  server(const server&) = delete;
  server& operator=(const server&) = delete;
  ~server() {
    const char c = 'q';
    while (::write(wake_write_.get(), &c, 1) < 0 && errno == EINTR) {
    }
    if (thread_.joinable()) thread_.join();
  }
  std::uint16_t port() const noexcept { return port_; }

 private:
  struct conn {
    fd_handle sock;
    std::string in, out;
    bool waiting = false;
    std::vector<std::string> wait_keys;
    clock::time_point deadline;
    bool closed = false;
  };

  // Each binds and listens; 0, or the errno with `err` set.
  int listen_any(int family, std::uint16_t port, std::string& err) {
    sockaddr_storage ss{};
    socklen_t len = 0;
    if (family == AF_INET6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_port = htons(port);
      a->sin6_addr = in6addr_any;
      len = sizeof(sockaddr_in6);
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_port = htons(port);
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      len = sizeof(sockaddr_in);
    }
    return bind_listen(family, reinterpret_cast<sockaddr*>(&ss), len, "every interface, port " + std::to_string(port),
                       port, err);
  }
  int listen_resolved(const std::string& host, std::uint16_t port, std::string& err) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0) {
      err = "tcp store server: cannot resolve the listen address " + quoted_text(host) + ": " + ::gai_strerror(rc);
      return EINVAL;
    }
    const std::string where = host_port(host, port);
    int e = EINVAL;
    for (addrinfo* a = res; a != nullptr && e != 0; a = a->ai_next)
      e = bind_listen(a->ai_family, a->ai_addr, a->ai_addrlen, where, port, err);
    ::freeaddrinfo(res);
    return e;
  }
  int bind_listen(int family, const sockaddr* addr, socklen_t len, const std::string& where, std::uint16_t port,
                  std::string& err) {
    auto failed = [&](const char* doing) {
      const int e = errno;
      err = std::string("tcp store server: cannot ") + doing + " (" + where + "): " + errno_text(e);
      if (e == EADDRINUSE)
        err += "; port " + std::to_string(port) +
               " is in use (another store or program listens on it): pick another port, or 0 for a free one";
      return e;
    };
    fd_handle s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s) return failed("open a socket");
    int one = 1, zero = 0;
    (void)::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // restart past TIME_WAIT
    if (family == AF_INET6) (void)::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (::bind(s.get(), addr, len) != 0) return failed("bind");
    if (::listen(s.get(), 1024) != 0) return failed("listen");
    sockaddr_storage got{};
    socklen_t got_len = sizeof got;
    if (::getsockname(s.get(), reinterpret_cast<sockaddr*>(&got), &got_len) != 0) return failed("read the bound port");
    port_ = ntohs(got.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&got)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&got)->sin_port);
    listener_ = std::move(s);
    return 0;
  }

  void run() noexcept {
    try {
      loop();
    } catch (...) {
      // Out of memory in the loop itself: stop serving; closing every socket below makes
      // each client fail with comm_error instead of waiting for its timeout.
    }
    conns_.clear();
    listener_.reset();
  }

  void loop() {
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({wake_read_.get(), POLLIN, 0});
      fds.push_back({listener_.get(), POLLIN, 0});
      int timeout = -1;
      for (const auto& c : conns_) {
        fds.push_back({c->sock.get(), static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
        if (c->waiting) timeout = timeout < 0 ? ms_left(c->deadline) : std::min(timeout, ms_left(c->deadline));
      }
      const int n = ::poll(fds.data(), fds.size(), timeout);
      if (n < 0 && errno != EINTR) return;  // cannot happen with valid fds; stop rather than spin
      if (n > 0 && fds[0].revents != 0) return;  // woken by the destructor
      if (n > 0 && (fds[1].revents & POLLIN)) accept_all();
      bool changed = false;
      for (std::size_t i = 0; n > 0 && i + 2 < fds.size() && i < conns_.size(); ++i) {
        conn& c = *conns_[i];
        if (fds[i + 2].fd != c.sock.get()) continue;  // accept_all only appends
        const short ev = fds[i + 2].revents;
        try {
          if (ev & (POLLIN | POLLHUP | POLLERR)) receive(c);
          if (!c.closed) changed |= serve(c);
          if (!c.closed && !c.out.empty()) flush(c);
        } catch (const std::exception&) {
          c.closed = true;  // e.g. out of memory for a value: drop this peer, keep serving
        }
      }
      // A set may complete waits of other connections; a deadline may have passed. Requests
      // a connection sent after its wait may set keys in turn: repeat until nothing changes.
      const auto now = clock::now();
      for (bool again = true; again; changed = again) {
        again = false;
        for (auto& cp : conns_) {
          conn& c = *cp;
          if (c.closed || !c.waiting) continue;
          try {
            if (changed || c.deadline <= now) finish_wait(c, c.deadline <= now);
            if (!c.waiting) again |= serve(c);
            if (!c.out.empty()) flush(c);
          } catch (const std::exception&) {
            c.closed = true;
          }
        }
      }
      std::erase_if(conns_, [](const auto& c) { return c->closed; });
    }
  }

  void accept_all() {
    for (;;) {
      const int s = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (s < 0) return;  // EAGAIN, or a peer that left before accept: nothing to do
      auto c = std::make_unique<conn>();
      c->sock.reset(s);
      set_nodelay(s);
      conns_.push_back(std::move(c));
    }
  }

  static void receive(conn& c) {
    char buf[65536];
    for (std::size_t total = 0; total < (std::size_t{4} << 20);) {  // then let others have a turn
      const ssize_t k = ::recv(c.sock.get(), buf, sizeof buf, 0);
      if (k > 0) {
        c.in.append(buf, static_cast<std::size_t>(k));
        total += static_cast<std::size_t>(k);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      c.closed = true;  // the peer closed, or the connection broke
      return;
    }
  }

  static void flush(conn& c) {
    std::size_t sent = 0;
    while (sent < c.out.size()) {
      const ssize_t k = ::send(c.sock.get(), c.out.data() + sent, c.out.size() - sent, MSG_NOSIGNAL);
      if (k > 0) {
        sent += static_cast<std::size_t>(k);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      c.closed = true;
      return;
    }
    c.out.erase(0, sent);
  }

  // Answers every complete request in c.in, stopping at a wait that has to wait.
  // Returns whether a key was set. A malformed request closes the connection.
  bool serve(conn& c) {
    bool changed = false;
    while (!c.closed && !c.waiting) {
      request rq;
      std::string bad;
      const std::size_t used = parse_request(c.in, rq, bad);
      if (!bad.empty()) {
        c.closed = true;  // garbage from this peer: drop it, everyone else is unaffected
        break;
      }
      if (used == 0) break;
      c.in.erase(0, used);
      switch (rq.op) {
        case op_set:
          data_[rq.keys.front()] = std::move(rq.value);
          put_u8(c.out, status_ok);
          changed = true;
          break;
        case op_get: {
          auto it = data_.find(rq.keys.front());
          if (it == data_.end()) {
            put_u8(c.out, status_missing);
          } else {
            put_u8(c.out, status_ok);
            put_u64(c.out, it->second.size());
            c.out.append(it->second.data(), it->second.size());
          }
          break;
        }
        case op_wait:
          c.waiting = true;
          c.wait_keys = std::move(rq.keys);
          c.deadline = clock::now() + std::chrono::milliseconds(std::min<std::uint64_t>(rq.timeout_ms, 1ull << 40));
          finish_wait(c, false);
          break;
        default:  // op_check
          c.wait_keys = std::move(rq.keys);
          reply_missing(c);
      }
    }
    return changed;
  }

  void finish_wait(conn& c, bool expired) {
    if (!expired)
      for (const auto& k : c.wait_keys)
        if (!data_.count(k)) return;  // keep waiting
    c.waiting = false;
    reply_missing(c);
  }

  void reply_missing(conn& c) {
    std::vector<std::string> missing;
    for (const auto& k : c.wait_keys)
      if (!data_.count(k)) missing.push_back(k);
    c.wait_keys.clear();
    if (missing.empty()) return put_u8(c.out, status_ok);
    put_u8(c.out, status_missing);
    put_keys(c.out, missing);
  }

  fd_handle listener_, wake_read_, wake_write_;
  std::uint16_t port_ = 0;
  std::map<std::string, std::vector<char>> data_;
  std::vector<std::unique_ptr<conn>> conns_;
  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace detail::tcp

AUTOSHARD_TCP_INLINE tcp_store::tcp_store(std::string host, std::uint16_t port, tcp_store_options opts)
    : host_(std::move(host)), port_(port), opts_(std::move(opts)) {
  if (host_.empty()) throw comm_error("tcp store: the server's host name is empty");
  // A name the resolver can look up has at most 253 bytes (RFC 1035); a longer one, from an
  // environment variable, was carried whole into every message about the store.
  if (host_.size() > max_tcp_host_bytes)
    throw comm_error("tcp store: the server's host name " + quoted_text(host_) + " is longer than a host name may be (" +
                     std::to_string(max_tcp_host_bytes) + " bytes, RFC 1035)");
  if (!detail::tcp::plain_host(host_))
    throw comm_error("tcp store: the server's host name " + quoted_text(host_) +
                     " holds a control character or a byte that is not UTF-8");
  if (opts_.timeout.count() <= 0)
    throw comm_error("tcp store " + address() + ": the timeout must be positive, got " +
                     std::to_string(opts_.timeout.count()) + " ms");
  if (opts_.is_server) {
    server_ = std::make_unique<detail::tcp::server>(opts_.listen_host, port_);
    port_ = server_->port();
  } else if (port_ == 0) {
    throw comm_error("tcp store " + host_ + ":0: a client needs the server's port (0 only lets a server pick one)");
  }
}

AUTOSHARD_TCP_INLINE tcp_store::~tcp_store() {
  sock_.reset();    // close our connection first: the server sees it go
  server_.reset();  // then stop and join the server thread
}

// One request and its reply under the store's lock, with a deadline. Any failure closes
// the connection (the next call reconnects) and throws comm_error naming the call.
class tcp_store::call {
 public:
  call(tcp_store& s, std::string what, std::chrono::milliseconds timeout,
       std::chrono::milliseconds extra = std::chrono::milliseconds(0))
      : s_(s),
        lock_(s.mu_),
        what_(std::move(what)),
        start_(detail::tcp::clock::now()),
        timeout_(timeout),
        deadline_(start_ + timeout),
        reply_deadline_(deadline_ + extra) {
    if (!s_.sock_) s_.connect(deadline_, what_);
  }
  std::chrono::nanoseconds elapsed() const { return detail::tcp::clock::now() - start_; }
  [[noreturn]] void fail(const std::string& why) const {
    s_.sock_.reset();
    throw comm_error("tcp store " + s_.address() + ": " + what_ + " failed after " +
                     detail::tcp::seconds(elapsed()) + " (timeout " + detail::tcp::seconds(timeout_) + "): " + why);
  }
  void send(const std::string& b) const {
    std::size_t sent = 0;
    while (sent < b.size()) {
      const ssize_t k = ::send(s_.sock_.get(), b.data() + sent, b.size() - sent, MSG_NOSIGNAL);
      if (k > 0) {
        sent += static_cast<std::size_t>(k);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        ready(POLLOUT, deadline_, "sending the request");
        continue;
      }
      fail("cannot send to the server: " + detail::tcp::errno_text(errno) + " (did the server die?)");
    }
  }
  void bytes(char* p, std::size_t n) const {
    while (n > 0) {
      const ssize_t k = ::recv(s_.sock_.get(), p, n, 0);
      if (k > 0) {
        p += k;
        n -= static_cast<std::size_t>(k);
        replied_ = true;
        continue;
      }
      if (k == 0)
        fail(replied_ ? "the server closed the connection mid-reply (did it die?)"
                      : "the server closed the connection before answering (did it die?)");
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        ready(POLLIN, reply_deadline_, "waiting for the reply");
        continue;
      }
      fail("cannot read from the server: " + detail::tcp::errno_text(errno) + " (did the server die?)");
    }
  }
  std::uint8_t status() const {
    char b = 0;
    bytes(&b, 1);
    const auto v = static_cast<std::uint8_t>(b);
    if (v != detail::tcp::status_ok && v != detail::tcp::status_missing)
      fail("malformed reply: status byte " + std::to_string(v));
    return v;
  }
  void expect_status(std::uint8_t want) const {
    if (status() != want) fail("unexpected reply status");
  }
  std::uint64_t u64() const {
    char b[8];
    bytes(b, 8);
    return detail::tcp::get_le(b, 8);
  }
  std::uint32_t u32() const {
    char b[4];
    bytes(b, 4);
    return static_cast<std::uint32_t>(detail::tcp::get_le(b, 4));
  }
  std::vector<std::string> missing_keys() const {
    std::vector<std::string> out;
    if (status() == detail::tcp::status_ok) return out;
    const std::uint32_t n = u32();
    if (n == 0 || n > detail::tcp::max_keys) fail("malformed reply: " + std::to_string(n) + " missing keys");
    for (std::uint32_t i = 0; i < n; ++i) {
      const std::uint32_t len = u32();
      if (len > detail::tcp::max_key_bytes) fail("malformed reply: a key of " + std::to_string(len) + " bytes");
      out.emplace_back(len, '\0');
      bytes(out.back().data(), len);
    }
    return out;
  }

 private:
  void ready(short events, detail::tcp::clock::time_point deadline, const char* doing) const {
    for (;;) {
      const int left = detail::tcp::ms_left(deadline);
      if (left == 0)
        fail(std::string("no answer from the server ") + doing + " (is it alive and reachable?)");
      pollfd p{s_.sock_.get(), events, 0};
      const int r = ::poll(&p, 1, left);
      if (r > 0) return;  // readable, writable, or an error the next recv/send reports
      if (r < 0 && errno != EINTR) fail("poll: " + detail::tcp::errno_text(errno));
    }
  }

  tcp_store& s_;
  std::lock_guard<std::mutex> lock_;
  std::string what_;
  detail::tcp::clock::time_point start_;
  std::chrono::milliseconds timeout_;
  detail::tcp::clock::time_point deadline_, reply_deadline_;
  mutable bool replied_ = false;  // some of the reply has arrived
};

AUTOSHARD_TCP_INLINE void tcp_store::set(const std::string& key, const std::vector<char>& data) {
  check_key(key, "set");
  if (data.size() > detail::tcp::max_value_bytes)
    throw comm_error("tcp store " + address() + ": set of key " + quoted_text(key) + ": a value of " +
                     std::to_string(data.size()) + " bytes is above the limit of 1 GiB");
  std::string rq;
  detail::tcp::put_u8(rq, detail::tcp::op_set);
  detail::tcp::put_key(rq, key);
  detail::tcp::put_u64(rq, data.size());
  rq.append(data.data(), data.size());
  const call c(*this, "set of key " + quoted_text(key), opts_.timeout);
  c.send(rq);
  c.expect_status(detail::tcp::status_ok);
}

AUTOSHARD_TCP_INLINE std::vector<char> tcp_store::get(const std::string& key) {
  const auto start = detail::tcp::clock::now();
  wait({key}, opts_.timeout);
  std::string rq;
  detail::tcp::put_u8(rq, detail::tcp::op_get);
  detail::tcp::put_key(rq, key);
  using std::chrono::milliseconds;
  const auto left = std::chrono::duration_cast<milliseconds>(opts_.timeout - (detail::tcp::clock::now() - start));
  const call c(*this, "get of key " + quoted_text(key), std::max(left, milliseconds(1)));
  c.send(rq);
  if (c.status() != detail::tcp::status_ok) c.fail("the server says the key is missing, after a wait found it");
  const std::uint64_t n = c.u64();
  if (n > detail::tcp::max_value_bytes) c.fail("malformed reply: a value of " + std::to_string(n) + " bytes");
  std::vector<char> v(static_cast<std::size_t>(n));
  c.bytes(v.data(), v.size());
  return v;
}

AUTOSHARD_TCP_INLINE void tcp_store::wait(const std::vector<std::string>& keys) { wait(keys, opts_.timeout); }

AUTOSHARD_TCP_INLINE void tcp_store::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  if (keys.empty()) return;
  if (keys.size() > detail::tcp::max_keys)
    throw comm_error("tcp store " + address() + ": wait for " + std::to_string(keys.size()) + " keys (at most " +
                     std::to_string(detail::tcp::max_keys) + ")");
  for (const auto& k : keys) check_key(k, "wait");
  const auto t = std::max(timeout, std::chrono::milliseconds(0));
  std::string rq;
  detail::tcp::put_u8(rq, detail::tcp::op_wait);
  detail::tcp::put_u64(rq, static_cast<std::uint64_t>(t.count()));
  detail::tcp::put_keys(rq, keys);
  // The server answers at its own deadline; ours allows for a busy machine on top.
  const call c(*this, "wait for key(s) " + detail::tcp::key_list(keys), t, reply_grace);
  c.send(rq);
  const auto missing = c.missing_keys();
  if (!missing.empty())
    throw comm_error("tcp store " + address() + ": wait for key(s) " + detail::tcp::key_list(keys) +
                     " timed out after " + detail::tcp::seconds(c.elapsed()) + " (timeout " +
                     detail::tcp::seconds(t) + "); still missing: " + detail::tcp::key_list(missing));
}

AUTOSHARD_TCP_INLINE bool tcp_store::check(const std::vector<std::string>& keys) {
  for (const auto& k : keys) check_key(k, "check");
  std::string rq;
  detail::tcp::put_u8(rq, detail::tcp::op_check);
  detail::tcp::put_keys(rq, keys);
  const call c(*this, "check of key(s) " + detail::tcp::key_list(keys), opts_.timeout);
  c.send(rq);
  return c.missing_keys().empty();
}

AUTOSHARD_TCP_INLINE void tcp_store::check_key(const std::string& key, const char* what) const {
  if (key.size() > detail::tcp::max_key_bytes)
    throw comm_error("tcp store " + address() + ": " + what + " of a key of " + std::to_string(key.size()) +
                     " bytes (at most " + std::to_string(detail::tcp::max_key_bytes) + ")");
}

// Connects to the server, retrying (the server may start later) until `deadline`.
AUTOSHARD_TCP_INLINE void tcp_store::connect(detail::tcp::clock::time_point deadline, const std::string& what) {
  using namespace std::chrono;
  const auto start = detail::tcp::clock::now();
  auto backoff = milliseconds(10);
  std::string last = "no attempt made";
  for (;;) {
    if (try_connect(deadline, last)) return;
    const auto now = detail::tcp::clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<detail::tcp::clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, milliseconds(500));
  }
  throw comm_error("tcp store " + address() + ": " + what + ": cannot connect to the server within " +
                   detail::tcp::seconds(detail::tcp::clock::now() - start) + " (timeout " +
                   detail::tcp::seconds(opts_.timeout) + "; last error: " + last +
                   "); is the rank that hosts the store (rank 0) running, and is the address reachable?");
}

AUTOSHARD_TCP_INLINE bool tcp_store::try_connect(detail::tcp::clock::time_point deadline, std::string& last) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &res);
  if (rc != 0) {
    last = "cannot resolve " + quoted_text(host_) + ": " + ::gai_strerror(rc);
    if (rc == EAI_AGAIN) return false;  // a DNS hiccup: retry
    throw comm_error("tcp store " + address() + ": " + last);
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, &::freeaddrinfo);
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    detail::tcp::fd_handle s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!s) {
      last = "socket: " + detail::tcp::errno_text(errno);
      continue;
    }
    if (::connect(s.get(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = detail::tcp::errno_text(errno);
        continue;
      }
      pollfd p{s.get(), POLLOUT, 0};
      int r = 0;
      do r = ::poll(&p, 1, detail::tcp::ms_left(deadline));
      while (r < 0 && errno == EINTR);
      if (r <= 0) {
        last = r == 0 ? "connect timed out" : "poll: " + detail::tcp::errno_text(errno);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0) {
        last = detail::tcp::errno_text(err);
        continue;
      }
    }
    detail::tcp::set_nodelay(s.get());
    sock_ = std::move(s);
    return true;
  }
  return false;
}

AUTOSHARD_TCP_INLINE std::optional<std::pair<std::string, std::uint16_t>> parse_tcp_store_url(const std::string& url) {
  const std::string scheme = "tcp://";
  if (url.compare(0, scheme.size(), scheme) != 0) return std::nullopt;
  const std::string rest = url.substr(scheme.size());
  auto bad = [&](const std::string& why) {
    return comm_error("store address " + quoted_text(url) + " is not tcp://HOST:PORT: " + why);
  };
  std::string host, port;
  if (!rest.empty() && rest.front() == '[') {
    const auto close = rest.find(']');
    if (close == std::string::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
      throw bad("unclosed [ or no port");
    host = rest.substr(1, close - 1);
    port = rest.substr(close + 2);
  } else {
    const auto colon = rest.rfind(':');
    if (colon == std::string::npos) throw bad("no port");
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (host.find(':') != std::string::npos) throw bad("write an IPv6 address in brackets, [::1]");
  }
  if (host.empty()) throw bad("no host");
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    throw bad("port " + quoted_text(port) + " is not a number");
  const unsigned long p = std::stoul(port);
  if (p > 65535) throw bad("port " + port + " is above 65535");
  return std::make_pair(host, static_cast<std::uint16_t>(p));
}

}  // namespace autoshard

#undef AUTOSHARD_TCP_INLINE

#pragma once
/// A TCP key/value store for Gloo rendezvous (what PyTorch's TCPStore is to c10d): one
/// process — rank 0, or whichever is told so — runs a small server thread that holds the
/// keys; every rank, the server's own included, is a client. Works across machines.
///   autoshard::tcp_store s("node0", 29500, {.timeout = 30s, .is_server = rank == 0});
///   s.set("k", {'v'});  s.wait({"k"});  std::vector<char> v = s.get("k");
/// Every call has the store's timeout (connecting, with retries, included) and fails with
/// comm_error naming HOST:PORT, the key(s) and the seconds waited; a malformed or
/// truncated message from a peer is a comm_error, never a crash; the server thread is
/// stopped and joined by the destructor. Protocol: length-prefixed binary, little-endian;
/// keys up to 64 KiB, values up to 1 GiB.
/// The implementation is in tcp_store_impl.hpp, included at the end of this header unless
/// AUTOSHARD_TCP_STORE_SEPARATE is defined (then one translation unit includes it).
#include <unistd.h>  // close

#include <chrono>        // std::chrono
#include <cstddef>       // std::size_t
#include <cstdint>       // std::uint8_t, std::uint32_t, std::uint64_t
#include <memory>        // std::unique_ptr
#include <mutex>         // std::mutex
#include <optional>      // std::optional
#include <string>        // std::string
#include <system_error>  // std::system_category
#include <utility>       // std::exchange, std::move, std::pair
#include <vector>        // std::vector

#include <gloo/rendezvous/store.h>  // gloo::rendezvous::Store

#include "../core/error.hpp"  // comm_error

namespace autoshard {

/// The longest server host name a tcp_store takes: what a resolver looks up (RFC 1035).
inline constexpr std::size_t max_tcp_host_bytes = 253;

/// How a tcp_store behaves.
struct tcp_store_options {
  /// Every call (set, get, wait, and connecting with retries) fails after this long.
  std::chrono::milliseconds timeout{30000};
  /// Run the server in this process (a thread, stopped and joined by ~tcp_store).
  bool is_server = false;
  /// The server's listen address; empty = every interface (IPv6 and IPv4 where possible).
  std::string listen_host;
};

namespace detail::tcp {

using clock = std::chrono::steady_clock;

/// "host:port", "[::1]:port" for an IPv6 literal.
inline std::string host_port(const std::string& host, std::uint16_t port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

inline std::string errno_text(int e) { return std::system_category().message(e); }

/// An owned file descriptor.
class fd_handle {
 public:
  fd_handle() = default;
  explicit fd_handle(int fd) noexcept : fd_(fd) {}
  fd_handle(fd_handle&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  fd_handle& operator=(fd_handle&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  fd_handle(const fd_handle&) = delete;
  fd_handle& operator=(const fd_handle&) = delete;
  ~fd_handle() { reset(); }
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

class server;  // tcp_store_impl.hpp

}  // namespace detail::tcp

/// A gloo::rendezvous::Store over TCP. With is_server, this object also runs the server
/// (bound to `port` on listen_host; port 0 picks a free port, see port()). One request at
/// a time per object (calls from several threads take turns); use one object per rank.
class tcp_store : public gloo::rendezvous::Store {
 public:
  tcp_store(std::string host, std::uint16_t port, tcp_store_options opts = {});
  tcp_store(const tcp_store&) = delete;
  tcp_store& operator=(const tcp_store&) = delete;
  ~tcp_store() override;

  const std::string& host() const noexcept { return host_; }
  /// The server's port (the one it picked, when constructed as a server with port 0).
  std::uint16_t port() const noexcept { return port_; }
  /// "HOST:PORT" ("[::1]:PORT" for an IPv6 literal).
  std::string address() const { return detail::tcp::host_port(host_, port_); }
  bool is_server() const noexcept { return server_ != nullptr; }
  std::chrono::milliseconds timeout() const noexcept { return opts_.timeout; }

  void set(const std::string& key, const std::vector<char>& data) override;
  /// The value of `key`, waiting up to the timeout for some rank to set it.
  std::vector<char> get(const std::string& key) override;

  void wait(const std::vector<std::string>& keys) override;

  /// Blocks until every key is set; comm_error after `timeout` naming the keys still missing.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  /// Whether every key is set now (no waiting).
  bool check(const std::vector<std::string>& keys);

 private:
  static constexpr std::chrono::milliseconds reply_grace{2000};

  void check_key(const std::string& key, const char* what) const;
  class call;  // one request and its reply
  void connect(detail::tcp::clock::time_point deadline, const std::string& what);
  bool try_connect(detail::tcp::clock::time_point deadline, std::string& last);

  std::string host_;
  std::uint16_t port_;
  tcp_store_options opts_;
  std::unique_ptr<detail::tcp::server> server_;
  detail::tcp::fd_handle sock_;
  std::mutex mu_;
};

/// "tcp://HOST:PORT" (HOST may be "[v6 literal]"): host and port; nullopt when `url` does
/// not start with tcp://; comm_error when it does but is malformed.
std::optional<std::pair<std::string, std::uint16_t>> parse_tcp_store_url(const std::string& url);

}  // namespace autoshard

#if !defined(AUTOSHARD_TCP_STORE_SEPARATE)
#include "tcp_store_impl.hpp"  // the definitions, inline
#endif

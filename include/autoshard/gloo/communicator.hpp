#pragma once
/// The Gloo backend: TCP transport (loopback by default), rendezvous through a store
/// (a FileStore directory shared by processes, a TCP store hosted by one rank, or an
/// in-process store for ranks that are threads), one gloo context per communicator, and a
/// sub-communicator per mesh axis.
///   auto store = autoshard::gloo_store::file("/tmp/run1");
///   auto world = autoshard::gloo_communicator::connect(store, rank, 8, {.timeout = 10s});
///   autoshard::mesh_communicator mc(std::move(world), autoshard::device_mesh{2, 4});
///   mc.axis(1).all_reduce(buf, n, autoshard::dtype::f32, autoshard::reduce_op::sum);
/// Every operation has the communicator's timeout; a dead, missing or mismatched peer
/// turns into comm_error naming this rank, the group and the operation.
#include <algorithm>  // std::clamp
#include <csignal>    // std::signal, SIGPIPE
#include <chrono>     // std::chrono::milliseconds
#include <cstddef>    // std::size_t
#include <cstdint>    // std::uint32_t
#include <cstring>    // std::memcpy
#include <exception>  // std::exception
#include <filesystem>  // std::filesystem::status: a file store's directory
#include <memory>     // std::shared_ptr
#include <mutex>      // std::once_flag
#include <string>     // std::string
#include <string_view>  // std::string_view
#include <utility>    // std::move
#include <vector>     // std::vector

#include <gloo/allgather.h>                // gloo::allgather
#include <gloo/allreduce.h>                // gloo::allreduce
#include <gloo/alltoall.h>                 // gloo::alltoall
#include <gloo/barrier.h>                  // gloo::barrier
#include <gloo/broadcast.h>                // gloo::broadcast
#include <gloo/rendezvous/context.h>       // gloo::rendezvous::Context
#include <gloo/rendezvous/file_store.h>    // gloo::rendezvous::FileStore
#include <gloo/rendezvous/hash_store.h>    // gloo::rendezvous::HashStore
#include <gloo/rendezvous/prefix_store.h>  // gloo::rendezvous::PrefixStore
#include <gloo/transport/tcp/device.h>     // gloo::transport::tcp::CreateDevice
#include <gloo/transport/unbound_buffer.h>  // gloo::transport::UnboundBuffer (point to point)

#include "../comm/communicator.hpp"       // communicator, reduce_elements
#include "../comm/mesh_communicator.hpp"  // basic_mesh_communicator, detail::check_split, detail::rank_list
#include "../core/dtype.hpp"              // dtype
#include "../core/error.hpp"              // comm_error
#include "../core/mesh.hpp"               // device_mesh
#include "../core/placement.hpp"          // reduce_op
#include "tcp_store.hpp"                  // tcp_store

namespace autoshard {

/// How ranks find and reach each other.
struct gloo_options {
  std::string hostname = "127.0.0.1";        ///< address to listen on (ignored when iface is set)
  std::string iface;                         ///< network interface, e.g. "eth0"
  std::chrono::milliseconds timeout{30000};  ///< per operation, and for connecting
  /// Before each operation, all-gather (op, count, dtype, root) and compare: ranks that call
  /// different operations or sizes get comm_error instead of Gloo aborting the process
  /// ("op.preamble.length <= op.nbytes"). Costs one 32-byte all-gather per operation.
  bool verify = true;
};

/// A rendezvous store shared by the ranks of one run.
class gloo_store {
 public:
  /// A FileStore in `dir` (created by the caller, empty, shared by every process of the run).
  static gloo_store file(const std::string& dir) {
    gloo_store s;
    // Gloo opens a path that is no directory (a regular file, AUTOSHARD_STORE mistyped) and
    // fails only at the first write: every rank then reported its peers as missing.
    std::error_code ec;
    if (const auto st = std::filesystem::status(dir, ec); !ec && std::filesystem::exists(st) && !std::filesystem::is_directory(st))
      throw comm_error("cannot open the file store " + quoted_path(dir) + ": it is not a directory (a file store is a "
                       "directory every rank of the run shares)");
    try {
      s.store_ = std::make_shared<gloo::rendezvous::FileStore>(dir);
    } catch (const std::exception& e) {
      throw comm_error("cannot open the file store " + quoted_path(dir) + ": " + e.what());
    }
    s.description_ = "file store " + quoted_path(dir);
    return s;
  }
  /// The TCP store at host:port (tcp_store.hpp); with o.is_server, this process hosts it.
  /// (A server asked for port 0 picks one: make the tcp_store yourself, read its port(),
  /// and wrap it with from().)
  static gloo_store tcp(const std::string& host, std::uint16_t port, const tcp_store_options& o = {}) {
    return from(std::make_shared<tcp_store>(host, port, o));
  }
  /// Wraps a tcp_store made by the caller (to read its port first).
  static gloo_store from(std::shared_ptr<tcp_store> s) {
    if (!s) throw comm_error("gloo_store::from: no tcp_store given");
    gloo_store g;
    g.description_ = "tcp store " + s->address();
    g.store_ = std::move(s);
    return g;
  }
  /// One in-process store for ranks that are threads of this process.
  static gloo_store in_process() {
    gloo_store s;
    s.store_ = std::make_shared<gloo::rendezvous::HashStore>();
    s.description_ = "in-process store";
    return s;
  }
  gloo::rendezvous::Store& get() const { return *store_; }
  const std::string& description() const noexcept { return description_; }
  explicit operator bool() const noexcept { return store_ != nullptr; }

 private:
  std::shared_ptr<gloo::rendezvous::Store> store_;
  std::string description_;
};

namespace detail {

/// Gloo writes to its peers' sockets without MSG_NOSIGNAL: a write to a peer that has died
/// raises SIGPIPE, whose default action kills the whole process before any error can be
/// reported. Where SIGPIPE still has its default action, ignore it, so the write fails with
/// EPIPE and the collective with comm_error; a handler the program installed is left alone.
inline void ignore_default_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL && !(old.sa_flags & SA_SIGINFO))
      std::signal(SIGPIPE, SIG_IGN);
  });
}

/// Calls f with a null pointer of the unsigned type of t's size: gloo only needs the width.
template <class F>
decltype(auto) with_width(dtype t, F&& f) {
  switch (dtype_size(t)) {
    case 1: return f(static_cast<std::uint8_t*>(nullptr));
    case 2: return f(static_cast<std::uint16_t*>(nullptr));
    case 4: return f(static_cast<std::uint32_t*>(nullptr));
    default: return f(static_cast<std::uint64_t*>(nullptr));
  }
}

}  // namespace detail

/// A group of ranks with a connected gloo context. Movable, not copyable.
class gloo_communicator {
 public:
  gloo_communicator() = default;

  /// Joins the world of `size` ranks as `rank`; blocks until everyone has joined or
  /// the timeout passes (comm_error naming the rank and the missing peers' store).
  static gloo_communicator connect(const gloo_store& store, int rank, int size, const gloo_options& opts = {}) {
    detail::ignore_default_sigpipe();
    if (size < 1 || rank < 0 || rank >= size)
      throw comm_error("rank " + std::to_string(rank) + " is outside a world of " + std::to_string(size));
    std::shared_ptr<gloo::transport::Device> dev;
    try {
      gloo::transport::tcp::attr a;
      if (!opts.iface.empty())
        a.iface = opts.iface;
      else
        a.hostname = opts.hostname;
      dev = gloo::transport::tcp::CreateDevice(a);
    } catch (const std::exception& e) {
      const std::string why = "rank " + std::to_string(rank) + ": cannot open a TCP device on " +
                              (opts.iface.empty() ? "host " + opts.hostname : "interface " + opts.iface) + ": " + e.what();
      abort_world(store, "world", why);  // the others stop waiting for this rank now, not after their time-out
      throw comm_error(why);
    }
    std::vector<int> members(static_cast<std::size_t>(size));
    for (int i = 0; i < size; ++i) members[static_cast<std::size_t>(i)] = i;
    gloo_communicator c(store, std::move(dev), opts.timeout, "world", std::move(members), rank, rank);
    c.verify_ = opts.verify;
    return c;
  }

  /// A sub-communicator of the ranks `members` (ranks of this communicator, in the new
  /// group's order; this rank must be one of them). Every rank of this communicator must
  /// call split in the same order, each with its own group; `name` tells groups apart.
  gloo_communicator split(const std::vector<int>& members, const std::string& name) {
    require_connected("split");
    detail::split_group g = detail::check_split(members, rank(), members_, who(), name);
    ++splits_;
    std::string prefix = name_ + "/" + std::to_string(splits_) + "/" + name + detail::rank_list(g.world_ranks);
    gloo_communicator c(store_, device_, timeout_, std::move(prefix), std::move(g.world_ranks), g.index, global_rank_,
                        name);
    c.verify_ = verify_;
    return c;
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return static_cast<int>(members_.size()); }
  /// Rank in the world this communicator was split from.
  int global_rank() const noexcept { return global_rank_; }
  /// World ranks of the members, in group order.
  const std::vector<int>& members() const noexcept { return members_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) {
    timeout_ = t;
    if (ctx_) ctx_->setTimeout(t);
  }
  /// "rank 5 (axis1 group [4,5,6,7])": how errors name this end.
  std::string who() const {
    return "rank " + std::to_string(global_rank_) +
           (label_.empty() ? std::string() : " (" + label_ + " group " + detail::rank_list(members_) + ")");
  }

  void all_reduce(void* buf, std::size_t n, dtype t, reduce_op op) {
    if (size() == 1 || n == 0) return require_connected("all-reduce");
    run("all-reduce", n, t, static_cast<int>(op), [&](auto* w) {
      using W = std::remove_pointer_t<decltype(w)>;
      gloo::AllreduceOptions o(ctx_);
      o.setOutput<W>(static_cast<W*>(buf), n);
      o.setReduceFunction([t, op](void* c, const void* a, const void* b, std::size_t k) {
        reduce_elements(c, a, b, k, t, op);
      });
      o.setTag(next_tag());
      o.setTimeout(timeout_);
      gloo::allreduce(o);
    });
  }

  void all_gather(const void* in, void* out, std::size_t n, dtype t) {
    if (size() == 1 || n == 0) return local_copy("all-gather", in, out, n, t);
    run("all-gather", n, t, 0, [&](auto* w) {
      using W = std::remove_pointer_t<decltype(w)>;
      gloo::AllgatherOptions o(ctx_);
      o.setInput<W>(static_cast<W*>(const_cast<void*>(in)), n);
      o.setOutput<W>(static_cast<W*>(out), n * static_cast<std::size_t>(size()));
      o.setTag(next_tag());
      o.setTimeout(timeout_);
      gloo::allgather(o);
    });
  }

  /// Direct reduce-scatter: an all-to-all of the blocks, then a local reduction in rank
  /// order (deterministic, and each rank sends (k-1)/k of its input, as the cost model says).
  void reduce_scatter(const void* in, void* out, std::size_t n, dtype t, reduce_op op) {
    if (size() == 1 || n == 0) return local_copy("reduce-scatter", in, out, n, t);
    const std::size_t bytes = n * dtype_size(t);
    std::vector<std::byte> recv(bytes * static_cast<std::size_t>(size()));
    exchange("reduce-scatter", in, recv.data(), n, t, static_cast<int>(op));
    std::memcpy(out, recv.data(), bytes);
    for (int i = 1; i < size(); ++i) reduce_elements(out, out, recv.data() + bytes * static_cast<std::size_t>(i), n, t, op);
  }

  void all_to_all(const void* in, void* out, std::size_t n, dtype t) {
    if (size() == 1 || n == 0) return local_copy("all-to-all", in, out, n, t);
    exchange("all-to-all", in, out, n, t, 0);
  }

  void broadcast(void* buf, std::size_t n, dtype t, int root) {
    if (root < 0 || root >= size())
      throw comm_error(who() + ": broadcast from root " + std::to_string(root) + " outside the group of " +
                       std::to_string(size()));
    if (size() == 1 || n == 0) return require_connected("broadcast");
    run("broadcast", n, t, root, [&](auto* w) {
      using W = std::remove_pointer_t<decltype(w)>;
      gloo::BroadcastOptions o(ctx_);
      o.setOutput<W>(static_cast<W*>(buf), n);
      o.setRoot(root);
      o.setTag(next_tag());
      o.setTimeout(timeout_);
      gloo::broadcast(o);
    });
  }

  /// Point to point (comm/communicator.hpp): `n` elements to rank `peer` of this group. The
  /// bytes are copied and sent in the background (Gloo delivers them once the peer receives);
  /// wait_sends() waits for every one. The k-th send to a peer meets the peer's k-th recv
  /// from this rank (each pair numbers its messages in its own slots).
  void send(const void* buf, std::size_t n, dtype t, int peer) {
    check_peer("send", peer);
    if (n == 0) return;
    pending_send p;
    p.bytes.resize(n * dtype_size(t));
    std::memcpy(p.bytes.data(), buf, p.bytes.size());
    p.peer = peer;
    try {
      p.buffer = ctx_->createUnboundBuffer(p.bytes.data(), p.bytes.size());
      p.buffer->send(peer, point_to_point_slot(next_message(sent_, peer)));
    } catch (const std::exception& e) {
      throw comm_error(who() + ": send of " + std::to_string(n) + " " + std::string(to_string(t)) + " elements to rank " +
                       std::to_string(members_[static_cast<std::size_t>(peer)]) + " failed: " + e.what());
    }
    pending_.push_back(std::move(p));
  }

  /// `n` elements from rank `peer` of this group into `buf`; blocks until they are here or the
  /// timeout passes (comm_error naming the peer).
  void recv(void* buf, std::size_t n, dtype t, int peer) {
    check_peer("recv", peer);
    if (n == 0) return;
    bool done = false;
    std::string why = "timed out";
    try {
      auto b = ctx_->createUnboundBuffer(buf, n * dtype_size(t));
      b->recv(peer, point_to_point_slot(next_message(received_, peer)));
      done = b->waitRecv(timeout_);
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!done) ctx_.reset();  // out of step with the peer: later calls fail at once
    if (!done)
      throw comm_error(who() + ": recv of " + std::to_string(n) + " " + std::string(to_string(t)) + " elements from rank " +
                       std::to_string(members_[static_cast<std::size_t>(peer)]) + " failed (timeout " +
                       std::to_string(timeout_.count()) + " ms; the peer died or never sent it): " + why);
  }

  /// Blocks until every send so far was delivered (comm_error naming a peer that never received).
  void wait_sends() {
    for (pending_send& p : pending_) {
      bool done = false;
      std::string why = "timed out";
      try {
        done = p.buffer->waitSend(timeout_);
      } catch (const std::exception& e) {
        why = e.what();
      }
      if (!done)
        throw comm_error(who() + ": a send of " + std::to_string(p.bytes.size()) + " bytes to rank " +
                         std::to_string(members_[static_cast<std::size_t>(p.peer)]) + " was not received (timeout " +
                         std::to_string(timeout_.count()) + " ms): " + why);
      p.buffer.reset();
    }
    pending_.clear();
  }

  void barrier() {
    if (size() == 1) return require_connected("barrier");
    run("barrier", 0, dtype::u8, 0, [&](auto*) {
      gloo::BarrierOptions o(ctx_);
      o.setTag(next_tag());
      o.setTimeout(timeout_);
      gloo::barrier(o);
    });
  }

 private:
  gloo_communicator(gloo_store store, std::shared_ptr<gloo::transport::Device> dev, std::chrono::milliseconds timeout,
                    std::string name, std::vector<int> members, int rank, int global_rank, std::string label = {})
      : store_(std::move(store)),
        device_(std::move(dev)),
        timeout_(timeout),
        name_(std::move(name)),
        label_(std::move(label)),
        members_(std::move(members)),
        rank_(rank),
        global_rank_(global_rank) {
    if (members_.size() == 1) return;  // nothing to connect: every collective is local
    gloo::rendezvous::PrefixStore prefixed(name_, store_.get());
    wait_for_peers(prefixed);
    try {
      ctx_ = std::make_shared<gloo::rendezvous::Context>(rank_, size());
      ctx_->setTimeout(timeout_);
      ctx_->connectFullMesh(prefixed, device_);
      // connectFullMesh can return on one rank while a peer is still finishing its side; a
      // rank that then closed at once (an error before its first collective) would break the
      // peer's handshake. A barrier makes every rank return connected.
      gloo::BarrierOptions b(ctx_);
      b.setTimeout(timeout_);
      gloo::barrier(b);
    } catch (const std::exception& e) {
      ctx_.reset();
      throw comm_error(who() + ": connecting " + std::to_string(size()) + " ranks through the " +
                       store_.description() + " failed within " + std::to_string(timeout_.count()) +
                       " ms (a peer never joined or died): " + e.what());
    }
  }

  /// Tells the ranks of group `name` that one of them cannot start (its TCP device, or a
  /// thread, could not be created: a process or thread limit): they fail at once with `why`
  /// instead of waiting their whole time-out for it ("rank(s) [1,4,6] did not join").
  static void abort_world(const gloo_store& store, const std::string& name, const std::string& why) noexcept {
    try {
      gloo::rendezvous::PrefixStore prefixed(name, store.get());
      prefixed.set("abort", std::vector<char>(why.begin(), why.end()));
    } catch (...) {  // the store itself is gone: the others time out as before
    }
  }

  // Everyone announces itself in the store before any TCP connection is made. Gloo's own
  // connect waits up to 5x the timeout for a peer that has gone; this wait fails within
  // the timeout, and names the ranks that never came. It waits in slices of at most 100 ms and
  // between them looks for an abort: a rank that could not start says so (abort_world).
  void wait_for_peers(gloo::rendezvous::Store& st) {
    auto key = [](int r) { return "joined/" + std::to_string(r); };
    std::vector<std::string> others;
    std::string aborted;  // why a peer could not start, when one said so
    bool timed_out = false;  // the last slice timed out: the store's words would name that slice's time-out
    try {
      st.set(key(rank_), std::vector<char>{'1'});
    } catch (const std::exception& e) {  // this rank's own write: no peer is to blame
      throw comm_error(who() + ": connecting " + std::to_string(size()) + " ranks through the " + store_.description() +
                       ": this rank cannot write to the store: " + e.what());
    }
    try {
      for (int r = 0; r < size(); ++r)
        if (r != rank_) others.push_back(key(r));
      const auto deadline = std::chrono::steady_clock::now() + timeout_;
      while (aborted.empty()) {
        const auto start = std::chrono::steady_clock::now();
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - start);
        const auto slice = std::clamp(left, std::chrono::milliseconds(1), std::chrono::milliseconds(100));
        try {
          st.wait(others, slice);
          return;
        } catch (const std::exception&) {
          // The last slice, or a failure that is not its time-out (it came early: a store that
          // is gone): as before.
          if (left <= slice) {
            timed_out = true;
            throw;
          }
          if (std::chrono::steady_clock::now() - start < slice / 2) throw;
        }
        try {
          st.wait({"abort"}, std::chrono::milliseconds(1));
          const std::vector<char> why = st.get("abort");
          aborted.assign(why.begin(), why.end());
        } catch (const std::exception&) {  // no abort: wait on
        }
      }
    } catch (const std::exception& e) {
      std::vector<int> missing;
      for (int r = 0; r < size(); ++r) {
        if (r == rank_) continue;
        try {
          st.wait({key(r)}, std::chrono::milliseconds(1));
        } catch (const std::exception&) {
          missing.push_back(members_[static_cast<std::size_t>(r)]);
        }
      }
      throw comm_error(who() + ": connecting " + std::to_string(size()) + " ranks through the " +
                       store_.description() + ": rank(s) " + detail::rank_list(missing) + " did not join within " +
                       std::to_string(timeout_.count()) + " ms" + (timed_out ? std::string() : " (" + std::string(e.what()) + ")"));
    }
    throw comm_error(who() + ": connecting " + std::to_string(size()) + " ranks through the " + store_.description() +
                     ": a peer could not start (" + aborted + ")");
  }

  /// A send in flight: its own copy of the bytes, kept until it was delivered.
  struct pending_send {
    std::vector<std::byte> bytes;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    int peer = 0;
  };

  void check_peer(const char* op, int peer) const {
    require_connected(op);
    if (peer < 0 || peer >= size() || peer == rank_)
      throw comm_error(who() + ": " + op + " with rank " + std::to_string(peer) + " of a group of " + std::to_string(size()) +
                       (peer == rank_ ? " (itself)" : ""));
    if (!ctx_) throw comm_error(who() + ": " + op + " on a communicator whose earlier failure closed it");
  }
  /// The number of the next message with `peer` in `count` (one entry per peer).
  std::uint64_t next_message(std::vector<std::uint64_t>& count, int peer) {
    count.resize(static_cast<std::size_t>(size()), 0);
    return count[static_cast<std::size_t>(peer)]++;
  }
  /// Point-to-point messages use slots of their own, apart from the collectives' tags.
  static std::uint64_t point_to_point_slot(std::uint64_t k) noexcept { return (std::uint64_t{0x5a} << 56) | k; }

  void require_connected(const char* op) const {
    if (members_.empty()) throw comm_error(std::string(op) + " on a communicator that was never connected");
  }
  void local_copy(const char* op, const void* in, void* out, std::size_t n, dtype t) const {
    require_connected(op);
    if (n != 0 && in != out) std::memmove(out, in, n * dtype_size(t));
  }
  std::uint32_t next_tag() noexcept { return ++tag_; }

  // `extra` is the reduce op or the broadcast root: part of what every rank must agree on.
  template <class F>
  void run(const char* op, std::size_t n, dtype t, int extra, F&& f) {
    require_connected(op);
    if (!ctx_) throw comm_error(who() + ": " + op + " on a communicator whose earlier failure closed it");
    std::vector<std::int64_t> all;
    try {
      if (verify_) {
        std::int64_t mine[4] = {op_code(op), static_cast<std::int64_t>(n), static_cast<std::int64_t>(t), extra};
        all.resize(4 * static_cast<std::size_t>(size()));
        gloo::AllgatherOptions o(ctx_);
        o.setInput<std::int64_t>(mine, 4);
        o.setOutput<std::int64_t>(all.data(), all.size());
        o.setTag(next_tag());
        o.setTimeout(timeout_);
        gloo::allgather(o);
      }
    } catch (const std::exception& e) {
      ctx_.reset();
      throw comm_error(who() + ": " + op + " of " + std::to_string(n) + " " + std::string(to_string(t)) +
                       " elements failed before it started (timeout " + std::to_string(timeout_.count()) +
                       " ms; a peer died or is missing): " + e.what());
    }
    if (verify_) check_agreement(op, all);
    try {
      detail::with_width(t, f);
    } catch (const std::exception& e) {
      // A failed gloo context is unusable (its pairs are closed or out of step): drop it,
      // so later calls fail fast instead of waiting for another timeout.
      ctx_.reset();
      throw comm_error(who() + ": " + op + " of " + std::to_string(n) + " " + std::string(to_string(t)) +
                       " elements failed (timeout " + std::to_string(timeout_.count()) +
                       " ms; a peer died, is missing or sent a different size): " + e.what());
    }
  }

  static std::int64_t op_code(const char* op) {
    static constexpr const char* names[] = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast", "barrier"};
    for (std::int64_t i = 0; i < 6; ++i)
      if (std::string_view(op) == names[i]) return i;
    return 99;
  }
  // Every rank sees the same headers, so every rank throws (and the context stays usable).
  void check_agreement(const char* op, const std::vector<std::int64_t>& all) const {
    static constexpr const char* names[] = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast", "barrier"};
    bool same = true;
    for (std::size_t r = 1; r < static_cast<std::size_t>(size()); ++r)
      for (std::size_t i = 0; i < 4; ++i) same = same && all[4 * r + i] == all[i];
    if (same) return;
    std::string list;
    for (std::size_t r = 0; r < static_cast<std::size_t>(size()); ++r) {
      const std::int64_t code = all[4 * r];
      list += (r ? "; " : "") + std::string("rank ") + std::to_string(members_[r]) + ": " +
              (code >= 0 && code < 6 ? names[code] : "?") + " of " + std::to_string(all[4 * r + 1]) + " " +
              std::string(to_string(static_cast<dtype>(all[4 * r + 2]))) +
              (code == 4 ? " from root " + std::to_string(all[4 * r + 3]) : std::string());
    }
    throw comm_error(who() + ": " + op + ": the ranks called different collectives or sizes (" + list + ")");
  }

  void exchange(const char* op, const void* in, void* out, std::size_t n, dtype t, int extra) {
    run(op, n, t, extra, [&](auto* w) {
      using W = std::remove_pointer_t<decltype(w)>;
      const std::size_t total = n * static_cast<std::size_t>(size());
      gloo::AlltoallOptions o(ctx_);
      o.setInput<W>(static_cast<W*>(const_cast<void*>(in)), total);
      o.setOutput<W>(static_cast<W*>(out), total);
      o.setTag(next_tag());
      o.setTimeout(timeout_);
      gloo::alltoall(o);
    });
  }

  gloo_store store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  std::chrono::milliseconds timeout_{30000};
  std::string name_;   // store prefix, unique per group
  std::string label_;  // what errors call the group
  std::vector<int> members_;
  int rank_ = 0;
  int global_rank_ = 0;
  std::uint32_t tag_ = 0;
  int splits_ = 0;
  bool verify_ = true;
  std::vector<pending_send> pending_;                // sends not yet known to be delivered, oldest first
  std::vector<std::uint64_t> sent_, received_;      // point-to-point messages per peer so far
};

static_assert(point_to_point_communicator<gloo_communicator>);

/// The Gloo world plus one communicator per mesh axis (comm/mesh_communicator.hpp).
using mesh_communicator = basic_mesh_communicator<gloo_communicator>;

}  // namespace autoshard

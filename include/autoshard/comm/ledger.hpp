#pragma once
/// Counting the collectives a rank actually issues: every axis communicator of a
/// basic_mesh_communicator is a counted_communicator, which notes each call in the mesh
/// communicator's collective_ledger before running it. The ledger charges what it sees to
/// the site a caller names (an edge of a plan, a gradient, ...); with no site named
/// (the default) nothing is noted, so a communicator nobody audits pays one branch a call.
///   collective_ledger& l = mc.ledger();
///   { ledger_site s(l, 7); mc.axis(1).all_reduce(buf, n, dtype::f32, reduce_op::sum); }
///   l.entries();   // {site 7, "all-reduce", axis 1, n elements, 1 call}
/// Elements are the B of the cost formula (core/cost.hpp) in elements: an all-reduce's or
/// broadcast's buffer, an all-gather's gathered output (size() x n), a reduce-scatter's or
/// all-to-all's input (size() x n), a send's or recv's buffer; padding included, as the
/// collective moves it.
#include <cstddef>      // std::size_t
#include <cstdint>      // std::uint64_t
#include <map>          // std::map
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <tuple>        // std::tuple
#include <utility>      // std::move
#include <vector>       // std::vector

#include "../core/dtype.hpp"         // dtype
#include "../core/placement.hpp"     // reduce_op
#include "../core/redistribute.hpp"  // collective, to_string(collective)
#include "communicator.hpp"          // communicator

namespace autoshard {

/// The collectives of one kind on one mesh axis charged to one site.
struct issued_collective {
  std::uint64_t site = 0;
  std::string kind;          ///< "all-gather", "all-reduce", "reduce-scatter", "all-to-all", "broadcast", "send", "recv"
  int mesh_axis = 0;
  std::size_t elements = 0;  ///< summed over the calls (B of the cost formula, in elements)
  std::size_t calls = 0;
};

/// One rank's count of the collectives it issued, by site, kind and mesh axis.
class collective_ledger {
 public:
  /// The site meaning "do not count" (the default).
  static constexpr std::uint64_t no_site = ~std::uint64_t{0};

  std::uint64_t site() const noexcept { return site_; }
  void charge_to(std::uint64_t site) noexcept { site_ = site; }

  /// Notes one call of `kind` on `mesh_axis` moving `elements` (see above), when a site is named.
  void note(std::string_view kind, int mesh_axis, std::size_t elements) {
    if (site_ == no_site) return;
    issued_collective& e = by_key_[{site_, std::string(kind), mesh_axis}];
    e.site = site_;
    e.kind = std::string(kind);
    e.mesh_axis = mesh_axis;
    e.elements += elements;
    ++e.calls;
  }

  /// Everything noted, ordered by site, kind and axis.
  std::vector<issued_collective> entries() const {
    std::vector<issued_collective> out;
    out.reserve(by_key_.size());
    for (const auto& kv : by_key_) out.push_back(kv.second);
    return out;
  }
  void clear() noexcept { by_key_.clear(); }

 private:
  std::uint64_t site_ = no_site;
  std::map<std::tuple<std::uint64_t, std::string, int>, issued_collective> by_key_;
};

/// Charges a ledger's collectives to `site` while it lives, then back to what it was.
class ledger_site {
 public:
  ledger_site(collective_ledger& l, std::uint64_t site) noexcept : l_(l), before_(l.site()) { l.charge_to(site); }
  ~ledger_site() { l_.charge_to(before_); }
  ledger_site(const ledger_site&) = delete;
  ledger_site& operator=(const ledger_site&) = delete;

 private:
  collective_ledger& l_;
  std::uint64_t before_;
};

/// A backend's communicator that notes every collective in a ledger (which outlives it)
/// as one on `mesh_axis`, then runs it. It is the backend's communicator (derived from it),
/// so code that takes the backend's type takes it too.
template <communicator Comm>
class counted_communicator : public Comm {
 public:
  counted_communicator(Comm c, collective_ledger* ledger, int mesh_axis)
      : Comm(std::move(c)), ledger_(ledger), axis_(mesh_axis) {}

  void all_reduce(void* buf, std::size_t n, dtype t, reduce_op op) {
    ledger_->note(to_string(collective::all_reduce), axis_, n);
    Comm::all_reduce(buf, n, t, op);
  }
  void all_gather(const void* in, void* out, std::size_t n, dtype t) {
    ledger_->note(to_string(collective::all_gather), axis_, n * group());
    Comm::all_gather(in, out, n, t);
  }
  void reduce_scatter(const void* in, void* out, std::size_t n, dtype t, reduce_op op) {
    ledger_->note(to_string(collective::reduce_scatter), axis_, n * group());
    Comm::reduce_scatter(in, out, n, t, op);
  }
  void all_to_all(const void* in, void* out, std::size_t n, dtype t) {
    ledger_->note(to_string(collective::all_to_all), axis_, n * group());
    Comm::all_to_all(in, out, n, t);
  }
  void broadcast(void* buf, std::size_t n, dtype t, int root) {
    ledger_->note("broadcast", axis_, n);
    Comm::broadcast(buf, n, t, root);
  }
  /// Point to point, where the backend has it (point_to_point_communicator): noted as "send"
  /// and "recv" of n elements.
  void send(const void* buf, std::size_t n, dtype t, int peer)
    requires point_to_point_communicator<Comm>
  {
    ledger_->note("send", axis_, n);
    Comm::send(buf, n, t, peer);
  }
  void recv(void* buf, std::size_t n, dtype t, int peer)
    requires point_to_point_communicator<Comm>
  {
    ledger_->note("recv", axis_, n);
    Comm::recv(buf, n, t, peer);
  }

 private:
  std::size_t group() const { return static_cast<std::size_t>(this->size()); }
  collective_ledger* ledger_;
  int axis_;
};

}  // namespace autoshard

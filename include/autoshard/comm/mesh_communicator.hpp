#pragma once
/// A mesh of communicators, for any backend: the world plus one sub-communicator per mesh
/// axis, and the checks every backend's split makes. Gloo (gloo/communicator.hpp) and NCCL
/// (device/nccl.hpp) both use these; neither keeps a copy.
///   autoshard::basic_mesh_communicator<my_comm> mc(std::move(world), autoshard::device_mesh{2, 4});
///   mc.axis(1).all_reduce(buf, n, autoshard::dtype::f32, autoshard::reduce_op::sum);
/// Every axis communicator notes its collectives in the mesh's ledger (comm/ledger.hpp)
/// while a caller names a site there: how an executor's traffic is audited.
#include <concepts>     // std::convertible_to
#include <cstddef>      // std::size_t
#include <memory>       // std::unique_ptr, std::make_unique
#include <string>       // std::string
#include <type_traits>  // std::remove_cvref_t
#include <utility>      // std::move
#include <vector>       // std::vector

#include "../core/error.hpp"  // comm_error
#include "../core/mesh.hpp"   // device_mesh
#include "communicator.hpp"   // communicator
#include "ledger.hpp"         // collective_ledger, counted_communicator

namespace autoshard {

/// What the executor needs: the mesh, this rank, and a communicator per mesh axis whose
/// members are device_mesh::group(axis, rank) in that order.
template <class M>
concept mesh_communicator_like = requires(M& m, const M& cm, std::size_t a) {
  { cm.mesh() } -> std::convertible_to<const device_mesh&>;
  { cm.rank() } -> std::convertible_to<int>;
  requires communicator<std::remove_cvref_t<decltype(m.axis(a))>>;
};

/// A communicator that can make sub-communicators of some of its ranks.
template <class C>
concept splittable_communicator =
    communicator<C> && std::movable<C> && requires(C& c, const std::vector<int>& members, const std::string& name) {
      { c.split(members, name) } -> std::convertible_to<C>;
    };

namespace detail {

/// "[0,1,2]": how messages name a group of ranks.
inline std::string rank_list(const std::vector<int>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

/// The checked members of a split: this rank's index in the new group and the members'
/// ranks in the world the parent communicator was split from.
struct split_group {
  int index = -1;
  std::vector<int> world_ranks;
};

/// What every backend's split checks before it builds a group: `members` are ranks of the
/// parent communicator (of `parent_world_ranks.size()` ranks; this end is `rank` there and
/// is named `who` in errors), each within the parent, none twice, this rank among them.
inline split_group check_split(const std::vector<int>& members, int rank, const std::vector<int>& parent_world_ranks,
                               const std::string& who, const std::string& name) {
  const auto size = static_cast<int>(parent_world_ranks.size());
  split_group g;
  g.world_ranks.reserve(members.size());
  std::vector<bool> seen(parent_world_ranks.size(), false);
  for (std::size_t i = 0; i < members.size(); ++i) {
    const int m = members[i];
    if (m < 0 || m >= size)
      throw comm_error(who + ": split " + quoted_text(name) + " names rank " + std::to_string(m) + " outside the group of " +
                       std::to_string(size));
    if (seen[static_cast<std::size_t>(m)])
      throw comm_error(who + ": split " + quoted_text(name) + " names rank " + std::to_string(m) + " twice");
    seen[static_cast<std::size_t>(m)] = true;
    if (m == rank) g.index = static_cast<int>(i);
    g.world_ranks.push_back(parent_world_ranks[static_cast<std::size_t>(m)]);
  }
  if (g.index < 0) throw comm_error(who + ": split " + quoted_text(name) + " of " + rank_list(members) + " leaves this rank out");
  return g;
}

/// How errors name this end of a communicator: its who() where the backend has one.
template <class C>
std::string who_of(const C& c) {
  if constexpr (requires { { c.who() } -> std::convertible_to<std::string>; })
    return c.who();
  else
    return "rank " + std::to_string(c.rank());
}

}  // namespace detail

/// The world plus one sub-communicator per mesh axis: axis(a) holds the ranks that share
/// this rank's other coordinates, ordered by coordinate a (device_mesh::group). Each axis
/// communicator is counted: its collectives go to ledger() (under the site named there).
template <splittable_communicator Comm>
class basic_mesh_communicator {
 public:
  using axis_communicator = counted_communicator<Comm>;

  basic_mesh_communicator(Comm world, const device_mesh& mesh)
      : mesh_(mesh), world_(std::move(world)), ledger_(std::make_unique<collective_ledger>()) {
    if (world_.size() != mesh.num_ranks())
      throw comm_error(detail::who_of(world_) + ": a world of " + std::to_string(world_.size()) +
                       " ranks cannot form " + to_string(mesh) + " (" + std::to_string(mesh.num_ranks()) + " ranks)");
    for (std::size_t a = 0; a < mesh.ndim(); ++a)
      axes_.emplace_back(world_.split(mesh.group(a, world_.rank()), "axis" + std::to_string(a)), ledger_.get(),
                         static_cast<int>(a));
  }
  const device_mesh& mesh() const noexcept { return mesh_; }
  int rank() const noexcept { return world_.rank(); }
  Comm& world() noexcept { return world_; }
  axis_communicator& axis(std::size_t a) { return axes_.at(a); }
  /// The count of this rank's collectives on the axes (the world's are not counted).
  collective_ledger& ledger() noexcept { return *ledger_; }

 private:
  device_mesh mesh_;
  Comm world_;
  std::unique_ptr<collective_ledger> ledger_;  // on the heap: the axes keep its address across moves
  std::vector<axis_communicator> axes_;
};

}  // namespace autoshard

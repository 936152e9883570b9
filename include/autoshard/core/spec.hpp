#pragma once
/// A sharding spec: one placement per mesh axis, plus the tensor's rank.
///   constexpr auto s = autoshard::make_spec(2, {Shard(0), Replicate()});   // [S(0),R] = "S0R"
///   static_assert(s.is_sharded(0) && !s.is_sharded(1));
#include <array>             // std::array
#include <cstdint>           // std::uint8_t
#include <initializer_list>  // std::initializer_list
#include <ostream>           // std::ostream
#include <string>            // std::string

#include "error.hpp"      // spec_error
#include "mesh.hpp"       // max_mesh_rank, device_mesh
#include "placement.hpp"  // placement
#include "shape.hpp"      // max_tensor_rank, tensor_shape

namespace autoshard {

/// Structural (usable as a template argument) and trivially copyable.
struct sharding_spec {
  std::array<placement, max_mesh_rank> placements{};
  std::uint8_t mesh_rank = 0;
  std::uint8_t tensor_rank = 0;

  constexpr const placement& operator[](std::size_t axis) const { return placements[axis]; }
  constexpr placement& operator[](std::size_t axis) { return placements[axis]; }

  constexpr bool is_replicated() const noexcept {
    for (std::size_t i = 0; i < mesh_rank; ++i)
      if (!placements[i].is_replicate()) return false;
    return true;
  }
  constexpr bool has_partial() const noexcept {
    for (std::size_t i = 0; i < mesh_rank; ++i)
      if (placements[i].is_partial()) return true;
    return false;
  }
  constexpr bool is_sharded(int dim) const noexcept {
    for (std::size_t i = 0; i < mesh_rank; ++i)
      if (placements[i].is_shard(dim)) return true;
    return false;
  }
  /// Number of pieces tensor dim `dim` is cut into on mesh `m`.
  constexpr int shard_count(const device_mesh& m, int dim) const noexcept {
    int n = 1;
    for (std::size_t i = 0; i < mesh_rank; ++i)
      if (placements[i].is_shard(dim)) n *= m.size(i);
    return n;
  }
  /// Number of distinct shards over the whole mesh.
  constexpr int num_shards(const device_mesh& m) const noexcept {
    int n = 1;
    for (std::size_t i = 0; i < mesh_rank; ++i)
      if (placements[i].is_shard()) n *= m.size(i);
    return n;
  }
  /// The same spec with `axis` set to `p`.
  constexpr sharding_spec with(std::size_t axis, placement p) const noexcept {
    sharding_spec s = *this;
    s.placements[axis] = p;
    return s;
  }

  friend constexpr bool operator==(const sharding_spec& a, const sharding_spec& b) noexcept {
    if (a.mesh_rank != b.mesh_rank || a.tensor_rank != b.tensor_rank) return false;
    for (std::size_t i = 0; i < a.mesh_rank; ++i)
      if (!(a.placements[i] == b.placements[i])) return false;
    return true;
  }
};

namespace bad_spec {
// Called on error paths only. They are not constexpr, so in a constant expression the
// compiler names them, and the name reads as the message; at run time they throw.
[[noreturn]] inline void shard_dim_outside_tensor_rank(int dim, int tensor_rank) {
  throw spec_error("Shard(" + std::to_string(dim) + ") is outside a tensor of rank " +
                   std::to_string(tensor_rank));
}
[[noreturn]] inline void too_many_mesh_axes(std::size_t n) {
  throw spec_error("a spec has at most 4 mesh axes, got " + std::to_string(n));
}
[[noreturn]] inline void tensor_rank_too_large(std::size_t n) {
  throw spec_error("a tensor has at most 8 dims, got " + std::to_string(n));
}
}  // namespace bad_spec

/// Builds and validates a spec from one placement per mesh axis.
constexpr sharding_spec make_spec(int tensor_rank, std::initializer_list<placement> ps) {
  if (ps.size() > max_mesh_rank) bad_spec::too_many_mesh_axes(ps.size());
  if (tensor_rank < 0 || tensor_rank > static_cast<int>(max_tensor_rank))
    bad_spec::tensor_rank_too_large(static_cast<std::size_t>(tensor_rank));
  sharding_spec s;
  s.tensor_rank = static_cast<std::uint8_t>(tensor_rank);
  for (const placement& p : ps) {
    if (p.is_shard() && (p.dim < 0 || p.dim >= tensor_rank)) bad_spec::shard_dim_outside_tensor_rank(p.dim, tensor_rank);
    s.placements[s.mesh_rank++] = p;
  }
  return s;
}

/// Fully replicated spec.
constexpr sharding_spec replicated_spec(int mesh_rank, int tensor_rank) noexcept {
  sharding_spec s;
  s.mesh_rank = static_cast<std::uint8_t>(mesh_rank);
  s.tensor_rank = static_cast<std::uint8_t>(tensor_rank);
  return s;
}

/// Checks that a spec fits a mesh and a tensor; throws spec_error naming `what`.
inline void check_spec(const sharding_spec& s, const device_mesh& m, const tensor_shape& shape,
                       const std::string& what = "tensor") {
  if (s.mesh_rank != m.ndim())
    throw spec_error(what + ": spec has " + std::to_string(s.mesh_rank) + " mesh axes but the mesh " +
                     to_string(m) + " has " + std::to_string(m.ndim()));
  if (s.tensor_rank != shape.rank)
    throw spec_error(what + ": spec is for a tensor of rank " + std::to_string(s.tensor_rank) +
                     " but the tensor " + to_string(shape) + " has rank " + std::to_string(shape.rank));
  for (std::size_t i = 0; i < s.mesh_rank; ++i)
    if (s[i].is_shard() && (s[i].dim < 0 || s[i].dim >= s.tensor_rank))
      bad_spec::shard_dim_outside_tensor_rank(s[i].dim, s.tensor_rank);
}

}  // namespace autoshard

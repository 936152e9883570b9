#pragma once
/// The typed front end: a sharded tensor described entirely by its type.
///   using W = autoshard::sharded_tensor<float, autoshard::mesh_extents<2, 4>, "RS1", 768, 2304>;
///   static_assert(W::local_shape(5) == autoshard::tensor_shape{768, 576});
///   constexpr auto plan = W::plan_to<"S0R">();          // constant expression
///   static_assert(plan.size() == 2);
/// lower() turns it into plain runtime values (sharded_desc) the other areas consume.
#include <cstddef>      // std::size_t
#include <cstdint>      // std::int32_t
#include <type_traits>  // std::is_same_v

#include "cost.hpp"          // price_plan
#include "dtype.hpp"         // dtype
#include "layout.hpp"        // local_box
#include "mesh.hpp"          // mesh_extents, device_mesh
#include "parse.hpp"         // fixed_string, parse_spec
#include "redistribute.hpp"  // plan_redistribute

namespace autoshard {

/// Two-byte storage tags for half and bfloat16 element types in typed descriptions.
struct f16_t {
  std::uint16_t bits;
};
struct bf16_t {
  std::uint16_t bits;
};

template <class T>
inline constexpr bool is_element_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, f16_t> ||
    std::is_same_v<T, bf16_t> || std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> ||
    std::is_same_v<T, std::uint8_t> || std::is_same_v<T, bool>;

template <class T>
concept element_type = is_element_type_v<T>;

template <element_type T>
constexpr dtype dtype_of() noexcept {
  if constexpr (std::is_same_v<T, float>) return dtype::f32;
  else if constexpr (std::is_same_v<T, double>) return dtype::f64;
  else if constexpr (std::is_same_v<T, f16_t>) return dtype::f16;
  else if constexpr (std::is_same_v<T, bf16_t>) return dtype::bf16;
  else if constexpr (std::is_same_v<T, std::int32_t>) return dtype::i32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return dtype::i64;
  else if constexpr (std::is_same_v<T, bool>) return dtype::boolean;
  else return dtype::u8;
}

template <class M>
inline constexpr bool is_mesh_extents_v = false;
template <std::size_t... S>
inline constexpr bool is_mesh_extents_v<mesh_extents<S...>> = true;

/// The runtime description a typed tensor lowers to.
struct sharded_desc {
  tensor_shape shape;
  dtype type = dtype::f32;
  sharding_spec spec;
  friend constexpr bool operator==(const sharded_desc&, const sharded_desc&) = default;
};

namespace detail {
// Not constexpr: at compile time its name is the message.
[[noreturn]] inline void links_do_not_match_the_mesh(const device_mesh& links, const device_mesh& mesh) {
  throw shape_error("cost_to: the link mesh " + to_string(links) + " does not have the sizes of the tensor's mesh " +
                    to_string(mesh));
}
}  // namespace detail

template <class T, class Mesh, fixed_string Spec, std::size_t... Global>
class sharded_tensor {
  static_assert(is_element_type_v<T>,
                "autoshard: sharded_tensor's element type must be float, double, f16_t, bf16_t, "
                "int32_t, int64_t, uint8_t or bool");
  static_assert(is_mesh_extents_v<Mesh>, "autoshard: sharded_tensor's Mesh must be a mesh_extents<...>");
  static_assert(sizeof...(Global) <= max_tensor_rank, "autoshard: a tensor has at most 8 dims");

 public:
  using element_type = T;
  using mesh_type = Mesh;
  static constexpr dtype type = dtype_of<T>();
  static constexpr tensor_shape global_shape{static_cast<std::int64_t>(Global)...};
  /// Parsed in the context of the mesh's and the tensor's rank: errors are compile errors.
  static constexpr sharding_spec spec =
      parse_spec(Spec.view(), static_cast<int>(Mesh::rank()), static_cast<int>(sizeof...(Global)));

  static constexpr sharded_desc lower() noexcept { return {global_shape, type, spec}; }

  /// Local shard of `rank` on a runtime mesh (any mesh_extents).
  static constexpr shard_box local_box(const Mesh& m, int rank) {
    return autoshard::local_box(device_mesh(m), spec, global_shape, rank);
  }
  /// Local shard of `rank` when every mesh size is static: a constant expression.
  static constexpr shard_box local_box(int rank) requires(Mesh::is_static()) {
    return autoshard::local_box(device_mesh(Mesh{}), spec, global_shape, rank);
  }
  static constexpr tensor_shape local_shape(int rank) requires(Mesh::is_static()) {
    return local_box(rank).shape;
  }
  /// Elements of the largest local shard: what a rank must allocate.
  static constexpr std::int64_t max_local_elements() requires(Mesh::is_static()) {
    return max_local_shape(device_mesh(Mesh{}), spec, global_shape).numel();
  }

  /// The redistribute plan to another spec, parsed in the same context.
  template <fixed_string To>
  static constexpr redist_plan plan_to() {
    constexpr sharding_spec to =
        parse_spec(To.view(), static_cast<int>(Mesh::rank()), static_cast<int>(sizeof...(Global)));
    if constexpr (Mesh::is_static()) return plan_redistribute(device_mesh(Mesh{}), spec, to, global_shape);
    else return plan_redistribute(spec, to);
  }
  /// Its alpha-beta cost on a static mesh with the given link model per axis (seconds).
  /// `links` must have the mesh's sizes; only its link models are new.
  template <fixed_string To>
  static constexpr plan_cost cost_to(const device_mesh& links) requires(Mesh::is_static()) {
    const device_mesh mine(Mesh{});
    bool same = links.ndim() == mine.ndim();
    for (std::size_t i = 0; same && i < mine.ndim(); ++i) same = links.size(i) == mine.size(i);
    if (!same) detail::links_do_not_match_the_mesh(links, mine);
    constexpr sharding_spec to =
        parse_spec(To.view(), static_cast<int>(Mesh::rank()), static_cast<int>(sizeof...(Global)));
    return price_plan(links, plan_redistribute(links, spec, to, global_shape), global_shape, type);
  }
};

}  // namespace autoshard

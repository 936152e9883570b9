#pragma once
/// Redistribute plans: the ordered collectives that turn one spec into another, in
/// DTensor's default order (undo mismatched inner axes last-to-first, then re-shard
/// first-to-last). The structure depends only on the placements (and which mesh axes
/// have size 1), so with static specs the plan is a constant expression:
///   constexpr auto p = autoshard::plan_redistribute("[S(0),S(0)]"_spec, "[R,S(0)]"_spec);
///   static_assert(p.size() == 3 && p[0].mesh_axis == 1 && p[0].kind == autoshard::collective::all_gather);
#include <array>    // std::array
#include <cstdint>  // std::uint8_t
#include <ostream>  // std::ostream
#include <string>   // std::string

#include "checked.hpp"    // ceil_div
#include "error.hpp"      // spec_error
#include "mesh.hpp"       // device_mesh
#include "parse.hpp"      // to_string(sharding_spec)
#include "placement.hpp"  // placement
#include "shape.hpp"      // tensor_shape
#include "spec.hpp"       // sharding_spec

namespace autoshard {

/// The transition one step performs on one mesh axis.
enum class collective : std::uint8_t {
  all_gather,      ///< S(d) -> R
  all_reduce,      ///< P -> R
  reduce_scatter,  ///< P -> S(d)
  all_to_all,      ///< S(d) -> S(e)
  local_slice,     ///< R -> S(d): keep one's own piece, no communication
  local_partial,   ///< R -> P: rank 0 of the axis keeps the value, others hold the identity (sum)
};

constexpr std::string_view to_string(collective c) noexcept {
  switch (c) {
    case collective::all_gather: return "all-gather";
    case collective::all_reduce: return "all-reduce";
    case collective::reduce_scatter: return "reduce-scatter";
    case collective::all_to_all: return "all-to-all";
    case collective::local_slice: return "local-slice";
    case collective::local_partial: return "local-partial";
  }
  return "?";
}

constexpr bool is_communication(collective c) noexcept {
  return c != collective::local_slice && c != collective::local_partial;
}

/// One step on one mesh axis.
struct redist_step {
  std::uint8_t mesh_axis = 0;
  collective kind = collective::local_slice;
  placement from;         ///< placement on mesh_axis before the step
  placement to;           ///< placement on mesh_axis after the step
  sharding_spec before;   ///< whole spec before the step
  sharding_spec after;    ///< whole spec after the step
  /// Tensor dim gathered (all-gather), scattered (reduce-scatter, local slice) or, for
  /// all-to-all, the dim that was split before; -1 if none.
  constexpr int src_dim() const noexcept { return from.is_shard() ? from.dim : -1; }
  constexpr int dst_dim() const noexcept { return to.is_shard() ? to.dim : -1; }
};

/// At most one hierarchical-reduction step, one undo and one re-shard step per mesh axis.
struct redist_plan {
  static constexpr std::size_t capacity = 3 * max_mesh_rank;
  sharding_spec src;
  sharding_spec dst;
  std::array<redist_step, capacity> steps{};
  std::uint8_t count = 0;

  constexpr std::size_t size() const noexcept { return count; }
  constexpr bool empty() const noexcept { return count == 0; }
  constexpr const redist_step& operator[](std::size_t i) const { return steps[i]; }
  constexpr const redist_step* begin() const noexcept { return steps.data(); }
  constexpr const redist_step* end() const noexcept { return steps.data() + count; }
  /// Number of steps that move data between ranks.
  constexpr std::size_t communication_steps() const noexcept {
    std::size_t n = 0;
    for (const auto& s : *this) n += is_communication(s.kind) ? 1 : 0;
    return n;
  }
};

namespace bad_redistribute {
// Not constexpr: at compile time the compiler names them and the name reads as the message.
[[noreturn]] inline void shard_to_partial(int axis) {
  throw spec_error("cannot redistribute Shard to Partial on mesh axis " + std::to_string(axis) +
                   " (a shard holds no partial value); go through Replicate explicitly");
}
[[noreturn]] inline void partial_to_different_partial(int axis) {
  throw spec_error("cannot redistribute Partial(op) into a different Partial on mesh axis " +
                   std::to_string(axis) + "; reduce to Replicate first");
}
[[noreturn]] inline void specs_have_different_mesh_rank(int a, int b) {
  throw spec_error("cannot redistribute between specs for meshes of " + std::to_string(a) + " and " +
                   std::to_string(b) + " axes");
}
[[noreturn]] inline void specs_have_different_tensor_rank(int a, int b) {
  throw spec_error("cannot redistribute between specs for tensors of rank " + std::to_string(a) + " and " +
                   std::to_string(b));
}
}  // namespace bad_redistribute

namespace detail {
constexpr collective classify(placement from, placement to, int axis) {
  if (from.is_shard() && to.is_replicate()) return collective::all_gather;
  if (from.is_partial() && to.is_replicate()) return collective::all_reduce;
  if (from.is_partial() && to.is_shard()) return collective::reduce_scatter;
  if (from.is_shard() && to.is_shard()) return collective::all_to_all;
  if (from.is_replicate() && to.is_shard()) return collective::local_slice;
  if (from.is_replicate() && to.is_partial()) return collective::local_partial;
  if (from.is_shard() && to.is_partial()) bad_redistribute::shard_to_partial(axis);
  bad_redistribute::partial_to_different_partial(axis);
}
}  // namespace detail

/// What the planner may know about the mesh and the tensor beyond the placements.
struct plan_context {
  const int* axis_sizes = nullptr;  ///< one per mesh axis; size-1 axes are skipped
  /// Mesh axes fastest first (a permutation); null: the inner (higher) axis is the faster,
  /// as in make_mesh_2d where axis 0 crosses nodes.
  const int* fastest_first = nullptr;
  /// The global shape, to choose the dim a hierarchical reduction scatters on (the one
  /// with the most local elements); null: the lowest-numbered free dim.
  const tensor_shape* shape = nullptr;
};

namespace detail {

constexpr int axis_size(const plan_context& c, int axis) noexcept {
  return c.axis_sizes == nullptr ? 2 : c.axis_sizes[axis];
}

/// A step on `axis` that puts Shard(d) there (local slice, reduce-scatter or the scatter
/// half of an all-to-all) stays inside the axis group only if no inner axis already splits
/// d: the chunk rule nests inner axes inside outer ones.
constexpr bool can_scatter(const sharding_spec& cur, int axis, int d) noexcept {
  for (int b = axis + 1; b < cur.mesh_rank; ++b)
    if (cur[static_cast<std::size_t>(b)].is_shard(d)) return false;
  return true;
}

/// Local extent of dim d under `cur` (ceil-divided by every axis that splits it).
constexpr std::int64_t local_extent(const sharding_spec& cur, const plan_context& c, int d) noexcept {
  std::int64_t n = (*c.shape)[static_cast<std::size_t>(d)];
  for (int b = 0; b < cur.mesh_rank; ++b)
    if (cur[static_cast<std::size_t>(b)].is_shard(d)) {
      const int k = axis_size(c, b);
      n = ceil_div(n, k);
    }
  return n;
}

}  // namespace detail

namespace detail {

/// A redistribute plan being built: the spec reached so far and the steps that reach it.
struct plan_builder {
  redist_plan plan;
  sharding_spec cur;
  const int* axis_sizes = nullptr;

  /// One step on `axis` to `to` (a size-1 axis never communicates: only relabelled).
  constexpr void push(int axis, placement to) {
    const placement from = cur[static_cast<std::size_t>(axis)];
    const sharding_spec next = cur.with(static_cast<std::size_t>(axis), to);
    if (axis_sizes == nullptr || axis_sizes[axis] > 1) {
      redist_step st;
      st.mesh_axis = static_cast<std::uint8_t>(axis);
      st.kind = classify(from, to, axis);
      st.from = from;
      st.to = to;
      st.before = cur;
      st.after = next;
      plan.steps[plan.count++] = st;
    }
    cur = next;
  }
};

/// Rejects a transition no order of steps can make: Shard to Partial, Partial to another Partial.
constexpr void check_transitions(const sharding_spec& src, const sharding_spec& dst) {
  const int n = src.mesh_rank;
  for (int i = 0; i < n; ++i) {
    const placement& a = src[static_cast<std::size_t>(i)];
    const placement& b = dst[static_cast<std::size_t>(i)];
    if (a == b) continue;
    if (a.is_shard() && b.is_partial()) bad_redistribute::shard_to_partial(i);
    if (a.is_partial() && b.is_partial()) bad_redistribute::partial_to_different_partial(i);
  }
}

/// The hierarchical reduction of the Partial axes that the target settles (Replicate or
/// Shard), when there are two or more: reduce-scatter on the faster axes, then the slowest.
constexpr void reduce_hierarchically(plan_builder& b, const sharding_spec& src, const sharding_spec& dst, const plan_context& ctx) {
  const int n = src.mesh_rank;
  std::array<int, max_mesh_rank> order{};
  for (int i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = ctx.fastest_first ? ctx.fastest_first[i] : n - 1 - i;
  std::array<int, max_mesh_rank> red{};
  int nred = 0;
  for (int i = 0; i < n; ++i) {
    const int a = order[static_cast<std::size_t>(i)];
    if (b.cur[static_cast<std::size_t>(a)].is_partial() && !dst[static_cast<std::size_t>(a)].is_partial() &&
        detail::axis_size(ctx, a) > 1)
      red[static_cast<std::size_t>(nred++)] = a;
  }
  if (nred >= 2 && src.tensor_rank > 0) {
    const int slow = red[static_cast<std::size_t>(nred - 1)];
    const placement slow_dst = dst[static_cast<std::size_t>(slow)];
    bool reduced_any = false;
    for (int i = 0; i + 1 < nred; ++i) {
      const int a = red[static_cast<std::size_t>(i)];
      const int k = detail::axis_size(ctx, a);
      // Candidate dims: the axis's own target dim first, then the others; a dim is usable when
      // the step stays in the group, the slow axis can still scatter its own target dim, and
      // (with the shape known) it has at least k elements, so padding never outweighs data.
      int best = -1;
      std::int64_t best_extent = -1;
      for (int d = 0; d < src.tensor_rank; ++d) {
        if (!detail::can_scatter(b.cur, a, d)) continue;
        if (slow_dst.is_shard(d) && a > slow) continue;
        const std::int64_t ext = ctx.shape ? detail::local_extent(b.cur, ctx, d) : 1;
        if (ctx.shape && ext < k) continue;
        const bool own = dst[static_cast<std::size_t>(a)].is_shard(d);
        if (own) {
          best = d;
          break;
        }
        if (ext > best_extent) best = d, best_extent = ext;
      }
      if (best < 0) continue;  // no dim to scatter on: this axis is all-reduced in its turn
      b.push(a, Shard(best));
      reduced_any = true;
    }
    if (reduced_any) {
      const bool scatter = slow_dst.is_shard() && detail::can_scatter(b.cur, slow, slow_dst.dim) &&
                           (!ctx.shape || detail::local_extent(b.cur, ctx, slow_dst.dim) >= detail::axis_size(ctx, slow));
      b.push(slow, scatter ? slow_dst : Replicate());
    }
  }
}

/// DTensor's order: undo mismatched inner axes last-to-first, then re-shard first-to-last.
constexpr void reshard_in_dtensor_order(plan_builder& b, const sharding_spec& dst) {
  const int n = dst.mesh_rank;
  // DTensor runs the inner-to-outer pass only when the source has more than one shard, so a
  // Shard on a size-1 axis alone does not count (it would only change the order of steps).
  bool cur_sharded = false;
  for (int i = 0; i < n; ++i)
    cur_sharded = cur_sharded || (b.cur[static_cast<std::size_t>(i)].is_shard() &&
                                  (b.axis_sizes == nullptr || b.axis_sizes[i] > 1));
  if (cur_sharded) {
    // Inner to outer: a target Shard(d) whose outer sharding of d differs from the
    // current one must be replicated first to clear the nested sharding.
    for (int axis = n - 1; axis >= 0; --axis) {
      placement current = b.cur[static_cast<std::size_t>(axis)];
      placement target = dst[static_cast<std::size_t>(axis)];
      if (target.is_shard()) {
        bool misaligned = false;
        for (int i = 0; i < axis; ++i)
          misaligned = misaligned || (b.cur[static_cast<std::size_t>(i)].is_shard(target.dim) !=
                                      dst[static_cast<std::size_t>(i)].is_shard(target.dim));
        if (misaligned) target = Replicate();
      }
      if (!(current == target)) b.push(axis, target);
    }
  }
  for (int axis = 0; axis < n; ++axis) {
    placement current = b.cur[static_cast<std::size_t>(axis)];
    placement target = dst[static_cast<std::size_t>(axis)];
    if (!(current == target)) b.push(axis, target);
  }
}

}  // namespace detail

/// The plan from `src` to `dst`, given what `ctx` says about the mesh and the tensor.
///
/// Partial axes that are reduced over several mesh axes at once are reduced hierarchically,
/// as NCCL and every tuned runtime do: reduce-scatter on the faster axes (fastest first, each
/// on a tensor dim it can split), then one all-reduce (or reduce-scatter, when the target
/// shards that axis) on the slowest axis over the 1/k that is left, after which the rest of
/// the plan gathers back what the target does not keep split. Everything else follows
/// DTensor's order: undo mismatched inner axes last-to-first, then re-shard first-to-last.
/// Every step stays inside its axis group under the chunk rule, so a plan always runs.
constexpr redist_plan plan_redistribute(const sharding_spec& src, const sharding_spec& dst, const plan_context& ctx) {
  if (src.mesh_rank != dst.mesh_rank) bad_redistribute::specs_have_different_mesh_rank(src.mesh_rank, dst.mesh_rank);
  if (src.tensor_rank != dst.tensor_rank)
    bad_redistribute::specs_have_different_tensor_rank(src.tensor_rank, dst.tensor_rank);
  detail::check_transitions(src, dst);  // whatever the order would be
  detail::plan_builder b;
  b.plan.src = src;
  b.plan.dst = dst;
  b.cur = src;
  b.axis_sizes = ctx.axis_sizes;
  detail::reduce_hierarchically(b, src, dst, ctx);
  detail::reshard_in_dtensor_order(b, dst);
  return b.plan;
}

/// The plan from `src` to `dst`. `axis_sizes` (optional, one per mesh axis) lets size-1
/// axes be skipped: they never communicate, the placement is simply relabelled. Without a
/// mesh the inner axis counts as the faster one.
constexpr redist_plan plan_redistribute(const sharding_spec& src, const sharding_spec& dst,
                                        const int* axis_sizes = nullptr) {
  plan_context c;
  c.axis_sizes = axis_sizes;
  return plan_redistribute(src, dst, c);
}

/// The same on mesh `m`: its size-1 axes are skipped and its links say which axes are fast.
/// With the global `shape`, a hierarchical reduction scatters on the dim with the most local
/// elements (the plan that prices and executes a tensor; comm and the pass use this one).
constexpr redist_plan plan_redistribute(const device_mesh& m, const sharding_spec& src, const sharding_spec& dst,
                                        const tensor_shape* shape = nullptr) {
  std::array<int, max_mesh_rank> sizes{};
  for (std::size_t i = 0; i < m.ndim(); ++i) sizes[i] = m.size(i);
  if (src.mesh_rank != m.ndim())
    bad_redistribute::specs_have_different_mesh_rank(src.mesh_rank, static_cast<int>(m.ndim()));
  const std::array<int, max_mesh_rank> order = axes_fastest_first(m);
  plan_context c;
  c.axis_sizes = sizes.data();
  c.fastest_first = order.data();
  c.shape = shape != nullptr && shape->rank == src.tensor_rank ? shape : nullptr;
  return plan_redistribute(src, dst, c);
}
constexpr redist_plan plan_redistribute(const device_mesh& m, const sharding_spec& src, const sharding_spec& dst,
                                        const tensor_shape& shape) {
  return plan_redistribute(m, src, dst, &shape);
}

inline std::ostream& operator<<(std::ostream& os, const redist_step& s) {
  return os << "axis " << int(s.mesh_axis) << ": " << to_string(s.kind) << " " << to_string(s.from) << " -> "
            << to_string(s.to);
}
inline std::ostream& operator<<(std::ostream& os, const redist_plan& p) {
  os << to_string(p.src) << " -> " << to_string(p.dst) << ":";
  if (p.empty()) os << " (no steps)";
  for (const auto& s : p) os << "\n  " << s;
  return os;
}

}  // namespace autoshard

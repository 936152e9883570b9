#pragma once
/// Cost of collectives and of whole redistribute plans, in seconds: NCCL's model, with the
/// link of the step's mesh axis (alpha per collective, hop per algorithm step, beta bytes/s),
/// k ranks on the axis and B bytes:
///   all-gather (B = gathered size)      alpha + (k-1) hop + (k-1)/k * B / beta
///   reduce-scatter (B = input size)     alpha + (k-1) hop + (k-1)/k * B / beta
///   all-reduce (B = buffer size)        alpha + 2(k-1) hop + 2 (k-1)/k * B / beta
///   all-to-all (B = input size)         alpha + (k-1) hop + (k-1)/k * B / beta   (ring volume, no penalty)
///   local slice / local partial         0
/// B / time is what nccl-tests calls algbw; the volume factor times algbw is its busbw
/// ((k-1)/k for all-gather and reduce-scatter, 2(k-1)/k for all-reduce), so beta is the
/// busbw a link sustains. A collective over several mesh axes is several steps of the plan
/// (core/redistribute.hpp): a reduction is reduce-scatter on the fast axes, all-reduce on the
/// slowest over what is left, all-gather back; hierarchical_all_reduce_seconds prices one
/// without a plan (gradient buckets).
/// Uneven shards are padded to ceil(n/k) for the collective; padding counts as bytes.
/// Sizes are taken at mesh coordinate 0, which holds the largest shard under the chunk rule.
///   constexpr auto m = autoshard::make_mesh_2d(2, 4, 25e9, 300e9);
///   constexpr auto c = autoshard::price_plan(
///       m, autoshard::plan_redistribute(m, autoshard::parse_spec("S0R", 2), autoshard::parse_spec("RR", 2)),
///       {1024, 768}, autoshard::dtype::f32);   // one all-gather over the 2 nodes, c.seconds ~ 83 us
#include <array>    // std::array
#include <cstdint>  // std::int64_t

#include "checked.hpp"       // checked_mul, checked_numel
#include "dtype.hpp"         // dtype, dtype_size
#include "layout.hpp"        // local_box, padded_piece
#include "mesh.hpp"          // device_mesh, link_model
#include "redistribute.hpp"  // redist_plan, collective

namespace autoshard {

/// Steps of the ring algorithm of the collective over k ranks (each pays the link's hop).
constexpr int algorithm_steps(collective kind, int k) noexcept {
  if (k <= 1 || !is_communication(kind)) return 0;
  return kind == collective::all_reduce ? 2 * (k - 1) : k - 1;
}

/// Time of one collective of `bytes` (as defined per kind above) over k ranks.
constexpr double collective_time(collective kind, const link_model& link, int k, double bytes) noexcept {
  if (k <= 1 || !is_communication(kind)) return 0.0;
  const double frac = static_cast<double>(k - 1) / static_cast<double>(k);
  const double latency = link.alpha + algorithm_steps(kind, k) * link.hop;
  switch (kind) {
    case collective::all_reduce: return latency + 2.0 * frac * bytes / link.beta;
    case collective::all_gather:
    case collective::reduce_scatter:
    case collective::all_to_all: return latency + frac * bytes / link.beta;
    default: return 0.0;
  }
}

/// Bytes one rank sends in a ring implementation of the collective.
constexpr double bytes_sent_per_rank(collective kind, int k, double bytes) noexcept {
  if (k <= 1 || !is_communication(kind)) return 0.0;
  const double frac = static_cast<double>(k - 1) / static_cast<double>(k);
  return kind == collective::all_reduce ? 2.0 * frac * bytes : frac * bytes;
}

/// One step with its sizes and time.
struct priced_step {
  redist_step step;
  int group_size = 1;           ///< ranks on the step's mesh axis
  std::int64_t bytes = 0;       ///< B of the formula, padding included
  std::int64_t sent_bytes = 0;  ///< bytes each rank sends
  double seconds = 0.0;
};

struct plan_cost {
  std::array<priced_step, redist_plan::capacity> steps{};
  std::uint8_t count = 0;
  double seconds = 0.0;
  std::int64_t sent_bytes = 0;  ///< total bytes each rank sends over all steps

  constexpr std::size_t size() const noexcept { return count; }
  constexpr const priced_step* begin() const noexcept { return steps.data(); }
  constexpr const priced_step* end() const noexcept { return steps.data() + count; }
  constexpr const priced_step& operator[](std::size_t i) const { return steps[i]; }
};

namespace detail {
constexpr std::int64_t elems_with(tensor_shape s, int dim, std::int64_t v) {
  s[static_cast<std::size_t>(dim)] = v;
  return checked_numel(s, "elements moved by a collective");
}
/// ceil(n / k) * k: n padded to a multiple of k, checked.
constexpr std::int64_t padded_total(std::int64_t n, int k) {
  return checked_mul(padded_piece(n, k), k, "a dim padded for a collective");
}
}  // namespace detail

/// Sizes and time of one step for a tensor of global shape `global`.
constexpr priced_step price_step(const device_mesh& m, const redist_step& st, const tensor_shape& global, dtype t) {
  priced_step p;
  p.step = st;
  const int k = m.size(st.mesh_axis);
  p.group_size = k;
  const auto esz = static_cast<std::int64_t>(dtype_size(t));
  const tensor_shape before = local_box(m, st.before, global, 0).shape;
  const tensor_shape after = local_box(m, st.after, global, 0).shape;
  std::int64_t elems = 0;
  switch (st.kind) {
    case collective::all_gather: {  // gathered size, each piece padded to ceil(n/k)
      const int d = st.src_dim();
      elems = detail::elems_with(after, d, detail::padded_total(after[static_cast<std::size_t>(d)], k));
      break;
    }
    case collective::all_reduce: elems = checked_numel(before, "elements moved by a collective"); break;
    case collective::reduce_scatter: {  // input size, padded to a multiple of k
      const int d = st.dst_dim();
      elems = detail::elems_with(before, d, detail::padded_total(before[static_cast<std::size_t>(d)], k));
      break;
    }
    case collective::all_to_all: {  // input: split dim padded, new split dim padded to a multiple of k
      const int a = st.src_dim(), b = st.dst_dim();
      tensor_shape in = before;
      in[static_cast<std::size_t>(a)] = padded_piece(after[static_cast<std::size_t>(a)], k);
      in[static_cast<std::size_t>(b)] = detail::padded_total(before[static_cast<std::size_t>(b)], k);
      elems = checked_numel(in, "elements moved by a collective");
      break;
    }
    default: elems = 0;
  }
  p.bytes = is_communication(st.kind) && k > 1 ? checked_mul(elems, esz, "bytes moved by a collective") : 0;
  const double sent = bytes_sent_per_rank(st.kind, k, static_cast<double>(p.bytes));  // up to 2 B
  if (sent >= 9.2e18) (void)checked_mul(p.bytes, 2, "bytes each rank sends in an all-reduce");
  p.sent_bytes = static_cast<std::int64_t>(sent);
  p.seconds = collective_time(st.kind, m.link(st.mesh_axis), k, static_cast<double>(p.bytes));
  return p;
}

/// Every step priced, and the total.
constexpr plan_cost price_plan(const device_mesh& m, const redist_plan& plan, const tensor_shape& global, dtype t) {
  plan_cost c;
  for (const redist_step& st : plan) {
    priced_step p = price_step(m, st, global, t);
    c.seconds += p.seconds;
    c.sent_bytes = checked_add(c.sent_bytes, p.sent_bytes, "bytes each rank sends");
    c.steps[c.count++] = p;
  }
  return c;
}

/// An all-reduce of `bytes` over the mesh axes in `axes` (a bit per axis), hierarchically:
/// reduce-scatter on each faster axis (fastest first, each on what the previous left), one
/// all-reduce on the slowest over B / (product of the faster sizes), all-gather back in the
/// reverse order. Bytes are not padded (a flat buffer, as a gradient bucket is).
///   2x4, 25 / 300 GB/s, 128 MiB:  RS(axis 1, B) + AR(axis 0, B/4) + AG(axis 1, B)
constexpr double hierarchical_all_reduce_seconds(const device_mesh& m, unsigned axes, double bytes) noexcept {
  const std::array<int, max_mesh_rank> order = axes_fastest_first(m);
  std::array<int, max_mesh_rank> use{};
  int n = 0;
  for (std::size_t i = 0; i < m.ndim(); ++i) {
    const int a = order[i];
    if ((axes >> a) & 1u && m.size(static_cast<std::size_t>(a)) > 1) use[static_cast<std::size_t>(n++)] = a;
  }
  double t = 0.0, b = bytes;
  for (int i = 0; i < n; ++i) {
    const auto a = static_cast<std::size_t>(use[static_cast<std::size_t>(i)]);
    const int k = m.size(a);
    if (i + 1 == n) {
      t += collective_time(collective::all_reduce, m.link(a), k, b);
    } else {
      t += 2.0 * collective_time(collective::reduce_scatter, m.link(a), k, b);  // and its all-gather
      b /= k;
    }
  }
  return t;
}

/// Plan and price in one call: the cost of turning `src` into `dst`.
constexpr double redistribute_seconds(const device_mesh& m, const sharding_spec& src, const sharding_spec& dst,
                                      const tensor_shape& global, dtype t) {
  return price_plan(m, plan_redistribute(m, src, dst, global), global, t).seconds;
}

}  // namespace autoshard

#pragma once
/// Cutting a global host tensor into a rank's shard and gathering shards back.
/// A rank's shard is described by a shard_layout: blocks of the global tensor (from core's
/// local_box) concatenated along one dim, so fused projections (QKV) use the same code.
/// Copies are block copies: one memcpy per longest contiguous inner run.
///   autoshard::device_mesh m{2, 4};
///   auto s = autoshard::shard_of(global.view(), m, "S01R"_spec, 5);   // rank 5's block
///   auto g = autoshard::gather(shard_views, m, "S01R"_spec, global.shape());
#include <cstddef>  // std::size_t
#include <cstdint>  // std::int64_t
#include <cstring>  // std::memcpy
#include <optional> // std::optional
#include <span>     // std::span
#include <string>   // std::string
#include <vector>   // std::vector

#include "../core/error.hpp"   // shape_error, spec_error
#include "../core/layout.hpp"  // local_box, split_rule, shard_box, fused_dim
#include "../core/mesh.hpp"    // device_mesh
#include "../core/parse.hpp"   // to_string(sharding_spec)
#include "../core/spec.hpp"    // sharding_spec, check_spec
#include "host_tensor.hpp"     // host_tensor, tensor_view

namespace autoshard {

/// One block of the global tensor: `shape` elements starting at `offset`.
struct shard_piece {
  tensor_shape offset;
  tensor_shape shape;
  friend bool operator==(const shard_piece&, const shard_piece&) = default;
};

/// A rank's local shard: the pieces, in order, concatenated along `concat_dim`.
/// A plain spec has one piece (core's local_box); a fused QKV block has one per part.
struct shard_layout {
  tensor_shape shape;  ///< the local shard's shape
  int concat_dim = 0;
  std::vector<shard_piece> pieces;
};

/// The layout of `rank`'s shard when dim `d` of `global` is the concatenation of parts of
/// `part_sizes` (summing to global[d]) and spec `s` cuts each part on its own: one piece per
/// part (core's local_box of the part, moved to where the part starts), concatenated along d.
/// The one home of the fused (per part) cut: tensor-parallel policies (QKV, GQA, gate/up) and
/// plans over fused tensors (fused_dim) both use it.
inline shard_layout parts_layout(const device_mesh& m, const sharding_spec& s, const tensor_shape& global, int d,
                                 std::span<const std::int64_t> part_sizes, int rank, split_rule rule = split_rule::chunk) {
  const auto du = static_cast<std::size_t>(d);
  shard_layout l;
  l.concat_dim = d;
  l.shape = global;
  l.shape[du] = 0;
  std::int64_t start = 0;
  for (std::int64_t size : part_sizes) {
    tensor_shape part = global;
    part[du] = size;
    shard_box b = local_box(m, s, part, rank, rule);
    b.offset[du] += start;
    l.pieces.push_back({b.offset, b.shape});
    for (std::size_t i = 0; i < global.rank; ++i) l.shape[i] = i == du ? l.shape[i] + b.shape[i] : b.shape[i];  // other dims as cut
    start += size;
  }
  if (start != global[du])
    throw shape_error("parts of " + std::to_string(start) + " in all do not make dim " + std::to_string(d) + " of " +
                      to_string(global));
  return l;
}

/// The layout of `rank`'s shard of a tensor with spec `s` on mesh `m`: one piece (local_box),
/// or, when `fused` names a dim that `s` cuts, one piece per fused part (parts_layout).
inline shard_layout spec_layout(const device_mesh& m, const sharding_spec& s, const tensor_shape& global, int rank,
                                split_rule rule = split_rule::chunk, fused_dim fused = {}) {
  check_spec(s, m, global);
  if (s.has_partial())
    throw spec_error("spec " + to_string(s) + " has a Partial placement; a stored tensor cannot be partial");
  if (fused.any() && fused.dim < static_cast<int>(global.rank) && s.is_sharded(fused.dim)) {
    if (!fused_parts_divide(m, s, global, fused))
      throw shape_error("spec " + to_string(s) + " cuts dim " + std::to_string(fused.dim) + " of " + to_string(global) +
                        ", made of " + std::to_string(fused.parts) + " fused parts, into pieces that are not equal");
    const std::vector<std::int64_t> parts(static_cast<std::size_t>(fused.parts),
                                          global[static_cast<std::size_t>(fused.dim)] / fused.parts);
    return parts_layout(m, s, global, fused.dim, parts, rank, rule);
  }
  shard_box b = local_box(m, s, global, rank, rule);
  return {b.shape, 0, {{b.offset, b.shape}}};
}

namespace detail {
inline void row_major_strides(const tensor_shape& s, std::int64_t* out) noexcept {
  std::int64_t st = 1;
  for (std::size_t i = s.rank; i-- > 0;) {
    out[i] = st;
    st *= s[i];
  }
}
[[noreturn]] inline void box_outside(const char* which, const tensor_shape& off, const tensor_shape& ext,
                                     const tensor_shape& shape) {
  throw shape_error(std::string("copy_block: ") + which + " box at " + to_string(off) + " of extent " +
                    to_string(ext) + " is outside a tensor of shape " + to_string(shape));
}
}  // namespace detail

/// Copies the block `extent` at `src_offset` of `src` to `dst_offset` of `dst` (same dtype).
/// The innermost dims that are whole in both tensors are merged into one memcpy run.
inline void copy_block(const_tensor_view src, const tensor_shape& src_offset, tensor_view dst,
                       const tensor_shape& dst_offset, const tensor_shape& extent) {
  if (src.type() != dst.type())
    throw shape_error("copy_block: dtype " + std::string(to_string(src.type())) + " into " +
                      std::string(to_string(dst.type())));
  const std::size_t R = src.shape().rank;
  if (dst.shape().rank != R || extent.rank != R || src_offset.rank != R || dst_offset.rank != R)
    throw shape_error("copy_block: ranks differ (src " + to_string(src.shape()) + ", dst " +
                      to_string(dst.shape()) + ", extent " + to_string(extent) + ")");
  for (std::size_t d = 0; d < R; ++d) {  // offset > size - extent: offset + extent overflowed for 2^63-1
    if (extent[d] < 0 || src_offset[d] < 0 || src_offset[d] > src.shape()[d] - extent[d])
      detail::box_outside("source", src_offset, extent, src.shape());
    if (dst_offset[d] < 0 || dst_offset[d] > dst.shape()[d] - extent[d])
      detail::box_outside("destination", dst_offset, extent, dst.shape());
  }
  const std::int64_t esz = static_cast<std::int64_t>(dtype_size(src.type()));
  if (extent.numel() == 0) return;
  if (R == 0) {
    std::memcpy(dst.data(), src.data(), static_cast<std::size_t>(esz));
    return;
  }
  std::int64_t ss[max_tensor_rank], ds[max_tensor_rank];
  detail::row_major_strides(src.shape(), ss);
  detail::row_major_strides(dst.shape(), ds);
  // Dims [inner, R) form one contiguous run in both tensors.
  std::size_t inner = R - 1;
  std::int64_t run = extent[inner];
  while (inner > 0 && extent[inner] == src.shape()[inner] && extent[inner] == dst.shape()[inner]) {
    --inner;
    run *= extent[inner];
  }
  const std::size_t run_bytes = static_cast<std::size_t>(run * esz);
  std::int64_t s0 = 0, d0 = 0;
  for (std::size_t d = 0; d < R; ++d) {
    s0 += src_offset[d] * ss[d];
    d0 += dst_offset[d] * ds[d];
  }
  const std::byte* sp = src.data() + s0 * esz;
  std::byte* dp = dst.data() + d0 * esz;
  if (inner == 0) {
    std::memcpy(dp, sp, run_bytes);
    return;
  }
  // Odometer over the outer dims [0, inner).
  std::int64_t idx[max_tensor_rank] = {};
  for (;;) {
    std::int64_t so = 0, dof = 0;
    for (std::size_t d = 0; d < inner; ++d) {
      so += idx[d] * ss[d];
      dof += idx[d] * ds[d];
    }
    std::memcpy(dp + dof * esz, sp + so * esz, run_bytes);
    std::size_t d = inner;
    while (d-- > 0) {
      if (++idx[d] < extent[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
  }
}

namespace detail {
inline void check_layout(const shard_layout& l, const tensor_shape& global, const tensor_shape& local) {
  if (!(l.shape == local))
    throw shape_error("shard of shape " + to_string(local) + " does not match its layout " + to_string(l.shape));
  for (const auto& p : l.pieces)
    if (p.shape.rank != global.rank)
      throw shape_error("shard piece " + to_string(p.shape) + " does not match tensor " + to_string(global));
}
}  // namespace detail

/// Copies the pieces of `layout` from `global` into `out` (shaped `layout.shape`).
inline void extract(const_tensor_view global, const shard_layout& layout, tensor_view out) {
  detail::check_layout(layout, global.shape(), out.shape());
  tensor_shape at;
  at.rank = global.shape().rank;
  const auto cd = static_cast<std::size_t>(layout.concat_dim);
  for (const auto& p : layout.pieces) {
    copy_block(global, p.offset, out, at, p.shape);
    if (at.rank) at[cd] += p.shape[cd];
  }
}
/// A new tensor holding `layout`'s shard of `global`.
inline host_tensor extract(const_tensor_view global, const shard_layout& layout) {
  host_tensor out(global.type(), layout.shape);
  extract(global, layout, out.view());
  return out;
}
/// Writes `shard` back into its place in `global` (the inverse of extract).
inline void insert(const_tensor_view shard, const shard_layout& layout, tensor_view global) {
  detail::check_layout(layout, global.shape(), shard.shape());
  tensor_shape at;
  at.rank = global.shape().rank;
  const auto cd = static_cast<std::size_t>(layout.concat_dim);
  for (const auto& p : layout.pieces) {
    copy_block(shard, at, global, p.offset, p.shape);
    if (at.rank) at[cd] += p.shape[cd];
  }
}

/// When the shard is one contiguous byte range of the global tensor: {offset, length} in bytes.
/// Lets writers and uploads copy straight from a memory map.
inline std::optional<std::pair<std::size_t, std::size_t>> contiguous_span(const shard_layout& l,
                                                                          const tensor_shape& global, dtype t) {
  if (l.pieces.size() != 1) return std::nullopt;
  const auto& p = l.pieces[0];
  const std::size_t R = global.rank;
  std::size_t d = 0;
  while (d < R && p.shape[d] == 1) ++d;  // leading unit dims
  for (std::size_t e = d + 1; e < R; ++e)
    if (p.shape[e] != global[e]) return std::nullopt;
  std::int64_t st[max_tensor_rank];
  detail::row_major_strides(global, st);
  std::int64_t off = 0;
  for (std::size_t e = 0; e < R; ++e) off += p.offset[e] * st[e];
  const auto esz = dtype_size(t);
  return std::pair{static_cast<std::size_t>(off) * esz, static_cast<std::size_t>(p.shape.numel()) * esz};
}

/// `rank`'s shard of `global` under spec `s` on mesh `m`.
inline host_tensor shard_of(const_tensor_view global, const device_mesh& m, const sharding_spec& s, int rank,
                            split_rule rule = split_rule::chunk, fused_dim fused = {}) {
  return extract(global, spec_layout(m, s, global.shape(), rank, rule, fused));
}

/// Reassembles the global tensor from every rank's shard (shards[r] is rank r's).
/// Replicated copies must agree bit for bit; a mismatch is a shape_error naming the rank.
inline host_tensor gather(std::span<const const_tensor_view> shards, const device_mesh& m, const sharding_spec& s,
                          const tensor_shape& global, split_rule rule = split_rule::chunk, fused_dim fused = {}) {
  if (static_cast<int>(shards.size()) != m.num_ranks())
    throw shape_error("gather: " + std::to_string(shards.size()) + " shards for a mesh of " +
                      std::to_string(m.num_ranks()) + " ranks");
  if (shards.empty()) throw shape_error("gather: no shards");
  host_tensor out(shards[0].type(), global);
  for (int r = 0; r < m.num_ranks(); ++r) {
    const auto& sh = shards[static_cast<std::size_t>(r)];
    if (sh.type() != out.type())
      throw shape_error("gather: rank " + std::to_string(r) + " holds " + std::string(to_string(sh.type())) +
                        ", rank 0 holds " + std::string(to_string(out.type())));
    shard_layout l = spec_layout(m, s, global, r, rule, fused);
    if (!(sh.shape() == l.shape))
      throw shape_error("gather: rank " + std::to_string(r) + " holds " + to_string(sh.shape()) +
                        " but spec " + to_string(s) + " gives it " + to_string(l.shape));
    insert(sh, l, out.view());
  }
  // Replicated copies: every rank's shard must equal the gathered block.
  for (int r = 0; r < m.num_ranks(); ++r) {
    shard_layout l = spec_layout(m, s, global, r, rule, fused);
    host_tensor back = extract(out.view(), l);
    if (!bitwise_equal(back.view(), shards[static_cast<std::size_t>(r)]))
      throw shape_error("gather: rank " + std::to_string(r) + "'s replica differs from the other ranks'");
  }
  return out;
}

}  // namespace autoshard

#pragma once
/// Where each rank's shard lies in the global tensor.
/// Split rule (DTensor / torch.chunk, the default): n over k ranks, c = ceil(n/k),
/// rank r holds [min(c*r, n), min(c*(r+1), n)): 5/4 -> 2,2,1,0; an empty shard's offset is n.
/// Two mesh axes on one tensor dim split axis by axis, outer (lower) axis first.
///   constexpr auto m = autoshard::device_mesh{2, 4};
///   constexpr auto b = autoshard::local_box(m, "S01R"_spec, {10, 3}, 5);
///   static_assert(b.shape[0] == 2 && b.offset[0] == 7);   // [0,5) then 2,2,1,0 of [5,10)
#include <cstdint>  // std::int64_t

#include "checked.hpp"  // ceil_div
#include "error.hpp"  // shape_error
#include "mesh.hpp"   // device_mesh
#include "shape.hpp"  // tensor_shape
#include "spec.hpp"   // sharding_spec

namespace autoshard {

/// How a dim of size n is cut into k pieces.
enum class split_rule : std::uint8_t {
  chunk,     ///< torch.chunk / DTensor: ceil-sized pieces, the tail may be short or empty
  balanced,  ///< sizes differ by at most one: 6/4 -> 2,2,1,1 (explicit opt-in only)
};

struct dim_range {
  std::int64_t offset = 0;
  std::int64_t size = 0;
  friend constexpr bool operator==(const dim_range&, const dim_range&) = default;
};

/// Piece r of n split k ways.
constexpr dim_range split_range(std::int64_t n, int k, int r, split_rule rule = split_rule::chunk) noexcept {
  if (rule == split_rule::balanced) {
    std::int64_t q = n / k, rem = n % k;
    return {r * q + (r < rem ? r : rem), q + (r < rem ? 1 : 0)};
  }
  // c * r and c * (r + 1) below the last piece stay within about n: no overflow at any n.
  const std::int64_t c = ceil_div(n, k);
  const std::int64_t lo = c * r < n ? c * r : n;
  const std::int64_t hi = r + 1 >= k ? n : c * (r + 1) < n ? c * (r + 1) : n;
  return {lo, hi - lo};
}

/// The size every piece is padded to for a collective: ceil(n / k).
constexpr std::int64_t padded_piece(std::int64_t n, int k) noexcept { return ceil_div(n, k); }

/// A rank's block of the global tensor.
struct shard_box {
  tensor_shape shape;
  tensor_shape offset;
  friend constexpr bool operator==(const shard_box&, const shard_box&) = default;
  constexpr bool empty() const noexcept { return shape.numel() == 0; }
};

namespace detail {
/// Throws unless spec `s` is for mesh `m` and a tensor of `global`'s rank, each Shard naming a dim of it.
constexpr void check_box_args(const device_mesh& m, const sharding_spec& s, const tensor_shape& global) {
  if (s.mesh_rank != m.ndim() || s.tensor_rank != global.rank)
    throw shape_error("local_box: the spec is for " + std::to_string(s.mesh_rank) + " mesh axes and a tensor of rank " +
                      std::to_string(s.tensor_rank) + ", but the mesh " + to_string(m) + " has " +
                      std::to_string(m.ndim()) + " axes and the tensor " + to_string(global) + " has rank " +
                      std::to_string(global.rank));
  for (std::size_t i = 0; i < s.mesh_rank; ++i)
    if (s[i].is_shard() && (s[i].dim < 0 || s[i].dim >= s.tensor_rank))
      bad_spec::shard_dim_outside_tensor_rank(s[i].dim, s.tensor_rank);
}
}  // namespace detail

/// Shape and offset of `rank`'s shard. Partial and Replicate placements do not cut.
constexpr shard_box local_box(const device_mesh& m, const sharding_spec& s, const tensor_shape& global,
                              int rank, split_rule rule = split_rule::chunk) {
  detail::check_box_args(m, s, global);
  auto coord = m.coordinate(rank);
  shard_box b;
  b.shape = global;
  b.offset.rank = global.rank;
  for (std::size_t i = 0; i < s.mesh_rank; ++i) {
    if (!s[i].is_shard()) continue;
    auto d = static_cast<std::size_t>(s[i].dim);
    dim_range r = split_range(b.shape[d], m.size(i), coord[i], rule);
    b.offset[d] += r.offset;
    b.shape[d] = r.size;
  }
  return b;
}

/// Local shard shape of `rank`.
constexpr tensor_shape local_shape(const device_mesh& m, const sharding_spec& s, const tensor_shape& global,
                                   int rank, split_rule rule = split_rule::chunk) {
  return local_box(m, s, global, rank, rule).shape;
}

/// The largest local shard (rank 0's under the chunk rule), what memory is budgeted by.
constexpr tensor_shape max_local_shape(const device_mesh& m, const sharding_spec& s, const tensor_shape& global) {
  tensor_shape out = global;
  for (std::size_t i = 0; i < s.mesh_rank; ++i)
    if (s[i].is_shard()) {
      auto d = static_cast<std::size_t>(s[i].dim);
      out[d] = padded_piece(out[d], m.size(i));
    }
  return out;
}

/// The same layout with every mesh axis of one rank Replicate: a Shard there is one piece, a
/// Partial one term, so the tensor is whole on that axis either way. Two specs lay a tensor out
/// the same on `m` exactly when their results are equal.
constexpr sharding_spec whole_on_unit_axes(const device_mesh& m, sharding_spec s) noexcept {
  for (std::size_t i = 0; i < s.mesh_rank && i < m.ndim(); ++i)
    if (m.size(i) == 1) s[i] = Replicate();
  return s;
}

/// True when every sharded dim divides evenly at every level of nesting.
constexpr bool divides_evenly(const device_mesh& m, const sharding_spec& s, const tensor_shape& global) noexcept {
  tensor_shape cur = global;
  for (std::size_t i = 0; i < s.mesh_rank; ++i)
    if (s[i].is_shard()) {
      auto d = static_cast<std::size_t>(s[i].dim);
      if (cur[d] % m.size(i) != 0) return false;
      cur[d] /= m.size(i);
    }
  return true;
}

/// True when no rank's shard is smaller than one element along a sharded dim. Under the
/// chunk rule this is stricter than n >= pieces: 6 over 4 gives 2,2,2,0, and nested splits
/// can empty a piece that one split alone would not (10 over 2 then 4: 5 -> 2,2,1,0). The
/// ranks are not visited (a mesh may have 2^20): each dim's mesh axes cut it outer first, and
/// a split of x into k gives at most two sizes (chunk: c = ceil(x/k) k-1 times, then
/// x - c*(k-1), empty when <= 0; balanced: x/k and x/k + 1, empty when x < k), so the sizes a
/// rank can hold are followed level by level: at most 2^max_mesh_rank of them.
constexpr bool no_empty_shards(const device_mesh& m, const sharding_spec& s, const tensor_shape& global,
                               split_rule rule = split_rule::chunk) {
  detail::check_box_args(m, s, global);
  constexpr std::size_t cap = std::size_t{1} << max_mesh_rank;
  for (int d = 0; d < s.tensor_rank; ++d) {
    if (!s.is_sharded(d)) continue;
    std::int64_t sizes[cap] = {global[static_cast<std::size_t>(d)]};
    std::size_t count = 1;
    for (std::size_t i = 0; i < s.mesh_rank; ++i) {
      if (!s[i].is_shard(d)) continue;
      const std::int64_t k = m.size(i);
      std::int64_t next[cap] = {};
      std::size_t n = 0;
      const auto add = [&](std::int64_t v) {
        for (std::size_t j = 0; j < n; ++j)
          if (next[j] == v) return;
        next[n++] = v;
      };
      for (std::size_t j = 0; j < count; ++j) {
        const std::int64_t x = sizes[j];
        if (rule == split_rule::balanced) {
          if (x < k) return false;
          add(x / k);
          if (x % k != 0) add(x / k + 1);
        } else {
          const std::int64_t c = ceil_div(x, k), last = x - c * (k - 1);
          if (last <= 0) return false;
          add(c);
          add(last);
        }
      }
      for (std::size_t j = 0; j < n; ++j) sizes[j] = next[j];
      count = n;
    }
  }
  return true;
}

/// Throws shape_error naming the tensor, dim, size and shard count when a dim does not divide.
inline void require_even(const device_mesh& m, const sharding_spec& s, const tensor_shape& global,
                         const std::string& what = "tensor") {
  tensor_shape cur = global;
  for (std::size_t i = 0; i < s.mesh_rank; ++i)
    if (s[i].is_shard()) {
      auto d = static_cast<std::size_t>(s[i].dim);
      if (cur[d] % m.size(i) != 0)
        throw shape_error(what + ": dim " + std::to_string(d) + " of size " + std::to_string(cur[d]) +
                          " does not divide over " + std::to_string(m.size(i)) + " ranks of mesh axis " +
                          std::to_string(i));
      cur[d] /= m.size(i);
    }
}

/// A tensor dim made of `parts` equal fused blocks, as GPT-2's c_attn output is q | k | v. A
/// Shard of that dim cuts every part the same way and gives each rank its piece of every part,
/// concatenated in part order (the blocked layout Megatron gives a fused QKV projection, so
/// each rank holds the q, k and v columns of its own heads), not one contiguous run. Local
/// shapes are a plain Shard's: fused dims are only cut when every part divides evenly.
///   fused_dim{1, 3} on a [768, 2304] weight over 4 ranks: rank 1 holds columns
///   [192, 384) ++ [960, 1152) ++ [1728, 1920).
struct fused_dim {
  int dim = -1;   ///< the fused tensor dim; -1: none
  int parts = 1;  ///< equal blocks along it
  constexpr bool any() const noexcept { return dim >= 0 && parts > 1; }
  friend constexpr bool operator==(const fused_dim&, const fused_dim&) = default;
};

/// The tensor seen with its fused dim as two, [parts, n / parts] (a free view of the same
/// row-major bytes, global or local): a per-part Shard of the fused dim is a plain Shard of
/// the second, so every redistribute plan of the view keeps the per-part layout exactly, and
/// its steps and bytes are a plain Shard's (the parts divide evenly). Dims after the fused one
/// move up by one. Needs a tensor rank below max_tensor_rank.
constexpr tensor_shape fused_view(fused_dim f, const tensor_shape& s) {
  if (!f.any()) return s;
  if (f.dim >= s.rank || s.rank >= max_tensor_rank || s[static_cast<std::size_t>(f.dim)] % f.parts != 0)
    throw shape_error("fused_view: dim " + std::to_string(f.dim) + " of " + to_string(s) + " is not " +
                      std::to_string(f.parts) + " equal parts");
  tensor_shape v;
  v.rank = s.rank + 1;
  for (std::size_t i = 0, j = 0; i < s.rank; ++i, ++j) {
    if (static_cast<int>(i) == f.dim) {
      v[j++] = f.parts;
      v[j] = s[i] / f.parts;
    } else {
      v[j] = s[i];
    }
  }
  return v;
}
constexpr sharding_spec fused_view(fused_dim f, const sharding_spec& s) {
  if (!f.any()) return s;
  sharding_spec v = s;
  v.tensor_rank = static_cast<std::uint8_t>(s.tensor_rank + 1);
  for (std::size_t i = 0; i < s.mesh_rank; ++i)
    if (s[i].is_shard() && s[i].dim >= f.dim) v[i] = Shard(s[i].dim + 1);
  return v;
}

/// Whether spec `s` may hold a tensor whose dim `f` is fused: a spec that cuts the fused dim
/// must cut every part into equal pieces at every level of nesting.
constexpr bool fused_parts_divide(const device_mesh& m, const sharding_spec& s, const tensor_shape& global,
                                  fused_dim f) noexcept {
  if (!f.any() || f.dim >= s.tensor_rank || !s.is_sharded(f.dim)) return true;
  const std::int64_t n = global[static_cast<std::size_t>(f.dim)];
  if (n % f.parts != 0) return false;
  std::int64_t part = n / f.parts;
  for (std::size_t i = 0; i < s.mesh_rank; ++i)
    if (s[i].is_shard(f.dim)) {
      if (part % m.size(i) != 0) return false;
      part /= m.size(i);
    }
  return true;
}

}  // namespace autoshard

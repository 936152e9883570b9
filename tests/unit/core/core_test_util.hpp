// Helpers shared by the core tests: enumerating every spec of a small mesh, and the
// brute-force torch.chunk / array_split reference the layout is checked against.
#pragma once
#include <autoshard/autoshard.hpp>

#include <cstdint>  // std::int64_t
#include <vector>   // std::vector

namespace autoshard_test {

using autoshard::placement;
using autoshard::reduce_op;
using autoshard::sharding_spec;

/// Every placement a mesh axis can take for a tensor of rank `tensor_rank`:
/// R, S(0..rank-1), and P for each op in `partial_ops`.
inline std::vector<placement> all_placements(int tensor_rank, const std::vector<reduce_op>& partial_ops) {
  std::vector<placement> out{autoshard::Replicate()};
  for (int d = 0; d < tensor_rank; ++d) out.push_back(autoshard::Shard(d));
  for (reduce_op op : partial_ops) out.push_back(autoshard::Partial(op));
  return out;
}

/// Every spec over `mesh_rank` axes (the cartesian product of all_placements).
inline std::vector<sharding_spec> all_specs(int mesh_rank, int tensor_rank,
                                            const std::vector<reduce_op>& partial_ops = {
                                                reduce_op::sum, reduce_op::max, reduce_op::min}) {
  const auto ps = all_placements(tensor_rank, partial_ops);
  std::vector<sharding_spec> out;
  std::vector<std::size_t> idx(static_cast<std::size_t>(mesh_rank), 0);
  for (;;) {
    sharding_spec s = autoshard::replicated_spec(mesh_rank, tensor_rank);
    for (std::size_t i = 0; i < idx.size(); ++i) s.placements[i] = ps[idx[i]];
    out.push_back(s);
    std::size_t i = idx.size();
    while (i > 0 && ++idx[i - 1] == ps.size()) idx[--i] = 0;
    if (i == 0) break;
  }
  return out;
}

/// A contiguous piece of a list of global indices; `end` is where an empty piece sits.
struct index_piece {
  std::vector<std::int64_t> idx;
  std::int64_t end = 0;
  std::int64_t offset() const { return idx.empty() ? end : idx.front(); }
};

/// torch.chunk(list, k), with the missing trailing chunks filled in empty (what DTensor does).
inline std::vector<index_piece> torch_chunk(const index_piece& in, int k) {
  const auto n = static_cast<std::int64_t>(in.idx.size());
  std::int64_t c = 0;
  while (c * k < n) ++c;  // ceil(n / k) without the formula under test
  std::vector<index_piece> out;
  for (std::int64_t start = 0; c > 0 && start < n; start += c) {
    index_piece p;
    for (std::int64_t j = start; j < start + c && j < n; ++j) p.idx.push_back(in.idx[static_cast<std::size_t>(j)]);
    p.end = p.idx.back() + 1;
    out.push_back(p);
  }
  const std::int64_t tail = in.idx.empty() ? in.end : in.idx.back() + 1;
  while (static_cast<int>(out.size()) < k) out.push_back({{}, tail});
  return out;
}

/// numpy.array_split(list, k): the first n % k pieces get one more element.
inline std::vector<index_piece> array_split(const index_piece& in, int k) {
  std::vector<index_piece> out(static_cast<std::size_t>(k));
  const auto n = in.idx.size();
  std::size_t pos = 0;
  for (std::size_t r = 0; r < static_cast<std::size_t>(k); ++r) {
    std::size_t len = n / static_cast<std::size_t>(k) + (r < n % static_cast<std::size_t>(k) ? 1 : 0);
    for (std::size_t j = 0; j < len; ++j) out[r].idx.push_back(in.idx[pos++]);
    out[r].end = pos < n ? in.idx[pos] : (in.idx.empty() ? in.end : in.idx.back() + 1);
  }
  return out;
}

inline index_piece iota_piece(std::int64_t n) {
  index_piece p;
  for (std::int64_t i = 0; i < n; ++i) p.idx.push_back(i);
  p.end = n;
  return p;
}

/// The rank's coordinates by counting through the mesh in row-major order (no formula).
inline std::vector<std::vector<int>> all_coordinates(const std::vector<int>& sizes) {
  std::vector<std::vector<int>> out;
  std::vector<int> c(sizes.size(), 0);
  for (;;) {
    out.push_back(c);
    std::size_t i = c.size();
    while (i > 0 && ++c[i - 1] == sizes[i - 1]) c[--i] = 0;
    if (i == 0) break;
  }
  return out;
}

/// Brute-force shard of one tensor dim: chunk the index list mesh axis by mesh axis.
inline index_piece brute_dim_piece(const std::vector<int>& sizes, const std::vector<int>& coord,
                                   const sharding_spec& s, int dim, std::int64_t n, bool balanced = false) {
  index_piece p = iota_piece(n);
  for (std::size_t i = 0; i < sizes.size(); ++i)
    if (s[i].is_shard(dim)) {
      auto pieces = balanced ? array_split(p, sizes[i]) : torch_chunk(p, sizes[i]);
      p = pieces[static_cast<std::size_t>(coord[i])];
    }
  return p;
}

}  // namespace autoshard_test

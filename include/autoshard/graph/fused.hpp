#pragma once
/// Fused dims: which tensors of a graph are laid out per part when a spec cuts them.
///   auto g = autoshard::build_gpt2(autoshard::transformer_config::gpt2(2, 64, 4));
///   autoshard::fused_dim_of(g, *autoshard::find_vertex(g, "transformer.h.0.attn.c_attn"));
///     // {2, 3}: [B, S, 3H] read as q | k | v
///   autoshard::fused_dim_of(g, *autoshard::find_vertex(g, "transformer.h.0.attn.c_attn.weight"));
///     // {1, 3}: [H, 3H], the columns of q, k and v
///
/// A tensor is fused on dim d in p parts when every consumer is a split on d that reads one
/// whole part, every part is read, and p >= 2 (GPT-2's c_attn output read as q, k, v; Phi-3's
/// gate_up_proj read as gate, up). A Shard of that dim then means core's fused_dim layout: each
/// rank holds its piece of every part, so a split can hand on its part still sharded (the head
/// split of Megatron's attention) with no communication. Redistributing such a tensor runs the
/// plan on core's fused_view ([parts, n / parts]), which keeps that layout; its price is a
/// plain Shard's (the parts divide evenly, so the steps and bytes are the same). The layout is traced back to what
/// computes the dim, when each of those is used only there: through a linear to its weight's
/// output dim and its bias, a matmul to its right operand's last dim, elementwise operators to
/// the operands that carry the dim; parameters end the trace (they are stored in that layout,
/// and `shard --plan` cuts them so). If any of them is not fused-able (used elsewhere, an input,
/// another kind of operator) nothing is fused and a split keeps its axis whole, as before.
/// Derived from the graph alone: every area (the strategies, the executor, the slicer) calls
/// this, so no file has to store it.
#include <cstdint>  // std::int64_t
#include <vector>   // std::vector

#include "../core/layout.hpp"  // fused_dim
#include "model.hpp"           // model_graph, node, op_kind

namespace autoshard {
namespace detail {

/// The parts v's output is read in when all its consumers are splits of whole equal parts
/// that read every part; none otherwise.
inline fused_dim split_parts(const model_graph& g, vertex_t v) {
  const node& nd = g[v];
  if (boost::out_degree(v, g) < 2) return {};
  int axis = -1;
  std::int64_t len = 0;
  for (auto [e, end] = boost::out_edges(v, g); e != end; ++e) {
    const node& w = g[boost::target(*e, g)];
    if (w.kind != op_kind::split) return {};
    const int ax = norm_axis(w.attrs.axis, nd.shape.rank);
    if (axis >= 0 && ax != axis) return {};
    axis = ax;
    if (len != 0 && w.attrs.length != len) return {};
    len = w.attrs.length;
    if (len <= 0 || w.attrs.start % len != 0) return {};
  }
  if (axis < 0 || axis >= nd.shape.rank || nd.shape.rank >= max_tensor_rank) return {};  // fused_view adds a dim
  const std::int64_t n = nd.shape[static_cast<std::size_t>(axis)];
  if (n % len != 0 || n / len < 2 || n / len > static_cast<std::int64_t>(boost::out_degree(v, g))) return {};
  std::vector<char> read(static_cast<std::size_t>(n / len), 0);
  for (auto [e, end] = boost::out_edges(v, g); e != end; ++e) read[static_cast<std::size_t>(g[boost::target(*e, g)].attrs.start / len)] = 1;
  for (char r : read)
    if (!r) return {};
  return {axis, static_cast<int>(n / len)};
}

/// The operand dims that carry output dim `d` of operator w, as (operand, dim) pairs; false
/// when w's kind cannot carry a fused dim.
inline bool carriers(const model_graph& g, vertex_t w, int d, std::vector<std::pair<std::size_t, int>>& out) {
  const node& nd = g[w];
  const std::vector<vertex_t> ops = operands(g, w);
  const int r = nd.shape.rank;
  out.clear();
  switch (nd.kind) {
    case op_kind::linear:
      if (d != r - 1) return false;
      out.emplace_back(1, nd.attrs.transposed_weight ? 1 : 0);
      if (ops.size() == 3) out.emplace_back(2, 0);
      return true;
    case op_kind::matmul:
      if (d != r - 1) return false;
      out.emplace_back(1, g[ops[1]].shape.rank - 1);
      return true;
    default:
      // Element-wise kinds (model.hpp's predicates, and where) carry the dim through every
      // operand that is not broadcast along it; rotary mixes pairs inside a head, so it does not.
      if (!(is_binary_elementwise(nd.kind) || nd.kind == op_kind::where ||
            (is_unary_elementwise(nd.kind) && nd.kind != op_kind::rotary)))
        return false;
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const tensor_shape& s = g[ops[i]].shape;
        const int od = d - (r - static_cast<int>(s.rank));
        if (od >= 0 && s[static_cast<std::size_t>(od)] == nd.shape[static_cast<std::size_t>(d)] && s[static_cast<std::size_t>(od)] != 1)
          out.emplace_back(i, od);
      }
      return true;
  }
}

/// Whether dim d of v can be laid out in `parts` parts: v is a parameter, or an operator whose
/// operands carrying d are used only by v and can be laid out so too.
inline bool can_fuse_up(const model_graph& g, vertex_t v, int d, int depth = 0) {
  const node& nd = g[v];
  if (nd.is_parameter()) return !is_integer(nd.type);
  if (!nd.is_operator() || depth > 64) return false;
  std::vector<std::pair<std::size_t, int>> c;
  if (!carriers(g, v, d, c)) return false;
  const std::vector<vertex_t> ops = operands(g, v);
  for (auto [i, od] : c)
    if (boost::out_degree(ops[i], g) != 1 || !can_fuse_up(g, ops[i], od, depth + 1)) return false;
  return true;
}

inline fused_dim fused_dim_of(const model_graph& g, vertex_t v, int depth) {
  if (fused_dim f = split_parts(g, v); f.any()) return can_fuse_up(g, v, f.dim) ? f : fused_dim{};
  if (boost::out_degree(v, g) != 1 || depth > 64) return {};
  const auto [e, end] = boost::out_edges(v, g);
  const vertex_t w = boost::target(*e, g);
  const fused_dim fw = fused_dim_of(g, w, depth + 1);
  if (!fw.any()) return {};
  std::vector<std::pair<std::size_t, int>> c;
  if (!carriers(g, w, fw.dim, c)) return {};
  for (auto [i, od] : c)
    if (static_cast<int>(i) == g[*e].operand) return {od, fw.parts};
  return {};
}

}  // namespace detail

/// The fused dim of v's output (see the header comment), or none (dim -1).
inline fused_dim fused_dim_of(const model_graph& g, vertex_t v) { return detail::fused_dim_of(g, v, 0); }

/// fused_dim_of every vertex, indexed by vertex.
inline std::vector<fused_dim> fused_dims(const model_graph& g) {
  std::vector<fused_dim> out(boost::num_vertices(g));
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) out[v] = fused_dim_of(g, v);
  return out;
}

}  // namespace autoshard

#pragma once
/// The same graph at another batch size or sequence length: the graph inputs' batch dim
/// (dim 0) and sequence dim (dim 1) replaced, every operator's shape inferred again, and a
/// reshape's target following its input (a dim it carries over, or the product of the dims
/// it merges), an expand's target following its input where it carries the input's dims and
/// the new batch / sequence where it broadcasts to them, and a rotary with a sequence-dependent
/// rope rule (op_attrs::rotary_rule: dynamic, longrope) turning by the rule's frequencies at
/// its new sequence, as transformers would at that length. Vertex order, names, kinds and
/// parameters are unchanged, so a plan's strategies can be looked up on the result (verify --batch/--seq).
///   autoshard::model_graph small = autoshard::with_batch_seq(g, 2, 64);
/// The batch is dim 0 of the first graph input, and every input whose dim 0 has that size is
/// re-sized; the sequence likewise with dim 1 of the first input of rank >= 2 (graph_batch,
/// graph_sequence). Inputs the model holds (attrs.held: an ONNX file's buffers and constants)
/// have neither and keep their shapes; a key/value cache (attrs.kv_cache) has the batch and
/// keeps its past (dim 1), as a rotary keeps its rotary_offset. 0 keeps a size.
#include <algorithm>  // std::equal
#include <cstddef>  // std::size_t
#include <cstdint>  // std::int64_t
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

#include "../core/error.hpp"  // graph_error
#include "model.hpp"          // model_graph, node, infer_shape, operands, rotary_width
#include "rope.hpp"           // rope_rule_frequencies
#include "validate.hpp"       // topological_order, validate

namespace autoshard {

/// The batch of a graph: dim 0 of its first fed input of rank >= 1 (what with_batch_seq
/// re-sizes), 0 without one.
inline std::int64_t graph_batch(const model_graph& g) {
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].is_fed_input() && g[v].shape.rank >= 1) return g[v].shape[0];
  return 0;
}

/// The sequence length of a graph: dim 1 of its first fed input of rank >= 2 that is not a
/// key/value cache (whose dim 1 is the past; what with_batch_seq re-sizes), 0 without one.
inline std::int64_t graph_sequence(const model_graph& g) {
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].is_fed_input() && !g[v].is_kv_cache() && g[v].shape.rank >= 2) return g[v].shape[1];
  return 0;
}

/// The first operator that keeps a fixed output shape (an opaque one that is not elementwise:
/// its shape came from the file, with no rule to infer it again), or "" when the graph can be
/// re-sized.
inline std::string fixed_shape_operator(const model_graph& g) {
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].kind == op_kind::opaque && !g[v].attrs.elementwise) return g[v].name;
  return {};
}

namespace detail {
/// The new target of a reshape from `old_in` to `old_out` when its input becomes `new_in`:
/// groups of dims covering the same elements are matched; an unchanged group keeps its
/// target, a group of one output dim takes the product of its inputs, a group whose input
/// and output dims are the same sizes in the same order takes the new sizes, and a group
/// that splits dims apart (an exporter's [B*heads, S, D] viewed as [B, heads, S, D]) takes,
/// for each size `renamed` changes (the batch, then the sequence), the new size at the first
/// of its output dims that had the old one, when that gives the input's new product. Empty: no
/// rule fits.
inline std::vector<std::int64_t> resized_reshape(const tensor_shape& old_in, const tensor_shape& old_out,
                                                 const tensor_shape& new_in,
                                                 const std::vector<std::pair<std::int64_t, std::int64_t>>& renamed = {}) {
  std::vector<std::int64_t> out;
  std::size_t i = 0, j = 0;
  while (i < old_in.rank || j < old_out.rank) {
    const std::size_t i0 = i, j0 = j;
    std::int64_t pa = 1, pb = 1;
    if (i < old_in.rank) pa *= old_in[i++];
    if (j < old_out.rank) pb *= old_out[j++];
    while (pa != pb) {
      if (pa < pb && i < old_in.rank) pa *= old_in[i++];
      else if (pb < pa && j < old_out.rank) pb *= old_out[j++];
      else return {};
    }
    bool same = true;
    std::int64_t prod = 1;
    for (std::size_t k = i0; k < i; ++k) {
      same = same && new_in[k] == old_in[k];
      prod *= new_in[k];
    }
    if (same) {
      for (std::size_t k = j0; k < j; ++k) out.push_back(old_out[k]);
    } else if (j - j0 == 1) {
      out.push_back(prod);
    } else if (i - i0 == j - j0 && std::equal(old_in.begin() + i0, old_in.begin() + i, old_out.begin() + j0)) {
      for (std::size_t k = 0; k < i - i0; ++k) out.push_back(new_in[i0 + k]);
    } else {
      std::vector<std::int64_t> group(old_out.begin() + j0, old_out.begin() + j);
      std::vector<char> taken(group.size(), 0);
      for (const auto& [from, to] : renamed)
        for (std::size_t k = 0; k < group.size(); ++k)
          if (from != to && !taken[k] && group[k] == from) {
            group[k] = to;
            taken[k] = 1;
            break;
          }
      std::int64_t got = 1;
      for (std::int64_t d : group)
        if (__builtin_mul_overflow(got, d, &got)) return {};
      if (got != prod) return {};
      out.insert(out.end(), group.begin(), group.end());
    }
  }
  return out;
}
}  // namespace detail

/// `g` with batch size `batch` and sequence length `seq` (0: unchanged). Throws graph_error
/// naming the vertex when a size cannot follow (a reshape whose target cannot be re-derived,
/// an operator the new sizes do not fit).
inline model_graph with_batch_seq(const model_graph& g, std::int64_t batch, std::int64_t seq) {
  if (batch < 0 || seq < 0)
    throw graph_error("a batch size and a sequence length are positive, got " + std::to_string(batch) + " and " +
                      std::to_string(seq));
  if (const std::string fixed = fixed_shape_operator(g); !fixed.empty())
    throw graph_error("opaque operator " + quoted_text(fixed) + " keeps a fixed output shape; the graph cannot be re-sized");
  const std::int64_t b0 = graph_batch(g), s0 = graph_sequence(g);
  if (batch > 0 && b0 == 0) throw graph_error("the graph has no input with a batch dim to re-size");
  if (seq > 0 && s0 == 0) throw graph_error("the graph has no input with a sequence dim (dim 1) to re-size");
  model_graph out = g;
  for (vertex_t v : topological_order(g)) {
    node& nd = out[v];
    if (nd.is_parameter()) continue;
    if (nd.is_input()) {
      if (nd.attrs.held) continue;  // data the model holds: no batch, no sequence
      if (batch > 0 && nd.shape.rank >= 1 && nd.shape[0] == b0) nd.shape[0] = batch;
      if (seq > 0 && nd.shape.rank >= 2 && nd.shape[1] == s0 && !nd.is_kv_cache()) nd.shape[1] = seq;  // a cache's is its past
      continue;
    }
    std::vector<tensor_shape> in;
    for (vertex_t u : operands(out, v)) in.push_back(out[u].shape);
    if (nd.kind == op_kind::reshape) {
      const tensor_shape& old_in = g[operands(g, v)[0]].shape;
      if (!(old_in == in[0])) {
        const std::vector<std::int64_t> dims =
            detail::resized_reshape(old_in, g[v].shape, in[0], {{b0, batch > 0 ? batch : b0}, {s0, seq > 0 ? seq : s0}});
        if (dims.empty())
          throw graph_error("reshape " + quoted_text(nd.name) + " from " + to_string(old_in) + " to " + to_string(g[v].shape) +
                            " cannot follow its input re-sized to " + to_string(in[0]));
        nd.attrs.dims = dims;
      }
    } else if (nd.kind == op_kind::expand) {
      // A target dim the input carries (equal sizes, right-aligned) follows the input; a
      // broadcast one that was the batch (dim 0) or the sequence (dim 1) takes the new size.
      const tensor_shape& old_in = g[operands(g, v)[0]].shape;
      const tensor_shape& old_out = g[v].shape;
      for (std::size_t d = 0; d < old_out.rank; ++d) {
        const std::size_t back = old_out.rank - 1 - d;
        if (back < old_in.rank && old_in[old_in.rank - 1 - back] == old_out[d] && old_out[d] != 1)
          nd.attrs.dims[d] = in[0][in[0].rank - 1 - back];
        else if (d == 0 && batch > 0 && old_out[d] == b0)
          nd.attrs.dims[d] = batch;
        else if (d == 1 && seq > 0 && old_out[d] == s0)
          nd.attrs.dims[d] = seq;
      }
    }
    try {
      // A rotary with a sequence-dependent rule (dynamic, longrope) turns at its new sequence
      // as transformers does there: its frequencies recomputed from the rule when, and only
      // when, its sequence (dim -2) changed.
      if (nd.kind == op_kind::rotary && nd.attrs.rotary_rule.kind != rope_rule_kind::none && nd.attrs.heads > 0 && in[0].rank >= 2) {
        const std::size_t r = in[0].rank;
        const std::int64_t S0 = g[operands(g, v)[0]].shape[r - 2], S = in[0][r - 2];
        if (S != S0)
          nd.attrs.rotary_frequencies = rope_rule_frequencies(nd.attrs.rotary_base, rotary_width(nd.attrs, in[0][r - 1] / nd.attrs.heads),
                                                              nd.attrs.rotary_rule, nd.attrs.rotary_offset + S);
      }
      nd.shape = infer_shape(nd.kind, nd.attrs, in);
    } catch (const graph_error& e) {
      throw graph_error("re-sizing to batch " + std::to_string(batch > 0 ? batch : b0) + ", sequence " +
                        std::to_string(seq > 0 ? seq : s0) + ": vertex " + quoted_text(nd.name) + ": " + e.what());
    }
  }
  validate(out);
  return out;
}

}  // namespace autoshard

#pragma once
/// What one operator costs on one device: its FLOPs, its time at the device's rates (the peaks,
/// or what real kernels achieve), and in training what it keeps for its backward pass.
///   double f = autoshard::detail::op_flops(g[v], local_in, local_out);        // 2 M N K for a linear
///   double b = autoshard::detail::bytes_moved(g[v], local_in, in_types, local_out);  // through HBM
///   double s = autoshard::detail::forward_seconds(g[v], local_in, local_out, b, pricing);
///   double t = autoshard::detail::backward_seconds(g[v], local_in, in_types, local_out, s, pricing);
///   bool kept = autoshard::kept_for_backward(g, v);   // a consumer needs it in the backward
///
/// The bytes an operator moves are its local operands read and its output written, but where
/// its kernel moves fewer: an embedding (F.embedding, a gather; Megatron-LM's
/// VocabParallelEmbedding masks the ids outside its shard, gathers and zeroes their rows)
/// reads its ids and the B x S rows they select, not its table, and writes its output; a
/// split whose dims before its axis are all 1 locally (the rows from P on of a position table,
/// builders.hpp position_rows) is a view, PyTorch's narrow: it moves nothing, and a view of a
/// parameter holds no memory of its own (a view of an activation keeps that activation's
/// storage alive, its own bytes' worth). Other splits are strided views their consumers copy:
/// priced as copies. In training the backward is backward_products forwards (the gradients of
/// the operands and of the weight), but an embedding's (embedding_dense_backward): its ids
/// have no gradient, and its table's zero-fills a table-sized gradient and adds each id's row
/// of the output's gradient into it: ids, table and output's gradient once, the rows written.
///
/// Time of one forward, per device: FLOPs / rate + bytes moved / memory rate, where the rate
/// of a GEMM (linear, matmul, the attention core's products) is the device's large-GEMM figure
/// when its smallest local dimension is at least device_model::large_matmul_dim and its
/// sliced-GEMM figure below, and every other operator's FLOPs run at the peak (they are bound
/// by their bytes); with step_pricing::achievable false, or a device without figures, the
/// peaks. The attention core as `unfused` (Megatron-LM before FlashAttention) computes all
/// S x S scores (no causal skipping) and moves them through HBM: the product writes them, the
/// scaled masked softmax reads and writes them, dropout (when the model has it) reads them and
/// writes them and its 1-byte mask, the product with V reads them: 8 bytes per score element,
/// 13 with dropout. As `flash` it reads q, k, v and writes its output, and a causal mask skips
/// the masked half of the pairs (with a sliding window, every pair outside it: attention_pairs).
/// ALiBi's bias (op_attrs::alibi) is one add per score, which both kernels fold into a pass
/// they make anyway (BLOOM's baddbmm writes the scores with it, FlashAttention takes
/// alibi_slopes): no score moves for it, and like the scaling, the mask and the softmax's
/// arithmetic it is not counted in the FLOPs (the products' 4 D per pair dwarf it). A
/// key/value cache (a decode step's, operands 3 and 4) is read once, as the step's own keys
/// and values are: its bytes are operands' bytes; the step's keys and values are written
/// into it in place (vLLM's paged cache, transformers' StaticCache), not copied with it.
///
/// Memory kept for the backward (training; autograd's saved tensors, as Korthikanti et al.
/// 2022 count them): a tensor is kept when an operator needs it in its backward: the input of
/// a linear (and both operands of a matmul or product of activations), of a norm, of an
/// activation function, the q, k, v of the attention core, the logits of the loss, and the
/// output of a softmax, tanh or exp; sums, views, dropout's output and rotary keep nothing of
/// their operands. An operator also keeps what it makes for its own backward: dropout its
/// 1-byte mask, the unfused attention core its probabilities (2 bytes per score), and with
/// attention dropout the mask and the dropped-out probabilities (1 + 2 bytes): the 5 a s^2 b
/// of Korthikanti et al.'s 34 s b h + 5 a s^2 b bytes per GPT layer.
#include <algorithm>  // std::min
#include <cstdint>    // std::int64_t
#include <vector>     // std::vector

#include "../core/shape.hpp"  // tensor_shape
#include "model.hpp"          // model_graph, node, op_kind
#include "pricing.hpp"        // step_pricing, attention_kernel

namespace autoshard {

/// Training prices an operator's backward as this many of its forward: the gradient of each
/// operand and of the weight, each a product as costly as the forward one (compute and memory
/// traffic alike), as Megatron-LM's and Alpa's FLOP counts do; an embedding's is what its
/// kernel moves (detail::backward_seconds).
inline constexpr double backward_products = 2.0;

namespace detail {

/// Heads of the attention core `nd` in a local query of width `local_width` (q, k, v are
/// [B, S, heads x head size]; a strategy splits whole heads).
inline double local_heads(const node& nd, double local_width) {
  const double width = static_cast<double>(nd.shape[nd.shape.rank - 1u]);
  return width > 0 ? static_cast<double>(nd.attrs.heads) * local_width / width : 0.0;
}

/// Score elements of the attention core `nd` on local shapes: batch x heads x queries x keys.
inline double attention_scores(const node& nd, const std::vector<tensor_shape>& in) {
  return static_cast<double>(in[0][0]) * local_heads(nd, static_cast<double>(in[0][2])) * static_cast<double>(in[0][1]) *
         static_cast<double>(attention_keys(in));
}

/// The (query, key) pairs a causal attention core over S queries after P cached keys keeps,
/// query i (at position P + i) seeing the P + i + 1 keys up to itself, or with a sliding
/// window W (op_attrs::window) the last W of them: S (S + 1) / 2 + S P without a window or
/// one of at least P + S; with P = 0 and W < S, the W (W + 1) / 2 of the first W queries and W
/// for each later one. Per batch row and head.
inline double attention_pairs(const op_attrs& a, std::int64_t S, std::int64_t P = 0) {
  const double s = static_cast<double>(S), p = static_cast<double>(P);
  if (a.window <= 0 || a.window >= P + S) return s * (s + 1.0) / 2.0 + s * p;
  const double w = static_cast<double>(a.window);
  if (a.window <= P + 1) return s * w;  // every query sees a full window
  // Queries see P + 1 .. W keys (a growing prefix), then W each.
  return w * (w + 1.0) / 2.0 - p * (p + 1.0) / 2.0 + (p + s - w) * w;
}

/// Bytes the unfused attention core moves through HBM per score element in one forward (see
/// the header comment): 8, or 13 with attention dropout.
constexpr double unfused_score_traffic(bool dropout) noexcept { return dropout ? 13.0 : 8.0; }

/// Bytes the unfused attention core keeps per score element for its backward: the softmax's
/// output (2), and with dropout its mask and output (1 + 2).
constexpr std::int64_t unfused_score_kept(bool dropout) noexcept { return dropout ? 5 : 2; }

/// FLOPs of the operator on local shapes (`kernel`: how the attention core runs).
inline double op_flops(const node& nd, const std::vector<tensor_shape>& in, const tensor_shape& out,
                       attention_kernel kernel = attention_kernel::flash) {
  const double n_out = static_cast<double>(out.numel());
  switch (nd.kind) {
    case op_kind::linear: {
      const double c = static_cast<double>(in[0][in[0].rank - 1u]);
      return 2.0 * n_out * c + (in.size() == 3 ? n_out : 0.0);
    }
    case op_kind::matmul: return 2.0 * n_out * static_cast<double>(in[0][in[0].rank - 1u]);
    case op_kind::attention: {
      // Scores and the weighted sum, 2 FLOPs per multiply-add each, over the (query, key) pairs
      // computed: all Sq x Sk of them, or with a causal mask over equal lengths the pairs it
      // keeps (attention_pairs: S (S + 1) / 2, about half, and with a sliding window W < S
      // fewer, about S W), which a flash kernel computes alone (it skips the masked blocks).
      // The unfused kernel computes every pair and masks afterwards, a window's as a causal one's.
      // A key/value cache adds its P keys before the step's (attention_pairs).
      const double sq = static_cast<double>(in[0][1]), sk = static_cast<double>(attention_keys(in));
      const bool skip = nd.attrs.causal && in[0][1] == in[1][1] && kernel == attention_kernel::flash;
      const double pairs = skip ? attention_pairs(nd.attrs, in[0][1], attention_past(in)) : sq * sk;
      return 4.0 * static_cast<double>(in[0][0]) * pairs * static_cast<double>(in[0][2]);
    }
    case op_kind::layer_norm:
    case op_kind::rms_norm:
    case op_kind::softmax:
    case op_kind::cross_entropy: return 5.0 * static_cast<double>(in[0].numel());
    case op_kind::reduce_sum:
    case op_kind::reduce_mean: return static_cast<double>(in[0].numel());
    case op_kind::gelu:
    case op_kind::gelu_erf:
    case op_kind::silu: return 8.0 * n_out;
    case op_kind::where: return n_out;
    case op_kind::expand: return 0.0;  // a copy: its bytes are priced by the memory bandwidth
    case op_kind::rotary: {  // 3 a turned element (2 multiplies, an add); a partial rotary's other dims are copied
      const std::int64_t D = nd.attrs.heads > 0 && nd.shape.rank > 0 ? nd.shape[nd.shape.rank - 1u] / nd.attrs.heads : 0;
      return D > 0 ? 3.0 * n_out * static_cast<double>(rotary_width(nd.attrs, D)) / static_cast<double>(D) : 3.0 * n_out;
    }
    default: return is_binary_elementwise(nd.kind) || is_unary_elementwise(nd.kind) ? n_out : 0.0;
  }
}

/// The smallest dimension of the GEMMs an operator runs on local shapes (M x K x N; the
/// attention core's are per head: queries x head size x keys); 0 for other operators.
inline double gemm_smallest_dim(const node& nd, const std::vector<tensor_shape>& in, const tensor_shape& out) {
  switch (nd.kind) {
    case op_kind::linear:
    case op_kind::matmul: {
      if (in[0].rank == 0 || out.rank == 0) return 0.0;
      const double k = static_cast<double>(in[0][in[0].rank - 1u]), n = static_cast<double>(out[out.rank - 1u]);
      const double m = static_cast<double>(out.numel()) / std::max(1.0, n);
      return std::min({m, k, n});
    }
    case op_kind::attention: {
      const double head = nd.attrs.heads > 0 ? static_cast<double>(nd.shape[nd.shape.rank - 1u]) / nd.attrs.heads : 0.0;
      return std::min({static_cast<double>(in[0][1]), static_cast<double>(attention_keys(in)), head});
    }
    default: return 0.0;
  }
}

/// Whether the split `nd` of a local operand `in` is a view of contiguous memory: every dim
/// before its axis is 1 locally (its axis 0 always: the table's rows from P on, builders.hpp
/// position_rows), so its output is one contiguous range of the operand's, as PyTorch's
/// `narrow` or `table[first:]` returns it without a copy. A split on a later axis of a
/// [B, S, 3 H] activation with B S > 1 is a strided view whose consumers copy it: priced as a
/// copy.
inline bool is_contiguous_view(const node& nd, const tensor_shape& in) {
  if (nd.kind != op_kind::split || in.rank == 0) return false;
  const int ax = norm_axis(nd.attrs.axis, static_cast<int>(in.rank));
  if (ax < 0 || ax >= static_cast<int>(in.rank)) return false;
  for (int d = 0; d < ax; ++d)
    if (in[static_cast<std::size_t>(d)] != 1) return false;
  return true;
}

/// Bytes of `shape` in elements of `t`.
inline double tensor_bytes(const tensor_shape& shape, dtype t) {
  return static_cast<double>(shape.numel()) * static_cast<double>(dtype_size(t));
}

/// Bytes one forward of the operator moves through HBM on one device, on local shapes (`types`:
/// its operands' element types; its output's is nd.type), as its kernel moves them (the
/// header comment): an embedding gathers the rows its ids select, not its table; a contiguous
/// view (is_contiguous_view) moves nothing; every other operator reads its operands and writes
/// its output once.
inline double bytes_moved(const node& nd, const std::vector<tensor_shape>& in, const std::vector<dtype>& types,
                          const tensor_shape& out) {
  if (nd.kind == op_kind::split && !in.empty() && is_contiguous_view(nd, in[0])) return 0.0;
  const double written = tensor_bytes(out, nd.type);
  if (nd.kind == op_kind::embedding && in.size() == 2) {
    // F.embedding (and Megatron-LM's VocabParallelEmbedding, which masks the ids outside its
    // shard, gathers and zeroes those rows): the ids, one row of the table per id, the output;
    // Gemma's scale (attrs.scale) a multiply after the gather (transformers' normalizer),
    // reading and writing the output once more.
    const double rows = static_cast<double>(out.numel()) * static_cast<double>(dtype_size(types[1]));
    return tensor_bytes(in[0], types[0]) + rows + written + (nd.attrs.scale != 1.0 ? 2.0 * written : 0.0);
  }
  double bytes = written;
  for (std::size_t i = 0; i < in.size(); ++i) bytes += tensor_bytes(in[i], types[i]);
  return bytes;
}

/// Seconds of one forward of the operator on one device: FLOPs at its rate, plus `bytes` (what
/// it moves: bytes_moved) and the unfused attention core's score traffic at the memory rate
/// (see the header comment).
inline double forward_seconds(const node& nd, const std::vector<tensor_shape>& in, const tensor_shape& out, double bytes,
                              const step_pricing& p) {
  const device_model& d = p.device;
  const double flops = op_flops(nd, in, out, p.attention);
  const double smallest = gemm_smallest_dim(nd, in, out);
  const double rate = smallest > 0 ? d.matmul_flops(smallest, p.achievable) : d.peak_flops;
  if (nd.kind == op_kind::attention && p.attention == attention_kernel::unfused)
    bytes += unfused_score_traffic(nd.attrs.dropout && p.mode == run_mode::training) * attention_scores(nd, in);
  return flops / rate + bytes / d.memory_rate(p.achievable);
}

/// Seconds of the operator's backward on one device in training, on local shapes, given its
/// forward's (`forward`): backward_products times it, but for an embedding, whose ids have no
/// gradient and whose table's (embedding_dense_backward) zero-fills a gradient of the local
/// table and adds each id's row of the output's gradient into it: the ids, the table's bytes
/// written once, the output's gradient read and its rows written.
inline double backward_seconds(const node& nd, const std::vector<tensor_shape>& in, const std::vector<dtype>& types,
                               const tensor_shape& out, double forward, const step_pricing& p) {
  if (nd.kind != op_kind::embedding || in.size() != 2) return backward_products * forward;
  const double rows = static_cast<double>(out.numel()) * static_cast<double>(dtype_size(types[1]));
  const double grad = tensor_bytes(out, nd.type);  // Gemma's scale: its multiply's backward reads and writes it once more
  const double bytes = tensor_bytes(in[0], types[0]) + tensor_bytes(in[1], types[1]) + grad + rows + (nd.attrs.scale != 1.0 ? 2.0 * grad : 0.0);
  return bytes / p.device.memory_rate(p.achievable);
}

/// Bytes an operator keeps of its own for its backward, on local shapes (training): dropout's
/// mask, the unfused attention core's probabilities (see the header comment).
inline std::int64_t kept_internal_bytes(const node& nd, const std::vector<tensor_shape>& in, const tensor_shape& out,
                                        const step_pricing& p) {
  if (p.mode != run_mode::training) return 0;
  if (nd.kind == op_kind::dropout) return out.numel();
  if (nd.kind == op_kind::attention && p.attention == attention_kernel::unfused)
    return static_cast<std::int64_t>(attention_scores(nd, in)) * unfused_score_kept(nd.attrs.dropout);
  return 0;
}

}  // namespace detail

/// Whether an operator of kind `k` needs its operand `i` in its backward pass (autograd's saved
/// tensors; see the header comment). A parameter operand is kept anyway.
constexpr bool saves_operand(op_kind k, std::size_t i) noexcept {
  switch (k) {
    case op_kind::linear: return i == 0;  // the input, for the weight's gradient
    case op_kind::matmul:
    case op_kind::mul:
    case op_kind::div:
    case op_kind::attention:
    case op_kind::opaque: return true;
    case op_kind::layer_norm:
    case op_kind::rms_norm:
    case op_kind::gelu:
    case op_kind::gelu_erf:
    case op_kind::silu:
    case op_kind::relu:
    case op_kind::cross_entropy: return i == 0;
    default: return false;
  }
}

/// Whether an operator of kind `k` needs its own output in its backward pass.
constexpr bool saves_output(op_kind k) noexcept {
  return k == op_kind::softmax || k == op_kind::tanh || k == op_kind::exp || k == op_kind::opaque;
}

/// Whether the output of vertex `v` is kept for the backward (training): its operator or one
/// of its consumers needs it. A graph input is always kept (it is there anyway); a parameter
/// is counted as a parameter.
inline bool kept_for_backward(const model_graph& g, vertex_t v) {
  const node& nd = g[v];
  if (!nd.is_operator()) return true;
  if (saves_output(nd.kind)) return true;
  for (auto [e, end] = boost::out_edges(v, g); e != end; ++e)
    if (saves_operand(g[boost::target(*e, g)].kind, static_cast<std::size_t>(g[*e].operand))) return true;
  return false;
}

}  // namespace autoshard

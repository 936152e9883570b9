#pragma once
/// The model graph: a Boost.Graph adjacency_list whose vertices are operators (model inputs
/// and parameters are vertices too) and whose edges are tensor uses with the operand index.
///   autoshard::model_graph g;
///   auto x = autoshard::add_input(g, "x", {8, 768}, autoshard::dtype::bf16);
///   auto w = autoshard::add_parameter(g, "fc.weight", {3072, 768}, autoshard::dtype::bf16);
///   auto y = autoshard::add_op(g, autoshard::op_kind::linear, "fc", {x, w});   // shape [8,3072]
#include <algorithm>    // std::find, std::sort
#include <bit>          // std::bit_floor
#include <cmath>        // std::isfinite, std::pow, std::sqrt
#include <cstdint>      // std::int64_t
#include <limits>       // std::numeric_limits
#include <optional>     // std::optional
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include <boost/graph/adjacency_list.hpp>  // adjacency_list, add_vertex, add_edge
#include <boost/graph/graph_traits.hpp>    // graph_traits

#include "../core/dtype.hpp"  // dtype
#include "../core/error.hpp"  // graph_error
#include "../core/shape.hpp"  // tensor_shape
#include "rope.hpp"            // rope_rule, rope_rule_problem, rope_rule_frequencies

namespace autoshard {

/// What a vertex computes. `input` and `parameter` vertices have no operands.
enum class op_kind : std::uint8_t {
  input,          ///< a model input (token ids, labels, activations fed in)
  parameter,      ///< a trainable weight, named like its checkpoint entry
  linear,         ///< x[...,in] @ W^T (+ b); W is [out,in], or [in,out] with transposed_weight
  matmul,         ///< a[...,m,k] @ b[...,k,n]; b may be [k,n] (batched when both have batch dims)
  gelu,           ///< GELU, tanh approximation (GPT-2's gelu_new, torch's approximate="tanh")
  gelu_erf,       ///< GELU, exact: 0.5 x (1 + erf(x / sqrt 2)) (torch.nn.GELU(), BERT's "gelu")
  silu, relu, tanh, exp, dropout,        ///< elementwise unary (dropout: identity at inference)
  rotary,         ///< rotary position embedding of x[B,S,heads*D] (pairs within each head)
  add, sub, mul, div,                    ///< elementwise binary, numpy broadcasting
  layer_norm,     ///< over the last dim; operands x, [weight, [bias]]; attrs.epsilon, attrs.weight_offset
  rms_norm,       ///< over the last dim; operands x, [weight]; attrs.epsilon, attrs.weight_offset
  softmax,        ///< over attrs.axis
  embedding,      ///< ids[...] (integer), table[V,H] -> [...,H], each row times attrs.scale
  reshape,        ///< to attrs.dims (same number of elements)
  transpose,      ///< permute by attrs.dims
  reduce_sum, reduce_mean,  ///< over attrs.dims (removed from the shape)
  concat,         ///< along attrs.axis
  split,          ///< the slice [start, start+length) of attrs.axis (one output per split node)
  attention,      ///< scaled-dot-product attention: q[B,S,heads*D], k,v[B,Sk,kv_heads*D], and
                  ///< optionally a key/value cache k,v[B,P,kv_heads*D] (operands 3, 4): the keys
                  ///< are the P cached then the Sk new, and query i sits at position P + i
  cross_entropy,  ///< logits[...,V], labels[...] (integer) -> mean loss, shape []
  where,          ///< cond ? x : y elementwise (cond integer/boolean, nonzero is true), numpy broadcasting
  expand,         ///< x broadcast (numpy rules) to the shape attrs.dims
  opaque,         ///< an imported operator with no mapping (attrs.op_type): output shape attrs.dims,
                  ///< any operands; only fully Replicate strategies, and no kernel to run it; or,
                  ///< with attrs.elementwise, an elementwise one (IsNaN, Equal, Sqrt, ...): its
                  ///< operands broadcast (numpy) to its output, and it splits as add does
};

/// The epsilon a layer_norm or rms_norm adds to the variance (mean square) where its
/// attrs.epsilon is not given: a graph file's norm without one, a norm built in code.
/// torch.nn.LayerNorm's, ONNX LayerNormalization's and Megatron-LM's --norm-epsilon default.
/// A model's own (Qwen2's 1e-6, BERT's 1e-12) is its norms' attrs.epsilon.
inline constexpr double default_norm_epsilon = 1e-5;

/// The largest norm epsilon read (a graph file, a config.json, an ONNX model): far above any
/// trained model's (1e-12 .. 1e-5), and below which the epsilon cannot drown the variance of
/// activations of unit scale without it being a mistake.
inline constexpr double max_norm_epsilon = 1.0;

/// Whether `e` is a norm epsilon autoshard computes with: finite, above 0, at most max_norm_epsilon.
inline bool valid_norm_epsilon(double e) noexcept { return e > 0.0 && e <= max_norm_epsilon; }

inline constexpr op_kind all_op_kinds[] = {
    op_kind::input,      op_kind::parameter,   op_kind::linear,     op_kind::matmul,     op_kind::gelu,
    op_kind::gelu_erf,   op_kind::silu,       op_kind::relu,        op_kind::tanh,       op_kind::exp,        op_kind::dropout,
    op_kind::rotary,     op_kind::add,         op_kind::sub,        op_kind::mul,        op_kind::div,
    op_kind::layer_norm, op_kind::rms_norm,    op_kind::softmax,    op_kind::embedding,  op_kind::reshape,
    op_kind::transpose,  op_kind::reduce_sum,  op_kind::reduce_mean, op_kind::concat,    op_kind::split,
    op_kind::attention,  op_kind::cross_entropy, op_kind::where,     op_kind::expand,     op_kind::opaque};

/// The JSON / DOT spelling: "linear", "layer_norm", ...
constexpr std::string_view to_string(op_kind k) noexcept {
  switch (k) {
    case op_kind::input: return "input";
    case op_kind::parameter: return "parameter";
    case op_kind::linear: return "linear";
    case op_kind::matmul: return "matmul";
    case op_kind::gelu: return "gelu";
    case op_kind::gelu_erf: return "gelu_erf";
    case op_kind::silu: return "silu";
    case op_kind::relu: return "relu";
    case op_kind::tanh: return "tanh";
    case op_kind::exp: return "exp";
    case op_kind::dropout: return "dropout";
    case op_kind::rotary: return "rotary";
    case op_kind::add: return "add";
    case op_kind::sub: return "sub";
    case op_kind::mul: return "mul";
    case op_kind::div: return "div";
    case op_kind::layer_norm: return "layer_norm";
    case op_kind::rms_norm: return "rms_norm";
    case op_kind::softmax: return "softmax";
    case op_kind::embedding: return "embedding";
    case op_kind::reshape: return "reshape";
    case op_kind::transpose: return "transpose";
    case op_kind::reduce_sum: return "reduce_sum";
    case op_kind::reduce_mean: return "reduce_mean";
    case op_kind::concat: return "concat";
    case op_kind::split: return "split";
    case op_kind::attention: return "attention";
    case op_kind::cross_entropy: return "cross_entropy";
    case op_kind::where: return "where";
    case op_kind::expand: return "expand";
    case op_kind::opaque: return "opaque";
  }
  return "?";
}

/// Inverse of to_string(op_kind).
constexpr std::optional<op_kind> parse_op_kind(std::string_view s) noexcept {
  for (op_kind k : all_op_kinds)
    if (to_string(k) == s) return k;
  return std::nullopt;
}

constexpr bool is_known(op_kind k) noexcept { return static_cast<std::uint8_t>(k) <= static_cast<std::uint8_t>(op_kind::opaque); }
constexpr bool is_unary_elementwise(op_kind k) noexcept {
  return k == op_kind::gelu || k == op_kind::gelu_erf || k == op_kind::silu || k == op_kind::relu || k == op_kind::tanh ||
         k == op_kind::exp || k == op_kind::dropout || k == op_kind::rotary;
}
constexpr bool is_binary_elementwise(op_kind k) noexcept {
  return k == op_kind::add || k == op_kind::sub || k == op_kind::mul || k == op_kind::div;
}
constexpr bool is_source(op_kind k) noexcept { return k == op_kind::input || k == op_kind::parameter; }

/// ALiBi (Press et al. 2022): a bias linear in the key's position added to an attention's
/// scaled scores, per query head, as a model's transformers code adds it (op_attrs::alibi; the
/// values: alibi_bias). `bloom`: modeling_bloom.py's (BLOOM). `falcon`: modeling_falcon.py's
/// (Falcon with alibi: true), which rounds to bfloat16 and adds before the 1/sqrt(D) scaling.
enum class alibi_rule : std::uint8_t { none, bloom, falcon };
inline constexpr alibi_rule all_alibi_rules[] = {alibi_rule::none, alibi_rule::bloom, alibi_rule::falcon};

/// "none", "bloom" or "falcon" (the graph file's spelling).
constexpr std::string_view to_string(alibi_rule r) noexcept {
  switch (r) {
    case alibi_rule::none: return "none";
    case alibi_rule::bloom: return "bloom";
    case alibi_rule::falcon: return "falcon";
  }
  return "?";
}

/// Vertex attributes; each kind reads only the fields its comment names.
struct op_attrs {
  bool transposed_weight = false;  ///< linear: weight stored [in,out] (GPT-2 Conv1D)
  bool causal = false;             ///< attention: causal mask
  /// attention, causal only: a sliding window of W keys: the query at position q sees keys
  /// q-W+1..q (itself and the W-1 before it), as transformers' sliding_window (masking_utils.py
  /// sliding_window_overlay: kv_idx > q_idx - sliding_window, with the causal kv_idx <= q_idx).
  /// 0: no window, every earlier key. A window at least the sequence masks nothing more.
  std::int64_t window = 0;
  /// attention: ALiBi's position bias added to the scaled scores (alibi_bias, per global query
  /// head); none: no bias.
  alibi_rule alibi = alibi_rule::none;
  bool dropout = false;            ///< attention: its probabilities dropped out in training (GPT-2's attn_pdrop, BERT's)
  int axis = -1;                   ///< softmax, concat, split: tensor dim, negative counts from the end
  int heads = 0;                   ///< attention (query heads), rotary
  bool rotary_half = false;        ///< rotary: pairs (i, i + D/2) of each head (Hugging Face's rotate_half);
                                   ///< false: (2i, 2i+1), interleaved (Meta's and GPT-NeoX's original layout)
  double rotary_base = 10000.0;    ///< rotary: pair i of a head's R turned dims turns by position x
                                   ///< base^(-2i/R) (Hugging Face's rope_theta)
  double epsilon = default_norm_epsilon;  ///< layer_norm, rms_norm: added to the variance (mean
                                          ///< square) before its root; valid_norm_epsilon
                                          ///< (Hugging Face's layer_norm_eps, rms_norm_eps)
  double weight_offset = 0.0;      ///< layer_norm, rms_norm with a weight: the normalised row times
                                   ///< weight_offset + weight (Gemma's GemmaRMSNorm: 1 + weight); finite
  double scale = 1.0;              ///< embedding: each row looked up times this (Gemma's normalizer,
                                   ///< sqrt(hidden)); finite. rotary: the turned dims' cos and sin
                                   ///< times this (YaRN's attention_factor: q and k scaled); finite, > 0
  std::int64_t rotary_dims = 0;    ///< rotary: R, the dims of each head of D turned (the first R: the
                                   ///< pairs lie within them, with rotary_half (i, i + R/2)); dims
                                   ///< R..D-1 pass through unchanged. 0 or D: the whole head. Even,
                                   ///< 0 < R <= D (GPT-NeoX's rotary_pct, Phi's partial_rotary_factor).
                                   ///< Read through rotary_width.
  std::vector<double> rotary_frequencies;  ///< rotary: pair i's frequency given outright, R/2 of them, each
                                           ///< finite and > 0 (Llama-3's scaled rope_scaling); empty:
                                           ///< base^(-2i/R). Read through rotary_frequency.
  /// rotary: the sequence-dependent rope rule (rope.hpp: dynamic, longrope) its
  /// rotary_frequencies follow; they are rope_rule_frequencies(rotary_base, R, rule, S) at its
  /// input's sequence S (dim -2), checked at shape inference and recomputed by with_batch_seq
  /// when S changes. none: the frequencies are fixed.
  rope_rule rotary_rule;
  /// rotary: the position of its first token; its S tokens are at positions rotary_offset ..
  /// rotary_offset + S - 1 (a step after a key/value cache of that many tokens, transformers'
  /// position_ids there), and a rope rule reads the sequence rotary_offset + S (transformers'
  /// max(position_ids) + 1). 0..max_attention_window.
  std::int64_t rotary_offset = 0;
  int kv_heads = 0;                ///< attention: key/value heads, 0 means `heads` (GQA when fewer)
  std::int64_t start = 0;          ///< split: first index taken along `axis`
  std::int64_t length = 0;         ///< split: number of indices taken
  std::vector<std::int64_t> dims;  ///< reshape, expand: target shape; transpose: permutation; reduce: dims;
                                   ///< opaque: the output shape (it cannot be inferred)
  std::string op_type;             ///< opaque: the operator in its source format ("NonMaxSuppression",
                                   ///< "com.example.FancyNorm"), for reports
  bool elementwise = false;        ///< opaque: elementwise over operands that broadcast to the output
                                   ///< (its shape, inferred; attrs.dims empty)
  /// input: a key/value cache [batch, past, kv_heads*D]: the keys (or values) of the past
  /// tokens of each sequence, which an attention reads as its operand 3 (4) before the step's
  /// own (op_kind::attention). Kept from step to step, so live the whole step; its dim 1 is
  /// the past, not the sequence (graph_sequence, with_batch_seq leave it), and it has no gradient.
  bool kv_cache = false;
  bool held = false;               ///< input: data the model holds (an ONNX file's buffers, constants and
                                   ///< integer tables), not fed each step: no batch or sequence dim
                                   ///< (graph_batch, with_batch_seq), and no gradient, as any input
  friend bool operator==(const op_attrs&, const op_attrs&) = default;
};

/// The largest sliding window an attention takes (op_attrs::window): far beyond any context.
inline constexpr std::int64_t max_attention_window = std::int64_t{1} << 40;

/// The most explicit rotary frequencies a graph file may give (half the largest head size read).
inline constexpr std::size_t max_rotary_frequencies = std::size_t{1} << 16;

/// R, the dims of each head of D a rotary turns: attrs.rotary_dims, 0 meaning the whole head.
/// The one place the kernels, the FLOP count and the exports take it from.
inline std::int64_t rotary_width(const op_attrs& a, std::int64_t D) { return a.rotary_dims > 0 ? a.rotary_dims : D; }

/// The frequency pair i (0 <= i < R/2, R = rotary_width) of a rotary's head of D turns by per
/// position: the explicit rotary_frequencies[i] where given, else rotary_base^(-2i/R). The one
/// place the kernels (forward and backward) and the ONNX import take it from.
inline double rotary_frequency(const op_attrs& a, std::int64_t i, std::int64_t D) {
  if (!a.rotary_frequencies.empty()) return a.rotary_frequencies[static_cast<std::size_t>(i)];
  return std::pow(a.rotary_base, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_width(a, D)));
}

/// The ALiBi slope of query head `h` (0-based, the global index) of an attention of `heads`
/// heads, as transformers computes it in float32 (modeling_bloom.py _get_alibi_slopes; Falcon's
/// build_alibi_tensor has the same): with p the largest power of two <= heads, head h < p gets
/// b^(h+1), b = 2^(-8/p) rounded to float, and the heads past p (a count not a power of two)
/// every other slope of 2p heads, e^(2(h-p)+1), e = 2^(-4/p) rounded to float. 8 heads: 1/2,
/// 1/4, ..., 1/256. The power is the float nearest b^i; torch's vectorised pow is within one
/// ulp of it and a few slopes differ by that ulp (32 heads: head 14's, 7e-9 of 0.0743).
inline float alibi_slope(std::int64_t heads, std::int64_t h) {
  if (heads <= 0 || h < 0 || h >= heads)
    throw graph_error("ALiBi: head " + std::to_string(h) + " of " + std::to_string(heads) + " heads does not exist");
  const auto p = static_cast<std::int64_t>(std::bit_floor(static_cast<std::uint64_t>(heads)));
  const double pd = static_cast<double>(p);
  const bool first = h < p;
  const auto base = static_cast<float>(std::pow(2.0, (first ? -8.0 : -4.0) / pd));  // Python's 2 ** -(2 ** -(log2(p) - 3)), as a float32 tensor
  const double power = first ? static_cast<double>(h + 1) : static_cast<double>(2 * (h - p) + 1);
  return static_cast<float>(std::pow(static_cast<double>(base), power));
}

/// What ALiBi (rule `r`) adds to the scaled score (QK^T / sqrt(D)) of query head `h` (global)
/// of `heads`, head size `D`, at the key of position `key`, as transformers adds it:
///   bloom:  float(slope x key), a float32 product, added after the scaling (modeling_bloom.py:
///           alibi.baddbmm(q, k^T, beta=1, alpha=1/sqrt(D)));
///   falcon: bf16(bf16(slope) x bf16(key)) / sqrt(D): modeling_falcon.py's build_alibi_tensor
///           multiplies the slopes .bfloat16() by the positions (a bfloat16 product), and its
///           FalconModel divides the bias by sqrt(D) into the mask added to the scaled scores:
///           (QK^T + bias) / sqrt(D). Exact up to 256 positions at 2^k heads; past them bfloat16
///           rounds the position and the product, as transformers does.
/// transformers adds slope x key, not the paper's -slope x (query - key): the two differ by
/// slope x query along each query's row, which the softmax cancels. Positions are 0.. with no
/// padding (transformers' cumsum of an all-ones attention mask). none: 0.
inline double alibi_bias(alibi_rule r, std::int64_t heads, std::int64_t h, std::int64_t key, std::int64_t D) {
  if (r == alibi_rule::none) return 0.0;
  const float slope = alibi_slope(heads, h), position = static_cast<float>(key);
  if (r == alibi_rule::bloom) return static_cast<double>(slope * position);
  const auto bf16 = [](float x) { return bf16_to_float(float_to_bf16(x)); };
  return static_cast<double>(bf16(bf16(slope) * bf16(position))) / std::sqrt(static_cast<double>(D));
}

/// Vertex bundle.
struct node {
  std::string name;               ///< unique; Hugging Face module / parameter name where one exists
  op_kind kind = op_kind::input;
  op_attrs attrs;
  tensor_shape shape;             ///< output shape
  dtype type = dtype::f32;        ///< output element type
  bool is_input() const noexcept { return kind == op_kind::input; }
  /// An input fed each step (token ids, labels, activations), not data the model holds (attrs.held).
  bool is_fed_input() const noexcept { return kind == op_kind::input && !attrs.held; }
  /// A key/value cache an attention reads (attrs.kv_cache).
  bool is_kv_cache() const noexcept { return kind == op_kind::input && attrs.kv_cache; }
  bool is_parameter() const noexcept { return kind == op_kind::parameter; }
  bool is_operator() const noexcept { return !is_source(kind); }
};

/// Edge bundle: the producer's output is operand `operand` of the consumer.
struct edge {
  int operand = 0;
};

using model_graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, node, edge>;
using vertex_t = boost::graph_traits<model_graph>::vertex_descriptor;
using edge_t = boost::graph_traits<model_graph>::edge_descriptor;

namespace detail {
[[noreturn]] inline void bad_operands(op_kind k, const std::string& why) {
  throw graph_error(std::string(to_string(k)) + ": " + why);
}
inline std::string shapes_str(std::span<const tensor_shape> in) {
  std::string s;
  for (std::size_t i = 0; i < in.size(); ++i) s += (i ? ", " : "") + to_string(in[i]);
  return s;
}
inline int norm_axis(int axis, int rank) { return axis < 0 ? axis + rank : axis; }
inline bool is_integer(dtype t) { return t == dtype::i32 || t == dtype::i64 || t == dtype::u8 || t == dtype::boolean; }
}  // namespace detail

/// Smallest and largest operand count of a kind.
constexpr std::pair<int, int> operand_count_range(op_kind k) noexcept {
  switch (k) {
    case op_kind::input:
    case op_kind::parameter: return {0, 0};
    case op_kind::linear: return {2, 3};
    case op_kind::layer_norm: return {1, 3};
    case op_kind::rms_norm: return {1, 2};
    case op_kind::concat: return {1, 64};
    case op_kind::opaque: return {0, 64};
    case op_kind::attention: return {3, 5};  // q, k, v, and a key/value cache's k and v
    case op_kind::where: return {3, 3};
    case op_kind::matmul:
    case op_kind::embedding:
    case op_kind::cross_entropy:
    case op_kind::add:
    case op_kind::sub:
    case op_kind::mul:
    case op_kind::div: return {2, 2};
    default: return {1, 1};
  }
}

namespace detail {

/// Throws unless operand i of `in` has rank >= min_rank.
inline void need_rank(op_kind k, std::span<const tensor_shape> in, std::size_t i, int min_rank) {
  if (in[i].rank < min_rank)
    bad_operands(k, "operand " + std::to_string(i) + " " + to_string(in[i]) + " needs rank >= " + std::to_string(min_rank));
}

inline std::int64_t last_dim(const tensor_shape& s) { return s[s.rank - 1u]; }

/// x [..., in] times a weight [out, in] (or [in, out], transposed_weight), plus a bias [out].
inline tensor_shape linear_shape(op_kind k, const op_attrs& a, std::span<const tensor_shape> in) {
  need_rank(k, in, 0, 1);
  if (in[1].rank != 2) bad_operands(k, "weight " + to_string(in[1]) + " must have rank 2");
  const std::int64_t w_in = a.transposed_weight ? in[1][0] : in[1][1];
  const std::int64_t w_out = a.transposed_weight ? in[1][1] : in[1][0];
  if (w_in != last_dim(in[0]))
    bad_operands(k, "input " + to_string(in[0]) + " has " + std::to_string(last_dim(in[0])) +
                        " features but weight " + to_string(in[1]) + (a.transposed_weight ? " [in,out]" : " [out,in]") +
                        " expects " + std::to_string(w_in));
  if (in.size() == 3 && !(in[2] == tensor_shape{w_out}))
    bad_operands(k, "bias " + to_string(in[2]) + " must be [" + std::to_string(w_out) + "]");
  tensor_shape out = in[0];
  out[out.rank - 1u] = w_out;
  return out;
}

/// x [..., m, n] @ y [n, p], or a batched y of x's rank with the same batch dims.
inline tensor_shape matmul_shape(op_kind k, std::span<const tensor_shape> in) {
  need_rank(k, in, 0, 2);
  need_rank(k, in, 1, 2);
  const auto& x = in[0];
  const auto& y = in[1];
  if (x[x.rank - 1u] != y[y.rank - 2u])
    bad_operands(k, "contraction sizes differ: " + to_string(x) + " @ " + to_string(y));
  if (y.rank > 2) {
    if (y.rank != x.rank) bad_operands(k, "batched operands need equal rank: " + shapes_str(in));
    for (std::size_t d = 0; d + 2 < x.rank; ++d)
      if (x[d] != y[d]) bad_operands(k, "batch dim " + std::to_string(d) + " differs: " + shapes_str(in));
  }
  tensor_shape out = x;
  out[x.rank - 1u] = y[y.rank - 1u];
  return out;
}

/// numpy broadcasting of every operand (add, sub, mul, div, where).
inline tensor_shape broadcast_shape(op_kind k, std::span<const tensor_shape> in) {
  tensor_shape out;
  for (const tensor_shape& x : in) out.rank = std::max(out.rank, x.rank);
  for (std::size_t i = 0; i < out.rank; ++i) out[i] = 1;
  for (const tensor_shape& x : in)
    for (std::size_t i = 0; i < x.rank; ++i) {
      const std::int64_t dx = x[x.rank - 1 - i];
      std::int64_t& d = out[out.rank - 1 - i];
      if (dx != d && dx != 1 && d != 1)
        bad_operands(k, "shapes " + shapes_str(in) + " do not broadcast (dim -" + std::to_string(i + 1) +
                            ": " + std::to_string(d) + " vs " + std::to_string(dx) + ")");
      if (d == 1) d = dx;
    }
  return out;
}

/// to attrs.dims exactly (ONNX's two-way Expand: the importer gives its inferred shape).
inline tensor_shape expand_shape(op_kind k, const op_attrs& a, std::span<const tensor_shape> in) {
  if (a.dims.size() > max_tensor_rank) bad_operands(k, "target has more than 8 dims");
  std::int64_t n = 1;
  for (std::int64_t d : a.dims)
    if (d < 0) bad_operands(k, "target dims must be non-negative");
    else if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d) bad_operands(k, "target has too many elements");
    else n *= d;
  const tensor_shape out(a.dims);
  const tensor_shape& x = in[0];
  bool ok = x.rank <= out.rank;
  for (std::size_t i = 0; ok && i < x.rank; ++i) ok = x[x.rank - 1 - i] == 1 || x[x.rank - 1 - i] == out[out.rank - 1 - i];
  if (!ok) bad_operands(k, "cannot broadcast " + to_string(x) + " to " + to_string(out));
  return out;
}

/// ids [...] into a table [vocab, hidden]: [..., hidden].
/// Whether a tensor of shape `s` holds any element (no dim of 0; a scalar holds one).
inline bool has_elements(const tensor_shape& s) noexcept {
  return std::find(s.begin(), s.end(), std::int64_t{0}) == s.end();
}

inline tensor_shape embedding_shape(op_kind k, std::span<const tensor_shape> in) {
  if (in[1].rank != 2) bad_operands(k, "table " + to_string(in[1]) + " must have rank 2");
  if (in[0].rank + 1u > max_tensor_rank) bad_operands(k, "ids have too many dims");
  // A table of no rows has no id to look up: such a graph was planned, and verify failed at
  // run time ("id 1 outside the table of 0 rows").
  if (in[1][0] == 0 && has_elements(in[0]))
    bad_operands(k, "table " + to_string(in[1]) + " has no rows, so none of the ids " + to_string(in[0]) + " can be looked up");
  tensor_shape out = in[0];
  out.dims[out.rank] = in[1][1];
  ++out.rank;
  return out;
}

/// a view of the same elements as attrs.dims.
inline tensor_shape reshape_shape(op_kind k, const op_attrs& a, std::span<const tensor_shape> in) {
  if (a.dims.size() > max_tensor_rank) bad_operands(k, "target has more than 8 dims");
  for (std::int64_t d : a.dims)
    if (d < 0) bad_operands(k, "target dims must be non-negative");
  tensor_shape out(a.dims);
  std::int64_t n = 1;
  for (std::int64_t d : a.dims)
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d) bad_operands(k, "target " + to_string(out) + " has too many elements");
    else n *= d;
  if (out.numel() != in[0].numel())
    bad_operands(k, "cannot view " + to_string(in[0]) + " (" + std::to_string(in[0].numel()) + " elements) as " +
                        to_string(out) + " (" + std::to_string(out.numel()) + ")");
  return out;
}

/// the dims permuted by attrs.dims.
inline tensor_shape transpose_shape(op_kind k, const op_attrs& a, std::span<const tensor_shape> in) {
  if (a.dims.size() != in[0].rank)
    bad_operands(k, "permutation has " + std::to_string(a.dims.size()) + " entries for " + to_string(in[0]));
  tensor_shape out = in[0];
  std::vector<bool> seen(in[0].rank, false);
  for (std::size_t i = 0; i < a.dims.size(); ++i) {
    const std::int64_t p = a.dims[i];
    if (p < 0 || p >= in[0].rank || seen[static_cast<std::size_t>(p)])
      bad_operands(k, "attrs.dims is not a permutation of 0.." + std::to_string(in[0].rank - 1));
    seen[static_cast<std::size_t>(p)] = true;
    out[i] = in[0][static_cast<std::size_t>(p)];
  }
  return out;
}

/// attrs.dims dropped (reduce_sum, reduce_mean).
inline tensor_shape reduce_shape(op_kind k, const op_attrs& a, std::span<const tensor_shape> in) {
  std::vector<bool> drop(in[0].rank, false);
  for (std::int64_t d : a.dims) {
    if (d < 0 || d >= in[0].rank || drop[static_cast<std::size_t>(d)])
      bad_operands(k, "reduced dim " + std::to_string(d) + " is outside " + to_string(in[0]) + " or repeated");
    drop[static_cast<std::size_t>(d)] = true;
  }
  tensor_shape out;
  for (std::size_t d = 0; d < in[0].rank; ++d)
    if (!drop[d]) out.dims[out.rank++] = in[0][d];
  // Each element of the output the mean of no element: 0/0 (the executor wrote 0 where PyTorch computes NaN).
  if (k == op_kind::reduce_mean && has_elements(out))
    for (std::int64_t d : a.dims)
      if (in[0][static_cast<std::size_t>(d)] == 0)
        bad_operands(k, "reduced dim " + std::to_string(d) + " of " + to_string(in[0]) + " is empty: each mean of " + to_string(out) +
                            " would be over no element, 0/0");
  return out;
}

/// operands equal but along the axis, summed along it.
inline tensor_shape concat_shape(op_kind k, const op_attrs& a, std::span<const tensor_shape> in) {
  const int ax = norm_axis(a.axis, in[0].rank);
  if (ax < 0 || ax >= in[0].rank) bad_operands(k, "axis " + std::to_string(a.axis) + " outside " + to_string(in[0]));
  tensor_shape out = in[0];
  for (std::size_t i = 1; i < in.size(); ++i) {
    bool ok = in[i].rank == in[0].rank;
    for (std::size_t d = 0; ok && d < in[0].rank; ++d) ok = static_cast<int>(d) == ax || in[i][d] == in[0][d];
    if (!ok) bad_operands(k, "operand " + std::to_string(i) + " " + to_string(in[i]) + " does not match " +
                                 to_string(in[0]) + " outside axis " + std::to_string(ax));
    if (in[i][static_cast<std::size_t>(ax)] > std::numeric_limits<std::int64_t>::max() - out[static_cast<std::size_t>(ax)])
      bad_operands(k, "concatenated size overflows");
    out[static_cast<std::size_t>(ax)] += in[i][static_cast<std::size_t>(ax)];
  }
  return out;
}

/// [start, start + length) of the axis.
inline tensor_shape split_shape(op_kind k, const op_attrs& a, std::span<const tensor_shape> in) {
  const int ax = norm_axis(a.axis, in[0].rank);
  if (ax < 0 || ax >= in[0].rank) bad_operands(k, "axis " + std::to_string(a.axis) + " outside " + to_string(in[0]));
  const std::int64_t n = in[0][static_cast<std::size_t>(ax)];
  if (a.start < 0 || a.length < 0 || a.start > n || a.length > n - a.start)
    bad_operands(k, "slice [" + std::to_string(a.start) + ", " + std::to_string(a.start + a.length) +
                        ") is outside dim " + std::to_string(ax) + " of " + to_string(in[0]));
  tensor_shape out = in[0];
  out[static_cast<std::size_t>(ax)] = a.length;
  return out;
}

/// rotary: x[..., heads x D], D even, its R = rotary_width turned dims even and within the head,
/// the base a finite number above 1, the explicit frequencies (where given) one a pair of
/// the R, each finite and above 0, and with a rotary_rule, the rule sound (rope_rule_problem)
/// and the frequencies its own at the sequence (dim -2), bit for bit.
inline tensor_shape rotary_shape(op_kind k, const op_attrs& a, std::span<const tensor_shape> in) {
  need_rank(k, in, 0, 2);
  if (a.heads <= 0 || last_dim(in[0]) % a.heads != 0 || (last_dim(in[0]) / a.heads) % 2 != 0)
    bad_operands(k, "last dim of " + to_string(in[0]) + " must be heads (" + std::to_string(a.heads) +
                        ") x an even head size");
  if (!(a.rotary_base > 1.0) || !std::isfinite(a.rotary_base))
    bad_operands(k, "base " + std::to_string(a.rotary_base) + " is not a finite number above 1");
  const std::int64_t D = last_dim(in[0]) / a.heads;
  if (a.rotary_dims != 0 && (a.rotary_dims < 0 || a.rotary_dims > D || a.rotary_dims % 2 != 0))
    bad_operands(k, "rotary_dims " + std::to_string(a.rotary_dims) + " is not an even number of dims in 1.." +
                        std::to_string(D) + ", the head size (" + to_string(in[0]) + " over " + std::to_string(a.heads) + " heads)");
  if (const std::int64_t R = rotary_width(a, D), half = R / 2;
      !a.rotary_frequencies.empty() && static_cast<std::int64_t>(a.rotary_frequencies.size()) != half)
    bad_operands(k, std::to_string(a.rotary_frequencies.size()) + " rotary_frequencies for " +
                        (R == D ? "heads of " + std::to_string(R) : std::to_string(R) + " turned dims of heads of " + std::to_string(D)) +
                        ": one a pair, " + std::to_string(half) + ", is needed");
  for (std::size_t i = 0; i < a.rotary_frequencies.size(); ++i)
    if (!(a.rotary_frequencies[i] > 0.0) || !std::isfinite(a.rotary_frequencies[i]))
      bad_operands(k, "rotary_frequencies[" + std::to_string(i) + "] " + std::to_string(a.rotary_frequencies[i]) +
                          " is not a finite number above 0");
  if (!(a.scale > 0.0) || !std::isfinite(a.scale))
    bad_operands(k, "scale " + exact_number(a.scale) + " (its cos and sin times it) is not a finite number above 0");
  if (a.rotary_offset < 0 || a.rotary_offset > max_attention_window)
    bad_operands(k, "rotary_offset " + std::to_string(a.rotary_offset) + " is not a position in 0.." + std::to_string(max_attention_window));
  if (a.rotary_rule.kind != rope_rule_kind::none) {
    const std::int64_t R = rotary_width(a, D), S = a.rotary_offset + in[0][in[0].rank - 2];
    if (const std::string why = rope_rule_problem(a.rotary_rule, R); !why.empty()) bad_operands(k, why);
    std::vector<double> want;
    try {
      want = rope_rule_frequencies(a.rotary_base, R, a.rotary_rule, S);
    } catch (const graph_error& e) {
      bad_operands(k, std::string(e.message()));
    }
    const auto at = [&] {
      return "at sequence " + std::to_string(S) + " (dim " + std::to_string(in[0].rank - 2) + " of " + to_string(in[0]) +
             (a.rotary_offset > 0 ? " after rotary_offset " + std::to_string(a.rotary_offset) : std::string()) + ")";
    };
    if (want.size() != a.rotary_frequencies.size())
      bad_operands(k, "rotary_rule " + to_string(a.rotary_rule) + " " + at() + " gives " +
                          (want.empty() ? std::string("the default base^(-2i/R)") : std::to_string(want.size()) + " rotary_frequencies") +
                          ", but " + std::to_string(a.rotary_frequencies.size()) + " are given");
    for (std::size_t i = 0; i < want.size(); ++i)
      if (want[i] != a.rotary_frequencies[i])
        bad_operands(k, "rotary_frequencies[" + std::to_string(i) + "] " + exact_number(a.rotary_frequencies[i]) + " is not " +
                            exact_number(want[i]) + ", what rotary_rule " + to_string(a.rotary_rule) + " gives " + at());
  }
  return in[0];
}

/// The tokens of an attention core's key/value cache (operands 3 and 4 of shapes `in`: the
/// past each query sees before the step's keys), 0 without one.
/// (Not inlined: GCC 12 at -O3 inlined it into 3-operand calls and warned that in[3], on the
/// branch they never take, was out of bounds.)
[[gnu::noinline]] inline std::int64_t attention_past(std::span<const tensor_shape> in) { return in.size() == 5 ? in[3][1] : 0; }

/// The keys an attention core over operands of shapes `in` weighs: its cache's then its own.
inline std::int64_t attention_keys(std::span<const tensor_shape> in) { return attention_past(in) + in[1][1]; }

/// q [b, s, heads*hd], k and v [b, s_kv, kv_heads*hd] -> q's shape.
inline tensor_shape attention_shape(op_kind k, const op_attrs& a, std::span<const tensor_shape> in) {
  for (std::size_t i = 0; i < 3; ++i)
    if (in[i].rank != 3) bad_operands(k, "q, k, v must be [batch, seq, heads*head_dim], got " + shapes_str(in));
  const int kv = a.kv_heads > 0 ? a.kv_heads : a.heads;
  if (a.heads <= 0 || in[0][2] % a.heads != 0 || a.heads % kv != 0)
    bad_operands(k, "q width " + std::to_string(in[0][2]) + " must be heads (" + std::to_string(a.heads) +
                        ") x head_dim, and heads a multiple of kv_heads (" + std::to_string(kv) + ")");
  const std::int64_t hd = in[0][2] / a.heads;
  if (!(in[1] == in[2]) || in[1][0] != in[0][0] || hd == 0 || in[1][2] % hd != 0 || in[1][2] / hd != kv)
    bad_operands(k, "k and v must be [" + std::to_string(in[0][0]) + ", seq, " + std::to_string(kv * hd) +
                        "] for q " + to_string(in[0]) + ", got " + shapes_str(in.subspan(1)));
  if (in.size() == 4) bad_operands(k, "takes q, k, v and, with a key/value cache, its k and v: 3 or 5 operands, got 4");
  if (in.size() == 5 && (!(in[3] == in[4]) || in[3].rank != 3 || in[3][0] != in[1][0] || in[3][2] != in[1][2]))
    bad_operands(k, "the key/value cache must be two [" + std::to_string(in[1][0]) + ", past, " + std::to_string(in[1][2]) +
                        "] (k and v's batch and width), got " + shapes_str(in.subspan(3)));
  if (a.causal && in[1][1] != in[0][1])
    bad_operands(k, "causal attention needs equal q and k lengths (the step's tokens; earlier ones are a key/value cache), got " +
                        shapes_str(in.first(2)));
  if (a.window < 0 || a.window > max_attention_window)
    bad_operands(k, "window " + std::to_string(a.window) + " is not a key count in 1.." + std::to_string(max_attention_window) + " (0: none)");
  if (a.window != 0 && !a.causal)
    bad_operands(k, "window " + std::to_string(a.window) + " is a causal sliding window, but the attention is not causal");
  if (static_cast<unsigned>(a.alibi) > static_cast<unsigned>(alibi_rule::falcon))
    bad_operands(k, "alibi " + std::to_string(static_cast<unsigned>(a.alibi)) + " is not an ALiBi rule (none, bloom, falcon)");
  if (attention_keys(in) == 0 && has_elements(in[0]))
    bad_operands(k, "k and v " + to_string(in[1]) + " hold no key: each query of " + to_string(in[0]) + " would weigh none, 0/0");
  return in[0];
}

}  // namespace detail

/// The output shape of `k` applied to operands of shapes `in`; throws graph_error (naming
/// the operator kind, the operand and the sizes) when they do not fit.
inline tensor_shape infer_shape(op_kind k, const op_attrs& a, std::span<const tensor_shape> in) {
  using detail::bad_operands;
  auto [lo, hi] = operand_count_range(k);
  if (!is_known(k)) throw graph_error("unknown operator kind " + std::to_string(static_cast<int>(k)));
  if (static_cast<int>(in.size()) < lo || static_cast<int>(in.size()) > hi)
    bad_operands(k, "takes " + std::to_string(lo) + (lo == hi ? "" : ".." + std::to_string(hi)) +
                        " operands, got " + std::to_string(in.size()));
  switch (k) {
    case op_kind::input:
    case op_kind::parameter: throw graph_error(std::string(to_string(k)) + " vertices have no operands");
    case op_kind::linear: return detail::linear_shape(k, a, in);
    case op_kind::matmul: return detail::matmul_shape(k, in);
    case op_kind::rotary: return detail::rotary_shape(k, a, in);
    case op_kind::gelu:
    case op_kind::gelu_erf:
    case op_kind::silu:
    case op_kind::relu:
    case op_kind::tanh:
    case op_kind::exp:
    case op_kind::dropout: return in[0];
    case op_kind::add:
    case op_kind::sub:
    case op_kind::mul:
    case op_kind::div:
    case op_kind::where: return detail::broadcast_shape(k, in);
    case op_kind::expand: return detail::expand_shape(k, a, in);
    case op_kind::layer_norm:
    case op_kind::rms_norm:
      detail::need_rank(k, in, 0, 1);
      if (!valid_norm_epsilon(a.epsilon))
        bad_operands(k, "epsilon " + exact_number(a.epsilon) + " is not a finite number in (0, " + exact_number(max_norm_epsilon) + "]");
      if (!std::isfinite(a.weight_offset)) bad_operands(k, "weight_offset " + exact_number(a.weight_offset) + " is not a finite number");
      if (a.weight_offset != 0.0 && in.size() < 2)
        bad_operands(k, "weight_offset " + exact_number(a.weight_offset) + " without a weight: it offsets the weight (weight_offset + weight)");
      for (std::size_t i = 1; i < in.size(); ++i)
        if (!(in[i] == tensor_shape{detail::last_dim(in[0])}))
          bad_operands(k, "operand " + std::to_string(i) + " " + to_string(in[i]) + " must be [" +
                              std::to_string(detail::last_dim(in[0])) + "] for input " + to_string(in[0]));
      return in[0];
    case op_kind::softmax: {
      detail::need_rank(k, in, 0, 1);
      const int ax = detail::norm_axis(a.axis, in[0].rank);
      if (ax < 0 || ax >= in[0].rank) bad_operands(k, "axis " + std::to_string(a.axis) + " outside " + to_string(in[0]));
      return in[0];
    }
    case op_kind::embedding:
      if (!std::isfinite(a.scale)) bad_operands(k, "scale " + exact_number(a.scale) + " is not a finite number");
      return detail::embedding_shape(k, in);
    case op_kind::reshape: return detail::reshape_shape(k, a, in);
    case op_kind::transpose: return detail::transpose_shape(k, a, in);
    case op_kind::reduce_sum:
    case op_kind::reduce_mean: return detail::reduce_shape(k, a, in);
    case op_kind::concat: return detail::concat_shape(k, a, in);
    case op_kind::split: return detail::split_shape(k, a, in);
    case op_kind::attention: return detail::attention_shape(k, a, in);
    case op_kind::cross_entropy: {
      detail::need_rank(k, in, 0, 1);
      bool ok = in[1].rank + 1u == in[0].rank;
      for (std::size_t d = 0; ok && d < in[1].rank; ++d) ok = in[1][d] == in[0][d];
      if (!ok) bad_operands(k, "labels " + to_string(in[1]) + " must be logits " + to_string(in[0]) + " without the last dim");
      // The mean over no label is 0/0, and a label of no class is out of range whatever it is:
      // such a graph was planned, and verify blamed the plan ("the plan's result differs from
      // the unsharded run" at a NaN loss) or failed at run time ("label 1 outside the vocabulary of 0").
      if (!detail::has_elements(in[1]))
        bad_operands(k, "labels " + to_string(in[1]) + " hold no label: the mean loss over none is 0/0");
      if (in[0][in[0].rank - 1] == 0)
        bad_operands(k, "logits " + to_string(in[0]) + " have no class (last dim 0) for the labels " + to_string(in[1]) + " to name");
      return tensor_shape{};
    }
    case op_kind::opaque: {
      if (a.elementwise) {  // the output is its operands broadcast: inferred, never recorded
        if (!a.dims.empty()) bad_operands(k, "an elementwise opaque operator's shape is its operands' broadcast, not dims");
        if (in.empty()) bad_operands(k, "an elementwise opaque operator needs an operand");
        return detail::broadcast_shape(k, in);
      }
      if (a.dims.size() > max_tensor_rank) bad_operands(k, "output shape has more than 8 dims");
      for (std::int64_t d : a.dims)
        if (d < 0) bad_operands(k, "output dims must be non-negative");
      return tensor_shape(a.dims);
    }
  }
  throw graph_error("unknown operator kind " + std::to_string(static_cast<int>(k)));
}

/// The operands of `v` in operand order; throws graph_error naming the vertex when an
/// operand index is missing or used twice.
inline std::vector<vertex_t> operands(const model_graph& g, vertex_t v) {
  std::vector<vertex_t> out(boost::in_degree(v, g), boost::graph_traits<model_graph>::null_vertex());
  for (auto [it, end] = boost::in_edges(v, g); it != end; ++it) {
    const int i = g[*it].operand;
    if (i < 0 || i >= static_cast<int>(out.size()) || out[static_cast<std::size_t>(i)] != boost::graph_traits<model_graph>::null_vertex())
      throw graph_error("vertex " + quoted_text(g[v].name) + " (" + std::string(to_string(g[v].kind)) + "): operand " +
                        std::to_string(i) + (i >= 0 && i < static_cast<int>(out.size()) ? " is given twice" : " is out of order") +
                        "; operand indices must be 0.." + std::to_string(static_cast<int>(out.size()) - 1));
    out[static_cast<std::size_t>(i)] = boost::source(*it, g);
  }
  return out;
}

/// The in-edges of `v` in operand order.
inline std::vector<edge_t> operand_edges(const model_graph& g, vertex_t v) {
  std::vector<edge_t> out;
  for (auto [it, end] = boost::in_edges(v, g); it != end; ++it) out.push_back(*it);
  std::sort(out.begin(), out.end(), [&](const edge_t& a, const edge_t& b) { return g[a].operand < g[b].operand; });
  return out;
}

/// Shapes of `v`'s operands, in operand order.
inline std::vector<tensor_shape> operand_shapes(const model_graph& g, vertex_t v) {
  std::vector<tensor_shape> s;
  for (vertex_t u : operands(g, v)) s.push_back(g[u].shape);
  return s;
}

/// The vertex called `name`, or nullopt.
inline std::optional<vertex_t> find_vertex(const model_graph& g, std::string_view name) {
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].name == name) return v;
  return std::nullopt;
}

/// Adds a model input.
inline vertex_t add_input(model_graph& g, std::string name, tensor_shape shape, dtype t) {
  return boost::add_vertex(node{std::move(name), op_kind::input, {}, shape, t}, g);
}
/// Adds data the model holds and does not train (a buffer, a constant): an input with attrs.held.
inline vertex_t add_held_input(model_graph& g, std::string name, tensor_shape shape, dtype t) {
  op_attrs a;
  a.held = true;
  return boost::add_vertex(node{std::move(name), op_kind::input, std::move(a), shape, t}, g);
}
/// Adds a key/value cache [batch, past, kv_heads*D] an attention reads as its operand 3 or 4:
/// an input with attrs.kv_cache (name it as the keys or values of its layer's cache,
/// "past_key_values.0.key").
inline vertex_t add_kv_cache(model_graph& g, std::string name, tensor_shape shape, dtype t) {
  op_attrs a;
  a.kv_cache = true;
  return boost::add_vertex(node{std::move(name), op_kind::input, std::move(a), shape, t}, g);
}
/// Adds a parameter (weight); name it as in the checkpoint ("transformer.h.0.attn.c_attn.weight").
inline vertex_t add_parameter(model_graph& g, std::string name, tensor_shape shape, dtype t) {
  return boost::add_vertex(node{std::move(name), op_kind::parameter, {}, shape, t}, g);
}

/// Adds an operator over `ops` (operand order), inferring its output shape; the output
/// dtype is the first floating operand's (the table's for embedding, f32 for cross_entropy)
/// unless given. Throws graph_error naming `name` when the operands do not fit.
inline vertex_t add_op(model_graph& g, op_kind k, std::string name, std::span<const vertex_t> ops,
                       op_attrs attrs = {}, std::optional<dtype> type = std::nullopt) {
  std::vector<tensor_shape> shapes;
  dtype t = dtype::f32;
  bool have_t = false;
  for (vertex_t u : ops) {
    if (u >= boost::num_vertices(g)) throw graph_error("vertex " + quoted_text(name) + ": operand vertex " + std::to_string(u) + " does not exist");
    shapes.push_back(g[u].shape);
    if (!have_t && !detail::is_integer(g[u].type)) {
      t = g[u].type;
      have_t = true;
    }
  }
  tensor_shape out;
  try {
    out = infer_shape(k, attrs, shapes);
  } catch (const graph_error& e) {
    throw graph_error("vertex " + quoted_text(name) + ": " + std::string(e.message()));
  }
  if (k == op_kind::cross_entropy) t = dtype::f32;
  vertex_t v = boost::add_vertex(node{std::move(name), k, std::move(attrs), out, type.value_or(t)}, g);
  int i = 0;
  for (vertex_t u : ops) boost::add_edge(u, v, edge{i++}, g);
  return v;
}
inline vertex_t add_op(model_graph& g, op_kind k, std::string name, std::initializer_list<vertex_t> ops,
                       op_attrs attrs = {}, std::optional<dtype> type = std::nullopt) {
  return add_op(g, k, std::move(name), std::span<const vertex_t>(ops.begin(), ops.size()), std::move(attrs), type);
}

/// Sum of the elements of every parameter vertex (a parameter used twice, e.g. tied
/// embeddings, counts once).
inline std::int64_t parameter_count(const model_graph& g) {
  std::int64_t n = 0;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].is_parameter()) n += g[v].shape.numel();
  return n;
}

}  // namespace autoshard

#pragma once
/// What a training plan is, in the words people run jobs in: its parallelism (tensor, data and
/// pipeline sizes, micro-batch, recomputation, ZeRO stage), and its FLOPs as Megatron-LM counts
/// them for TFLOP/s per GPU and model FLOPs utilisation.
///   autoshard::step_flops f = autoshard::count_step_flops(g, micro_batches, layers);
///   f.megatron;  // 96 B s l h^2 (1 + s/6h + V/16lh) for a GPT: Narayanan et al. 2021, eq. 3
///   f.model;     // 72 B s l h^2 (1 + (s+1)/12h + V/12lh): the model's own FLOPs, for MFU
///
/// The counts are the graph's GEMMs (linear, matmul, the attention core), forward, over the
/// global batch (the graph's micro-step batch times the micro-steps), 2 FLOPs per
/// multiply-add. Megatron-LM's TFLOP/s count the attention core over all S x S pairs as eq. 3
/// does: a layer's 24 B s h^2 + 4 B s^2 h, the logits' 2 B s h V, every layer's forward four
/// times (forward, two backward products, one recomputation: eq. 3 assumes full recomputation
/// whatever the run did) and the rest three times. The model's FLOPs count everything three
/// times and a causal core over the S (S + 1) / 2 pairs its mask keeps (2 B s (s + 1) h a
/// layer): the work the model needs, so that MFU stays below 100 % at any sequence length (with
/// all S x S pairs counted, eq. 3's s/6h term reaches the peak once s is several times h, since
/// a causal flash kernel skips the masked half). For a GPT graph these are the closed forms
/// exactly; for other models (SwiGLU, grouped-query attention) they are what the formulas mean.
#include <algorithm>  // std::min
#include <array>     // std::array
#include <cstdint>   // std::int64_t
#include <optional>  // std::optional
#include <string>    // std::string
#include <utility>   // std::pair
#include <vector>   // std::vector

#include "../core/layout.hpp"     // sharding_spec
#include "../core/mesh.hpp"       // device_mesh
#include "../graph/compute.hpp"   // attention_pairs
#include "../graph/model.hpp"     // model_graph
#include "../graph/resize.hpp"    // graph_batch
#include "../graph/strategy.hpp"  // strategy
#include "layers.hpp"             // layer_map

namespace autoshard {

/// The global batch's FLOPs of one training step.
struct step_flops {
  double layers = 0;    ///< the repeated layers' GEMMs, one forward of the global batch
  double rest = 0;      ///< every other GEMM (the logits), one forward of the global batch
  double masked = 0;    ///< of layers + rest, the causal cores' pairs their masks drop
  double megatron = 0;  ///< 4 layers + 3 rest: what Megatron-LM's TFLOP/s count (eq. 3)
  double model = 0;     ///< 3 (layers + rest - masked): the model's FLOPs, for MFU
};

/// The FLOPs of one step of `g` (one micro-step's batch) run `micro_batches` times.
inline step_flops count_step_flops(const model_graph& g, int micro_batches, const layer_map& layers) {
  step_flops f;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    const node& nd = g[v];
    double x = 0;
    if (nd.kind == op_kind::linear || nd.kind == op_kind::matmul) {
      const tensor_shape in = g[operands(g, v)[0]].shape;
      if (in.rank > 0) x = 2.0 * static_cast<double>(nd.shape.numel()) * static_cast<double>(in[in.rank - 1u]);
    } else if (nd.kind == op_kind::attention) {
      const std::vector<vertex_t> ops = operands(g, v);
      const tensor_shape q = g[ops[0]].shape, k = g[ops[1]].shape;
      const std::vector<tensor_shape> in = operand_shapes(g, v);
      const double b = static_cast<double>(q[0]), sq = static_cast<double>(q[1]), d = static_cast<double>(q[2]);
      const double keys = static_cast<double>(detail::attention_keys(in));
      x = 4.0 * b * sq * keys * d;
      // A causal mask over equal lengths keeps S (S + 1) / 2 of the S x S pairs (and each
      // query every key of a cache before them), a sliding window fewer (compute.hpp's
      // attention_pairs, which op_flops counts for a flash kernel).
      if (nd.attrs.causal && q[1] == k[1])
        f.masked += 4.0 * b * (sq * keys - detail::attention_pairs(nd.attrs, q[1], detail::attention_past(in))) * d * micro_batches;
    }
    (layers.layer[v] >= 0 ? f.layers : f.rest) += x * micro_batches;
  }
  f.megatron = 4 * f.layers + 3 * f.rest;
  f.model = 3 * (f.layers + f.rest - f.masked);
  return f;
}

/// A training plan in the words people run jobs in (pp is 1 until pipelines exist), read off
/// the operator of the largest weight of a layer (of the model, without layers): how it splits
/// its batch (dp) and how it takes that weight (tp), and how the weight is stored (ZeRO).
/// `mixed` when some other GEMM of the layers splits its work otherwise (the ILP may, say,
/// keep attention data parallel while the MLP is tensor parallel).
struct parallelism {
  int tp = 1;               ///< tensor-parallel size: the ranks the weight's operator takes it split over
  int dp = 1;               ///< data-parallel size: the ranks that operator splits the batch over
  int pp = 1;               ///< pipeline stages
  int micro_batch = 0;      ///< sequences per data-parallel rank per micro-step
  int micro_batches = 1;    ///< micro-steps per step (gradient accumulation)
  std::string recompute;    ///< per layer, in words ("full on all 24 layers")
  /// ZeRO stage of most of the parameters (by elements; zero_elements): 0 (whole on every
  /// data-parallel rank), 1 (optimizer state sharded: Megatron-LM's distributed optimizer), 2
  /// (gradient too), 3 (the weight itself, gathered on use: FSDP).
  int zero = 0;
  /// The parameters' elements stored at each ZeRO stage: the ILP chooses per parameter, so a plan
  /// may keep some weights plain beside ZeRO-2 for the rest (to_string says so).
  std::array<std::int64_t, 4> zero_elements{};
  /// The rest of the devices (tp x dp x sp x replicas = devices): the ranks that split that
  /// GEMM's sequence (sp), and those that repeat its work (replicas).
  int sp = 1;
  int replicas = 1;
  bool mixed = false;       ///< the layers' GEMMs do not all split their work alike
};

/// "ZeRO-1", or where the parameters are stored at several stages "ZeRO-2 for 77 % of the
/// parameters (ZeRO-0 for 23 %)": the stage of most, then the others, by elements.
inline std::string describe_zero(const parallelism& p) {
  std::int64_t all = 0;
  for (const std::int64_t n : p.zero_elements) all += n;
  const auto share = [&](int k) {
    const double pct = 100.0 * static_cast<double>(p.zero_elements[static_cast<std::size_t>(k)]) / static_cast<double>(all);
    return pct < 1 ? std::string("under 1 %") : pct > 99 ? std::string("over 99 %") : std::to_string(static_cast<int>(pct + 0.5)) + " %";
  };
  std::string others;
  for (int k = 0; k < 4; ++k)
    if (k != p.zero && p.zero_elements[static_cast<std::size_t>(k)] > 0)
      others += (others.empty() ? "" : ", ") + ("ZeRO-" + std::to_string(k) + " for " + share(k));
  if (others.empty()) return "ZeRO-" + std::to_string(p.zero);
  return "ZeRO-" + std::to_string(p.zero) + " for " + share(p.zero) + " of the parameters (" + others + ")";
}

/// "tp 8, dp 4, pp 1, micro-batch 2 x 64, recompute full on all 80 layers, ZeRO-1".
inline std::string to_string(const parallelism& p) {
  return "tp " + std::to_string(p.tp) + ", dp " + std::to_string(p.dp) + ", pp " + std::to_string(p.pp) + ", micro-batch " +
         std::to_string(p.micro_batch) + " x " + std::to_string(p.micro_batches) + ", recompute " + p.recompute + ", " +
         describe_zero(p) + (p.sp > 1 ? ", the sequence split " + std::to_string(p.sp) + " ways" : "") +
         (p.replicas > 1 ? ", the work repeated on " + std::to_string(p.replicas) + " replicas" : "") +
         (p.mixed ? " (the layers' operators split their work differently)" : "");
}

namespace detail {
/// (tp, dp) of a GEMM taking its weight as operand `w`: the sizes of the axes that split the
/// weight it takes, and of those that split its output's dim 0 (the batch); `sp`, `replicas`:
/// of those that split its sequence (dim 1 of a 3-D output), and of the rest.
inline std::pair<int, int> gemm_split(const device_mesh& m, const strategy& s, std::size_t w, int* sp = nullptr,
                                      int* replicas = nullptr) {
  int tp = 1, dp = 1, seq = 1, rest = 1;
  for (std::size_t a = 0; a < m.ndim(); ++a) {
    if (m.size(a) == 1) continue;
    if (w < s.inputs.size() && s.inputs[w][a].is_shard()) tp *= m.size(a);
    else if (s.output[a].is_shard(0)) dp *= m.size(a);
    else if (s.output.tensor_rank >= 3 && s.output[a].is_shard(1)) seq *= m.size(a);
    else rest *= m.size(a);
  }
  if (sp) *sp = seq;
  if (replicas) *replicas = rest;
  return {tp, dp};
}
}  // namespace detail

/// The parallelism of per-vertex strategies `chosen` of `g` (one micro-step's batch) on `m`.
inline parallelism parallelism_of(const model_graph& g, const device_mesh& m, const std::vector<const strategy*>& chosen,
                                  int micro_batches, const layer_map& layers) {
  parallelism p;
  p.micro_batches = micro_batches;
  bool any_layer = false;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) any_layer = any_layer || layers.layer[v] >= 0;
  // The largest weight a GEMM of a layer takes (of any GEMM without layers), and its GEMM.
  std::int64_t largest = -1;
  vertex_t op = 0;
  std::size_t operand = 0;
  std::optional<std::pair<int, int>> first;
  for (auto [e, end] = boost::edges(g); e != end; ++e) {
    const vertex_t w = boost::source(*e, g), c = boost::target(*e, g);
    if (!g[w].is_parameter() || g[c].kind != op_kind::linear || g[*e].operand != 1 || !chosen[c]) continue;
    if (any_layer && layers.layer[c] < 0) continue;
    const auto split = detail::gemm_split(m, *chosen[c], 1);
    if (!first) first = split;
    else if (split != *first) p.mixed = true;
    if (g[w].shape.numel() > largest) largest = g[w].shape.numel(), op = c, operand = 1;
  }
  if (largest >= 0) {
    const auto [tp, dp] = detail::gemm_split(m, *chosen[op], operand, &p.sp, &p.replicas);
    p.tp = tp;
    p.dp = dp;
  } else {  // no weights: the batch split of the first input
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
      if (g[v].is_fed_input() && g[v].shape.rank >= 1 && chosen[v]) {
        for (std::size_t a = 0; a < m.ndim(); ++a)
          if (chosen[v]->output[a].is_shard(0)) p.dp *= m.size(a);
        break;
      }
  }
  // Each parameter's ZeRO stage: its storage's, or 3 where it is stored sharded on an axis on
  // which a consumer takes it whole (gathered on use); the stage of most elements is the plan's.
  for (vertex_t w = 0; w < boost::num_vertices(g); ++w) {
    if (!g[w].is_parameter() || !chosen[w]) continue;
    const strategy& stored = *chosen[w];
    bool gathered = false;
    for (auto [e, end] = boost::out_edges(w, g); e != end && !gathered; ++e) {
      const strategy* c = chosen[boost::target(*e, g)];
      const auto i = static_cast<std::size_t>(g[*e].operand);
      if (!c || i >= c->inputs.size()) continue;
      for (std::size_t a = 0; a < m.ndim(); ++a)
        gathered = gathered || (m.size(a) > 1 && stored.output[a].is_shard() && c->inputs[i][a].is_replicate());
    }
    const int stage = stored.zero_stage > 0 ? std::min(stored.zero_stage, 3) : gathered ? 3 : 0;
    p.zero_elements[static_cast<std::size_t>(stage)] += g[w].shape.numel();
  }
  for (int k = 1; k < 4; ++k)
    if (p.zero_elements[static_cast<std::size_t>(k)] > p.zero_elements[static_cast<std::size_t>(p.zero)]) p.zero = k;
  const std::int64_t batch = graph_batch(g);
  p.micro_batch = static_cast<int>((batch + p.dp - 1) / p.dp);
  p.recompute = describe_recomputation(layer_recomputation(layers, chosen));
  return p;
}

}  // namespace autoshard

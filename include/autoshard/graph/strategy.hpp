#pragma once
/// Sharding strategies of each operator, and the resharding cost of each edge.
///   auto m = autoshard::make_mesh_2d(2, 4, 25e9, 300e9);
///   std::vector<autoshard::strategy> s = autoshard::enumerate_strategies(g, v, m);
///   autoshard::cost_matrix r = autoshard::resharding_costs(g, e, s_producer, s_consumer, m);
///
/// Enumeration follows DTensor's einsum rule: per mesh axis an operator offers Replicate,
/// or sharding one of its index labels (a batch dim, a free dim of either operand, or the
/// contraction dim, which leaves the output Partial); the strategies are the Cartesian
/// product over mesh axes. Elementwise ops, norms and softmax follow their input with the
/// normalised dim forced to Replicate (where and expand broadcast like the binary ones: a
/// size-1 operand dim stays Replicate while the output's dim is cut); views map shardings
/// through split/merged dims; a split keeps its axis whole, except out of a tensor fused on
/// that axis (fused.hpp: c_attn's q | k | v), whose per-part Shard hands each part on sharded;
/// embeddings offer batch, column and vocab-parallel (output Partial); attention shards
/// batch or heads (whole heads per rank, GQA groups kept together); an opaque operator
/// (imported, with no mapping) offers only Replicate for every operand and its output, unless
/// it is elementwise (IsNaN, Equal, ...: then it splits as add does).
///
/// Costs, per device, in seconds:
///   compute  = FLOPs(local shapes) / peak_flops + bytes(local operands + output) / memory_bandwidth
///              (x3 in training: forward + two backward products, backward_compute_seconds),
///              where the bytes are what the kernel moves (compute.hpp bytes_moved: an
///              embedding's gathered rows, not its table; nothing for a contiguous view) and an
///              embedding's backward is its table's gradient (compute.hpp backward_seconds)
///   comm     = the operator's own communication: none (a Partial output is settled on the
///              edge that consumes it), except vocab-parallel cross-entropy (three
///              all-reduces of one f32 per local row: max, sum of exponentials, target logit).
///   grads    = training: the spec each operand's gradient leaves the operator in. A
///              differentiable operand that is Replicate on a mesh axis where the strategy
///              shards a label it lacks has a Partial gradient there; a Partial operand has a
///              Replicate one; otherwise the gradient is laid out as the operand was.
///   memory   = bytes of the local output (activations; none for a contiguous view of a
///              parameter, compute.hpp is_contiguous_view); a parameter vertex holds its local
///              weight, and in training its gradient and optimizer state too
///              (parameter_state_bytes: 16 B per parameter for mixed-precision Adam).
/// An edge u -> v costs, forward, price_plan(plan_redistribute(u's output -> v's input)) and,
/// in training, its adjoint: the plan that takes v's gradient of the operand back to the
/// layout of u's output (a Partial output takes a Replicate gradient). So an all-gather's
/// backward is a reduce-scatter when the consumer's gradient is Partial and a free slice when
/// it is not, an all-reduce's backward is free, a local slice's backward is an all-gather, and
/// the consumer's Partial input gradient is reduced here, once: a producer with c
/// differentiable consumers charges each edge 1/c of its reductions (and of the all-gathers
/// that undo their reduce-scatters) (exact when the consumers
/// hand the gradient back in the same spec, as a runtime that sums them before reducing
/// does). Graph inputs, and everything computed from inputs alone, have no gradient. An edge
/// out of a fused tensor (fused.hpp) is priced as a plain Shard's: its parts divide evenly, so
/// the plan on core's fused_view, which the executor runs, has the same steps and bytes. A
/// parameter's backward plan is its gradient synchronisation: bucketed like DDP (each
/// collective pays its share bytes / bucket of the latency of a full bucket, default 25 MiB) and
/// partly hidden behind the backward pass (gradient_overlap_model): per edge parameter ->
/// consumer, behind the consumer's own backward compute, or a fixed fraction of it.
#include <algorithm>  // std::min, std::max, std::find_if, std::all_of
#include <array>      // std::array
#include <cmath>      // std::isfinite
#include <cstdint>    // std::int64_t
#include <cstdio>     // std::snprintf
#include <exception>  // std::exception (std::stod's)
#include <initializer_list>  // std::initializer_list
#include <limits>     // std::numeric_limits
#include <map>        // std::map
#include <unordered_map>  // std::unordered_map
#include <optional>   // std::optional
#include <string>     // std::string
#include <utility>    // std::pair
#include <vector>     // std::vector

#include "../core/cost.hpp"          // price_plan, collective_time
#include "../core/error.hpp"         // spec_error
#include "../core/layout.hpp"        // max_local_shape, divides_evenly, no_empty_shards
#include "../core/parse.hpp"         // to_alpa_string
#include "../core/redistribute.hpp"  // plan_redistribute
#include "compute.hpp"               // forward_seconds, kept_for_backward, kept_internal_bytes
#include "device.hpp"                // device_model
#include "pricing.hpp"               // step_pricing, run_mode, optimizer_kind, gradient_overlap_model
#include "fused.hpp"                 // fused_dim_of
#include "model.hpp"                 // model_graph, node, op_kind
#include "validate.hpp"              // topological_order

namespace autoshard {

/// The cost model's options: how a step is priced (step_pricing, one value carried whole from
/// the options to the plan file) and which strategies are offered at all.
struct strategy_options {
  step_pricing pricing{};
  /// Drop strategies that cut a dim into more pieces than it has elements.
  bool drop_empty_shards = true;
  /// Also drop strategies whose sharded dims do not divide evenly (the even-split policy).
  bool even_split_only = false;
};

/// One way to run an operator on the mesh.
struct strategy {
  std::string name;                   ///< "S0R,RS1->S0S1" (Alpa notation, operands then output)
  std::vector<sharding_spec> inputs;  ///< spec each operand must arrive in, operand order
  std::vector<sharding_spec> grads;   ///< training: spec of each operand's gradient (see above)
  sharding_spec output;               ///< spec of the result
  /// Forward, and in training backward too, of every micro-step of the step (x micro_batches).
  double compute_seconds = 0.0;
  /// One micro-step's forward: what recomputation runs again in the backward.
  double forward_compute_seconds = 0.0;
  /// Training: one micro-step's backward (two products per forward one: the gradients of the
  /// operands and of the weight, and what recomputation runs again), the window a parameter's
  /// once-per-step gradient sync hides behind in the last micro-step
  /// (gradient_overlap_model::backward).
  double backward_compute_seconds = 0.0;
  double comm_seconds = 0.0;          ///< the operator's own communication, over the step
  /// Per device: a parameter's weight (and in training its gradient and optimizer state); in
  /// training an operator's output when it is kept for the backward (kept_for_backward) and
  /// what it keeps of its own (kept_internal_bytes), at inference its output.
  std::int64_t memory_bytes = 0;
  std::int64_t kept_internal_bytes = 0;  ///< training: the part of memory_bytes kept of its own
  /// Training: what the operator holds in its layer's backward, where a recomputation makes
  /// again what the plain strategy keeps (memory_bytes but for a recomputed variant).
  std::int64_t recomputed_bytes = 0;
  /// Training, an operator in a transformer layer: what it recomputes in the backward
  /// (recomputed(): the pass offers the variants a layer may take).
  recompute_kind recompute = recompute_kind::none;
  /// Training, a parameter: 1 when its optimizer state is sharded over the mesh axes where the
  /// weight is replicated (ZeRO-1), 2 when its gradient is too (ZeRO-2); 0 otherwise. Its
  /// gradient synchronisation then ends sharded, in `gradient_spec` (a reduce-scatter where
  /// plain data parallelism all-reduces), and comm_seconds is the all-gather of the updated
  /// weight after the optimizer step.
  int zero_stage = 0;
  sharding_spec gradient_spec;        ///< with zero_stage > 0: where the gradient sync ends
  double seconds() const noexcept { return compute_seconds + comm_seconds; }
};

namespace detail {

/// One choice on one mesh axis: a placement per operand, the output's, and which operands
/// end up with a Partial gradient (training).
struct axis_option {
  std::vector<placement> in;
  placement out;
  std::vector<char> grad_partial;
  int row_allreduces = 0;  ///< forward all-reduces of one f32 per local row (vocab-parallel loss)
};

/// An einsum-like description: a label per dim of each operand (-1: broadcast size-1
/// dim) and of the output; labels missing from the output are contracted.
struct einsum_desc {
  std::vector<std::vector<int>> in;
  std::vector<int> out;
  std::vector<char> forced_replicate;  ///< per label
  int labels = 0;
};

inline int find_label(const std::vector<int>& v, int l) {
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] == l) return static_cast<int>(i);
  return -1;
}

inline std::vector<axis_option> einsum_options(const einsum_desc& e, const std::vector<char>& differentiable) {
  const std::size_t n = e.in.size();
  std::vector<axis_option> opts;
  opts.push_back({std::vector<placement>(n, Replicate()), Replicate(), std::vector<char>(n, 0)});
  std::vector<int> order;  // output labels first (in output order), then contracted ones
  for (int l : e.out) order.push_back(l);
  for (const auto& labels : e.in)
    for (int l : labels)
      if (l >= 0 && find_label(order, l) < 0) order.push_back(l);
  for (int l : order) {
    if (e.forced_replicate[static_cast<std::size_t>(l)]) continue;
    const int out_pos = find_label(e.out, l);
    axis_option o;
    o.out = out_pos >= 0 ? Shard(out_pos) : Partial();
    o.grad_partial.assign(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      const int pos = find_label(e.in[i], l);
      if (pos >= 0) o.in.push_back(Shard(pos));
      else if (out_pos < 0) o.in.push_back(Partial());
      else o.in.push_back(Replicate());
      o.grad_partial[i] = o.in.back().is_replicate() && differentiable[i];
    }
    opts.push_back(std::move(o));
  }
  return opts;
}

inline std::vector<int> iota_labels(int n, int first = 0) {
  std::vector<int> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = first + i;
  return v;
}

/// Marks labels `ls` (those >= 0) as never split; every other label may be.
inline void force_replicate(einsum_desc& e, std::initializer_list<int> ls) {
  e.forced_replicate.assign(static_cast<std::size_t>(e.labels), 0);
  for (int l : ls)
    if (l >= 0) e.forced_replicate[static_cast<std::size_t>(l)] = 1;
}

/// linear: x: b.. c ; w: o c (or c o) ; bias: o ; out: b.. o
inline einsum_desc einsum_linear(const node& nd, const std::vector<tensor_shape>& in) {
  einsum_desc e;
  const int r0 = in.empty() ? 0 : in[0].rank;
  std::vector<int> x = iota_labels(r0);  // last label r0-1 is c
  const int c = r0 - 1, o = r0;
  e.labels = r0 + 1;
  e.in.push_back(x);
  e.in.push_back(nd.attrs.transposed_weight ? std::vector<int>{c, o} : std::vector<int>{o, c});
  if (in.size() == 3) e.in.push_back({o});
  e.out = x;
  e.out.back() = o;
  force_replicate(e, {});
  return e;
}

/// matmul: a: b.. m k ; b: (b..) k n ; out: b.. m n
inline einsum_desc einsum_matmul(const std::vector<tensor_shape>& in) {
  einsum_desc e;
  const int r0 = in.empty() ? 0 : in[0].rank;
  const int k = r0, nlab = r0 + 1;
  e.labels = r0 + 2;
  std::vector<int> a = iota_labels(r0);
  a.back() = k;  // a = b.. m k  (m is label r0-2)
  std::vector<int> b = in[1].rank > 2 ? iota_labels(r0 - 2) : std::vector<int>{};
  b.push_back(k);
  b.push_back(nlab);
  e.in = {a, b};
  e.out = iota_labels(r0);
  e.out.back() = nlab;
  force_replicate(e, {});
  return e;
}

/// Broadcasting kinds: every operand's dims line up with the output's from the right (a dim
/// of 1 against a larger one takes no label).
inline einsum_desc einsum_broadcast(const node& nd, const std::vector<tensor_shape>& in) {
  einsum_desc e;
  const int r = nd.shape.rank;
  e.labels = r;
  e.out = iota_labels(r);
  for (const tensor_shape& s : in) {
    std::vector<int> ls(s.rank);
    for (std::size_t d = 0; d < s.rank; ++d) {
      const int l = r - static_cast<int>(s.rank) + static_cast<int>(d);
      ls[d] = (s[d] == 1 && nd.shape[static_cast<std::size_t>(l)] != 1) ? -1 : l;
    }
    e.in.push_back(ls);
  }
  force_replicate(e, {});
  return e;
}

/// Kinds that keep their input's dims: the main operands share the output's labels, a norm's
/// weight and bias take the last; a norm's features and a softmax's, split's or concat's
/// axis are never split.
inline einsum_desc einsum_same_dims(const node& nd, const std::vector<tensor_shape>& in) {
  einsum_desc e;
  const int r0 = in.empty() ? 0 : in[0].rank;
  e.labels = r0;
  e.out = iota_labels(r0);
  const bool norm = nd.kind == op_kind::layer_norm || nd.kind == op_kind::rms_norm;
  const std::size_t n_main = norm ? 1 : in.size();
  for (std::size_t i = 0; i < n_main; ++i) e.in.push_back(e.out);
  for (std::size_t i = n_main; i < in.size(); ++i) e.in.push_back({r0 - 1});  // norm weight / bias
  int f = -1;
  if (norm) f = r0 - 1;
  else if (nd.kind == op_kind::softmax || nd.kind == op_kind::split || nd.kind == op_kind::concat)
    f = norm_axis(nd.attrs.axis, r0);
  force_replicate(e, {f});
  return e;
}

/// Einsum description of the kinds that have one; nullopt for the others.
inline std::optional<einsum_desc> einsum_of(const node& nd, const std::vector<tensor_shape>& in) {
  einsum_desc e;
  const int r0 = in.empty() ? 0 : in[0].rank;
  switch (nd.kind) {
    case op_kind::linear: return einsum_linear(nd, in);
    case op_kind::matmul: return einsum_matmul(in);
    case op_kind::add:
    case op_kind::sub:
    case op_kind::mul:
    case op_kind::div:
    case op_kind::where:
    case op_kind::expand: return einsum_broadcast(nd, in);
    case op_kind::opaque:
      if (nd.attrs.elementwise) return einsum_broadcast(nd, in);  // splits as add does
      return std::nullopt;
    case op_kind::layer_norm:
    case op_kind::rms_norm:
    case op_kind::softmax:
    case op_kind::split:
    case op_kind::concat:
    case op_kind::gelu:
    case op_kind::gelu_erf:
    case op_kind::silu:
    case op_kind::relu:
    case op_kind::tanh:
    case op_kind::exp:
    case op_kind::dropout:
    case op_kind::rotary: return einsum_same_dims(nd, in);
    case op_kind::transpose: {
      e.labels = r0;
      e.in.push_back(iota_labels(r0));
      for (std::int64_t p : nd.attrs.dims) e.out.push_back(static_cast<int>(p));
      force_replicate(e, {});
      return e;
    }
    case op_kind::reduce_sum:
    case op_kind::reduce_mean: {
      e.labels = r0;
      e.in.push_back(iota_labels(r0));
      for (int d = 0; d < r0; ++d)
        if (std::find(nd.attrs.dims.begin(), nd.attrs.dims.end(), d) == nd.attrs.dims.end()) e.out.push_back(d);
      force_replicate(e, {});
      return e;
    }
    case op_kind::cross_entropy: {  // logits: b.. v ; labels: b.. ; out: scalar (mean)
      e.labels = r0;
      e.in.push_back(iota_labels(r0));
      e.in.push_back(iota_labels(r0 - 1));
      force_replicate(e, {r0 - 1});
      return e;
    }
    default: return std::nullopt;
  }
}

/// Groups of input and output dims of a reshape that cover the same elements; each group
/// is represented by its first dim larger than one.
inline std::vector<std::pair<int, int>> reshape_groups(const tensor_shape& a, const tensor_shape& b) {
  std::vector<std::pair<int, int>> out;
  std::size_t i = 0, j = 0;
  while (i < a.rank && j < b.rank) {
    int fa = -1, fb = -1;
    auto take_a = [&] { if (fa < 0 && a[i] > 1) fa = static_cast<int>(i); return a[i++]; };
    auto take_b = [&] { if (fb < 0 && b[j] > 1) fb = static_cast<int>(j); return b[j++]; };
    std::int64_t pa = take_a(), pb = take_b();
    while (pa != pb) {
      if (pa < pb && i < a.rank) pa *= take_a();
      else if (pb < pa && j < b.rank) pb *= take_b();
      else return out;  // sizes do not line up (only with zero-sized dims)
    }
    if (fa >= 0 && fb >= 0) out.emplace_back(fa, fb);
  }
  return out;
}

/// Whether each vertex has a gradient (requires_grad), for the whole graph in one topological
/// sweep: what every pass over all vertices or edges uses (requires_grad per vertex walks its
/// ancestors, which made planning quadratic in a model's depth).
inline std::vector<char> gradient_flags(const model_graph& g) {
  std::vector<char> grad(boost::num_vertices(g), 0);
  for (const vertex_t v : topological_order(g)) {
    const node& n = g[v];
    if (is_integer(n.type)) continue;
    grad[v] = n.is_parameter();
    for (auto [e, end] = boost::in_edges(v, g); e != end && !grad[v]; ++e) grad[v] = grad[boost::source(*e, g)];
  }
  return grad;
}

/// Whether vertex `v` has a gradient: a floating-point parameter, or an operator with a
/// differentiable operand that has one. Graph inputs (token ids, `x`) have none. Walks v's
/// ancestors: for many vertices, gradient_flags once.
inline bool requires_grad(const model_graph& g, vertex_t v) {
  std::vector<vertex_t> stack{v};
  std::vector<char> seen(boost::num_vertices(g), 0);
  seen[v] = 1;
  while (!stack.empty()) {
    const vertex_t u = stack.back();
    stack.pop_back();
    const node& n = g[u];
    if (is_integer(n.type)) continue;
    if (n.is_parameter()) return true;
    for (auto [e, end] = boost::in_edges(u, g); e != end; ++e) {
      const vertex_t w = boost::source(*e, g);
      if (!seen[w]) seen[w] = 1, stack.push_back(w);
    }
  }
  return false;
}

/// The per-axis options of `v` (the same list on every mesh axis).
/// `grads`: gradient_flags(g), or empty to ask requires_grad of each operand.
inline std::vector<axis_option> axis_options(const model_graph& g, vertex_t v, const std::vector<vertex_t>& ops,
                                             const std::vector<tensor_shape>& in, const std::vector<char>& grads = {}) {
  const node& nd = g[v];
  std::vector<char> diff;
  for (vertex_t u : ops) diff.push_back(grads.empty() ? requires_grad(g, u) : grads[u]);
  if (auto e = einsum_of(nd, in)) {
    std::vector<axis_option> o = einsum_options(*e, diff);
    if (nd.kind == op_kind::split && fused_dim_of(g, ops[0]).dim == norm_axis(nd.attrs.axis, in[0].rank)) {
      // The operand is fused on the split axis and this split reads one whole part: a Shard of
      // it holds every rank's piece of that part, which is the part sharded (fused.hpp).
      const int ax = norm_axis(nd.attrs.axis, in[0].rank);
      o.push_back({{Shard(ax)}, Shard(ax), {0}});
    }
    if (nd.kind == op_kind::cross_entropy) {
      // vocab-parallel (Megatron): each rank holds a slice of the vocabulary; the row max,
      // the sum of exponentials and the target logit are all-reduced over the axis, after
      // which every rank has the whole loss of its rows.
      o.push_back({{Shard(in[0].rank - 1), Replicate()}, Replicate(), {0, 0}, 3});
    }
    return o;
  }
  std::vector<axis_option> o;
  const std::size_t n = ops.size();
  auto opt = [&](std::vector<placement> p, placement out) {
    axis_option a{std::move(p), out, std::vector<char>(n, 0)};
    bool any = !out.is_replicate();
    for (std::size_t i = 0; i < n; ++i) any = any || !a.in[i].is_replicate();
    for (std::size_t i = 0; i < n; ++i) a.grad_partial[i] = any && a.in[i].is_replicate() && diff[i];
    o.push_back(std::move(a));
  };
  switch (nd.kind) {
    case op_kind::input:
    case op_kind::parameter:
      opt({}, Replicate());
      for (int d = 0; d < nd.shape.rank; ++d) opt({}, Shard(d));
      break;
    case op_kind::embedding: {  // ids, table
      opt({Replicate(), Replicate()}, Replicate());
      for (int d = 0; d < in[0].rank; ++d) opt({Shard(d), Replicate()}, Shard(d));  // batch / sequence
      opt({Replicate(), Shard(1)}, Shard(in[0].rank));                              // column
      opt({Replicate(), Shard(0)}, Partial());                                      // vocab-parallel
      break;
    }
    case op_kind::attention: {
      // A key/value cache (operands 3, 4) is laid out as the step's own keys and values.
      const auto qkv = [&](placement q, placement kv) {
        std::vector<placement> p{q, kv, kv};
        if (n == 5) p.insert(p.end(), {kv, kv});
        return p;
      };
      opt(qkv(Replicate(), Replicate()), Replicate());
      opt(qkv(Shard(0), Shard(0)), Shard(0));  // batch
      opt(qkv(Shard(2), Shard(2)), Shard(2));  // heads
      // Query heads split, the key/value heads whole on every rank: the replicated KV projection
      // when there are fewer KV heads than ranks (or a count they do not divide). Each rank reads
      // the KV heads of its query heads; their gradients are partial sums over the ranks.
      opt(qkv(Shard(2), Replicate()), Shard(2));
      break;
    }
    case op_kind::reshape:
      opt({Replicate()}, Replicate());
      for (auto [a, b] : reshape_groups(in[0], nd.shape)) opt({Shard(a)}, Shard(b));
      break;
    case op_kind::opaque:  // nothing is known of how it could be split: every operand and the output whole
      opt(std::vector<placement>(n, Replicate()), Replicate());
      break;
    default: break;
  }
  return o;
}

/// Kind-specific validity of a whole strategy beyond the generic size checks.
inline bool kind_accepts(const node& nd, const device_mesh& m, const std::vector<sharding_spec>& in_specs,
                         const std::vector<tensor_shape>& in, const sharding_spec& out_spec) {
  switch (nd.kind) {
    case op_kind::attention: {
      // Whole heads on every rank, and each rank's query heads read key/value heads it holds:
      // split the same way (GQA groups kept together) or the key/values whole.
      const int kv = nd.attrs.kv_heads > 0 ? nd.attrs.kv_heads : nd.attrs.heads;
      const int k = in_specs[0].shard_count(m, 2), kk = in_specs[1].shard_count(m, 2);
      if (nd.attrs.heads % k != 0) return false;
      return kk == 1 ? !(in_specs[1] == in_specs[0]) || k == 1 : kv % k == 0 && in_specs[1] == in_specs[0];
    }
    case op_kind::rotary: return nd.attrs.heads % in_specs[0].shard_count(m, in[0].rank - 1) == 0;
    case op_kind::reshape: return divides_evenly(m, in_specs[0], in[0]) && divides_evenly(m, out_spec, nd.shape);
    default: return true;
  }
}

inline std::int64_t local_bytes(const device_mesh& m, const sharding_spec& s, const tensor_shape& shape, dtype t) {
  return max_local_shape(m, s, shape).numel() * static_cast<std::int64_t>(dtype_size(t));
}

}  // namespace detail

/// One collective of a parameter's synchronisation (its gradient's reduction, ZeRO's
/// all-gather of the updated weight), bucketed like DDP: it pays its share, bytes / bucket, of
/// the latency of a full bucket (bucket 0: the whole latency).
inline double bucketed_seconds(const device_mesh& m, const priced_step& p, double bucket_bytes) {
  if (!is_communication(p.step.kind) || p.seconds <= 0) return 0.0;
  if (bucket_bytes <= 0) return p.seconds;
  const double latency = collective_time(p.step.kind, m.link(p.step.mesh_axis), p.group_size, 0.0);
  const double share = std::min(1.0, static_cast<double>(p.bytes) / bucket_bytes);
  return p.seconds - latency + latency * share;
}

/// The spec of a parameter's ZeRO shard when it is held as `out`: every mesh axis of more
/// than one rank where it is replicated shards its largest local dim (ZeRO flattens the
/// tensor; a dim keeps shards whole rows). None when there is no such axis, or a shard would
/// be empty. A fused dim (`keep`, fused.hpp) is never the ZeRO dim: its parts need not divide
/// evenly that finely. ZeRO shards the local tensor, so the shard is a piece of `out`'s
/// local block: a dim already split by a mesh axis after a ZeRO axis is passed over where
/// another dim can be split (a spec splits a dim over mesh axes in axis order, and the ZeRO
/// axis would come first: its all-gather would then be a shuffle, not a gather of blocks).
inline std::optional<sharding_spec> zero_spec(const device_mesh& m, const sharding_spec& out, const tensor_shape& shape,
                                              int keep = -1) {
  if (shape.rank == 0) return std::nullopt;
  const tensor_shape local = max_local_shape(m, out, shape);
  std::size_t first_zero_axis = out.mesh_rank;
  for (std::size_t a = 0; a < out.mesh_rank && a < max_mesh_rank; ++a)
    if (out[a].is_replicate() && m.size(a) > 1) first_zero_axis = std::min(first_zero_axis, a);
  const auto nested = [&](std::size_t i) {  // the ZeRO axes split dim i inside out's split of it
    for (std::size_t a = first_zero_axis + 1; a < out.mesh_rank && a < max_mesh_rank; ++a)
      if (out[a].is_shard(static_cast<int>(i))) return false;
    return true;
  };
  int d = -1;
  for (bool need_nested : {true, false}) {
    for (std::size_t i = 0; i < shape.rank; ++i)
      if (static_cast<int>(i) != keep && (!need_nested || nested(i)) && (d < 0 || local[i] > local[static_cast<std::size_t>(d)]))
        d = static_cast<int>(i);
    if (d >= 0) break;
  }
  if (d < 0) return std::nullopt;
  sharding_spec z = out;
  bool any = false;
  // The max_mesh_rank bound is implied by mesh_rank; GCC 12 at -O3 cannot see it and warns
  // (stringop-overflow) in the release build.
  for (std::size_t a = 0; a < out.mesh_rank && a < max_mesh_rank; ++a)
    if (out[a].is_replicate() && m.size(a) > 1) z[a] = Shard(d), any = true;
  if (!any || !no_empty_shards(m, z, shape)) return std::nullopt;
  return z;
}

namespace detail {

/// The ZeRO-1 and ZeRO-2 variants of parameter strategy `s` (training). Per device, with e
/// the weight's bytes per element, S the optimizer's (f32 master and moments: 12 B for
/// mixed-precision Adam), n elements held and n_z in the ZeRO shard:
///   plain data parallel  (2e + S) n        ZeRO-1  2e n + S n_z        ZeRO-2  e n + (e + S) n_z
/// Both reduce-scatter the gradient (on the edges) and all-gather the updated weight
/// (comm_seconds, bucketed): the bytes of one all-reduce, as the ZeRO paper counts them.
inline std::vector<strategy> zero_variants(const device_mesh& m, const strategy& s, const node& nd, const strategy_options& opt,
                                           fused_dim fused = {}) {
  std::vector<strategy> out;
  const std::optional<sharding_spec> z = zero_spec(m, s.output, nd.shape, fused.any() ? fused.dim : -1);
  if (!z) return out;
  const auto e = static_cast<std::int64_t>(dtype_size(nd.type));
  const std::int64_t state = parameter_state_bytes(nd.type, opt.pricing.optimizer) - 2 * e;
  const std::int64_t n = max_local_shape(m, s.output, nd.shape).numel(), nz = max_local_shape(m, *z, nd.shape).numel();
  double gather = 0.0;
  for (const priced_step& p : price_plan(m, plan_redistribute(m, *z, s.output, nd.shape), nd.shape, nd.type))
    gather += bucketed_seconds(m, p, opt.pricing.gradient_bucket_bytes);
  for (int stage : {1, 2}) {
    if (stage == 1 && state == 0) continue;  // no optimizer state to shard: ZeRO-1 is plain data parallelism
    strategy v = s;
    v.zero_stage = stage;
    v.gradient_spec = *z;
    v.memory_bytes = stage == 1 ? 2 * e * n + state * nz : e * n + (e + state) * nz;
    v.comm_seconds += gather;
    v.name += stage == 1 ? " zero-1" : " zero-2";
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace detail

/// The variant of operator strategy `s` that recomputes `r` in the backward: one more forward
/// per micro-step (`micro_batches` of them over the step; each in its micro-step's backward,
/// which it widens), holding `memory` bytes to the end of the forward instead of
/// s.memory_bytes (what the layer's recomputation leaves it to keep: the pass decides). Its
/// name says so (" recompute-full"), so a plan file names the variant it chose.
inline strategy recomputed(const strategy& s, recompute_kind r, std::int64_t memory, int micro_batches) {
  strategy v = s;
  v.recompute = r;
  v.compute_seconds += micro_batches * s.forward_compute_seconds;
  v.backward_compute_seconds += s.forward_compute_seconds;
  v.memory_bytes = memory;
  v.kept_internal_bytes = std::min(v.kept_internal_bytes, memory);
  v.recomputed_bytes = r == recompute_kind::full ? s.memory_bytes : memory;  // full makes again what the plain one keeps
  v.name += " recompute-" + std::string(to_string(r));
  return v;
}

namespace detail {

/// One vertex's strategies being enumerated: its operands, the per-axis options of its kind,
/// and what pricing them needs. A strategy is one option per mesh axis (`pick`).
struct vertex_strategies {
  const model_graph& g;
  vertex_t v;
  const node& nd;
  const device_mesh& m;
  const strategy_options& opt;
  std::vector<vertex_t> ops;
  std::vector<tensor_shape> in;
  std::vector<axis_option> options;
  int axes;
  bool train, kept;
  double steps;  // micro-steps per step
  fused_dim out_fused;
  std::vector<fused_dim> in_fused;

  vertex_strategies(const model_graph& graph, vertex_t vertex, const device_mesh& mesh, const strategy_options& o,
                    const std::vector<char>& grads)
      : g(graph),
        v(vertex),
        nd(graph[vertex]),
        m(mesh),
        opt(o),
        ops(operands(graph, vertex)),
        in(operand_shapes(graph, vertex)),
        options(axis_options(graph, vertex, ops, in, grads)),
        axes(static_cast<int>(mesh.ndim())),
        train(o.pricing.mode == run_mode::training),
        kept(train && kept_for_backward(graph, vertex)),
        steps(train ? o.pricing.accumulation() : 1.0),
        out_fused(fused_dim_of(graph, vertex)) {
    for (vertex_t u : ops) in_fused.push_back(fused_dim_of(graph, u));
  }

  const axis_option& option(const std::array<std::size_t, max_mesh_rank>& pick, int a) const {
    return options[pick[static_cast<std::size_t>(a)]];
  }

  /// The specs of `pick`, empty when a tensor's split is refused (empty shards, uneven splits
  /// or fused parts cut, as the options ask) or the kind does not accept them.
  std::optional<strategy> specs(const std::array<std::size_t, max_mesh_rank>& pick) const {
    strategy s;
    s.inputs.assign(ops.size(), replicated_spec(axes, 0));
    for (std::size_t i = 0; i < ops.size(); ++i) s.inputs[i].tensor_rank = in[i].rank;
    s.output = replicated_spec(axes, nd.shape.rank);
    for (int a = 0; a < axes; ++a) {
      const axis_option& o = option(pick, a);
      for (std::size_t i = 0; i < ops.size(); ++i) s.inputs[i][static_cast<std::size_t>(a)] = o.in[i];
      s.output[static_cast<std::size_t>(a)] = o.out;
    }
    bool ok = true;
    for (std::size_t i = 0; ok && i < ops.size(); ++i) ok = fits(s.inputs[i], in[i], in_fused[i]);
    ok = ok && fits(s.output, nd.shape, out_fused) && kind_accepts(nd, m, s.inputs, in, s.output);
    if (!ok) return std::nullopt;
    return s;
  }

  bool fits(const sharding_spec& sp, const tensor_shape& sh, fused_dim f) const {
    return (!opt.drop_empty_shards || no_empty_shards(m, sp, sh)) && (!opt.even_split_only || divides_evenly(m, sp, sh)) &&
           fused_parts_divide(m, sp, sh, f);
  }

  /// The compute, memory and communication of strategy `s` (chosen by `pick`), and in training
  /// its gradients' layouts.
  void price(strategy& s, const std::array<std::size_t, max_mesh_rank>& pick) const {
    std::vector<tensor_shape> local_in;
    std::vector<dtype> types;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      local_in.push_back(max_local_shape(m, s.inputs[i], in[i]));
      types.push_back(g[ops[i]].type);
    }
    std::int64_t out_bytes = local_bytes(m, s.output, nd.shape, nd.type);
    if (nd.is_operator()) {
      const tensor_shape local_out = max_local_shape(m, s.output, nd.shape);
      const double bytes = bytes_moved(nd, local_in, types, local_out);
      s.forward_compute_seconds = forward_seconds(nd, local_in, local_out, bytes, opt.pricing);
      s.backward_compute_seconds = train ? backward_seconds(nd, local_in, types, local_out, s.forward_compute_seconds, opt.pricing) : 0.0;
      s.compute_seconds = steps * (s.forward_compute_seconds + s.backward_compute_seconds);
      // A contiguous view of a parameter (a position table's rows from P on) is the
      // parameter's memory, counted there; a view of an activation keeps that activation's
      // storage alive as long as it is, its own bytes' worth (q, k and v of one projection
      // together hold all of it).
      if (nd.kind == op_kind::split && is_contiguous_view(nd, local_in[0]) && g[ops[0]].is_parameter()) out_bytes = 0;
      if (train) {
        s.kept_internal_bytes = kept_internal_bytes(nd, local_in, local_out, opt.pricing);
        s.memory_bytes = (kept ? out_bytes : 0) + s.kept_internal_bytes;
        s.recomputed_bytes = s.memory_bytes;
      } else {
        s.memory_bytes = out_bytes;
      }
    } else {
      s.memory_bytes = train && nd.is_parameter()
                           ? out_bytes / static_cast<std::int64_t>(dtype_size(nd.type)) * parameter_state_bytes(nd.type, opt.pricing.optimizer)
                           : out_bytes;
    }
    for (int a = 0; a < axes; ++a) {
      const axis_option& o = option(pick, a);
      if (o.row_allreduces > 0)
        s.comm_seconds += steps * o.row_allreduces * collective_time(collective::all_reduce, m.link(static_cast<std::size_t>(a)),
                                                             m.size(static_cast<std::size_t>(a)),
                                                             static_cast<double>(local_in[1].numel() * 4));
    }
    if (train) {
      s.grads = s.inputs;
      for (int a = 0; a < axes; ++a) {
        const axis_option& o = option(pick, a);
        for (std::size_t i = 0; i < ops.size(); ++i) {
          placement& gp = s.grads[i][static_cast<std::size_t>(a)];
          if (o.grad_partial[i]) gp = Partial();
          else if (gp.is_partial()) gp = Replicate();
        }
      }
    }
  }
};

}  // namespace detail

/// Every strategy of vertex `v` on mesh `m`, priced. Source vertices (inputs, parameters)
/// offer Replicate or Shard(d) per mesh axis. `grads`: detail::gradient_flags(g) when enumerating
/// many vertices (empty: v's operands are looked up one by one).
inline std::vector<strategy> enumerate_strategies(const model_graph& g, vertex_t v, const device_mesh& m,
                                                  const strategy_options& opt = {}, const std::vector<char>& grads = {}) {
  const detail::vertex_strategies vs(g, v, m, opt, grads);
  const node& nd = vs.nd;
  if (vs.options.empty()) throw graph_error("vertex " + quoted_text(nd.name) + ": no strategies for kind " + std::string(to_string(nd.kind)));
  // On a mesh axis of one rank every option is the whole tensor (a Shard is one piece, a
  // Partial one term): only the all-Replicate option is offered there, so such an axis neither
  // multiplies the strategies nor shows a split that does nothing.
  std::array<std::vector<std::size_t>, max_mesh_rank> offered;
  const auto whole = std::find_if(vs.options.begin(), vs.options.end(), [](const detail::axis_option& o) {
    return o.out.is_replicate() && std::all_of(o.in.begin(), o.in.end(), [](const placement& p) { return p.is_replicate(); });
  });
  std::size_t total = 1;
  for (int a = 0; a < vs.axes; ++a) {
    auto& list = offered[static_cast<std::size_t>(a)];
    if (m.size(static_cast<std::size_t>(a)) == 1 && whole != vs.options.end())
      list.push_back(static_cast<std::size_t>(whole - vs.options.begin()));
    else
      for (std::size_t i = 0; i < vs.options.size(); ++i) list.push_back(i);
    total *= list.size();
  }
  std::vector<strategy> out;
  std::array<std::size_t, max_mesh_rank> pick{};
  for (std::size_t code = 0; code < total; ++code) {
    std::size_t c = code;
    for (int a = vs.axes - 1; a >= 0; --a) {
      const auto& list = offered[static_cast<std::size_t>(a)];
      pick[static_cast<std::size_t>(a)] = list[c % list.size()];
      c /= list.size();
    }
    std::optional<strategy> candidate = vs.specs(pick);
    if (!candidate) continue;
    strategy& s = *candidate;
    vs.price(s, pick);
    for (std::size_t i = 0; i < vs.ops.size(); ++i) s.name += (i ? "," : "") + to_alpa_string(s.inputs[i]);
    s.name += "->" + to_alpa_string(s.output);
    std::vector<strategy> zero;
    if (vs.train && opt.pricing.zero && nd.is_parameter() && !detail::is_integer(nd.type))
      zero = detail::zero_variants(m, s, nd, opt, vs.out_fused);
    out.push_back(std::move(s));
    for (strategy& z : zero) out.push_back(std::move(z));
  }
  return out;
}

/// Strategies of every vertex, indexed by vertex.
inline std::vector<std::vector<strategy>> enumerate_all_strategies(const model_graph& g, const device_mesh& m,
                                                                  const strategy_options& opt = {}) {
  std::vector<std::vector<strategy>> all(boost::num_vertices(g));
  const std::vector<char> grads = detail::gradient_flags(g);
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) all[v] = enumerate_strategies(g, v, m, opt, grads);
  return all;
}

/// The target of a Shard -> Partial edge: Shard goes through Replicate (all-gather, then
/// keep the value on one rank).
inline sharding_spec settle_target(const sharding_spec& from, const sharding_spec& to) {
  sharding_spec t = to;
  for (std::size_t a = 0; a < to.mesh_rank; ++a)
    if (to[a].is_partial() && from[a].is_shard()) t[a] = Replicate();
  return t;
}

/// The spec a tensor produced as `out` takes its gradient in: Partial axes become Replicate.
inline sharding_spec gradient_target(const sharding_spec& out) {
  sharding_spec t = out;
  for (std::size_t a = 0; a < out.mesh_rank; ++a)
    if (out[a].is_partial()) t[a] = Replicate();
  return t;
}

/// How the backward of one edge is priced (see the header comment).
struct backward_pricing {
  bool parameter = false;  ///< the producer is a parameter: its reductions are gradient sync
  int consumers = 1;       ///< differentiable consumer edges of the producer
  double bucket_bytes = 0; ///< gradient bucket (parameters); 0: per tensor
  gradient_overlap_model overlap{};  ///< how much of a parameter's gradient sync the backward hides
  int micro_batches = 1;   ///< micro-steps per step (step_pricing::accumulation)
  friend bool operator==(const backward_pricing&, const backward_pricing&) = default;
};

/// Whether a parameter held as `producer` synchronises the gradient `grad` a consumer hands it
/// once per step (accumulated whole over the micro-steps, then reduced: DDP's no_sync,
/// Megatron-LM's gradient buffer, ZeRO-1's one reduce-scatter) rather than at every micro-step
/// (the gradient ends sharded on an axis where the consumer's is a Partial sum: ZeRO-2's and
/// ZeRO-3's (FSDP's) reduce-scatter, whose memory holds only the shard). ZeRO-1 keeps the
/// whole gradient, so it reduces once.
inline bool syncs_once_per_step(const strategy& producer, const sharding_spec& target, const sharding_spec& grad) {
  if (producer.zero_stage == 1) return true;
  for (std::size_t a = 0; a < grad.mesh_rank; ++a)
    if (grad[a].is_partial() && target[a].is_shard()) return false;
  return true;
}

/// Seconds of one priced step in the backward pass. `reduction`: the step is part of reducing
/// a Partial gradient (the reduction itself, or the all-gather that undoes a reduce-scatter of
/// the same plan); those are shared by the producer's consumers. Every step of a parameter's
/// plan is gradient synchronisation: bucketed (the part the backward hides is taken off the
/// whole edge, by edge_pricer: it depends on the consumer's strategy).
inline double backward_step_seconds(const device_mesh& m, const priced_step& p, const backward_pricing& b, bool reduction) {
  if (!is_communication(p.step.kind) || p.seconds <= 0) return 0.0;
  double s = b.parameter ? bucketed_seconds(m, p, b.bucket_bytes) : p.seconds;
  if (reduction && b.consumers > 1) s /= b.consumers;
  return s;
}

/// Which steps of a backward plan reduce a Partial gradient (see backward_step_seconds).
inline std::array<bool, redist_plan::capacity> reduction_steps(const plan_cost& c) {
  std::array<bool, redist_plan::capacity> r{};
  std::array<bool, max_mesh_rank> scattered{};
  for (std::size_t i = 0; i < c.size(); ++i) {
    const redist_step& st = c[i].step;
    r[i] = st.from.is_partial() || (st.kind == collective::all_gather && scattered[st.mesh_axis]);
    if (st.kind == collective::reduce_scatter) scattered[st.mesh_axis] = true;
  }
  return r;
}

namespace detail {
/// FNV-1a over 64-bit words: the hash of plan_price_cache's keys and of edge_pricing_inputs.
inline constexpr std::uint64_t fnv1a_offset = 1469598103934665603ull;
constexpr std::uint64_t fnv1a(std::uint64_t h, std::uint64_t word) noexcept { return (h ^ word) * 1099511628211ull; }

/// A placement as one word: its kind, and a Shard's dim or a Partial's op.
constexpr std::int64_t placement_word(const placement& p) noexcept {
  const std::int64_t detail = p.is_shard() ? p.dim : p.is_partial() ? static_cast<std::int64_t>(p.op) : 0;
  return static_cast<std::int64_t>(p.kind) << 16 | (detail & 0xffff);
}

/// Whether a step priced by `opt` carries a gradient back into vertex u: a training step, and u
/// requires one (`grads`: gradient_flags(g), or empty: u is looked up).
inline bool gradient_flows(const model_graph& g, vertex_t u, const strategy_options& opt, const std::vector<char>& grads) {
  return opt.pricing.mode == run_mode::training && (grads.empty() ? requires_grad(g, u) : grads[u] != 0);
}
}  // namespace detail

/// Redistribution plans priced once per (from, to, shape, dtype) on one mesh. The pass prices
/// every edge of a model for every pair of its strategies, and the edges of a model carry a
/// few shapes (each layer's activations and weights, again in every layer) between the same
/// few dozen specs: each distinct plan is planned and priced once instead of once per edge
/// (planning and pricing them was most of the time of pricing a model's edges). Bounded:
/// beyond `max_entries` distinct plans (about 1 KiB each), the rest are priced uncached.
class plan_price_cache {
 public:
  explicit plan_price_cache(const device_mesh& m, std::size_t max_entries = std::size_t{1} << 14)
      : m_(m), max_(max_entries) {}
  const device_mesh& mesh() const noexcept { return m_; }
  /// price_plan(m, plan_redistribute(m, from, to, shape), shape, t), priced once.
  plan_cost operator()(const sharding_spec& from, const sharding_spec& to, const tensor_shape& shape, dtype t) {
    const key k = key_of(from, to, shape, t);
    if (auto it = prices_.find(k); it != prices_.end()) return it->second;
    const plan_cost c = price_plan(m_, plan_redistribute(m_, from, to, shape), shape, t);
    if (prices_.size() < max_) prices_.emplace(k, c);
    return c;
  }
  std::size_t size() const noexcept { return prices_.size(); }

 private:
  // Mesh and tensor ranks, each placement as (kind, dim, op), the dims, the dtype.
  using key = std::array<std::int64_t, 2 + 2 * max_mesh_rank + max_tensor_rank + 2>;
  struct key_hash {
    std::size_t operator()(const key& k) const noexcept {
      std::uint64_t h = detail::fnv1a_offset;
      for (std::int64_t x : k) h = detail::fnv1a(h, static_cast<std::uint64_t>(x));
      return static_cast<std::size_t>(h);
    }
  };
  static key key_of(const sharding_spec& from, const sharding_spec& to, const tensor_shape& shape, dtype t) noexcept {
    key k{};
    std::size_t i = 0;
    k[i++] = from.mesh_rank | from.tensor_rank << 8 | to.mesh_rank << 16 | to.tensor_rank << 24;
    k[i++] = static_cast<std::int64_t>(t) | static_cast<std::int64_t>(shape.rank) << 8;
    for (std::size_t a = 0; a < max_mesh_rank; ++a) {
      k[i++] = a < from.mesh_rank ? detail::placement_word(from[a]) : -1;
      k[i++] = a < to.mesh_rank ? detail::placement_word(to[a]) : -1;
    }
    for (std::size_t d = 0; d < max_tensor_rank; ++d) k[i++] = d < shape.rank ? shape.dims[d] : -1;
    return k;
  }
  const device_mesh& m_;
  std::size_t max_;
  std::unordered_map<key, plan_cost, key_hash> prices_;
};

namespace detail {
inline double resharding_seconds(plan_price_cache& prices, const sharding_spec& from, const sharding_spec& to,
                                 const tensor_shape& shape, dtype t, run_mode mode) {
  for (std::size_t a = 0; a < to.mesh_rank; ++a)
    if (to[a].is_partial() && from[a].is_partial() && !(to[a] == from[a])) return std::numeric_limits<double>::infinity();
  double s = prices(from, settle_target(from, to), shape, t).seconds;
  if (mode == run_mode::training) {
    sharding_spec grad = to;
    for (std::size_t a = 0; a < to.mesh_rank; ++a)
      if (grad[a].is_partial()) grad[a] = Replicate();
    s += prices(grad, gradient_target(from), shape, t).seconds;
  }
  return s;
}

inline double backward_seconds(plan_price_cache& prices, const sharding_spec& target, const sharding_spec& grad,
                               const tensor_shape& shape, dtype t, const backward_pricing& b) {
  const plan_cost c = prices(grad, target, shape, t);
  const std::array<bool, redist_plan::capacity> red = reduction_steps(c);
  double s = 0;
  for (std::size_t i = 0; i < c.size(); ++i) s += backward_step_seconds(prices.mesh(), c[i], b, red[i]);
  return s;
}
}  // namespace detail

/// Seconds to turn a tensor held as `from` into `to` (forward only). Shard -> Partial goes
/// through Replicate; impossible transitions (Partial(op) -> another Partial) are +infinity.
/// Training without a gradient spec adds the adjoint of a consumer whose gradient is laid out
/// as its input (no Partial): the plan from `to` back to `from`'s gradient layout.
inline double resharding_seconds(const device_mesh& m, const sharding_spec& from, const sharding_spec& to,
                                 const tensor_shape& shape, dtype t, run_mode mode) {
  plan_price_cache prices(m, 0);
  return detail::resharding_seconds(prices, from, to, shape, t, mode);
}

/// Where the gradient of `producer`'s output is taken back to: a ZeRO parameter's
/// gradient_spec, otherwise its output with Partial axes Replicate.
inline sharding_spec backward_target(const strategy& producer) {
  return producer.zero_stage > 0 ? producer.gradient_spec : gradient_target(producer.output);
}

/// Seconds of the backward of an edge: the consumer's gradient `grad` of the operand, taken
/// back to `target` (backward_target of the producer's strategy).
inline double backward_seconds(const device_mesh& m, const sharding_spec& target, const sharding_spec& grad,
                               const tensor_shape& shape, dtype t, const backward_pricing& b) {
  plan_price_cache prices(m, 0);
  return detail::backward_seconds(prices, target, grad, shape, t, b);
}

/// Everything one edge costs: forward resharding, and in training the backward of it and,
/// out of a parameter, its forward plan once more: the weight gathered again for the
/// backward, as ZeRO-3 and FSDP do (a gathered copy is not kept: no memory counts it).
/// Out of a parameter, `backward` is the gradient sync's exposed part, `sync` all of it.
/// Over the step: every micro-step's forward resharding (twice into an operator whose layer
/// is fully recomputed: the recomputed forward reshards again) and activation backward; out
/// of a parameter, every micro-step's re-gather, and the gradient sync once per step or at
/// every micro-step (syncs_once_per_step).
struct edge_costs {
  double forward = 0, backward = 0, regather = 0;
  double sync = 0;  ///< a parameter's gradient sync on this edge over the step, before the backward hides any
  double total() const noexcept { return forward + backward + regather; }
};

/// How the backward of edge `e` is priced, from the graph and the options.
inline backward_pricing backward_pricing_of(const model_graph& g, edge_t e, const strategy_options& opt) {
  backward_pricing b;
  const vertex_t u = boost::source(e, g);
  b.parameter = g[u].is_parameter();
  b.bucket_bytes = opt.pricing.gradient_bucket_bytes;
  b.overlap = opt.pricing.gradient_overlap;
  b.consumers = 0;
  for (auto [o, end] = boost::out_edges(u, g); o != end; ++o) b.consumers += detail::is_integer(g[boost::target(*o, g)].type) ? 0 : 1;
  b.consumers = std::max(1, b.consumers);
  b.micro_batches = opt.pricing.accumulation();
  return b;
}

/// Prices one graph edge for any pair of producer and consumer strategies: forward, backward
/// and re-gather (edge_costs). The forward plan depends on (output spec, input spec) only and
/// the backward on (backward target, gradient spec) only, so each distinct pair is priced
/// once (a few dozen distinct specs per edge, compared as values); the part of a parameter's
/// gradient sync that the consumer's backward hides is then taken off per pair. A matrix of
/// P x C pairs looks each strategy's specs up once (producer_key, consumer_key): P + C spec
/// comparisons rather than 2·P·C (a recomputation variant has its plain strategy's specs, so a
/// layer's matrices grow fourfold with them, and the lookups were most of their pricing).
class edge_pricer {
 public:
  /// `grad_flows`: the producer has a gradient (requires_grad) and the mode is training.
  /// `prices`: plans priced across edges (a cache on `m` that outlives the pricer), or none:
  /// the pricer keeps its own.
  edge_pricer(const model_graph& g, edge_t e, const device_mesh& m, bool grad_flows, const backward_pricing& b,
              plan_price_cache* prices = nullptr)
      : own_(m, prices != nullptr ? 0 : std::size_t{1} << 14),
        prices_(prices != nullptr ? *prices : own_),
        src_(g[boost::source(e, g)]),
        operand_(static_cast<std::size_t>(g[e].operand)),
        grad_flows_(grad_flows),
        b_(b) {
    if (!(prices_.mesh() == m)) throw graph_error("edge_pricer: the plan price cache is for another mesh");
  }
  edge_pricer(const edge_pricer&) = delete;
  edge_pricer& operator=(const edge_pricer&) = delete;

  /// Where a strategy's specs sit in the pricer's tables (none: the edge has no backward).
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  struct producer_key {
    std::size_t forward = none, backward = none;  ///< its output; its backward target
  };
  struct consumer_key {
    std::size_t forward = none, backward = none;  ///< its operand's spec; the gradient it hands back
  };
  producer_key producer_key_of(const strategy& producer) {
    return {index(forward_.rows, producer.output), grad_flows_ ? index(backward_.rows, backward_target(producer)) : none};
  }
  consumer_key consumer_key_of(const strategy& consumer) {
    return {index(forward_.cols, consumer.inputs[operand_]),
            grad_flows_ && operand_ < consumer.grads.size() ? index(backward_.cols, consumer.grads[operand_]) : none};
  }

  edge_costs operator()(const strategy& producer, const strategy& consumer) {
    return (*this)(producer, producer_key_of(producer), consumer, consumer_key_of(consumer));
  }

  /// The costs of one pair whose keys were looked up (producer_key_of, consumer_key_of).
  edge_costs operator()(const strategy& producer, const producer_key& pk, const strategy& consumer, const consumer_key& ck) {
    edge_costs c;
    c.forward = memo(forward_, pk.forward, ck.forward, [&](const sharding_spec& from, const sharding_spec& to) {
      return detail::resharding_seconds(prices_, from, to, src_.shape, src_.type, run_mode::inference);  // the backward is priced below
    });
    const double steps = b_.micro_batches;
    if (grad_flows_ && std::isfinite(c.forward)) {
      if (ck.backward != none)
        c.backward = memo(backward_, pk.backward, ck.backward, [&](const sharding_spec& target, const sharding_spec& grad) {
          return detail::backward_seconds(prices_, target, grad, src_.shape, src_.type, b_);
        });
      if (src_.is_parameter()) {
        // Once per step, hidden behind the last micro-step's backward, or at every micro-step
        // behind that micro-step's.
        const double times =
            ck.backward != none && !syncs_once_per_step(producer, backward_.rows[pk.backward], backward_.cols[ck.backward])
                ? steps
                : 1.0;
        c.sync = times * c.backward;
        c.backward = times * b_.overlap.exposed(c.backward, consumer.backward_compute_seconds);
        c.regather = steps * c.forward;
      } else {
        c.backward *= steps;
      }
    }
    const bool again = consumer.recompute == recompute_kind::full && !src_.is_parameter();
    c.forward *= steps * (again ? 2.0 : 1.0);
    return c;
  }

 private:
  struct table {
    std::vector<sharding_spec> rows, cols;
    std::vector<std::vector<double>> values;  // [row][col], NaN = not priced yet
  };
  static std::size_t index(std::vector<sharding_spec>& ids, const sharding_spec& s) {
    for (std::size_t k = 0; k < ids.size(); ++k)
      if (ids[k] == s) return k;
    ids.push_back(s);
    return ids.size() - 1;
  }
  template <class F>
  static double memo(table& t, std::size_t r, std::size_t c, F&& price) {
    if (t.values.size() <= r) t.values.resize(r + 1);
    std::vector<double>& row = t.values[r];
    if (row.size() <= c) row.resize(c + 1, std::numeric_limits<double>::quiet_NaN());
    if (std::isnan(row[c])) row[c] = price(t.rows[r], t.cols[c]);
    return row[c];
  }
  plan_price_cache own_;
  plan_price_cache& prices_;
  const node& src_;
  std::size_t operand_;
  bool grad_flows_;
  backward_pricing b_;
  table forward_, backward_;
};

/// The cost of edge `e` when its producer runs `producer` and its consumer `consumer`.
/// `grad_flows`: the producer has a gradient (requires_grad) and the mode is training.
inline edge_costs price_edge(const model_graph& g, edge_t e, const strategy& producer, const strategy& consumer,
                             const device_mesh& m, bool grad_flows, const backward_pricing& b) {
  return edge_pricer(g, e, m, grad_flows, b)(producer, consumer);
}

/// Row-major producer-strategy x consumer-strategy matrix of seconds.
struct cost_matrix {
  std::size_t rows = 0, cols = 0;
  std::vector<double> values;
  double operator()(std::size_t i, std::size_t j) const { return values[i * cols + j]; }
};

/// Resharding cost of edge `e` (producer u -> consumer v, operand g[e].operand) for every
/// pair of u's and v's strategies, forward plus (training) backward. Distinct specs are
/// priced once. `grads`: detail::gradient_flags(g) when pricing many edges (empty: u is looked up);
/// `prices`: a cache on `m` shared by the edges priced (plan_price_cache), or none.
/// `rows_used`, `cols_used` (one flag per producer, consumer strategy; empty: all): only the pairs
/// of two used strategies are priced, every other pair costs +infinity (no choice of a solve that
/// cannot pick them: the pass prices megatron's layout alone so).
inline cost_matrix resharding_costs(const model_graph& g, edge_t e, const std::vector<strategy>& producer,
                                    const std::vector<strategy>& consumer, const device_mesh& m,
                                    const strategy_options& opt = {}, const std::vector<char>& grads = {},
                                    plan_price_cache* prices = nullptr, const std::vector<char>& rows_used = {},
                                    const std::vector<char>& cols_used = {}) {
  if ((!rows_used.empty() && rows_used.size() != producer.size()) || (!cols_used.empty() && cols_used.size() != consumer.size()))
    throw graph_error("resharding_costs: " + std::to_string(rows_used.size()) + " and " + std::to_string(cols_used.size()) +
                      " used flags for " + std::to_string(producer.size()) + " x " + std::to_string(consumer.size()) + " strategies");
  const auto used = [](const std::vector<char>& flags, std::size_t i) { return flags.empty() || flags[i] != 0; };
  const auto operand = static_cast<std::size_t>(g[e].operand);
  const vertex_t u = boost::source(e, g);
  const bool grad_flows = detail::gradient_flows(g, u, opt, grads);
  edge_pricer price(g, e, m, grad_flows, backward_pricing_of(g, e, opt), prices);
  cost_matrix c{producer.size(), consumer.size(),
                std::vector<double>(producer.size() * consumer.size(), std::numeric_limits<double>::infinity())};
  for (std::size_t j = 0; j < consumer.size(); ++j)
    if (operand >= consumer[j].inputs.size())
      throw graph_error("edge into " + quoted_text(g[boost::target(e, g)].name) + ": strategy has no operand " + std::to_string(operand));
  std::vector<std::optional<edge_pricer::producer_key>> rows(producer.size());
  std::vector<std::optional<edge_pricer::consumer_key>> cols(consumer.size());
  for (std::size_t i = 0; i < producer.size(); ++i)
    if (used(rows_used, i)) rows[i] = price.producer_key_of(producer[i]);
  for (std::size_t j = 0; j < consumer.size(); ++j)
    if (used(cols_used, j)) cols[j] = price.consumer_key_of(consumer[j]);
  for (std::size_t i = 0; i < producer.size(); ++i)
    for (std::size_t j = 0; j < consumer.size(); ++j)
      if (rows[i] && cols[j]) c.values[i * c.cols + j] = price(producer[i], *rows[i], consumer[j], *cols[j]).total();
  return c;
}

/// What resharding_costs reads of one edge (producer u -> consumer v): u's shape, dtype and
/// whether it is a parameter, the operand, whether a gradient flows, the backward's pricing,
/// and of each strategy what the pricer uses: a producer's output, backward target and ZeRO-1,
/// a consumer's operand spec, gradient, backward compute seconds and full recomputation (with
/// the producer's recomputation too, which the pass's ties inside a layer read). Two edges
/// alike in all of it have equal cost matrices: the edges of a model's repeated layers are
/// priced once each (pass_model::price_edges). hash() buckets them; alike() decides. It refers
/// to the graph's node and the two strategy lists: they outlive it, unchanged.
class edge_pricing_inputs {
 public:
  /// `grads`: detail::gradient_flags(g) (empty: u is looked up), as resharding_costs takes it.
  edge_pricing_inputs(const model_graph& g, edge_t e, const std::vector<strategy>& producer, const std::vector<strategy>& consumer,
                      const strategy_options& opt, const std::vector<char>& grads = {})
      : source_(g[boost::source(e, g)]),
        operand_(static_cast<std::size_t>(g[e].operand)),
        grad_flows_(detail::gradient_flows(g, boost::source(e, g), opt, grads)),
        backward_(backward_pricing_of(g, e, opt)),
        producer_(producer),
        consumer_(consumer) {}

  std::uint64_t hash() const noexcept {
    std::uint64_t h = detail::fnv1a_offset;
    const auto mix = [&h](std::uint64_t x) { h = detail::fnv1a(h, x); };
    const auto spec = [&mix](const sharding_spec& s) {
      mix(static_cast<std::uint64_t>(s.mesh_rank) | static_cast<std::uint64_t>(s.tensor_rank) << 8);
      for (std::size_t a = 0; a < s.mesh_rank; ++a) mix(static_cast<std::uint64_t>(detail::placement_word(s[a])));
    };
    for (std::size_t d = 0; d < source_.shape.rank; ++d) mix(static_cast<std::uint64_t>(source_.shape[d]));
    mix(static_cast<std::uint64_t>(source_.type) | std::uint64_t{source_.is_parameter()} << 8 | std::uint64_t{grad_flows_} << 9);
    mix(operand_);
    mix(static_cast<std::uint64_t>(backward_.consumers));
    mix(producer_.size());
    mix(consumer_.size());
    for (const strategy& s : producer_) spec(s.output);
    for (const strategy& s : consumer_)
      if (operand_ < s.inputs.size()) spec(s.inputs[operand_]);
    return h;
  }

  bool alike(const edge_pricing_inputs& o) const {
    if (!(source_.shape == o.source_.shape) || source_.type != o.source_.type || source_.is_parameter() != o.source_.is_parameter() ||
        operand_ != o.operand_ || grad_flows_ != o.grad_flows_ || !(backward_ == o.backward_) ||
        producer_.size() != o.producer_.size() || consumer_.size() != o.consumer_.size())
      return false;
    for (std::size_t i = 0; i < producer_.size(); ++i) {
      const strategy &a = producer_[i], &b = o.producer_[i];
      if (!(a.output == b.output) || (a.zero_stage == 1) != (b.zero_stage == 1) || a.recompute != b.recompute) return false;
      if (grad_flows_ && !(backward_target(a) == backward_target(b))) return false;
    }
    for (std::size_t j = 0; j < consumer_.size(); ++j) {
      const strategy &a = consumer_[j], &b = o.consumer_[j];
      // An operand a strategy lacks is an error resharding_costs reports: never alike.
      if (operand_ >= a.inputs.size() || operand_ >= b.inputs.size() || !(a.inputs[operand_] == b.inputs[operand_]) ||
          a.recompute != b.recompute || !(a.backward_compute_seconds == b.backward_compute_seconds))
        return false;
      if (!grad_flows_) continue;
      const bool ga = operand_ < a.grads.size(), gb = operand_ < b.grads.size();
      if (ga != gb || (ga && !(a.grads[operand_] == b.grads[operand_]))) return false;
    }
    return true;
  }

 private:
  const node& source_;
  std::size_t operand_;
  bool grad_flows_;
  backward_pricing backward_;
  const std::vector<strategy>& producer_;
  const std::vector<strategy>& consumer_;
};

}  // namespace autoshard

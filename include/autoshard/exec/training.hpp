#pragma once
/// One training step executed: the forward pass, the backward pass (every operator's backward
/// kernel, the adjoint of every redistribute step) and an optimizer step on the parameters,
/// unsharded on one host or sharded by a plan on the ranks of a mesh.
///   autoshard::training_result ref = autoshard::train_unsharded<double>(g, sources, step);
///   autoshard::train_sharded<double>(mc, g, plan, sources, step, on_piece, on_param);
///   step.micro_batches = 4;  // sources' batch inputs hold 4 x the graph's batch
///   autoshard::training_record r = autoshard::train_sharded<double>(mc, g, plan, sources, step, on_piece, on_param);
/// In the sharded run a gradient lives in a spec derived from the forward plan: per mesh
/// axis, an operand split there gets a gradient split the same way; an operand replicated
/// there gets a Partial gradient (each rank's contribution) unless the operator ran the same
/// work on every rank of that axis (then it is Replicate); a Partial operand gets a Replicate
/// gradient. Before an operator's backward runs, its output gradient is redistributed to
/// the output spec with Partial made Replicate: the redistribute plan of the adjoint
/// collective (all-gather <-> reduce-scatter, an all-reduce's backward free where the work
/// was replicated, a local slice's backward a Partial to reduce). A parameter's gradient
/// is finally redistributed to the parameter's own spec: the data-parallel reduction and
/// the sum over a tied parameter's uses.
#include <algorithm>   // std::find_if
#include <cmath>       // std::sqrt
#include <cstring>     // std::memcpy
#include <functional>  // std::function
#include <string>      // std::string
#include <vector>      // std::vector

#include "../plan/document.hpp"  // plan_document
#include "backward.hpp"  // run_kernel_backward
#include "executor.hpp"  // run_sharded helpers, detail::reshard

namespace autoshard {

// optimizer_kind: graph/strategy.hpp (none, sgd, adam), shared with the cost model.

/// How a step runs: the global batch in `micro_batches` micro-steps (gradients accumulated
/// over them), and the optimizer step after the last backward (first step: Adam's moments
/// start at zero).
struct training_step {
  optimizer_kind optimizer = optimizer_kind::adam;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  /// The step's micro-steps (a plan's pricing.micro_batches): the graph is one micro-step's,
  /// the sources' batch inputs hold the global batch (dim 0 = micro_batches x the graph's),
  /// and micro-step k runs rows [k b, (k + 1) b) of each; each micro-step's loss counts
  /// 1 / micro_batches, so the accumulated gradients are the global batch's mean loss's.
  int micro_batches = 1;
  /// Fault injection for tests of the checker: this parameter's gradient reduction is left
  /// out (each rank keeps its own contribution as if it were the whole gradient).
  std::string drop_gradient_sync;
};

/// The micro-steps a plan's training step runs: its pricing's micro_batches (1 for an
/// inference plan, and for a file written before plans recorded them). What layers recompute
/// is each strategy's own (strategy::recompute, the schedule's replays).
inline int plan_micro_batches(const plan_document& d) {
  return d.pricing.mode == run_mode::training ? d.pricing.accumulation() : 1;
}

/// The losses a training step starts its backward from (d = 1): the scalar float operators
/// nothing consumes (a cross_entropy over labels, as the builders add in training mode).
/// Throws exec_error when there is none, before anything runs: such a graph (an encoder
/// without a head, an inference graph) has nothing to differentiate.
///   autoshard::training_losses(build_gpt2(c));   // {the "loss" vertex} when c.mode is training
inline std::vector<vertex_t> training_losses(const model_graph& g) {
  std::vector<vertex_t> out;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (detail::is_training_loss(g, v)) out.push_back(v);
  if (out.empty()) {
    std::string sinks;
    int n_sinks = 0;
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
      if (g[v].is_operator() && boost::out_degree(v, g) == 0 && n_sinks++ < 3)
        sinks += (sinks.empty() ? "" : ", ") + quoted_text(g[v].name) + " " + to_string(g[v].shape);
    throw exec_error("a training step needs a loss, and this graph has none: no scalar float operator that nothing "
                     "consumes (such as a cross_entropy over labels, which the model builders add in training mode); its "
                     "outputs are " + (sinks.empty() ? std::string("none") : sinks) + (n_sinks > 3 ? ", ..." : "") +
                     ". Nothing can be differentiated: check the forward pass only (verify --forward-only), or plan a "
                     "graph that ends in a loss");
  }
  return out;
}

namespace detail {
inline std::vector<vertex_t> losses(const model_graph& g) { return training_losses(g); }

inline sharding_spec settled_spec(sharding_spec s) {
  for (std::size_t a = 0; a < s.mesh_rank; ++a)
    if (s[a].is_partial()) s[a] = Replicate();
  return s;
}

/// The spec of operand i's gradient from operator v's backward under strategy st (see above).
inline sharding_spec gradient_spec(const model_graph& g, vertex_t v, const strategy& st, std::size_t i) {
  const std::vector<vertex_t> ops = operands(g, v);
  sharding_spec s = st.inputs[i];
  for (std::size_t a = 0; a < s.mesh_rank; ++a) {
    if (s[a].is_partial()) {
      s[a] = Replicate();
      continue;
    }
    if (!s[a].is_replicate()) continue;
    bool redundant = st.output[a].is_replicate();
    for (std::size_t j = 0; j < ops.size(); ++j)
      if (!is_integer(g[ops[j]].type) && !st.inputs[j][a].is_replicate()) redundant = false;
    if (!redundant) s[a] = Partial();
  }
  return s;
}

template <class T>
void add_into(host_tensor& acc, const host_tensor& x) {
  T* a = acc.as<T>();
  const T* b = x.as<T>();
  for (std::int64_t i = 0; i < acc.numel(); ++i) a[i] += b[i];
}

/// The optimizer's new value of a parameter block from its gradient block.
template <class T>
host_tensor optimizer_update(const host_tensor& p, const host_tensor& grad, const training_step& o) {
  host_tensor out = host_tensor::copy_of(p);
  T* w = out.as<T>();
  const T* d = grad.as<T>();
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    if (o.optimizer == optimizer_kind::sgd) {
      w[i] -= static_cast<T>(o.lr) * d[i];
    } else if (o.optimizer == optimizer_kind::adam) {
      const double m = (1 - o.beta1) * d[i], v = (1 - o.beta2) * d[i] * d[i];
      const double mh = m / (1 - o.beta1), vh = v / (1 - o.beta2);
      w[i] = static_cast<T>(w[i] - o.lr * mh / (std::sqrt(vh) + o.eps));
    }
  }
  return out;
}

}  // namespace detail

namespace detail {

/// Operator v's backward in the unsharded step: its output gradient d[v] into its operands'
/// (summed where an operand has several uses), the operand values it reads computed again
/// where the schedule freed them, and with `keep_values` false its first operand's gradient
/// written over that operand where this is its last reader.
template <class T>
void backward_unsharded(const model_graph& g, vertex_t v, const std::vector<host_tensor>& sources, const liveness_schedule& s,
                        bool keep_values, std::vector<host_tensor>& value, std::vector<host_tensor>& d) {
  const std::vector<vertex_t> ops = operands(g, v);
  std::vector<const host_tensor*> in;
  std::vector<tensor_shape> shapes;
  for (vertex_t u : ops) {
    in.push_back(g[u].is_operator() ? &value[u] : &sources[u]);
    shapes.push_back(g[u].shape);
  }
  std::vector<vertex_t> again;  // operand values recomputed for this backward
  for (vertex_t u : s.recomputed[v]) {
    if (value[u].data() != nullptr) continue;
    const vertex_t w = operands(g, u)[0];
    const host_tensor* x = g[w].is_operator() ? &value[w] : &sources[w];
    value[u] = run_kernel<T>(g[u], std::span<const host_tensor* const>(&x, 1), whole_context({g[w].shape}, g[u].shape));
    again.push_back(u);
  }
  host_tensor* reuse = !keep_values && s.last_reader_of_first[v] ? &value[ops[0]] : nullptr;
  std::vector<host_tensor> dx = run_kernel_backward<T>(g[v], in, d[v], whole_context(shapes, g[v].shape), reuse);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (dx[i].data() == nullptr) continue;
    if (d[ops[i]].data() == nullptr) d[ops[i]] = std::move(dx[i]);
    else add_into<T>(d[ops[i]], dx[i]);
  }
  d[v] = host_tensor();
  for (vertex_t u : again) keep_shape_only(value[u]);
}

}  // namespace detail

/// Every parameter's gradient and updated value of the unsharded step, indexed by vertex
/// (empty for operators and inputs), and every operator's forward value (empty for inputs
/// and parameters: their values are the sources the step was given; with `keep_values`
/// false, shape-only stand-ins).
struct training_result {
  std::vector<host_tensor> value, grad, updated;
};

/// One training step on one host: the forward, the backward from every loss, the update
/// (left out with `with_updates` false: the update is elementwise, so a caller comparing
/// blocks can compute the block it needs from the gradient's, holding no second copy of
/// the parameters). With `keep_values` false the step holds what a training framework
/// holds: a forward value is freed once no backward still to run reads it (never read
/// values as soon as their consumers have run), and the loss's backward writes the logits'
/// gradient over the logits.
template <class T>
training_result train_unsharded(const model_graph& g, const std::vector<host_tensor>& sources, const training_step& o = {},
                                bool with_updates = true, bool keep_values = true) {
  const std::size_t n = boost::num_vertices(g);
  training_result r;
  const liveness_schedule s = make_liveness_schedule(g, nullptr, run_mode::training);
  r.value = detail::forward_unsharded<T>(g, sources, false, keep_values ? nullptr : &s);
  r.grad.resize(n);
  r.updated.resize(n);
  std::vector<host_tensor> d(n);
  for (vertex_t v : detail::losses(g)) {
    d[v] = host_tensor(compute_dtype<T>(), g[v].shape);
    d[v].as<T>()[0] = T(1);
  }
  for (auto it = s.order.rbegin(); it != s.order.rend(); ++it) {
    const vertex_t v = *it;
    if (!g[v].is_operator()) continue;
    if (d[v].data() != nullptr) detail::backward_unsharded<T>(g, v, sources, s, keep_values, r.value, d);
    if (!keep_values)  // what no backward still to run reads
      for (vertex_t u : s.backward_frees[v]) detail::keep_shape_only(r.value[u]);
  }
  for (vertex_t v = 0; v < n; ++v)
    if (g[v].is_parameter() && d[v].data() != nullptr) {
      if (with_updates) r.updated[v] = detail::optimizer_update<T>(sources[v], d[v], o);
      r.grad[v] = std::move(d[v]);
    }
  return r;
}

namespace detail {

/// The graph inputs of each micro-step of a step of `micro_batches`: an input whose value
/// holds the global batch (dim 0 = micro_batches x the graph's) is cut into consecutive
/// micro-batches along dim 0; one of the graph's own shape is read whole by every micro-step.
/// Throws exec_error naming the input for any other shape, and when micro_batches > 1 but no
/// input holds a global batch (every micro-step would run the same rows) unless
/// `batch_optional` (a pipeline stage between others: its activations arrive).
class micro_batch_inputs {
 public:
  micro_batch_inputs(const model_graph& g, const std::vector<host_tensor>& sources, int micro_batches, bool batch_optional = false)
      : g_(g), sources_(sources), m_(micro_batches), slice_(boost::num_vertices(g)) {
    if (micro_batches < 1 || micro_batches > max_micro_batches)
      throw exec_error("a step runs 1 to " + std::to_string(max_micro_batches) + " micro-batches, not " +
                       std::to_string(micro_batches));
    if (m_ == 1) return;
    bool any = false;
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
      if (!g[v].is_input() || v >= sources.size()) continue;
      const tensor_shape& want = g[v].shape;
      const tensor_shape& got = sources[v].shape();
      if (got == want) continue;
      tensor_shape micro = got;  // the global batch's value cut to one micro-step's rows
      if (micro.rank > 0) micro[0] = got[0] / m_;
      if (!(micro == want) || got[0] != want[0] * m_)
        throw exec_error("input " + quoted_text(g[v].name) + " is " + to_string(got) + ": a step of " + std::to_string(m_) +
                         " micro-batches of the graph's " + to_string(want) + " takes it whole or with dim 0 " +
                         std::to_string(m_) + " x " + std::to_string(want[0]) + " (the global batch)");
      any = true;
    }
    if (!any && !batch_optional)
      throw exec_error("a step of " + std::to_string(m_) + " micro-batches needs the global batch, and no input holds it (dim 0 " +
                       std::to_string(m_) + " x the graph's): every micro-step would run the same rows");
  }

  /// Micro-step k's rows of each batched input (empty entries: read the source whole); valid
  /// until the next call.
  const std::vector<host_tensor>* at(int k) {
    if (m_ == 1) return nullptr;
    for (vertex_t v = 0; v < slice_.size(); ++v) {
      if (!g_[v].is_input() || sources_[v].shape() == g_[v].shape) continue;
      host_tensor& t = slice_[v];
      if (t.data() == nullptr) t = host_tensor(sources_[v].type(), g_[v].shape);
      const std::size_t bytes = t.nbytes();
      std::memcpy(t.data(), sources_[v].data() + static_cast<std::size_t>(k) * bytes, bytes);
    }
    return &slice_;
  }

 private:
  const model_graph& g_;
  const std::vector<host_tensor>& sources_;
  int m_;
  std::vector<host_tensor> slice_;
};

}  // namespace detail

/// What one rank's sharded training step did, for the audit: every parameter's gradient
/// synchronisations (reductions of its Partial contributions over the ranks) in the step, the
/// micro-steps run and the operators whose forward ran again for their backward.
struct training_record {
  int micro_batches = 1;
  /// Per vertex (0 for anything but a parameter): 1 when the gradient is accumulated over the
  /// micro-steps and reduced once; micro_batches where the plan reduces it at every
  /// micro-step (a gradient that ends sharded on an axis it is summed over: ZeRO-2, a weight
  /// stored sharded over data-parallel ranks), as the cost model prices it
  /// (syncs_once_per_step); 0 for one that needs none.
  std::vector<int> gradient_syncs;
  std::size_t replayed_forwards = 0;  ///< operator forwards run again (full recomputation), over the step
};

/// Called with each parameter's gradient block and updated block, in the parameter's spec.
using parameter_callback = std::function<void(vertex_t, const host_tensor& grad, const host_tensor& updated, const sharding_spec& spec)>;

namespace detail {

/// The backward of a sharded training step on one rank, in phases: the loss's gradient seeds,
/// each operator's backward (settle its output gradient, gather a resharded weight again,
/// recompute what the schedule freed, run the kernel, hand each operand its contribution),
/// and after it what the schedule frees and each parameter it finishes (its gradient
/// synchronisation and optimizer step).
template <class T, mesh_communicator_like M>
class sharded_backward {
 public:
  /// `seeds`: the losses the backward starts from (a pipeline stage without one: none; its
  /// output gradients arrive, seed()).
  sharded_backward(M& mc, const model_graph& g, const std::vector<strategy>& plan, const training_step& o,
                   const parameter_callback& on_param, const liveness_schedule& s, std::vector<held_value>& val,
                   std::vector<saved_forward>& saved, std::vector<vertex_t> seeds)
      : mc_(mc), g_(g), plan_(plan), o_(o), on_param_(on_param), s_(s), val_(&val), saved_(&saved), fused_(fused_dims(g)),
        parts_(boost::num_vertices(g)), accumulated_(boost::num_vertices(g)), seeds_(std::move(seeds)),
        keep_gradient_(boost::num_vertices(g), 0), defer_(boost::num_vertices(g), 0) {
    record_.gradient_syncs.assign(boost::num_vertices(g), 0);
  }

  /// The values and saved operands of the micro-step whose backward runs next (a pipeline
  /// holds several micro-steps' forwards at once).
  void bind(std::vector<held_value>& val, std::vector<saved_forward>& saved) noexcept {
    val_ = &val;
    saved_ = &saved;
  }

  /// Graph input u (an activation that arrived from another stage) gets its gradient too:
  /// take_gradient() hands it out after each backward.
  void keep_gradient(vertex_t u) { keep_gradient_[u] = 1; }

  /// A gradient of v's output computed elsewhere (the next stage's), in `spec`, added to what
  /// v's consumers here hand back.
  void seed(vertex_t v, const sharding_spec& spec, host_tensor grad) { add_part(v, spec, std::move(grad)); }

  /// Input u's gradient of the micro-step just run, reduced to `target` (zeros when nothing read u).
  host_tensor take_gradient(vertex_t u, const sharding_spec& target) {
    host_tensor t = settle(u, target, false);
    if (t.data() == nullptr) t = host_tensor(compute_dtype<T>(), local_box(mc_.mesh(), target, g_[u].shape, mc_.rank()).shape);
    return t;
  }

  /// Parameter v is finished after the step (finish_deferred), not at its last use: its
  /// gradient is kept in sync with another stage's copy first (a pipeline's tied embedding).
  void defer(vertex_t v) { defer_[v] = 1; }

  /// The deferred parameters' synchronisation and update: `sync` gets each one's reduced
  /// gradient block (in place) before the optimizer step.
  void finish_deferred(const std::function<void(vertex_t, host_tensor&)>& sync) {
    for (auto& [v, weight] : deferred_) finish_parameter(v, weight.get(), &sync);
    deferred_.clear();
  }

  /// Micro-step k's backward of `micro_batches` (after its forward): gradients accumulate
  /// over the micro-steps, and the last one's finishes every parameter.
  void run(int k, int micro_batches) {
    last_ = k + 1 == micro_batches;
    seed_losses(micro_batches);
    for (auto it = s_.order.rbegin(); it != s_.order.rend(); ++it) {
      const vertex_t v = *it;
      if (!g_[v].is_operator()) continue;
      if (!s_.replay[v].empty()) replay(v);
      if (!parts_[v].empty()) backward(v);
      after_backward(v);
    }
    record_.micro_batches = micro_batches;
  }

  training_record record() && { return std::move(record_); }

 private:
  /// A tensor's gradient contributions, one per spec they arrive in (summed within a spec).
  using contributions = std::vector<std::pair<sharding_spec, host_tensor>>;

  /// d loss = 1 / micro_batches (each micro-step's share of the global batch's mean), in the
  /// loss's settled spec.
  void seed_losses(int micro_batches) {
    for (vertex_t v : seeds_) {
      const sharding_spec sp = settled_spec(plan_[v].output);
      host_tensor one(compute_dtype<T>(), local_box(mc_.mesh(), sp, g_[v].shape, mc_.rank()).shape);
      for (std::int64_t i = 0; i < one.numel(); ++i) one.as<T>()[i] = T(1) / static_cast<T>(micro_batches);
      parts_[v].emplace_back(sp, std::move(one));
    }
  }

  /// Contribution `t` (in `spec`) of u's gradient taken to `target`, into `total` (summed
  /// there). With `skip_sync` (the fault a test injects) a Partial contribution is kept as it
  /// is. Returns whether it was reduced over ranks (a Partial summed).
  bool reduce_into(vertex_t u, const sharding_spec& spec, host_tensor& t, const sharding_spec& target, bool skip_sync,
                   host_tensor& total) {
    host_tensor x;
    sharding_spec from = spec;
    if (skip_sync)
      for (std::size_t a = 0; a < from.mesh_rank; ++a)
        if (from[a].is_partial()) from[a] = Replicate();
    bool reduced = false;
    if (from == target) {
      x = std::move(t);
    } else {
      for (std::size_t a = 0; a < from.mesh_rank; ++a) reduced = reduced || (from[a].is_partial() && mc_.mesh().size(a) > 1);
      const auto site = charge(mc_, traffic_site::gradient(u));
      x = reshard(mc_, t, g_[u].shape, from, target, fused_[u]);
      t = host_tensor();  // a replicated parameter's contribution is as large as the parameter
    }
    if (total.data() == nullptr) total = std::move(x);
    else add_into<T>(total, x);
    return reduced;
  }

  /// Every contribution taken to `target` (each distinct spec's sum reduced once), summed
  /// there; a parameter's counts one synchronisation when any was reduced.
  host_tensor settle(vertex_t u, const sharding_spec& target, bool skip_sync) {
    host_tensor total;
    bool reduced = false;
    for (auto& [spec, t] : parts_[u]) reduced = reduce_into(u, spec, t, target, skip_sync, total) || reduced;
    parts_[u].clear();
    if (reduced && g_[u].is_parameter()) ++record_.gradient_syncs[u];
    return total;
  }

  /// Where a parameter's gradient is reduced to: its ZeRO shard, else its own spec.
  const sharding_spec& gradient_target(vertex_t v) const {
    return plan_[v].zero_stage > 0 ? plan_[v].gradient_spec : plan_[v].output;
  }

  /// After a micro-step but the last's backward of parameter v's last use: the contributions
  /// the plan reduces at every micro-step (syncs_once_per_step: a gradient that ends sharded
  /// on an axis it is summed over) are reduced now, into the shard accumulated over the
  /// micro-steps; the others stay as they are, accumulated in their own spec, and are reduced
  /// once, after the last micro-step's.
  void sync_this_micro_step(vertex_t v) {
    const sharding_spec& target = gradient_target(v);
    bool reduced = false;
    for (auto it = parts_[v].begin(); it != parts_[v].end();) {
      if (syncs_once_per_step(plan_[v], target, it->first)) {
        ++it;
        continue;
      }
      reduced = reduce_into(v, it->first, it->second, target, g_[v].name == o_.drop_gradient_sync, accumulated_[v]) || reduced;
      it = parts_[v].erase(it);
    }
    if (reduced) ++record_.gradient_syncs[v];
  }

  /// A fully recomputed layer's forward run again right before its first backward (the
  /// schedule's replay at v): each operator's piece and what its backward reads, kept as a
  /// plain layer's first forward keeps them (a weight gathered here is the one its backward
  /// would gather again), and what the schedule frees after each.
  void replay(vertex_t v) {
    std::vector<host_tensor> local;
    std::vector<const host_tensor*> in;
    for (vertex_t w : s_.replay[v]) {
      local_context c = run_operator<T>(mc_, g_, plan_, w, fused_, *val_, local, in, true);
      keep_for_backward(g_, plan_, w, *val_, std::move(local), std::move(c), (*saved_)[w], true);
      for (vertex_t u : s_.replay_frees[w]) keep_shape_only((*val_)[u].own);
      if (s_.replay_frees_itself[w]) keep_shape_only((*val_)[w].own);
    }
    record_.replayed_forwards += s_.replay[v].size();
  }

  /// The gradient synchronisation the plan implies, then the optimizer step on this block,
  /// as soon as the parameter's last use has run its backward (as DDP's buckets fire during
  /// the backward): the gradient and the update are handed to on_param and dropped, so a rank
  /// holds one parameter's full gradient at a time, not every replicated parameter's. A ZeRO
  /// parameter's gradient ends sharded (its gradient_spec), the step updates that shard and
  /// the updated weight is gathered back to the parameter's spec.
  void finish_parameter(vertex_t v, const host_tensor& weight, const std::function<void(vertex_t, host_tensor&)>* sync = nullptr) {
    const strategy& ps = plan_[v];
    const bool zero = ps.zero_stage > 0;
    const sharding_spec& gs = gradient_target(v);
    host_tensor gblock = settle(v, gs, g_[v].name == o_.drop_gradient_sync);
    if (accumulated_[v].data() != nullptr) {  // the shard reduced at the earlier micro-steps
      if (gblock.data() == nullptr) gblock = std::move(accumulated_[v]);
      else add_into<T>(gblock, accumulated_[v]);
      accumulated_[v] = host_tensor();
    }
    if (sync != nullptr && *sync) (*sync)(v, gblock);
    if (!zero) {
      const host_tensor updated = optimizer_update<T>(weight, gblock, o_);
      if (on_param_) on_param_(v, gblock, updated, gs);
      return;
    }
    host_tensor wshard;
    {
      const auto uncounted = charge(mc_, collective_ledger::no_site);  // a local slice: no traffic
      wshard = reshard(mc_, weight, g_[v].shape, ps.output, gs, fused_[v]);
    }
    host_tensor updated = optimizer_update<T>(wshard, gblock, o_);
    if (on_param_) on_param_(v, gblock, updated, gs);
    gblock = host_tensor();
    wshard = host_tensor();
    const auto site = charge(mc_, traffic_site::gradient(v));
    (void)reshard(mc_, updated, g_[v].shape, gs, ps.output, fused_[v]);  // the all-gather of the updated weight
  }

  /// After v's backward (or where it has none): what only v's backward needed is dropped, the
  /// operand values the schedule frees here, and each parameter whose last use this was is
  /// synchronised and updated.
  void after_backward(vertex_t v) {
    std::vector<held_value>& val = *val_;
    (*saved_)[v] = saved_forward();
    val[v].reset();
    for (vertex_t u : s_.backward_frees[v]) keep_shape_only(val[u].own);
    for (vertex_t u : s_.finished[v]) {
      if (last_ && (!parts_[u].empty() || accumulated_[u].data() != nullptr)) {
        if (defer_[u]) deferred_.emplace_back(u, std::move(val[u]));
        else finish_parameter(u, val[u].get());
      } else if (!last_) {
        sync_this_micro_step(u);
      }
      val[u].reset();  // loaded again by the next micro-step's forward
    }
  }

  /// One contribution to u's gradient, summed with one in the same spec.
  void add_part(vertex_t u, const sharding_spec& gs, host_tensor dx) {
    auto same = std::find_if(parts_[u].begin(), parts_[u].end(), [&](const auto& p) { return p.first == gs; });
    if (same == parts_[u].end()) parts_[u].emplace_back(gs, std::move(dx));
    else add_into<T>(same->second, dx);
  }

  /// Operand i's piece: a weight resharded in the forward is gathered again (as priced: the re-gather).
  void regather_weights(vertex_t v, const std::vector<vertex_t>& ops, saved_forward& sv) {
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (sv.in[i] == nullptr) {
        const auto site = charge(mc_, traffic_site::gradient(ops[i]));
        sv.own[i] = reshard(mc_, (*val_)[ops[i]].get(), g_[ops[i]].shape, plan_[ops[i]].output, plan_[v].inputs[i], fused_[ops[i]]);
        sv.in[i] = &sv.own[i];
      }
  }

  /// Operand 0's piece when nothing needs it after this backward (its own resharded copy, or
  /// the value itself when this is its last reader): the kernel may write its gradient over it.
  host_tensor* overwritable_first(vertex_t v, const std::vector<vertex_t>& ops, saved_forward& sv) {
    if (ops.empty() || !g_[ops[0]].is_operator()) return nullptr;
    if (sv.own[0].data() != nullptr) return &sv.own[0];
    if (s_.last_reader_of_first[v] && (*val_)[ops[0]].alias == nullptr) return &(*val_)[ops[0]].own;
    return nullptr;
  }

  /// Each operand's gradient from v's backward, in the spec the cost model gives it.
  void contribute(vertex_t v, const std::vector<vertex_t>& ops, std::vector<host_tensor>& dx) {
    const strategy& st = plan_[v];
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const vertex_t u = ops[i];
      if (dx[i].data() == nullptr || (g_[u].is_input() && !keep_gradient_[u])) continue;  // graph inputs have no gradients
      // The cost model's gradient spec where the plan carries it (training strategies), else the same rule here.
      add_part(u, st.grads.size() == ops.size() ? st.grads[i] : gradient_spec(g_, v, st, i), std::move(dx[i]));
      dx[i] = host_tensor();
    }
  }

  void backward(vertex_t v) {
    const host_tensor dy = settle(v, settled_spec(plan_[v].output), false);
    const std::vector<vertex_t> ops = operands(g_, v);
    saved_forward& sv = (*saved_)[v];
    regather_weights(v, ops, sv);
    host_tensor* reuse = overwritable_first(v, ops, sv);
    std::vector<vertex_t> again;  // operand values the schedule freed, recomputed for this backward
    for (vertex_t u : s_.recomputed[v]) {
      if ((*val_)[u].own.data() != nullptr) continue;
      (*val_)[u].own = run_kernel<T>(g_[u], (*saved_)[u].in, (*saved_)[u].c);  // the same kernel on the same bits as the forward
      again.push_back(u);
    }
    std::vector<host_tensor> dx;
    {
      const auto site = charge(mc_, traffic_site::recompute(v));  // a loss's row statistics, again
      dx = run_kernel_backward<T>(g_[v], sv.in, dy, sv.c, reuse);
    }
    for (vertex_t u : again) keep_shape_only((*val_)[u].own);
    contribute(v, ops, dx);
  }

  M& mc_;
  const model_graph& g_;
  const std::vector<strategy>& plan_;
  const training_step& o_;
  const parameter_callback& on_param_;
  const liveness_schedule& s_;
  std::vector<held_value>* val_;
  std::vector<saved_forward>* saved_;
  const std::vector<fused_dim> fused_;
  std::vector<contributions> parts_;  ///< a parameter's accumulate over the micro-steps
  std::vector<host_tensor> accumulated_;  ///< per parameter: the reduced shard of earlier micro-steps
  std::vector<vertex_t> seeds_;           ///< the losses
  std::vector<char> keep_gradient_, defer_;
  std::vector<std::pair<vertex_t, held_value>> deferred_;  ///< finished parameters awaiting finish_deferred, with their weight
  bool last_ = true;                      ///< this micro-step is the step's last
  training_record record_;
};

}  // namespace detail

/// One training step sharded by `plan` on this rank of `mc` (every rank calls it alike): for
/// each of `o.micro_batches` micro-steps, run_sharded's forward on its rows of the global batch
/// (on_piece sees every piece, every micro-step), then the backward with the adjoint
/// collectives, a fully recomputed layer's forward run again right before its backward; the
/// parameters' gradients accumulate over the micro-steps and are reduced to each parameter's
/// spec once, as the last micro-step's backward finishes with it (at every micro-step where
/// the plan reduces it there), followed by the optimizer step on the block this rank holds
/// (on_param sees both). Values are kept and freed as the training liveness_schedule says.
/// Returns what the step did (its gradient synchronisations), for the audit.
template <class T, mesh_communicator_like M>
training_record train_sharded(M& mc, const model_graph& g, const std::vector<strategy>& plan,
                              const std::vector<host_tensor>& sources, const training_step& o, const piece_callback& on_piece,
                              const parameter_callback& on_param) {
  detail::check_plan_size(g, plan, sources);
  const liveness_schedule s = make_liveness_schedule(g, &plan, run_mode::training);
  detail::micro_batch_inputs batch(g, sources, o.micro_batches);
  std::vector<detail::held_value> val;
  std::vector<detail::saved_forward> saved;
  detail::sharded_backward<T, M> backward(mc, g, plan, o, on_param, s, val, saved, detail::losses(g));
  for (int k = 0; k < o.micro_batches; ++k) {
    detail::forward_sharded<T>(mc, g, plan, sources, on_piece, val, &saved, s, batch.at(k));  // keeps what the backward needs
    backward.run(k, o.micro_batches);
  }
  return std::move(backward).record();
}

}  // namespace autoshard

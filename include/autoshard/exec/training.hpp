#pragma once
/// One training step executed: the forward pass, the backward pass (every operator's backward
/// kernel, the adjoint of every redistribute step) and an optimizer step on the parameters,
/// unsharded on one host or sharded by a plan on the ranks of a mesh.
///   autoshard::training_result ref = autoshard::train_unsharded<double>(g, sources, step);
///   autoshard::train_sharded<double>(mc, g, plan, sources, step, on_piece, on_param);
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
#include <functional>  // std::function
#include <string>      // std::string
#include <vector>      // std::vector

#include "backward.hpp"  // run_kernel_backward
#include "executor.hpp"  // run_sharded helpers, detail::reshard

namespace autoshard {

// optimizer_kind: graph/strategy.hpp (none, sgd, adam), shared with the cost model.

/// The optimizer step after the backward (first step: Adam's moments start at zero).
struct training_step {
  optimizer_kind optimizer = optimizer_kind::adam;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  /// Fault injection for tests of the checker: this parameter's gradient reduction is left
  /// out (each rank keeps its own contribution as if it were the whole gradient).
  std::string drop_gradient_sync;
};

/// The losses a training step starts its backward from (d = 1): the scalar float operators
/// nothing consumes (a cross_entropy over labels, as the builders add in training mode).
/// Throws exec_error when there is none, before anything runs: such a graph (an encoder
/// without a head, an inference graph) has nothing to differentiate.
///   autoshard::training_losses(build_gpt2(c));   // {the "loss" vertex} when c.mode is training
inline std::vector<vertex_t> training_losses(const model_graph& g) {
  std::vector<vertex_t> out;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].is_operator() && boost::out_degree(v, g) == 0 && !detail::is_integer(g[v].type) && g[v].shape.numel() == 1)
      out.push_back(v);
  if (out.empty()) {
    std::string sinks;
    int n_sinks = 0;
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
      if (g[v].is_operator() && boost::out_degree(v, g) == 0 && n_sinks++ < 3)
        sinks += (sinks.empty() ? "'" : ", '") + g[v].name + "' " + to_string(g[v].shape);
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
  std::vector<std::size_t> readers = detail::in_place_backward_readers(g, nullptr);
  r.value = detail::forward_unsharded<T>(g, sources, false, keep_values ? nullptr : &readers);
  r.grad.resize(n);
  r.updated.resize(n);
  std::vector<host_tensor> d(n);
  for (vertex_t v : detail::losses(g)) {
    d[v] = host_tensor(compute_dtype<T>(), g[v].shape);
    d[v].as<T>()[0] = T(1);
  }
  const std::vector<vertex_t> order = topological_order(g);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const vertex_t v = *it;
    if (!g[v].is_operator()) continue;
    const std::vector<vertex_t> ops = operands(g, v);
    const auto free_read_operands = [&] {  // what no backward still to run reads
      if (!keep_values)
        for (std::size_t i = 0; i < ops.size(); ++i)
          if (g[ops[i]].is_operator() && detail::backward_reads_operand(g[v].kind, i) && --readers[ops[i]] == 0)
            detail::keep_shape_only(r.value[ops[i]]);
    };
    if (d[v].data() == nullptr) {
      free_read_operands();
      continue;
    }
    std::vector<const host_tensor*> in;
    std::vector<tensor_shape> shapes;
    for (vertex_t u : ops) {
      in.push_back(g[u].is_operator() ? &r.value[u] : &sources[u]);
      shapes.push_back(g[u].shape);
    }
    std::vector<vertex_t> again;  // operand values recomputed for this backward (recomputed_in_backward)
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const vertex_t u = ops[i];
      if (!detail::recomputed_in_backward(g, u) || !detail::backward_reads_operand(g[v].kind, i) || r.value[u].data() != nullptr)
        continue;
      const vertex_t w = operands(g, u)[0];
      const host_tensor* x = g[w].is_operator() ? &r.value[w] : &sources[w];
      r.value[u] = run_kernel<T>(g[u], std::span<const host_tensor* const>(&x, 1), whole_context({g[w].shape}, g[u].shape));
      again.push_back(u);
    }
    host_tensor* reuse = !keep_values && !ops.empty() && g[ops[0]].is_operator() && detail::backward_reads_operand(g[v].kind, 0) &&
                                 readers[ops[0]] == 1
                             ? &r.value[ops[0]]
                             : nullptr;  // operand 0 read by no later backward: its gradient may be written over it
    std::vector<host_tensor> dx = run_kernel_backward<T>(g[v], in, d[v], whole_context(shapes, g[v].shape), reuse);
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (dx[i].data() == nullptr) continue;
      if (d[ops[i]].data() == nullptr) d[ops[i]] = std::move(dx[i]);
      else detail::add_into<T>(d[ops[i]], dx[i]);
    }
    d[v] = host_tensor();
    free_read_operands();
    for (vertex_t u : again) detail::keep_shape_only(r.value[u]);
  }
  for (vertex_t v = 0; v < n; ++v)
    if (g[v].is_parameter() && d[v].data() != nullptr) {
      if (with_updates) r.updated[v] = detail::optimizer_update<T>(sources[v], d[v], o);
      r.grad[v] = std::move(d[v]);
    }
  return r;
}

/// Called with each parameter's gradient block and updated block, in the parameter's spec.
using parameter_callback = std::function<void(vertex_t, const host_tensor& grad, const host_tensor& updated, const sharding_spec& spec)>;

/// One training step sharded by `plan` on this rank of `mc` (every rank calls it alike):
/// run_sharded's forward (on_piece sees every piece), then the backward with the adjoint
/// collectives, each parameter's gradient reduced to the parameter's spec, and the
/// optimizer step on the block this rank holds (on_param sees both).
template <class T, mesh_communicator_like M>
void train_sharded(M& mc, const model_graph& g, const std::vector<strategy>& plan, const std::vector<host_tensor>& sources,
                   const training_step& o, const piece_callback& on_piece, const parameter_callback& on_param) {
  const std::size_t n = boost::num_vertices(g);
  const device_mesh& mesh = mc.mesh();
  const int rank = mc.rank();
  std::vector<detail::held_value> val;
  std::vector<detail::saved_forward> saved;
  std::vector<std::size_t> readers = detail::in_place_backward_readers(g, &plan);
  detail::forward_sharded<T>(mc, g, plan, sources, on_piece, val, &saved, &readers);  // keeps what the backward needs
  const std::vector<fused_dim> fused = fused_dims(g);
  const std::vector<vertex_t> order = topological_order(g);
  // Backward, in reverse topological order.
  // A tensor's gradient contributions, one per spec they arrive in (summed within a spec).
  using contributions = std::vector<std::pair<sharding_spec, host_tensor>>;
  std::vector<contributions> parts(n);
  // Every contribution taken to `target` (each distinct spec's sum reduced once), summed there.
  // With `skip_sync` (the fault a test injects) a Partial contribution is kept as it is.
  const auto settle = [&](vertex_t u, const sharding_spec& target, bool skip_sync) {
    host_tensor total;
    for (auto& [spec, t] : parts[u]) {
      host_tensor x;
      sharding_spec from = spec;
      if (skip_sync)
        for (std::size_t a = 0; a < from.mesh_rank; ++a)
          if (from[a].is_partial()) from[a] = Replicate();
      if (from == target) {
        x = std::move(t);
      } else {
        const auto site = detail::charge(mc, traffic_site::gradient(u));
        x = detail::reshard(mc, t, g[u].shape, from, target, fused[u]);
        t = host_tensor();  // a replicated parameter's contribution is as large as the parameter
      }
      if (total.data() == nullptr) total = std::move(x);
      else detail::add_into<T>(total, x);
    }
    parts[u].clear();
    return total;
  };
  // The gradient synchronisation the plan implies, then the optimizer step on this block,
  // as soon as the parameter's last use has run its backward (as DDP's buckets fire during
  // the backward): the gradient and the update are handed to on_param and dropped, so a rank
  // holds one parameter's full gradient at a time, not every replicated parameter's. A ZeRO
  // parameter's gradient ends sharded (its gradient_spec), the step updates that shard and
  // the updated weight is gathered back to the parameter's spec.
  const auto finish_parameter = [&](vertex_t v) {
    const strategy& ps = plan[v];
    const bool zero = ps.zero_stage > 0;
    const sharding_spec& gs = zero ? ps.gradient_spec : ps.output;
    host_tensor gblock = settle(v, gs, g[v].name == o.drop_gradient_sync);
    if (!zero) {
      const host_tensor updated = detail::optimizer_update<T>(val[v].get(), gblock, o);
      if (on_param) on_param(v, gblock, updated, gs);
      return;
    }
    host_tensor wshard;
    {
      const auto uncounted = detail::charge(mc, collective_ledger::no_site);  // a local slice: no traffic
      wshard = detail::reshard(mc, val[v].get(), g[v].shape, ps.output, gs, fused[v]);
    }
    host_tensor updated = detail::optimizer_update<T>(wshard, gblock, o);
    if (on_param) on_param(v, gblock, updated, gs);
    gblock = host_tensor();
    wshard = host_tensor();
    const auto site = detail::charge(mc, traffic_site::gradient(v));
    (void)detail::reshard(mc, updated, g[v].shape, gs, ps.output, fused[v]);  // the all-gather of the updated weight
  };
  std::vector<std::size_t> pending_uses(n, 0);  // a parameter's uses whose backward has not run yet
  for (vertex_t v = 0; v < n; ++v) pending_uses[v] = boost::out_degree(v, g);
  for (vertex_t v : detail::losses(g)) {
    const sharding_spec s = detail::settled_spec(plan[v].output);
    host_tensor one(compute_dtype<T>(), local_box(mesh, s, g[v].shape, rank).shape);
    for (std::int64_t i = 0; i < one.numel(); ++i) one.as<T>()[i] = T(1);
    parts[v].emplace_back(s, std::move(one));
  }
  // After v's backward (or where it has none): what only v's backward needed is dropped, and
  // each parameter whose last use this was is synchronised and updated.
  const auto after_backward = [&](vertex_t v) {
    saved[v] = detail::saved_forward();
    val[v].reset();
    const std::vector<vertex_t> ops = operands(g, v);
    for (std::size_t i = 0; i < ops.size(); ++i)  // an operand value read by no backward still to run is freed
      if (g[ops[i]].is_operator() && detail::backward_reads_operand(g[v].kind, i) && plan[ops[i]].output == plan[v].inputs[i] &&
          --readers[ops[i]] == 0)
        detail::keep_shape_only(val[ops[i]].own);
    for (auto [e, end] = boost::in_edges(v, g); e != end; ++e) {
      const vertex_t u = boost::source(*e, g);
      if (!g[u].is_parameter() || --pending_uses[u] > 0) continue;
      if (!parts[u].empty()) finish_parameter(u);
      val[u].reset();
    }
  };
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const vertex_t v = *it;
    if (!g[v].is_operator()) continue;
    if (parts[v].empty()) {
      after_backward(v);
      continue;
    }
    const strategy& st = plan[v];
    const host_tensor dy = settle(v, detail::settled_spec(st.output), false);
    const std::vector<vertex_t> ops = operands(g, v);
    detail::saved_forward& sv = saved[v];
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (sv.in[i] == nullptr) {  // a weight resharded in the forward, gathered again (as priced: the re-gather)
        const auto site = detail::charge(mc, traffic_site::gradient(ops[i]));
        sv.own[i] = detail::reshard(mc, val[ops[i]].get(), g[ops[i]].shape, plan[ops[i]].output, st.inputs[i], fused[ops[i]]);
        sv.in[i] = &sv.own[i];
      }
    // Operand 0's piece when nothing needs it after this backward (its own resharded copy, or
    // the value itself when this is its last reader): the kernel may write its gradient over it.
    host_tensor* reuse = nullptr;
    if (!ops.empty() && g[ops[0]].is_operator()) {
      if (sv.own[0].data() != nullptr) reuse = &sv.own[0];
      else if (plan[ops[0]].output == st.inputs[0] && detail::backward_reads_operand(g[v].kind, 0) && readers[ops[0]] == 1 &&
               val[ops[0]].alias == nullptr)
        reuse = &val[ops[0]].own;
    }
    std::vector<vertex_t> again;  // operand values recomputed for this backward (recomputed_in_backward)
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const vertex_t u = ops[i];
      if (!detail::recomputed_in_backward(g, u) || !detail::backward_reads_operand(g[v].kind, i) ||
          !(plan[u].output == st.inputs[i]) || val[u].own.data() != nullptr)
        continue;
      val[u].own = run_kernel<T>(g[u], saved[u].in, saved[u].c);  // the same kernel on the same bits as the forward
      again.push_back(u);
    }
    std::vector<host_tensor> dx;
    {
      const auto site = detail::charge(mc, traffic_site::recompute(v));  // a loss's row statistics, again
      dx = run_kernel_backward<T>(g[v], sv.in, dy, sv.c, reuse);
    }
    for (vertex_t u : again) detail::keep_shape_only(val[u].own);
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const vertex_t u = ops[i];
      if (dx[i].data() == nullptr || g[u].is_input()) continue;  // graph inputs have no gradients
      // The cost model's gradient spec where the plan carries it (training strategies), else the same rule here.
      const sharding_spec gs = st.grads.size() == ops.size() ? st.grads[i] : detail::gradient_spec(g, v, st, i);
      auto same = std::find_if(parts[u].begin(), parts[u].end(), [&](const auto& p) { return p.first == gs; });
      if (same == parts[u].end()) parts[u].emplace_back(gs, std::move(dx[i]));
      else detail::add_into<T>(same->second, dx[i]);
      dx[i] = host_tensor();
    }
    after_backward(v);
  }
}

}  // namespace autoshard

#pragma once
/// What a run on rank threads will take, estimated before it starts, against what this
/// machine gives (core/machine.hpp): memory, threads, file descriptors (every Gloo rank holds
/// a socket to every peer of the world and of each mesh axis) and address space (every
/// thread reserves a stack).
///   autoshard::machine_limits m = autoshard::machine_limits::here();
///   autoshard::check_rank_threads(mesh, m);                // exec_error when they cannot run
///   autoshard::memory_estimate e = autoshard::estimate_verify_memory(g, mesh, plan, dtype::f64);
#include <algorithm>  // std::find, std::max, std::min
#include <cstdint>    // std::uint64_t
#include <limits>     // std::numeric_limits
#include <string>     // std::string
#include <vector>     // std::vector

#include "../core/dtype.hpp"    // human_bytes
#include "../core/layout.hpp"   // local_box
#include "../graph/strategy.hpp"  // model_graph, strategy
#include "../core/machine.hpp"  // machine_limits
#include "../graph/validate.hpp"  // topological_order
#include "kernels.hpp"          // exec_error
#include "training.hpp"         // detail::gradient_spec, detail::settled_spec: the specs train_sharded uses

namespace autoshard {

/// What running `mesh.num_ranks()` Gloo ranks as threads of this process takes.
struct rank_thread_cost {
  std::uint64_t ranks = 0;
  std::uint64_t threads = 0;        ///< a rank thread and its TCP device's loop thread each
  std::uint64_t files = 0;          ///< a socket per peer of the world and of every mesh axis, an epoll, a listener
  std::uint64_t address_space = 0;  ///< the threads' stacks
  std::uint64_t memory = 0;         ///< resident bytes: stacks touched, connection buffers
};

inline rank_thread_cost rank_threads_cost(const device_mesh& mesh, std::uint64_t stack = 8u << 20) {
  rank_thread_cost c;
  c.ranks = static_cast<std::uint64_t>(mesh.num_ranks());
  std::uint64_t peers = c.ranks - 1;
  for (std::size_t a = 0; a < mesh.ndim(); ++a) peers += static_cast<std::uint64_t>(mesh.size(a)) - 1;
  c.threads = 2 * c.ranks;
  c.files = c.ranks * (peers + 3);
  c.address_space = c.threads * (stack + (64u << 10));
  c.memory = c.ranks * ((1u << 20) + peers * (16u << 10));  // measured: ~1 MiB a rank, ~16 KiB a connection
  return c;
}

/// Throws exec_error, naming the count and the limit, when the mesh's ranks cannot all run
/// as threads here: a half-started world would only wait for its missing peers.
inline void check_rank_threads(const device_mesh& mesh, const machine_limits& m) {
  const rank_thread_cost c = rank_threads_cost(mesh, m.stack);
  const auto refuse = [&](const std::string& what, std::uint64_t need, std::uint64_t have, const std::string& unit) {
    throw exec_error(std::to_string(c.ranks) + " ranks on " + to_string(mesh) + " need " + std::to_string(need) + " " +
                     unit + " as threads of one process, but " + what + " allows " + std::to_string(have) +
                     "; verify a plan for a smaller mesh (e.g. `autoshard plan --mesh 2x4`)");
  };
  if (c.threads > m.threads)
    refuse("the thread limit (RLIMIT_NPROC less the user's running threads, kernel.threads-max, the cgroup's pids.max)", c.threads,
           m.threads, "threads");
  if (c.files > m.files) refuse("the open-file limit (ulimit -n)", c.files, m.files, "sockets");
  if (c.address_space > m.address_space)
    refuse("the address-space limit (ulimit -v)", c.address_space, m.address_space, "bytes of stacks");
}

/// The peak memory of a verification run, estimated before it starts.
struct memory_estimate {
  std::uint64_t sources = 0;     ///< the global inputs and parameters, held once
  std::uint64_t activations = 0; ///< the reference run's and every rank's live pieces at the worst step
  /// Training: what the worst step holds the size of the parameters (gradients, updates,
  /// gathered weights), which a smaller batch or sequence does not shrink.
  std::uint64_t parameters = 0;
  std::uint64_t ranks = 0;       ///< threads and connections
  std::string worst_step;        ///< the vertex computed at the worst step
  std::uint64_t total() const noexcept { return sources + activations + parameters + ranks; }
};

namespace detail {
inline std::uint64_t bytes_of(const tensor_shape& s, dtype t) {
  return static_cast<std::uint64_t>(s.numel()) * static_cast<std::uint64_t>(dtype_size(t));
}
inline bool all_replicated(const sharding_spec& s) {
  for (std::size_t a = 0; a < s.mesh_rank; ++a)
    if (!s[a].is_replicate()) return false;
  return true;
}
}  // namespace detail

namespace detail {
/// Bytes that grow with batch x seq (activations and their gradients) apart from those the
/// size of the parameters (their gradients, updates and gathered copies), which do not.
struct split_bytes {
  std::uint64_t act = 0, par = 0;
  std::uint64_t total() const noexcept { return act + par; }
  split_bytes& operator+=(const split_bytes& o) noexcept {
    act += o.act;
    par += o.par;
    return *this;
  }
  split_bytes& operator-=(const split_bytes& o) noexcept {
    act -= std::min(act, o.act);
    par -= std::min(par, o.par);
    return *this;
  }
  friend split_bytes operator+(split_bytes a, const split_bytes& b) noexcept { return a += b; }
};

/// The peak of a verified training step beyond the sources, simulated step by step as verify
/// runs it, the ranks in lockstep (their collectives keep them together):
///  1. the unsharded step (train_unsharded without keeping values): a forward value lives
///     until no backward still to run reads it (backward_reads_operand: a value only a
///     shape is needed of is freed once its consumers have run; an element-wise activation
///     is computed again for its reader's backward, recomputed_in_backward), the loss's
///     backward writes d logits over the logits, and every parameter's gradient is kept for
///     the comparison;
///  2. the ranks' forward against the streamed reference (`forward`: the inference
///     estimate's peak), beside those gradients;
///  3. the ranks' training step: each rank keeps its forward pieces while a backward still
///     to run reads them (the same rules), and the operand pieces it resharded for such a backward; in the
///     backward it holds its gradient contributions, the settled output gradient (a
///     collective's buffer and result for each contribution in another spec), its operands'
///     gradients and a re-gathered weight; when a parameter's last use has run, its
///     reduction (3 x the target block: the contribution, the collective's buffer, the
///     result) and its update, and the compared blocks (one rank at a time).
template <class TypeOf>
memory_estimate estimate_training_step(const model_graph& g, const device_mesh& mesh, const std::vector<strategy>& plan,
                                       const TypeOf& type_of, std::uint64_t forward, const std::string& forward_worst) {
  const std::size_t n = boost::num_vertices(g);
  const int ranks = mesh.num_ranks();
  const auto ur = static_cast<std::size_t>(ranks);
  const std::vector<vertex_t> order = topological_order(g);
  const auto whole = [&](vertex_t v) { return bytes_of(g[v].shape, type_of(v)); };
  const auto tagged = [&](vertex_t u, std::uint64_t b) { return g[u].is_parameter() ? split_bytes{0, b} : split_bytes{b, 0}; };
  const auto box = [&](int r, vertex_t u, const sharding_spec& s) {
    return bytes_of(local_box(mesh, s, g[u].shape, r).shape, type_of(u));
  };
  std::vector<bool> is_loss(n, false);
  for (vertex_t v = 0; v < n; ++v)
    is_loss[v] = g[v].is_operator() && boost::out_degree(v, g) == 0 && !is_integer(g[v].type) && g[v].shape.numel() == 1;
  const auto differentiable = [&](vertex_t u) { return !g[u].is_input() && !is_integer(g[u].type); };
  // The operators the backward reaches: a loss, or a consumer of one reached.
  std::vector<bool> reached(n, false);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const vertex_t v = *it;
    if (!g[v].is_operator()) continue;
    reached[v] = reached[v] || is_loss[v];
    if (reached[v])
      for (vertex_t u : operands(g, v))
        if (differentiable(u)) reached[u] = true;
  }
  // Whether the backward of operand i of v reads it where it lies (plan null: unsharded).
  const auto reads_in_place = [&](vertex_t v, std::size_t i, const std::vector<strategy>* p) {
    const vertex_t u = operands(g, v)[i];
    return g[u].is_operator() && backward_reads_operand(g[v].kind, i) &&
           (p == nullptr || (i < (*p)[v].inputs.size() && (*p)[u].output == (*p)[v].inputs[i]));
  };
  memory_estimate e;
  split_bytes worst;
  const auto note = [&](const split_bytes& now, const std::string& where) {
    if (now.total() > worst.total()) {
      worst = now;
      e.worst_step = where;
    }
  };
  // 1. The unsharded step.
  std::vector<std::size_t> readers = in_place_backward_readers(g, nullptr), uses(n);
  std::vector<bool> alive(n, false), has_grad(n, false);
  split_bytes values, grads;
  for (vertex_t v = 0; v < n; ++v) uses[v] = boost::out_degree(v, g);
  const auto free_value = [&](vertex_t u) {
    if (!alive[u]) return;
    alive[u] = false;
    values.act -= whole(u);
  };
  for (vertex_t v : order) {
    if (!g[v].is_operator()) continue;
    note(values + split_bytes{whole(v), 0}, "the unsharded step (forward of " + g[v].name + ")");
    values.act += whole(v);
    alive[v] = true;
    for (vertex_t u : operands(g, v))
      if (--uses[u] == 0 && (readers[u] == 0 || recomputed_in_backward(g, u))) free_value(u);
    if (uses[v] == 0 && (readers[v] == 0 || recomputed_in_backward(g, v))) free_value(v);
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const vertex_t v = *it;
    if (!g[v].is_operator()) continue;
    const std::vector<vertex_t> ops = operands(g, v);
    if (is_loss[v] && !has_grad[v]) {
      grads.act += whole(v);
      has_grad[v] = true;
    }
    if (reached[v] && has_grad[v]) {
      // Operand 0 read by no later backward: the kernel may write its gradient over it.
      const bool reuse = !ops.empty() && reads_in_place(v, 0, nullptr) && readers[ops[0]] == 1 && g[v].kind == op_kind::cross_entropy;
      split_bytes dx;
      for (std::size_t i = 0; i < ops.size(); ++i) {
        if (differentiable(ops[i]) && !(i == 0 && reuse)) dx += tagged(ops[i], whole(ops[i]));
        if (reads_in_place(v, i, nullptr) && recomputed_in_backward(g, ops[i]) && !alive[ops[i]]) dx.act += whole(ops[i]);  // computed again
      }
      note(values + grads + dx, "the unsharded step (backward of " + g[v].name + ")");
      if (reuse) {
        free_value(ops[0]);
        grads.act += whole(ops[0]);
        has_grad[ops[0]] = true;
      }
      for (std::size_t i = 0; i < ops.size(); ++i)
        if (differentiable(ops[i]) && !has_grad[ops[i]]) {
          grads += tagged(ops[i], whole(ops[i]));
          has_grad[ops[i]] = true;
        }
      grads.act -= std::min(grads.act, whole(v));
    }
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (reads_in_place(v, i, nullptr) && --readers[ops[i]] == 0) free_value(ops[i]);
  }
  split_bytes ref;  // the parameters' gradients, kept until every rank compared its block
  for (vertex_t v = 0; v < n; ++v)
    if (g[v].is_parameter() && has_grad[v]) ref.par += whole(v);
  // 2. The ranks' forward against the streamed reference.
  note(ref + split_bytes{forward, 0}, forward_worst);
  // 3. The ranks' training step: every rank's value pieces and saved operand copies.
  readers = in_place_backward_readers(g, &plan);
  for (vertex_t v = 0; v < n; ++v) uses[v] = boost::out_degree(v, g);
  std::vector<std::vector<split_bytes>> piece(ur, std::vector<split_bytes>(n)), saved(ur, std::vector<split_bytes>(n));
  split_bytes k;  // every rank's pieces and saved copies together
  std::vector<bool> held(n, false);  // the ranks hold u's pieces
  const auto free_piece = [&](vertex_t u) {
    held[u] = false;
    for (std::size_t r = 0; r < ur; ++r) {
      k -= piece[r][u];
      piece[r][u] = {};
    }
  };
  for (vertex_t v : order) {
    const strategy& st = plan[v];
    if (!g[v].is_operator()) {
      if (!all_replicated(st.output))
        for (int r = 0; r < ranks; ++r) {
          piece[static_cast<std::size_t>(r)][v] = tagged(v, box(r, v, st.output));  // its own shard
          k += piece[static_cast<std::size_t>(r)][v];
        }
      continue;
    }
    const std::vector<vertex_t> ops = operands(g, v);
    split_bytes step;
    for (int r = 0; r < ranks; ++r) {
      const auto rr = static_cast<std::size_t>(r);
      for (std::size_t i = 0; i < ops.size() && i < st.inputs.size(); ++i) {
        if (plan[ops[i]].output == st.inputs[i]) continue;
        const split_bytes b = tagged(ops[i], box(r, ops[i], st.inputs[i]));
        step += b + b;  // the collective's buffer and the resharded piece
        if (!g[ops[i]].is_parameter() && backward_reads_operand(g[v].kind, i)) saved[rr][v] += b;  // kept for the backward
      }
      step.act += box(r, v, st.output);
    }
    note(ref + k + step, "forward of " + g[v].name + " on the ranks (training step)");
    held[v] = true;
    for (int r = 0; r < ranks; ++r) {
      const auto rr = static_cast<std::size_t>(r);
      piece[rr][v].act = box(r, v, st.output);
      k += piece[rr][v] + saved[rr][v];
    }
    for (vertex_t u : ops)
      if (--uses[u] == 0 && g[u].is_operator() && (readers[u] == 0 || recomputed_in_backward(g, u))) free_piece(u);
    if (uses[v] == 0 && (readers[v] == 0 || recomputed_in_backward(g, v))) free_piece(v);
  }
  std::vector<std::vector<split_bytes>> contrib(ur, std::vector<split_bytes>(n));
  std::vector<std::vector<std::vector<sharding_spec>>> contrib_specs(ur, std::vector<std::vector<sharding_spec>>(n));
  std::vector<std::size_t> pending(n);
  for (vertex_t v = 0; v < n; ++v) pending[v] = boost::out_degree(v, g);
  split_bytes gr;  // every rank's contributions together
  for (vertex_t v = 0; v < n; ++v)
    if (is_loss[v])
      for (int r = 0; r < ranks; ++r) {
        const auto rr = static_cast<std::size_t>(r);
        contrib[rr][v].act = box(r, v, settled_spec(plan[v].output));
        contrib_specs[rr][v].push_back(settled_spec(plan[v].output));
        gr += contrib[rr][v];
      }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const vertex_t v = *it;
    if (!g[v].is_operator()) continue;
    const strategy& st = plan[v];
    const std::vector<vertex_t> ops = operands(g, v);
    if (reached[v]) {
      const sharding_spec target = settled_spec(st.output);
      const bool reuse = g[v].kind == op_kind::cross_entropy && !ops.empty() && g[ops[0]].is_operator() &&
                         (!(plan[ops[0]].output == st.inputs[0]) || readers[ops[0]] == 1);
      split_bytes settling, step, added;
      for (int r = 0; r < ranks; ++r) {
        const auto rr = static_cast<std::size_t>(r);
        const std::uint64_t dy = box(r, v, target);
        for (std::size_t i = 0; i < ops.size(); ++i)  // an operand value computed again for this backward
          if (reads_in_place(v, i, &plan) && recomputed_in_backward(g, ops[i]) && !held[ops[i]]) {
            settling.act += box(r, ops[i], plan[ops[i]].output);
            step.act += box(r, ops[i], plan[ops[i]].output);
          }
        for (const sharding_spec& cs : contrib_specs[rr][v])
          if (!(cs == target)) settling.act += 2 * dy;  // the collective's buffer and its result, beside the contributions
        step.act += dy;
        for (std::size_t i = 0; i < ops.size() && i < st.inputs.size(); ++i) {
          const vertex_t u = ops[i];
          if (g[u].is_parameter() && !(plan[u].output == st.inputs[i])) step += tagged(u, box(r, u, st.inputs[i]));  // gathered again
          if (!differentiable(u)) continue;
          const sharding_spec gs = st.grads.size() == ops.size() ? st.grads[i] : gradient_spec(g, v, st, i);
          const split_bytes dx = tagged(u, box(r, u, gs));
          if (!(i == 0 && reuse)) step += dx;  // else written over the logits piece
          if (std::find(contrib_specs[rr][u].begin(), contrib_specs[rr][u].end(), gs) == contrib_specs[rr][u].end()) {
            contrib_specs[rr][u].push_back(gs);
            contrib[rr][u] += dx;
            added += dx;
          }
        }
      }
      note(ref + k + gr + settling, "backward of " + g[v].name + " on the ranks");
      for (std::size_t r = 0; r < ur; ++r) {
        gr -= contrib[r][v];
        contrib[r][v] = {};
      }
      note(ref + k + gr + step, "backward of " + g[v].name + " on the ranks");
      if (reuse)  // the logits piece became their gradient: it leaves what the ranks keep
        for (int r = 0; r < ranks; ++r) {
          const auto rr = static_cast<std::size_t>(r);
          if (!(plan[ops[0]].output == st.inputs[0])) {
            const split_bytes b{box(r, ops[0], st.inputs[0]), 0};
            k -= b;
            saved[rr][v] -= b;
          } else {
            k -= piece[rr][ops[0]];
            piece[rr][ops[0]] = {};
          }
        }
      gr += added;
    }
    for (std::size_t r = 0; r < ur; ++r) {
      k -= saved[r][v] + piece[r][v];
      saved[r][v] = piece[r][v] = {};
    }
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (reads_in_place(v, i, &plan) && --readers[ops[i]] == 0) free_piece(ops[i]);
    for (vertex_t u : ops) {
      if (!g[u].is_parameter() || --pending[u] > 0 || !has_grad[u]) continue;
      const strategy& ps = plan[u];
      const sharding_spec& target = ps.zero_stage > 0 ? ps.gradient_spec : ps.output;
      split_bytes finishing;
      std::uint64_t largest_block = 0;
      for (int r = 0; r < ranks; ++r) {
        const std::uint64_t b = box(r, u, target);
        finishing.par += 3 * b + (ps.zero_stage > 0 ? 3 * box(r, u, ps.output) : 0);  // reduce, update, gather back
        largest_block = std::max(largest_block, b);
      }
      note(ref + k + gr + finishing + split_bytes{0, 3 * largest_block}, "update of " + g[u].name + " on the ranks");
      for (std::size_t r = 0; r < ur; ++r) {
        gr -= contrib[r][u];
        contrib[r][u] = {};
      }
      free_piece(u);
      ref -= split_bytes{0, whole(u)};  // every rank compared its gradient
    }
  }
  e.activations = worst.act;
  e.parameters = worst.par;
  return e;
}
}  // namespace detail

/// The peak of verify_plan's forward run in `compute` (f32 or f64): the sources held once,
/// then step by step in topological order the reference values still needed plus every
/// rank's live pieces, its resharded operands (twice: a collective's buffer and its result),
/// its output and the replicated copy a Partial output is compared through.
inline memory_estimate estimate_verify_memory(const model_graph& g, const device_mesh& mesh,
                                              const std::vector<strategy>& plan, dtype compute, bool training = false) {
  const std::size_t n = boost::num_vertices(g);
  if (plan.size() != n)
    throw exec_error("the plan has " + std::to_string(plan.size()) + " strategies for a graph of " + std::to_string(n) + " vertices");
  const auto type_of = [&](vertex_t v) { return detail::is_integer(g[v].type) ? dtype::i64 : compute; };
  const int ranks = mesh.num_ranks();
  memory_estimate e;
  e.ranks = rank_threads_cost(mesh).memory;
  std::vector<std::size_t> uses(n, 0);
  std::vector<std::uint64_t> piece_sum(n, 0);  // every rank's piece of v together
  for (vertex_t v = 0; v < n; ++v) {
    uses[v] = boost::out_degree(v, g);
    if (!g[v].is_operator()) {
      e.sources += detail::bytes_of(g[v].shape, type_of(v));
      if (detail::all_replicated(plan[v].output)) continue;  // ranks read the source itself
    }
    for (int r = 0; r < ranks; ++r) piece_sum[v] += detail::bytes_of(local_box(mesh, plan[v].output, g[v].shape, r).shape, type_of(v));
  }
  std::uint64_t live = 0;  // reference values and pieces alive between steps
  for (vertex_t v : topological_order(g)) {
    std::uint64_t step = 0;
    if (g[v].is_operator()) {
      const std::vector<vertex_t> ops = operands(g, v);
      for (std::size_t i = 0; i < ops.size() && i < plan[v].inputs.size(); ++i) {
        const vertex_t u = ops[i];
        if (plan[u].output == plan[v].inputs[i]) continue;
        for (int r = 0; r < ranks; ++r)
          step += 2 * detail::bytes_of(local_box(mesh, plan[v].inputs[i], g[u].shape, r).shape, type_of(u));
      }
      const std::uint64_t whole = detail::bytes_of(g[v].shape, type_of(v));
      step += whole;  // the reference output
      bool partial = false;
      for (std::size_t a = 0; a < plan[v].output.mesh_rank; ++a) partial |= plan[v].output[a].is_partial();
      step += partial ? 2 * whole : whole / static_cast<std::uint64_t>(ranks) + 1;  // the compared block, one rank at a time
      if (e.sources + live + piece_sum[v] + step + e.ranks > e.total()) {
        e.activations = live + piece_sum[v] + step;
        e.worst_step = g[v].name;
      }
      live += piece_sum[v] + whole;
      for (vertex_t u : ops)
        if (--uses[u] == 0) live -= piece_sum[u] + (g[u].is_operator() ? detail::bytes_of(g[u].shape, type_of(u)) : 0);
    } else {
      live += piece_sum[v];
    }
    if (uses[v] == 0) live -= piece_sum[v] + (g[v].is_operator() ? detail::bytes_of(g[v].shape, type_of(v)) : 0);
  }
  if (training) {  // the forward above is its step 2, beside the reference's gradients
    const memory_estimate t = detail::estimate_training_step(g, mesh, plan, type_of, e.activations, e.worst_step);
    e.activations = t.activations;
    e.parameters = t.parameters;
    e.worst_step = t.worst_step;
  }
  return e;
}

}  // namespace autoshard

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
#include "../pass/pipelined.hpp"   // last_reading_stage: the boundaries a pipelined run's activation crosses
#include "kernels.hpp"          // exec_error
#include "schedule.hpp"         // liveness_schedule: when the run frees what
#include "training.hpp"         // detail::gradient_spec, detail::settled_spec: the specs train_sharded uses
#include "workspace.hpp"        // kernel_workspace_bytes: what a kernel allocates beside its tensors

namespace autoshard {

/// What running `mesh.num_ranks()` Gloo ranks as threads of this process takes.
struct rank_thread_cost {
  std::uint64_t ranks = 0;
  std::uint64_t threads = 0;        ///< a rank thread and its TCP device's loop thread each
  std::uint64_t files = 0;          ///< a socket per peer of the world and of every mesh axis, an epoll, a listener
  std::uint64_t address_space = 0;  ///< the threads' stacks
  std::uint64_t memory = 0;         ///< resident bytes: stacks touched, connection buffers
};

/// `extra_peers`: each rank's peers in communicators beyond the world and the mesh's axes (a
/// pipelined run's stage and tied groups, pipeline_extra_peers).
inline rank_thread_cost rank_threads_cost(const device_mesh& mesh, std::uint64_t stack = 8u << 20, std::uint64_t extra_peers = 0) {
  rank_thread_cost c;
  c.ranks = static_cast<std::uint64_t>(mesh.num_ranks());
  std::uint64_t peers = c.ranks - 1 + extra_peers;
  for (std::size_t a = 0; a < mesh.ndim(); ++a) peers += static_cast<std::uint64_t>(mesh.size(a)) - 1;
  c.threads = 2 * c.ranks;
  c.files = c.ranks * (peers + 3);
  c.address_space = c.threads * (stack + (64u << 10));
  c.memory = c.ranks * ((1u << 20) + peers * (16u << 10));  // measured: ~1 MiB a rank, ~16 KiB a connection
  return c;
}

/// Address space a run on `threads` new threads maps beyond the bytes it uses: it counts under
/// an address-space limit (ulimit -v, RLIMIT_AS), not in resident memory. Each thread maps its
/// whole stack (`m.stack`: RLIMIT_STACK's size, 8 MiB by default) and a malloc arena beside the
/// main one maps a 64 MiB heap whole (glibc's HEAP_MAX_SIZE; under ulimit -v the tool's threads
/// share two arenas, so one). Measured: `verify --seq 256 --batch 64` of a one-layer GPT-2 plan
/// on 2x2 (estimate 361 MiB, peak RSS 372 MB) started and ran out of memory under
/// `ulimit -v` 400,000-480,000 KB and passed from 500,000.
inline std::uint64_t reserved_address_space(std::uint64_t threads, const machine_limits& m) {
  return threads * m.stack + (std::uint64_t{64} << 20);
}

/// Throws exec_error, naming the count and the limit, when the mesh's ranks cannot all run
/// as threads here: a half-started world would only wait for its missing peers.
inline void check_rank_threads(const device_mesh& mesh, const machine_limits& m, std::uint64_t extra_peers = 0) {
  const rank_thread_cost c = rank_threads_cost(mesh, m.stack, extra_peers);
  // The most ranks that do fit (a mesh of one axis; the cost grows with the ranks), for the
  // advice: a fixed example ("e.g. `autoshard plan --mesh 2x4`") proposed 8 ranks for a 2x2
  // plan refused at 4.
  const auto fit = [&](std::uint64_t r) {
    const rank_thread_cost k = rank_threads_cost(device_mesh(std::vector<int>{static_cast<int>(r)}), m.stack, extra_peers);
    return k.threads <= m.threads && k.files <= m.files && k.address_space <= m.address_space;
  };
  const auto refuse = [&](const std::string& what, std::uint64_t need, std::uint64_t have, const std::string& unit) {
    std::uint64_t lo = 0, hi = c.ranks - 1;  // fit(lo) or lo == 0; the answer is in [lo, hi]
    while (lo < hi) {
      const std::uint64_t mid = lo + (hi - lo + 1) / 2;
      if (fit(mid)) lo = mid;
      else hi = mid - 1;
    }
    throw exec_error(std::to_string(c.ranks) + " ranks on " + to_string(mesh) + " need " + std::to_string(need) + " " +
                     unit + " as threads of one process, but " + what + " allows " + std::to_string(have) +
                     ": raise it (by at least " + std::to_string(need - have) + "), or verify a plan for fewer ranks (" +
                     (lo >= 2 ? "at most " + std::to_string(lo) + " fit here" : "here not even 2 fit") + ")");
  };
  if (c.threads > m.threads)
    refuse("the thread limit (RLIMIT_NPROC less the user's running threads, kernel.threads-max, the cgroup's pids.max)", c.threads,
           m.threads, "threads");
  if (c.files > m.files) refuse("the open-file limit (ulimit -n)", c.files, m.files, "sockets");
  if (c.address_space > m.address_space)
    refuse("the address-space limit (ulimit -v)", c.address_space, m.address_space, "bytes of stacks");
}

/// The world of a pipelined run of `stage_of`'s stages (verify_pipeline::stage_of), each on
/// `stage_mesh`: stages x its ranks, as the world and the pipeline axis see it.
inline device_mesh pipeline_world(const device_mesh& stage_mesh, const std::vector<std::vector<int>>& stage_of) {
  int stages = 1;
  for (const std::vector<int>& s : stage_of)
    if (!s.empty()) stages = std::max(stages, s.back() + 1);
  return device_mesh(std::vector<int>{stages, stage_mesh.num_ranks()});
}

/// A pipelined rank's peers beyond pipeline_world's axes: its stage mesh's axes and the tied group.
inline std::uint64_t pipeline_extra_peers(const device_mesh& stage_mesh) {
  std::uint64_t peers = 1;
  for (std::size_t a = 0; a < stage_mesh.ndim(); ++a) peers += static_cast<std::uint64_t>(stage_mesh.size(a)) - 1;
  return peers;
}

/// The peak memory of a verification run, estimated before it starts.
struct memory_estimate {
  std::uint64_t sources = 0;     ///< the global inputs and parameters, held once
  std::uint64_t activations = 0; ///< the reference run's and every rank's live pieces at the worst step
  /// Training: what the worst step holds the size of the parameters (gradients, updates,
  /// gathered weights), which a smaller batch or sequence does not shrink.
  std::uint64_t parameters = 0;
  std::uint64_t ranks = 0;       ///< threads and connections
  /// Held beside the run for its caller: the source values' making (a checkpoint's tensor read
  /// while it is converted, verify_options::source_overhead) and the outputs kept whole
  /// (verify_options::keep_outputs).
  std::uint64_t held = 0;
  std::string worst_step;        ///< the vertex computed at the worst step, quoted (or the step, naming it)
  std::uint64_t total() const noexcept { return sources + activations + parameters + ranks + held; }
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

/// The peak of a verified training step beyond the sources, walked step by step along the
/// liveness schedules the run follows (exec/schedule.hpp), the ranks in lockstep (their
/// collectives keep them together):
///  1. the unsharded step (train_unsharded without keeping values), on the unsharded
///     schedule: a forward value lives until the schedule frees it (an element-wise
///     activation is computed again for its reader's backward), the loss's backward writes
///     d logits over the logits, and every parameter's gradient is kept for the comparison;
///  2. the ranks' forward against the streamed reference (`forward`: the inference
///     estimate's peak), beside those gradients;
///  3. the ranks' training step, on the plan's schedule: each rank keeps its forward pieces
///     until the schedule frees them, and the operand pieces it resharded for a backward that
///     reads them; in the backward it holds its gradient contributions, the settled output
///     gradient (a collective's buffer and result for each contribution in another spec), its
///     operands' gradients and a re-gathered weight; when the schedule finishes a parameter,
///     its reduction (3 x the target block: the contribution, the collective's buffer, the
///     result) and its update, and the compared blocks (one rank at a time).
template <class TypeOf>
class training_step_estimate {
 public:
  training_step_estimate(const model_graph& g, const device_mesh& mesh, const std::vector<strategy>& plan, const TypeOf& type_of)
      : g_(g), mesh_(mesh), plan_(plan), type_of_(type_of), n_(boost::num_vertices(g)),
        ranks_(static_cast<std::size_t>(mesh.num_ranks())), is_loss_(n_, false), reached_(n_, false), has_grad_(n_, false) {
    for (vertex_t v = 0; v < n_; ++v)
      is_loss_[v] = g[v].is_operator() && boost::out_degree(v, g) == 0 && !is_integer(g[v].type) && g[v].shape.numel() == 1;
    // The operators the backward reaches: a loss, or a consumer of one reached.
    const std::vector<vertex_t> order = topological_order(g);
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      const vertex_t v = *it;
      if (!g[v].is_operator()) continue;
      reached_[v] = reached_[v] || is_loss_[v];
      if (reached_[v])
        for (vertex_t u : operands(g, v))
          if (differentiable(u)) reached_[u] = true;
    }
  }

  memory_estimate run(std::uint64_t forward, const std::string& forward_worst) {
    split_bytes ref = unsharded_step();  // the parameters' gradients, kept until every rank compared its block
    note(ref + split_bytes{forward, 0}, forward_worst);  // 2. the ranks' forward against the streamed reference
    ranks_step(ref);
    memory_estimate e;
    e.activations = worst_.act;
    e.parameters = worst_.par;
    e.worst_step = worst_step_;
    return e;
  }

 private:
  using pieces = std::vector<std::vector<split_bytes>>;  // [rank][vertex]

  std::uint64_t whole(vertex_t v) const { return bytes_of(g_[v].shape, type_of_(v)); }
  split_bytes tagged(vertex_t u, std::uint64_t b) const { return g_[u].is_parameter() ? split_bytes{0, b} : split_bytes{b, 0}; }
  std::uint64_t box(std::size_t r, vertex_t u, const sharding_spec& s) const {
    return bytes_of(local_box(mesh_, s, g_[u].shape, static_cast<int>(r)).shape, type_of_(u));
  }
  bool differentiable(vertex_t u) const { return !g_[u].is_input() && !is_integer(g_[u].type); }
  /// v's kernel's workspace (exec/workspace.hpp): the unsharded one, or every rank's (they run at once).
  split_bytes workspace(vertex_t v, bool backward, bool on_ranks) const {
    return split_bytes{on_ranks ? workspace_on_ranks(g_, mesh_, plan_, v, type_of_(v), backward)
                                : workspace_unsharded(g_, v, type_of_(v), backward),
                       0};
  }
  void note(const split_bytes& now, const std::string& where) {
    if (now.total() > worst_.total()) {
      worst_ = now;
      worst_step_ = where;
    }
  }

  // ---- 1. the unsharded step ----------------------------------------------------------------

  split_bytes unsharded_step() {
    const liveness_schedule s = make_liveness_schedule(g_, nullptr, run_mode::training);
    std::vector<bool> alive(n_, false);
    split_bytes values, grads;
    const auto free_value = [&](vertex_t u) {
      if (!alive[u]) return;
      alive[u] = false;
      values.act -= whole(u);
    };
    for (vertex_t v : s.order) {
      if (!g_[v].is_operator()) continue;
      note(values + split_bytes{whole(v), 0} + workspace(v, false, false), "the unsharded step (forward of " + quoted_text(g_[v].name) + ")");
      values.act += whole(v);
      alive[v] = true;
      for (vertex_t u : s.forward_frees[v]) free_value(u);
      if (s.forward_frees_itself[v]) free_value(v);
    }
    for (auto it = s.order.rbegin(); it != s.order.rend(); ++it) {
      const vertex_t v = *it;
      if (!g_[v].is_operator()) continue;
      if (is_loss_[v] && !has_grad_[v]) {
        grads.act += whole(v);
        has_grad_[v] = true;
      }
      if (reached_[v] && has_grad_[v]) unsharded_backward(v, s, alive, values, grads, free_value);
      for (vertex_t u : s.backward_frees[v]) free_value(u);
    }
    split_bytes ref;
    for (vertex_t v = 0; v < n_; ++v)
      if (g_[v].is_parameter() && has_grad_[v]) ref.par += whole(v);
    return ref;
  }

  template <class Free>
  void unsharded_backward(vertex_t v, const liveness_schedule& s, const std::vector<bool>& alive, const split_bytes& values,
                          split_bytes& grads, const Free& free_value) {
    const std::vector<vertex_t> ops = operands(g_, v);
    // Operand 0 read by no later backward: the kernel may write its gradient over it.
    const bool reuse = s.last_reader_of_first[v] && g_[v].kind == op_kind::cross_entropy;
    split_bytes dx;
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (differentiable(ops[i]) && !(i == 0 && reuse)) dx += tagged(ops[i], whole(ops[i]));
    for (vertex_t u : s.recomputed[v])
      if (!alive[u]) dx.act += whole(u);  // computed again
    note(values + grads + dx + workspace(v, true, false), "the unsharded step (backward of " + quoted_text(g_[v].name) + ")");
    if (reuse) {
      free_value(ops[0]);
      grads.act += whole(ops[0]);
      has_grad_[ops[0]] = true;
    }
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (differentiable(ops[i]) && !has_grad_[ops[i]]) {
        grads += tagged(ops[i], whole(ops[i]));
        has_grad_[ops[i]] = true;
      }
    grads.act -= std::min(grads.act, whole(v));
  }

  // ---- 3. the ranks' training step ------------------------------------------------------------

  void free_piece(vertex_t u) {
    held_[u] = false;
    for (std::size_t r = 0; r < ranks_; ++r) {
      k_ -= piece_[r][u];
      piece_[r][u] = {};
    }
  }

  void ranks_step(split_bytes& ref) {
    const liveness_schedule s = make_liveness_schedule(g_, &plan_, run_mode::training);
    piece_.assign(ranks_, std::vector<split_bytes>(n_));
    saved_.assign(ranks_, std::vector<split_bytes>(n_));
    held_.assign(n_, false);
    for (vertex_t v : s.order) ranks_forward(v, s, ref);
    contrib_.assign(ranks_, std::vector<split_bytes>(n_));
    contrib_specs_.assign(ranks_, std::vector<std::vector<sharding_spec>>(n_));
    for (vertex_t v = 0; v < n_; ++v)
      if (is_loss_[v])
        for (std::size_t r = 0; r < ranks_; ++r) {
          contrib_[r][v].act = box(r, v, settled_spec(plan_[v].output));
          contrib_specs_[r][v].push_back(settled_spec(plan_[v].output));
          gr_ += contrib_[r][v];
        }
    for (auto it = s.order.rbegin(); it != s.order.rend(); ++it) {
      const vertex_t v = *it;
      if (!g_[v].is_operator()) continue;
      for (vertex_t w : s.replay[v]) ranks_forward(w, s, ref, true);  // a fully recomputed layer, run again
      if (reached_[v]) ranks_backward(v, s, ref);
      for (std::size_t r = 0; r < ranks_; ++r) {
        k_ -= saved_[r][v] + piece_[r][v];
        saved_[r][v] = piece_[r][v] = {};
      }
      for (vertex_t u : s.backward_frees[v]) free_piece(u);
      for (vertex_t u : s.finished[v])
        if (has_grad_[u]) finish_parameter(u, ref);
    }
  }

  /// Every rank's pieces and the operand copies it resharded for a backward that reads them
  /// (none in a fully recomputed layer's first forward; `again`: its forward run again before
  /// its backward, freeing what the schedule's replay frees).
  void ranks_forward(vertex_t v, const liveness_schedule& s, const split_bytes& ref, bool again = false) {
    const strategy& st = plan_[v];
    if (!g_[v].is_operator()) {
      if (!all_replicated(st.output))
        for (std::size_t r = 0; r < ranks_; ++r) {
          piece_[r][v] = tagged(v, box(r, v, st.output));  // its own shard
          k_ += piece_[r][v];
        }
      return;
    }
    if (again && held_[v]) free_piece(v);  // a value kept from the first forward is computed over
    const std::vector<vertex_t> ops = operands(g_, v);
    split_bytes step;
    for (std::size_t r = 0; r < ranks_; ++r) {
      for (std::size_t i = 0; i < ops.size() && i < st.inputs.size(); ++i) {
        if (plan_[ops[i]].output == st.inputs[i]) continue;
        const split_bytes b = tagged(ops[i], box(r, ops[i], st.inputs[i]));
        step += b + b;  // the collective's buffer and the resharded piece
        if (!g_[ops[i]].is_parameter() && backward_reads_operand(g_[v].kind, i) && (again || !s.replayed[v]))
          saved_[r][v] += b;  // kept for the backward
      }
      step.act += box(r, v, st.output);
    }
    note(ref + k_ + step + workspace(v, false, true),
         (again ? "recomputed forward of " : "forward of ") + quoted_text(g_[v].name) + " on the ranks (training step)");
    held_[v] = true;
    for (std::size_t r = 0; r < ranks_; ++r) {
      piece_[r][v].act = box(r, v, st.output);
      k_ += piece_[r][v] + saved_[r][v];
    }
    for (vertex_t u : again ? s.replay_frees[v] : s.forward_frees[v]) free_piece(u);
    if (again ? s.replay_frees_itself[v] : s.forward_frees_itself[v]) free_piece(v);
  }

  /// v's backward on every rank: settling its output gradient, then the step itself.
  void ranks_backward(vertex_t v, const liveness_schedule& s, const split_bytes& ref) {
    const strategy& st = plan_[v];
    const std::vector<vertex_t> ops = operands(g_, v);
    const sharding_spec target = settled_spec(st.output);
    const bool reuse = g_[v].kind == op_kind::cross_entropy && !ops.empty() && g_[ops[0]].is_operator() &&
                       (!(plan_[ops[0]].output == st.inputs[0]) || s.last_reader_of_first[v]);
    split_bytes settling, step, added;
    for (std::size_t r = 0; r < ranks_; ++r) {
      const std::uint64_t dy = box(r, v, target);
      for (vertex_t u : s.recomputed[v])  // an operand value computed again for this backward
        if (!held_[u]) {
          settling.act += box(r, u, plan_[u].output);
          step.act += box(r, u, plan_[u].output);
        }
      for (const sharding_spec& cs : contrib_specs_[r][v])
        if (!(cs == target)) settling.act += 2 * dy;  // the collective's buffer and its result, beside the contributions
      step.act += dy;
      step += operand_gradients(r, v, ops, reuse, added);
    }
    note(ref + k_ + gr_ + settling, "backward of " + quoted_text(g_[v].name) + " on the ranks");
    for (std::size_t r = 0; r < ranks_; ++r) {
      gr_ -= contrib_[r][v];
      contrib_[r][v] = {};
    }
    note(ref + k_ + gr_ + step + workspace(v, true, true), "backward of " + quoted_text(g_[v].name) + " on the ranks");
    if (reuse)  // the logits piece became their gradient: it leaves what the ranks keep
      for (std::size_t r = 0; r < ranks_; ++r) {
        if (!(plan_[ops[0]].output == st.inputs[0])) {
          const split_bytes b{box(r, ops[0], st.inputs[0]), 0};
          k_ -= b;
          saved_[r][v] -= b;
        } else {
          k_ -= piece_[r][ops[0]];
          piece_[r][ops[0]] = {};
        }
      }
    gr_ += added;
  }

  /// Rank r's re-gathered weights and operand gradients in v's backward; the contributions
  /// they make (one per distinct spec) are noted in `added`.
  split_bytes operand_gradients(std::size_t r, vertex_t v, const std::vector<vertex_t>& ops, bool reuse, split_bytes& added) {
    const strategy& st = plan_[v];
    split_bytes step;
    for (std::size_t i = 0; i < ops.size() && i < st.inputs.size(); ++i) {
      const vertex_t u = ops[i];
      if (g_[u].is_parameter() && !(plan_[u].output == st.inputs[i])) step += tagged(u, box(r, u, st.inputs[i]));  // gathered again
      if (!differentiable(u)) continue;
      const sharding_spec gs = st.grads.size() == ops.size() ? st.grads[i] : gradient_spec(g_, v, st, i);
      const split_bytes dx = tagged(u, box(r, u, gs));
      if (!(i == 0 && reuse)) step += dx;  // else written over the logits piece
      std::vector<sharding_spec>& specs = contrib_specs_[r][u];
      if (std::find(specs.begin(), specs.end(), gs) == specs.end()) {
        specs.push_back(gs);
        contrib_[r][u] += dx;
        added += dx;
      }
    }
    return step;
  }

  /// The parameter's reduction, update and gather back; then it is compared and dropped.
  void finish_parameter(vertex_t u, split_bytes& ref) {
    const strategy& ps = plan_[u];
    const sharding_spec& target = ps.zero_stage > 0 ? ps.gradient_spec : ps.output;
    split_bytes finishing;
    std::uint64_t largest_block = 0;
    for (std::size_t r = 0; r < ranks_; ++r) {
      const std::uint64_t b = box(r, u, target);
      finishing.par += 3 * b + (ps.zero_stage > 0 ? 3 * box(r, u, ps.output) : 0);  // reduce, update, gather back
      largest_block = std::max(largest_block, b);
    }
    note(ref + k_ + gr_ + finishing + split_bytes{0, 3 * largest_block}, "update of " + quoted_text(g_[u].name) + " on the ranks");
    for (std::size_t r = 0; r < ranks_; ++r) {
      gr_ -= contrib_[r][u];
      contrib_[r][u] = {};
    }
    free_piece(u);
    ref -= split_bytes{0, whole(u)};  // every rank compared its gradient
  }

  const model_graph& g_;
  const device_mesh& mesh_;
  const std::vector<strategy>& plan_;
  const TypeOf& type_of_;
  const std::size_t n_, ranks_;
  std::vector<bool> is_loss_, reached_, has_grad_, held_;
  split_bytes worst_;
  std::string worst_step_;
  pieces piece_, saved_, contrib_;  // every rank's value pieces, saved operand copies, gradient contributions
  std::vector<std::vector<std::vector<sharding_spec>>> contrib_specs_;
  split_bytes k_;   // every rank's pieces and saved copies together
  split_bytes gr_;  // every rank's contributions together
};

template <class TypeOf>
memory_estimate estimate_training_step(const model_graph& g, const device_mesh& mesh, const std::vector<strategy>& plan,
                                       const TypeOf& type_of, std::uint64_t forward, const std::string& forward_worst) {
  return training_step_estimate<TypeOf>(g, mesh, plan, type_of).run(forward, forward_worst);
}
}  // namespace detail

namespace detail {
/// What verify_plan's forward adds at operator v beyond the pieces alive: every rank's
/// resharded operands (twice: a collective's buffer and its result), the reference output,
/// the kernel's workspace on the reference and on every rank (exec/workspace.hpp), and the
/// compared block (one rank at a time; a Partial output through a replicated copy).
template <class TypeOf>
std::uint64_t verify_step_bytes(const model_graph& g, const device_mesh& mesh, const std::vector<strategy>& plan, vertex_t v,
                                const TypeOf& type_of) {
  std::uint64_t step = 0;
  const std::vector<vertex_t> ops = operands(g, v);
  for (std::size_t i = 0; i < ops.size() && i < plan[v].inputs.size(); ++i) {
    const vertex_t u = ops[i];
    if (plan[u].output == plan[v].inputs[i]) continue;
    for (int r = 0; r < mesh.num_ranks(); ++r)
      step += 2 * bytes_of(local_box(mesh, plan[v].inputs[i], g[u].shape, r).shape, type_of(u));
  }
  const std::uint64_t whole = bytes_of(g[v].shape, type_of(v));
  step += whole;  // the reference output
  step += workspace_unsharded(g, v, type_of(v), false) + workspace_on_ranks(g, mesh, plan, v, type_of(v), false);
  bool partial = false;
  for (std::size_t a = 0; a < plan[v].output.mesh_rank; ++a) partial |= plan[v].output[a].is_partial();
  return step + (partial ? 2 * whole : whole / static_cast<std::uint64_t>(mesh.num_ranks()) + 1);
}
}  // namespace detail

namespace detail {
/// What a step of several micro-steps holds throughout beside one micro-step's: every rank's
/// gradient accumulators, from the first micro-step's backward to the last's (train_sharded):
/// each parameter's contributions, one per distinct spec its consumers hand back, and the
/// shard reduced at every micro-step where the plan reduces it there.
template <class TypeOf>
std::uint64_t accumulation_bytes(const model_graph& g, const device_mesh& mesh, const std::vector<strategy>& plan,
                                 const TypeOf& type_of) {
  std::uint64_t total = 0;
  for (vertex_t u = 0; u < boost::num_vertices(g); ++u) {
    if (!g[u].is_parameter() || is_integer(g[u].type)) continue;
    std::vector<sharding_spec> specs;
    for (auto [e, end] = boost::out_edges(u, g); e != end; ++e) {
      const vertex_t v = boost::target(*e, g);
      const auto i = static_cast<std::size_t>(g[*e].operand);
      const strategy& st = plan[v];
      const sharding_spec gs = st.grads.size() == operands(g, v).size() ? st.grads[i] : gradient_spec(g, v, st, i);
      if (std::find(specs.begin(), specs.end(), gs) == specs.end()) specs.push_back(gs);
    }
    if (plan[u].zero_stage > 0) specs.push_back(plan[u].gradient_spec);
    for (const sharding_spec& s : specs)
      for (int r = 0; r < mesh.num_ranks(); ++r) total += bytes_of(local_box(mesh, s, g[u].shape, r).shape, type_of(u));
  }
  return total;
}
}  // namespace detail

/// The peak of verify_plan's forward run in `compute` (f32 or f64): the sources held once,
/// then step by step in topological order the reference values still needed plus every
/// rank's live pieces, its resharded operands (twice: a collective's buffer and its result),
/// its output and the replicated copy a Partial output is compared through. `training`: the
/// training step's peak (`g` the global batch's graph, which bounds a micro-step's), with
/// `micro_batches` > 1 every rank's gradient accumulators held beside it (accumulation_bytes).
inline memory_estimate estimate_verify_memory(const model_graph& g, const device_mesh& mesh,
                                              const std::vector<strategy>& plan, dtype compute, bool training = false,
                                              int micro_batches = 1) {
  const std::size_t n = boost::num_vertices(g);
  if (plan.size() != n)
    throw exec_error("the plan has " + std::to_string(plan.size()) + " strategies for a graph of " + std::to_string(n) + " vertices");
  const auto type_of = [&](vertex_t v) { return detail::is_integer(g[v].type) ? dtype::i64 : compute; };
  const int ranks = mesh.num_ranks();
  memory_estimate e;
  e.ranks = rank_threads_cost(mesh).memory;
  std::vector<std::uint64_t> piece_sum(n, 0);  // every rank's piece of v together
  for (vertex_t v = 0; v < n; ++v) {
    if (!g[v].is_operator()) {
      e.sources += detail::bytes_of(g[v].shape, type_of(v));
      if (detail::all_replicated(plan[v].output)) continue;  // ranks read the source itself
    }
    for (int r = 0; r < ranks; ++r) piece_sum[v] += detail::bytes_of(local_box(mesh, plan[v].output, g[v].shape, r).shape, type_of(v));
  }
  // Walked along the schedule run_sharded follows: every value freed at its last consumer.
  const liveness_schedule s = make_liveness_schedule(g, &plan, run_mode::inference);
  const auto held_for = [&](vertex_t u) { return piece_sum[u] + (g[u].is_operator() ? detail::bytes_of(g[u].shape, type_of(u)) : 0); };
  std::uint64_t live = 0;  // reference values and pieces alive between steps
  for (vertex_t v : s.order) {
    if (g[v].is_operator()) {
      const std::uint64_t step = detail::verify_step_bytes(g, mesh, plan, v, type_of);
      if (e.sources + live + piece_sum[v] + step + e.ranks > e.total()) {
        e.activations = live + piece_sum[v] + step;
        e.worst_step = quoted_text(g[v].name);
      }
      live += held_for(v);
      for (vertex_t u : s.forward_frees[v]) live -= held_for(u);
    } else {
      live += piece_sum[v];
    }
    if (s.forward_frees_itself[v]) live -= held_for(v);
  }
  if (training) {  // the forward above is its step 2, beside the reference's gradients
    const memory_estimate t = detail::estimate_training_step(g, mesh, plan, type_of, e.activations, e.worst_step);
    e.activations = t.activations;
    e.parameters = t.parameters + (micro_batches > 1 ? detail::accumulation_bytes(g, mesh, plan, type_of) : 0);
    e.worst_step = t.worst_step;
  }
  return e;
}

/// The peak of a pipelined plan's verification (stages `stage_of`, verify_pipeline::stage_of,
/// each on `mesh`): estimate_verify_memory of the whole graph on one stage's mesh bounds every
/// stage's ranks together (each holds its own operators' pieces, at most the step's micro-batches
/// of them at once); beside it each stage's copy of the inputs and parameters it reads, every
/// crossing activation's pieces at each boundary (2 m + 2 of them: the micro-steps in flight as
/// received, the sends of the activations and of their gradients not yet known delivered, the
/// outgoing copy), and the ranks of every stage.
inline memory_estimate estimate_pipelined_verify_memory(const model_graph& g, const device_mesh& mesh, const std::vector<strategy>& plan,
                                                        dtype compute, const std::vector<std::vector<int>>& stage_of, bool training = false,
                                                        int micro_batches = 1) {
  memory_estimate e = estimate_verify_memory(g, mesh, plan, compute, training, micro_batches);
  const auto type_of = [&](vertex_t v) { return detail::is_integer(g[v].type) ? dtype::i64 : compute; };
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    if (!g[v].is_operator()) {
      e.sources += detail::bytes_of(g[v].shape, type_of(v)) * stage_of[v].size();
      continue;
    }
    const int last = last_reading_stage(g, stage_of, v);
    std::uint64_t pieces = 0;
    for (int r = 0; r < mesh.num_ranks(); ++r) pieces += detail::bytes_of(local_box(mesh, plan[v].output, g[v].shape, r).shape, type_of(v));
    e.activations += pieces * static_cast<std::uint64_t>(last - stage_of[v].front()) * (2 * static_cast<std::uint64_t>(micro_batches) + 2);
  }
  e.ranks = rank_threads_cost(pipeline_world(mesh, stage_of), 8u << 20, pipeline_extra_peers(mesh)).memory;
  return e;
}

}  // namespace autoshard

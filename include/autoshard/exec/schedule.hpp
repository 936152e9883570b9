#pragma once
/// When a step's values are freed: one schedule, computed once from the graph and the plan,
/// that the executor runs (run_sharded, train_unsharded, train_sharded) and the memory
/// estimate walks (estimate_verify_memory), so the memory a verification is refused for is
/// the memory the run would hold.
///   const autoshard::liveness_schedule s = autoshard::make_liveness_schedule(g, &plan, autoshard::run_mode::training);
///   s.forward_frees[v];   // the operand values freed once operator v's forward has run
///   s.backward_frees[v];  // the operand values freed once v's backward has run
///
/// Inference (the forward alone) frees every value, a source's piece too, once its last
/// consumer has run. Training keeps what a backward still reads where it lies (backward
/// kernels read some operands, backward_reads_operand, in the spec the forward took them in; a
/// consumer that resharded an operand keeps its own copy): an operator's value is freed when
/// its consumers have run and no backward reads it, or when it is computed again for the
/// backward that does (recomputed_in_backward); otherwise after the last backward reading it.
/// A backward that is the last to read its first operand may write that operand's gradient
/// over it (the loss writes d logits over the logits), and a parameter's gradient is
/// synchronised and the parameter updated after the backward of its last use (as DDP's
/// buckets fire during the backward). A loss's value (a scalar) is kept: it is the step's result.
///
/// Full recomputation (Korthikanti et al. 2022; the plan's strategies that recompute `full`,
/// grouped by their layer, pass/layers.hpp): the layer's first forward keeps nothing for its
/// backward, only what something outside the layer still needs (its output, the next layer's
/// input); each value another recomputed layer starts from (its checkpoint) is kept until that
/// layer has run again. Right before the layer's first backward (its last operator's) its
/// forward runs again, in topological order, keeping what the backward reads as a plain layer
/// does, so from there the backward frees as it would without recomputation.
#include <algorithm>  // std::find, std::none_of
#include <map>        // std::map
#include <set>        // std::set
#include <cstddef>    // std::size_t
#include <string>     // std::to_string
#include <vector>     // std::vector

#include "../graph/pricing.hpp"   // run_mode, recompute_kind
#include "../pass/layers.hpp"     // map_layers
#include "../graph/strategy.hpp"  // strategy
#include "../graph/validate.hpp"  // topological_order
#include "backward.hpp"           // backward_reads_operand
#include "../core/error.hpp"       // exec_error

namespace autoshard {

namespace detail {

/// Whether operator v's backward reads its operand i (`ops` = operands(g, v)) where that
/// operand's value lies: an operator's value, taken in the spec its producer's strategy gives
/// (`plan` null: the unsharded run, where every operand is).
inline bool reads_in_place(const model_graph& g, vertex_t v, const std::vector<vertex_t>& ops, std::size_t i,
                           const std::vector<strategy>* plan) {
  const vertex_t u = ops[i];
  return g[u].is_operator() && backward_reads_operand(g[v].kind, i) &&
         (plan == nullptr || (i < (*plan)[v].inputs.size() && (*plan)[u].output == (*plan)[v].inputs[i]));
}

/// Whether v is a loss a training step starts its backward from: a scalar float operator
/// nothing consumes (a cross_entropy over labels, as the builders add in training mode).
inline bool is_training_loss(const model_graph& g, vertex_t v) {
  return g[v].is_operator() && boost::out_degree(v, g) == 0 && !is_integer(g[v].type) && g[v].shape.numel() == 1;
}

/// Whether u's value is freed once its consumers' forwards have run and computed again for a
/// backward that reads it: an element-wise function of one operand (gelu, silu, ...) whose
/// operand u's own backward keeps anyway and is not itself recomputed, so the recomputation
/// reads the same bits and gives the same bits (a language model's MLP activation, four
/// times the width of the residual stream, then lives only during its reader's backward).
inline bool recomputed_in_backward(const model_graph& g, vertex_t u) {
  const auto elementwise = [](op_kind k) {
    return k == op_kind::gelu || k == op_kind::gelu_erf || k == op_kind::silu || k == op_kind::relu || k == op_kind::tanh ||
           k == op_kind::exp;
  };
  if (!g[u].is_operator() || !elementwise(g[u].kind)) return false;
  const std::vector<vertex_t> ops = operands(g, u);
  return ops.size() == 1 && !(g[ops[0]].is_operator() && elementwise(g[ops[0]].kind));
}

}  // namespace detail

/// The schedule of one step (see the file comment); every list is indexed by vertex.
struct liveness_schedule {
  std::vector<vertex_t> order;  ///< topological: the forward runs it, the backward runs it reversed
  /// Operand values freed once v's forward has run (its last consumer), before its own piece
  /// is handed on.
  std::vector<std::vector<vertex_t>> forward_frees;
  /// v's own value is freed as soon as its forward has run and been handed on (nothing consumes it).
  std::vector<char> forward_frees_itself;
  /// Training: operand values freed once v's backward has run (the last backward reading them).
  std::vector<std::vector<vertex_t>> backward_frees;
  /// Training: operand values v's backward computes again (each once), freed right after it.
  std::vector<std::vector<vertex_t>> recomputed;
  /// Training: v's backward is the last to read its operand 0 where it lies, so it may write
  /// that operand's gradient over it.
  std::vector<char> last_reader_of_first;
  /// Training: the parameters whose last use's backward is v's.
  std::vector<std::vector<vertex_t>> finished;
  /// Training, full recomputation: v's first forward keeps nothing for its backward (its layer
  /// runs again before it).
  std::vector<char> replayed;
  /// Training, full recomputation: the operators whose forward runs again right before v's
  /// backward (a fully recomputed layer's, in topological order, at its last operator).
  std::vector<std::vector<vertex_t>> replay;
  /// Training, full recomputation: operand values freed once v's forward has run again, and
  /// whether v's own is (nothing in its layer consumes it and no backward still reads it).
  std::vector<std::vector<vertex_t>> replay_frees;
  std::vector<char> replay_frees_itself;
  /// How many operators run their forward again per step (0: nothing is recomputed fully).
  std::size_t replayed_operators = 0;
};

namespace detail {

/// How many backward kernels read each value where it lies (reads_in_place).
inline std::vector<std::size_t> in_place_backward_readers(const model_graph& g, const std::vector<strategy>* plan) {
  std::vector<std::size_t> readers(boost::num_vertices(g), 0);
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    if (!g[v].is_operator()) continue;
    const std::vector<vertex_t> ops = operands(g, v);
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (reads_in_place(g, v, ops, i, plan)) ++readers[ops[i]];
  }
  return readers;
}

/// The fully recomputed layers of a plan (strategies that recompute `full`, by layer index):
/// each vertex's group (-1: none), each group's operators in topological order, and for each
/// value how many groups other than its own start from it (their checkpoint).
struct replay_groups {
  std::vector<long> group;
  std::vector<std::vector<vertex_t>> members;
  std::vector<std::size_t> checkpoint_of;
  bool any() const noexcept { return !members.empty(); }
};

inline replay_groups full_recompute_groups(const model_graph& g, const std::vector<strategy>* plan, const std::vector<vertex_t>& order) {
  const std::size_t n = boost::num_vertices(g);
  replay_groups r;
  r.group.assign(n, -1);
  r.checkpoint_of.assign(n, 0);
  if (plan == nullptr ||
      std::none_of(plan->begin(), plan->end(), [](const strategy& st) { return st.recompute == recompute_kind::full; }))
    return r;
  const layer_map layers = map_layers(g);
  std::map<long, long> id;  // layer index -> group
  for (vertex_t v : order) {
    if (!g[v].is_operator() || (*plan)[v].recompute != recompute_kind::full || layers.layer[v] < 0) continue;
    const auto [it, fresh] = id.try_emplace(layers.layer[v], static_cast<long>(r.members.size()));
    if (fresh) r.members.emplace_back();
    r.group[v] = it->second;
    r.members[static_cast<std::size_t>(it->second)].push_back(v);
  }
  for (const std::vector<vertex_t>& m : r.members) {
    std::set<vertex_t> inputs;
    for (vertex_t w : m)
      for (vertex_t u : operands(g, w))
        if (r.group[u] != r.group[w]) inputs.insert(u);
    for (vertex_t u : inputs) ++r.checkpoint_of[u];
  }
  return r;
}

/// The forward's half: each value freed at its last consumer (training: unless a backward
/// still reads it and it is not recomputed, or a recomputed layer starts from it; a value of a
/// recomputed layer counts only the backwards outside its layer).
inline void schedule_forward(const model_graph& g, bool training, const std::vector<strategy>* plan,
                             const std::vector<std::size_t>& readers, const replay_groups& rg, liveness_schedule& s) {
  const std::size_t n = boost::num_vertices(g);
  std::vector<std::size_t> uses(n), first_readers = readers;
  for (vertex_t v = 0; v < n; ++v) uses[v] = boost::out_degree(v, g);
  if (rg.any())
    for (vertex_t v = 0; v < n; ++v) {
      if (!g[v].is_operator()) continue;
      const std::vector<vertex_t> ops = operands(g, v);
      for (std::size_t i = 0; i < ops.size(); ++i)
        if (rg.group[ops[i]] >= 0 && rg.group[ops[i]] == rg.group[v] && reads_in_place(g, v, ops, i, plan)) --first_readers[ops[i]];
    }
  const auto dropped = [&](vertex_t u) {
    return !training || (g[u].is_operator() && rg.checkpoint_of[u] == 0 && !is_training_loss(g, u) &&
                         (first_readers[u] == 0 || recomputed_in_backward(g, u)));
  };
  for (vertex_t v : s.order) {
    s.replayed[v] = training && rg.group[v] >= 0 ? 1 : 0;
    if (g[v].is_operator())
      for (vertex_t u : operands(g, v))
        if (--uses[u] == 0 && dropped(u)) s.forward_frees[v].push_back(u);
    s.forward_frees_itself[v] = uses[v] == 0 && (g[v].is_operator() || !training) && dropped(v) ? 1 : 0;
  }
}

/// A fully recomputed layer's forward run again (group `m`, before its first backward): what
/// each operator frees once it has run, by the backwards and recomputed layers still to come
/// (`readers`, `checkpoints`: what is left of them at this point of the backward).
inline void schedule_replay(const model_graph& g, const replay_groups& rg, const std::vector<vertex_t>& m,
                            const std::vector<std::size_t>& readers, std::vector<std::size_t>& checkpoints, liveness_schedule& s) {
  const long group = rg.group[m.front()];
  std::map<vertex_t, vertex_t> last_in_layer;  // each value's last consumer in the layer
  for (vertex_t w : m)
    for (vertex_t u : operands(g, w)) {
      if (rg.group[u] != group && last_in_layer.find(u) == last_in_layer.end()) --checkpoints[u];  // once per layer
      last_in_layer[u] = w;
    }
  const auto unneeded = [&](vertex_t u) {
    return g[u].is_operator() && checkpoints[u] == 0 && !is_training_loss(g, u) &&
           (readers[u] == 0 || (rg.group[u] == group && recomputed_in_backward(g, u)));
  };
  for (vertex_t w : m) {
    for (const auto& [u, last] : last_in_layer)
      if (last == w && unneeded(u)) s.replay_frees[w].push_back(u);
    s.replay_frees_itself[w] = last_in_layer.find(w) == last_in_layer.end() && unneeded(w) ? 1 : 0;
  }
  s.replay[m.back()] = m;
  s.replayed_operators += m.size();
}

/// The backward's half, in reverse topological order.
inline void schedule_backward(const model_graph& g, const std::vector<strategy>* plan, std::vector<std::size_t> readers,
                              const replay_groups& rg, liveness_schedule& s) {
  std::vector<std::size_t> pending(boost::num_vertices(g));  // a parameter's uses whose backward has not run
  for (vertex_t v = 0; v < pending.size(); ++v) pending[v] = boost::out_degree(v, g);
  std::vector<std::size_t> checkpoints = rg.checkpoint_of;  // recomputed layers still to start from a value
  for (auto it = s.order.rbegin(); it != s.order.rend(); ++it) {
    const vertex_t v = *it;
    if (!g[v].is_operator()) continue;
    if (rg.group[v] >= 0 && rg.members[static_cast<std::size_t>(rg.group[v])].back() == v)
      schedule_replay(g, rg, rg.members[static_cast<std::size_t>(rg.group[v])], readers, checkpoints, s);
    const std::vector<vertex_t> ops = operands(g, v);
    s.last_reader_of_first[v] = !ops.empty() && reads_in_place(g, v, ops, 0, plan) && readers[ops[0]] == 1 ? 1 : 0;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (!reads_in_place(g, v, ops, i, plan)) continue;
      std::vector<vertex_t>& again = s.recomputed[v];
      if (recomputed_in_backward(g, ops[i]) && std::find(again.begin(), again.end(), ops[i]) == again.end())
        again.push_back(ops[i]);
      if (--readers[ops[i]] == 0 && checkpoints[ops[i]] == 0) s.backward_frees[v].push_back(ops[i]);
    }
    for (vertex_t u : ops)
      if (g[u].is_parameter() && --pending[u] == 0) s.finished[v].push_back(u);
  }
}

}  // namespace detail

/// The schedule of a step of `g` run by `plan` (null: unsharded), forward alone (inference) or
/// forward and backward (training).
inline liveness_schedule make_liveness_schedule(const model_graph& g, const std::vector<strategy>* plan, run_mode mode) {
  const std::size_t n = boost::num_vertices(g);
  liveness_schedule s;
  s.order = topological_order(g);
  s.forward_frees.resize(n);
  s.forward_frees_itself.resize(n, 0);
  s.backward_frees.resize(n);
  s.recomputed.resize(n);
  s.last_reader_of_first.resize(n, 0);
  s.finished.resize(n);
  s.replayed.resize(n, 0);
  s.replay.resize(n);
  s.replay_frees.resize(n);
  s.replay_frees_itself.resize(n, 0);
  if (plan != nullptr && plan->size() != n)
    throw exec_error("the plan has " + std::to_string(plan->size()) + " strategies for a graph of " + std::to_string(n) + " vertices");
  const bool training = mode == run_mode::training;
  const std::vector<std::size_t> readers = training ? detail::in_place_backward_readers(g, plan) : std::vector<std::size_t>();
  const detail::replay_groups rg = detail::full_recompute_groups(g, training ? plan : nullptr, s.order);
  detail::schedule_forward(g, training, plan, readers, rg, s);
  if (training) detail::schedule_backward(g, plan, readers, rg, s);
  return s;
}

}  // namespace autoshard

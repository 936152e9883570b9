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
/// buckets fire during the backward).
#include <algorithm>  // std::find
#include <cstddef>    // std::size_t
#include <string>     // std::to_string
#include <vector>     // std::vector

#include "../graph/pricing.hpp"   // run_mode
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

/// The forward's half: each value freed at its last consumer (training: unless a backward
/// still reads it and it is not recomputed).
inline void schedule_forward(const model_graph& g, bool training, const std::vector<std::size_t>& readers, liveness_schedule& s) {
  std::vector<std::size_t> uses(boost::num_vertices(g));
  for (vertex_t v = 0; v < uses.size(); ++v) uses[v] = boost::out_degree(v, g);
  const auto dropped = [&](vertex_t u) {
    return !training || (g[u].is_operator() && (readers[u] == 0 || recomputed_in_backward(g, u)));
  };
  for (vertex_t v : s.order) {
    if (g[v].is_operator())
      for (vertex_t u : operands(g, v))
        if (--uses[u] == 0 && dropped(u)) s.forward_frees[v].push_back(u);
    s.forward_frees_itself[v] = uses[v] == 0 && (g[v].is_operator() || !training) && dropped(v) ? 1 : 0;
  }
}

/// The backward's half, in reverse topological order.
inline void schedule_backward(const model_graph& g, const std::vector<strategy>* plan, std::vector<std::size_t> readers,
                              liveness_schedule& s) {
  std::vector<std::size_t> pending(boost::num_vertices(g));  // a parameter's uses whose backward has not run
  for (vertex_t v = 0; v < pending.size(); ++v) pending[v] = boost::out_degree(v, g);
  for (auto it = s.order.rbegin(); it != s.order.rend(); ++it) {
    const vertex_t v = *it;
    if (!g[v].is_operator()) continue;
    const std::vector<vertex_t> ops = operands(g, v);
    s.last_reader_of_first[v] = !ops.empty() && reads_in_place(g, v, ops, 0, plan) && readers[ops[0]] == 1 ? 1 : 0;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (!reads_in_place(g, v, ops, i, plan)) continue;
      std::vector<vertex_t>& again = s.recomputed[v];
      if (recomputed_in_backward(g, ops[i]) && std::find(again.begin(), again.end(), ops[i]) == again.end())
        again.push_back(ops[i]);
      if (--readers[ops[i]] == 0) s.backward_frees[v].push_back(ops[i]);
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
  if (plan != nullptr && plan->size() != n)
    throw exec_error("the plan has " + std::to_string(plan->size()) + " strategies for a graph of " + std::to_string(n) + " vertices");
  const bool training = mode == run_mode::training;
  const std::vector<std::size_t> readers = training ? detail::in_place_backward_readers(g, plan) : std::vector<std::size_t>();
  detail::schedule_forward(g, training, readers, s);
  if (training) detail::schedule_backward(g, plan, readers, s);
  return s;
}

}  // namespace autoshard

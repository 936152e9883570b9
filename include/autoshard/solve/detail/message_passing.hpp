#pragma once
// Sequential tree-reweighted message passing (TRW-S, Kolmogorov 2006) on the reduced problem
// with the usage limit priced away: the nodes are visited in a fixed order, forwards then
// backwards; at each node the messages to the nodes after it (in the direction of the pass) are
// recomputed from the node's belief, shared between the monotonic chains that pass through it.
// It optimises the dual of the LP relaxation (the marginal polytope's local relaxation) of the
// priced pairwise problem, and the forward pass reads an assignment off the messages: each node
// takes its best strategy given the picks of the nodes before it and the messages of the nodes
// after it. On the auto-sharding requests that assignment, priced by Lagrangian prices of the
// memory rows and then improved by the window search, is far better than local search alone
// (detail/lagrangian_search.hpp). Floating point is fine here: nothing read from it is trusted
// without being evaluated exactly, and the proven bound (detail/lagrangian_bound.hpp) recomputes
// the reparametrisation the messages define in exact integers.
#include <algorithm>  // std::min, std::max, std::min_element
#include <cstddef>    // std::size_t
#include <vector>     // std::vector

#include "reduce.hpp"        // wcost, is_forbidden_w
#include "reduced_view.hpp"  // reduced_view

namespace autoshard::detail {

/// The reduced problem's edge tables in double precision (a forbidden entry is `big`), built
/// once and shared read-only by every search thread, and each node's place in the visiting order.
struct mrf_tables {
  static constexpr double big = 1e30;  ///< a forbidden entry or strategy
  const reduced_view& rv;
  std::vector<std::size_t> pos;                 ///< per node id: its place in rv.ilp_nodes
  std::vector<std::vector<double>> edge;        ///< per edge id: row-major |S_u| x |S_v|
  std::vector<double> weight;                   ///< per node id: 1 / (chains through it)

  static double of(wcost c) { return is_forbidden_w(c) ? big : static_cast<double>(c); }

  explicit mrf_tables(const reduced_view& view) : rv(view), edge(view.red.edges.size()) {
    const std::size_t n = rv.red.nodes.size();
    pos.assign(n, n);
    weight.assign(n, 1.0);
    for (std::size_t k = 0; k < rv.ilp_nodes.size(); ++k) pos[rv.ilp_nodes[k]] = k;
    for (std::size_t e = 0; e < rv.red.edges.size(); ++e) {
      if (!rv.edge(e).alive) continue;
      edge[e].reserve(rv.edge(e).m.size());
      for (wcost c : rv.edge(e).m) edge[e].push_back(of(c));
    }
    for (std::size_t v : rv.ilp_nodes) {
      std::size_t before = 0, after = 0;
      for (const reduced_view::incidence& in : rv.inc[v]) (pos[rv.other(in)] < pos[v] ? before : after) += 1;
      weight[v] = 1.0 / static_cast<double>(std::max<std::size_t>(1, std::max(before, after)));
    }
  }
};

/// One thread's messages and the assignment the last forward pass read off them.
class message_passing {
 public:
  explicit message_passing(const mrf_tables& t) : t_(t), rv_(t.rv), into_(t.rv.red.edges.size() * 2) {
    for (std::size_t e = 0; e < rv_.red.edges.size(); ++e)
      if (rv_.edge(e).alive) {
        into_[2 * e].assign(rv_.node(rv_.edge(e).u).size(), 0.0);
        into_[2 * e + 1].assign(rv_.node(rv_.edge(e).v).size(), 0.0);
      }
    unary_.resize(rv_.red.nodes.size());
    pick.assign(rv_.red.nodes.size(), 0);
  }

  /// The assignment of the last forward pass (per node id).
  std::vector<std::size_t> pick;

  /// Node costs plus `penalty` (per node id and strategy; none: the costs alone). The messages
  /// are kept: they stay a valid reparametrisation, and a warm start for the new costs.
  void set_costs(const std::vector<std::vector<wcost>>* penalty) {
    for (std::size_t v : rv_.ilp_nodes) {
      const work_node& n = rv_.node(v);
      std::vector<double>& u = unary_[v];
      u.resize(n.size());
      for (std::size_t i = 0; i < n.size(); ++i)
        u[i] = mrf_tables::of(penalty ? wadd(n.cost[i], (*penalty)[v][i]) : n.cost[i]);
    }
  }

  /// `iterations` forward and backward passes, then a forward pass that reads `pick`. False
  /// when `over()` (asked every 1024 nodes: a pass over the contest's largest requests takes
  /// seconds) ended it first, the messages and `pick` then part-way.
  template <class Over>
  bool run(int iterations, Over&& over) {
    for (int k = 0; k < iterations; ++k)
      if (!pass(true, over) || !pass(false, over)) return false;
    return pass(true, over);
  }
  void run(int iterations) { (void)run(iterations, [] { return false; }); }

  /// The message into node `to_u ? u : v` of edge e (per strategy of that node).
  const std::vector<double>& message(std::size_t e, bool to_u) const { return into_[2 * e + (to_u ? 0 : 1)]; }
  const std::vector<double>& costs(std::size_t v) const { return unary_[v]; }

 private:
  const mrf_tables& t_;
  const reduced_view& rv_;
  std::vector<std::vector<double>> into_;   // [2e]: into u from v; [2e + 1]: into v from u
  std::vector<std::vector<double>> unary_;  // per node id
  std::vector<double> belief_, share_, row_;

  std::vector<double>& into(const reduced_view::incidence& in) { return into_[2 * in.edge + (in.is_u ? 0 : 1)]; }
  std::vector<double>& out_of(const reduced_view::incidence& in) { return into_[2 * in.edge + (in.is_u ? 1 : 0)]; }

  template <class Over>
  bool pass(bool forward, Over& over) {
    const std::vector<std::size_t>& order = rv_.ilp_nodes;
    const std::size_t n = order.size();
    for (std::size_t k = 0; k < n; ++k) {
      if ((k & 1023) == 1023 && over()) return false;
      const std::size_t v = order[forward ? k : n - 1 - k];
      const std::size_t sv = rv_.node(v).size();
      const auto later = [&](std::size_t w) { return forward ? t_.pos[w] > t_.pos[v] : t_.pos[w] < t_.pos[v]; };
      belief_ = unary_[v];
      for (const reduced_view::incidence& in : rv_.inc[v]) {
        const std::vector<double>& m = into(in);
        for (std::size_t i = 0; i < sv; ++i) belief_[i] += m[i];
      }
      if (forward) {  // the nodes before v are placed: v's best given them and the messages after
        row_ = unary_[v];
        for (const reduced_view::incidence& in : rv_.inc[v]) {
          const std::size_t w = rv_.other(in);
          if (later(w)) {
            const std::vector<double>& m = into(in);
            for (std::size_t i = 0; i < sv; ++i) row_[i] += m[i];
          } else {
            const std::vector<double>& tab = t_.edge[in.edge];
            const std::size_t sw = rv_.node(w).size();
            for (std::size_t i = 0; i < sv; ++i) row_[i] += in.is_u ? tab[i * sw + pick[w]] : tab[pick[w] * sv + i];
          }
        }
        pick[v] = static_cast<std::size_t>(std::min_element(row_.begin(), row_.end()) - row_.begin());
      }
      for (const reduced_view::incidence& in : rv_.inc[v]) {
        const std::size_t w = rv_.other(in);
        if (!later(w)) continue;
        const std::vector<double>& back = into(in);
        share_.resize(sv);
        for (std::size_t i = 0; i < sv; ++i) share_[i] = t_.weight[v] * belief_[i] - back[i];
        std::vector<double>& out = out_of(in);
        const std::vector<double>& tab = t_.edge[in.edge];
        const std::size_t sw = rv_.node(w).size();
        if (in.is_u) {  // tab[i * sw + j], i of v: min over rows
          for (std::size_t j = 0; j < sw; ++j) out[j] = share_[0] + tab[j];
          for (std::size_t i = 1; i < sv; ++i) {
            const double s = share_[i];
            const double* r = &tab[i * sw];
            for (std::size_t j = 0; j < sw; ++j) out[j] = std::min(out[j], s + r[j]);
          }
        } else {  // tab[j * sv + i], i of v: min within each row
          for (std::size_t j = 0; j < sw; ++j) {
            const double* r = &tab[j * sv];
            double m = share_[0] + r[0];
            for (std::size_t i = 1; i < sv; ++i) m = std::min(m, share_[i] + r[i]);
            out[j] = m;
          }
        }
        const double lo = *std::min_element(out.begin(), out.end());
        for (double& x : out) x -= lo;
      }
    }
    return true;
  }
};

}  // namespace autoshard::detail

#pragma once
// A branch and bound whose every pruning is proven in spite of floating point: GLPK's simplex
// solves each node's LP, but a node is pruned only by the safe dual bound of that LP
// (glpk_model::safe_dual_bound, exact integer data, rounding error subtracted) rounded up
// to an integer, or by exact evaluation of a complete assignment. Branching splits one node's
// strategies into {its largest LP value} and the rest. An LP that GLPK calls infeasible is
// solved again with the excluded strategies allowed at a large exact price, whose safe bound is
// then a bound of the node. It proves the optimum of the reduced problem, or leaves a proven
// lower bound over the nodes still open when time runs out.
#include <glpk.h>  // glp_simplex

#include <algorithm>   // std::min
#include <chrono>      // std::chrono::steady_clock
#include <climits>     // INT_MAX
#include <cmath>       // std::ceil
#include <cstddef>     // std::size_t
#include <functional>  // std::function
#include <limits>      // std::numeric_limits
#include <vector>      // std::vector

#include "glpk_model.hpp"  // glpk_model, safe_simplex

namespace autoshard::detail {

/// What the exact search established (reduced-cost units, the reducer's offset not included).
struct exact_search_result {
  bool complete = false;  ///< every node was pruned: no answer is cheaper than the incumbent
  /// Not complete and not for lack of time: GLPK's simplex failed (its return code or, when it
  /// returned 0, 100 + the LP's status) on a node's LP, so the search could not go on.
  int failure = 0;
  /// A lower bound of every answer cheaper than the incumbent (the open nodes' smallest bound).
  long double bound = -std::numeric_limits<long double>::infinity();
  std::size_t nodes = 0;  ///< LPs solved
};

class exact_search {
 public:
  using clock = std::chrono::steady_clock;
  /// Offers a complete assignment of the reduced nodes; returns the incumbent's reduced cost.
  using offer_fn = std::function<wcost(const std::vector<std::size_t>&)>;

  /// `slack`: nodes whose bound is within it of the incumbent are pruned too (mip_rel_gap).
  exact_search(glpk_model& m, offer_fn offer, wcost incumbent, wcost slack, double limit_tol)
      : model_(m), offer_(std::move(offer)), ub_(incumbent), slack_(slack), tol_(limit_tol) {}

  exact_search_result run(clock::time_point deadline) {
    exact_search_result out;
    glp_prob* P = model_.lp.get();
    const reduced_view& rv = model_.rv;
    std::vector<node> stack{{{}, -std::numeric_limits<long double>::infinity()}};
    long double root_bound = -std::numeric_limits<long double>::infinity();
    bool stopped = false;
    while (!stack.empty()) {
      node nd = std::move(stack.back());
      stack.pop_back();
      if (prunes(nd.bound)) continue;
      if (clock::now() >= deadline) {
        stack.push_back(std::move(nd));
        stopped = true;
        break;
      }
      apply(nd.fixed);
      long double bound = nd.bound;
      std::vector<double> x;
      const lp_end end = solve_node(nd.fixed, deadline, root_bound, bound, x);
      ++out.nodes;
      if (end == lp_end::stop || end == lp_end::failed) {
        stack.push_back(std::move(nd));
        stopped = true;
        if (end == lp_end::failed) out.failure = failure_;
        break;
      }
      if (stack.empty() && nd.fixed.empty()) root_bound = bound;
      if (end == lp_end::pruned || prunes(bound)) continue;
      // Reduced-cost fixing for the subtree: a column whose every answer costs at least the
      // incumbent (bound + its safe reduced cost) is held at 0 below this node.
      std::vector<char> is_fixed(static_cast<std::size_t>(glp_get_num_cols(P)) + 1, 0);
      for (int c : nd.fixed) is_fixed[static_cast<std::size_t>(c)] = 1;
      fix_by_reduced_cost(is_fixed, nd.fixed);
      std::size_t branch_v = rv.red.nodes.size(), top_col = 0;
      double most = -1.0;
      bool integral = true;
      std::vector<std::size_t> pick(rv.red.nodes.size(), 0);
      for (std::size_t v : rv.ilp_nodes) {
        const auto c0 = static_cast<std::size_t>(model_.first_col[v]);
        std::size_t free = 0, arg = 0;
        double hi = -1.0;
        for (std::size_t i = 0; i < rv.node(v).size(); ++i) {
          if (is_fixed[c0 + i] || glp_get_col_ub(P, static_cast<int>(c0 + i)) <= 0.0) continue;
          ++free;
          if (x[c0 + i] > hi) hi = x[c0 + i], arg = i;
        }
        pick[v] = arg;
        if (hi < 1.0 - 1e-9) integral = false;
        if (free >= 2 && 1.0 - hi > most) most = 1.0 - hi, branch_v = v, top_col = c0 + arg;
      }
      if (integral || branch_v == rv.red.nodes.size()) {
        ub_ = offer_(pick);  // exactly evaluated; may lower the incumbent
        if (prunes(bound) || branch_v == rv.red.nodes.size()) continue;
      }
      // Child "not the top strategy", then child "only the top strategy" (searched first).
      node without{nd.fixed, bound};
      without.fixed.push_back(static_cast<int>(top_col));
      node only{std::move(nd.fixed), bound};
      const auto c0 = static_cast<std::size_t>(model_.first_col[branch_v]);
      for (std::size_t i = 0; i < rv.node(branch_v).size(); ++i)
        if (c0 + i != top_col && !is_fixed[c0 + i] && glp_get_col_ub(P, static_cast<int>(c0 + i)) > 0.0)
          only.fixed.push_back(static_cast<int>(c0 + i));
      stack.push_back(std::move(without));
      stack.push_back(std::move(only));
    }
    apply({});
    out.complete = !stopped;
    long double lo = pruned_low_;
    for (const node& nd : stack) lo = std::min(lo, nd.bound);
    out.bound = lo;
    return out;
  }

 private:
  struct node {
    std::vector<int> fixed;  // strategy columns held at 0 (with their pair columns, by the marginal rows)
    long double bound;       // proven lower bound (from the parent)
  };
  enum class lp_end { solved, pruned, stop, failed };

  glpk_model& model_;
  offer_fn offer_;
  wcost ub_;
  wcost slack_;
  double tol_;
  long double pruned_low_ = std::numeric_limits<long double>::infinity();  // lowest bound pruned by the slack
  std::vector<int> applied_;
  std::vector<long double> last_reduced_;  // safe reduced costs of the node's LP (1-based)
  long double last_bound_ = 0.0L;          // and its safe bound, from the same duals

  /// The LP objective (GLPK's units) past which a node is pruned, with a margin for the safe
  /// bound's rounding: the dual simplex need not go further (solve_node).
  double prune_level() const {
    const long double level = static_cast<long double>(ub_) - static_cast<long double>(slack_) - 1.0L;
    if (!(level < 1e30L)) return std::numeric_limits<double>::infinity();
    const double scaled = model_.scale * static_cast<double>(level);
    return scaled + 1e-9 * std::fabs(scaled) + 1e-9;
  }

  /// A node of proven bound `b` holds no answer cheaper than the incumbent: every answer is an
  /// integer, so one of cost < ub_ costs at most ub_ - 1.
  bool prunes(long double b) {
    if (!(b > -std::numeric_limits<long double>::infinity())) return false;
    if (b >= 1e30L) return true;
    const wcost c = static_cast<wcost>(std::ceil(b));  // an integer below 1e30: exact in 128 bits
    if (c + slack_ < ub_) return false;
    if (c < ub_) pruned_low_ = std::min(pruned_low_, std::ceil(b));
    return true;
  }

  /// With the node's own safe bound L and reduced costs d (from the same duals), an answer that
  /// takes column j costs at least L + d_j.
  void fix_by_reduced_cost(std::vector<char>& is_fixed, std::vector<int>& fixed) {
    const long double bound = last_bound_;
    if (!std::isfinite(static_cast<double>(bound)) || last_reduced_.empty()) return;
    glp_prob* P = model_.lp.get();
    const long double eps = std::numeric_limits<long double>::epsilon();
    for (std::size_t j = 1; j < last_reduced_.size(); ++j) {
      const long double d = last_reduced_[j];
      if (is_fixed[j] || !(d > 0.0L) || glp_get_col_ub(P, static_cast<int>(j)) <= 0.0) continue;
      const long double lo = bound + d - 4.0L * eps * (std::fabs(bound) + d);
      if (lo >= 1e30L || prunes(lo)) {
        is_fixed[j] = 1;
        fixed.push_back(static_cast<int>(j));
      }
    }
  }

  void apply(const std::vector<int>& fixed) {
    glp_prob* P = model_.lp.get();
    for (int c : applied_) glp_set_col_bnds(P, c, GLP_DB, 0.0, 1.0);
    for (int c : fixed) glp_set_col_bnds(P, c, GLP_FX, 0.0, 0.0);
    applied_ = fixed;
  }

  static int ms_until(clock::time_point deadline) {
    const double left = std::chrono::duration<double>(deadline - clock::now()).count();
    if (left <= 0.0) return 0;
    return static_cast<int>(std::min(left * 1000.0, static_cast<double>(INT_MAX)));
  }

  int failure_ = 0;  // the last failure's code (see exact_search_result::failure)

  /// 0 solved, 1 infeasible, 2 out of time, 3 failed (the code in failure_), 4 stopped once its
  /// objective passed `obj_ul` (GLPK's units). A time-out and a failure are told apart: only the
  /// first is the time limit's doing.
  int simplex(clock::time_point deadline, double obj_ul = std::numeric_limits<double>::infinity()) {
    glp_prob* P = model_.lp.get();
    const int tm_lim = ms_until(deadline);
    if (tm_lim == 0) return 2;
    const int rc = safe_simplex(P, tm_lim, obj_ul);
    if (rc == GLP_ETMLIM) return 2;
    if (rc == GLP_EOBJUL) return 4;
    if (rc != 0) {
      failure_ = rc;
      return 3;
    }
    const int st = glp_get_status(P);
    if (st == GLP_OPT) return 0;
    if (st == GLP_NOFEAS) return 1;
    failure_ = 100 + st;
    return 3;
  }

  /// Solve the node's LP (adding violated memory rows), raise `bound` to its safe bound, leave
  /// its column values in `x`.
  lp_end solve_node(const std::vector<int>& fixed, clock::time_point deadline, long double root_bound,
                    long double& bound, std::vector<double>& x) {
    bool limited = true;  // the dual simplex may stop where the node is pruned (prune_level)
    for (;;) {
      const int st = simplex(deadline, limited ? prune_level() : std::numeric_limits<double>::infinity());
      if (st == 2) return lp_end::stop;
      if (st == 3) return lp_end::failed;
      if (st == 1) return penalised(fixed, deadline, root_bound, bound, x);
      glpk_model::safe_lp safe = model_.safe_dual_bound();
      bound = std::max(bound, safe.bound);
      if (prunes(bound)) return lp_end::pruned;
      if (st == 4) {  // stopped at the level, but its safe bound fell short of pruning: finish the LP
        limited = false;
        continue;
      }
      last_reduced_ = std::move(safe.reduced);
      last_bound_ = safe.bound;
      x = model_.lp_values();
      const long t = model_.most_violated(x, tol_);
      if (t < 0) return lp_end::solved;
      model_.add_memory_row(static_cast<std::size_t>(t));
    }
  }

  /// GLPK calls the node infeasible: allow its excluded strategies again at a price M each (in
  /// the LP and, exactly, in the safe bound). That LP relaxes the node, so its bound is one.
  lp_end penalised(const std::vector<int>& fixed, clock::time_point deadline, long double root_bound,
                   long double& bound, std::vector<double>& x) {
    glp_prob* P = model_.lp.get();
    const long double span = root_bound > -std::numeric_limits<long double>::infinity()
                                 ? static_cast<long double>(ub_) - root_bound
                                 : static_cast<long double>(ub_);
    const wcost price = static_cast<wcost>(std::min(1e24L, 64.0L * std::max(span, 1.0L) + 1.0L));
    std::vector<wcost> old_cost;
    for (int c : fixed) {
      old_cost.push_back(model_.col_cost[static_cast<std::size_t>(c)]);
      model_.col_cost[static_cast<std::size_t>(c)] += price;
      glp_set_col_bnds(P, c, GLP_DB, 0.0, 1.0);
      glp_set_obj_coef(P, c, model_.coef(model_.col_cost[static_cast<std::size_t>(c)]));
    }
    const int st = simplex(deadline);
    last_reduced_.clear();  // the penalised LP's reduced costs are not this node's
    if (st == 0) {
      bound = std::max(bound, model_.safe_dual_bound().bound);
      x = model_.lp_values();
    }
    for (std::size_t k = 0; k < fixed.size(); ++k) {
      const int c = fixed[k];
      model_.col_cost[static_cast<std::size_t>(c)] = old_cost[k];
      glp_set_obj_coef(P, c, model_.coef(old_cost[k]));
      glp_set_col_bnds(P, c, GLP_FX, 0.0, 0.0);
    }
    if (st == 2) return lp_end::stop;
    if (st != 0) {
      if (st == 1) failure_ = 100 + GLP_NOFEAS;  // infeasible even with every strategy allowed
      return lp_end::failed;
    }
    return prunes(bound) ? lp_end::pruned : lp_end::solved;
  }
};

}  // namespace autoshard::detail

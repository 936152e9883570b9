#pragma once
/// The strategy ILP on GLPK. One one-hot binary vector s_v per node; objective = node costs +
/// edge costs + a constant; each edge u->v gets continuous pair variables e[i][j] in [0, 1] tied
/// to the node vectors by the marginal rows
///   sum_j e[i][j] = s_u[i]   and   sum_i e[i][j] = s_v[j]
/// (|S_u| + |S_v| rows per edge; with integral s they force e to the product). Before GLPK the
/// problem is reduced exactly (detail/reduce.hpp); a memory limit becomes rows over the nodes live
/// at one time point, added lazily: solve, find the most violated time point, add its row, re-solve.
///   autoshard::solve_options o;
///   o.time_limit = 60;        // seconds, for everything
///   o.mip_rel_gap = 0.01;     // a FRACTION: 0.01 = stop within 1% of the bound (MASE used percent)
///   autoshard::solve_result r = autoshard::solve_ilp(problem, o);
///   // r.choice[v] = strategy of node v; r.objective; r.status; r.bound; r.gap; r.sizes
#include <glpk.h>  // glp_prob, glp_intopt, glp_simplex

#include <algorithm>   // std::max, std::min
#include <chrono>      // std::chrono::steady_clock
#include <climits>     // INT_MAX
#include <cmath>       // std::abs, std::isfinite
#include <cstddef>     // std::size_t
#include <cstdint>     // std::int64_t
#include <exception>   // std::exception_ptr
#include <functional>  // std::function
#include <limits>      // std::numeric_limits
#include <memory>      // std::unique_ptr
#include <ostream>     // std::ostream
#include <sstream>     // std::ostringstream
#include <string>      // std::string
#include <vector>      // std::vector

#include "../core/error.hpp"  // solver_error
#include "detail/reduce.hpp"  // reducer, ilp_size
#include "problem.hpp"        // strategy_problem

namespace autoshard {

/// How pair variables are tied to node variables.
enum class ilp_formulation {
  marginal,   ///< e continuous, |S_u| + |S_v| rows per edge (the default)
  naive_and,  ///< e binary, e <= s_u, e <= s_v, e >= s_u + s_v - 1 per pair (MASE; for comparison)
};

/// Proven optimal (within GLPK's tolerance) or merely feasible (time-out or mip_rel_gap reached).
enum class solve_status { optimal, feasible };

inline const char* to_string(solve_status s) { return s == solve_status::optimal ? "optimal" : "feasible"; }

/// A snapshot of the branch and bound, passed to solve_options::on_progress.
struct solve_progress {
  double incumbent = infinite_cost;  ///< best objective found so far (this round), or infinity
  double bound = -infinite_cost;     ///< best lower bound of this round's ILP
  double gap = infinite_cost;        ///< (incumbent - bound) / |incumbent|, a fraction
  double seconds = 0.0;              ///< since solve_ilp started
  int round = 0;                     ///< memory round (0 before any memory row is added)
};

struct solve_options {
  /// Wall-clock budget in seconds for the whole solve (all memory rounds). Must be > 0.
  double time_limit = 10000.0;
  /// Relative MIP gap at which to stop, as a fraction: 0 = prove optimality, 0.01 = within 1%.
  /// (MASE's pass documented an int and passed percent; this is GLPK's mip_gap unit.)
  double mip_rel_gap = 0.0;
  /// Called on every better incumbent and about every `progress_interval` seconds of search.
  std::function<void(const solve_progress&)> on_progress;
  double progress_interval = 1.0;
  /// Exact reductions before GLPK (off only to measure the naive formulation).
  bool reduce = true;
  ilp_formulation formulation = ilp_formulation::marginal;
  /// Memory rows added when violated (true) or all up front (false).
  bool lazy_memory = true;
  /// GLPK's feasibility pump at the root (autoshard's own rounding heuristic always runs).
  bool feasibility_pump = false;
  /// GLPK's cut generators (mixed-integer rounding, Gomory, cover, clique).
  bool cuts = false;
};

struct solve_result {
  std::vector<int> choice;           ///< strategy index per node (of the input problem)
  double objective = 0.0;            ///< cost_of(choice), re-priced on the input problem
  solve_status status = solve_status::optimal;
  double bound = 0.0;                ///< proven lower bound on the optimum
  double gap = 0.0;                  ///< (objective - bound) / |objective|, a fraction
  double seconds = 0.0;              ///< wall-clock time of solve_ilp
  usage_peak peak;                   ///< peak summed usage of the choice
  std::vector<ilp_size> sizes;       ///< "input", then after each reduction, then "ilp"
  std::size_t memory_rows = 0;       ///< memory rows added to the final ILP
  int rounds = 0;                    ///< MIP solves (1 + times a memory row cut off a solution)
};

/// Prints the sizes table and the outcome, e.g. for logs and benches.
inline std::ostream& operator<<(std::ostream& os, const solve_result& r) {
  os << "objective " << r.objective << " (" << to_string(r.status) << ", bound " << r.bound << ", gap "
     << r.gap * 100.0 << "%) in " << r.seconds << " s, " << r.rounds << " round(s), " << r.memory_rows
     << " memory row(s)\n";
  for (const ilp_size& s : r.sizes)
    os << "  " << s.stage << ": " << s.nodes << " nodes, " << s.edges << " edges, " << s.variables
       << " variables, " << s.rows << " rows (" << s.memory_rows << " memory)\n";
  return os;
}

namespace detail {

struct glp_deleter {
  void operator()(glp_prob* p) const noexcept { glp_delete_prob(p); }
};
using glp_ptr = std::unique_ptr<glp_prob, glp_deleter>;

/// Silences GLPK's terminal output for a scope.
class glp_quiet {
  int old_;

 public:
  glp_quiet() : old_(glp_term_out(GLP_OFF)) {}
  ~glp_quiet() { glp_term_out(old_); }
  glp_quiet(const glp_quiet&) = delete;
  glp_quiet& operator=(const glp_quiet&) = delete;
};

using clock = std::chrono::steady_clock;

inline double seconds_since(clock::time_point t0) {
  return std::chrono::duration<double>(clock::now() - t0).count();
}

/// Sizes of the input as written (nothing merged): all pair variables, all maximal live sets.
inline ilp_size input_size(const strategy_problem& p) {
  ilp_size s;
  s.stage = "input";
  s.nodes = p.nodes.size();
  s.edges = p.edges.size();
  for (const strategy_node& n : p.nodes) s.variables += n.costs.size();
  s.rows = p.nodes.size();
  for (const strategy_edge& e : p.edges) {
    s.variables += e.costs.size();
    s.rows += p.nodes[e.from].costs.size() + p.nodes[e.to].costs.size();
  }
  if (p.usage_limit) {
    std::vector<std::int64_t> starts, ends;
    for (const strategy_node& n : p.nodes)
      if (!n.live.empty()) starts.push_back(n.live.begin), ends.push_back(n.live.end);
    std::sort(starts.begin(), starts.end());
    starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
    std::sort(ends.begin(), ends.end());
    for (std::size_t k = 0; k < starts.size(); ++k) {
      const std::int64_t next = k + 1 < starts.size() ? starts[k + 1] : std::numeric_limits<std::int64_t>::max();
      auto it = std::upper_bound(ends.begin(), ends.end(), starts[k]);
      if (it != ends.end() && *it <= next) ++s.memory_rows;
    }
    s.rows += s.memory_rows;
  }
  return s;
}

/// The GLPK model of a reduced problem, with the memory rows it can still add.
class ilp_model {
 public:
  const strategy_problem& p;
  const reducer& red;
  ilp_formulation form;
  glp_ptr lp{glp_create_prob()};
  double scale = 1.0;                // GLPK objective = scale * true objective
  std::vector<std::size_t> ilp_nodes;
  std::vector<int> first_col;        // per original node: first s column (1-based), 0 if folded
  // For the primal heuristic: incident edges per node, pair column per (edge, i*|S_v|+j).
  struct incidence {
    std::size_t edge;
    bool is_u;
  };
  std::vector<std::vector<incidence>> inc;
  std::vector<std::vector<int>> pair_col;
  // Memory candidates: one per time point where the limit can bind.
  std::vector<std::int64_t> times;
  std::vector<char> added;
  std::size_t memory_rows = 0;

  ilp_model(const strategy_problem& prob, const reducer& r, ilp_formulation f)
      : p(prob), red(r), form(f), first_col(prob.nodes.size(), 0), inc(prob.nodes.size()),
        pair_col(r.edges.size()) {
    glp_set_obj_dir(lp.get(), GLP_MIN);
    double big = 0.0;
    for (std::size_t v = 0; v < red.nodes.size(); ++v)
      if (red.nodes[v].alive) {
        ilp_nodes.push_back(v);
        for (double c : red.nodes[v].cost)
          if (std::isfinite(c)) big = std::max(big, std::abs(c));
      }
    for (const work_edge& e : red.edges)
      if (e.alive)
        for (double c : e.m)
          if (std::isfinite(c)) big = std::max(big, std::abs(c));
    scale = big > 0.0 ? 1000.0 / big : 1.0;
    build();
  }

  int add_cols(int n) { return glp_add_cols(lp.get(), n); }

  void build() {
    glp_prob* P = lp.get();
    std::vector<int> ia{0}, ja{0};
    std::vector<double> ar{0.0};
    auto put = [&](int row, int col, double v) {
      ia.push_back(row);
      ja.push_back(col);
      ar.push_back(v);
    };
    // Node columns and one-hot rows.
    for (std::size_t v : ilp_nodes) {
      const work_node& n = red.nodes[v];
      const int c0 = add_cols(static_cast<int>(n.size()));
      first_col[v] = c0;
      const int row = glp_add_rows(P, 1);
      glp_set_row_bnds(P, row, GLP_FX, 1.0, 1.0);
      for (std::size_t i = 0; i < n.size(); ++i) {
        const int c = c0 + static_cast<int>(i);
        glp_set_col_kind(P, c, GLP_BV);
        if (std::isfinite(n.cost[i])) {
          glp_set_obj_coef(P, c, scale * n.cost[i]);
        } else {
          glp_set_col_bnds(P, c, GLP_FX, 0.0, 0.0);
        }
        put(row, c, 1.0);
      }
    }
    // Pair columns.
    for (const work_edge& e : red.edges) {
      if (!e.alive) continue;
      const std::size_t nu = red.nodes[e.u].size(), nv = red.nodes[e.v].size();
      const int cu = first_col[e.u], cv = first_col[e.v];
      const auto eid = static_cast<std::size_t>(&e - red.edges.data());
      inc[e.u].push_back({eid, true});
      inc[e.v].push_back({eid, false});
      pair_col[eid].assign(nu * nv, 0);
      if (form == ilp_formulation::marginal) {
        const int r0 = glp_add_rows(P, static_cast<int>(nu + nv));
        for (std::size_t k = 0; k < nu + nv; ++k) glp_set_row_bnds(P, r0 + static_cast<int>(k), GLP_FX, 0.0, 0.0);
        for (std::size_t i = 0; i < nu; ++i) put(r0 + static_cast<int>(i), cu + static_cast<int>(i), -1.0);
        for (std::size_t j = 0; j < nv; ++j) put(r0 + static_cast<int>(nu + j), cv + static_cast<int>(j), -1.0);
        for (std::size_t i = 0; i < nu; ++i)
          for (std::size_t j = 0; j < nv; ++j) {
            const double c = e.m[i * nv + j];
            if (!std::isfinite(c)) continue;  // a forbidden pair: no variable, so never chosen
            const int col = add_cols(1);
            pair_col[eid][i * nv + j] = col;
            glp_set_col_bnds(P, col, GLP_DB, 0.0, 1.0);
            glp_set_obj_coef(P, col, scale * c);
            put(r0 + static_cast<int>(i), col, 1.0);
            put(r0 + static_cast<int>(nu + j), col, 1.0);
          }
      } else {
        for (std::size_t i = 0; i < nu; ++i)
          for (std::size_t j = 0; j < nv; ++j) {
            const double c = e.m[i * nv + j];
            const int col = add_cols(1);
            pair_col[eid][i * nv + j] = col;
            glp_set_col_kind(P, col, GLP_BV);
            if (std::isfinite(c))
              glp_set_obj_coef(P, col, scale * c);
            else
              glp_set_col_bnds(P, col, GLP_FX, 0.0, 0.0);  // then e >= s_u + s_v - 1 forbids the pair
            const int r0 = glp_add_rows(P, 3);
            glp_set_row_bnds(P, r0, GLP_UP, 0.0, 0.0);  // e - s_u[i] <= 0
            put(r0, col, 1.0);
            put(r0, cu + static_cast<int>(i), -1.0);
            glp_set_row_bnds(P, r0 + 1, GLP_UP, 0.0, 0.0);  // e - s_v[j] <= 0
            put(r0 + 1, col, 1.0);
            put(r0 + 1, cv + static_cast<int>(j), -1.0);
            glp_set_row_bnds(P, r0 + 2, GLP_LO, -1.0, 0.0);  // e - s_u[i] - s_v[j] >= -1
            put(r0 + 2, col, 1.0);
            put(r0 + 2, cu + static_cast<int>(i), -1.0);
            put(r0 + 2, cv + static_cast<int>(j), -1.0);
          }
      }
    }
    glp_set_obj_coef(P, 0, scale * red.offset);
    glp_load_matrix(P, static_cast<int>(ia.size() - 1), ia.data(), ja.data(), ar.data());
    if (p.usage_limit) {
      times = red.binding_times;
      added.assign(times.size(), 0);
    }
  }

  double true_objective(double glpk_value) const { return glpk_value / scale; }

  /// Usage at every candidate time for column values `x` (LP or MIP), minus the limit.
  /// Folded nodes contribute their constant usage.
  std::vector<double> excess(const std::vector<double>& x) const {
    std::vector<double> diff(times.size() + 1, 0.0);
    auto add_range = [&](const live_interval& iv, double u) {
      if (iv.empty() || u == 0.0) return;
      const auto a = std::lower_bound(times.begin(), times.end(), iv.begin) - times.begin();
      const auto b = std::lower_bound(times.begin(), times.end(), iv.end) - times.begin();
      diff[static_cast<std::size_t>(a)] += u;
      diff[static_cast<std::size_t>(b)] -= u;
    };
    for (std::size_t v = 0; v < red.nodes.size(); ++v) {
      const work_node& n = red.nodes[v];
      if (!n.alive) {
        add_range(n.live, static_cast<double>(n.lo));
        continue;
      }
      double u = 0.0;
      for (std::size_t i = 0; i < n.size(); ++i)
        u += static_cast<double>(n.usage[i]) * x[static_cast<std::size_t>(first_col[v]) + i];
      add_range(n.live, u);
    }
    std::vector<double> out(times.size());
    double cur = 0.0;
    for (std::size_t k = 0; k < times.size(); ++k) {
      cur += diff[k];
      out[k] = cur - static_cast<double>(*p.usage_limit);
    }
    return out;
  }

  /// Add the row of candidate time k: sum (usage - lo) s <= limit - constants - sum lo, scaled by 1/limit.
  void add_memory_row(std::size_t k) {
    const std::int64_t t = times[k];
    glp_prob* P = lp.get();
    double rhs = static_cast<double>(*p.usage_limit);
    std::vector<int> idx{0};
    std::vector<double> val{0.0};
    for (std::size_t v = 0; v < red.nodes.size(); ++v) {
      const work_node& n = red.nodes[v];
      if (!n.live.contains(t)) continue;
      if (!n.alive) {
        rhs -= static_cast<double>(n.lo);
        continue;
      }
      const std::int64_t lo = reducer::min_usage(n);
      rhs -= static_cast<double>(lo);
      for (std::size_t i = 0; i < n.size(); ++i)
        if (n.usage[i] != lo) {
          idx.push_back(first_col[v] + static_cast<int>(i));
          val.push_back(static_cast<double>(n.usage[i] - lo));
        }
    }
    const double norm = std::max(1.0, static_cast<double>(*p.usage_limit));
    for (double& a : val) a /= norm;
    const int row = glp_add_rows(P, 1);
    glp_set_row_bnds(P, row, GLP_UP, 0.0, rhs / norm);
    glp_set_mat_row(P, row, static_cast<int>(idx.size() - 1), idx.data(), val.data());
    added[k] = 1;
    ++memory_rows;
  }

  /// Index of the most violated candidate not yet added, or -1.
  long most_violated(const std::vector<double>& x, double tol) const {
    const std::vector<double> ex = excess(x);
    long best = -1;
    double worst = tol;
    for (std::size_t k = 0; k < ex.size(); ++k)
      if (ex[k] > worst) worst = ex[k], best = static_cast<long>(k);
    return best;
  }

  std::vector<double> lp_values() const {
    const int n = glp_get_num_cols(lp.get());
    std::vector<double> x(static_cast<std::size_t>(n) + 1, 0.0);
    for (int j = 1; j <= n; ++j) x[static_cast<std::size_t>(j)] = glp_get_col_prim(lp.get(), j);
    return x;
  }
  std::vector<double> mip_values() const {
    const int n = glp_get_num_cols(lp.get());
    std::vector<double> x(static_cast<std::size_t>(n) + 1, 0.0);
    for (int j = 1; j <= n; ++j) x[static_cast<std::size_t>(j)] = glp_mip_col_val(lp.get(), j);
    return x;
  }

  /// A primal heuristic: round `x` (argmax per node), repair memory by the cheapest switch per
  /// byte saved at the most violated time point, then improve node by node while it fits.
  /// Fills `out` (1-based column values) and returns true when it found a feasible choice.
  bool heuristic(const std::vector<double>& x, std::vector<double>& out) const {
    std::vector<std::size_t> pick(red.nodes.size(), 0);
    for (std::size_t v : ilp_nodes) {
      const work_node& n = red.nodes[v];
      for (std::size_t i = 1; i < n.size(); ++i)
        if (x[static_cast<std::size_t>(first_col[v]) + i] > x[static_cast<std::size_t>(first_col[v]) + pick[v]]) pick[v] = i;
    }
    auto local = [&](std::size_t v, std::size_t i) {
      double c = red.nodes[v].cost[i];
      for (const incidence& in : inc[v]) {
        const work_edge& e = red.edges[in.edge];
        const std::size_t nv = red.nodes[e.v].size();
        c += in.is_u ? e.m[i * nv + pick[e.v]] : e.m[pick[e.u] * nv + i];
      }
      return c;
    };
    std::vector<double> load;
    auto range = [&](const live_interval& iv) {
      const auto a = std::lower_bound(times.begin(), times.end(), iv.begin) - times.begin();
      const auto b = std::lower_bound(times.begin(), times.end(), iv.end) - times.begin();
      return std::pair<std::size_t, std::size_t>(static_cast<std::size_t>(a), static_cast<std::size_t>(std::max(a, b)));
    };
    if (p.usage_limit) {
      std::vector<double> xs(x.size(), 0.0);
      for (std::size_t v : ilp_nodes) xs[static_cast<std::size_t>(first_col[v]) + pick[v]] = 1.0;
      load = excess(xs);
    }
    auto fits = [&](std::size_t v, std::size_t j) {  // switching v to j keeps every time point within the limit
      if (!p.usage_limit) return true;
      const double du = static_cast<double>(red.nodes[v].usage[j] - red.nodes[v].usage[pick[v]]);
      if (du <= 0) return true;
      const auto [a, b] = range(red.nodes[v].live);
      for (std::size_t k = a; k < b; ++k)
        if (load[k] + du > 0.0) return false;
      return true;
    };
    auto move = [&](std::size_t v, std::size_t j) {
      if (p.usage_limit) {
        const double du = static_cast<double>(red.nodes[v].usage[j] - red.nodes[v].usage[pick[v]]);
        const auto [a, b] = range(red.nodes[v].live);
        for (std::size_t k = a; k < b; ++k) load[k] += du;
      }
      pick[v] = j;
    };
    // Repair.
    for (std::size_t guard = 0; p.usage_limit && guard < 100000; ++guard) {
      std::size_t worst = load.size();
      for (std::size_t k = 0; k < load.size(); ++k)
        if (load[k] > 0.0 && (worst == load.size() || load[k] > load[worst])) worst = k;
      if (worst == load.size()) break;
      double best_score = infinite_cost;
      std::size_t bv = 0, bj = 0;
      for (std::size_t v : ilp_nodes) {
        const work_node& n = red.nodes[v];
        if (!n.live.contains(times[worst])) continue;
        const double here = local(v, pick[v]);
        for (std::size_t j = 0; j < n.size(); ++j) {
          if (n.usage[j] >= n.usage[pick[v]]) continue;
          const double score = (local(v, j) - here) / static_cast<double>(n.usage[pick[v]] - n.usage[j]);
          if (score < best_score) best_score = score, bv = v, bj = j;
        }
      }
      if (best_score == infinite_cost) return false;
      move(bv, bj);
    }
    // Improve.
    for (int sweep = 0; sweep < 4; ++sweep) {
      bool changed = false;
      for (std::size_t v : ilp_nodes) {
        double cur = local(v, pick[v]);
        for (std::size_t j = 0; j < red.nodes[v].size(); ++j) {
          const double c = local(v, j);
          if (c < cur - 1e-12 * (1.0 + std::abs(cur)) && fits(v, j)) {
            move(v, j);
            cur = c;
            changed = true;
          }
        }
      }
      if (!changed) break;
    }
    out.assign(x.size(), 0.0);
    for (std::size_t v : ilp_nodes) {
      if (!std::isfinite(red.nodes[v].cost[pick[v]])) return false;
      out[static_cast<std::size_t>(first_col[v]) + pick[v]] = 1.0;
    }
    for (std::size_t e = 0; e < red.edges.size(); ++e) {
      if (!red.edges[e].alive) continue;
      const std::size_t nv = red.nodes[red.edges[e].v].size();
      const int col = pair_col[e][pick[red.edges[e].u] * nv + pick[red.edges[e].v]];
      if (col == 0) return false;  // a forbidden pair
      out[static_cast<std::size_t>(col)] = 1.0;
    }
    return true;
  }

  /// The full choice (original strategy indices) from MIP column values.
  std::vector<int> choice_from(const std::vector<double>& x) const {
    std::vector<int> choice(p.nodes.size(), -1);
    for (std::size_t v : ilp_nodes) {
      const work_node& n = red.nodes[v];
      std::size_t best = 0;
      for (std::size_t i = 1; i < n.size(); ++i)
        if (x[static_cast<std::size_t>(first_col[v]) + i] > x[static_cast<std::size_t>(first_col[v]) + best]) best = i;
      choice[v] = n.strat[best];
    }
    red.unfold(choice);
    return choice;
  }
};

/// State the GLPK callback reads and writes.
struct callback_state {
  const solve_options* opt = nullptr;
  const ilp_model* model = nullptr;
  bool heuristic_done = false;
  clock::time_point t0;
  double scale = 1.0;
  int round = 0;
  double bound = -infinite_cost;  // best bound seen in this round (scaled back)
  double last_report = -1e300;
  std::exception_ptr error;
};

inline void glpk_callback(glp_tree* tree, void* info) {
  auto* st = static_cast<callback_state*>(info);
  const int reason = glp_ios_reason(tree);
  if (reason == GLP_IHEUR && !st->heuristic_done && st->model && st->model->form == ilp_formulation::marginal) {
    st->heuristic_done = true;  // once per round, at the root
    try {
      std::vector<double> out;
      if (st->model->heuristic(st->model->lp_values(), out)) glp_ios_heur_sol(tree, out.data());
    } catch (...) {
      st->error = std::current_exception();
      glp_ios_terminate(tree);
    }
    return;
  }
  if (reason != GLP_IBINGO && reason != GLP_ISELECT) return;
  const int best = glp_ios_best_node(tree);
  if (best != 0) st->bound = std::max(st->bound, glp_ios_node_bound(tree, best) / st->scale);
  if (!st->opt->on_progress || st->error) return;
  const double now = seconds_since(st->t0);
  if (reason == GLP_ISELECT && now - st->last_report < st->opt->progress_interval) return;
  st->last_report = now;
  solve_progress pr;
  glp_prob* P = glp_ios_get_prob(tree);
  if (glp_mip_status(P) == GLP_FEAS || glp_mip_status(P) == GLP_OPT) {
    pr.incumbent = glp_mip_obj_val(P) / st->scale;
    pr.gap = glp_ios_mip_gap(tree);
  }
  pr.bound = st->bound;
  pr.seconds = now;
  pr.round = st->round;
  try {
    st->opt->on_progress(pr);
  } catch (...) {  // never unwind through GLPK's C frames
    st->error = std::current_exception();
    glp_ios_terminate(tree);
  }
}

inline int ms_left(double limit, clock::time_point t0) {
  const double left = limit - seconds_since(t0);
  if (left <= 0.0) return 0;
  return static_cast<int>(std::min(left * 1000.0, static_cast<double>(INT_MAX)));
}

inline std::string fmt_num(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

}  // namespace detail

/// Pick one strategy per node at minimum total cost within the usage limit.
/// Throws solver_error on: bad options (time_limit <= 0, mip_rel_gap < 0), a malformed problem,
/// a usage limit below the smallest reachable peak (the message states that peak), an
/// infeasible ILP, and a time-out without an incumbent that fits the limit.
inline solve_result solve_ilp(const strategy_problem& p, const solve_options& opt = {}) {
  using namespace detail;
  const clock::time_point t0 = clock::now();
  if (!(opt.time_limit > 0.0))
    throw solver_error("time_limit must be > 0 seconds, got " + fmt_num(opt.time_limit));
  if (!(opt.mip_rel_gap >= 0.0))
    throw solver_error("mip_rel_gap must be a fraction >= 0 (0.01 = 1%), got " + fmt_num(opt.mip_rel_gap));
  p.validate();
  if (p.usage_limit) {
    const usage_peak lo = p.min_peak_usage();
    if (lo.bytes > *p.usage_limit)
      throw solver_error("usage_limit " + std::to_string(*p.usage_limit) +
                         " cannot be met: the smallest budget that could fit is " + std::to_string(lo.bytes) +
                         " (every node at its smallest usage, peak at time " + std::to_string(lo.time) + ")");
  }

  solve_result res;
  res.sizes.push_back(input_size(p));
  reducer red(p, opt.reduce);
  if (opt.reduce) {
    red.run();
  } else {
    red.update_binding();
    if (!opt.lazy_memory && p.usage_limit) {  // every maximal live set, binding or not
      red.binding_times.clear();
      for (const strategy_node& n : p.nodes)
        if (!n.live.empty()) red.binding_times.push_back(n.live.begin);
      std::sort(red.binding_times.begin(), red.binding_times.end());
      red.binding_times.erase(std::unique(red.binding_times.begin(), red.binding_times.end()),
                              red.binding_times.end());
    }
  }

  glp_quiet quiet;
  ilp_model model(p, red, opt.formulation);
  {
    ilp_size s = red.sizes.empty() ? ilp_size{} : red.sizes.back();
    s.stage = "ilp";
    s.nodes = model.ilp_nodes.size();
    s.variables = static_cast<std::size_t>(glp_get_num_cols(model.lp.get()));
    s.rows = static_cast<std::size_t>(glp_get_num_rows(model.lp.get()));
    s.edges = 0;
    for (const work_edge& e : red.edges) s.edges += e.alive ? 1 : 0;
    s.memory_rows = model.times.size();
    for (const ilp_size& r : red.sizes) res.sizes.push_back(r);
    res.sizes.push_back(s);
  }
  if (!opt.lazy_memory)
    for (std::size_t k = 0; k < model.times.size(); ++k) model.add_memory_row(k);

  const double limit_tol = p.usage_limit ? 1e-9 * static_cast<double>(*p.usage_limit) + 1e-6 : 0.0;
  auto finish = [&](std::vector<int> choice, solve_status status, double bound) {
    res.choice = std::move(choice);
    res.objective = p.cost_of(res.choice);
    res.peak = p.peak_usage(res.choice);
    res.status = status;
    res.bound = status == solve_status::optimal ? res.objective : std::min(bound, res.objective);
    res.gap = res.objective == res.bound ? 0.0
                                         : (res.objective - res.bound) / std::max(std::abs(res.objective), 1e-300);
    res.memory_rows = model.memory_rows;
    res.seconds = seconds_since(t0);
    return res;
  };

  // Nothing left to choose: the reductions solved it.
  if (model.ilp_nodes.empty()) {
    std::vector<int> choice(p.nodes.size(), -1);
    red.unfold(choice);
    if (p.usage_limit && p.peak_usage(choice).bytes > *p.usage_limit)
      throw solver_error("internal: the reduced solution exceeds usage_limit " + std::to_string(*p.usage_limit));
    res.rounds = 0;
    return finish(std::move(choice), solve_status::optimal, 0.0);
  }

  glp_prob* P = model.lp.get();
  callback_state cb;
  cb.opt = &opt;
  cb.model = &model;
  cb.t0 = t0;
  cb.scale = model.scale;
  const auto timeout = [&](const std::string& where) {
    return solver_error("time_limit of " + fmt_num(opt.time_limit) + " s reached " + where +
                        " without an incumbent" + (p.usage_limit ? " that fits usage_limit " +
                                                                        std::to_string(*p.usage_limit)
                                                                  : std::string()));
  };
  const auto infeasible = [&]() {
    std::string msg = "no choice is feasible";
    if (p.usage_limit)
      msg += ": usage_limit " + std::to_string(*p.usage_limit) + " cannot be met together with the forbidden " +
             "(infinite-cost) pairs; the smallest budget ignoring them is " +
             std::to_string(p.min_peak_usage().bytes);
    return solver_error(msg);
  };

  for (int round = 0;; ++round) {
    cb.round = round;
    cb.heuristic_done = false;
    // LP phase: solve the relaxation, add the most violated memory row, until none is violated.
    for (;;) {
      glp_smcp sm;
      glp_init_smcp(&sm);
      sm.msg_lev = GLP_MSG_OFF;
      sm.meth = GLP_DUALP;
      sm.tm_lim = ms_left(opt.time_limit, t0);
      if (sm.tm_lim == 0) throw timeout("in the LP relaxation");
      int rc = glp_simplex(P, &sm);
      if (rc == GLP_EBADB || rc == GLP_ESING || rc == GLP_ECOND) {
        glp_adv_basis(P, 0);
        rc = glp_simplex(P, &sm);
      }
      if (rc == GLP_ETMLIM) throw timeout("in the LP relaxation");
      if (rc != 0) throw solver_error("GLPK simplex failed with code " + std::to_string(rc));
      const int st = glp_get_status(P);
      if (st == GLP_NOFEAS) throw infeasible();
      if (st != GLP_OPT) throw solver_error("GLPK simplex ended with status " + std::to_string(st));
      cb.bound = std::max(cb.bound, model.true_objective(glp_get_obj_val(P)));
      if (!p.usage_limit) break;
      const long k = model.most_violated(model.lp_values(), limit_tol);
      if (k < 0) break;
      model.add_memory_row(static_cast<std::size_t>(k));
    }
    // MIP phase.
    glp_iocp io;
    glp_init_iocp(&io);
    io.msg_lev = GLP_MSG_OFF;
    io.presolve = GLP_OFF;  // the LP relaxation is already optimal
    io.tm_lim = ms_left(opt.time_limit, t0);
    io.mip_gap = opt.mip_rel_gap;
    io.fp_heur = opt.feasibility_pump ? GLP_ON : GLP_OFF;
    if (opt.cuts) io.mir_cuts = io.gmi_cuts = io.cov_cuts = io.clq_cuts = GLP_ON;
    io.cb_func = &glpk_callback;
    io.cb_info = &cb;
    if (io.tm_lim == 0) throw timeout("before the branch and bound");
    cb.bound = -infinite_cost;
    cb.bound = std::max(cb.bound, model.true_objective(glp_get_obj_val(P)));
    const int rc = glp_intopt(P, &io);
    if (cb.error) std::rethrow_exception(cb.error);
    res.rounds = round + 1;
    const int ms = glp_mip_status(P);
    if (rc == GLP_ENOPFS || ms == GLP_NOFEAS) throw infeasible();
    const bool have = ms == GLP_OPT || ms == GLP_FEAS;
    if (rc == GLP_ETMLIM || rc == GLP_ESTOP) {
      if (!have) throw timeout("in the branch and bound");
    } else if (rc != 0 && rc != GLP_EMIPGAP) {
      throw solver_error("GLPK intopt failed with code " + std::to_string(rc));
    }
    if (!have) throw solver_error("GLPK intopt found no integer solution (status " + std::to_string(ms) + ")");
    const std::vector<double> x = model.mip_values();
    std::vector<int> choice = model.choice_from(x);
    const double glpk_obj = model.true_objective(glp_mip_obj_val(P));
    const double true_obj = p.cost_of(choice);
    if (std::abs(glpk_obj - true_obj) > 1e-6 * (1.0 + std::abs(true_obj)))
      throw solver_error("internal: GLPK's objective " + fmt_num(glpk_obj) + " differs from the re-priced " +
                         fmt_num(true_obj));
    if (p.usage_limit) {
      const long k = model.most_violated(x, limit_tol);
      if (k >= 0) {
        if (model.added[static_cast<std::size_t>(k)])
          throw solver_error("internal: memory row at time " + std::to_string(model.times[static_cast<std::size_t>(k)]) +
                             " is violated although added");
        if (rc == GLP_ETMLIM) throw timeout("in the branch and bound");
        model.add_memory_row(static_cast<std::size_t>(k));
        continue;
      }
      if (p.peak_usage(choice).bytes > *p.usage_limit)
        throw solver_error("internal: the solution exceeds usage_limit " + std::to_string(*p.usage_limit));
    }
    const bool proven = rc == 0 && ms == GLP_OPT;
    return finish(std::move(choice), proven ? solve_status::optimal : solve_status::feasible, cb.bound);
  }
}

}  // namespace autoshard

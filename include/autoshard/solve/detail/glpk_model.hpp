#pragma once
// The GLPK model of a reduced problem. One one-hot binary vector s_v per node; each edge u-v
// gets pair variables e[i][j] for its allowed pairs, tied to the node vectors by the marginal
// rows  sum_j e[i][j] = s_u[i]  and  sum_i e[i][j] = s_v[j]  (with integral s they force e to
// the product; a forbidden pair has no variable). The objective is the reduced one, without
// its constant offset, times `scale` so that GLPK works with magnitudes near 1000: after the
// reductions every node and edge has a zero entry and no negative one, so the LP never sees
// 1e18 or a large constant. Memory rows, one per candidate time point (the maximal live sets
// where the limit can bind), aggregate each node's live parts and are added when violated.
//
// Bounds that hold in spite of floating point (`safe_dual_bound`): GLPK's duals y are only
// some vector; for ANY y of the right signs, y.b + sum_j min(0, c_j - y.A_j) u_j (l = 0) is
// a lower bound of the LP, hence of every integer answer. It is evaluated on the exact integer
// data (costs, the memory rows' integer usages and limits; the other rows are 0/+-1) in long
// double with a rigorous bound on the rounding error subtracted (Neumaier and Shcherbina, "Safe
// bounds in linear and mixed-integer programming", Math. Program. 99, 2004).
#include <glpk.h>         // glp_prob
#include <sys/syscall.h>  // SYS_gettid
#include <unistd.h>       // syscall, getpid

#include <algorithm>  // std::max, std::min
#include <chrono>     // std::chrono::steady_clock
#include <climits>    // INT_MAX
#include <cmath>      // std::fabs
#include <cstddef>    // std::size_t
#include <cstdint>    // std::int64_t, std::uint64_t
#include <limits>     // std::numeric_limits
#include <memory>     // std::unique_ptr
#include <utility>    // std::pair
#include <vector>     // std::vector

#include "reduce.hpp"        // reducer
#include "reduced_view.hpp"  // reduced_view

namespace autoshard {

/// How pair variables are tied to node variables.
enum class ilp_formulation {
  marginal,   ///< e continuous, |S_u| + |S_v| rows per edge (the default)
  naive_and,  ///< e binary, e <= s_u, e <= s_v, e >= s_u + s_v - 1 per pair (MASE; for comparison)
};

namespace detail {

struct glp_deleter {
  void operator()(glp_prob* p) const noexcept { glp_delete_prob(p); }
};
using glp_ptr = std::unique_ptr<glp_prob, glp_deleter>;

/// GLPK keeps an environment per thread, made at the thread's first GLPK call and released
/// only by glp_free_env on that thread: every thread that solved and then exited leaked it
/// (5 KiB, LeakSanitizer). On any thread but the process's first, it is freed when the thread
/// exits (the first thread's lasts until the process ends, after which static destructors
/// that still hold GLPK objects may run).
inline void free_glpk_env_at_thread_exit() noexcept {
  struct env_guard {
    ~env_guard() { glp_free_env(); }
  };
  if (static_cast<long>(::syscall(SYS_gettid)) == static_cast<long>(::getpid())) return;
  thread_local env_guard guard;
  (void)&guard;
}

/// Silences GLPK's terminal output for a scope (and frees GLPK's environment of the thread
/// when it exits: free_glpk_env_at_thread_exit).
class glp_quiet {
  int old_;

 public:
  glp_quiet() : old_(glp_term_out(GLP_OFF)) { free_glpk_env_at_thread_exit(); }
  ~glp_quiet() { glp_term_out(old_); }
  glp_quiet(const glp_quiet&) = delete;
  glp_quiet& operator=(const glp_quiet&) = delete;
};

/// GLPK's tolerance on reduced costs (default 1e-7) for the LPs whose duals give safe bounds:
/// a reduced cost below 0 within the tolerance costs its size in the safe bound, so a tight one
/// keeps the safe bound within a fraction of a unit of GLPK's value.
inline constexpr double safe_tol_dj = 1e-11;

/// glp_simplex for an LP whose duals give a safe bound, within `tm_lim` ms: the dual simplex at
/// safe_tol_dj, from an advanced basis when GLPK finds the current one unusable. At so tight a
/// tolerance GLPK's dual simplex can stall on a degenerate LP (strategies priced alike, as a
/// parameter's ZeRO storage variants are: one node of the exact search ran 45,000 iterations in
/// 5.8 s without ending where its neighbours need a few dozen, and a 1 MiB GPT-2 plan that took
/// 0.6 s took the whole time limit). So it gets an iteration budget of 1000 + 5 (rows + columns),
/// and past it goes on from the basis reached at GLPK's default tolerance: the safe bound stays
/// a bound (a negative reduced cost is paid in full), looser at most by that tolerance. Returns
/// glp_simplex's code (GLP_ETMLIM when the time ran out). With `obj_ul` finite the dual simplex
/// stops once its objective passes it (GLP_EOBJUL): every basis it holds is dual feasible, so
/// its duals give a safe bound above about that much, and the rest of the LP is not needed.
inline int safe_simplex(glp_prob* P, int tm_lim, double obj_ul = std::numeric_limits<double>::infinity()) {
  using clock = std::chrono::steady_clock;
  const clock::time_point start = clock::now();
  glp_smcp sm;
  glp_init_smcp(&sm);
  const double default_tol_dj = sm.tol_dj;
  sm.msg_lev = GLP_MSG_OFF;
  sm.meth = GLP_DUALP;
  sm.tol_dj = safe_tol_dj;
  sm.tm_lim = tm_lim;
  if (std::isfinite(obj_ul)) sm.obj_ul = obj_ul;
  sm.it_lim = static_cast<int>(std::min<long long>(
      INT_MAX, 1000LL + 5LL * (static_cast<long long>(glp_get_num_rows(P)) + glp_get_num_cols(P))));
  int rc = glp_simplex(P, &sm);
  if (rc == GLP_EBADB || rc == GLP_ESING || rc == GLP_ECOND) {
    glp_adv_basis(P, 0);
    rc = glp_simplex(P, &sm);
  }
  if (rc == GLP_EITLIM) {
    const auto used = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start).count();
    if (used >= tm_lim) return GLP_ETMLIM;
    sm.tm_lim = tm_lim - static_cast<int>(used);
    sm.it_lim = INT_MAX;
    sm.tol_dj = default_tol_dj;
    rc = glp_simplex(P, &sm);
  }
  return rc;
}

/// Largest finite cost left in the reduced problem (0 when none).
inline double largest_cost(const reduced_view& rv) {
  double big = 0.0;
  for (std::size_t v : rv.ilp_nodes)
    for (wcost c : rv.node(v).cost)
      if (!is_forbidden_w(c)) big = std::max(big, static_cast<double>(c));
  for (const work_edge& e : rv.red.edges)
    if (e.alive)
      for (wcost c : e.m)
        if (!is_forbidden_w(c)) big = std::max(big, static_cast<double>(c));
  return big;
}

/// The size of the model glpk_model builds of a reduced problem, before any memory row:
/// counted from the reduced problem alone, so that it is known before GLPK takes any memory.
struct lp_size {
  std::uint64_t cols = 0, rows = 0, nonzeros = 0;
  std::uint64_t pair_entries = 0;  ///< pair_col's entries (forbidden pairs too)
};

inline lp_size lp_size_of(const reduced_view& rv, ilp_formulation form) {
  lp_size s;
  for (std::size_t v : rv.ilp_nodes) {
    const std::uint64_t n = rv.node(v).size();
    s.cols += n;
    s.rows += 1;
    s.nonzeros += n;  // the one-hot row
  }
  for (std::size_t e = 0; e < rv.red.edges.size(); ++e) {
    const work_edge& ed = rv.edge(e);
    if (!ed.alive) continue;
    const std::uint64_t nu = rv.node(ed.u).size(), nv = rv.node(ed.v).size();
    s.pair_entries += nu * nv;
    if (form == ilp_formulation::marginal) {
      const std::uint64_t allowed = ed.allowed;
      s.cols += allowed;
      s.rows += nu + nv;
      s.nonzeros += nu + nv + 2 * allowed;
    } else {
      s.cols += nu * nv;
      s.rows += 3 * nu * nv;
      s.nonzeros += 7 * nu * nv;
    }
  }
  return s;
}

/// The most memory a glpk_model of this size takes while its LP is solved: GLPK's own peak
/// (glp_mem_usage: the problem object, then the simplex's copies of the matrix and its
/// factorisation) and this side's (the triplets, col_cost, pair_col, safe_dual_bound's and
/// lp_values' vectors). GLPK's peak was measured on the IOPDDL requests (release build,
/// GLPK 5.0, marginal model, the LP relaxation with its memory rows): S, 2,634,467 columns,
/// 305,038 rows and 5,488,740 nonzeros, took 1,217 MB; K, 1,312,317 / 286,693 / 2,854,466,
/// 696 MB; V, 335,366 / 24,366 / 686,935, 145 MB; B, G and P 4-12 MB. 200 bytes a column, 95 a
/// nonzero, 665 a row and 16 MiB fixed cover each of them (S 1,251 MB, K 724 MB, V 165 MB).
inline std::uint64_t lp_bytes(const lp_size& s) {
  const std::uint64_t glpk = (16u << 20) + 200 * s.cols + 95 * s.nonzeros + 665 * s.rows;
  const std::uint64_t ours = 16 * s.nonzeros + 80 * s.cols + 4 * s.pair_entries + 40 * s.rows;
  return glpk + ours;
}

/// The sparse matrix GLPK loads at once (1-based triplets).
struct triplets {
  std::vector<int> ia{0}, ja{0};
  std::vector<double> ar{0.0};
  void reserve(std::uint64_t nonzeros) {
    ia.reserve(nonzeros + 1);
    ja.reserve(nonzeros + 1);
    ar.reserve(nonzeros + 1);
  }
  void put(int row, int col, double v) {
    ia.push_back(row);
    ja.push_back(col);
    ar.push_back(v);
  }
};

class glpk_model {
 public:
  const reduced_view& rv;
  ilp_formulation form;
  glp_ptr lp{glp_create_prob()};
  double scale = 1.0;                       // GLPK objective = scale * (reduced objective - offset)
  std::vector<int> first_col;               // per node id: first s column (1-based), 0 if folded
  std::vector<std::vector<int>> pair_col;   // per edge id: column per (i * |S_v| + j), 0 if none
  std::vector<char> added;                  // per candidate time: its memory row is in the model
  std::size_t memory_rows = 0;
  std::vector<wcost> col_cost{0};           // per column (1-based): exact reduced cost (0 if fixed)
  /// A memory row in exact integers: sum coef * s <= rhs; GLPK holds it divided by `norm`.
  struct exact_row {
    int row = 0;
    int128 rhs = 0;
    double norm = 1.0;
    std::vector<std::pair<int, int128>> coef;  // (column, usage above the node's lowest)
  };
  std::vector<exact_row> exact_rows;
  std::vector<std::size_t> exact_of_row{0};  // per GLPK row (1-based): index + 1 into exact_rows, or 0

  glpk_model(const reduced_view& view, ilp_formulation f) : glpk_model(view, f, lp_size_of(view, f)) {}
  /// `size` is lp_size_of(view, f), counted already (to check that the model fits).
  glpk_model(const reduced_view& view, ilp_formulation f, const lp_size& size)
      : rv(view), form(f), first_col(view.red.nodes.size(), 0), pair_col(view.red.edges.size()),
        added(view.times.size(), 0) {
    glp_set_obj_dir(lp.get(), GLP_MIN);
    const double big = largest_cost(rv);
    scale = big > 0.0 ? 1000.0 / big : 1.0;
    triplets t;
    t.reserve(size.nonzeros);
    col_cost.reserve(size.cols + 1);
    add_node_columns(t);
    for (std::size_t e = 0; e < rv.red.edges.size(); ++e)
      if (rv.edge(e).alive) {
        if (form == ilp_formulation::marginal)
          add_marginal_edge(e, t);
        else
          add_naive_edge(e, t);
      }
    glp_load_matrix(lp.get(), static_cast<int>(t.ia.size() - 1), t.ia.data(), t.ja.data(), t.ar.data());
    glp_scale_prob(lp.get(), GLP_SF_AUTO);
    exact_of_row.resize(static_cast<std::size_t>(glp_get_num_rows(lp.get())) + 1, 0);
  }

  glpk_model(const glpk_model&) = delete;
  glpk_model& operator=(const glpk_model&) = delete;

  /// A lower bound of the current LP (with its current column bounds) in reduced-cost units,
  /// and a lower bound of every column's reduced cost, both exact in spite of floating point
  /// (see the top of this file). `bound` is -infinity when the numbers do not allow one.
  struct safe_lp {
    long double bound = -std::numeric_limits<long double>::infinity();
    std::vector<long double> reduced;  // per column (1-based)
  };
  safe_lp safe_dual_bound() const {
    using ld = long double;
    glp_prob* P = lp.get();
    const int m = glp_get_num_rows(P), n = glp_get_num_cols(P);
    const ld eps = std::numeric_limits<ld>::epsilon();
    std::vector<ld> y(static_cast<std::size_t>(m) + 1, 0.0L);
    ld by = 0.0L, by_abs = 0.0L;
    for (int r = 1; r <= m; ++r) {
      const std::size_t ex = exact_of_row[static_cast<std::size_t>(r)];
      const int type = glp_get_row_type(P, r);
      ld yr = static_cast<ld>(glp_get_row_dual(P, r)) / static_cast<ld>(scale);
      ld b = 0.0L;
      if (ex != 0) {  // memory row: per exact unit of usage, and <= needs y <= 0
        yr = std::min(0.0L, yr / static_cast<ld>(exact_rows[ex - 1].norm));
        b = static_cast<ld>(exact_rows[ex - 1].rhs);
      } else if (type == GLP_FX) {
        b = static_cast<ld>(glp_get_row_lb(P, r));
      } else if (type == GLP_UP) {
        yr = std::min(0.0L, yr);
        b = static_cast<ld>(glp_get_row_ub(P, r));
      } else if (type == GLP_LO) {
        yr = std::max(0.0L, yr);
        b = static_cast<ld>(glp_get_row_lb(P, r));
      } else {
        yr = 0.0L;
      }
      if (!std::isfinite(static_cast<double>(yr))) return {};
      y[static_cast<std::size_t>(r)] = yr;
      by += b * yr;
      by_abs += std::fabs(b * yr);
    }
    // Reduced costs d_j = c_j - sum_i a_ij y_i: the memory rows from their exact integers.
    safe_lp out;
    out.reduced.assign(static_cast<std::size_t>(n) + 1, 0.0L);
    std::vector<ld> mag(static_cast<std::size_t>(n) + 1, 0.0L);
    std::vector<int> terms(static_cast<std::size_t>(n) + 1, 1);
    for (const exact_row& er : exact_rows) {
      const ld yr = y[static_cast<std::size_t>(er.row)];
      if (yr == 0.0L) continue;
      for (const auto& [col, a] : er.coef) {
        const ld t = static_cast<ld>(a) * yr;
        out.reduced[static_cast<std::size_t>(col)] -= t;
        mag[static_cast<std::size_t>(col)] += std::fabs(t);
        ++terms[static_cast<std::size_t>(col)];
      }
    }
    std::vector<int> ind(static_cast<std::size_t>(m) + 1);
    std::vector<double> val(static_cast<std::size_t>(m) + 1);
    ld sum = by, err_mag = by_abs;
    long total_terms = m + 2;
    for (int j = 1; j <= n; ++j) {
      const auto jj = static_cast<std::size_t>(j);
      const int len = glp_get_mat_col(P, j, ind.data(), val.data());
      ld d = static_cast<ld>(col_cost[jj]) + out.reduced[jj];
      ld a = std::fabs(static_cast<ld>(col_cost[jj])) + mag[jj];
      for (int k = 1; k <= len; ++k) {
        const auto r = static_cast<std::size_t>(ind[static_cast<std::size_t>(k)]);
        if (exact_of_row[r] != 0) continue;
        const ld t = static_cast<ld>(val[static_cast<std::size_t>(k)]) * y[r];
        d -= t;
        a += std::fabs(t);
      }
      // Every step of d's sum loses at most eps/2 of the magnitudes summed so far.
      const ld lower = d - static_cast<ld>(terms[jj] + len + 4) * eps * a;
      out.reduced[jj] = lower;
      const ld lb = static_cast<ld>(glp_get_col_lb(P, j)), ub = static_cast<ld>(glp_get_col_ub(P, j));
      const ld part = lower >= 0.0L ? lower * lb : lower * ub;
      sum += part;
      err_mag += std::fabs(part);
      total_terms += 1;
    }
    const ld bound = sum - static_cast<ld>(total_terms + 4) * eps * err_mag;
    if (!std::isfinite(static_cast<double>(bound))) return {};
    out.bound = bound;
    return out;
  }

  double coef(wcost c) const { return scale * static_cast<double>(c); }

  /// Column values (1-based, GLPK's layout) of one assignment of the reduced problem.
  std::vector<double> columns_of(const std::vector<std::size_t>& pick) const {
    std::vector<double> x(static_cast<std::size_t>(glp_get_num_cols(lp.get())) + 1, 0.0);
    for (std::size_t v : rv.ilp_nodes) x[static_cast<std::size_t>(first_col[v]) + pick[v]] = 1.0;
    for (std::size_t e = 0; e < rv.red.edges.size(); ++e) {
      if (!rv.edge(e).alive) continue;
      const work_edge& ed = rv.edge(e);
      const int col = pair_col[e][pick[ed.u] * rv.node(ed.v).size() + pick[ed.v]];
      if (col != 0) x[static_cast<std::size_t>(col)] = 1.0;
    }
    return x;
  }

  /// The largest entry of each node's block of column values.
  std::vector<std::size_t> pick_of(const std::vector<double>& x) const {
    std::vector<std::size_t> pick(rv.red.nodes.size(), 0);
    for (std::size_t v : rv.ilp_nodes) {
      const auto c0 = static_cast<std::size_t>(first_col[v]);
      for (std::size_t i = 1; i < rv.node(v).size(); ++i)
        if (x[c0 + i] > x[c0 + pick[v]]) pick[v] = i;
    }
    return pick;
  }

  /// Usage minus the limit at every candidate time for column values `x` (LP or MIP).
  std::vector<double> excess(const std::vector<double>& x) const {
    std::vector<double> diff(rv.times.size() + 1, 0.0);
    for (std::size_t v : rv.ilp_nodes)
      for (const reduced_view::part_span& s : rv.spans[v]) {
        double u = 0.0;
        const std::vector<std::int64_t>& use = rv.node(v).parts[s.part].usage;
        for (std::size_t i = 0; i < use.size(); ++i) u += static_cast<double>(use[i]) * x[static_cast<std::size_t>(first_col[v]) + i];
        diff[s.a] += u;
        diff[s.b] -= u;
      }
    std::vector<double> out(rv.times.size());
    double cur = 0.0;
    for (std::size_t t = 0; t < out.size(); ++t) {
      cur += diff[t];
      out[t] = static_cast<double>(rv.base[t]) + cur - static_cast<double>(*rv.limit);
    }
    return out;
  }

  /// Index of the most violated candidate time not yet in the model, or -1.
  long most_violated(const std::vector<double>& x, double tol) const {
    if (!rv.limit) return -1;
    const std::vector<double> ex = excess(x);
    long best = -1;
    double worst = tol;
    for (std::size_t t = 0; t < ex.size(); ++t)
      if (!added[t] && ex[t] > worst) worst = ex[t], best = static_cast<long>(t);
    return best;
  }

  /// The row of candidate time t: sum over live nodes of (usage - lo) s <= limit - base - sum lo,
  /// each node's live parts summed, scaled by 1/limit.
  void add_memory_row(std::size_t t) {
    exact_row er;
    er.rhs = static_cast<int128>(*rv.limit) - rv.base[t];
    std::vector<int> idx{0};
    std::vector<double> val{0.0};
    for (std::size_t v : rv.ilp_nodes) {
      const std::size_t s = rv.node(v).size();
      std::vector<int128> use(s, 0);
      bool live = false;
      for (const reduced_view::part_span& sp : rv.spans[v])
        if (sp.a <= t && t < sp.b) {
          live = true;
          for (std::size_t i = 0; i < s; ++i) use[i] += rv.node(v).parts[sp.part].usage[i];
        }
      if (!live) continue;
      const int128 lo = *std::min_element(use.begin(), use.end());
      er.rhs -= lo;
      for (std::size_t i = 0; i < s; ++i)
        if (use[i] != lo) {
          idx.push_back(first_col[v] + static_cast<int>(i));
          val.push_back(static_cast<double>(use[i] - lo));
          er.coef.emplace_back(idx.back(), use[i] - lo);
        }
    }
    er.norm = std::max(1.0, static_cast<double>(*rv.limit));
    for (std::size_t k = 1; k < val.size(); ++k) val[k] /= er.norm;
    const int row = glp_add_rows(lp.get(), 1);
    glp_set_row_bnds(lp.get(), row, GLP_UP, 0.0, static_cast<double>(er.rhs) / er.norm);
    glp_set_mat_row(lp.get(), row, static_cast<int>(idx.size() - 1), idx.data(), val.data());
    er.row = row;
    exact_rows.push_back(std::move(er));
    exact_of_row.resize(static_cast<std::size_t>(row) + 1, 0);
    exact_of_row[static_cast<std::size_t>(row)] = exact_rows.size();
    added[t] = 1;
    ++memory_rows;
  }

  std::vector<double> lp_values() const { return values(glp_get_col_prim); }
  std::vector<double> mip_values() const { return values(glp_mip_col_val); }

 private:
  std::vector<double> values(double (*get)(glp_prob*, int)) const {
    const int n = glp_get_num_cols(lp.get());
    std::vector<double> x(static_cast<std::size_t>(n) + 1, 0.0);
    for (int j = 1; j <= n; ++j) x[static_cast<std::size_t>(j)] = get(lp.get(), j);
    return x;
  }

  /// One binary column per strategy and a one-hot row per node.
  void add_node_columns(triplets& t) {
    glp_prob* P = lp.get();
    for (std::size_t v : rv.ilp_nodes) {
      const work_node& n = rv.node(v);
      const int c0 = glp_add_cols(P, static_cast<int>(n.size()));
      first_col[v] = c0;
      const int row = glp_add_rows(P, 1);
      glp_set_row_bnds(P, row, GLP_FX, 1.0, 1.0);
      for (std::size_t i = 0; i < n.size(); ++i) {
        const int c = c0 + static_cast<int>(i);
        glp_set_col_kind(P, c, GLP_BV);
        if (is_forbidden_w(n.cost[i])) {
          glp_set_col_bnds(P, c, GLP_FX, 0.0, 0.0);
          col_cost.push_back(0);
        } else {
          glp_set_obj_coef(P, c, coef(n.cost[i]));
          col_cost.push_back(n.cost[i]);
        }
        t.put(row, c, 1.0);
      }
    }
  }

  /// Continuous pair columns for the allowed pairs and the |S_u| + |S_v| marginal rows.
  void add_marginal_edge(std::size_t eid, triplets& t) {
    glp_prob* P = lp.get();
    const work_edge& e = rv.edge(eid);
    const std::size_t nu = rv.node(e.u).size(), nv = rv.node(e.v).size();
    const int cu = first_col[e.u], cv = first_col[e.v];
    pair_col[eid].assign(nu * nv, 0);
    const int r0 = glp_add_rows(P, static_cast<int>(nu + nv));
    for (std::size_t k = 0; k < nu + nv; ++k) glp_set_row_bnds(P, r0 + static_cast<int>(k), GLP_FX, 0.0, 0.0);
    for (std::size_t i = 0; i < nu; ++i) t.put(r0 + static_cast<int>(i), cu + static_cast<int>(i), -1.0);
    for (std::size_t j = 0; j < nv; ++j) t.put(r0 + static_cast<int>(nu + j), cv + static_cast<int>(j), -1.0);
    for (std::size_t i = 0; i < nu; ++i)
      for (std::size_t j = 0; j < nv; ++j) {
        const wcost c = e.m[i * nv + j];
        if (is_forbidden_w(c)) continue;  // a forbidden pair: no variable, so never chosen
        const int col = glp_add_cols(P, 1);
        pair_col[eid][i * nv + j] = col;
        glp_set_col_bnds(P, col, GLP_DB, 0.0, 1.0);
        glp_set_obj_coef(P, col, coef(c));
        col_cost.push_back(c);
        t.put(r0 + static_cast<int>(i), col, 1.0);
        t.put(r0 + static_cast<int>(nu + j), col, 1.0);
      }
  }

  /// Binary pair columns with the three AND rows each (a forbidden pair's column is fixed at 0).
  void add_naive_edge(std::size_t eid, triplets& t) {
    glp_prob* P = lp.get();
    const work_edge& e = rv.edge(eid);
    const std::size_t nu = rv.node(e.u).size(), nv = rv.node(e.v).size();
    const int cu = first_col[e.u], cv = first_col[e.v];
    pair_col[eid].assign(nu * nv, 0);
    for (std::size_t i = 0; i < nu; ++i)
      for (std::size_t j = 0; j < nv; ++j) {
        const wcost c = e.m[i * nv + j];
        const int col = glp_add_cols(P, 1);
        pair_col[eid][i * nv + j] = col;
        glp_set_col_kind(P, col, GLP_BV);
        if (is_forbidden_w(c)) {
          glp_set_col_bnds(P, col, GLP_FX, 0.0, 0.0);  // then e >= s_u + s_v - 1 forbids the pair
          col_cost.push_back(0);
        } else {
          glp_set_obj_coef(P, col, coef(c));
          col_cost.push_back(c);
        }
        const int r0 = glp_add_rows(P, 3);
        glp_set_row_bnds(P, r0, GLP_UP, 0.0, 0.0);  // e - s_u[i] <= 0
        t.put(r0, col, 1.0);
        t.put(r0, cu + static_cast<int>(i), -1.0);
        glp_set_row_bnds(P, r0 + 1, GLP_UP, 0.0, 0.0);  // e - s_v[j] <= 0
        t.put(r0 + 1, col, 1.0);
        t.put(r0 + 1, cv + static_cast<int>(j), -1.0);
        glp_set_row_bnds(P, r0 + 2, GLP_LO, -1.0, 0.0);  // e - s_u[i] - s_v[j] >= -1
        t.put(r0 + 2, col, 1.0);
        t.put(r0 + 2, cu + static_cast<int>(i), -1.0);
        t.put(r0 + 2, cv + static_cast<int>(j), -1.0);
      }
  }
};

}  // namespace detail
}  // namespace autoshard

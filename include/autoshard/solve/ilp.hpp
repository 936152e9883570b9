#pragma once
/// The strategy solver: exact reductions (detail/reduce.hpp), a primal heuristic that gives a
/// feasible answer early (detail/heuristic.hpp), then the ILP on GLPK (detail/glpk_model.hpp)
/// to improve it and prove a bound; memory rows are added lazily (solve, find the most violated
/// candidate time point, add its row, re-solve). Beside it, on every other core, the Lagrangian
/// search (detail/lagrangian_search.hpp, detail/portfolio.hpp); the ILP's thread joins it when
/// the LP relaxation is too large to finish. Every answer is re-evaluated exactly on the
/// original problem (`strategy_problem::evaluate`), independently of the ILP; "optimal" is
/// claimed only when that exact objective equals the proven integer lower bound.
///   autoshard::solve_options o;
///   o.time_limit = 60;        // seconds, for everything
///   o.mip_rel_gap = 0.01;     // a FRACTION: 0.01 = stop within 1% of the bound (MASE used percent)
///   o.threads = 2;            // 0 (the default): every core
///   autoshard::solve_result r = autoshard::solve_ilp(problem, o);
///   // r.choice[v] = strategy of node v; r.objective (exact); r.status; r.bound; r.gap; r.sizes;
///   // r.stop and r.stopped: why it ended
#include <glpk.h>  // glp_intopt, glp_simplex

#include <algorithm>   // std::max, std::min
#include <chrono>      // std::chrono::steady_clock
#include <climits>     // INT_MAX
#include <cmath>       // std::abs, std::ceil
#include <cstddef>     // std::size_t
#include <cstdint>     // std::int64_t
#include <exception>   // std::exception_ptr
#include <functional>  // std::function
#include <limits>      // std::numeric_limits
#include <memory>      // std::unique_ptr
#include <optional>    // std::optional
#include <ostream>     // std::ostream
#include <sstream>     // std::ostringstream
#include <string>      // std::string
#include <system_error>  // std::system_error
#include <thread>      // std::thread
#include <utility>     // std::pair
#include <vector>      // std::vector

#include "../core/dtype.hpp"            // human_bytes
#include "../core/error.hpp"            // solver_error
#include "../core/machine.hpp"          // available_cores
#include "detail/exact_search.hpp"      // exact_search
#include "detail/glpk_model.hpp"        // glpk_model, ilp_formulation
#include "detail/heuristic.hpp"         // local_search
#include "detail/lagrangian_bound.hpp"  // lagrangian_bound
#include "detail/portfolio.hpp"         // search_pool, progress_hub
#include "detail/reduce.hpp"            // reducer, ilp_size
#include "problem.hpp"                  // strategy_problem

namespace autoshard {

/// Proven optimal, or feasible (time-out, mip_rel_gap reached, or optimality not provable
/// exactly in floating point) with a proven bound and gap.
enum class solve_status { optimal, feasible };

inline const char* to_string(solve_status s) { return s == solve_status::optimal ? "optimal" : "feasible"; }

/// Why a solve ended. Only `optimal` is a proof; the others leave a proven bound and a gap.
enum class stop_reason {
  optimal,      ///< the answer equals a proven lower bound
  gap_reached,  ///< within mip_rel_gap of the proven bound
  stalled,      ///< before the time limit: every search thread went many rounds without a cheaper
                ///< answer and nothing else was left to run (more time is unlikely to help)
  work_limit,   ///< every search thread did solve_options::work_limit rounds
  time_limit,   ///< time_limit reached
  cutoff,       ///< the proven bound reached solve_options::cutoff: no answer cheaper than it exists
};

inline const char* to_string(stop_reason r) {
  switch (r) {
    case stop_reason::optimal: return "optimal";
    case stop_reason::gap_reached: return "gap_reached";
    case stop_reason::stalled: return "stalled";
    case stop_reason::work_limit: return "work_limit";
    case stop_reason::time_limit: return "time_limit";
    case stop_reason::cutoff: return "cutoff";
  }
  return "?";
}

/// A snapshot of the search, passed to solve_options::on_progress (costs in problem units).
/// Called on every cheaper answer (from any thread, one call at a time) and about every
/// `progress_interval` seconds otherwise.
struct solve_progress {
  double incumbent = std::numeric_limits<double>::infinity();  ///< best exact objective so far, or infinity
  double bound = -std::numeric_limits<double>::infinity();     ///< best proven lower bound so far
  double gap = std::numeric_limits<double>::infinity();        ///< (incumbent - bound) / incumbent
  double seconds = 0.0;                                         ///< since solve_ilp started
  /// What is running: "heuristic", "LP relaxation", "branch and bound", "exact search", or
  /// "search k" (the Lagrangian search of thread k).
  std::string phase;
};

/// Seconds a solve may take when not told: solve_options, autosharding_options and the tool's
/// `--time-limit` of `plan` and `solve` all start from it (10 minutes).
inline constexpr double default_time_limit_s = 600.0;

struct solve_options {
  /// Wall-clock budget in seconds for the whole solve (all memory rounds). Must be > 0.
  double time_limit = default_time_limit_s;
  /// Relative MIP gap at which to stop, as a fraction: 0 = prove optimality, 0.01 = within 1%.
  /// (MASE's pass documented an int and passed percent; this is GLPK's mip_gap unit.)
  double mip_rel_gap = 0.0;
  /// Called on every better incumbent and about every `progress_interval` seconds of search.
  std::function<void(const solve_progress&)> on_progress;
  double progress_interval = 1.0;
  /// Exact reductions before GLPK (off only to measure the naive formulation).
  bool reduce = true;
  /// The most of time_limit the first reductions take: past it they stop, the problem less
  /// reduced but the same (the contest's largest requests take seconds to reduce).
  double reduce_share = 0.5;
  ilp_formulation formulation = ilp_formulation::marginal;
  /// Memory rows added when violated (true) or all up front (false).
  bool lazy_memory = true;
  /// The primal heuristic's share of time_limit (greedy, repair, local search) before GLPK.
  double heuristic_share = 0.05;
  /// With an answer in hand, the most of time_limit the LP relaxation takes before thread 0
  /// joins the Lagrangian search; it goes on from its basis, with no share, once the search on
  /// thread 0 stalls (stall_rounds) before the time limit.
  double relaxation_share = 0.25;
  /// GLPK's feasibility pump at the root (autoshard's own heuristics always run).
  bool feasibility_pump = false;
  /// GLPK's cut generators (mixed-integer rounding, Gomory, cover, clique).
  bool cuts = false;
  /// Threads: one runs the ILP, the others the Lagrangian search. 0: the cores available
  /// (available_cores(): the thread's CPU affinity). Thread k does the same work with any thread count, so
  /// more threads never give a worse answer at the same point of the search.
  int threads = 0;
  /// Seed of the search threads: the same seed and thread count give the same answers.
  unsigned seed = 0;
  /// Rounds each search thread may do (0: no limit). With it and a time limit that is not
  /// reached, a solve is the same work on any machine.
  std::size_t work_limit = 0;
  /// Rounds without a cheaper answer after which a search thread gives up (0: never).
  std::size_t stall_rounds = 200;
  /// Run the ILP (LP relaxation, branch and bound, exact search). Off: thread 0 runs the
  /// Lagrangian search too and the bound is the Lagrangian one alone.
  bool exact = true;
  /// Answers that cost this much or more (problem units) do not matter to the caller, as
  /// Gurobi's Cutoff and CPLEX's upper cutoff: the solve ends as soon as a proven bound reaches
  /// it (stop_reason::cutoff), with the best answer it found, which then costs it or more. A
  /// caller comparing several solves passes the best answer it already holds (the pass does).
  /// Empty: none; every answer matters.
  std::optional<std::int64_t> cutoff;
  /// Fault injection for tests of the paths a GLPK failure takes (GLPK's numerical failures come
  /// only on large LPs, unpredictably): glp_simplex in the LP relaxation, or glp_intopt, is taken
  /// to have returned this code (GLP_EFAIL is 5); 0: GLPK runs.
  struct glpk_faults {
    int relaxation = 0;
    int branch_and_bound = 0;
  } glpk_fault;
};

/// The number of threads a solve uses for `requested` (0: the cores available to this thread,
/// available_cores(), at least 1).
inline int solver_threads(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::min(available_cores(), 1u << 16));
}

struct solve_result {
  std::vector<int> choice;           ///< strategy index per node (of the input problem)
  std::int64_t objective = 0;        ///< exact total of `choice` on the input problem
  solve_status status = solve_status::optimal;
  std::int64_t bound = 0;            ///< proven integer lower bound on the optimum (<= objective)
  double gap = 0.0;                  ///< (objective - bound) / objective, a fraction
  double seconds = 0.0;              ///< wall-clock time of solve_ilp
  double first_feasible_seconds = 0.0;  ///< when the first feasible answer was known
  usage_peak peak;                   ///< peak summed usage of the choice
  std::vector<ilp_size> sizes;       ///< "input", then after each reduction, then "ilp"
  std::size_t memory_rows = 0;       ///< memory rows added to the final ILP
  int rounds = 0;                    ///< MIP solves (1 + times a memory row cut off a solution)
  std::size_t exact_nodes = 0;       ///< LPs the exact search solved to prove the bound
  stop_reason stop = stop_reason::optimal;  ///< why it ended
  std::string stopped;               ///< the same, in words, with what ran (never empty)
  int threads = 1;                   ///< threads used
  std::size_t search_rounds = 0;     ///< Lagrangian search rounds, all threads
  double cost_unit = 1.0;            ///< the problem's cost_unit
  /// The objective and the bound in the problem's own unit (seconds for the pass).
  double objective_value() const { return static_cast<double>(objective) * cost_unit; }
  double bound_value() const { return static_cast<double>(bound) * cost_unit; }
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

using clock = std::chrono::steady_clock;

inline double seconds_since(clock::time_point t0) {
  return std::chrono::duration<double>(clock::now() - t0).count();
}

inline std::string fmt_num(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

/// Milliseconds left until `deadline` (GLPK's tm_lim), 0 once it has passed.
inline int ms_left(clock::time_point deadline) {
  const double left = std::chrono::duration<double>(deadline - clock::now()).count();
  if (left <= 0.0) return 0;
  return static_cast<int>(std::min(left * 1000.0, static_cast<double>(INT_MAX)));
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

/// Options and problem checks before any work; a limit below the smallest reachable peak.
inline void check_inputs(const strategy_problem& p, const solve_options& opt) {
  if (!(opt.time_limit > 0.0))
    throw solver_error("time_limit must be > 0 seconds, got " + fmt_num(opt.time_limit));
  if (!(opt.mip_rel_gap >= 0.0))
    throw solver_error("mip_rel_gap must be a fraction >= 0 (0.01 = 1%), got " + fmt_num(opt.mip_rel_gap));
  if (!(opt.heuristic_share >= 0.0 && opt.heuristic_share <= 1.0))
    throw solver_error("heuristic_share must be in [0, 1], got " + fmt_num(opt.heuristic_share));
  if (!(opt.reduce_share >= 0.0 && opt.reduce_share <= 1.0))
    throw solver_error("reduce_share must be in [0, 1], got " + fmt_num(opt.reduce_share));
  if (!(opt.relaxation_share >= 0.0 && opt.relaxation_share <= 1.0))
    throw solver_error("relaxation_share must be in [0, 1], got " + fmt_num(opt.relaxation_share));
  if (opt.threads < 0 || opt.threads > 1024)
    throw solver_error("threads must be 0 (the cores available) to 1024, got " + std::to_string(opt.threads));
  p.validate();
  // A total that must reach the contest's infinity: said so, not blamed on the usage limit
  // ("no feasible answer was found (usage_limit 50)" for costs summing to 4.45e18).
  p.check_costs_can_be_finite();
  if (p.usage_limit) {
    const usage_peak lo = p.min_peak_usage();
    if (lo.bytes > *p.usage_limit)
      throw solver_error("usage_limit " + std::to_string(*p.usage_limit) +
                         " cannot be met: the smallest budget that could fit is " + std::to_string(lo.bytes) +
                         " (every node at its smallest usage, peak at time " + std::to_string(lo.time) + ")");
  }
}

/// What the solver's own memory grows with (solver_bytes).
struct solver_size {
  std::uint64_t strategies = 0, costs = 0;  ///< every node's strategies; every edge's costs
  std::uint64_t items = 0;                  ///< nodes and edges
};

inline solver_size solver_size_of(const strategy_problem& p) {
  solver_size s;
  for (const strategy_node& n : p.nodes) s.strategies += n.costs.size();
  for (const strategy_edge& e : p.edges) s.costs += e.costs.size();
  s.items = p.nodes.size() + p.edges.size();
  return s;
}

/// The most memory solve_ilp takes beside the problem, without the LP (which is not built when
/// it would not fit: exact_pipeline::beyond_memory): the reducer's copy of every cost (16-byte
/// integers), the search threads' snapshot of the reduced problem and its tables in double,
/// the views and each search thread's messages. Measured beside this estimate (release build,
/// the ILP off, the heap's peak above the problem read): S 206 MB on 2 threads (295 MB on 8),
/// K 159 MB, V 37 MB, P 181 MB (345 MB on 8), a 10x12 grid of 60-strategy nodes 33 MB; the
/// estimate is 1.1-2.3 times each.
inline std::uint64_t solver_bytes(const solver_size& s, int threads) {
  const std::uint64_t per_thread = 256 * s.items + 16 * s.strategies;
  return (std::uint64_t{16} << 20) + 40 * s.costs + 64 * s.strategies + 800 * s.items +
         static_cast<std::uint64_t>(std::max(threads, 1)) * per_thread;
}

/// The seconds solve_ilp keeps back from its time limit for freeing what it built before it
/// returns: the reducer, the search's snapshot and tables, each thread's state, tens of millions
/// of allocations at the contest's largest sizes. For S 22 times over (1.5 million nodes and
/// edges; release build, 2-core VM, glibc malloc) they took 1.0 s on an idle machine and 2.1 s
/// at a load of 7, 0.7-1.4 us an item: charged 2 us an item, at most a tenth of the time limit
/// (a small problem keeps back microseconds).
inline double wind_down_seconds(const solver_size& s, double time_limit) {
  return std::min(2e-6 * static_cast<double>(s.items), 0.1 * time_limit);
}

/// Refuses, before anything is copied, a solve whose memory (solver_bytes) is above what this
/// process can still allocate: the OOM killer or a std::bad_alloc in a search thread otherwise.
inline void check_solver_memory(const strategy_problem& p, const solver_size& size, int threads) {
  const machine_limits m = machine_limits::memory_here();
  const std::uint64_t need = solver_bytes(size, threads), have = m.memory();
  if (need <= have) return;
  const std::uint64_t one = solver_bytes(size, 1);
  throw resource_error(
      "solving " + (p.name.empty() ? std::string("the problem") : quoted_text(p.name)) + " (" +
      std::to_string(p.nodes.size()) + " nodes, " + std::to_string(p.edges.size()) + " edges with " +
      std::to_string(size.costs) + " costs) on " + std::to_string(threads) + " thread(s) would need about " +
      human_bytes(static_cast<double>(need)) + " beside the problem; this process can allocate " +
      human_bytes(static_cast<double>(have)) + " more (" + m.memory_source() + ")" +
      (threads > 1 && one <= have
           ? ": use 1 thread (--threads 1, solve_options::threads; about " + human_bytes(static_cast<double>(one)) + ")"
           : m.memory_limited() ? ": free memory or raise the limit" : ": free memory"));
}

/// Candidate time points for memory rows: the binding ones, or (unreduced, not lazy) every start.
inline std::vector<std::int64_t> candidate_times(const strategy_problem& p, const reducer& red,
                                                 const solve_options& opt) {
  if (!p.usage_limit) return {};
  if (opt.reduce || opt.lazy_memory) return red.binding_times;
  std::vector<std::int64_t> t;
  for (const strategy_node& n : p.nodes)
    if (!n.live.empty()) t.push_back(n.live.begin);
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  return t;
}

/// The best answer so far, each one evaluated exactly on the original problem.
struct incumbent {
  const strategy_problem& p;
  const reducer& red;
  clock::time_point t0;
  std::vector<int> choice;
  std::optional<evaluation> eval;
  double found_at = 0.0;
  progress_hub* hub = nullptr;
  std::string phase = "heuristic";
  std::optional<std::int64_t> cutoff;  ///< solve_options::cutoff

  /// The cost a proof has to reach: the best answer's, or the cutoff when that is lower; empty
  /// while there is neither.
  std::optional<std::int64_t> aim() const {
    if (eval && (!cutoff || eval->objective <= *cutoff)) return eval->objective;
    return cutoff;
  }
  /// Whether proven bound `b` ends the search: no answer is cheaper than the aim.
  bool reached(std::int64_t b) const {
    const std::optional<std::int64_t> a = aim();
    return a && b >= *a;
  }

  /// The original choice of reduced picks.
  std::vector<int> unreduce(const reduced_view& rv, const std::vector<std::size_t>& pick) const {
    std::vector<int> c(p.nodes.size(), -1);
    for (std::size_t v : rv.ilp_nodes) c[v] = red.nodes[v].strat[pick[v]];
    red.unfold(c);
    return c;
  }

  /// The best choice on the nodes of `rv` (a node whose strategy is gone keeps its first one).
  std::vector<std::size_t> project(const reduced_view& rv) const {
    std::vector<std::size_t> pick(p.nodes.size(), 0);
    for (std::size_t v : rv.ilp_nodes) {
      const std::vector<int>& strat = red.nodes[v].strat;
      const auto it = std::find(strat.begin(), strat.end(), choice[v]);
      pick[v] = it == strat.end() ? 0 : static_cast<std::size_t>(it - strat.begin());
    }
    return pick;
  }

  /// Keep `c` when it is feasible and cheaper; true when kept.
  bool offer(std::vector<int> c) {
    evaluation ev = p.evaluate(c);
    if (!ev.feasible || (eval && ev.objective >= eval->objective)) return false;
    if (!eval) found_at = seconds_since(t0);
    eval = std::move(ev);
    choice = std::move(c);
    if (hub) {
      hub->incumbent(eval->objective, phase);
      if (std::exception_ptr e = hub->error()) std::rethrow_exception(e);  // a callback threw
    }
    return true;
  }
  double value() const {
    return eval ? static_cast<double>(eval->objective) : std::numeric_limits<double>::infinity();
  }
};

/// Greedy, memory repair and local search within the heuristic's share of the time; offers the
/// result. Returns the proven Lagrangian bound (detail/lagrangian_bound.hpp, reduced units) of
/// the best prices the subgradient steps met, when it could be stated exactly.
inline std::optional<wcost> run_heuristic(const reduced_view& rv, incumbent& best, clock::time_point deadline) {
  local_search ls(rv);
  std::optional<std::vector<std::size_t>> best_pick;
  wcost best_total = forbidden;
  // Make `ls` feasible and locally optimal; keep it when it is the best so far.
  const auto polish = [&]() {
    if (!ls.repair(deadline)) return;
    ls.improve(deadline);
    const wcost t = ls.total();
    if (!is_forbidden_w(t) && t < best_total) best_total = t, best_pick = ls.pick;
  };
  ls.greedy();
  polish();
  // The first answer goes out at once: on a large problem the share below takes seconds.
  if (best_pick) best.offer(best.unreduce(rv, *best_pick));
  // Subgradient steps on the prices of the memory rows, a DP over one spanning forest at each.
  const spanning_forest forest(rv);
  std::vector<double> lambda(rv.times.size(), 0.0), best_lambda = lambda;
  double best_lagrangian = -std::numeric_limits<double>::infinity();
  double theta = 1.0;
  for (int iter = 0; iter < 300 && clock::now() < deadline; ++iter) {
    std::vector<std::vector<wcost>> pen;
    if (iter > 0) pen = ls.penalties(lambda);
    const wcost value = ls.tree_dp(forest, iter == 0 ? nullptr : &pen);
    // The forest ignores the other edges: ICM on the priced problem accounts for all of them.
    ls.priced = iter == 0 ? nullptr : &pen;
    if (ls.priced) ls.improve(deadline);
    ls.priced = nullptr;
    const std::vector<double> g = rv.limit ? ls.excess() : std::vector<double>();
    double norm = 0.0, priced = 0.0;
    for (std::size_t t = 0; t < g.size(); ++t) {
      norm += g[t] * g[t];
      priced += lambda[t] * static_cast<double>(*rv.limit);
    }
    polish();
    const double lagrangian = static_cast<double>(wadd(value, rv.red.offset)) - priced;
    if (lagrangian > best_lagrangian) best_lagrangian = lagrangian, best_lambda = lambda;
    const bool fits_unpriced = std::all_of(g.begin(), g.end(), [](double x) { return x <= 0.0; }) &&
                               std::all_of(lambda.begin(), lambda.end(), [](double l) { return l == 0.0; });
    if (norm == 0.0 || !rv.limit || fits_unpriced) break;
    const double ub = is_forbidden_w(best_total) ? 2.0 * std::abs(lagrangian) + 1.0 : static_cast<double>(best_total);
    const double step = theta * std::max(ub - lagrangian, 0.01 * ub) / norm;
    for (std::size_t t = 0; t < g.size(); ++t) lambda[t] = std::max(0.0, lambda[t] + step * g[t]);
    if (iter % 20 == 19) theta *= 0.5;
  }
  const std::optional<wcost> bound = lagrangian_bound(rv, forest, best_lambda);
  if (!best_pick) return bound;
  ls.pick = *best_pick;
  ls.recompute_load();
  ls.window_search(deadline, 12345u, 2 * rv.ilp_nodes.size());
  ls.perturb(deadline, 12345u, std::max<std::size_t>(2000, 20 * rv.ilp_nodes.size()));
  best.offer(best.unreduce(rv, ls.pick));
  return bound;
}

/// Picks made exact: memory repaired in integers, then improved locally.
inline std::optional<std::vector<std::size_t>> repair_pick(const reduced_view& rv, std::vector<std::size_t> pick,
                                                           clock::time_point deadline) {
  local_search ls(rv);
  ls.pick = std::move(pick);
  ls.recompute_load();
  if (!ls.repair(deadline)) return std::nullopt;
  ls.improve(deadline);
  if (is_forbidden_w(ls.total())) return std::nullopt;
  return ls.pick;
}

/// Now plus the heuristic's share of the time limit.
inline clock::time_point heuristic_deadline_from_now(const solve_options& opt) {
  return clock::now() + std::chrono::duration_cast<clock::duration>(
                            std::chrono::duration<double>(opt.time_limit * opt.heuristic_share));
}

/// A proven lower bound in problem units from a proven bound `b` of the reduced costs (a safe
/// dual bound, see glpk_model::safe_dual_bound): every answer is an integer, so ceil(b) holds;
/// every reduced cost is >= 0, so the offset alone does too. The offset is exact.
inline std::int64_t proven_bound(long double b, wcost offset) {
  wcost above = 0;
  if (b > 0.0L) above = b >= 1e30L ? forbidden : static_cast<wcost>(std::ceil(b));
  const wcost total = wadd(offset, above);
  return total >= infinite_cost ? infinite_cost : static_cast<std::int64_t>(total);
}

/// State the GLPK callback reads and writes.
struct callback_state {
  const solve_options* opt = nullptr;
  const reduced_view* rv = nullptr;
  const glpk_model* model = nullptr;
  incumbent* best = nullptr;
  std::optional<std::vector<std::size_t>> start;  // the heuristic's picks, offered at the root
  bool root_done = false;
  int round = 0;
  double bound = -std::numeric_limits<double>::infinity();  // best bound of this round (scaled)
  double last_report = -1e300;
  std::exception_ptr error;

  /// Whether GLPK's bound says no answer is cheaper than the cutoff, when the cutoff is what a
  /// proof has to reach (incumbent::aim; below it GLPK's own incumbent prunes its tree). Not a
  /// proof (GLPK works within floating-point tolerances): the exact search after the tree proves it.
  bool past_cutoff() const {
    const std::optional<std::int64_t> aim = best->aim();
    if (!best->cutoff || aim != best->cutoff) return false;
    return bound / model->scale + static_cast<double>(rv->red.offset) >= static_cast<double>(*aim);
  }
};

inline void offer_root_solutions(glp_tree* tree, callback_state& st) {
  st.root_done = true;  // once per round, at the root
  if (st.start) {
    std::vector<double> x = st.model->columns_of(*st.start);
    glp_ios_heur_sol(tree, x.data());
  }
  // LP rounding: the argmax of each node's LP block, repaired and improved.
  if (auto pick = repair_pick(*st.rv, st.model->pick_of(st.model->lp_values()), heuristic_deadline_from_now(*st.opt))) {
    st.best->offer(st.best->unreduce(*st.rv, *pick));
    std::vector<double> x = st.model->columns_of(*pick);
    glp_ios_heur_sol(tree, x.data());
  }
}

inline void glpk_callback(glp_tree* tree, void* info) {
  auto* st = static_cast<callback_state*>(info);
  if (st->error) return;
  try {
    const int reason = glp_ios_reason(tree);
    if (reason == GLP_IHEUR && !st->root_done && st->model->form == ilp_formulation::marginal) {
      offer_root_solutions(tree, *st);
      return;
    }
    if (reason != GLP_IBINGO && reason != GLP_ISELECT) return;
    const int node = glp_ios_best_node(tree);
    if (node != 0) st->bound = std::max(st->bound, glp_ios_node_bound(tree, node));
    if (st->past_cutoff()) glp_ios_terminate(tree);  // the tree cannot hold an answer that matters
    // GLPK's own bound and objective are not exact: the progress shows only exact objectives
    // (offered to the incumbent) and proven bounds.
    if (st->best->hub) {
      st->best->hub->tick("branch and bound");
      if (std::exception_ptr e = st->best->hub->error()) std::rethrow_exception(e);
    }
  } catch (...) {  // never unwind through GLPK's C frames
    st->error = std::current_exception();
    glp_ios_terminate(tree);
  }
}

/// How one phase of the search ended.
/// `failed`: GLPK gave up (a numerical failure, GLP_EFAIL on a large LP): the phase proves
/// nothing, and the Lagrangian search goes on with the time left.
enum class phase_end { done, time_out, infeasible, failed };

/// The LP relaxation with memory rows added until none is violated. `failure`: glp_simplex's
/// code when it ends `failed` (100 + the status when the simplex ended neither optimal nor
/// infeasible, as the exact search counts them).
inline phase_end solve_relaxation(glpk_model& model, clock::time_point until, double limit_tol, int& failure, int fault = 0) {
  glp_prob* P = model.lp.get();
  for (;;) {
    const int tm_lim = ms_left(until);
    if (tm_lim == 0) return phase_end::time_out;
    const int rc = fault != 0 ? fault : safe_simplex(P, tm_lim);  // its duals give the safe bound
    if (rc == GLP_ETMLIM) return phase_end::time_out;
    if (rc != 0) return failure = rc, phase_end::failed;
    const int st = glp_get_status(P);
    if (st == GLP_NOFEAS) return phase_end::infeasible;
    if (st != GLP_OPT) return failure = 100 + st, phase_end::failed;
    const long t = model.most_violated(model.lp_values(), limit_tol);
    if (t < 0) return phase_end::done;
    model.add_memory_row(static_cast<std::size_t>(t));
  }
}

/// What one branch and bound round found.
struct mip_round {
  phase_end end = phase_end::done;
  int failure = 0;              // glp_intopt's code when `end` is failed
  bool proven = false;          // GLPK finished the tree (optimal for this round's rows)
  double bound = -std::numeric_limits<double>::infinity();  // scaled
  std::optional<std::vector<std::size_t>> pick;             // GLPK's integer solution
};

inline mip_round run_branch_and_bound(glpk_model& model, callback_state& cb, const solve_options& opt,
                                      clock::time_point deadline) {
  glp_prob* P = model.lp.get();
  glp_iocp io;
  glp_init_iocp(&io);
  io.msg_lev = GLP_MSG_OFF;
  io.presolve = GLP_OFF;  // the LP relaxation is already optimal
  io.tm_lim = ms_left(deadline);
  io.mip_gap = opt.mip_rel_gap;
  io.fp_heur = opt.feasibility_pump ? GLP_ON : GLP_OFF;
  if (opt.cuts) io.mir_cuts = io.gmi_cuts = io.cov_cuts = io.clq_cuts = GLP_ON;
  io.cb_func = &glpk_callback;
  io.cb_info = &cb;
  mip_round out;
  if (io.tm_lim == 0) {
    out.end = phase_end::time_out;
    return out;
  }
  cb.bound = glp_get_obj_val(P);
  cb.root_done = false;
  const int rc = opt.glpk_fault.branch_and_bound != 0 ? opt.glpk_fault.branch_and_bound : glp_intopt(P, &io);
  if (cb.error) std::rethrow_exception(cb.error);
  const int ms = glp_mip_status(P);
  // A failure proves nothing, whatever status the problem object holds.
  const bool failed = rc != 0 && rc != GLP_ENOPFS && rc != GLP_ETMLIM && rc != GLP_ESTOP && rc != GLP_EMIPGAP;
  if (!failed && (rc == GLP_ENOPFS || ms == GLP_NOFEAS)) {
    out.end = phase_end::infeasible;
    return out;
  }
  if (failed) out.failure = rc;
  out.end = failed ? phase_end::failed : rc == GLP_ETMLIM ? phase_end::time_out : phase_end::done;
  out.proven = rc == 0 && ms == GLP_OPT;
  if (ms == GLP_OPT || ms == GLP_FEAS) out.pick = model.pick_of(model.mip_values());
  out.bound = out.proven && out.pick ? glp_mip_obj_val(P) : cb.bound;
  return out;
}

/// How thread 0's exact pipeline ended: its proven bound, and why it stopped (in words).
struct exact_end {
  std::int64_t bound = 0;
  stop_reason why = stop_reason::time_limit;
  std::string message;
  bool then_search = false;  ///< the Lagrangian search is to use the rest of the time on thread 0
  /// The LP relaxation ran out of its share of the time (relaxation_share); its pass stays open, and
  /// exact_pipeline::resume goes on from its basis (when the search on thread 0 stalls).
  bool resumable = false;
};

/// Why a solve that reached its cutoff ended, in words.
inline std::string cutoff_words(std::int64_t bound, std::int64_t cutoff) {
  return "the proven bound " + std::to_string(bound) + " reached the cutoff " + std::to_string(cutoff) +
         ": no answer cheaper than the cutoff exists";
}

/// The result from the best answer of all threads and the proven bound.
inline solve_result finish(solve_result res, const strategy_problem& p, double first_feasible_seconds,
                           const std::optional<evaluation>& eval, const std::vector<int>& choice, std::int64_t bound,
                           stop_reason why, const std::string& message, const solve_options& opt, clock::time_point t0) {
  res.choice = choice;
  res.objective = eval->objective;
  res.peak = eval->peak;
  res.bound = std::min(bound, res.objective);
  res.status = res.bound == res.objective ? solve_status::optimal : solve_status::feasible;
  res.gap = res.objective == res.bound ? 0.0
                                       : static_cast<double>(res.objective - res.bound) /
                                             std::max(static_cast<double>(res.objective), 1.0);
  if (res.status == solve_status::optimal) {
    res.stop = stop_reason::optimal;
    res.stopped = "proven optimal: the answer equals the proven bound";
  } else if (opt.cutoff && res.bound >= *opt.cutoff) {
    res.stop = stop_reason::cutoff;
    res.stopped = cutoff_words(res.bound, *opt.cutoff) + (message.empty() ? "" : " (" + message + ")");
  } else if (why == stop_reason::gap_reached || res.gap <= opt.mip_rel_gap) {
    res.stop = stop_reason::gap_reached;
    res.stopped = "mip_rel_gap " + fmt_num(opt.mip_rel_gap) + " reached" + (message.empty() ? "" : " (" + message + ")");
  } else {
    res.stop = why;
    res.stopped = message;
  }
  res.first_feasible_seconds = first_feasible_seconds;
  res.cost_unit = p.cost_unit;
  res.seconds = seconds_since(t0);
  return res;
}

/// The sizes after the reductions and of the model GLPK gets.
inline void record_sizes(solve_result& res, const reducer& red, const reduced_view& rv, const glpk_model& model) {
  for (const ilp_size& r : red.sizes) res.sizes.push_back(r);
  ilp_size s = red.sizes.empty() ? ilp_size{} : red.sizes.back();
  s.stage = "ilp";
  s.nodes = rv.ilp_nodes.size();
  s.variables = static_cast<std::size_t>(glp_get_num_cols(model.lp.get()));
  s.rows = static_cast<std::size_t>(glp_get_num_rows(model.lp.get()));
  s.edges = 0;
  for (const work_edge& e : red.edges) s.edges += e.alive ? 1 : 0;
  s.memory_rows = rv.times.size();
  res.sizes.push_back(s);
}

/// Columns that cannot be 1 in a cheaper answer: with the safe bound L of the LP and the safe
/// lower bound d_j >= 0 of a column's reduced cost, every answer that takes the column costs at
/// least L + d_j; when that rounds up to the answer's cost or more, forbid its strategy or pair in
/// the reducer. Returns how many.
inline std::size_t fix_by_reduced_costs(const glpk_model& model, reducer& red, const glpk_model::safe_lp& safe,
                                        wcost answer) {
  if (is_forbidden_w(answer) || !(safe.bound > -std::numeric_limits<long double>::infinity())) return 0;
  glp_prob* P = model.lp.get();
  const wcost gap = answer - red.offset;  // the answer in reduced units
  const long double eps = std::numeric_limits<long double>::epsilon();
  const auto fixable = [&](int col) {
    if (col == 0 || glp_get_col_ub(P, col) <= 0.0) return false;
    const long double d = safe.reduced[static_cast<std::size_t>(col)];
    if (!(d >= 0.0L)) return false;
    const long double sum = safe.bound + d, lo = sum - 4.0L * eps * (std::fabs(safe.bound) + d);
    return lo >= 1e30L || (lo > 0.0L && static_cast<wcost>(std::ceil(lo)) >= gap);
  };
  std::size_t fixed = 0;
  for (std::size_t v : model.rv.ilp_nodes)
    for (std::size_t i = 0; i < red.nodes[v].size(); ++i)
      if (fixable(model.first_col[v] + static_cast<int>(i)) && !is_forbidden_w(red.nodes[v].cost[i]))
        red.forbid_cost(v, i), ++fixed;
  for (std::size_t e = 0; e < red.edges.size(); ++e)
    for (std::size_t k = 0; k < model.pair_col[e].size(); ++k)
      if (fixable(model.pair_col[e][k]) && !is_forbidden_w(red.edges[e].m[k])) red.forbid_entry(e, k), ++fixed;
  return fixed;
}

/// The exact search (detail/exact_search.hpp) on `model`, seeded with the best answer, until
/// the time limit: it proves the answer optimal (within mip_rel_gap), or that none is cheaper
/// than the cutoff when the answer costs more (incumbent::aim), or a lower bound.
inline exact_search_result prove(glpk_model& model, const reduced_view& rv, incumbent& best, const solve_options& opt,
                                 clock::time_point deadline, double limit_tol) {
  const wcost offset = rv.red.offset;
  const auto reduced_aim = [&]() { return static_cast<wcost>(*best.aim()) - offset; };
  exact_search es(
      model,
      [&](const std::vector<std::size_t>& pick) {
        best.offer(best.unreduce(rv, pick));
        return reduced_aim();
      },
      reduced_aim(), static_cast<wcost>(opt.mip_rel_gap * static_cast<double>(best.eval->objective)), limit_tol);
  exact_search_result ex = es.run(deadline);
  if (ex.complete) ex.bound = std::min(ex.bound, static_cast<long double>(reduced_aim()));
  return ex;
}

/// How one round of thread 0's ILP phase ended: with the phase's end, or (neither set) with
/// another round on the same model after a memory row was added, or with a new pass after the
/// reductions changed the problem.
struct round_end {
  std::optional<exact_end> end;
  bool new_pass = false;
};

/// Thread 0's ILP phase: LP relaxation with lazy memory rows, reduced-cost fixing (then reduce
/// and rebuild) while it removes much, then branch and bound seeded with the best answer, then
/// the exact search. Says how it ended; the search threads may still hold a cheaper answer.
/// Each pass builds the model of the reduced problem; each round of a pass solves it again with
/// the memory rows found so far.
class exact_pipeline {
 public:
  exact_pipeline(const strategy_problem& p, const solve_options& opt, reducer& red, incumbent& best, solve_result& res,
                 clock::time_point t0, clock::time_point deadline, std::int64_t known_bound)
      : p_(p),
        opt_(opt),
        red_(red),
        best_(best),
        res_(res),
        t0_(t0),
        deadline_(deadline),
        timed_out_("time_limit of " + fmt_num(opt.time_limit) + " s reached"),
        limit_tol_(p.usage_limit ? 1e-9 * static_cast<double>(*p.usage_limit) + 1e-6 : 0.0),
        bound_(std::max(known_bound, proven_bound(0.0L, red.offset))) {}

  exact_end run() {
    glp_quiet quiet;
    return passes_from(0);
  }

  /// Whether run() ended with the LP relaxation cut off at its share of the time, its pass
  /// (the model and its basis) kept for resume().
  bool resumable() const noexcept { return open_ != nullptr; }

  /// After run() ended resumable and the Lagrangian search on this thread stalled: the LP
  /// relaxation goes on from the basis it reached, with the rest of the time and no share,
  /// then branch and bound and the exact search as usual. Offer the search's answers to the
  /// incumbent first: GLPK starts from the best one, and reduced-cost fixing prunes with it.
  exact_end resume() {
    glp_quiet quiet;
    capped_ = false;
    res_.sizes.resize(sizes_kept_);  // recorded again when this ends
    open_pass& o = *open_;
    if (best_.eval)
      if (std::optional<std::vector<std::size_t>> s = repair_pick(*o.rv, best_.project(*o.rv), heuristic_deadline_from_now(opt_)))
        o.cb.start = std::move(s);
    const int next = o.pass + 1;
    std::optional<exact_end> end = rounds();
    if (!end) end = passes_from(next);
    end->message += std::string(end->message.empty() ? "" : " ") +
                    "(the LP relaxation went on from its basis once the Lagrangian search on thread 0 stalled)";
    return *end;
  }

 private:
  const strategy_problem& p_;
  const solve_options& opt_;
  reducer& red_;
  incumbent& best_;
  solve_result& res_;
  clock::time_point t0_;
  clock::time_point deadline_;  // the solve's: its time limit less the wind-down (wind_down_seconds)
  std::string timed_out_;
  double limit_tol_;
  std::vector<std::int64_t> rows_at_;  // time points whose memory rows proved needed
  std::int64_t bound_;
  bool capped_ = true;                 // the LP relaxation gets relaxation_share of the time (until resume())
  std::size_t sizes_kept_ = 0;         // res_.sizes before the record made when that share ran out

  /// The pass being solved: its view of the reduced problem, its model and GLPK's callback state
  /// (which points into both, so they stay put), and the round it is in.
  struct open_pass {
    open_pass(int p, std::unique_ptr<const reduced_view> view, ilp_formulation f, const lp_size& size)
        : pass(p), rv(std::move(view)), model(*rv, f, size) {}
    int pass;
    int round = 0;
    std::unique_ptr<const reduced_view> rv;
    glpk_model model;
    callback_state cb;
  };
  std::unique_ptr<open_pass> open_;  // kept past run() only when it ended resumable

  exact_end passes_from(int pass) {
    for (;; ++pass)
      if (std::optional<exact_end> end = one_pass(pass)) return *end;
  }

  solver_error proven_infeasible() const {
    std::string msg = "no choice is feasible (proven by the ILP)";
    if (p_.usage_limit)
      msg += ": usage_limit " + std::to_string(*p_.usage_limit) + " cannot be met together with the forbidden " +
             "(infinite-cost) pairs; the smallest budget ignoring them is " +
             std::to_string(p_.min_peak_usage().bytes);
    return solver_error(msg);
  }

  void note_bound() {
    if (best_.hub) best_.hub->bound(bound_);
  }

  /// The end once the proven bound reached the aim (incumbent::reached), found by `how`: the
  /// answer proven optimal, or no answer cheaper than the cutoff.
  exact_end aim_met(const std::string& how) const {
    if (best_.eval && bound_ >= best_.eval->objective) return {bound_, stop_reason::optimal, "the answer meets " + how, false};
    return {bound_, stop_reason::cutoff, how + " reached the cutoff", false};
  }

  /// One pass: the model of the problem as the reducer holds it now, solved round by round.
  /// Empty when the reductions changed the problem (the next pass rebuilds the model).
  std::optional<exact_end> one_pass(int pass) {
    auto view = std::make_unique<const reduced_view>(red_, candidate_times(p_, red_, opt_));
    const reduced_view& rv = *view;
    bound_ = std::max(bound_, proven_bound(0.0L, red_.offset));
    if (rv.ilp_nodes.empty()) return decided_by_reductions();
    const lp_size size = lp_size_of(rv, opt_.formulation);
    if (std::optional<exact_end> end = beyond_memory(size)) return end;
    open_ = std::make_unique<open_pass>(pass, std::move(view), opt_.formulation, size);
    glpk_model& model = open_->model;
    for (std::size_t t = 0; t < rv.times.size(); ++t)
      if (!opt_.lazy_memory || std::binary_search(rows_at_.begin(), rows_at_.end(), rv.times[t]))
        model.add_memory_row(t);
    // GLPK's first incumbent: the best answer so far, on the nodes left.
    std::optional<std::vector<std::size_t>> start;
    if (best_.eval) start = repair_pick(rv, best_.project(rv), heuristic_deadline_from_now(opt_));
    if (start) best_.offer(best_.unreduce(rv, *start));

    callback_state& cb = open_->cb;
    cb.opt = &opt_;
    cb.rv = &rv;
    cb.model = &model;
    cb.best = &best_;
    cb.start = start;
    return rounds();
  }

  /// The open pass's rounds, from the one it is in: its end (the pass kept open only when the
  /// end is resumable), or empty for a new pass.
  std::optional<exact_end> rounds() {
    open_pass& o = *open_;
    for (;; ++o.round) {
      o.cb.round = o.round;
      round_end r = one_round(o.pass, o.round, *o.rv, o.model, o.cb);
      if (r.end) {
        if (!r.end->resumable) open_.reset();
        return std::move(r.end);
      }
      if (r.new_pass) {
        open_.reset();
        return std::nullopt;
      }
    }
  }

  /// The end, before GLPK takes any memory, when the LP of this size would not fit what the
  /// process can still allocate (GLPK aborts the process when an allocation fails): the
  /// Lagrangian search, which needs no more memory than it holds, takes thread 0 instead. A
  /// tenth of what is left stays for the search threads and the answer.
  std::optional<exact_end> beyond_memory(const lp_size& size) {
    const std::uint64_t need = lp_bytes(size);
    const machine_limits m = machine_limits::memory_here();
    const std::uint64_t have = m.memory();
    if (have == machine_limits::unlimited || need <= have - have / 10) return std::nullopt;
    for (const ilp_size& r : red_.sizes) res_.sizes.push_back(r);
    return exact_end{bound_, stop_reason::time_limit,
                     "the LP of " + std::to_string(size.cols) + " columns, " + std::to_string(size.rows) + " rows and " +
                         std::to_string(size.nonzeros) + " nonzeros would take about " +
                         human_bytes(static_cast<double>(need)) + ", and this process can allocate " +
                         human_bytes(static_cast<double>(have)) + " more (" + m.memory_source() +
                         "): it was not built, and the Lagrangian search used thread 0 too",
                     true};
  }

  /// The reductions decided every node: their answer is the best one.
  exact_end decided_by_reductions() {
    std::vector<int> choice(p_.nodes.size(), -1);
    red_.unfold(choice);
    best_.offer(std::move(choice));
    for (const ilp_size& r : red_.sizes) res_.sizes.push_back(r);
    if (!best_.eval) throw proven_infeasible();
    return {bound_, stop_reason::optimal, "the reductions decided every node", false};
  }

  /// One round: the LP relaxation and its bound, reduced-cost fixing on a pass's first round,
  /// then the branch and bound and what follows it.
  round_end one_round(int pass, int round, const reduced_view& rv, glpk_model& model, callback_state& cb) {
    if (std::optional<exact_end> end = relaxation(rv, model)) return {std::move(end)};
    const glpk_model::safe_lp safe = model.safe_dual_bound();
    bound_ = std::max(bound_, proven_bound(safe.bound, red_.offset));
    note_bound();
    if (best_.reached(bound_)) {  // the answer (or the cutoff) meets the LP bound
      record_sizes(res_, red_, rv, model);
      return {aim_met("the LP relaxation's bound")};
    }
    // Reduced-cost fixing, then reduce and rebuild, while it removes a good share of columns.
    if (round == 0 && pass < 8 && best_.eval && opt_.reduce) {
      const std::size_t fixed = fix_by_reduced_costs(model, red_, safe, best_.eval->objective);
      if (fixed * 20 > static_cast<std::size_t>(glp_get_num_cols(model.lp.get()))) return reduce_again(rv, model);
    }
    best_.phase = "branch and bound";
    const mip_round mr = run_branch_and_bound(model, cb, opt_, deadline_);
    return after_branch_and_bound(mr, rv, model);
  }

  /// The LP relaxation with the memory rows it needs (remembered for the next passes). An end
  /// when it proves the problem infeasible (thrown) or runs out of time.
  std::optional<exact_end> relaxation(const reduced_view& rv, glpk_model& model) {
    best_.phase = "LP relaxation";
    if (best_.hub) best_.hub->tick(best_.phase);
    // With an answer in hand the LP relaxation gets at most relaxation_share (a quarter) of the
    // time: one that cannot finish by then leaves too little for a search and a proof over it,
    // and the rest goes to the Lagrangian search, which then needs every second it can get, until
    // it stalls (resume()).
    const bool quarter = capped_ && best_.eval.has_value();
    const clock::time_point lp_until =
        quarter ? std::min(deadline_, t0_ + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(
                                                opt_.relaxation_share * opt_.time_limit)))
                : deadline_;
    int failure = 0;
    const phase_end lp = solve_relaxation(model, lp_until, limit_tol_, failure, opt_.glpk_fault.relaxation);
    for (std::size_t t = 0; t < rv.times.size(); ++t)
      if (model.added[t] && !std::binary_search(rows_at_.begin(), rows_at_.end(), rv.times[t]))
        rows_at_.insert(std::upper_bound(rows_at_.begin(), rows_at_.end(), rv.times[t]), rv.times[t]);
    if (lp == phase_end::infeasible && !best_.eval) throw proven_infeasible();
    if (lp == phase_end::done) return std::nullopt;
    sizes_kept_ = res_.sizes.size();
    record_sizes(res_, red_, rv, model);
    // With an answer known, the pass holds only what may be in a cheaper one: GLPK finding no LP
    // solution says there is none, in floating point, which proves nothing; the bound stays.
    if (lp == phase_end::infeasible)
      return exact_end{bound_, stop_reason::time_limit,
                       "GLPK finds the LP relaxation of what may be in a cheaper answer infeasible (in floating point, no "
                       "proof); the bound is the last proven one, and the Lagrangian search used the rest of the time",
                       true};
    if (lp == phase_end::failed)
      return exact_end{bound_, stop_reason::time_limit,
                       "GLPK's simplex failed (code " + std::to_string(failure) +
                           ") in the LP relaxation; the bound is the reductions', and the Lagrangian search used the rest of the time",
                       true};
    if (quarter)
      return exact_end{
          bound_, stop_reason::time_limit,
          "the LP relaxation did not finish in relaxation_share (" + fmt_num(opt_.relaxation_share) +
              ") of the time_limit; the Lagrangian search used the rest",
          true, true};
    return exact_end{bound_, stop_reason::time_limit, timed_out_ + " in the LP relaxation", false};
  }

  /// After reduced-cost fixing forbade many columns: reduce again for a new pass, or end when
  /// no strategy of some node is left in a cheaper answer (the best one is then optimal).
  round_end reduce_again(const reduced_view& rv, const glpk_model& model) {
    red_.record_size("reduced-cost fixing (LP bound " + std::to_string(bound_) + ")");
    try {
      if (red_.prune_infinite()) red_.update_binding();
      red_.run_rounds();
    } catch (const no_strategy_left&) {
      // Every strategy left of some node is in no answer cheaper than the best one: it is optimal.
      bound_ = best_.eval->objective;
      note_bound();
      record_sizes(res_, red_, rv, model);
      return {exact_end{bound_, stop_reason::optimal, "reduced-cost fixing left no cheaper answer", false}};
    }
    return {std::nullopt, true};
  }

  /// GLPK's answer offered (repaired in integers when only within its tolerance); a memory row
  /// it violates is added for another round; else the round's end.
  round_end after_branch_and_bound(const mip_round& mr, const reduced_view& rv, glpk_model& model) {
    res_.rounds += 1;
    res_.memory_rows = model.memory_rows;
    // With an answer known, the pass holds only what may be in a cheaper one (reduced-cost
    // fixing forbade the rest): GLPK finding no integer answer says there is none cheaper,
    // in floating point. The exact search (conclude) proves it, or leaves a proven bound.
    if (mr.end == phase_end::infeasible && !best_.eval) throw proven_infeasible();
    if (mr.pick && !best_.offer(best_.unreduce(rv, *mr.pick))) {
      // Within GLPK's tolerance but not exactly within the limit: repair it in integers.
      if (auto fixed = repair_pick(rv, *mr.pick, heuristic_deadline_from_now(opt_)))
        best_.offer(best_.unreduce(rv, *fixed));
    }
    if (mr.pick) {
      // A violated time point without a row: add it and solve again (the bound stays valid).
      const long t = model.most_violated(model.columns_of(*mr.pick), limit_tol_);
      if (t >= 0 && mr.end == phase_end::done && !best_.reached(bound_)) {
        model.add_memory_row(static_cast<std::size_t>(t));
        return {};
      }
    }
    record_sizes(res_, red_, rv, model);
    return {conclude(mr, rv, model)};
  }

  /// The end after a branch and bound without a violated row: GLPK's tree ends within its
  /// floating-point tolerances, so its bound is not a proof; the exact search proves the answer
  /// (or a bound) with safe LP bounds, in the time left.
  exact_end conclude(const mip_round& mr, const reduced_view& rv, glpk_model& model) {
    if (best_.reached(bound_)) return aim_met("the proven bound");
    if (!best_.eval && mr.end == phase_end::failed)
      return {bound_, stop_reason::time_limit,
              "GLPK's branch and bound failed (code " + std::to_string(mr.failure) +
                  ") without an answer; the Lagrangian search used the rest of the time",
              true};
    if (!best_.eval)
      return {bound_, stop_reason::time_limit,
              mr.end == phase_end::time_out ? timed_out_ + " in the branch and bound"
                                            : std::string("the branch and bound ended without an answer"),
              false};
    if (mr.end == phase_end::time_out)
      return {bound_, stop_reason::time_limit, timed_out_ + " in the branch and bound", false};
    best_.phase = "exact search";
    const exact_search_result ex = prove(model, rv, best_, opt_, deadline_, limit_tol_);
    res_.exact_nodes = ex.nodes;
    bound_ = std::max(bound_, proven_bound(ex.bound, red_.offset));
    note_bound();
    if (ex.complete)
      return best_.reached(bound_) ? aim_met("the exact search's bound")
                                   : exact_end{bound_, stop_reason::gap_reached, "the exact search closed every node within it", false};
    if (ex.failure != 0)
      return {bound_, stop_reason::time_limit,
              "GLPK's simplex failed (code " + std::to_string(ex.failure) + ") in the exact search after " +
                  std::to_string(ex.nodes) + " LPs; the bound is that of its open nodes, and the Lagrangian "
                  "search used the rest of the time",
              true};
    return {bound_, stop_reason::time_limit, timed_out_ + " in the exact search", false};
  }
};

/// The user's progress callback as the hub's sink (none when the options have none).
inline progress_hub::sink progress_sink(const solve_options& opt) {
  if (!opt.on_progress) return progress_hub::sink();
  return progress_hub::sink([&opt](double inc, double bnd, double sec, const std::string& phase) {
    solve_progress pr;
    pr.incumbent = inc;
    pr.bound = bnd;
    if (inc < std::numeric_limits<double>::infinity()) pr.gap = std::max(0.0, (inc - bnd) / std::max(std::abs(inc), 1.0));
    pr.seconds = sec;
    pr.phase = phase;
    opt.on_progress(pr);
  });
}

/// The Lagrangian search's first answer (offered to `best`) and the proven bound with its
/// Lagrangian bound, which holds for the problem as it is now: its offset is added here.
inline std::int64_t first_heuristic(const reduced_view& first, const reducer& red, incumbent& best,
                                    const solve_options& opt, clock::time_point deadline) {
  std::int64_t known_bound = proven_bound(0.0L, red.offset);
  if (const std::optional<wcost> lb = run_heuristic(first, best, std::min(heuristic_deadline_from_now(opt), deadline));
      lb && !is_forbidden_w(*lb)) {
    const wcost total = wadd(red.offset, *lb);
    known_bound = std::max(known_bound, total >= infinite_cost ? infinite_cost : static_cast<std::int64_t>(total));
  }
  return known_bound;
}

/// The search pool (its snapshot of the reduced problem, then its threads) built on a thread of
/// its own while thread 0 runs the heuristic: both only read the reducer, and copying the
/// contest's largest requests takes seconds. ready() waits for it, before the reducer changes,
/// and rethrows what building it threw (std::bad_alloc).
class pool_builder {
 public:
  pool_builder(const strategy_problem& p, const reducer& red, const std::vector<std::int64_t>& times, progress_hub& hub,
               search_pool::limits lim, std::size_t helpers) {
    const auto build = [this, &p, &red, &times, &hub, lim, helpers] {
      try {
        pool_.emplace(p, red, times, hub, lim);
        started_ = pool_->start(1, helpers);
      } catch (...) {
        error_ = std::current_exception();
      }
    };
    try {
      thread_ = std::thread(build);
    } catch (const std::system_error&) {  // no thread to spare: built here, before the heuristic
      build();
    }
  }
  pool_builder(const pool_builder&) = delete;
  pool_builder& operator=(const pool_builder&) = delete;
  ~pool_builder() {
    if (thread_.joinable()) thread_.join();
  }

  search_pool& ready() {
    if (thread_.joinable()) thread_.join();
    if (error_) std::rethrow_exception(error_);
    return *pool_;
  }
  /// The search threads that started (after ready()).
  std::size_t started() const noexcept { return started_; }

 private:
  std::optional<search_pool> pool_;
  std::exception_ptr error_;
  std::size_t started_ = 0;
  std::thread thread_;
};

/// The cheapest answer over the threads (ties to the lowest thread, thread 0 first), the best
/// proven bound, and whether a search thread ended at its time or work limit.
struct pooled_answer {
  std::optional<evaluation> eval;
  std::vector<int> choice;
  std::int64_t bound = 0;
  bool any_time = false, any_work = false;
};

inline pooled_answer pool_answers(const strategy_problem& p, const incumbent& best, const exact_end& end,
                                  const search_pool& pool, solve_result& res) {
  pooled_answer out{best.eval, best.choice, end.bound, false, false};
  for (const search_pool::result& r : pool.results()) {
    res.search_rounds += r.rounds;
    if (r.bound) out.bound = std::max(out.bound, *r.bound);
    out.any_time = out.any_time || r.end == search_end::time_limit;
    out.any_work = out.any_work || r.end == search_end::work_limit;
    if (r.choice && (!out.eval || r.objective < out.eval->objective)) {
      out.eval = p.evaluate(*r.choice);
      out.choice = *r.choice;
    }
  }
  return out;
}

/// Why the solve stopped when the Lagrangian search used the rest of thread 0's time: the
/// search's limit that ended it, with the exact pipeline's end and the rounds in words.
inline std::pair<stop_reason, std::string> search_stop(const pooled_answer& a, const exact_end& end,
                                                       const solve_result& res, const solve_options& opt,
                                                       clock::time_point deadline) {
  const std::string rounds = std::to_string(res.search_rounds) + " rounds of the Lagrangian search on " +
                             std::to_string(res.threads) + " thread(s)";
  if (a.any_time || clock::now() >= deadline)
    return {stop_reason::time_limit,
            "time_limit of " + fmt_num(opt.time_limit) + " s reached (" + end.message + "; " + rounds + ")"};
  if (a.any_work)
    return {stop_reason::work_limit, "work_limit of " + std::to_string(opt.work_limit) +
                                         " rounds per search thread reached (" + end.message + "; " + rounds + ")"};
  return {stop_reason::stalled, "no improvement possible under the method: every search thread went " +
                                    std::to_string(opt.stall_rounds) +
                                    " rounds without a cheaper answer before the time limit (" + end.message + "; " +
                                    rounds + ")"};
}

}  // namespace detail

/// Pick one strategy per node at minimum total cost within the usage limit.
/// Returns the best answer found (exactly evaluated): status optimal when its objective equals
/// the proven bound, else feasible with the bound and gap (a time-out is not an error); `stop`
/// and `stopped` say why it ended.
/// Throws solver_error on: bad options, a malformed problem, a usage limit below the smallest
/// reachable peak (the message states that peak), a problem proven infeasible (says so), and a
/// time-out before any feasible answer was found (says so); resource_error, before anything is
/// copied, when the memory it needs beside the problem (detail::solver_bytes) is above what the
/// process can allocate. An exception thrown by `on_progress` stops the solve and comes out
/// unchanged.
inline solve_result solve_ilp(const strategy_problem& p, const solve_options& opt = {}) {
  using namespace detail;
  const clock::time_point t0 = clock::now();
  check_inputs(p, opt);
  solve_result res;
  res.threads = solver_threads(opt.threads);
  const solver_size size = solver_size_of(p);
  check_solver_memory(p, size, res.threads);
  // The search ends in time to free what it built by the time limit (wind_down_seconds).
  const clock::time_point deadline = t0 + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(
                                              opt.time_limit - wind_down_seconds(size, opt.time_limit)));
  res.sizes.push_back(input_size(p));
  reducer red(p, opt.reduce);
  // The first reductions get at most reduce_share of the time: the rest is the answer's. On
  // the contest's largest requests they take seconds (a solve given less than that stops them
  // part-way, the problem as whole as before, only less reduced).
  red.stop_reducing_at(t0 + std::chrono::duration_cast<clock::duration>((deadline - t0) * opt.reduce_share));
  if (opt.reduce)
    red.run();
  else
    red.update_binding();
  red.stop_reducing_at(deadline);
  red.release_dead();
  progress_hub hub(progress_sink(opt), opt.progress_interval, t0);
  incumbent best{p, red, t0, {}, std::nullopt, 0.0, &hub, "heuristic", opt.cutoff};
  const reduced_view first(red, candidate_times(p, red, opt));
  if (first.ilp_nodes.empty()) {  // nothing left to choose: the reductions solved it
    std::vector<int> choice(p.nodes.size(), -1);
    red.unfold(choice);
    const evaluation ev = p.evaluate(choice);
    if (!ev.feasible) throw solver_error("no choice is feasible: " + ev.why);
    best.offer(std::move(choice));
    for (const ilp_size& r : red.sizes) res.sizes.push_back(r);
    return finish(std::move(res), p, best.found_at, best.eval, best.choice, proven_bound(0.0L, red.offset),
                  stop_reason::optimal, "", opt, t0);
  }
  // No answer can come in time: say so now rather than after the time limit (copying the
  // problem for the search and the heuristic's first pass take about as long again).
  if (clock::now() >= deadline)
    throw solver_error::none_found("time_limit of " + fmt_num(opt.time_limit) + " s reached before any answer: checking" +
                                   (opt.reduce ? " and reducing" : "") + " the problem (" + std::to_string(p.nodes.size()) +
                                   " nodes, " + std::to_string(p.edges.size()) + " edges) took " + fmt_num(seconds_since(t0)) +
                                   " s" + (red.cut_short ? " (the reductions stopped part-way, at " + fmt_num(opt.reduce_share) + " of the time limit)" : ""));
  // The search threads start now, on a snapshot of the reduced problem taken while thread 0
  // runs the heuristic; thread 0 joins them when the ILP cannot go on.
  pool_builder building(p, red, first.times, hub, {deadline, opt.work_limit, opt.stall_rounds, opt.seed, opt.cutoff},
                        static_cast<std::size_t>(res.threads - 1));
  const std::int64_t known_bound = first_heuristic(first, red, best, opt, deadline);
  search_pool& pool = building.ready();  // before the reducer changes
  res.threads = 1 + static_cast<int>(building.started());
  hub.bound(known_bound);
  exact_end end{known_bound, stop_reason::time_limit, "", true};
  std::optional<exact_pipeline> exact;  // kept while its LP relaxation may resume
  if (opt.cutoff && known_bound >= *opt.cutoff) {  // nothing that matters is left to prove
    end = {known_bound, stop_reason::cutoff, "the heuristic's Lagrangian bound reached the cutoff", false};
  } else if (opt.exact) {
    // Nothing that costs more than the heuristic's answer can be in a better one: forbid it.
    if (best.eval && opt.reduce) red.tighten(best.eval->objective);
    exact.emplace(p, opt, red, best, res, t0, deadline, known_bound);
    end = exact->run();
  } else {
    end.message = "the ILP is off (solve_options::exact); the Lagrangian search ran";
  }
  bool searched = end.then_search && clock::now() < deadline;
  if (searched) {
    pool.run_here(0, deadline);
    // The search on thread 0 stalled with time left: thread 0 goes back to the LP relaxation
    // it left at relaxation_share of the time (from its basis), with the search's answer in hand.
    const search_pool::result mine = pool.result_of(0);
    if (exact && exact->resumable() && mine.end == search_end::stalled && clock::now() < deadline) {
      if (mine.choice) best.offer(*mine.choice);
      end = exact->resume();
      searched = end.then_search;
    }
  }
  if (searched)
    pool.join();  // the others end at their own limits (or the deadline)
  else
    pool.stop();
  if (std::exception_ptr e = hub.error()) std::rethrow_exception(e);
  const pooled_answer a = pool_answers(p, best, end, pool, res);
  if (!a.eval && opt.cutoff && a.bound >= *opt.cutoff)
    throw solver_error::cut_off("no answer was found, and " + cutoff_words(a.bound, *opt.cutoff));
  if (!a.eval)  // a problem proven infeasible was thrown above: this one may have answers
    throw solver_error::none_found((end.message.empty() ? "the search ended" : end.message) +
                                   ", and no feasible answer was found" +
                                   (p.usage_limit ? " (usage_limit " + std::to_string(*p.usage_limit) + ")" : std::string()));
  auto [why, message] = searched ? search_stop(a, end, res, opt, deadline) : std::pair{end.why, end.message};
  return finish(std::move(res), p, hub.first_seconds(), a.eval, a.choice, a.bound, why, message, opt, t0);
}

}  // namespace autoshard

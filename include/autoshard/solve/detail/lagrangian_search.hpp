#pragma once
// The anytime search for requests whose memory limit binds widely (the large IOPDDL requests,
// whose cheapest choice ignoring the limit is several times below the best feasible one).
// Lagrangian relaxation of the memory rows, with a strong solver for each priced problem:
//   1. prices lambda_t >= 0 per candidate time point turn the limit into node costs
//      (local_search::penalties: usage x the prices of the time points a live part covers);
//   2. message passing (detail/message_passing.hpp, warm-started from the last round) reads an
//      assignment of the priced problem, which ICM and the window search then improve (priced:
//      the limit is not enforced, the prices stand in for it);
//   3. that assignment, repaired to the limit (cheapest cost per byte saved at the most loaded
//      time point) and improved by ICM, is a feasible answer;
//   4. the prices move along the subgradient (each time point's load minus the limit), with a
//      Polyak step towards the best answer's cost.
// After each cheaper answer and every few rounds the best answer is polished by the feasible
// window search. Each round also proves a bound: the chain bound of its messages and prices
// (detail/lagrangian_bound.hpp).
// A round's work is fixed by counts, never by the clock, so the same seed gives the same
// sequence of answers; the clock only decides where the sequence stops (a round cut short by the
// deadline offers nothing). Each thread owns one of these; the tables are shared read-only.
#include <algorithm>  // std::max
#include <atomic>     // std::atomic
#include <chrono>     // std::chrono::steady_clock
#include <cmath>      // std::abs
#include <cstddef>    // std::size_t
#include <limits>     // std::numeric_limits
#include <optional>   // std::optional
#include <vector>     // std::vector

#include "heuristic.hpp"        // local_search
#include "lagrangian_bound.hpp"  // chain_bound
#include "message_passing.hpp"  // mrf_tables, message_passing
#include "reduce.hpp"           // wcost, forbidden
#include "reduced_view.hpp"     // reduced_view

namespace autoshard::detail {

/// How much one round of the Lagrangian search does (counts, so that a round is the same work
/// on any machine).
struct lagrangian_effort {
  int passes = 10;           ///< message-passing iterations per round (each forwards and backwards)
  std::size_t windows = 16;  ///< priced windows per round
  int polish_every = 8;      ///< rounds between polishes of the best answer (and after each new best)
  std::size_t polish_windows = 64;  ///< feasible windows per polish (a quarter of them in a row finding nothing ends it)
  bool polish_on_better = true;     ///< also polish right after each cheaper answer
};

class lagrangian_search {
 public:
  using clock = std::chrono::steady_clock;

  /// `cancel`, when given, ends a round early (as its deadline would) once it turns true.
  lagrangian_search(const mrf_tables& tables, unsigned seed, lagrangian_effort e = {},
                    const std::atomic<bool>* cancel = nullptr)
      : rv_(tables.rv), tables_(tables), mp_(tables), ls_(tables.rv), seed_(seed), effort_(e),
        lambda_(tables.rv.times.size(), 0.0), cancel_(cancel) {
    ls_.cancel = cancel;
    effort_.polish_every = std::max(1, effort_.polish_every);
  }

  /// The best feasible answer so far (reduced picks per node id) and its exact reduced total.
  const std::optional<std::vector<std::size_t>>& best() const { return best_; }
  wcost best_total() const { return best_total_; }
  /// The prices of the best priced estimate so far (for the proven bound), per time point.
  const std::vector<double>& best_prices() const { return best_lambda_; }
  const message_passing& messages() const { return mp_; }
  /// The best proven lower bound of the rounds so far (reduced units, the offset not included):
  /// the chain bound of each round's messages and prices (detail/lagrangian_bound.hpp).
  const std::optional<wcost>& bound() const { return bound_; }
  std::size_t rounds() const { return rounds_; }
  std::size_t rounds_since_improvement() const { return idle_; }

  /// Seed the search with a feasible answer (e.g. the greedy one, or another thread's).
  void offer(const std::vector<std::size_t>& pick) {
    local_search ls(rv_);
    ls.pick = pick;
    ls.recompute_load();
    if (!ls.within_limit()) return;
    const wcost t = ls.total();
    if (!is_forbidden_w(t) && t < best_total_) best_total_ = t, best_ = pick;
  }

  /// Seed the search with the greedy answer (local_search::greedy, then repaired; no clock in
  /// it): a feasible upper bound from the first round on, which scales the first subgradient
  /// steps (without one they aim at twice the estimate). Not improved by ICM: that costs a
  /// round's time at the contest's largest sizes, and the answer it gives steers the prices
  /// worse there (measured: docs/autosharding.md).
  void start_from_greedy(clock::time_point deadline) {
    local_search ls(rv_);
    ls.cancel = cancel_;
    ls.greedy();
    if (!ls.repair(deadline)) return;
    offer(ls.pick);
  }

  /// One round (steps 1-4, then a polish when due). True when it found a cheaper answer; a round
  /// cut short by `deadline` changes nothing that a later round depends on and offers nothing.
  bool round(clock::time_point deadline) {
    const std::vector<std::vector<wcost>> pen = ls_.penalties(lambda_);
    mp_.set_costs(rv_.limit ? &pen : nullptr);
    const auto over = [&] { return ls_.over(deadline); };
    if (!mp_.run(effort_.passes, over)) return false;
    if (const std::optional<wcost> b = chain_bound(rv_, lambda_, mp_, tables_.pos, over); b && (!bound_ || *b > *bound_))
      bound_ = b;
    if (over()) return false;
    ls_.pick = mp_.pick;
    ls_.recompute_load();
    ls_.priced = rv_.limit ? &pen : nullptr;
    const unsigned s = seed_ * 7919u + static_cast<unsigned>(rounds_) + 1u;
    ls_.improve(deadline);
    ls_.window_search(deadline, s, static_cast<std::size_t>(-1), 1000000, 8, effort_.windows);
    ls_.priced = nullptr;
    if (ls_.over(deadline)) return false;
    // The priced value of this assignment: an estimate (from above) of the Lagrangian function.
    double estimate = static_cast<double>(ls_.total());
    for (std::size_t v : rv_.ilp_nodes) estimate += rv_.limit ? static_cast<double>(pen[v][ls_.pick[v]]) : 0.0;
    std::vector<double> g = rv_.limit ? ls_.excess() : std::vector<double>();
    double norm = 0.0;
    for (std::size_t t = 0; t < g.size(); ++t) {
      estimate -= lambda_[t] * static_cast<double>(*rv_.limit);
      if (g[t] > 0.0 || lambda_[t] > 0.0) norm += g[t] * g[t];
    }
    // The assignment made feasible.
    bool better = false;
    {
      local_search fix(rv_);
      fix.cancel = cancel_;
      fix.pick = ls_.pick;
      fix.recompute_load();
      if (fix.repair(deadline)) {
        fix.improve(deadline);
        if (ls_.over(deadline)) return false;
        const wcost t = fix.total();
        if (!is_forbidden_w(t) && t < best_total_) best_total_ = t, best_ = fix.pick, better = true;
      }
    }
    if (estimate > best_estimate_) best_estimate_ = estimate, best_lambda_ = lambda_;
    // The subgradient step.
    if (norm > 0.0) {
      const double ub = is_forbidden_w(best_total_) ? 2.0 * std::abs(estimate) + 1.0 : static_cast<double>(best_total_);
      const double step = theta_ * std::max(ub - estimate, 0.01 * ub) / norm;
      for (std::size_t t = 0; t < g.size(); ++t) lambda_[t] = std::max(0.0, lambda_[t] + step * g[t]);
    }
    ++rounds_;
    if (rounds_ % 10 == 0) theta_ *= 0.7;
    // Polish after each cheaper answer and every `polish_every` rounds.
    if (best_ && ((better && effort_.polish_on_better) || rounds_ % static_cast<std::size_t>(effort_.polish_every) == 0))
      better = polish(deadline) || better;
    idle_ = better ? 0 : idle_ + 1;
    return better;
  }

  /// The feasible window search and random kicks from the best answer; true when cheaper.
  bool polish(clock::time_point deadline) {
    if (!best_) return false;
    local_search ls(rv_);
    ls.cancel = cancel_;
    ls.pick = *best_;
    ls.recompute_load();
    const unsigned s = seed_ * 104729u + static_cast<unsigned>(rounds_);
    ls.window_search(deadline, s, effort_.polish_windows / 4, 1000000, 8, effort_.polish_windows);
    const wcost t = ls.total();
    if (is_forbidden_w(t) || t >= best_total_ || !ls.within_limit()) return false;
    best_total_ = t;
    best_ = ls.pick;
    return true;
  }

 private:
  const reduced_view& rv_;
  const mrf_tables& tables_;
  message_passing mp_;
  local_search ls_;
  unsigned seed_;
  lagrangian_effort effort_;
  std::vector<double> lambda_, best_lambda_;
  const std::atomic<bool>* cancel_;
  double theta_ = 1.0;
  double best_estimate_ = -std::numeric_limits<double>::infinity();
  std::optional<std::vector<std::size_t>> best_;
  wcost best_total_ = forbidden;
  std::optional<wcost> bound_;
  std::size_t rounds_ = 0, idle_ = 0;
};

}  // namespace autoshard::detail

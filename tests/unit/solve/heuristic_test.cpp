// The primal heuristic's window search (detail::local_search::window_search) against exhaustive
// enumeration: on a tree with no usage limit one window covers everything, so it must reach the
// optimum; on any graph with a limit it keeps the answer feasible and never makes it costlier.
#include <doctest/doctest.h>

#include <autoshard/solve/ilp.hpp>

#include <algorithm>
#include <chrono>
#include <random>
#include <utility>
#include <vector>

#include "brute.hpp"

namespace {

using autoshard::strategy_problem;
namespace ad = autoshard::detail;

// The original choice of the heuristic's picks (no reductions ran: every node is still alive).
std::vector<int> choice_of(const ad::reducer& red, const ad::local_search& ls) {
  std::vector<int> c(red.p.nodes.size(), -1);
  for (std::size_t v : ls.rv.ilp_nodes) c[v] = red.nodes[v].strat[ls.pick[v]];
  red.unfold(c);
  return c;
}

ad::clock::time_point in_seconds(int s) { return ad::clock::now() + std::chrono::seconds(s); }

// Without a usage limit, a greedy start then window search (no reductions ran); returns the
// exact evaluation of the answer and whether the problem kept a cycle.
std::pair<autoshard::evaluation, bool> window_search_answer(const strategy_problem& p, unsigned seed) {
  ad::reducer red(p, true);
  red.update_binding();
  const ad::reduced_view rv(red, {});
  std::size_t edges = 0;
  for (const ad::work_edge& e : red.edges) edges += e.alive ? 1 : 0;
  ad::local_search ls(rv);
  ls.greedy();
  ls.window_search(in_seconds(10), seed, 4);
  autoshard::evaluation ev = p.evaluate(choice_of(red, ls));
  CHECK(static_cast<std::int64_t>(ls.total()) == ev.objective);
  return {ev, !rv.ilp_nodes.empty() && edges >= rv.ilp_nodes.size()};
}

}  // namespace

TEST_CASE("window search without a usage limit: one window covers a small tree, or one with a few cycles, and reaches the exact optimum") {
  // A random tree, then a tree plus up to three extra edges (each closes a cycle): small enough
  // that one window takes every node, so variable elimination over it must give the optimum.
  for (const int extra_max : {0, 3}) {
    CAPTURE(extra_max);
    std::mt19937 rng(static_cast<unsigned>(4242 + extra_max));
    int with_cycles = 0;
    for (int seed = 0; seed < 60; ++seed) {
      CAPTURE(seed);
      const int extra = std::uniform_int_distribution<int>(std::min(1, extra_max), extra_max)(rng);
      const strategy_problem p = solve_test::random_tree_problem(rng, 9, extra);
      const solve_test::brute_result want = solve_test::brute_force(p);
      REQUIRE(want.best);
      const auto [ev, cyclic] = window_search_answer(p, static_cast<unsigned>(seed));
      with_cycles += cyclic ? 1 : 0;
      CHECK(ev.feasible);
      CHECK(ev.objective == *want.best);
    }
    if (extra_max > 0) CHECK(with_cycles >= 10);  // a good share of the problems keep a cycle
  }
}

TEST_CASE("window search: with a binding usage limit the answer stays feasible and never costlier") {
  std::mt19937 rng(977);
  solve_test::random_spec spec;
  spec.p_follower = 0.2;
  int improved = 0;
  for (int seed = 0; seed < 80; ++seed) {
    CAPTURE(seed);
    strategy_problem p = solve_test::random_problem(rng, spec);
    const std::int64_t lo = p.min_peak_usage().bytes;
    p.usage_limit = lo + std::uniform_int_distribution<std::int64_t>(0, 8)(rng);
    const solve_test::brute_result want = solve_test::brute_force(p);
    ad::reducer red(p, true);
    red.update_binding();
    const ad::reduced_view rv(red, red.binding_times);
    ad::local_search ls(rv);
    ls.greedy();
    if (!ls.repair() || !p.evaluate(choice_of(red, ls)).feasible) continue;
    const std::int64_t before = p.evaluate(choice_of(red, ls)).objective;
    ls.window_search(in_seconds(10), static_cast<unsigned>(seed), 40);
    CHECK(ls.within_limit());
    const autoshard::evaluation ev = p.evaluate(choice_of(red, ls));
    REQUIRE(ev.feasible);
    REQUIRE(want.best);
    CHECK(ev.objective <= before);
    CHECK(ev.objective >= *want.best);
    CHECK(static_cast<std::int64_t>(ls.total()) == ev.objective);
    improved += ev.objective < before ? 1 : 0;
  }
  CHECK(improved > 0);
}


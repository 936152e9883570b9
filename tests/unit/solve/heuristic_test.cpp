// The primal heuristic's window search (detail::local_search::window_search) against exhaustive
// enumeration: on a tree with no usage limit one window covers everything, so it must reach the
// optimum; on any graph with a limit it keeps the answer feasible and never makes it costlier.
#include <doctest/doctest.h>

#include <autoshard/solve/ilp.hpp>

#include <chrono>
#include <random>
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

}  // namespace

TEST_CASE("window search: on a tree without a usage limit it reaches the exact optimum") {
  std::mt19937 rng(4242);
  solve_test::random_spec spec;
  spec.p_inf = 0.0;
  spec.max_nodes = 9;
  spec.max_strategies = 4;
  for (int seed = 0; seed < 60; ++seed) {
    CAPTURE(seed);
    strategy_problem p = solve_test::random_problem(rng, spec);
    p.edges.clear();  // a random tree: each node joins one earlier node
    for (std::size_t v = 1; v < p.nodes.size(); ++v) {
      autoshard::strategy_edge e;
      e.from = std::uniform_int_distribution<std::size_t>(0, v - 1)(rng);
      e.to = v;
      std::uniform_int_distribution<std::int64_t> c(0, 50);
      for (std::size_t k = 0; k < p.nodes[e.from].costs.size() * p.nodes[v].costs.size(); ++k) e.costs.push_back(c(rng));
      p.edges.push_back(e);
    }
    const solve_test::brute_result want = solve_test::brute_force(p);
    REQUIRE(want.best);
    ad::reducer red(p, true);
    red.update_binding();
    const ad::reduced_view rv(red, {});
    ad::local_search ls(rv);
    ls.greedy();
    ls.window_search(in_seconds(10), static_cast<unsigned>(seed), 4);
    const autoshard::evaluation ev = p.evaluate(choice_of(red, ls));
    CHECK(ev.feasible);
    CHECK(ev.objective == *want.best);
    CHECK(static_cast<std::int64_t>(ls.total()) == *want.best);
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

TEST_CASE("window search: with a few cycles and no usage limit one window reaches the exact optimum") {
  // A random tree plus up to three extra edges (each closes a cycle): small enough that one
  // window takes every node, so variable elimination over it must give the optimum.
  std::mt19937 rng(5151);
  solve_test::random_spec spec;
  spec.p_inf = 0.0;
  spec.max_nodes = 8;
  spec.max_strategies = 4;
  int with_cycles = 0;
  for (int seed = 0; seed < 60; ++seed) {
    CAPTURE(seed);
    strategy_problem p = solve_test::random_problem(rng, spec);
    if (p.nodes.size() < 4) continue;
    p.edges.clear();
    std::uniform_int_distribution<std::int64_t> c(0, 50);
    const auto link = [&](std::size_t a, std::size_t b) {
      autoshard::strategy_edge e;
      e.from = a;
      e.to = b;
      for (std::size_t k = 0; k < p.nodes[a].costs.size() * p.nodes[b].costs.size(); ++k) e.costs.push_back(c(rng));
      p.edges.push_back(e);
    };
    for (std::size_t v = 1; v < p.nodes.size(); ++v) link(std::uniform_int_distribution<std::size_t>(0, v - 1)(rng), v);
    const int extra = std::uniform_int_distribution<int>(1, 3)(rng);
    for (int k = 0; k < extra; ++k) {
      std::uniform_int_distribution<std::size_t> any(0, p.nodes.size() - 1);
      const std::size_t a = any(rng), b = any(rng);
      if (a != b) link(a, b);
    }
    const solve_test::brute_result want = solve_test::brute_force(p);
    REQUIRE(want.best);
    ad::reducer red(p, true);
    red.update_binding();
    const ad::reduced_view rv(red, {});
    std::size_t inner = 0;
    for (const ad::work_edge& e : red.edges) inner += e.alive ? 1 : 0;
    with_cycles += inner >= rv.ilp_nodes.size() && !rv.ilp_nodes.empty() ? 1 : 0;
    ad::local_search ls(rv);
    ls.greedy();
    ls.window_search(in_seconds(10), static_cast<unsigned>(seed), 4);
    const autoshard::evaluation ev = p.evaluate(choice_of(red, ls));
    CHECK(ev.feasible);
    CHECK(ev.objective == *want.best);
  }
  CHECK(with_cycles > 20);
}

// The Lagrangian bound (detail/lagrangian_bound.hpp) against exhaustive enumeration: for any
// prices >= 0, however large, it never exceeds the optimum of the problem with its usage limit;
// on a tree without a limit (prices zero) it is the optimum exactly. The chain bound of TRW-S
// messages likewise, and it sees the edges a spanning forest drops.
#include <doctest/doctest.h>

#include <autoshard/solve/ilp.hpp>
#include <autoshard/solve/detail/lagrangian_search.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "brute.hpp"

namespace {

namespace ad = autoshard::detail;

// The bound in problem units, or nothing when it could not be stated exactly.
std::optional<std::int64_t> bound_of(const ad::reducer& red, const std::vector<double>& lambda) {
  const ad::reduced_view rv(red, red.binding_times);
  const std::optional<ad::wcost> lb = ad::lagrangian_bound(rv, ad::spanning_forest(rv), lambda);
  if (!lb || ad::is_forbidden_w(*lb)) return std::nullopt;
  return static_cast<std::int64_t>(ad::wadd(red.offset, *lb));
}

// The chain bound of `passes` TRW-S iterations at prices `lambda`, in problem units.
std::optional<std::int64_t> chain_bound_of(const ad::reducer& red, const std::vector<double>& lambda, int passes) {
  const ad::reduced_view rv(red, red.binding_times);
  const ad::mrf_tables tables(rv);
  ad::message_passing mp(tables);
  ad::local_search ls(rv);
  const std::vector<std::vector<ad::wcost>> pen = ls.penalties(lambda);
  mp.set_costs(rv.limit ? &pen : nullptr);
  mp.run(passes);
  const std::optional<ad::wcost> lb = ad::chain_bound(rv, lambda, mp, tables.pos);
  if (!lb || ad::is_forbidden_w(*lb)) return std::nullopt;
  return static_cast<std::int64_t>(ad::wadd(red.offset, *lb));
}

}  // namespace

TEST_CASE("lagrangian and chain bounds: never above the optimum, for any prices and messages, with the reductions run") {
  std::mt19937 rng(8080);
  solve_test::random_spec spec;
  spec.p_follower = 0.1;
  int priced = 0, above_free = 0, chain_tighter = 0;
  for (int seed = 0; seed < 150; ++seed) {
    CAPTURE(seed);
    autoshard::strategy_problem p = solve_test::random_problem(rng, spec);
    const std::int64_t lo = p.min_peak_usage().bytes;
    p.usage_limit = lo + std::uniform_int_distribution<std::int64_t>(0, 6)(rng);
    const solve_test::brute_result want = solve_test::brute_force(p);
    if (!want.best) continue;
    ad::reducer red(p, true);
    red.run();
    const ad::reduced_view rv(red, red.binding_times);
    if (rv.ilp_nodes.empty()) continue;
    const std::optional<std::int64_t> free = bound_of(red, std::vector<double>(rv.times.size(), 0.0));
    REQUIRE(free);
    CHECK(*free <= *want.best);
    for (int draw = 0; draw < 6; ++draw) {
      // Prices from 0 to far beyond any cost per usage unit.
      std::vector<double> lambda(rv.times.size());
      const double top = std::pow(10.0, std::uniform_real_distribution<double>(-3.0, 4.0)(rng));
      for (double& l : lambda) l = std::uniform_int_distribution<int>(0, 2)(rng) == 0 ? 0.0 : top * std::uniform_real_distribution<double>(0.0, 1.0)(rng);
      const std::optional<std::int64_t> b = bound_of(red, lambda);
      REQUIRE(b);
      CHECK(*b <= *want.best);
      // The chain bound of TRW-S's messages after 0 to 30 passes, at the same prices.
      const std::optional<std::int64_t> chain = chain_bound_of(red, lambda, (draw % 4) * (draw % 4) * 3);
      REQUIRE(chain);
      CHECK(*chain <= *want.best);
      chain_tighter += *chain > *b ? 1 : 0;
      priced += rv.times.empty() ? 0 : 1;
      above_free += *b > *free ? 1 : 0;
    }
  }
  CHECK(priced > 100);
  CHECK(above_free > 0);     // prices do raise the bound on some problems
  CHECK(chain_tighter > 0);  // the messages see the edges a spanning forest drops
}

TEST_CASE("lagrangian and chain bounds: on a tree without a usage limit they are the optimum") {
  std::mt19937 rng(9090);
  for (int seed = 0; seed < 60; ++seed) {
    CAPTURE(seed);
    const autoshard::strategy_problem p = solve_test::random_tree_problem(rng, 8, 0);
    const solve_test::brute_result want = solve_test::brute_force(p);
    REQUIRE(want.best);
    ad::reducer red(p, true);
    red.update_binding();
    const std::optional<std::int64_t> b = bound_of(red, {});
    REQUIRE(b);
    CHECK(*b == *want.best);
    // TRW-S's messages converge to the exact minimum too.
    const std::optional<std::int64_t> chain = chain_bound_of(red, {}, 20);
    REQUIRE(chain);
    CHECK(*chain == *want.best);
  }
}

TEST_CASE("chain bound: asked to stop, it stops within 1024 nodes and states no bound") {
  // A path of 5,000 two-strategy nodes, not reduced: the bound visits each node twice (its
  // messages in, then its chain), 10,000 visits, and asks `stop` at every 1024th.
  autoshard::strategy_problem p;
  const std::size_t n = 5000;
  for (std::size_t v = 0; v < n; ++v) p.nodes.push_back({"", {static_cast<std::int64_t>(v % 7), 3}, {1, 1}, {0, 1}});
  for (std::size_t v = 0; v + 1 < n; ++v) p.edges.push_back({v, v + 1, {0, 5, 2, 0}});
  const ad::reducer red(p, true);
  const ad::reduced_view rv(red, red.binding_times);
  const ad::mrf_tables tables(rv);
  ad::message_passing mp(tables);
  mp.set_costs(nullptr);
  mp.run(2);
  const std::vector<double> lambda;
  int asked = 0;
  const std::optional<ad::wcost> whole = ad::chain_bound(rv, lambda, mp, tables.pos, [&] { return ++asked < 0; });
  CHECK(asked == 2 * n / 1024);
  REQUIRE(whole);
  CHECK(*whole == ad::chain_bound(rv, lambda, mp, tables.pos));  // the default never stops
  for (const int at : {1, 5, 9}) {
    CAPTURE(at);
    asked = 0;
    CHECK_FALSE(ad::chain_bound(rv, lambda, mp, tables.pos, [&] { return ++asked == at; }));
    CHECK(asked == at);  // it stopped at once
  }
}

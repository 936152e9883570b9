// The strategy ILP against exhaustive enumeration, and its documented errors.
#include <doctest/doctest.h>

#include <autoshard/solve/solve.hpp>

#include <cmath>
#include <random>
#include <string>

#include "brute.hpp"

namespace {

using autoshard::solve_ilp;
using autoshard::solve_options;
using autoshard::stop_reason;
using autoshard::strategy_problem;

// Compare one problem with exact enumeration: the answer is feasible and exactly priced, the
// bound is a true bound, "optimal" only when the answer is the optimum; both agree on infeasible.
void check_against_brute(const strategy_problem& p, const solve_options& opt, int seed, bool must_be_optimal = true) {
  CAPTURE(seed);
  const solve_test::brute_result want = solve_test::brute_force(p);
  if (!want.best) {
    CHECK_THROWS_AS(solve_ilp(p, opt), autoshard::solver_error);
    return;
  }
  const autoshard::solve_result got = solve_ilp(p, opt);
  REQUIRE(got.choice.size() == p.nodes.size());
  const autoshard::evaluation ev = p.evaluate(got.choice);
  CHECK(ev.feasible);
  CHECK(ev.objective == got.objective);
  CHECK(got.objective >= *want.best);
  CHECK(got.bound <= *want.best);
  if (got.status == autoshard::solve_status::optimal) {
    CHECK(got.objective == *want.best);
    CHECK(got.gap == 0.0);
  } else {
    CHECK(got.gap > 0.0);
  }
  if (must_be_optimal) CHECK(got.status == autoshard::solve_status::optimal);
  if (p.usage_limit) CHECK(p.peak_usage(got.choice).bytes <= *p.usage_limit);
}

// A usage limit somewhere between the smallest reachable peak and the unconstrained optimum's
// peak, so that it often binds.
void set_binding_limit(strategy_problem& p, std::mt19937& rng) {
  p.usage_limit.reset();
  const solve_test::brute_result free = solve_test::brute_force(p);
  const std::int64_t lo = p.min_peak_usage().bytes;
  const std::int64_t hi = free.best ? p.peak_usage(free.choice).bytes : lo;
  std::uniform_int_distribution<std::int64_t> d(lo, std::max(lo, hi));
  p.usage_limit = d(rng);
}

using solve_test::frustrated_grid;

}  // namespace

TEST_CASE("solve_ilp equals exhaustive enumeration on random small problems") {
  std::mt19937 rng(20250302);
  solve_test::random_spec spec;
  for (int seed = 0; seed < 120; ++seed) {
    strategy_problem p = solve_test::random_problem(rng, spec);
    if (seed % 2 == 1) set_binding_limit(p, rng);
    check_against_brute(p, {}, seed);
  }
}

TEST_CASE("a cutoff: below the optimum the solve proves nothing cheaper exists, at or above it the answer is the optimum") {
  std::mt19937 rng(20261205);
  solve_test::random_spec spec;
  int below = 0;
  for (int seed = 0; seed < 30; ++seed) {
    CAPTURE(seed);
    strategy_problem p = solve_test::random_problem(rng, spec);
    if (seed % 2 == 1) set_binding_limit(p, rng);
    const solve_test::brute_result want = solve_test::brute_force(p);
    if (!want.best) continue;
    const std::int64_t opt = *want.best;
    for (const std::int64_t cut : {opt - 7, opt - 1, opt, opt + 1}) {
      CAPTURE(cut);
      solve_options o;
      o.threads = 1 + seed % 2;
      o.cutoff = cut;
      autoshard::solve_result r;
      try {
        r = solve_ilp(p, o);
      } catch (const autoshard::solver_error& e) {  // no answer found: only when none is cheaper than the cutoff
        CHECK(e.beyond_cutoff());
        CHECK(cut <= opt);
        continue;
      }
      CHECK(p.evaluate(r.choice).objective == r.objective);
      CHECK(r.objective >= opt);
      CHECK(r.bound <= opt);  // always a true bound
      if (r.status == autoshard::solve_status::optimal) {
        CHECK(r.objective == opt);
      } else {
        // Stopped only because nothing cheaper than the cutoff exists: never above the optimum.
        CHECK(cut <= opt);
        CHECK(r.stop == stop_reason::cutoff);
        CHECK(r.bound >= cut);
        CHECK(r.stopped.find("reached the cutoff " + std::to_string(cut)) != std::string::npos);
        ++below;
      }
      if (cut > opt) CHECK(r.status == autoshard::solve_status::optimal);
    }
  }
  CHECK(below > 0);  // some solves did stop at their cutoff
}

TEST_CASE("a cutoff ends a long solve as soon as its bound reaches it, not once the optimum is proven") {
  // A bound proven in a short solve, as a cutoff, ends the next solve once it is proven again,
  // not when the optimum is: by the heuristic's bound, the LP relaxation's or the search threads'.
  const strategy_problem p = frustrated_grid(5);
  for (const bool exact : {true, false}) {
    CAPTURE(exact);
    solve_options o;
    o.threads = 2;
    o.exact = exact;
    o.time_limit = 0.5;
    const autoshard::solve_result first = solve_ilp(p, o);
    REQUIRE(first.status == autoshard::solve_status::feasible);
    o.time_limit = 20.0;
    o.heuristic_share = 0.01;
    o.cutoff = first.bound;
    const autoshard::solve_result r = solve_ilp(p, o);
    CHECK(r.stop == stop_reason::cutoff);
    CHECK(r.bound >= first.bound);
    CHECK(r.objective > r.bound);
    CHECK(r.seconds < 10.0);  // without the cutoff it runs its 20 s
  }
}

TEST_CASE("follower and alias edges merge, and the answer stays the optimum") {
  std::mt19937 rng(17);
  solve_test::random_spec spec;
  spec.p_follower = 0.4;
  spec.max_nodes = 9;
  for (int seed = 0; seed < 60; ++seed) {
    strategy_problem p = solve_test::random_problem(rng, spec);
    if (seed % 2 == 0) set_binding_limit(p, rng);
    check_against_brute(p, {}, seed);
  }
}

TEST_CASE("costs from 1 to 1e17, near 2^59 and beyond 1e18: exact or feasible with a true bound, never a wrong optimal") {
  // The exact cross-check is enumeration in 128-bit integers; the solver's LP works in doubles,
  // where 1e17 and 1 differ by more than a double's precision.
  std::mt19937 rng(7);
  solve_test::random_spec spec;
  spec.wide_costs = true;
  spec.p_inf = 0.15;
  spec.p_follower = 0.2;
  spec.max_nodes = 8;
  int optimal = 0;
  for (int seed = 0; seed < 80; ++seed) {
    strategy_problem p = solve_test::random_problem(rng, spec);
    if (seed % 2 == 1) set_binding_limit(p, rng);
    check_against_brute(p, {}, seed, false);
    try {
      optimal += solve_ilp(p).status == autoshard::solve_status::optimal ? 1 : 0;
    } catch (const autoshard::solver_error&) {
    }
  }
  CHECK(optimal > 30);  // many are still proven (exactly, by the reductions and the integer bound)
}

TEST_CASE("answers 1 apart beside costs of 1e12 are told apart: the exact optimum, proven") {
  // GLPK prunes within a relative 1e-7 of its incumbent and accepts reduced costs within 1e-7:
  // here that is ~1e5 units, so only the safe bounds and the exact search can prove these.
  std::mt19937 rng(31);
  solve_test::random_spec spec;
  spec.max_nodes = 8;
  spec.p_inf = 0.05;
  int proven = 0;
  for (int seed = 0; seed < 40; ++seed) {
    strategy_problem p = solve_test::random_problem(rng, spec);
    std::uniform_int_distribution<int> coin(0, 2);
    for (autoshard::strategy_node& n : p.nodes)
      for (std::int64_t& c : n.costs)
        if (!autoshard::is_forbidden(c) && coin(rng) == 0) c += 1'000'000'000'000;
    for (autoshard::strategy_edge& e : p.edges)
      for (std::int64_t& c : e.costs)
        if (!autoshard::is_forbidden(c) && coin(rng) == 0) c += 1'000'000'000'000;
    if (seed % 2 == 1) set_binding_limit(p, rng);
    check_against_brute(p, {}, seed, false);
    try {
      proven += solve_ilp(p).status == autoshard::solve_status::optimal ? 1 : 0;
    } catch (const autoshard::solver_error&) {
      ++proven;  // proven infeasible, as check_against_brute saw
    }
  }
  CHECK(proven == 40);
}

TEST_CASE("the naive AND formulation without reductions finds the same optimum") {
  std::mt19937 rng(11);
  solve_test::random_spec spec;
  spec.max_nodes = 7;
  solve_options naive;
  naive.reduce = false;
  naive.formulation = autoshard::ilp_formulation::naive_and;
  naive.lazy_memory = false;
  solve_options marginal_unreduced;
  marginal_unreduced.reduce = false;
  for (int seed = 0; seed < 30; ++seed) {
    strategy_problem p = solve_test::random_problem(rng, spec);
    if (seed % 2 == 0) set_binding_limit(p, rng);
    check_against_brute(p, naive, seed);
    check_against_brute(p, marginal_unreduced, seed);
  }
}

TEST_CASE("IOPDDL example.json: the optimum found by enumeration") {
  const strategy_problem p = autoshard::read_iopddl_file(AUTOSHARD_TEST_DATA_DIR "/solve/example.json");
  const solve_test::brute_result want = solve_test::brute_force(p);
  REQUIRE(want.best);
  const autoshard::solve_result got = solve_ilp(p);
  CHECK(got.objective == *want.best);
  CHECK(got.choice == want.choice);  // the optimum is unique here
  CHECK(got.peak.bytes <= 50);
  // The reductions leave less than the input, and the sizes are reported stage by stage.
  REQUIRE(got.sizes.size() >= 3);
  CHECK(got.sizes.front().stage == "input");
  CHECK(got.sizes.front().variables == 23);  // 1+2+3+2+1 strategies + 2+3+4+3+2 pairs
  CHECK(got.sizes.back().stage == "ilp");
  CHECK(got.sizes.back().variables < got.sizes.front().variables);

  // Without the limit the optimum is cheaper or equal, and the limit is respected only with it.
  strategy_problem unlimited = p;
  unlimited.usage_limit.reset();
  const autoshard::solve_result free = solve_ilp(unlimited);
  CHECK(free.objective == *solve_test::brute_force(unlimited).best);
  CHECK(free.objective <= got.objective);
}

TEST_CASE("forbidden (infinite) strategies and pairs are never chosen") {
  strategy_problem p;
  p.nodes = {{"a", {0, 1, 2}, {0, 0, 0}, {}}, {"b", {0, 1}, {0, 0}, {}}, {"c", {5, 0}, {0, 0}, {}}};
  const std::int64_t inf = autoshard::infinite_cost;
  p.edges = {{0, 1, {inf, 3, 4, inf, 0, 9}}, {1, 2, {0, inf, inf, 0}}};
  // a=0 must take b=1 (cost 3); c then must be 1: 0+3+1+0+0 = 4. a=1 with b=0: 1+4+0+0+5 = 10.
  const autoshard::solve_result r = solve_ilp(p);
  CHECK(r.objective == 4);
  CHECK(r.choice == std::vector<int>{0, 1, 1});
  p.nodes[0].costs = {inf, inf, inf};
  CHECK_THROWS_WITH_AS(solve_ilp(p), doctest::Contains("node 0 'a'"), autoshard::solver_error);
}

TEST_CASE("an infeasible budget names the smallest budget that could fit") {
  strategy_problem p = autoshard::read_iopddl_file(AUTOSHARD_TEST_DATA_DIR "/solve/example.json");
  const std::int64_t lo = p.min_peak_usage().bytes;  // 10 + 25 + 15 at time 50
  CHECK(lo == 50);
  p.usage_limit = 49;
  CHECK_THROWS_WITH_AS(solve_ilp(p), doctest::Contains("smallest budget that could fit is 50"),
                       autoshard::solver_error);
  p.usage_limit = 50;
  CHECK(solve_ilp(p).peak.bytes == 50);
}

TEST_CASE("bad options are errors: time_limit 0, negative gap") {
  const strategy_problem p = autoshard::read_iopddl_file(AUTOSHARD_TEST_DATA_DIR "/solve/example.json");
  solve_options o;
  o.time_limit = 0;
  CHECK_THROWS_WITH_AS(solve_ilp(p, o), doctest::Contains("time_limit must be > 0 seconds, got 0"),
                       autoshard::solver_error);
  o.time_limit = 10;
  o.mip_rel_gap = -0.5;
  CHECK_THROWS_WITH_AS(solve_ilp(p, o), doctest::Contains("mip_rel_gap"), autoshard::solver_error);
  strategy_problem bad = p;
  bad.edges[0].costs.pop_back();
  CHECK_THROWS_WITH_AS(solve_ilp(bad), doctest::Contains("edge 0 [0, 1] has 1 costs, expected 1x2 = 2"),
                       autoshard::solver_error);
}

TEST_CASE("a short time limit returns an incumbent with its gap, or says it found none") {
  const strategy_problem p = frustrated_grid(3);
  solve_options o;
  o.time_limit = 0.05;
  int reports = 0;
  o.on_progress = [&](const autoshard::solve_progress& pr) {
    ++reports;
    CHECK(pr.seconds >= 0.0);
    CHECK(pr.bound <= pr.incumbent);
  };
  try {
    const autoshard::solve_result r = solve_ilp(p, o);
    CHECK(p.cost_of(r.choice) == r.objective);
    CHECK(r.bound <= r.objective);
    CHECK(r.gap >= 0.0);
    if (r.status == autoshard::solve_status::feasible) CHECK(r.gap > 0.0);
    CHECK(r.seconds < 5.0);
  } catch (const autoshard::solver_error& e) {
    // Out of time after the search, or before it could start (a slow machine, ASan).
    CHECK(e.unproven());
    const std::string what = e.what();
    CHECK((what.find("no feasible answer was found") != std::string::npos ||
           what.find("reached before any answer") != std::string::npos));
  }
}

TEST_CASE("progress reports every better incumbent, mip_rel_gap stops early within the gap") {
  std::mt19937 rng(5);
  solve_test::random_spec spec;
  spec.max_nodes = 40;
  spec.max_choices = 1L << 62;
  spec.p_inf = 0.0;
  strategy_problem p;
  while (p.nodes.size() < 25) p = solve_test::random_problem(rng, spec);
  solve_options o;
  std::vector<double> incumbents;
  o.on_progress = [&](const autoshard::solve_progress& pr) {
    if (pr.incumbent < autoshard::infinite_cost) incumbents.push_back(pr.incumbent);
  };
  const autoshard::solve_result exact = solve_ilp(p, o);
  CHECK(exact.status == autoshard::solve_status::optimal);
  for (std::size_t i = 1; i < incumbents.size(); ++i) CHECK(incumbents[i] <= incumbents[i - 1] + 1e-9);
  o.mip_rel_gap = 0.5;
  const autoshard::solve_result loose = solve_ilp(p, o);
  CHECK(loose.objective >= exact.objective - 1e-9);
  CHECK(loose.objective <= exact.objective * 1.5 + 1e-9);
  // A callback that throws stops the solve and its exception comes out unchanged.
  o.mip_rel_gap = 0;
  o.on_progress = [](const autoshard::solve_progress&) { throw std::runtime_error("stop here"); };
  if (exact.rounds > 0) CHECK_THROWS_WITH(solve_ilp(p, o), "stop here");
}

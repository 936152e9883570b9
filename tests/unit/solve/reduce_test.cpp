// The reductions (detail/reduce.hpp) keep what they need as they go: each edge's count of
// allowed pairs, each node's version (what a later round may skip), the edge between two nodes
// by key, the live ranges sorted once. These tests hold them to what looking at everything
// again gives, and to linear work around a node of very high degree.
#include <doctest/doctest.h>

#include <autoshard/solve/ilp.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "brute.hpp"

namespace ad = autoshard::detail;

// The reducer keeps counts and versions as it goes (work_edge::allowed, reducer::touch) so
// that sizes need no rescan and later rounds skip what did not change. Skipping must change
// nothing: the reductions end in the same problem, step for step, as when every reduction
// looks at everything each time, after a tightening too.
TEST_CASE("skipping what did not change reduces to the same problem, and the counts of allowed pairs stay exact") {
  std::mt19937 rng(23);
  solve_test::random_spec spec;
  spec.max_nodes = 12;
  spec.max_strategies = 6;
  spec.p_inf = 0.1;
  int reduced = 0, tightened = 0, coupled = 0;
  for (int trial = 0; trial < 150; ++trial) {
    autoshard::strategy_problem p = solve_test::random_problem(rng, spec);
    if (trial % 2) p.usage_limit = p.min_peak_usage().bytes + static_cast<std::int64_t>(rng() % 15);  // often binding
    ad::reducer fast(p, true), full(p, true);
    full.skip_unchanged = false;
    const auto run = [](ad::reducer& r, bool tighten) {
      try {
        if (!tighten) {
          r.run();
        } else {
          r.tighten(r.offset + 3);
        }
        return std::string();
      } catch (const autoshard::solver_error& e) {
        return std::string(e.what());
      }
    };
    CAPTURE(trial);
    for (const bool tighten : {false, true}) {
      const std::string a = run(fast, tighten), b = run(full, tighten);
      REQUIRE(a == b);
      if (!a.empty()) break;
      CHECK(fast.counts_consistent());
      REQUIRE(fast.offset == full.offset);
      REQUIRE(fast.records.size() == full.records.size());
      REQUIRE(fast.sizes.size() == full.sizes.size());
      for (std::size_t k = 0; k < fast.sizes.size(); ++k) {
        CHECK(fast.sizes[k].stage == full.sizes[k].stage);
        CHECK(fast.sizes[k].variables == full.sizes[k].variables);
        CHECK(fast.sizes[k].rows == full.sizes[k].rows);
      }
      for (std::size_t v = 0; v < p.nodes.size(); ++v) {
        CHECK(fast.nodes[v].alive == full.nodes[v].alive);
        CHECK(fast.nodes[v].strat == full.nodes[v].strat);
        CHECK(fast.nodes[v].cost == full.nodes[v].cost);
        if (fast.nodes[v].alive) CHECK(fast.coupled(v) == full.coupled(v));
      }
      REQUIRE(fast.edges.size() == full.edges.size());
      for (std::size_t e = 0; e < fast.edges.size(); ++e) {
        CHECK(fast.edges[e].alive == full.edges[e].alive);
        if (fast.edges[e].alive) CHECK(fast.edges[e].m == full.edges[e].m);
      }
      (tighten ? tightened : reduced) += 1;
      for (std::size_t v = 0; v < p.nodes.size(); ++v) coupled += fast.nodes[v].alive && fast.coupled(v) ? 1 : 0;
    }
  }
  CHECK(coupled > 20);  // the usage limit bound somewhere, so the usages took part in domination
  CHECK(reduced > 100);
  CHECK(tightened > 50);
}

namespace {

autoshard::strategy_node hub_node(std::vector<std::int64_t> costs) {
  autoshard::strategy_node n;
  n.usages.assign(costs.size(), 1);
  n.costs = std::move(costs);
  n.live = {0, 10};
  return n;
}

autoshard::solve_options sixty_seconds() {
  autoshard::solve_options o;
  o.time_limit = 60;
  return o;
}

}  // namespace

// A node of many edges: the reducer merged parallel edges by scanning an end's list of edges,
// a copy of it each time, so building it was quadratic in the degree (a 200,000-leaf star, 10
// MB of IOPDDL, ran past 120 s under --time-limit 30; 100,000 leaves are 5e9 copies). Each
// shape below ends in seconds, with the optimum, checked here.
TEST_CASE("a node of 30,000 to 100,000 edges: a star, a hub that follows its leaves, two hubs joined by paths") {
  constexpr std::int64_t inf = autoshard::infinite_cost;
  SUBCASE("a star: every leaf agrees with the hub") {
    autoshard::strategy_problem p;
    const std::size_t leaves = 100000;
    p.nodes.push_back(hub_node({1, 2}));
    for (std::size_t i = 0; i < leaves; ++i) p.nodes.push_back(hub_node({1, 2}));
    for (std::size_t i = 1; i <= leaves; ++i) p.edges.push_back({0, i, {0, 1, 1, 0}});
    const autoshard::solve_result r = autoshard::solve_ilp(p, sixty_seconds());
    CHECK(r.status == autoshard::solve_status::optimal);
    CHECK(r.objective == static_cast<std::int64_t>(leaves) + 1);  // everyone at strategy 0
  }
  SUBCASE("the hub, last, follows each leaf, which has more strategies (it must not absorb them)") {
    autoshard::strategy_problem p;
    const std::size_t leaves = 50000;
    for (std::size_t i = 0; i < leaves; ++i) p.nodes.push_back(hub_node({1, 2, 3}));
    p.nodes.push_back(hub_node({5, 1}));
    for (std::size_t i = 0; i < leaves; ++i) p.edges.push_back({i, leaves, {0, inf, inf, 0, 0, inf}});
    const autoshard::solve_result r = autoshard::solve_ilp(p, sixty_seconds());
    CHECK(r.status == autoshard::solve_status::optimal);
    // Leaf strategies 0 and 2 put the hub at 0, strategy 1 at 1. Hub at 0 (5): every leaf at
    // 0 (1); hub at 1 (1): every leaf at 1 (2). 50,005 against 100,001.
    CHECK(r.objective == static_cast<std::int64_t>(leaves) + 5);
  }
  SUBCASE("two hubs joined by 30,000 two-edge paths, each folded into the one edge between them") {
    autoshard::strategy_problem p;
    const std::size_t paths = 30000;
    p.nodes.push_back(hub_node({1, 2}));
    p.nodes.push_back(hub_node({1, 2}));
    for (std::size_t i = 0; i < paths; ++i) {
      p.nodes.push_back(hub_node({1, 2}));
      p.edges.push_back({0, i + 2, {0, 3, 2, 1}});
      p.edges.push_back({i + 2, 1, {1, 0, 4, 2}});
    }
    const autoshard::solve_result r = autoshard::solve_ilp(p, sixty_seconds());
    CHECK(r.status == autoshard::solve_status::optimal);
    // A path's cheapest middle for hubs (a, b): (0, 0) 2, (0, 1) 1 (middle 0: 1 + 0 + 0),
    // (1, 0) 4, (1, 1) 3; the hubs cost 1 + 2 at (0, 1): 30,003.
    CHECK(r.objective == static_cast<std::int64_t>(paths) + 3);
    CHECK(r.objective == p.evaluate(r.choice).objective);
  }
}

// The first reductions stop at solve_options::reduce_share of the time limit. Stopped at once
// they leave the problem as it came (parallel edges merged), and the solve must still find and
// prove the optimum, with and without a binding usage limit; the sizes say they stopped.
TEST_CASE("reductions stopped at once (reduce_share 0): the same optimum, proven, and the sizes say so") {
  std::mt19937 rng(31);
  solve_test::random_spec spec;
  spec.max_nodes = 8;
  spec.max_strategies = 4;
  spec.p_inf = 0.05;
  autoshard::solve_options o;
  o.time_limit = 30;
  o.reduce_share = 0.0;
  int solved = 0;
  for (int trial = 0; trial < 40; ++trial) {
    autoshard::strategy_problem p = solve_test::random_problem(rng, spec);
    if (trial % 2) p.usage_limit = p.min_peak_usage().bytes + static_cast<std::int64_t>(rng() % 10);
    const solve_test::brute_result want = solve_test::brute_force(p);
    CAPTURE(trial);
    if (!want.best) {
      CHECK_THROWS_AS((void)autoshard::solve_ilp(p, o), autoshard::solver_error);
      continue;
    }
    const autoshard::solve_result r = autoshard::solve_ilp(p, o);
    CHECK(r.status == autoshard::solve_status::optimal);
    CHECK(r.objective == *want.best);
    const bool stopped = std::any_of(r.sizes.begin(), r.sizes.end(),
                                     [](const autoshard::ilp_size& s) { return s.stage == "stopped: the time for reductions ran out"; });
    CHECK(stopped);
    ++solved;
  }
  CHECK(solved > 30);
  o.reduce_share = 1.5;
  CHECK_THROWS_WITH_AS((void)autoshard::solve_ilp(solve_test::random_problem(rng, spec), o),
                       "solver error: reduce_share must be in [0, 1], got 1.5", autoshard::solver_error);
}

// A time limit that passes before the search could start: said at once, with the problem's
// size and how long checking and reducing it took, as a solve that found no answer (not one
// proven infeasible).
TEST_CASE("a time limit that passes before any answer is said at once, the reductions cut short") {
  autoshard::strategy_problem p;
  for (int v = 0; v < 2000; ++v) p.nodes.push_back(hub_node({3, 1, 2}));
  for (std::size_t v = 0; v + 1 < 2000; ++v) p.edges.push_back({v, v + 1, {0, 2, 1, 2, 0, 1, 1, 1, 0}});
  autoshard::solve_options o;
  o.time_limit = 1e-9;
  try {
    (void)autoshard::solve_ilp(p, o);
    FAIL("a solve of 2,000 nodes answered within a nanosecond");
  } catch (const autoshard::solver_error& e) {
    CHECK(e.unproven());
    const std::string what = e.what();
    CHECK(what.rfind("solver error: time_limit of 1e-09 s reached before any answer: checking and reducing the problem "
                     "(2000 nodes, 1999 edges) took ", 0) == 0);
    CHECK(what.find("(the reductions stopped part-way, at 0.5 of the time limit)") != std::string::npos);
  }
}

// update_binding sweeps the live ranges sorted once (parts only move between nodes). Held to
// the plain computation, every part's start and end as events sorted each time, on random
// problems with a usage limit, before and after the reductions fold nodes into others.
TEST_CASE("the binding time points from the ranges sorted once equal those from sorting every part's events") {
  const auto sorted_events = [](const ad::reducer& r) {
    std::vector<std::int64_t> out;
    std::vector<std::pair<std::int64_t, autoshard::int128>> ev;
    for (const ad::work_node& n : r.nodes)
      for (const ad::usage_part& pt : n.parts) {
        if (pt.live.empty()) continue;
        const std::int64_t hi = n.alive ? ad::max_of(pt.usage) : pt.hi;
        ev.emplace_back(pt.live.begin, hi);
        ev.emplace_back(pt.live.end, -static_cast<autoshard::int128>(hi));
      }
    std::sort(ev.begin(), ev.end());
    autoshard::int128 cur = 0;
    for (std::size_t k = 0; k < ev.size();) {
      const std::int64_t t = ev[k].first;
      bool starts = false;
      for (; k < ev.size() && ev[k].first == t; ++k) cur += ev[k].second, starts = starts || ev[k].second > 0;
      if (starts && cur > *r.p.usage_limit) out.push_back(t);
    }
    return out;
  };
  std::mt19937 rng(5);
  solve_test::random_spec spec;
  spec.max_nodes = 14;
  spec.max_strategies = 5;
  spec.p_inf = 0.05;
  int reduced = 0, binding = 0;
  for (int trial = 0; trial < 400; ++trial) {
    autoshard::strategy_problem p = solve_test::random_problem(rng, spec);
    p.usage_limit = p.min_peak_usage().bytes + static_cast<std::int64_t>(rng() % 15);
    ad::reducer r(p, true);
    r.update_binding();
    CAPTURE(trial);
    CHECK(r.binding_times == sorted_events(r));
    try {
      r.run();
    } catch (const autoshard::solver_error&) {
      continue;
    }
    r.update_binding();
    CHECK(r.binding_times == sorted_events(r));
    ++reduced;
    binding += r.binding_times.empty() ? 0 : 1;
  }
  CHECK(reduced > 300);
  CHECK(binding > 100);  // the limit still binds somewhere after most reductions
}

// The search's snapshot (reducer::for_reading) keeps only what the search reads: the view built
// on it is the view built on the reducer, the answers it unfolds are the same, and it cannot
// be reduced further.
TEST_CASE("a reducer copied for reading gives the same view and answers, and refuses to reduce") {
  std::mt19937 rng(41);
  solve_test::random_spec spec;
  spec.max_nodes = 12;
  spec.max_strategies = 5;
  spec.p_follower = 0.2;
  int compared = 0;
  for (int trial = 0; trial < 120; ++trial) {
    CAPTURE(trial);
    autoshard::strategy_problem p = solve_test::random_problem(rng, spec);
    if (trial % 2) p.usage_limit = p.min_peak_usage().bytes + static_cast<std::int64_t>(rng() % 10);
    ad::reducer red(p, true);
    try {
      red.run();
    } catch (const autoshard::solver_error&) {
      continue;  // infeasible: nothing to copy
    }
    red.release_dead();
    const ad::reducer copy(red, ad::reducer::for_reading{});
    const ad::reduced_view a(red, red.binding_times), b(copy, copy.binding_times);
    REQUIRE(a.ilp_nodes == b.ilp_nodes);
    CHECK(a.times == b.times);
    CHECK(a.base == b.base);
    CHECK(a.segment == b.segment);
    for (std::size_t v : a.ilp_nodes) {
      REQUIRE(a.inc[v].size() == b.inc[v].size());
      CHECK(a.node(v).cost == b.node(v).cost);
      CHECK(a.node(v).strat == b.node(v).strat);
      for (std::size_t k = 0; k < a.inc[v].size(); ++k) CHECK(a.edge(a.inc[v][k].edge).m == b.edge(b.inc[v][k].edge).m);
    }
    // Every pick of the alive nodes unfolds to the same whole answer.
    for (int draw = 0; draw < 5; ++draw) {
      std::vector<int> x(p.nodes.size(), -1), y;
      for (std::size_t v : a.ilp_nodes) x[v] = red.nodes[v].strat[rng() % red.nodes[v].size()];
      y = x;
      red.unfold(x);
      copy.unfold(y);
      CHECK(x == y);
    }
    ad::reducer again(red, ad::reducer::for_reading{});
    CHECK_THROWS_WITH_AS(again.run(), "solver error: internal: a reducer copied for reading was asked to reduce", autoshard::solver_error);
    ++compared;
  }
  CHECK(compared > 60);
}

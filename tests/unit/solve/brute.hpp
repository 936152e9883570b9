#pragma once
// Exhaustive enumeration and random problems, shared by the solve tests. Enumeration is exact
// (strategy_problem::evaluate sums in 128-bit integers), so it is the cross-check for the solver.
#include <autoshard/solve/problem.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

namespace solve_test {

struct brute_result {
  std::optional<std::int64_t> best;  // none when no choice is feasible
  std::vector<int> choice;
};

/// Every choice, odometer order; keeps the cheapest feasible one (exact evaluation).
inline brute_result brute_force(const autoshard::strategy_problem& p) {
  brute_result r;
  std::vector<int> c(p.nodes.size(), 0);
  for (;;) {
    const autoshard::evaluation ev = p.evaluate(c);
    if (ev.feasible && (!r.best || ev.objective < *r.best)) {
      r.best = ev.objective;
      r.choice = c;
    }
    std::size_t v = 0;
    for (; v < c.size(); ++v) {
      if (++c[v] < static_cast<int>(p.nodes[v].costs.size())) break;
      c[v] = 0;
    }
    if (v == c.size()) break;
  }
  return r;
}

struct random_spec {
  int max_nodes = 10;
  int max_strategies = 4;
  long max_choices = 20000;  // product of strategy counts
  double p_inf = 0.03;       // chance that a cost is forbidden (1e18, or above it up to 2^62)
  /// Costs: 0..20 when false; else spread over 1..1e17 (log-uniform), some near 2^62 / 8.
  bool wide_costs = false;
  double p_follower = 0.0;  // chance that an edge is a follower/alias pattern (0 or 1e18)
};

/// A random problem: parallel, reversed and self edges included; usage limit left unset.
inline autoshard::strategy_problem random_problem(std::mt19937& rng, const random_spec& s) {
  autoshard::strategy_problem p;
  std::uniform_int_distribution<int> nn(1, s.max_nodes), ns(1, s.max_strategies), small(0, 20), t(0, 12),
      use(0, 10);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto cost = [&]() -> std::int64_t {
    if (unit(rng) < s.p_inf) {
      // The contest's infinity, or any larger int64: all forbid.
      const double k = unit(rng);
      return k < 0.5 ? autoshard::infinite_cost : autoshard::infinite_cost + static_cast<std::int64_t>(k * 3e18);
    }
    if (!s.wide_costs) return small(rng);
    const double k = unit(rng);
    if (k < 0.05) return (std::int64_t{1} << 59) + small(rng);  // near 2^62 / 8, still finite
    return static_cast<std::int64_t>(std::pow(10.0, 17.0 * unit(rng)));
  };
  const int n = nn(rng);
  long choices = 1;
  for (int v = 0; v < n; ++v) {
    int k = ns(rng);
    while (k > 1 && choices * k > s.max_choices) --k;
    choices *= k;
    autoshard::strategy_node node;
    for (int i = 0; i < k; ++i) {
      node.costs.push_back(cost());
      node.usages.push_back(use(rng));
    }
    int a = t(rng), b = t(rng);
    if (a > b) std::swap(a, b);
    node.live = {a, b};
    p.nodes.push_back(node);
  }
  std::uniform_int_distribution<int> ne(0, 2 * n), pick(0, n - 1);
  const int m = ne(rng);
  for (int e = 0; e < m; ++e) {
    autoshard::strategy_edge ed;
    ed.from = static_cast<std::size_t>(pick(rng));
    ed.to = static_cast<std::size_t>(pick(rng));
    const std::size_t su = p.nodes[ed.from].costs.size(), sv = p.nodes[ed.to].costs.size();
    if (unit(rng) < s.p_follower) {
      // Each strategy of `from` allows exactly one of `to` (XLA's follower and alias edges).
      std::uniform_int_distribution<std::size_t> target(0, sv - 1);
      ed.costs.assign(su * sv, autoshard::infinite_cost);
      for (std::size_t i = 0; i < su; ++i) ed.costs[i * sv + target(rng)] = 0;
    } else {
      for (std::size_t k = 0; k < su * sv; ++k) ed.costs.push_back(cost());
    }
    p.edges.push_back(ed);
  }
  return p;
}

/// Replace p's edges by a random tree (each node joins one earlier node) plus `extra` random
/// edges, each of which closes a cycle (or doubles an edge); costs 0..50.
inline void random_tree_edges(autoshard::strategy_problem& p, std::mt19937& rng, int extra) {
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
  std::uniform_int_distribution<std::size_t> any(0, p.nodes.size() - 1);
  for (int k = 0; k < extra; ++k) {
    const std::size_t a = any(rng), b = any(rng);
    if (a != b) link(a, b);
  }
}

/// A random problem without forbidden costs or a usage limit (up to `max_nodes` nodes of up to
/// 4 strategies) on a random tree plus `extra` random edges.
inline autoshard::strategy_problem random_tree_problem(std::mt19937& rng, int max_nodes, int extra) {
  random_spec spec;
  spec.p_inf = 0.0;
  spec.max_nodes = max_nodes;
  spec.max_strategies = 4;
  autoshard::strategy_problem p = random_problem(rng, spec);
  random_tree_edges(p, rng, extra);
  return p;
}

// A side x side grid of k strategies per node, frustrated random node and edge costs (0..1000)
// and no structure the reductions can use: its optimum takes the ILP seconds to prove.
inline autoshard::strategy_problem frustrated_grid(unsigned seed, int side = 14, int k = 5) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> c(0, 1000);
  autoshard::strategy_problem p;
  for (int v = 0; v < side * side; ++v) {
    autoshard::strategy_node n;
    for (int i = 0; i < k; ++i) n.costs.push_back(c(rng)), n.usages.push_back(0);
    p.nodes.push_back(n);
  }
  auto edge = [&](int a, int b) {
    autoshard::strategy_edge e{static_cast<std::size_t>(a), static_cast<std::size_t>(b), {}};
    for (int i = 0; i < k * k; ++i) e.costs.push_back(c(rng));
    p.edges.push_back(e);
  };
  for (int r = 0; r < side; ++r)
    for (int q = 0; q < side; ++q) {
      if (q + 1 < side) edge(r * side + q, r * side + q + 1);
      if (r + 1 < side) edge(r * side + q, (r + 1) * side + q);
    }
  return p;
}

}  // namespace solve_test

#pragma once
// Exhaustive enumeration and random problems, shared by the solve tests.
#include <autoshard/solve/problem.hpp>

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

namespace solve_test {

struct brute_result {
  std::optional<double> best;  // none when no choice is feasible
  std::vector<int> choice;
};

/// Every choice, odometer order; keeps the cheapest one within the usage limit.
inline brute_result brute_force(const autoshard::strategy_problem& p) {
  brute_result r;
  std::vector<int> c(p.nodes.size(), 0);
  for (;;) {
    const double cost = p.cost_of(c);
    if (cost < autoshard::infinite_cost && (!r.best || cost < *r.best) &&
        (!p.usage_limit || p.peak_usage(c).bytes <= *p.usage_limit)) {
      r.best = cost;
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
  double p_inf = 0.03;       // chance that a cost is infinite
  bool integer_costs = true;
};

/// A random problem: parallel, reversed and self edges included; usage limit left unset.
inline autoshard::strategy_problem random_problem(std::mt19937& rng, const random_spec& s) {
  autoshard::strategy_problem p;
  std::uniform_int_distribution<int> nn(1, s.max_nodes), ns(1, s.max_strategies), small(0, 20), t(0, 12),
      use(0, 10);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto cost = [&]() -> double {
    if (unit(rng) < s.p_inf) return autoshard::infinite_cost;
    return s.integer_costs ? small(rng) : unit(rng) * 1e-3;
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
    const std::size_t sz = p.nodes[ed.from].costs.size() * p.nodes[ed.to].costs.size();
    for (std::size_t k = 0; k < sz; ++k) ed.costs.push_back(cost());
    p.edges.push_back(ed);
  }
  return p;
}

}  // namespace solve_test

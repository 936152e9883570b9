#pragma once
/// The solver-level strategy problem: the shape of the ASPLOS 2025 IOPDDL contest, in seconds
/// (or any one cost unit) and bytes. Pick one strategy per node; pay its node cost, the edge
/// cost of every pair of picks, and keep the summed usage of the nodes live at each time point
/// within `usage_limit`.
///   autoshard::strategy_problem p;
///   p.nodes = {{"a", {1, 2}, {10, 5}, {0, 2}}, {"b", {3, 1}, {5, 5}, {1, 3}}};
///   p.edges = {{0, 1, {0, 4, 4, 0}}};                    // row-major |S_a| x |S_b|
///   p.usage_limit = 12;
///   double c = p.cost_of({1, 1});                         // 2 + 1 + 0
#include <algorithm>  // std::sort, std::max
#include <cmath>      // std::isnan, std::isinf
#include <cstddef>    // std::size_t
#include <cstdint>    // std::int64_t
#include <initializer_list>  // std::initializer_list
#include <limits>     // std::numeric_limits
#include <optional>   // std::optional
#include <span>       // std::span
#include <string>     // std::string
#include <utility>    // std::pair
#include <vector>     // std::vector

#include "../core/error.hpp"  // solver_error

namespace autoshard {

/// A strategy that must never be chosen (a spec that does not fit, a pinned tensor) costs this.
inline constexpr double infinite_cost = std::numeric_limits<double>::infinity();

/// Half-open range of discrete time points [begin, end) during which a node's tensor is live.
/// An empty interval (begin == end) never counts against the usage limit.
struct live_interval {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  constexpr bool empty() const noexcept { return end <= begin; }
  constexpr bool contains(std::int64_t t) const noexcept { return begin <= t && t < end; }
  friend constexpr bool operator==(const live_interval&, const live_interval&) = default;
};

/// One node: a cost and a memory usage per strategy, and when its usage is live.
struct strategy_node {
  std::string name;                  ///< optional, used in messages and plan files
  std::vector<double> costs;         ///< one per strategy; infinite_cost forbids a strategy
  std::vector<std::int64_t> usages;  ///< one per strategy, >= 0 (bytes per device)
  live_interval live;
  friend bool operator==(const strategy_node&, const strategy_node&) = default;
};

/// One edge: a cost for every pair of strategies of `from` and `to`, row-major
/// (`costs[i * |S_to| + j]` for strategy i of `from` and j of `to`). Parallel edges add up.
struct strategy_edge {
  std::size_t from = 0;
  std::size_t to = 0;
  std::vector<double> costs;
  friend bool operator==(const strategy_edge&, const strategy_edge&) = default;
};

/// Peak of the summed usage over time, and the first time point where it is reached.
struct usage_peak {
  std::int64_t bytes = 0;
  std::int64_t time = 0;
};

/// The whole problem. Plain data: build it, `validate()` it, hand it to `solve_ilp`.
struct strategy_problem {
  std::string name;
  std::vector<strategy_node> nodes;
  std::vector<strategy_edge> edges;
  std::optional<std::int64_t> usage_limit;  ///< per time point; none = unlimited

  friend bool operator==(const strategy_problem&, const strategy_problem&) = default;

  /// Throws solver_error naming the node or edge and the numbers when the problem is malformed.
  void validate() const {
    for (std::size_t v = 0; v < nodes.size(); ++v) {
      const strategy_node& n = nodes[v];
      if (n.costs.empty()) throw solver_error(node_label(v) + " has no strategy");
      if (n.usages.size() != n.costs.size())
        throw solver_error(node_label(v) + " has " + std::to_string(n.costs.size()) + " costs but " +
                           std::to_string(n.usages.size()) + " usages");
      if (n.live.end < n.live.begin)
        throw solver_error(node_label(v) + " has interval [" + std::to_string(n.live.begin) + ", " +
                           std::to_string(n.live.end) + ") with end before begin");
      for (std::size_t i = 0; i < n.costs.size(); ++i) {
        if (std::isnan(n.costs[i]) || n.costs[i] == -infinite_cost)
          throw solver_error(node_label(v) + " strategy " + std::to_string(i) + " has cost " +
                             std::to_string(n.costs[i]) + " (NaN and -inf are not costs)");
        if (n.usages[i] < 0)
          throw solver_error(node_label(v) + " strategy " + std::to_string(i) + " has negative usage " +
                             std::to_string(n.usages[i]));
      }
    }
    for (std::size_t e = 0; e < edges.size(); ++e) {
      const strategy_edge& ed = edges[e];
      if (ed.from >= nodes.size() || ed.to >= nodes.size())
        throw solver_error("edge " + std::to_string(e) + " [" + std::to_string(ed.from) + ", " +
                           std::to_string(ed.to) + "] names a node beyond the " + std::to_string(nodes.size()) +
                           " nodes");
      const std::size_t want = nodes[ed.from].costs.size() * nodes[ed.to].costs.size();
      if (ed.costs.size() != want)
        throw solver_error("edge " + std::to_string(e) + " [" + std::to_string(ed.from) + ", " +
                           std::to_string(ed.to) + "] has " + std::to_string(ed.costs.size()) +
                           " costs, expected " + std::to_string(nodes[ed.from].costs.size()) + "x" +
                           std::to_string(nodes[ed.to].costs.size()) + " = " + std::to_string(want));
      for (double c : ed.costs)
        if (std::isnan(c) || c == -infinite_cost)
          throw solver_error("edge " + std::to_string(e) + " [" + std::to_string(ed.from) + ", " +
                             std::to_string(ed.to) + "] has a NaN or -inf cost");
    }
    if (usage_limit && *usage_limit < 0)
      throw solver_error("usage_limit " + std::to_string(*usage_limit) + " is negative");
  }

  /// Total cost of one choice (strategy index per node); infinite_cost when a pick is forbidden.
  double cost_of(std::span<const int> choice) const {
    check_choice(choice);
    double total = 0.0;
    for (std::size_t v = 0; v < nodes.size(); ++v) total += nodes[v].costs[static_cast<std::size_t>(choice[v])];
    for (const strategy_edge& e : edges) {
      const std::size_t i = static_cast<std::size_t>(choice[e.from]);
      const std::size_t j = static_cast<std::size_t>(choice[e.to]);
      total += e.costs[i * nodes[e.to].costs.size() + j];
    }
    return total;
  }
  double cost_of(std::initializer_list<int> choice) const {
    return cost_of(std::span<const int>(choice.begin(), choice.size()));
  }

  /// Highest summed usage over time for one choice.
  usage_peak peak_usage(std::span<const int> choice) const {
    check_choice(choice);
    return peak_of([&](std::size_t v) { return nodes[v].usages[static_cast<std::size_t>(choice[v])]; });
  }

  /// The smallest peak any choice can reach: every node at its smallest usage among strategies
  /// with a finite cost. A usage_limit below it can never be met.
  usage_peak min_peak_usage() const {
    return peak_of([&](std::size_t v) {
      std::int64_t lo = std::numeric_limits<std::int64_t>::max();
      for (std::size_t i = 0; i < nodes[v].costs.size(); ++i)
        if (nodes[v].costs[i] < infinite_cost) lo = std::min(lo, nodes[v].usages[i]);
      return lo == std::numeric_limits<std::int64_t>::max() ? std::int64_t{0} : lo;
    });
  }

  /// "node 3 'attn.c_proj'" or "node 3".
  std::string node_label(std::size_t v) const {
    std::string s = "node " + std::to_string(v);
    if (v < nodes.size() && !nodes[v].name.empty()) s += " '" + nodes[v].name + "'";
    return s;
  }

 private:
  void check_choice(std::span<const int> choice) const {
    if (choice.size() != nodes.size())
      throw solver_error("a choice has " + std::to_string(choice.size()) + " entries for " +
                         std::to_string(nodes.size()) + " nodes");
    for (std::size_t v = 0; v < nodes.size(); ++v)
      if (choice[v] < 0 || static_cast<std::size_t>(choice[v]) >= nodes[v].costs.size())
        throw solver_error(node_label(v) + ": strategy " + std::to_string(choice[v]) + " out of range [0, " +
                           std::to_string(nodes[v].costs.size()) + ")");
  }

  template <class UsageOf>
  usage_peak peak_of(UsageOf usage_of) const {
    // Sweep: at equal times ends come first (half-open intervals).
    std::vector<std::pair<std::int64_t, std::int64_t>> events;
    events.reserve(2 * nodes.size());
    for (std::size_t v = 0; v < nodes.size(); ++v) {
      if (nodes[v].live.empty()) continue;
      const std::int64_t u = usage_of(v);
      events.emplace_back(nodes[v].live.begin, u);
      events.emplace_back(nodes[v].live.end, -u);
    }
    std::sort(events.begin(), events.end());
    usage_peak best;
    std::int64_t cur = 0;
    for (std::size_t k = 0; k < events.size();) {
      const std::int64_t t = events[k].first;
      for (; k < events.size() && events[k].first == t; ++k)
        if (__builtin_add_overflow(cur, events[k].second, &cur))
          throw solver_error("summed usage at time " + std::to_string(t) + " exceeds 2^63-1 bytes");
      if (cur > best.bytes) best = {cur, t};
    }
    return best;
  }
};

}  // namespace autoshard

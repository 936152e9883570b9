#pragma once
/// The solver-level strategy problem: the ASPLOS 2025 IOPDDL contest's problem, exactly. Pick one
/// strategy per node; pay its node cost and the edge cost of every pair of picks, and keep the
/// summed usage of the nodes live at each time point within `usage_limit`. Costs and usages are
/// int64; a cost >= `infinite_cost` (1e18, the contest's kInfinityInt) forbids that strategy or
/// pair and is never a term of the objective. The auto-sharding pass states seconds as integer
/// multiples of `cost_unit`.
///   autoshard::strategy_problem p;
///   p.nodes = {{"a", {1, 2}, {10, 5}, {0, 2}}, {"b", {3, 1}, {5, 5}, {1, 3}}};
///   p.edges = {{0, 1, {0, 4, 4, 0}}};                    // row-major |S_a| x |S_b|
///   p.usage_limit = 12;
///   std::int64_t c = p.cost_of({1, 1});                   // 2 + 1 + 0
///   autoshard::evaluation ev = p.evaluate(std::vector<int>{1, 1});   // ev.feasible, ev.why
#include <algorithm>  // std::sort, std::max
#include <cstddef>    // std::size_t
#include <cstdint>    // std::int64_t
#include <initializer_list>  // std::initializer_list
#include <limits>     // std::numeric_limits
#include <optional>   // std::optional
#include <span>       // std::span
#include <string>     // std::string
#include <utility>    // std::pair
#include <vector>     // std::vector

#include "../core/error.hpp"  // solver_error, quoted_text

namespace autoshard {

/// A cost at or above this forbids the strategy or the pair (the contest's kInfinityInt, 1e18).
inline constexpr std::int64_t infinite_cost = 1'000'000'000'000'000'000;

/// True when a node cost or an edge entry forbids that choice.
constexpr bool is_forbidden(std::int64_t cost) noexcept { return cost >= infinite_cost; }

/// Exact sums of int64 costs and usages (a total of many int64 terms can exceed int64).
__extension__ using int128 = __int128;

/// a + b for costs >= 0, forbidden when either is or when the sum reaches infinite_cost.
constexpr std::int64_t add_costs(std::int64_t a, std::int64_t b) noexcept {
  return is_forbidden(a) || is_forbidden(b) || a >= infinite_cost - b ? infinite_cost : a + b;
}

/// The unit for real-valued costs (seconds) whose largest finite value is `largest`: it maps
/// to 2^40 units (about 1e12), so sums of millions of costs stay far below infinite_cost and
/// each cost keeps 12 significant digits.
inline double cost_unit_for(double largest) {
  return largest > 0.0 && largest < std::numeric_limits<double>::infinity() ? largest / 1099511627776.0 : 1.0;
}

/// A real cost >= 0 in integer units: round(x / unit); infinity (a forbidden choice) and any
/// x whose units would reach infinite_cost become infinite_cost. Throws on NaN or x < 0.
inline std::int64_t to_cost_units(double x, double unit) {
  if (!(x >= 0.0)) throw solver_error("a cost of " + std::to_string(x) + " is not a cost (NaN or negative)");
  const double u = x / unit;
  return u >= 1e18 ? infinite_cost : static_cast<std::int64_t>(u + 0.5);
}

/// Decimal text of an int128 (std::to_string has no overload).
inline std::string to_decimal(int128 x) {
  if (x == 0) return "0";
  const bool neg = x < 0;
  std::string s;
  while (x != 0) {
    const int d = static_cast<int>(x % 10);
    s.push_back(static_cast<char>('0' + (neg ? -d : d)));
    x /= 10;
  }
  if (neg) s.push_back('-');
  return {s.rbegin(), s.rend()};
}

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
  std::vector<std::int64_t> costs;   ///< one per strategy, >= 0; >= infinite_cost forbids it
  std::vector<std::int64_t> usages;  ///< one per strategy, >= 0 (bytes per device)
  live_interval live;
  friend bool operator==(const strategy_node&, const strategy_node&) = default;
};

/// One edge: a cost for every pair of strategies of `from` and `to`, row-major
/// (`costs[i * |S_to| + j]` for strategy i of `from` and j of `to`). Parallel edges add up.
struct strategy_edge {
  std::size_t from = 0;
  std::size_t to = 0;
  std::vector<std::int64_t> costs;  ///< >= 0; >= infinite_cost forbids the pair
  friend bool operator==(const strategy_edge&, const strategy_edge&) = default;
};

/// Peak of the summed usage over time, and the first time point where it is reached.
struct usage_peak {
  std::int64_t bytes = 0;
  std::int64_t time = 0;
};

/// The exact verdict on one choice (google/iopddl's `Evaluate`): feasible when no pick is
/// forbidden, the usage limit holds at every time point and the total is below infinite_cost.
struct evaluation {
  bool feasible = false;
  std::int64_t objective = 0;  ///< exact total (meaningful when feasible)
  usage_peak peak;             ///< highest summed usage over time
  std::string why;             ///< when not feasible: the first reason, naming the node, edge or time
};

/// The whole problem. Plain data: build it, `validate()` it, hand it to `solve_ilp`.
struct strategy_problem {
  std::string name;
  std::vector<strategy_node> nodes;
  std::vector<strategy_edge> edges;
  std::optional<std::int64_t> usage_limit;  ///< per time point; none = unlimited
  /// What one cost unit is worth (the pass: seconds per unit); the solver never reads it.
  double cost_unit = 1.0;

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
        if (n.costs[i] < 0)
          throw solver_error(node_label(v) + " strategy " + std::to_string(i) + " has negative cost " +
                             std::to_string(n.costs[i]));
        if (n.usages[i] < 0)
          throw solver_error(node_label(v) + " strategy " + std::to_string(i) + " has negative usage " +
                             std::to_string(n.usages[i]));
      }
    }
    for (std::size_t e = 0; e < edges.size(); ++e) {
      const strategy_edge& ed = edges[e];
      if (ed.from >= nodes.size() || ed.to >= nodes.size())
        throw solver_error(edge_label(e) + " names a node beyond the " + std::to_string(nodes.size()) + " nodes");
      const std::size_t want = nodes[ed.from].costs.size() * nodes[ed.to].costs.size();
      if (ed.costs.size() != want)
        throw solver_error(edge_label(e) + " has " + std::to_string(ed.costs.size()) + " costs, expected " +
                           std::to_string(nodes[ed.from].costs.size()) + "x" +
                           std::to_string(nodes[ed.to].costs.size()) + " = " + std::to_string(want));
      for (std::size_t k = 0; k < ed.costs.size(); ++k)
        if (ed.costs[k] < 0)
          throw solver_error(edge_label(e) + " entry " + std::to_string(k) + " has negative cost " +
                             std::to_string(ed.costs[k]));
    }
    if (usage_limit && *usage_limit < 0)
      throw solver_error("usage_limit " + std::to_string(*usage_limit) + " is negative");
  }

  /// Exact total cost of one choice (strategy index per node), summed in 128 bits; infinite_cost
  /// when a pick is forbidden or the total reaches infinite_cost. Throws on a malformed choice.
  std::int64_t cost_of(std::span<const int> choice) const {
    check_choice(choice);
    int128 total = 0;
    for (std::size_t v = 0; v < nodes.size(); ++v) {
      const std::int64_t c = nodes[v].costs[static_cast<std::size_t>(choice[v])];
      if (is_forbidden(c)) return infinite_cost;
      total += c;
    }
    for (const strategy_edge& e : edges) {
      const std::int64_t c = e.costs[pair_index(e, choice)];
      if (is_forbidden(c)) return infinite_cost;
      total += c;
    }
    return total >= infinite_cost ? infinite_cost : static_cast<std::int64_t>(total);
  }
  std::int64_t cost_of(std::initializer_list<int> choice) const {
    return cost_of(std::span<const int>(choice.begin(), choice.size()));
  }

  /// Exact evaluation of one choice, as the contest scores it (see `evaluation`). Throws
  /// solver_error only for a malformed choice (wrong length, index out of range).
  evaluation evaluate(std::span<const int> choice) const {
    check_choice(choice);
    evaluation ev;
    int128 total = 0;
    for (std::size_t v = 0; v < nodes.size(); ++v) {
      const std::int64_t c = nodes[v].costs[static_cast<std::size_t>(choice[v])];
      if (is_forbidden(c)) {
        ev.why = node_label(v) + " strategy " + std::to_string(choice[v]) + " is forbidden (cost " +
                 std::to_string(c) + " >= 1e18)";
        return ev;
      }
      total += c;
    }
    for (std::size_t e = 0; e < edges.size(); ++e) {
      const std::size_t k = pair_index(edges[e], choice);
      const std::int64_t c = edges[e].costs[k];
      if (is_forbidden(c)) {
        ev.why = edge_label(e) + " pair (" + std::to_string(choice[edges[e].from]) + ", " +
                 std::to_string(choice[edges[e].to]) + ") is forbidden (cost " + std::to_string(c) + " >= 1e18)";
        return ev;
      }
      total += c;
    }
    if (total >= infinite_cost) {
      ev.why = "the total cost " + to_decimal(total) + " reaches the contest's infinity 1e18";
      return ev;
    }
    ev.objective = static_cast<std::int64_t>(total);
    ev.peak = peak_usage(choice);
    if (usage_limit && ev.peak.bytes > *usage_limit) {
      ev.why = "summed usage " + std::to_string(ev.peak.bytes) + " at time " + std::to_string(ev.peak.time) +
               " exceeds usage_limit " + std::to_string(*usage_limit);
      return ev;
    }
    ev.feasible = true;
    return ev;
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
      // No sentinel value: a usage of 2^63-1 is a usage (it was taken for "none allowed", 0).
      bool any = false;
      std::int64_t lo = 0;
      for (std::size_t i = 0; i < nodes[v].costs.size(); ++i)
        if (!is_forbidden(nodes[v].costs[i])) {
          lo = any ? std::min(lo, nodes[v].usages[i]) : nodes[v].usages[i];
          any = true;
        }
      return lo;
    });
  }

  /// Throws solver_error when no choice can be feasible whatever the usage limit: a node or an
  /// edge whose every cost is forbidden (>= 1e18), or cheapest costs that alone sum to the
  /// contest's infinity (a total reaching 1e18 is infinite).
  void check_costs_can_be_finite() const {
    const auto cheapest = [](const std::vector<std::int64_t>& costs) {
      std::int64_t lo = infinite_cost;
      for (const std::int64_t c : costs) lo = std::min(lo, c);
      return lo;
    };
    int128 total = 0;
    for (std::size_t v = 0; v < nodes.size(); ++v) {
      const std::int64_t c = cheapest(nodes[v].costs);
      if (is_forbidden(c)) throw solver_error(node_label(v) + ": every strategy is forbidden (cost >= 1e18): no choice is feasible");
      total += c;
    }
    for (std::size_t e = 0; e < edges.size(); ++e) {
      const std::int64_t c = cheapest(edges[e].costs);
      if (is_forbidden(c)) throw solver_error(edge_label(e) + ": every pair is forbidden (cost >= 1e18): no choice is feasible");
      total += c;
    }
    if (total >= infinite_cost)
      throw solver_error("no choice can be feasible: a total cost must stay below the contest's infinity, 1e18, but the "
                         "cheapest cost of every node and every edge alone sum to " + to_decimal(total) +
                         " (costs in one problem must sum to less than 1e18)");
  }

  /// "node 3 'attn.c_proj'" or "node 3".
  std::string node_label(std::size_t v) const {
    std::string s = "node " + std::to_string(v);
    if (v < nodes.size() && !nodes[v].name.empty()) s += " " + quoted_text(nodes[v].name);  // a name from the file
    return s;
  }

  /// "edge 4 [0, 1]".
  std::string edge_label(std::size_t e) const {
    return "edge " + std::to_string(e) + " [" + std::to_string(edges[e].from) + ", " + std::to_string(edges[e].to) +
           "]";
  }

 private:
  std::size_t pair_index(const strategy_edge& e, std::span<const int> choice) const {
    return static_cast<std::size_t>(choice[e.from]) * nodes[e.to].costs.size() + static_cast<std::size_t>(choice[e.to]);
  }

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

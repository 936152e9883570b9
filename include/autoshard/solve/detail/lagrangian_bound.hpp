#pragma once
// A proven lower bound on the reduced problem from prices on its memory rows (Lagrangian
// relaxation), in exact integers. For prices k_t >= 0 and every answer x within the limit,
//   cost(x) >= cost_F(x) + sum_t k_t (load_t(x) - limit) >= min_y [cost_F(y) + sum_t k_t load_t(y)]
//              - sum_t k_t limit,
// where cost_F keeps only a spanning forest's edges and every other edge at its smallest entry
// (all entries are >= 0 after the reductions, so that only lowers the cost); the minimum over y
// is one dynamic programming pass over the forest. The prices come from the heuristic's
// subgradient steps (doubles); they are rounded down to multiples of 2^-24 here, which leaves
// them >= 0 and so the bound valid, and everything after that is exact 128-bit arithmetic.
#include <cmath>     // std::floor, std::ldexp
#include <cstddef>   // std::size_t
#include <optional>  // std::optional
#include <vector>    // std::vector

#include "reduce.hpp"        // wcost, is_forbidden_w, int128
#include "reduced_view.hpp"  // reduced_view, spanning_forest

namespace autoshard::detail {

/// The bound in reduced units (the reducer's offset not included), `forbidden` when no choice
/// satisfies even the forest's forbidden entries, or nothing when a magnitude is too large to
/// state it exactly (finite costs from 2^70, a limit minus a time point's folded usage beyond
/// 2^70 either way, or a million nodes and more).
inline std::optional<wcost> lagrangian_bound(const reduced_view& rv, const spanning_forest& f,
                                             const std::vector<double>& lambda) {
  constexpr int shift = 24;                              // prices in units of 2^-24
  const int128 big = static_cast<int128>(1) << 70;       // finite costs stay below it
  const int128 inf = static_cast<int128>(1) << 125;      // a forbidden term; finite sums stay far below
  const std::size_t n = rv.red.nodes.size(), times = rv.times.size();
  if (rv.ilp_nodes.size() >= (std::size_t{1} << 20)) return std::nullopt;
  // Integer prices k_t = floor(lambda_t 2^24), their sum at most 2^40 (scaled down if needed).
  std::vector<int128> k(times, 0);
  if (rv.limit && lambda.size() == times) {
    double total = 0.0;
    for (double l : lambda) total += l > 0.0 ? l : 0.0;
    const double cap = std::ldexp(1.0, 40), scale = total * std::ldexp(1.0, shift) > cap
                                                         ? cap / (total * std::ldexp(1.0, shift))
                                                         : 1.0;
    for (std::size_t t = 0; t < times; ++t)
      if (lambda[t] > 0.0) k[t] = static_cast<int128>(std::floor(lambda[t] * scale * std::ldexp(1.0, shift)));
  }
  std::vector<int128> prefix(times + 1, 0);
  for (std::size_t t = 0; t < times; ++t) prefix[t + 1] = prefix[t] + k[t];
  const auto scaled = [&](wcost c) -> std::optional<int128> {
    if (is_forbidden_w(c)) return inf;
    if (c < 0 || c >= big) return std::nullopt;
    return c << shift;
  };
  const auto add = [&](int128 a, int128 b) { return a >= inf || b >= inf ? inf : a + b; };
  // The constant: the other edges at their smallest entry, minus the priced limit.
  int128 constant = 0;
  for (std::size_t e = 0; e < rv.red.edges.size(); ++e) {
    const work_edge& ed = rv.edge(e);
    if (!ed.alive || f.in_forest[e]) continue;
    wcost lo = forbidden;
    for (wcost c : ed.m) lo = c < lo ? c : lo;
    const std::optional<int128> s = scaled(lo);
    if (!s) return std::nullopt;
    if (*s >= inf) return forbidden;
    constant += *s;
  }
  if (rv.limit)
    for (std::size_t t = 0; t < times; ++t) {
      const int128 room = static_cast<int128>(*rv.limit) - rv.base[t];
      if (room >= big || room <= -big) return std::nullopt;
      constant -= k[t] * room;
    }
  // The forest's minimum with every node's usage priced: leaves up.
  std::vector<std::vector<int128>> best(n);
  for (std::size_t v : rv.ilp_nodes) {
    const work_node& nd = rv.node(v);
    best[v].resize(nd.size());
    for (std::size_t i = 0; i < nd.size(); ++i) {
      const std::optional<int128> s = scaled(nd.cost[i]);
      if (!s) return std::nullopt;
      int128 c = *s;
      for (const reduced_view::part_span& sp : rv.spans[v])
        c = add(c, (prefix[sp.b] - prefix[sp.a]) * nd.parts[sp.part].usage[i]);
      best[v][i] = c;
    }
  }
  for (auto it = f.seq.rbegin(); it != f.seq.rend(); ++it) {
    const std::size_t v = *it, par = f.parent[v];
    if (par == n) continue;
    for (std::size_t j = 0; j < best[par].size(); ++j) {
      int128 m = inf;
      for (std::size_t i = 0; i < best[v].size(); ++i) {
        const std::optional<int128> s = scaled(rv.entry(f.up[v], i, j));
        if (!s) return std::nullopt;
        const int128 c = add(best[v][i], *s);
        m = c < m ? c : m;
      }
      best[par][j] = add(best[par][j], m);
    }
  }
  int128 value = 0;
  for (std::size_t v : f.seq)
    if (f.parent[v] == n) {
      int128 m = inf;
      for (int128 c : best[v]) m = c < m ? c : m;
      value = add(value, m);
    }
  if (value >= inf) return forbidden;
  const int128 total = value + constant;  // the bound times 2^24
  if (total <= 0) return wcost{0};        // every reduced cost is >= 0 anyway
  const int128 unit = static_cast<int128>(1) << shift;
  return static_cast<wcost>((total + unit - 1) / unit);  // rounded up: every answer is an integer
}

}  // namespace autoshard::detail

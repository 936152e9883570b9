#pragma once
// The reduced problem as the heuristic, the Lagrangian bound and the ILP see it (the nodes with
// a choice left, their live edges, the candidate time points), and a maximum spanning forest of
// its edges for the dynamic programming over it.
#include <algorithm>  // std::lower_bound, std::sort, std::max
#include <cstddef>    // std::size_t
#include <cstdint>    // std::int64_t
#include <optional>   // std::optional
#include <utility>    // std::pair
#include <vector>     // std::vector

#include "reduce.hpp"  // reducer, wcost, work_node, work_edge

namespace autoshard::detail {

/// The reduced problem as the heuristic and the ILP see it: the nodes with a choice left, their
/// live edges, and the candidate time points where the usage limit can bind.
struct reduced_view {
  const reducer& red;
  std::vector<std::size_t> ilp_nodes;  // alive node ids, ascending
  struct incidence {
    std::size_t edge;
    bool is_u;
  };
  std::vector<std::vector<incidence>> inc;  // per node id
  std::optional<std::int64_t> limit;
  std::vector<std::int64_t> times;  // candidate time points, sorted
  std::vector<int128> base;         // per time: the usage of folded nodes there
  struct part_span {
    std::size_t part, a, b;  // time indices [a, b) this part of the node is live at
  };
  std::vector<std::vector<part_span>> spans;  // per node id
  struct span_end {
    std::size_t t, part;
    bool start;  // the part's span starts at time index t (else it ends there)
  };
  std::vector<std::vector<span_end>> ends;  // per node with several spans: their starts and ends, by time
  std::size_t leaves = 0;                       // of the segment tree over the time indices
  std::vector<std::vector<std::size_t>> segment;  // its nodes: the alive nodes whose spans cover them

  reduced_view(const reducer& r, std::vector<std::int64_t> candidate_times)
      : red(r), inc(r.nodes.size()), limit(r.p.usage_limit), spans(r.nodes.size()) {
    for (std::size_t v = 0; v < red.nodes.size(); ++v)
      if (red.nodes[v].alive) ilp_nodes.push_back(v);
    for (std::size_t e = 0; e < red.edges.size(); ++e)
      if (red.edges[e].alive) {
        inc[red.edges[e].u].push_back({e, true});
        inc[red.edges[e].v].push_back({e, false});
      }
    if (!limit) return;
    times = std::move(candidate_times);
    std::vector<int128> diff(times.size() + 1, 0);
    for (std::size_t v = 0; v < red.nodes.size(); ++v) {
      const work_node& n = red.nodes[v];
      for (std::size_t k = 0; k < n.parts.size(); ++k) {
        const auto [a, b] = range(n.parts[k].live);
        if (a == b) continue;
        if (n.alive) {
          spans[v].push_back({k, a, b});
        } else {
          diff[a] += n.parts[k].lo;
          diff[b] -= n.parts[k].lo;
        }
      }
    }
    ends.resize(red.nodes.size());
    for (std::size_t v = 0; v < red.nodes.size(); ++v) {
      if (spans[v].size() < 2) continue;
      for (const part_span& sp : spans[v]) ends[v].push_back({sp.a, sp.part, true}), ends[v].push_back({sp.b, sp.part, false});
      std::sort(ends[v].begin(), ends[v].end(), [](const span_end& x, const span_end& y) { return x.t < y.t; });
    }
    base.assign(times.size(), 0);
    int128 cur = 0;
    for (std::size_t t = 0; t < times.size(); ++t) cur += diff[t], base[t] = cur;
    // Each live span in the O(log T) segments of a segment tree that cover it.
    leaves = 1;
    while (leaves < times.size()) leaves *= 2;
    segment.resize(2 * leaves);
    for (std::size_t v : ilp_nodes)
      for (const part_span& s : spans[v])
        for (std::size_t lo = s.a + leaves, hi = s.b + leaves; lo < hi; lo /= 2, hi /= 2) {
          if (lo & 1) segment[lo++].push_back(v);
          if (hi & 1) segment[--hi].push_back(v);
        }
    for (std::vector<std::size_t>& l : segment) {
      std::sort(l.begin(), l.end());
      l.erase(std::unique(l.begin(), l.end()), l.end());
    }
  }

  /// The alive nodes with a live part at time index t, ascending, each once: O(log T + answer).
  std::vector<std::size_t> live_at(std::size_t t) const {
    std::vector<std::size_t> out;
    if (t >= times.size()) return out;
    for (std::size_t i = t + leaves; i >= 1; i /= 2) out.insert(out.end(), segment[i].begin(), segment[i].end());
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  /// Time indices [a, b) inside a live interval.
  std::pair<std::size_t, std::size_t> range(const live_interval& iv) const {
    if (iv.empty()) return {0, 0};
    const auto a = static_cast<std::size_t>(std::lower_bound(times.begin(), times.end(), iv.begin) - times.begin());
    const auto b = static_cast<std::size_t>(std::lower_bound(times.begin(), times.end(), iv.end) - times.begin());
    return {a, std::max(a, b)};
  }

  const work_node& node(std::size_t v) const { return red.nodes[v]; }
  const work_edge& edge(std::size_t e) const { return red.edges[e]; }
  std::size_t other(const incidence& in) const { return in.is_u ? edge(in.edge).v : edge(in.edge).u; }
  /// Entry of the incident edge for strategy i of its node and k of the other end.
  wcost entry(const incidence& in, std::size_t i, std::size_t k) const {
    const work_edge& e = edge(in.edge);
    const std::size_t nv = red.nodes[e.v].size();
    return in.is_u ? e.m[i * nv + k] : e.m[k * nv + i];
  }
};

/// A maximum spanning forest of the live edges (each weighted by its largest allowed entry),
/// each component ordered from a root by depth-first search: a parent comes before its children.
struct spanning_forest {
  std::vector<std::size_t> seq;                // the alive nodes, parents first
  std::vector<std::size_t> parent;             // per node id; the node count for a root
  std::vector<reduced_view::incidence> up;     // per node id: the edge to its parent, seen from it
  std::vector<char> in_forest;                 // per edge id

  explicit spanning_forest(const reduced_view& rv) {
    const std::size_t n = rv.red.nodes.size();
    parent.assign(n, n);
    up.resize(n);
    in_forest.assign(rv.red.edges.size(), 0);
    std::vector<std::pair<wcost, std::size_t>> order;  // (weight, edge)
    for (std::size_t e = 0; e < rv.red.edges.size(); ++e) {
      if (!rv.edge(e).alive) continue;
      wcost w = 0;
      for (wcost c : rv.edge(e).m)
        if (!is_forbidden_w(c)) w = std::max(w, c);
      order.emplace_back(w, e);
    }
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<std::size_t> root(n);
    for (std::size_t v = 0; v < n; ++v) root[v] = v;
    const auto find = [&](std::size_t v) {
      while (root[v] != v) v = root[v] = root[root[v]];
      return v;
    };
    std::vector<std::vector<reduced_view::incidence>> tree(n);
    for (const auto& [w, e] : order) {
      const std::size_t a = find(rv.edge(e).u), b = find(rv.edge(e).v);
      if (a == b) continue;
      root[a] = b;
      in_forest[e] = 1;
      tree[rv.edge(e).u].push_back({e, true});
      tree[rv.edge(e).v].push_back({e, false});
    }
    // Order each component from a root by depth-first search; parent edge per node.
    std::vector<char> seen(n, 0);
    for (std::size_t r : rv.ilp_nodes) {
      if (seen[r]) continue;
      std::vector<std::size_t> stack{r};
      seen[r] = 1;
      while (!stack.empty()) {
        const std::size_t v = stack.back();
        stack.pop_back();
        seq.push_back(v);
        for (const reduced_view::incidence& in : tree[v]) {
          const std::size_t w = rv.other(in);
          if (seen[w]) continue;
          seen[w] = 1;
          parent[w] = v;
          up[w] = {in.edge, !in.is_u};  // the edge as seen from w
          stack.push_back(w);
        }
      }
    }
  }
};

}  // namespace autoshard::detail

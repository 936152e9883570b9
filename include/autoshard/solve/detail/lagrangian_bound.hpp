#pragma once
// Proven lower bounds on the reduced problem from prices on its memory rows (Lagrangian
// relaxation), in exact integers. For prices k_t >= 0 and every answer x within the limit,
//   cost(x) >= cost(x) + sum_t k_t (load_t(x) - limit) >= min_y [cost(y) + sum_t k_t load_t(y)]
//              - sum_t k_t limit,
// and the minimum over y of the priced problem is bounded from below in one of two ways:
//   - lagrangian_bound: keep a spanning forest's edges and put every other edge at its smallest
//     entry (all entries are >= 0 after the reductions, so that only lowers the cost); the
//     minimum is one dynamic programming pass over the forest;
//   - chain_bound: any messages (detail/message_passing.hpp) define a reparametrisation of the
//     priced problem (node terms plus the messages into them, edge terms minus the messages out
//     of them: the same total for every y); split it into monotonic chains of the nodes' order,
//     each node's term shared between the chains through it, and the sum of the chains' exact
//     minima (dynamic programming along each) bounds the minimum. With TRW-S's messages it is
//     the bound TRW-S reports, the LP relaxation's dual of the priced problem.
// The prices and messages are doubles; they are rounded (prices down, so still >= 0) to
// multiples of 2^-24 here, which leaves the bounds valid (any messages do), and everything after
// that is exact 128-bit arithmetic, rounded up at the end (every answer is an integer).
#include <algorithm>  // std::find_if, std::max
#include <cmath>     // std::floor, std::ldexp, std::llround
#include <cstddef>   // std::size_t
#include <optional>  // std::optional
#include <vector>    // std::vector

#include "message_passing.hpp"  // message_passing
#include "reduce.hpp"           // wcost, is_forbidden_w, int128
#include "reduced_view.hpp"     // reduced_view, spanning_forest

namespace autoshard::detail {

/// The priced problem in exact integers (units of 2^-24): node terms with the usage priced,
/// and the constant -sum_t k_t (limit - folded usage at t). `ok` false when a magnitude is too
/// large to state a bound exactly (finite costs from 2^70, a limit minus a time point's folded
/// usage beyond 2^70 either way, or a million nodes and more).
struct priced_integers {
  static constexpr int shift = 24;
  static constexpr int128 big = static_cast<int128>(1) << 70;   // finite costs stay below it
  static constexpr int128 inf = static_cast<int128>(1) << 125;  // a forbidden term; finite sums stay far below
  bool ok = true;
  std::vector<std::vector<int128>> unary;  // per node id
  int128 constant = 0;

  static int128 add(int128 a, int128 b) { return a >= inf || b >= inf ? inf : a + b; }

  /// c in units of 2^-24, `inf` when forbidden, nothing when too large.
  static std::optional<int128> scaled(wcost c) {
    if (is_forbidden_w(c)) return inf;
    if (c < 0 || c >= big) return std::nullopt;
    return c << shift;
  }

  /// The bound from a total in units of 2^-24 (`forbidden` when it is infinite).
  static wcost rounded_up(int128 total) {
    if (total >= inf / 2) return forbidden;
    if (total <= 0) return wcost{0};  // every reduced cost is >= 0 anyway
    const int128 unit = static_cast<int128>(1) << shift;
    return static_cast<wcost>((total + unit - 1) / unit);
  }

  priced_integers(const reduced_view& rv, const std::vector<double>& lambda) : unary(rv.red.nodes.size()) {
    const std::size_t times = rv.times.size();
    if (rv.ilp_nodes.size() >= (std::size_t{1} << 20)) {
      ok = false;
      return;
    }
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
    if (rv.limit)
      for (std::size_t t = 0; t < times; ++t) {
        const int128 room = static_cast<int128>(*rv.limit) - rv.base[t];
        if (room >= big || room <= -big) {
          ok = false;
          return;
        }
        constant -= k[t] * room;
      }
    for (std::size_t v : rv.ilp_nodes) {
      const work_node& nd = rv.node(v);
      unary[v].resize(nd.size());
      for (std::size_t i = 0; i < nd.size(); ++i) {
        const std::optional<int128> s = scaled(nd.cost[i]);
        if (!s) {
          ok = false;
          return;
        }
        int128 c = *s;
        for (const reduced_view::part_span& sp : rv.spans[v])
          c = add(c, (prefix[sp.b] - prefix[sp.a]) * nd.parts[sp.part].usage[i]);
        unary[v][i] = c;
      }
    }
  }
};

/// The forest bound in reduced units (the reducer's offset not included), `forbidden` when no
/// choice satisfies even the forest's forbidden entries, or nothing when a magnitude is too
/// large to state it exactly (see priced_integers).
inline std::optional<wcost> lagrangian_bound(const reduced_view& rv, const spanning_forest& f,
                                             const std::vector<double>& lambda) {
  using pi = priced_integers;
  priced_integers terms(rv, lambda);
  if (!terms.ok) return std::nullopt;
  const std::size_t n = rv.red.nodes.size();
  // The other edges at their smallest entry.
  int128 constant = terms.constant;
  for (std::size_t e = 0; e < rv.red.edges.size(); ++e) {
    const work_edge& ed = rv.edge(e);
    if (!ed.alive || f.in_forest[e]) continue;
    wcost lo = forbidden;
    for (wcost c : ed.m) lo = c < lo ? c : lo;
    const std::optional<int128> s = pi::scaled(lo);
    if (!s) return std::nullopt;
    if (*s >= pi::inf) return forbidden;
    constant += *s;
  }
  // The forest's minimum with every node's usage priced: leaves up.
  std::vector<std::vector<int128>>& best = terms.unary;
  for (auto it = f.seq.rbegin(); it != f.seq.rend(); ++it) {
    const std::size_t v = *it, par = f.parent[v];
    if (par == n) continue;
    for (std::size_t j = 0; j < best[par].size(); ++j) {
      int128 m = pi::inf;
      for (std::size_t i = 0; i < best[v].size(); ++i) {
        const std::optional<int128> s = pi::scaled(rv.entry(f.up[v], i, j));
        if (!s) return std::nullopt;
        const int128 c = pi::add(best[v][i], *s);
        m = c < m ? c : m;
      }
      best[par][j] = pi::add(best[par][j], m);
    }
  }
  int128 value = 0;
  for (std::size_t v : f.seq)
    if (f.parent[v] == n) {
      int128 m = pi::inf;
      for (int128 c : best[v]) m = c < m ? c : m;
      value = pi::add(value, m);
    }
  if (value >= pi::inf) return forbidden;
  return pi::rounded_up(value + constant);
}

/// The chain bound of `messages` (any) for prices `lambda`, in reduced units, as
/// lagrangian_bound. The chains: each node pairs its k-th edge to an earlier node with its k-th
/// edge to a later one (in rv.ilp_nodes' order); a chain starts at an unpaired later edge and
/// ends at an unpaired earlier one, and a node without edges is a chain of its own. Each node's
/// reparametrised term is split between the max(earlier, later) chains through it (whole units
/// of 2^-24, the remainder to the first), so the chains' terms add up to the whole.
/// `stop` is asked every 1024 nodes (on the contest's largest requests the bound takes over a
/// second): once it says true, no bound (nothing) comes back.
template <class Stop = bool (*)()>
std::optional<wcost> chain_bound(const reduced_view& rv, const std::vector<double>& lambda, const message_passing& messages,
                                 const std::vector<std::size_t>& pos, Stop stop = [] { return false; }) {
  using pi = priced_integers;
  priced_integers terms(rv, lambda);
  if (!terms.ok) return std::nullopt;
  const std::size_t n = rv.red.nodes.size();
  const double unit = std::ldexp(1.0, pi::shift);
  const auto integer = [&](double m) -> int128 {  // any integers make a valid reparametrisation
    const double x = m * unit;
    return x > -9e18 && x < 9e18 ? static_cast<int128>(std::llround(x)) : 0;
  };
  // Each node's edges to earlier and later nodes, and its term with the messages into it.
  std::vector<std::vector<reduced_view::incidence>> before(n), after(n);
  std::vector<std::vector<int128>>& node = terms.unary;
  std::size_t visited = 0;
  const auto stopped = [&] { return (++visited & 1023) == 0 && stop(); };
  for (std::size_t v : rv.ilp_nodes) {
    if (stopped()) return std::nullopt;
    for (const reduced_view::incidence& in : rv.inc[v]) {
      (pos[rv.other(in)] < pos[v] ? before[v] : after[v]).push_back(in);
      const std::vector<double>& m = messages.message(in.edge, in.is_u);
      for (std::size_t i = 0; i < node[v].size(); ++i) node[v][i] = pi::add(node[v][i], integer(m[i]));
    }
  }
  // A node's share for its k-th chain.
  const auto share = [&](std::size_t v, std::size_t k, std::size_t i) {
    const int128 c = node[v][i];
    if (c >= pi::inf) return pi::inf;
    const auto parts = static_cast<int128>(std::max<std::size_t>(1, std::max(before[v].size(), after[v].size())));
    int128 q = c / parts, r = c % parts;
    if (r < 0) q -= 1, r += parts;  // floor division
    return k == 0 ? q + r : q;
  };
  // The reparametrised entry of edge `in` (seen from its node at strategy i, the other end at j).
  const auto edge_term = [&](const reduced_view::incidence& in, std::size_t i, std::size_t j) -> std::optional<int128> {
    const std::optional<int128> c = pi::scaled(rv.entry(in, i, j));
    if (!c) return std::nullopt;
    if (*c >= pi::inf) return pi::inf;
    return *c - integer(messages.message(in.edge, in.is_u)[i]) - integer(messages.message(in.edge, !in.is_u)[j]);
  };
  int128 value = 0;
  std::vector<int128> f, g;
  for (std::size_t v : rv.ilp_nodes) {
    if (stopped()) return std::nullopt;
    const std::size_t chains = std::max<std::size_t>(1, std::max(before[v].size(), after[v].size()));
    for (std::size_t k = before[v].size(); k < chains; ++k) {  // the chains that start at v
      f.resize(node[v].size());
      for (std::size_t i = 0; i < f.size(); ++i) f[i] = share(v, k, i);
      std::size_t at = v, slot = k;
      while (slot < after[at].size()) {
        const reduced_view::incidence out = after[at][slot];
        const std::size_t w = rv.other(out);
        const reduced_view::incidence in{out.edge, !out.is_u};  // the same edge seen from w
        slot = static_cast<std::size_t>(
            std::find_if(before[w].begin(), before[w].end(), [&](const reduced_view::incidence& b) { return b.edge == out.edge; }) -
            before[w].begin());
        g.assign(node[w].size(), pi::inf);
        for (std::size_t j = 0; j < g.size(); ++j) {
          int128 m = pi::inf;
          for (std::size_t i = 0; i < f.size(); ++i) {
            if (f[i] >= pi::inf) continue;
            const std::optional<int128> e = edge_term(in, j, i);
            if (!e) return std::nullopt;
            const int128 c = pi::add(f[i], *e);
            m = c < m ? c : m;
          }
          g[j] = pi::add(m, share(w, slot, j));
        }
        f.swap(g);
        at = w;
      }
      int128 m = pi::inf;
      for (int128 c : f) m = c < m ? c : m;
      value = pi::add(value, m);
    }
  }
  if (value >= pi::inf) return forbidden;
  return pi::rounded_up(value + terms.constant);
}

}  // namespace autoshard::detail

#pragma once
// Exact reductions of a strategy_problem before GLPK sees it. Costs are exact integers here
// (128 bits, so sums never overflow); a forbidden choice is `forbidden` and stays forbidden
// under every sum. Every step keeps the optimum:
//   merge parallel edges (and fold self-loops into node costs),
//   prune strategies with a forbidden node cost or a forbidden row/column in an edge,
//   merge followers and aliases: an edge whose allowed pairs map every strategy of one node to
//     exactly one strategy of the other makes the second node a function of the first, so the
//     first absorbs it (its costs, its other edges, and its usage as one more live part),
//   fold single-strategy nodes into their neighbours' costs,
//   normalise: each edge's row minima into the source's costs, column minima into the
//     target's, and each node's minimum into a constant offset, so every entry is >= 0 with a
//     zero in every row, column and node (all-zero edges vanish),
//   remove duplicate and dominated strategies (cost, usage where memory binds, every incident edge),
//   fold leaves (min_j c_leaf[j] + R[i][j] into the neighbour) and series nodes (a degree-2 node
//     becomes an edge min_j R_a[i][j] + c[j] + R_b[j][k]) when their usage never binds.
// A node's usage "binds" when it is live at a time point where the largest possible summed usage
// exceeds the limit; elsewhere its usage cannot change feasibility.
#include <algorithm>  // std::min, std::max, std::sort, std::lower_bound, std::any_of
#include <chrono>     // std::chrono::steady_clock
#include <cstddef>    // std::size_t
#include <cstdint>    // std::int64_t
#include <limits>     // std::numeric_limits
#include <string>     // std::string
#include <unordered_map>  // std::unordered_map
#include <utility>    // std::pair
#include <vector>     // std::vector

#include "../../core/error.hpp"  // solver_error
#include "../problem.hpp"        // strategy_problem, int128

namespace autoshard {

/// Size of the ILP at one stage of the reductions (marginal formulation).
struct ilp_size {
  std::string stage;           ///< "input", "merge parallel edges", ..., "ilp"
  std::size_t nodes = 0;       ///< nodes with a choice left
  std::size_t edges = 0;       ///< edges left
  std::size_t variables = 0;   ///< strategy + pair variables (allowed ones)
  std::size_t rows = 0;        ///< one-hot + marginal rows + memory rows over maximal live sets
  std::size_t memory_rows = 0; ///< of `rows`: maximal live sets where the usage limit can bind
};

namespace detail {

/// An exact cost inside the reductions; `forbidden` and above is a forbidden choice.
using wcost = int128;
inline constexpr wcost forbidden = static_cast<wcost>(1) << 100;
constexpr bool is_forbidden_w(wcost c) noexcept { return c >= forbidden; }
constexpr wcost wadd(wcost a, wcost b) noexcept { return a >= forbidden || b >= forbidden ? forbidden : a + b; }
inline wcost to_wcost(std::int64_t c) { return is_forbidden(c) ? forbidden : static_cast<wcost>(c); }

/// One live range of a node's usage: its own, or that of a follower it absorbed.
struct usage_part {
  live_interval live;
  std::vector<std::int64_t> usage;  // per strategy of the owning node
  std::int64_t lo = 0, hi = 0;      // once the node is folded: its range (for the binding test)
  std::size_t origin = 0;           // the original node whose live range this is: each is in one part
};

struct work_node {
  bool alive = true;
  std::vector<int> strat;            // original strategy indices still allowed
  std::vector<wcost> cost;
  std::vector<usage_part> parts;     // empty after being absorbed by another node
  std::vector<std::size_t> adj;      // edge ids (some may be dead)
  std::size_t size() const { return strat.size(); }
};

struct work_edge {
  bool alive = true;
  std::size_t u = 0, v = 0;  // u < v when merged; m is |S_u| x |S_v|
  std::vector<wcost> m;
  /// Entries of m that are not forbidden, kept as m changes (reducer::forbid_entry and every
  /// reduction), so a size needs no rescan of the tables.
  std::size_t allowed = 0;
};

inline std::size_t count_allowed(const std::vector<wcost>& m) {
  return static_cast<std::size_t>(std::count_if(m.begin(), m.end(), [](wcost c) { return !is_forbidden_w(c); }));
}

struct fold_record {
  enum class kind { fixed, leaf, series, follow } what = kind::fixed;
  std::size_t node = 0;
  int fixed = -1;              // kind::fixed: the original strategy
  std::size_t a = 0, b = 0;    // leaf and follow: node a decides; series: neighbours a, b
  std::size_t na = 0, nb = 0;  // original strategy counts of a and b (table dims)
  std::vector<int> table;      // leaf, follow: [orig a] -> orig; series: [orig a * nb + orig b] -> orig
};

/// A node lost its last strategy: the problem as given has no feasible choice, or (after
/// strategies were forbidden because only a cheaper answer than a known one was wanted) no
/// answer is cheaper than that one.
class no_strategy_left : public solver_error {
 public:
  using solver_error::solver_error;
};

inline std::int64_t min_of(const std::vector<std::int64_t>& u) { return *std::min_element(u.begin(), u.end()); }
inline std::int64_t max_of(const std::vector<std::int64_t>& u) { return *std::max_element(u.begin(), u.end()); }

class reducer {
 public:
  const strategy_problem& p;
  std::vector<work_node> nodes;
  std::vector<work_edge> edges;
  std::vector<fold_record> records;
  std::vector<ilp_size> sizes;
  wcost offset = 0;
  bool merge = true;

  // ---- what changed since a reduction last looked ------------------------------------------
  // version[v] grows whenever node v's strategies, costs or usage, or one of its edges, change
  // (touch). A reduction that found nothing to do at a node (or edge) notes the clock then, and
  // skips it while its version (or both ends') is no newer: the same test on the same data
  // finds nothing again. Later rounds and the passes after a tightening then cost only what
  // changed.
  std::vector<std::uint64_t> version;
  std::uint64_t changes = 1;  // the clock of touch()
  struct seen_marks {
    std::vector<std::uint64_t> at;  // by node or edge: the clock when it was last found clean
    bool clean(std::size_t k, std::uint64_t v) const { return k < at.size() && at[k] >= v; }
    void mark(std::size_t k, std::uint64_t now) {
      if (at.size() <= k) at.resize(k + 1, 0);
      at[k] = now;
    }
  };
  seen_marks pruned, undominated, normalised, no_follower;
  std::vector<char> undominated_mem;  // coupled(v) when v was last found clean of dominated strategies
  bool skip_unchanged = true;  ///< false: every reduction looks at everything each time (the tests compare)

  // ---- when to stop --------------------------------------------------------------------------
  /// The reductions stop here, reduced or not (solve_ilp gives them part of its time limit):
  /// each one changes a node or an edge at a time and leaves the problem whole, so a problem
  /// reduced part-way has the same answers, only more of them left for the search.
  std::chrono::steady_clock::time_point stop_at = std::chrono::steady_clock::time_point::max();
  bool out_of_time_ = false;  // stop_at has passed
  bool cut_short = false;     ///< some run of the reductions stopped at stop_at, before a fixed point
  /// Whether stop_at has passed; looked at on every 1024th item of a loop (`k`).
  bool out_of_time(std::size_t k = 0) {
    if (!out_of_time_ && (k & 1023) == 0 && std::chrono::steady_clock::now() >= stop_at) out_of_time_ = true;
    return out_of_time_;
  }
  /// The reductions from now on stop at `t`.
  void stop_reducing_at(std::chrono::steady_clock::time_point t) {
    stop_at = t;
    out_of_time_ = false;
  }

  void touch(std::size_t v) { version[v] = ++changes; }
  bool read_only_ = false;  // a copy for_reading
  void check_reducible() const {
    if (read_only_) throw solver_error("internal: a reducer copied for reading was asked to reduce");
  }
  bool unchanged(const seen_marks& s, std::size_t k, std::uint64_t v) const { return skip_unchanged && s.clean(k, v); }
  std::uint64_t edge_version(const work_edge& e) const { return std::max(version[e.u], version[e.v]); }

  /// The problem's strategies less those of a forbidden node cost (none can be chosen; a node
  /// with no other keeps them all, for prune_infinite to refuse in its words): a solve the pass
  /// restricted to one algo's few strategies of each node's dozens copies only their pairs.
  reducer(const strategy_problem& prob, bool merge_parallel) : p(prob), merge(merge_parallel) {
    nodes.resize(p.nodes.size());
    version.assign(p.nodes.size(), 1);
    edge_at.reserve(p.edges.size());
    undominated_mem.assign(p.nodes.size(), 0);
    for (std::size_t v = 0; v < p.nodes.size(); ++v) {
      work_node& n = nodes[v];
      const strategy_node& s = p.nodes[v];
      const bool any = std::any_of(s.costs.begin(), s.costs.end(), [](std::int64_t c) { return !is_forbidden(c); });
      std::vector<std::int64_t> usage;
      for (std::size_t i = 0; i < s.costs.size(); ++i)
        if (!any || !is_forbidden(s.costs[i])) {
          n.strat.push_back(static_cast<int>(i));
          n.cost.push_back(to_wcost(s.costs[i]));
          usage.push_back(s.usages[i]);
        }
      n.parts.push_back({s.live, std::move(usage), 0, 0, v});
    }
    for (const strategy_edge& e : p.edges) {
      const std::size_t nu = nodes[e.from].size(), nv = nodes[e.to].size();
      const std::vector<int>&su = nodes[e.from].strat, &sv = nodes[e.to].strat;
      const std::size_t cols = p.nodes[e.to].costs.size();  // e.costs is over every strategy
      if (e.from == e.to) {  // a self-loop only ever pays its diagonal
        for (std::size_t i = 0; i < nu; ++i)
          nodes[e.from].cost[i] = wadd(nodes[e.from].cost[i], to_wcost(e.costs[static_cast<std::size_t>(su[i]) * cols + static_cast<std::size_t>(su[i])]));
        continue;
      }
      std::vector<wcost> m;
      m.reserve(nu * nv);
      for (std::size_t i = 0; i < nu; ++i)
        for (std::size_t j = 0; j < nv; ++j)
          m.push_back(to_wcost(e.costs[static_cast<std::size_t>(su[i]) * cols + static_cast<std::size_t>(sv[j])]));
      if (merge) {
        connect(e.from, e.to, std::move(m));
      } else {
        add_edge(e.from, e.to, std::move(m));
      }
    }
  }

  /// A copy for reading only (the search's snapshot, detail/portfolio.hpp): what reduced_view
  /// and unfold read, the alive nodes and edges, the folded nodes' usage ranges, the records
  /// and the offset, without what only the reductions use (the edge index, the change marks,
  /// the nodes' edge lists, a folded node's strategies and costs). At the contest's largest
  /// sizes that is millions of allocations fewer to copy, and to free. Reducing it throws.
  struct for_reading {};
  reducer(const reducer& o, for_reading)
      : p(o.p), nodes(o.nodes.size()), edges(o.edges), records(o.records), offset(o.offset), merge(o.merge),
        cut_short(o.cut_short), read_only_(true), binding_times(o.binding_times) {
    for (std::size_t v = 0; v < nodes.size(); ++v) {
      const work_node& from = o.nodes[v];
      work_node& to = nodes[v];
      to.alive = from.alive;
      if (from.alive) {
        to.strat = from.strat;
        to.cost = from.cost;
        to.parts = from.parts;
        continue;
      }
      to.parts.reserve(from.parts.size());  // a folded node's ranges count at their lo (reduced_view::base)
      for (const usage_part& pt : from.parts) to.parts.push_back({pt.live, {}, pt.lo, pt.hi, pt.origin});
    }
  }

  static std::vector<wcost> transpose(const std::vector<wcost>& m, std::size_t r, std::size_t c) {
    std::vector<wcost> t(m.size());
    for (std::size_t i = 0; i < r; ++i)
      for (std::size_t j = 0; j < c; ++j) t[j * r + i] = m[i * c + j];
    return t;
  }

  /// The live edge between two nodes, by key(min, max): found in constant time whatever the
  /// nodes' degrees (a node of 200,000 edges made scanning its list quadratic). An entry whose
  /// edge has died since is stale, and counts as none.
  std::unordered_map<std::uint64_t, std::size_t> edge_at;
  std::uint64_t pair_key(std::size_t a, std::size_t b) const {
    return static_cast<std::uint64_t>(std::min(a, b)) * nodes.size() + std::max(a, b);
  }

  std::size_t add_edge(std::size_t u, std::size_t v, std::vector<wcost> m) {
    const std::size_t allowed = count_allowed(m);
    edge_at[pair_key(u, v)] = edges.size();
    edges.push_back({true, u, v, std::move(m), allowed});
    touch(u);
    touch(v);
    nodes[u].adj.push_back(edges.size() - 1);
    nodes[v].adj.push_back(edges.size() - 1);
    return edges.size() - 1;
  }

  /// Add the cost matrix m (|S_a| x |S_b|) between a != b: into the live a-b edge if there is
  /// one, else as a new edge oriented u < v.
  void connect(std::size_t a, std::size_t b, std::vector<wcost> m) {
    const std::size_t u = std::min(a, b), v = std::max(a, b);
    if (u != a) m = transpose(m, nodes[a].size(), nodes[b].size());
    if (const auto it = edge_at.find(pair_key(u, v)); it != edge_at.end()) {
      work_edge& ed = edges[it->second];
      if (ed.alive && ed.u == u && ed.v == v) {
        for (std::size_t k = 0; k < m.size(); ++k) ed.m[k] = wadd(ed.m[k], m[k]);
        ed.allowed = count_allowed(ed.m);
        touch(u);
        touch(v);
        return;
      }
    }
    add_edge(u, v, std::move(m));
  }

  std::vector<std::size_t> live_edges(std::size_t v) {
    std::vector<std::size_t>& a = nodes[v].adj;
    std::erase_if(a, [&](std::size_t e) { return !edges[e].alive; });
    return a;
  }

  /// Entry of edge `ed` for strategy i of node `x` and k of the other end.
  wcost entry(const work_edge& ed, std::size_t x, std::size_t i, std::size_t k) const {
    const std::size_t nv = nodes[ed.v].size();
    return ed.u == x ? ed.m[i * nv + k] : ed.m[k * nv + i];
  }

  // ---- memory: which time points can bind --------------------------------------------------
  std::vector<std::int64_t> binding_times;  // sorted start times where the max summed usage > limit

  // Every part keeps its original node's live range (parts only move between nodes), so the
  // ranges are sorted once, by begin and by end, and each sweep below is linear.
  std::vector<std::size_t> by_begin, by_end;  // original nodes with a live range

  void sort_ranges() {
    if (!by_begin.empty() || !by_end.empty()) return;
    for (std::size_t o = 0; o < p.nodes.size(); ++o)
      if (!p.nodes[o].live.empty()) by_begin.push_back(o);
    by_end = by_begin;
    std::stable_sort(by_begin.begin(), by_begin.end(),
                     [&](std::size_t a, std::size_t b) { return p.nodes[a].live.begin < p.nodes[b].live.begin; });
    std::stable_sort(by_end.begin(), by_end.end(),
                     [&](std::size_t a, std::size_t b) { return p.nodes[a].live.end < p.nodes[b].live.end; });
  }

  void update_binding() {
    binding_times.clear();
    if (!p.usage_limit) return;
    sort_ranges();
    std::vector<std::int64_t> hi(p.nodes.size(), 0);  // by original node: its part's largest usage
    for (const work_node& n : nodes)
      for (const usage_part& pt : n.parts)
        if (!pt.live.empty()) hi[pt.origin] = n.alive ? max_of(pt.usage) : pt.hi;
    // At each time point: the ranges that end there leave, those that begin there enter; the
    // point binds when one entered with a positive usage and the sum is above the limit.
    int128 cur = 0;
    for (std::size_t i = 0, j = 0; i < by_begin.size() || j < by_end.size();) {
      const std::int64_t t = i == by_begin.size() ? p.nodes[by_end[j]].live.end
                             : j == by_end.size() ? p.nodes[by_begin[i]].live.begin
                                                  : std::min(p.nodes[by_begin[i]].live.begin, p.nodes[by_end[j]].live.end);
      bool starts = false;
      for (; j < by_end.size() && p.nodes[by_end[j]].live.end == t; ++j) {
        cur -= hi[by_end[j]];
        starts = starts || hi[by_end[j]] < 0;
      }
      for (; i < by_begin.size() && p.nodes[by_begin[i]].live.begin == t; ++i) {
        cur += hi[by_begin[i]];
        starts = starts || hi[by_begin[i]] > 0;
      }
      if (starts && cur > *p.usage_limit) binding_times.push_back(t);
    }
  }

  bool live_at_binding(const live_interval& iv) const {
    if (iv.empty()) return false;
    auto it = std::lower_bound(binding_times.begin(), binding_times.end(), iv.begin);
    return it != binding_times.end() && *it < iv.end;
  }

  /// Its usage can change feasibility: it varies and the node is live where the limit can bind.
  bool coupled(std::size_t v) const {
    if (!p.usage_limit) return false;
    for (const usage_part& pt : nodes[v].parts)
      if (min_of(pt.usage) != max_of(pt.usage) && live_at_binding(pt.live)) return true;
    return false;
  }

  // ---- strategy removal ----------------------------------------------------------------------
  void restrict_to(std::size_t v, const std::vector<char>& keep) {
    work_node& n = nodes[v];
    const std::size_t old = n.size();
    for (std::size_t e : live_edges(v)) {
      work_edge& ed = edges[e];
      const std::size_t nu = nodes[ed.u].size(), nv = nodes[ed.v].size();
      std::vector<wcost> m;
      for (std::size_t i = 0; i < nu; ++i)
        for (std::size_t j = 0; j < nv; ++j)
          if ((ed.u != v || keep[i]) && (ed.v != v || keep[j])) m.push_back(ed.m[i * nv + j]);
      ed.m = std::move(m);
      ed.allowed = count_allowed(ed.m);
      touch(ed.u == v ? ed.v : ed.u);
    }
    touch(v);
    std::size_t w = 0;
    for (std::size_t i = 0; i < old; ++i)
      if (keep[i]) {
        n.strat[w] = n.strat[i];
        n.cost[w] = n.cost[i];
        for (usage_part& pt : n.parts) pt.usage[w] = pt.usage[i];
        ++w;
      }
    n.strat.resize(w);
    n.cost.resize(w);
    for (usage_part& pt : n.parts) pt.usage.resize(w);
    if (w == 0) throw no_strategy_left(p.node_label(v) + ": every strategy is forbidden (infinite cost)");
  }

  // Strategies with a forbidden node cost, or forbidden against every strategy of a neighbour.
  bool prune_infinite() {
    bool changed = false, again = true;
    while (again) {
      again = false;
      for (std::size_t v = 0; v < nodes.size(); ++v) {
        if (out_of_time(v)) return changed;
        if (!nodes[v].alive || unchanged(pruned, v, version[v])) continue;
        work_node& n = nodes[v];
        std::vector<char> keep(n.size(), 1);
        for (std::size_t i = 0; i < n.size(); ++i) keep[i] = !is_forbidden_w(n.cost[i]);
        for (std::size_t e : live_edges(v)) {
          const work_edge& ed = edges[e];
          const std::size_t other = nodes[ed.u == v ? ed.v : ed.u].size();
          for (std::size_t i = 0; i < n.size(); ++i) {
            bool any = false;
            for (std::size_t k = 0; k < other && !any; ++k) any = !is_forbidden_w(entry(ed, v, i, k));
            if (!any) keep[i] = 0;
          }
        }
        if (std::find(keep.begin(), keep.end(), 0) != keep.end()) {
          restrict_to(v, keep);
          changed = again = true;
        } else {
          pruned.mark(v, changes);
        }
      }
    }
    return changed;
  }

  void kill_node(std::size_t v) {
    work_node& n = nodes[v];
    n.alive = false;
    for (usage_part& pt : n.parts) pt.lo = min_of(pt.usage), pt.hi = max_of(pt.usage);
    touch(v);
  }

  // A single-strategy node adds its edge rows to its neighbours and leaves.
  bool fold_singletons() {
    bool changed = false;
    for (std::size_t v = 0; v < nodes.size() && !out_of_time(v); ++v) {
      if (!nodes[v].alive || nodes[v].size() != 1) continue;
      for (std::size_t e : live_edges(v)) {
        work_edge& ed = edges[e];
        const std::size_t w = ed.u == v ? ed.v : ed.u;
        for (std::size_t k = 0; k < nodes[w].size(); ++k) nodes[w].cost[k] = wadd(nodes[w].cost[k], ed.m[k]);
        ed.alive = false;
        touch(w);
      }
      offset = wadd(offset, nodes[v].cost[0]);
      records.push_back({fold_record::kind::fixed, v, nodes[v].strat[0], 0, 0, 0, 0, {}});
      kill_node(v);
      changed = true;
    }
    return changed;
  }

  /// The map k -> the only allowed strategy of `to` for strategy k of `from` over edge ed, or
  /// empty when some strategy of `from` allows more than one.
  std::vector<std::size_t> function_of(const work_edge& ed, std::size_t from) const {
    const std::size_t to = ed.u == from ? ed.v : ed.u;
    std::vector<std::size_t> f(nodes[from].size());
    for (std::size_t i = 0; i < f.size(); ++i) {
      std::size_t count = 0;
      for (std::size_t k = 0; k < nodes[to].size(); ++k)
        if (!is_forbidden_w(entry(ed, from, i, k))) f[i] = k, ++count;
      if (count != 1) return {};
    }
    return f;
  }

  /// Node `x` takes strategy f[i] whenever `a` takes i: `a` absorbs x's costs, edges and usage.
  void absorb(std::size_t a, std::size_t x, std::size_t via, const std::vector<std::size_t>& f) {
    work_node &na = nodes[a], &nx = nodes[x];
    fold_record r{fold_record::kind::follow, x, -1, a, 0, orig_count(a), 0, {}};
    r.table.assign(orig_count(a), -1);
    for (std::size_t i = 0; i < na.size(); ++i) {
      na.cost[i] = wadd(na.cost[i], wadd(entry(edges[via], a, i, f[i]), nx.cost[f[i]]));
      r.table[static_cast<std::size_t>(na.strat[i])] = nx.strat[f[i]];
    }
    edges[via].alive = false;
    for (usage_part& pt : nx.parts) {
      usage_part moved{pt.live, {}, 0, 0, pt.origin};
      for (std::size_t i = 0; i < na.size(); ++i) moved.usage.push_back(pt.usage[f[i]]);
      na.parts.push_back(std::move(moved));
    }
    nx.parts.clear();  // its usage now lives in a's parts
    for (std::size_t e : live_edges(x)) {
      work_edge& ed = edges[e];
      const std::size_t w = ed.u == x ? ed.v : ed.u;
      std::vector<wcost> m(na.size() * nodes[w].size());
      for (std::size_t i = 0; i < na.size(); ++i)
        for (std::size_t k = 0; k < nodes[w].size(); ++k) m[i * nodes[w].size() + k] = entry(ed, x, f[i], k);
      ed.alive = false;
      connect(a, w, std::move(m));
    }
    nx.alive = false;
    touch(a);
    touch(x);
    records.push_back(std::move(r));
  }

  // Followers and aliases: an edge that makes one end a function of the other merges them, when
  // the re-indexed edges of the absorbed node are no larger than the ones removed.
  bool merge_followers() {
    bool changed = false;
    for (std::size_t e = 0; e < edges.size() && !out_of_time(e); ++e) {
      if (!edges[e].alive || unchanged(no_follower, e, edge_version(edges[e]))) continue;
      bool merged = false;
      for (const bool from_u : {true, false}) {
        const std::size_t a = from_u ? edges[e].u : edges[e].v, x = from_u ? edges[e].v : edges[e].u;
        const std::vector<std::size_t> f = function_of(edges[e], a);
        if (f.empty()) continue;
        // Before: sa sx + sx W, after: sa W, W the strategies of x's other neighbours summed;
        // after > before iff (sa - sx) W > sa sx. Only when sa > sx can it grow, and then the
        // sum stops as soon as it does: bounded work whatever x's degree.
        const std::size_t sa = nodes[a].size(), sx = nodes[x].size();
        bool grows = false;
        if (sa > sx) {
          std::size_t W = 0;
          for (std::size_t k : nodes[x].adj) {
            if (k == e || !edges[k].alive) continue;
            W += nodes[edges[k].u == x ? edges[k].v : edges[k].u].size();
            if ((sa - sx) * W > sa * sx) {
              grows = true;
              break;
            }
          }
        }
        if (grows) continue;
        absorb(a, x, e, f);
        changed = merged = true;
        break;
      }
      if (!merged) no_follower.mark(e, changes);
    }
    return changed;
  }

  // Row minima into u's costs, column minima into v's, node minima into the offset; an all-zero
  // matrix disappears.
  bool normalise() {
    bool changed = false;
    auto shift = [&](auto&& at, std::size_t count, wcost& into) {
      wcost lo = forbidden;
      for (std::size_t k = 0; k < count; ++k) lo = std::min(lo, at(k));
      if (lo == 0 || is_forbidden_w(lo)) return false;
      for (std::size_t k = 0; k < count; ++k)
        if (!is_forbidden_w(at(k))) at(k) -= lo;
      into = wadd(into, lo);
      return changed = true;
    };
    // One pass leaves every row and column with a zero (a column with a row's zero is not
    // shifted), so an edge whose ends did not change since is skipped.
    for (std::size_t e = 0; e < edges.size() && !out_of_time(e); ++e) {
      work_edge& ed = edges[e];
      if (!ed.alive || unchanged(normalised, e, edge_version(ed))) continue;
      work_node &a = nodes[ed.u], &b = nodes[ed.v];
      const std::size_t nu = a.size(), nv = b.size();
      bool shifted = false;
      for (std::size_t i = 0; i < nu; ++i)
        shifted = shift([&](std::size_t j) -> wcost& { return ed.m[i * nv + j]; }, nv, a.cost[i]) || shifted;
      for (std::size_t j = 0; j < nv; ++j)
        shifted = shift([&](std::size_t i) -> wcost& { return ed.m[i * nv + j]; }, nu, b.cost[j]) || shifted;
      if (std::all_of(ed.m.begin(), ed.m.end(), [](wcost x) { return x == 0; })) {
        ed.alive = false;
        changed = shifted = true;
      }
      if (shifted) {
        touch(ed.u);
        touch(ed.v);
      }
      normalised.mark(e, changes);
    }
    for (std::size_t v = 0; v < nodes.size(); ++v)
      if (nodes[v].alive && shift([&](std::size_t i) -> wcost& { return nodes[v].cost[i]; }, nodes[v].size(), offset)) touch(v);
    return changed;
  }

  // Strategy b goes when some a is no worse on cost, on usage (where memory binds) and against
  // every strategy of every neighbour; of equal strategies the first stays.
  bool remove_dominated() {
    bool changed = false;
    for (std::size_t v = 0; v < nodes.size() && !out_of_time(v); ++v) {
      if (!nodes[v].alive || nodes[v].size() < 2) continue;
      const bool mem = coupled(v);
      if (unchanged(undominated, v, version[v]) && undominated_mem[v] == static_cast<char>(mem)) continue;
      const work_node& n = nodes[v];
      const std::size_t s = n.size();
      const std::vector<std::size_t> es = live_edges(v);
      // Compared in place, no copy: most pairs differ in their first entries.
      const auto le = [&](std::size_t a, std::size_t b) {
        if (!(n.cost[a] <= n.cost[b])) return false;
        if (mem)
          for (const usage_part& pt : n.parts)
            if (!(pt.usage[a] <= pt.usage[b])) return false;
        for (std::size_t e : es) {
          const work_edge& ed = edges[e];
          if (ed.u == v) {  // rows a and b
            const std::size_t nv = nodes[ed.v].size();
            const wcost *ra = ed.m.data() + a * nv, *rb = ed.m.data() + b * nv;
            for (std::size_t k = 0; k < nv; ++k)
              if (!(ra[k] <= rb[k])) return false;
          } else {  // columns a and b
            const std::size_t nu = nodes[ed.u].size();
            const wcost* m = ed.m.data();
            for (std::size_t k = 0; k < nu; ++k, m += s)
              if (!(m[a] <= m[b])) return false;
          }
        }
        return true;
      };
      std::vector<char> keep(s, 1);
      for (std::size_t b = 0; b < s; ++b)
        for (std::size_t a = 0; a < s && keep[b]; ++a)
          if (a != b && keep[a] && le(a, b) && (a < b || !le(b, a))) keep[b] = 0;
      if (std::find(keep.begin(), keep.end(), 0) != keep.end()) {
        restrict_to(v, keep);
        changed = true;
      } else {
        undominated.mark(v, changes);
        undominated_mem[v] = static_cast<char>(mem);
      }
    }
    return changed;
  }

  std::size_t orig_count(std::size_t v) const { return p.nodes[v].costs.size(); }

  // Degree 0 and 1 nodes whose usage never binds.
  bool fold_leaves() {
    bool changed = false;
    for (std::size_t v = 0; v < nodes.size() && !out_of_time(v); ++v) {
      if (!nodes[v].alive || coupled(v)) continue;
      const std::vector<std::size_t> es = live_edges(v);
      work_node& n = nodes[v];
      if (es.empty()) {
        std::size_t best = 0;
        for (std::size_t i = 1; i < n.size(); ++i)
          if (n.cost[i] < n.cost[best]) best = i;
        offset = wadd(offset, n.cost[best]);
        records.push_back({fold_record::kind::fixed, v, n.strat[best], 0, 0, 0, 0, {}});
        kill_node(v);
        changed = true;
        continue;
      }
      if (es.size() != 1) continue;
      work_edge& ed = edges[es[0]];
      const std::size_t w = ed.u == v ? ed.v : ed.u;
      work_node& nb = nodes[w];
      fold_record r{fold_record::kind::leaf, v, -1, w, 0, orig_count(w), 0, {}};
      r.table.assign(orig_count(w), -1);
      for (std::size_t i = 0; i < nb.size(); ++i) {
        wcost best = forbidden;
        std::size_t arg = 0;
        for (std::size_t j = 0; j < n.size(); ++j) {
          const wcost c = wadd(n.cost[j], entry(ed, w, i, j));
          if (c < best) best = c, arg = j;
        }
        nb.cost[i] = wadd(nb.cost[i], best);
        r.table[static_cast<std::size_t>(nb.strat[i])] = n.strat[arg];
      }
      ed.alive = false;
      touch(w);
      records.push_back(std::move(r));
      kill_node(v);
      changed = true;
    }
    return changed;
  }

  // Degree-2 nodes whose usage never binds become an edge between their neighbours, when
  // that edge is no larger than the two it replaces.
  bool fold_series() {
    bool changed = false;
    for (std::size_t x = 0; x < nodes.size() && !out_of_time(x); ++x) {
      if (!nodes[x].alive || coupled(x)) continue;
      const std::vector<std::size_t> es = live_edges(x);
      if (es.size() != 2) continue;
      const work_edge &e1 = edges[es[0]], &e2 = edges[es[1]];
      const std::size_t a = e1.u == x ? e1.v : e1.u, b = e2.u == x ? e2.v : e2.u;
      if (a == b) continue;  // parallel pair: cannot happen once merged
      const std::size_t sa = nodes[a].size(), sb = nodes[b].size(), sx = nodes[x].size();
      if (sa * sb > sa * sx + sx * sb) continue;
      fold_record r{fold_record::kind::series, x, -1, a, b, orig_count(a), orig_count(b), {}};
      r.table.assign(r.na * r.nb, -1);
      std::vector<wcost> m(sa * sb, forbidden);
      const work_node& n = nodes[x];
      for (std::size_t i = 0; i < sa; ++i)
        for (std::size_t k = 0; k < sb; ++k) {
          wcost best = forbidden;
          std::size_t arg = 0;
          for (std::size_t j = 0; j < sx; ++j) {
            const wcost c = wadd(wadd(entry(e1, a, i, j), n.cost[j]), entry(e2, b, k, j));
            if (c < best) best = c, arg = j;
          }
          m[i * sb + k] = best;
          r.table[static_cast<std::size_t>(nodes[a].strat[i]) * r.nb + static_cast<std::size_t>(nodes[b].strat[k])] =
              n.strat[arg];
        }
      edges[es[0]].alive = false;
      edges[es[1]].alive = false;
      records.push_back(std::move(r));
      kill_node(x);
      connect(a, b, std::move(m));
      changed = true;
    }
    return changed;
  }

  // ---- sizes -----------------------------------------------------------------------------------
  /// Memory rows that would be written: maximal sets of simultaneously live parts with a choice,
  /// at time points where the limit can bind.
  std::size_t count_memory_rows() const {
    if (!p.usage_limit || binding_times.empty()) return 0;
    std::vector<char> alive(p.nodes.size(), 0);  // by original node: its part is a live node's
    for (const work_node& n : nodes)
      if (n.alive)
        for (const usage_part& pt : n.parts) alive[pt.origin] = 1;
    std::vector<std::int64_t> ends;  // sorted, as by_end is (update_binding filled it)
    for (std::size_t o : by_end)
      if (alive[o]) ends.push_back(p.nodes[o].live.end);
    std::size_t rows = 0;
    for (std::size_t k = 0; k < binding_times.size(); ++k) {
      // Maximal iff some interval ends after this time and no later than the next binding time.
      const std::int64_t t = binding_times[k];
      const std::int64_t next =
          k + 1 < binding_times.size() ? binding_times[k + 1] : std::numeric_limits<std::int64_t>::max();
      auto it = std::upper_bound(ends.begin(), ends.end(), t);
      if (it != ends.end() && *it <= next) ++rows;
    }
    return rows;
  }

  /// Free the tables of the edges the reductions removed (nothing reads them again).
  void release_dead() {
    for (work_edge& e : edges)
      if (!e.alive) std::vector<wcost>().swap(e.m);
  }

  void record_size(std::string stage) {
    ilp_size s;
    s.stage = std::move(stage);
    for (const work_node& n : nodes)
      if (n.alive) {
        ++s.nodes;
        s.variables += n.size();
        s.rows += 1;
      }
    for (const work_edge& e : edges)
      if (e.alive) {
        ++s.edges;
        s.variables += e.allowed;
        s.rows += nodes[e.u].size() + nodes[e.v].size();
      }
    s.memory_rows = count_memory_rows();
    s.rows += s.memory_rows;
    sizes.push_back(std::move(s));
  }

  /// Forbid every node cost and edge entry above `cap`. With every entry >= 0 and the offset a
  /// lower bound, a choice that pays one of them costs more than offset + cap: for cap = (a known
  /// answer) - offset no cheaper answer is lost. False when nothing was above.
  bool forbid_above(wcost cap) {
    bool changed = false;
    for (std::size_t v = 0; v < nodes.size(); ++v)
      if (nodes[v].alive)
        for (wcost& c : nodes[v].cost)
          if (!is_forbidden_w(c) && c > cap) c = forbidden, changed = true, touch(v);
    for (work_edge& e : edges)
      if (e.alive)
        for (wcost& c : e.m)
          if (!is_forbidden_w(c) && c > cap) c = forbidden, --e.allowed, changed = true, touch(e.u), touch(e.v);
    return changed;
  }

  /// Forbid entry k of edge e (a pair no cheaper answer takes).
  void forbid_entry(std::size_t e, std::size_t k) {
    wcost& c = edges[e].m[k];
    if (is_forbidden_w(c)) return;
    c = forbidden;
    --edges[e].allowed;
    touch(edges[e].u);
    touch(edges[e].v);
  }

  /// Forbid strategy i of node v (no cheaper answer takes it).
  void forbid_cost(std::size_t v, std::size_t i) {
    if (is_forbidden_w(nodes[v].cost[i])) return;
    nodes[v].cost[i] = forbidden;
    touch(v);
  }

  /// Whether every live edge's count of allowed entries matches its table (for the tests).
  bool counts_consistent() const {
    for (const work_edge& e : edges)
      if (e.alive && e.allowed != count_allowed(e.m)) return false;
    return true;
  }

  /// Run every reduction to a fixed point, recording the size after each one that changed something.
  void run() {
    check_reducible();
    update_binding();
    record_size("merge parallel edges");
    if (prune_infinite()) record_size("prune infinite");
    run_rounds();
  }

  /// After a known answer of reduced objective `answer`: forbid what costs more, reduce again.
  void tighten(wcost answer) {
    check_reducible();
    if (!forbid_above(answer - offset)) return;
    record_size("forbid costs above the heuristic's answer");
    if (prune_infinite()) {
      update_binding();
      record_size("prune infinite");
    }
    run_rounds();
  }

  void run_rounds() {
    for (int round = 1;; ++round) {
      bool any = false;
      const auto step = [&](const char* name, bool changed) {
        if (changed) {
          update_binding();
          record_size(std::string(name) + " (round " + std::to_string(round) + ")");
          any = true;
        }
      };
      step("merge followers and aliases", merge_followers());
      step("prune infinite", prune_infinite());
      step("fold single-strategy nodes", fold_singletons());
      step("prune infinite", prune_infinite());
      step("normalise edges", normalise());
      step("remove dominated strategies", remove_dominated());
      step("fold leaves", fold_leaves());
      step("fold series nodes", fold_series());
      if (!any) break;
    }
    if (out_of_time_ && !cut_short) {
      cut_short = true;
      record_size("stopped: the time for reductions ran out");
    }
  }

  /// Fill in every folded node of `choice` (original strategy indices; ILP nodes already set).
  void unfold(std::vector<int>& choice) const {
    for (auto it = records.rbegin(); it != records.rend(); ++it) {
      const fold_record& r = *it;
      switch (r.what) {
        case fold_record::kind::fixed: choice[r.node] = r.fixed; break;
        case fold_record::kind::leaf:
        case fold_record::kind::follow: choice[r.node] = r.table[static_cast<std::size_t>(choice[r.a])]; break;
        case fold_record::kind::series:
          choice[r.node] =
              r.table[static_cast<std::size_t>(choice[r.a]) * r.nb + static_cast<std::size_t>(choice[r.b])];
          break;
      }
      if (choice[r.node] < 0) throw solver_error("internal: unfolding " + p.node_label(r.node) + " found no strategy");
    }
  }
};

}  // namespace detail
}  // namespace autoshard

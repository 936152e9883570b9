#pragma once
// Exact reductions of a strategy_problem before GLPK sees it. Every step keeps the optimum:
//   merge parallel edges (and fold self-loops into node costs),
//   prune strategies with an infinite node cost or an all-infinite row/column in an edge,
//   fold single-strategy nodes into their neighbours' costs,
//   normalise edges (row minima into the source's costs, column minima into the target's,
//     so every matrix is >= 0 with a zero in every row and column; all-zero edges vanish),
//   remove duplicate and dominated strategies (cost, usage where memory binds, every incident edge),
//   fold leaves (min_j c_leaf[j] + R[i][j] into the neighbour) and series nodes (a degree-2 node
//     becomes an edge min_j R_a[i][j] + c[j] + R_b[j][k]) when their usage never binds.
// A node's usage "binds" when it is live at a time point where the largest possible summed usage
// exceeds the limit; elsewhere its usage cannot change feasibility.
#include <algorithm>  // std::min, std::max, std::sort, std::lower_bound
#include <cstddef>    // std::size_t
#include <cstdint>    // std::int64_t
#include <limits>     // std::numeric_limits
#include <map>        // std::map
#include <optional>   // std::optional
#include <string>     // std::string
#include <utility>    // std::pair
#include <vector>     // std::vector

#include "../../core/error.hpp"  // solver_error
#include "../problem.hpp"        // strategy_problem

namespace autoshard {

/// Size of the ILP at one stage of the reductions (marginal formulation).
struct ilp_size {
  std::string stage;           ///< "input", "merge parallel edges", ..., "ilp"
  std::size_t nodes = 0;       ///< nodes with a choice left
  std::size_t edges = 0;       ///< edges left
  std::size_t variables = 0;   ///< strategy + pair variables
  std::size_t rows = 0;        ///< one-hot + marginal rows + memory rows over maximal live sets
  std::size_t memory_rows = 0; ///< of `rows`: time points where the usage limit can bind
};

namespace detail {

struct work_node {
  bool alive = true;
  std::vector<int> strat;            // original strategy indices still allowed
  std::vector<double> cost;
  std::vector<std::int64_t> usage;
  live_interval live;
  std::vector<std::size_t> adj;      // edge ids (some may be dead)
  // Once folded: its usage range at fold time (for the binding test) and whether it is constant.
  std::int64_t lo = 0, hi = 0;
  std::size_t size() const { return strat.size(); }
};

struct work_edge {
  bool alive = true;
  std::size_t u = 0, v = 0;  // u < v when merged; m is |S_u| x |S_v|
  std::vector<double> m;
};

struct fold_record {
  enum class kind { fixed, leaf, series } what = kind::fixed;
  std::size_t node = 0;
  int fixed = -1;              // kind::fixed: the original strategy
  std::size_t a = 0, b = 0;    // leaf: neighbour a; series: neighbours a, b
  std::size_t na = 0, nb = 0;  // original strategy counts of a and b (table dims)
  std::vector<int> table;      // leaf: [orig a] -> orig; series: [orig a * nb + orig b] -> orig
};

class reducer {
 public:
  const strategy_problem& p;
  std::vector<work_node> nodes;
  std::vector<work_edge> edges;
  std::vector<fold_record> records;
  std::vector<ilp_size> sizes;
  double offset = 0.0;
  bool merge = true;

  reducer(const strategy_problem& prob, bool merge_parallel) : p(prob), merge(merge_parallel) {
    nodes.resize(p.nodes.size());
    for (std::size_t v = 0; v < p.nodes.size(); ++v) {
      work_node& n = nodes[v];
      const strategy_node& s = p.nodes[v];
      n.cost = s.costs;
      n.usage = s.usages;
      n.live = s.live;
      for (std::size_t i = 0; i < s.costs.size(); ++i) n.strat.push_back(static_cast<int>(i));
    }
    std::map<std::pair<std::size_t, std::size_t>, std::size_t> seen;
    for (const strategy_edge& e : p.edges) {
      const std::size_t nu = nodes[e.from].size(), nv = nodes[e.to].size();
      if (e.from == e.to) {  // a self-loop only ever pays its diagonal
        for (std::size_t i = 0; i < nu; ++i) nodes[e.from].cost[i] += e.costs[i * nv + i];
        continue;
      }
      std::size_t u = e.from, v = e.to;
      std::vector<double> m = e.costs;
      if (merge && u > v) {
        std::swap(u, v);
        m = transpose(e.costs, nu, nv);
      }
      if (merge) {
        auto [it, fresh] = seen.try_emplace({u, v}, edges.size());
        if (!fresh) {
          std::vector<double>& into = edges[it->second].m;
          for (std::size_t k = 0; k < into.size(); ++k) into[k] += m[k];
          continue;
        }
      }
      add_edge(u, v, std::move(m));
    }
  }

  static std::vector<double> transpose(const std::vector<double>& m, std::size_t r, std::size_t c) {
    std::vector<double> t(m.size());
    for (std::size_t i = 0; i < r; ++i)
      for (std::size_t j = 0; j < c; ++j) t[j * r + i] = m[i * c + j];
    return t;
  }

  std::size_t add_edge(std::size_t u, std::size_t v, std::vector<double> m) {
    edges.push_back({true, u, v, std::move(m)});
    nodes[u].adj.push_back(edges.size() - 1);
    nodes[v].adj.push_back(edges.size() - 1);
    return edges.size() - 1;
  }

  std::vector<std::size_t> live_edges(std::size_t v) {
    std::vector<std::size_t>& a = nodes[v].adj;
    std::erase_if(a, [&](std::size_t e) { return !edges[e].alive; });
    return a;
  }

  // ---- memory: which time points can bind --------------------------------------------------
  std::vector<std::int64_t> binding_times;  // sorted start times where the max summed usage > limit

  void update_binding() {
    binding_times.clear();
    if (!p.usage_limit) return;
    std::vector<std::pair<std::int64_t, std::int64_t>> ev;
    for (std::size_t v = 0; v < nodes.size(); ++v) {
      const work_node& n = nodes[v];
      if (n.live.empty()) continue;
      const std::int64_t hi = n.alive ? max_usage(n) : n.hi;
      ev.emplace_back(n.live.begin, hi);
      ev.emplace_back(n.live.end, -hi);
    }
    std::sort(ev.begin(), ev.end());
    std::int64_t cur = 0;
    for (std::size_t k = 0; k < ev.size();) {
      const std::int64_t t = ev[k].first;
      bool starts = false;
      for (; k < ev.size() && ev[k].first == t; ++k) {
        cur += ev[k].second;
        starts = starts || ev[k].second > 0;
      }
      if (starts && cur > *p.usage_limit) binding_times.push_back(t);
    }
  }

  static std::int64_t max_usage(const work_node& n) { return *std::max_element(n.usage.begin(), n.usage.end()); }
  static std::int64_t min_usage(const work_node& n) { return *std::min_element(n.usage.begin(), n.usage.end()); }

  bool live_at_binding(const live_interval& iv) const {
    if (iv.empty()) return false;
    auto it = std::lower_bound(binding_times.begin(), binding_times.end(), iv.begin);
    return it != binding_times.end() && *it < iv.end;
  }

  /// Its usage can change feasibility: it varies and the node is live where the limit can bind.
  bool coupled(std::size_t v) const {
    const work_node& n = nodes[v];
    return p.usage_limit && min_usage(n) != max_usage(n) && live_at_binding(n.live);
  }

  // ---- strategy removal ----------------------------------------------------------------------
  void restrict_to(std::size_t v, const std::vector<char>& keep) {
    work_node& n = nodes[v];
    const std::size_t old = n.size();
    for (std::size_t e : live_edges(v)) {
      work_edge& ed = edges[e];
      const std::size_t nu = nodes[ed.u].size(), nv = nodes[ed.v].size();
      std::vector<double> m;
      for (std::size_t i = 0; i < nu; ++i)
        for (std::size_t j = 0; j < nv; ++j)
          if ((ed.u != v || keep[i]) && (ed.v != v || keep[j])) m.push_back(ed.m[i * nv + j]);
      ed.m = std::move(m);
    }
    std::size_t w = 0;
    for (std::size_t i = 0; i < old; ++i)
      if (keep[i]) {
        n.strat[w] = n.strat[i];
        n.cost[w] = n.cost[i];
        n.usage[w] = n.usage[i];
        ++w;
      }
    n.strat.resize(w);
    n.cost.resize(w);
    n.usage.resize(w);
    if (w == 0) throw solver_error(p.node_label(v) + ": every strategy is forbidden (infinite cost)");
  }

  // Strategies with an infinite node cost, or infinite against every strategy of a neighbour.
  bool prune_infinite() {
    bool changed = false, again = true;
    while (again) {
      again = false;
      for (std::size_t v = 0; v < nodes.size(); ++v) {
        if (!nodes[v].alive) continue;
        work_node& n = nodes[v];
        std::vector<char> keep(n.size(), 1);
        for (std::size_t i = 0; i < n.size(); ++i) keep[i] = n.cost[i] < infinite_cost;
        for (std::size_t e : live_edges(v)) {
          const work_edge& ed = edges[e];
          const std::size_t nu = nodes[ed.u].size(), nv = nodes[ed.v].size();
          for (std::size_t i = 0; i < n.size(); ++i) {
            bool any = false;
            for (std::size_t k = 0; k < (ed.u == v ? nv : nu) && !any; ++k)
              any = (ed.u == v ? ed.m[i * nv + k] : ed.m[k * nv + i]) < infinite_cost;
            if (!any) keep[i] = 0;
          }
        }
        if (std::find(keep.begin(), keep.end(), 0) != keep.end()) {
          restrict_to(v, keep);
          changed = again = true;
        }
      }
    }
    return changed;
  }

  void kill_node(std::size_t v) {
    work_node& n = nodes[v];
    n.alive = false;
    n.lo = min_usage(n);
    n.hi = max_usage(n);
  }

  // A single-strategy node adds its edge rows to its neighbours and leaves.
  bool fold_singletons() {
    bool changed = false;
    for (std::size_t v = 0; v < nodes.size(); ++v) {
      if (!nodes[v].alive || nodes[v].size() != 1) continue;
      for (std::size_t e : live_edges(v)) {
        work_edge& ed = edges[e];
        const std::size_t w = ed.u == v ? ed.v : ed.u;
        for (std::size_t k = 0; k < nodes[w].size(); ++k) nodes[w].cost[k] += ed.m[k];  // one row or column
        ed.alive = false;
      }
      offset += nodes[v].cost[0];
      records.push_back({fold_record::kind::fixed, v, nodes[v].strat[0], 0, 0, 0, 0, {}});
      kill_node(v);
      changed = true;
    }
    return changed;
  }

  // Row minima into u's costs, column minima into v's; an all-zero matrix disappears.
  bool normalise_edges() {
    bool changed = false;
    for (work_edge& ed : edges) {
      if (!ed.alive) continue;
      work_node &a = nodes[ed.u], &b = nodes[ed.v];
      const std::size_t nu = a.size(), nv = b.size();
      for (std::size_t i = 0; i < nu; ++i) {
        double lo = infinite_cost;
        for (std::size_t j = 0; j < nv; ++j) lo = std::min(lo, ed.m[i * nv + j]);
        if (lo == 0.0 || lo == infinite_cost) continue;
        for (std::size_t j = 0; j < nv; ++j) ed.m[i * nv + j] -= lo;
        a.cost[i] += lo;
        changed = true;
      }
      for (std::size_t j = 0; j < nv; ++j) {
        double lo = infinite_cost;
        for (std::size_t i = 0; i < nu; ++i) lo = std::min(lo, ed.m[i * nv + j]);
        if (lo == 0.0 || lo == infinite_cost) continue;
        for (std::size_t i = 0; i < nu; ++i) ed.m[i * nv + j] -= lo;
        b.cost[j] += lo;
        changed = true;
      }
      if (std::all_of(ed.m.begin(), ed.m.end(), [](double x) { return x == 0.0; })) {
        ed.alive = false;
        changed = true;
      }
    }
    return changed;
  }

  // Strategy b goes when some a is no worse on cost, on usage (where memory binds) and against
  // every strategy of every neighbour; of equal strategies the first stays.
  bool remove_dominated() {
    bool changed = false;
    for (std::size_t v = 0; v < nodes.size(); ++v) {
      if (!nodes[v].alive || nodes[v].size() < 2) continue;
      const work_node& n = nodes[v];
      const std::size_t s = n.size();
      const bool mem = coupled(v);
      std::vector<std::vector<double>> sig(s);
      for (std::size_t i = 0; i < s; ++i) {
        sig[i].push_back(n.cost[i]);
        if (mem) sig[i].push_back(static_cast<double>(n.usage[i]));
      }
      for (std::size_t e : live_edges(v)) {
        const work_edge& ed = edges[e];
        const std::size_t nv = nodes[ed.v].size(), nu = nodes[ed.u].size();
        for (std::size_t i = 0; i < s; ++i) {
          if (ed.u == v)
            for (std::size_t k = 0; k < nv; ++k) sig[i].push_back(ed.m[i * nv + k]);
          else
            for (std::size_t k = 0; k < nu; ++k) sig[i].push_back(ed.m[k * nv + i]);
        }
      }
      auto le = [&](std::size_t a, std::size_t b) {
        for (std::size_t k = 0; k < sig[a].size(); ++k)
          if (!(sig[a][k] <= sig[b][k])) return false;
        return true;
      };
      std::vector<char> keep(s, 1);
      for (std::size_t b = 0; b < s; ++b)
        for (std::size_t a = 0; a < s && keep[b]; ++a)
          if (a != b && keep[a] && le(a, b) && (a < b || !le(b, a))) keep[b] = 0;
      if (std::find(keep.begin(), keep.end(), 0) != keep.end()) {
        if (mem) {  // a removed strategy with a unique usage must not be the only one fitting
          // (dominance already required usage[a] <= usage[b], so nothing to check)
        }
        restrict_to(v, keep);
        changed = true;
      }
    }
    return changed;
  }

  std::size_t orig_count(std::size_t v) const { return p.nodes[v].costs.size(); }

  // Degree 0 and 1 nodes whose usage never binds.
  bool fold_leaves() {
    bool changed = false;
    for (std::size_t v = 0; v < nodes.size(); ++v) {
      if (!nodes[v].alive || coupled(v)) continue;
      const std::vector<std::size_t> es = live_edges(v);
      work_node& n = nodes[v];
      if (es.empty()) {
        std::size_t best = 0;
        for (std::size_t i = 1; i < n.size(); ++i)
          if (n.cost[i] < n.cost[best]) best = i;
        offset += n.cost[best];
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
      const std::size_t nu = nodes[ed.u].size(), nv = nodes[ed.v].size();
      for (std::size_t i = 0; i < nb.size(); ++i) {
        double best = infinite_cost;
        std::size_t arg = 0;
        for (std::size_t j = 0; j < n.size(); ++j) {
          const double r_ij = ed.u == w ? ed.m[i * nv + j] : ed.m[j * nv + i];
          if (n.cost[j] + r_ij < best) best = n.cost[j] + r_ij, arg = j;
        }
        nb.cost[i] += best;
        r.table[static_cast<std::size_t>(nb.strat[i])] = n.strat[arg];
      }
      (void)nu;
      ed.alive = false;
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
    for (std::size_t x = 0; x < nodes.size(); ++x) {
      if (!nodes[x].alive || coupled(x)) continue;
      const std::vector<std::size_t> es = live_edges(x);
      if (es.size() != 2) continue;
      const work_edge &e1 = edges[es[0]], &e2 = edges[es[1]];
      const std::size_t a = e1.u == x ? e1.v : e1.u, b = e2.u == x ? e2.v : e2.u;
      if (a == b) continue;  // parallel pair: cannot happen once merged
      const std::size_t sa = nodes[a].size(), sb = nodes[b].size(), sx = nodes[x].size();
      if (sa * sb > sa * sx + sx * sb) continue;
      auto r_a = [&](std::size_t i, std::size_t j) {  // a's strategy i, x's strategy j
        return e1.u == a ? e1.m[i * sx + j] : e1.m[j * sa + i];
      };
      auto r_b = [&](std::size_t j, std::size_t k) {  // x's strategy j, b's strategy k
        return e2.u == x ? e2.m[j * sb + k] : e2.m[k * sx + j];
      };
      fold_record r{fold_record::kind::series, x, -1, a, b, orig_count(a), orig_count(b), {}};
      r.table.assign(r.na * r.nb, -1);
      std::vector<double> m(sa * sb, infinite_cost);
      const work_node& n = nodes[x];
      for (std::size_t i = 0; i < sa; ++i)
        for (std::size_t k = 0; k < sb; ++k) {
          double best = infinite_cost;
          std::size_t arg = 0;
          for (std::size_t j = 0; j < sx; ++j) {
            const double c = r_a(i, j) + n.cost[j] + r_b(j, k);
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
      // Into the existing a-b edge if there is one (kept u < v orientation).
      const std::size_t u = std::min(a, b), v = std::max(a, b);
      if (u != a) m = transpose(m, sa, sb);
      bool merged = false;
      for (std::size_t e : live_edges(u)) {
        work_edge& ed = edges[e];
        if (ed.u == u && ed.v == v) {
          for (std::size_t k = 0; k < m.size(); ++k) ed.m[k] += m[k];
          merged = true;
          break;
        }
        if (ed.u == v && ed.v == u) {  // unmerged orientation (merge disabled never reaches here)
          const std::vector<double> t = transpose(m, nodes[u].size(), nodes[v].size());
          for (std::size_t k = 0; k < t.size(); ++k) ed.m[k] += t[k];
          merged = true;
          break;
        }
      }
      if (!merged) add_edge(u, v, std::move(m));
      changed = true;
    }
    return changed;
  }

  // ---- sizes -----------------------------------------------------------------------------------
  /// Memory rows that would be written: maximal sets of simultaneously live nodes with a choice,
  /// at time points where the limit can bind.
  std::size_t count_memory_rows() const {
    if (!p.usage_limit || binding_times.empty()) return 0;
    std::vector<std::int64_t> ends;
    for (const work_node& n : nodes)
      if (n.alive && !n.live.empty()) ends.push_back(n.live.end);
    std::sort(ends.begin(), ends.end());
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
        for (double x : e.m) s.variables += x < infinite_cost ? 1 : 0;
        s.rows += nodes[e.u].size() + nodes[e.v].size();
      }
    s.memory_rows = count_memory_rows();
    s.rows += s.memory_rows;
    sizes.push_back(std::move(s));
  }

  /// Run every reduction to a fixed point, recording the size after each one that changed something.
  void run() {
    update_binding();
    record_size("merge parallel edges");
    if (prune_infinite()) record_size("prune infinite");
    for (int round = 1;; ++round) {
      bool any = false;
      const auto step = [&](const char* name, bool changed) {
        if (changed) {
          update_binding();
          record_size(std::string(name) + " (round " + std::to_string(round) + ")");
          any = true;
        }
      };
      step("fold single-strategy nodes", fold_singletons());
      step("prune infinite", prune_infinite());
      step("normalise edges", normalise_edges());
      step("remove dominated strategies", remove_dominated());
      step("fold leaves", fold_leaves());
      step("fold series nodes", fold_series());
      if (!any) break;
    }
  }

  /// Fill in every folded node of `choice` (original strategy indices; ILP nodes already set).
  void unfold(std::vector<int>& choice) const {
    for (auto it = records.rbegin(); it != records.rend(); ++it) {
      const fold_record& r = *it;
      switch (r.what) {
        case fold_record::kind::fixed: choice[r.node] = r.fixed; break;
        case fold_record::kind::leaf: choice[r.node] = r.table[static_cast<std::size_t>(choice[r.a])]; break;
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

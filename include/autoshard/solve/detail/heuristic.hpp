#pragma once
// The primal heuristic on the reduced problem, in exact integer arithmetic: a greedy pass in
// node order that keeps every time point within the usage limit, a memory repair (cheapest
// cost per byte saved at the most loaded time point), then local search: iterated conditional
// modes (each node moves to its best strategy given its neighbours while the limit holds),
// windows of nodes re-optimised exactly (detail/min_sum.hpp), and random kicks that are kept
// when they lead to a cheaper assignment. It gives an answer within a small fraction of the
// time limit on every instance; the ILP then improves it.
#include <algorithm>  // std::min, std::lower_bound
#include <atomic>     // std::atomic
#include <chrono>     // std::chrono::steady_clock
#include <cstddef>    // std::size_t
#include <cstdint>    // std::int64_t
#include <optional>   // std::optional
#include <random>     // std::mt19937
#include <tuple>      // std::tuple
#include <utility>    // std::pair
#include <vector>     // std::vector

#include "load_tree.hpp"     // load_tree
#include "min_sum.hpp"       // min_sum_problem, plan_elimination, solve_min_sum
#include "reduce.hpp"        // reducer, wcost
#include "reduced_view.hpp"  // reduced_view, spanning_forest

namespace autoshard::detail {

/// A local cost: how many forbidden terms, then the exact sum of the others.
struct local_cost {
  int bad = 0;
  wcost sum = 0;
  void add(wcost c) {
    if (is_forbidden_w(c))
      ++bad;
    else
      sum += c;
  }
  friend bool operator<(const local_cost& a, const local_cost& b) {
    return a.bad != b.bad ? a.bad < b.bad : a.sum < b.sum;
  }
};

/// One assignment of the reduced problem and the moves of the local search.
class local_search {
 public:
  using clock = std::chrono::steady_clock;

  explicit local_search(const reduced_view& view) : rv(view), pick(view.red.nodes.size(), 0) {}

  const reduced_view& rv;
  std::vector<std::size_t> pick;  // per node id; meaningful for alive nodes
  load_tree load;                 // summed usage per candidate time

  /// Set by a search thread: when it turns true the loops end as at their deadline.
  const std::atomic<bool>* cancel = nullptr;

  /// The deadline has passed, or the search was cancelled.
  bool over(clock::time_point deadline) const {
    return clock::now() >= deadline || (cancel && cancel->load(std::memory_order_relaxed));
  }

  /// Lagrangian prices of the memory rows per node and strategy (see `penalties`): when set,
  /// they are part of every node's cost and the moves ignore the limit.
  const std::vector<std::vector<wcost>>* priced = nullptr;

  /// Cost of node v at strategy i, its price included when `priced` is set.
  wcost node_cost(std::size_t v, std::size_t i) const {
    return priced ? wadd(rv.node(v).cost[i], (*priced)[v][i]) : rv.node(v).cost[i];
  }

  /// Node and edge cost of node v at strategy i, against its neighbours' current picks.
  local_cost local(std::size_t v, std::size_t i) const {
    local_cost c;
    c.add(priced ? wadd(rv.node(v).cost[i], (*priced)[v][i]) : rv.node(v).cost[i]);
    for (const reduced_view::incidence& in : rv.inc[v]) c.add(rv.entry(in, i, pick[rv.other(in)]));
    return c;
  }

  /// Moving v from its pick to j keeps every candidate time point within the limit (its live
  /// parts may overlap: each stretch between their ends is checked with their summed change).
  bool fits(std::size_t v, std::size_t j) const {
    if (!rv.limit || j == pick[v]) return true;
    const std::vector<reduced_view::part_span>& spans = rv.spans[v];
    if (spans.size() == 1) {
      const std::vector<std::int64_t>& u = rv.node(v).parts[spans[0].part].usage;
      const int128 du = static_cast<int128>(u[j]) - u[pick[v]];
      return du <= 0 || load.max(spans[0].a, spans[0].b) + du <= *rv.limit;
    }
    // Sweep the spans' starts and ends in time order: between two of them the change is the
    // sum over the parts live there (O(S) and one O(log T) query per stretch).
    const std::vector<reduced_view::span_end>& ends = rv.ends[v];
    int128 du = 0;
    for (std::size_t k = 0; k < ends.size();) {
      const std::size_t t = ends[k].t;
      for (; k < ends.size() && ends[k].t == t; ++k) {
        const std::vector<std::int64_t>& u = rv.node(v).parts[ends[k].part].usage;
        const int128 d = static_cast<int128>(u[j]) - u[pick[v]];
        du += ends[k].start ? d : -d;
      }
      if (k < ends.size() && du > 0 && load.max(t, ends[k].t) + du > *rv.limit) return false;
    }
    return true;
  }

  void move(std::size_t v, std::size_t j) {
    if (rv.limit)
      for (const reduced_view::part_span& s : rv.spans[v]) {
        const std::vector<std::int64_t>& u = rv.node(v).parts[s.part].usage;
        load.add(s.a, s.b, static_cast<int128>(u[j]) - u[pick[v]]);
      }
    pick[v] = j;
  }

  void recompute_load() {
    if (!rv.limit) return;
    std::vector<int128> diff(rv.times.size() + 1, 0);
    for (std::size_t v : rv.ilp_nodes)
      for (const reduced_view::part_span& s : rv.spans[v]) {
        const std::int64_t u = rv.node(v).parts[s.part].usage[pick[v]];
        diff[s.a] += u;
        diff[s.b] -= u;
      }
    std::vector<int128> values(rv.times.size());
    int128 cur = 0;
    for (std::size_t t = 0; t < values.size(); ++t) cur += diff[t], values[t] = rv.base[t] + cur;
    load = load_tree(values);
  }

  bool within_limit() const { return !rv.limit || load.size() == 0 || load.argmax().first <= *rv.limit; }

  /// Summed usage minus the limit at every candidate time point.
  std::vector<double> excess() const {
    std::vector<double> g(load.size());
    for (std::size_t t = 0; t < g.size(); ++t) g[t] = static_cast<double>(load.at(t) - *rv.limit);
    return g;
  }

  /// Greedy in node order: each node takes its cheapest strategy against the neighbours already
  /// placed, among those that keep the limit (the others sit at their smallest usage meanwhile).
  void greedy() {
    for (std::size_t v : rv.ilp_nodes) {
      const work_node& n = rv.node(v);
      std::size_t best = 0;
      int128 lowest = -1;
      for (std::size_t i = 0; i < n.size(); ++i) {
        int128 total = 0;
        for (const usage_part& pt : n.parts) total += pt.usage[i];
        if (lowest < 0 || total < lowest) lowest = total, best = i;
      }
      pick[v] = best;
    }
    recompute_load();
    std::vector<char> placed(rv.red.nodes.size(), 0);
    for (std::size_t v : rv.ilp_nodes) {
      const work_node& n = rv.node(v);
      std::optional<std::pair<local_cost, std::size_t>> best;
      for (std::size_t i = 0; i < n.size(); ++i) {
        if (!fits(v, i)) continue;
        local_cost c;
        c.add(n.cost[i]);
        for (const reduced_view::incidence& in : rv.inc[v])
          if (placed[rv.other(in)]) c.add(rv.entry(in, i, pick[rv.other(in)]));
        if (!best || c < best->first) best = {c, i};
      }
      if (best) move(v, best->second);
      placed[v] = 1;
    }
  }

  /// Exact minimum over `f` (a maximum spanning forest of rv's edges, see spanning_forest),
  /// the other edges and the limit ignored: dynamic programming from the leaves up, then each
  /// node's best strategy given its parent's, from the roots down.
  /// With `penalty` (per node id and strategy), node costs are raised by it (Lagrangian prices
  /// of the memory rows). Returns the value the forest gives (with the penalties).
  wcost tree_dp(const spanning_forest& f, const std::vector<std::vector<wcost>>* penalty = nullptr) {
    const std::size_t n = rv.red.nodes.size();
    const std::vector<std::size_t>&seq = f.seq, &parent = f.parent;
    const std::vector<reduced_view::incidence>& up = f.up;
    // best[v][i]: cheapest subtree of v with v at i; arg[v][j]: v's best strategy for parent's j.
    std::vector<std::vector<wcost>> best(n);
    std::vector<std::vector<std::size_t>> arg(n);
    for (std::size_t v : rv.ilp_nodes) {
      best[v] = rv.node(v).cost;
      if (penalty)
        for (std::size_t i = 0; i < best[v].size(); ++i) best[v][i] = wadd(best[v][i], (*penalty)[v][i]);
    }
    for (auto it = seq.rbegin(); it != seq.rend(); ++it) {
      const std::size_t v = *it, par = parent[v];
      if (par == n) continue;
      const std::size_t sp = rv.node(par).size(), sv = rv.node(v).size();
      arg[v].assign(sp, 0);
      for (std::size_t j = 0; j < sp; ++j) {
        wcost m = forbidden;
        for (std::size_t i = 0; i < sv; ++i) {
          const wcost c = wadd(best[v][i], rv.entry(up[v], i, j));
          if (c < m) m = c, arg[v][j] = i;
        }
        best[par][j] = wadd(best[par][j], m);
      }
    }
    wcost value = 0;
    for (std::size_t v : seq) {
      if (parent[v] == n) {
        pick[v] = static_cast<std::size_t>(std::min_element(best[v].begin(), best[v].end()) - best[v].begin());
        value = wadd(value, best[v][pick[v]]);
      } else {
        pick[v] = arg[v][pick[parent[v]]];
      }
    }
    recompute_load();
    return value;
  }

  /// Lagrangian prices for the memory rows: per node and strategy, the sum over its live parts
  /// of (price of each time point it covers) x usage.
  std::vector<std::vector<wcost>> penalties(const std::vector<double>& lambda) const {
    std::vector<double> prefix(lambda.size() + 1, 0.0);
    for (std::size_t t = 0; t < lambda.size(); ++t) prefix[t + 1] = prefix[t] + lambda[t];
    std::vector<std::vector<wcost>> pen(rv.red.nodes.size());
    for (std::size_t v : rv.ilp_nodes) {
      pen[v].assign(rv.node(v).size(), 0);
      for (const reduced_view::part_span& s : rv.spans[v]) {
        const double price = prefix[s.b] - prefix[s.a];
        for (std::size_t i = 0; i < pen[v].size(); ++i) {
          const double x = price * static_cast<double>(rv.node(v).parts[s.part].usage[i]);
          pen[v][i] += x >= 1e30 ? static_cast<wcost>(1e30) : static_cast<wcost>(x);
        }
      }
    }
    return pen;
  }

  /// Bring every candidate time point within the limit: at the most loaded one, switch nodes
  /// to lower-usage strategies, the least cost per byte saved first, until it fits. The switches
  /// for one time point are ranked once; a node whose neighbour has switched meanwhile is skipped
  /// (its cost changed), so each switch taken is priced exactly. False when no switch helps, or
  /// when `deadline` passes first.
  bool repair(clock::time_point deadline = clock::time_point::max()) {
    if (!rv.limit) return true;
    struct option {
      long double score;
      int128 saved;
      std::size_t v, j;
    };
    std::vector<option> options;
    std::vector<char> moved(rv.red.nodes.size(), 0);
    std::vector<std::size_t> marked;
    for (std::size_t guard = 0; guard < 1000000; ++guard) {
      if (load.size() == 0) return true;
      if ((guard & 63) == 63 && over(deadline)) return false;
      const auto [peak, worst] = load.argmax();
      if (peak <= *rv.limit) return true;
      options.clear();
      for (std::size_t v : rv.live_at(worst)) {
        const int128 here_use = usage_at(v, pick[v], worst);
        const local_cost here = local(v, pick[v]);
        for (std::size_t j = 0; j < rv.node(v).size(); ++j) {
          const int128 saved = here_use - usage_at(v, j, worst);
          if (saved <= 0) continue;
          const local_cost there = local(v, j);
          const long double dc = static_cast<long double>(there.bad - here.bad) * 1e30L +
                                 static_cast<long double>(there.sum - here.sum);
          options.push_back({dc / static_cast<long double>(saved), saved, v, j});
        }
      }
      if (options.empty()) return false;
      std::stable_sort(options.begin(), options.end(),
                       [](const option& a, const option& b) { return a.score < b.score; });
      int128 over = peak - *rv.limit;
      for (const option& o : options) {
        if (moved[o.v]) continue;
        note_change(local(o.v, pick[o.v]), local(o.v, o.j));
        log.push_back({o.v, pick[o.v]});
        move(o.v, o.j);
        over -= o.saved;
        moved[o.v] = 1;
        marked.push_back(o.v);
        for (const reduced_view::incidence& in : rv.inc[o.v])
          if (!moved[rv.other(in)]) moved[rv.other(in)] = 1, marked.push_back(rv.other(in));
        if (over <= 0) break;
      }
      for (std::size_t v : marked) moved[v] = 0;
      marked.clear();
    }
    return within_limit();
  }

  /// Iterated conditional modes from a queue of nodes whose neighbourhood changed.
  void improve_from(std::vector<std::size_t> queue, clock::time_point deadline) {
    std::vector<char> queued(rv.red.nodes.size(), 0);
    for (std::size_t v : queue) queued[v] = 1;
    std::size_t steps = 0;
    while (!queue.empty()) {
      if ((++steps & 255) == 0 && over(deadline)) return;
      const std::size_t v = queue.back();
      queue.pop_back();
      queued[v] = 0;
      local_cost cur = local(v, pick[v]);
      std::size_t to = pick[v];
      for (std::size_t j = 0; j < rv.node(v).size(); ++j) {
        if (j == pick[v]) continue;
        const local_cost c = local(v, j);
        if (c < cur && (priced || fits(v, j))) cur = c, to = j;
      }
      if (to == pick[v]) continue;
      note_change(local(v, pick[v]), cur);
      log.push_back({v, pick[v]});
      move(v, to);
      for (const reduced_view::incidence& in : rv.inc[v])
        if (!queued[rv.other(in)]) queued[rv.other(in)] = 1, queue.push_back(rv.other(in));
    }
  }

  void improve(clock::time_point deadline) { improve_from(rv.ilp_nodes, deadline); }

  /// Exact reduced objective of the current picks (offset included); `forbidden` if any term is.
  wcost total() const {
    wcost t = rv.red.offset;
    for (std::size_t v : rv.ilp_nodes) t = wadd(t, rv.node(v).cost[pick[v]]);
    for (std::size_t e = 0; e < rv.red.edges.size(); ++e) {
      const work_edge& ed = rv.edge(e);
      if (ed.alive) t = wadd(t, ed.m[pick[ed.u] * rv.red.nodes[ed.v].size() + pick[ed.v]]);
    }
    return t;
  }

  /// Random kicks (a node to another strategy, then ICM around it), kept when the total does not
  /// rise (sideways steps let the search walk along a plateau), until the deadline or until
  /// `patience` kicks in a row found nothing cheaper.
  void perturb(clock::time_point deadline, unsigned seed, std::size_t patience) {
    if (rv.ilp_nodes.empty()) return;
    std::mt19937 rng(seed);
    std::uniform_int_distribution<std::size_t> pick_node(0, rv.ilp_nodes.size() - 1);
    for (std::size_t idle = 0; idle < patience && !over(deadline); ++idle) {
      log.clear();
      drift = {};
      const std::size_t v = rv.ilp_nodes[pick_node(rng)];
      const std::size_t s = rv.node(v).size();
      if (s < 2) continue;
      const std::size_t j = (pick[v] + 1 + std::uniform_int_distribution<std::size_t>(0, s - 2)(rng)) % s;
      // A kick past the limit is repaired (the most loaded time point first), then improved.
      const bool over = !fits(v, j);
      note_change(local(v, pick[v]), local(v, j));
      log.push_back({v, pick[v]});
      move(v, j);
      std::vector<std::size_t> queue;
      for (const reduced_view::incidence& in : rv.inc[v]) queue.push_back(rv.other(in));
      const std::size_t kicked = log.size();
      const bool fixed = !over || repair();
      if (fixed) {
        for (std::size_t k = kicked; k < log.size(); ++k)
          for (const reduced_view::incidence& in : rv.inc[log[k].first]) queue.push_back(rv.other(in));
        improve_from(std::move(queue), deadline);
      }
      if (fixed && (drift.bad < 0 || (drift.bad == 0 && drift.sum < 0))) {
        idle = 0;
        continue;
      }
      if (fixed && drift.bad == 0 && drift.sum == 0) continue;  // a sideways step: kept, not a success
      for (auto it = log.rbegin(); it != log.rend(); ++it) move(it->first, it->second);
    }
    log.clear();
  }

  /// Large-neighbourhood search: a window of nodes (grown from a random node, see grow_window)
  /// is re-optimised exactly by variable elimination (detail/min_sum.hpp) with every node outside
  /// it fixed; the usage limit is handled by prices on the time points the window overloads
  /// (raised until its answer fits, a few times at most). The window's new picks are kept when
  /// the exact total does not rise. Runs until the deadline, until `patience` windows in a row
  /// found nothing cheaper, or after `limit` windows. `work` bounds the table entries one window's
  /// elimination visits.
  void window_search(clock::time_point deadline, unsigned seed, std::size_t patience, std::size_t work = 1000000,
                     std::size_t roots = 8, std::size_t limit = static_cast<std::size_t>(-1)) {
    if (rv.ilp_nodes.empty()) return;
    std::mt19937 rng(seed);
    std::uniform_int_distribution<std::size_t> pick_node(0, rv.ilp_nodes.size() - 1);
    const std::size_t n = rv.red.nodes.size();
    std::vector<std::size_t> pos(n, n);  // position in the window, n when outside
    for (std::size_t idle = 0, done = 0; idle < patience && done < limit && !over(deadline); ++idle, ++done) {
      const window w = grow_window(rv.ilp_nodes[pick_node(rng)], rng, pos, work, roots);
      const wcost before = window_cost(w, pos);
      std::vector<std::size_t> old(w.nodes.size());
      for (std::size_t k = 0; k < w.nodes.size(); ++k) old[k] = pick[w.nodes[k]];
      std::vector<double> lambda;  // prices per time point, only once the window overloads one
      bool kept = false;
      for (int attempt = 0; attempt < 6; ++attempt) {
        const std::vector<std::size_t> to = solve_window(w, pos, lambda);
        for (std::size_t k = 0; k < w.nodes.size(); ++k) move(w.nodes[k], to[k]);
        const wcost after = window_cost(w, pos);
        if (is_forbidden_w(after) || after > before) break;  // prices cannot make it cheaper
        if (priced || within_limit()) {
          kept = true;
          if (after < before) idle = 0;
          break;
        }
        raise_prices(lambda, before);
        for (std::size_t k = 0; k < w.nodes.size(); ++k) move(w.nodes[k], old[k]);
      }
      if (!kept)
        for (std::size_t k = 0; k < w.nodes.size(); ++k) move(w.nodes[k], old[k]);
      for (std::size_t v : w.nodes) pos[v] = n;
    }
  }

 private:
  /// The window's nodes, the edges between them (as (position, position, edge)), and the order
  /// that eliminates them within the work bound.
  struct window {
    std::vector<std::size_t> nodes;
    std::vector<std::tuple<std::size_t, std::size_t, std::size_t>> inner;
    elimination_plan plan;
  };

  /// The seed, then (when a limit holds) up to `roots` other nodes live at the seed's most
  /// loaded time point that share no edge with the window, its partners in trading memory; then
  /// breadth-first growth from all of them. A new node joined to the window by one edge keeps it
  /// a forest (its elimination visits its values times its neighbour's); one joined by two or
  /// more closes a cycle (estimated at its values times theirs), and at most `closers` of those
  /// are taken. The exact elimination plan is checked at the end: while it visits more than
  /// twice `work` entries, the last cycle-closing node leaves again.
  window grow_window(std::size_t seed, std::mt19937& rng, std::vector<std::size_t>& pos, std::size_t work,
                     std::size_t roots, std::size_t closers = 4) const {
    window w;
    std::vector<std::size_t> closing;  // positions of the cycle-closing nodes, in order
    join(w, pos, seed);
    double spent = static_cast<double>(rv.node(seed).size());
    if (rv.limit && roots > 0 && !rv.spans[seed].empty()) add_memory_partners(w, rng, pos, work, roots, spent);
    grow_breadth_first(w, rng, pos, work, closers, closing, spent);
    plan_window(w, pos, work, closing);
    return w;
  }

  /// Put v at the window's end.
  static void join(window& w, std::vector<std::size_t>& pos, std::size_t v) {
    pos[v] = w.nodes.size();
    w.nodes.push_back(v);
  }

  /// Up to `roots` nodes live at the most loaded time point of the seed (the window's only node)
  /// that share no edge with the window, while their values fit in `work`.
  void add_memory_partners(window& w, std::mt19937& rng, std::vector<std::size_t>& pos, std::size_t work,
                           std::size_t roots, double& spent) const {
    const std::size_t n = rv.red.nodes.size(), seed = w.nodes.front();
    // The first time point holding the largest load, over the spans in order (O(log T) each).
    std::size_t hot = rv.spans[seed][0].a;
    int128 peak = load.at(hot);
    for (const reduced_view::part_span& sp : rv.spans[seed]) {
      const auto [m, t] = load.argmax(sp.a, sp.b);
      if (m > peak) peak = m, hot = t;
    }
    std::vector<std::size_t> live = live_at(hot);
    std::shuffle(live.begin(), live.end(), rng);
    for (std::size_t v : live) {
      if (w.nodes.size() > roots || pos[v] != n) continue;
      bool touches = false;
      for (const reduced_view::incidence& in : rv.inc[v]) touches = touches || pos[rv.other(in)] != n;
      if (!touches && spent + static_cast<double>(rv.node(v).size()) <= static_cast<double>(work)) {
        join(w, pos, v);
        spent += static_cast<double>(rv.node(v).size());
      }
    }
  }

  /// Breadth-first growth from every window node while the estimated work fits; at most
  /// `closers` nodes that close a cycle, their positions recorded in `closing`.
  void grow_breadth_first(window& w, std::mt19937& rng, std::vector<std::size_t>& pos, std::size_t work,
                          std::size_t closers, std::vector<std::size_t>& closing, double& spent) const {
    const std::size_t n = rv.red.nodes.size();
    std::vector<reduced_view::incidence> around;
    std::vector<std::size_t> joined;
    for (std::size_t head = 0; head < w.nodes.size(); ++head) {
      around = rv.inc[w.nodes[head]];
      std::shuffle(around.begin(), around.end(), rng);
      for (const reduced_view::incidence& in : around) {
        const std::size_t x = rv.other(in);
        if (pos[x] != n) continue;
        joined.clear();  // window nodes x has an edge to
        for (const reduced_view::incidence& back : rv.inc[x])
          if (pos[rv.other(back)] != n) joined.push_back(rv.other(back));
        std::sort(joined.begin(), joined.end());
        joined.erase(std::unique(joined.begin(), joined.end()), joined.end());
        if (joined.size() > 1 && closing.size() >= closers) continue;
        double cost = static_cast<double>(rv.node(x).size());
        for (std::size_t y : joined) cost *= static_cast<double>(rv.node(y).size());
        if (spent + cost > static_cast<double>(work)) continue;
        spent += cost;
        if (joined.size() > 1) closing.push_back(w.nodes.size());
        join(w, pos, x);
      }
    }
  }

  /// The window's inner edges and elimination plan; while the plan visits more than twice
  /// `work` entries, the last cycle-closing node leaves again.
  void plan_window(window& w, std::vector<std::size_t>& pos, std::size_t work, std::vector<std::size_t>& closing) const {
    const std::size_t n = rv.red.nodes.size();
    for (;;) {
      w.inner.clear();
      std::vector<std::size_t> size(w.nodes.size());
      std::vector<std::pair<std::size_t, std::size_t>> links;
      for (std::size_t k = 0; k < w.nodes.size(); ++k) {
        size[k] = rv.node(w.nodes[k]).size();
        for (const reduced_view::incidence& in : rv.inc[w.nodes[k]])
          if (in.is_u && pos[rv.other(in)] != n) {
            w.inner.emplace_back(k, pos[rv.other(in)], in.edge);
            links.emplace_back(k, pos[rv.other(in)]);
          }
      }
      w.plan = plan_elimination(size, links);
      if (closing.empty()) {
        // A forest: the reverse of the growth order eliminates each node when only the one it
        // joined is left, within `work`; take it when the greedy order does worse.
        std::vector<std::size_t> order(w.nodes.size());
        for (std::size_t k = 0; k < order.size(); ++k) order[k] = order.size() - 1 - k;
        elimination_plan leaves_up = plan_in_order(size, links, std::move(order));
        if (leaves_up.work < w.plan.work) w.plan = std::move(leaves_up);
        return;
      }
      if (w.plan.work <= 2.0 * static_cast<double>(work)) return;
      // Drop the last cycle-closing node (the growth order of the others is kept).
      const std::size_t k = closing.back();
      closing.pop_back();
      pos[w.nodes[k]] = n;
      w.nodes.erase(w.nodes.begin() + static_cast<std::ptrdiff_t>(k));
      for (std::size_t q = k; q < w.nodes.size(); ++q) pos[w.nodes[q]] = q;
      for (std::size_t& c : closing)
        if (c > k) --c;
    }
  }

  /// Alive nodes with a live part at time index t.
  std::vector<std::size_t> live_at(std::size_t t) const { return rv.live_at(t); }

  /// Node costs of the window plus every edge with an end in it, at the current picks.
  wcost window_cost(const window& w, const std::vector<std::size_t>& pos) const {
    const std::size_t n = rv.red.nodes.size();
    wcost c = 0;
    for (std::size_t v : w.nodes) {
      c = wadd(c, node_cost(v, pick[v]));
      for (const reduced_view::incidence& in : rv.inc[v]) {
        const std::size_t x = rv.other(in);
        if (pos[x] == n || in.is_u) c = wadd(c, rv.entry(in, pick[v], pick[x]));  // inner edges once
      }
    }
    return c;
  }

  /// The window's exact best picks with the outside fixed, each node's usage priced by `lambda`.
  std::vector<std::size_t> solve_window(const window& w, const std::vector<std::size_t>& pos,
                                        const std::vector<double>& lambda) const {
    const std::size_t n = rv.red.nodes.size(), size = w.nodes.size();
    std::vector<double> prefix;
    if (!lambda.empty()) {
      prefix.assign(lambda.size() + 1, 0.0);
      for (std::size_t t = 0; t < lambda.size(); ++t) prefix[t + 1] = prefix[t] + lambda[t];
    }
    min_sum_problem pb;
    pb.size.resize(size);
    pb.unary.resize(size);
    for (std::size_t k = 0; k < size; ++k) {
      const std::size_t v = w.nodes[k];
      std::vector<wcost>& u = pb.unary[k];
      pb.size[k] = rv.node(v).size();
      u.resize(pb.size[k]);
      for (std::size_t i = 0; i < u.size(); ++i) u[i] = node_cost(v, i);
      for (const reduced_view::incidence& in : rv.inc[v]) {
        const std::size_t x = rv.other(in);
        if (pos[x] != n) continue;
        for (std::size_t i = 0; i < u.size(); ++i) u[i] = wadd(u[i], rv.entry(in, i, pick[x]));
      }
      if (prefix.empty()) continue;
      for (const reduced_view::part_span& s : rv.spans[v]) {
        const double price = prefix[s.b] - prefix[s.a];
        if (price <= 0.0) continue;
        for (std::size_t i = 0; i < u.size(); ++i) {
          const double x = price * static_cast<double>(rv.node(v).parts[s.part].usage[i]);
          u[i] = wadd(u[i], x >= 1e30 ? forbidden : static_cast<wcost>(x));
        }
      }
    }
    for (const auto& [a, b, e] : w.inner) {
      // rv.entry sees the edge from its u end, which is the node at position a.
      min_sum_problem::pair_table pt;
      pt.a = a;
      pt.b = b;
      pt.m = rv.edge(e).m;
      pb.pairs.push_back(pt);
    }
    return solve_min_sum(std::move(pb), w.plan);
  }

  /// Raise the prices of the overloaded time points (created at the first overload), in
  /// proportion to the overload, scaled so that the window's cost `scale` is at stake.
  void raise_prices(std::vector<double>& lambda, wcost scale) const {
    if (lambda.empty()) lambda.assign(rv.times.size(), 0.0);
    std::vector<double> over(lambda.size(), 0.0);
    double norm = 0.0;
    for (std::size_t t = 0; t < lambda.size(); ++t) {
      const int128 x = load.at(t) - *rv.limit;
      if (x > 0) over[t] = static_cast<double>(x), norm += over[t] * over[t];
    }
    if (norm == 0.0) return;
    const double step = std::max(1.0, static_cast<double>(scale)) / norm;
    for (std::size_t t = 0; t < lambda.size(); ++t) lambda[t] = 2.0 * lambda[t] + step * over[t];
  }

  std::vector<std::pair<std::size_t, std::size_t>> log;  // (node, previous pick) for undo
  local_cost drift;  // change of the total since the last kick (may be negative)

  void note_change(const local_cost& from, const local_cost& to) {
    drift.bad += to.bad - from.bad;
    drift.sum += to.sum - from.sum;
  }

  int128 usage_at(std::size_t v, std::size_t j, std::size_t t) const {
    int128 u = 0;
    for (const reduced_view::part_span& s : rv.spans[v])
      if (s.a <= t && t < s.b) u += rv.node(v).parts[s.part].usage[j];
    return u;
  }
};

}  // namespace autoshard::detail

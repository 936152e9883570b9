#pragma once
// Exact minimisation of a small pairwise cost function (a cost per variable and value, and a
// table per linked pair of variables) by variable elimination: the variable whose elimination
// touches the fewest table entries goes first, its factors are combined and minimised out, and
// the minimising value is recorded for every assignment of the variables it was linked to; a
// back-substitution in reverse order then reads the best assignment. On a tree this is the
// usual leaves-up dynamic programming; a cycle costs one fill-in link (a table over two
// variables) per elimination around it. The local search re-optimises windows of the reduced
// problem with it (detail/heuristic.hpp). Costs are exact (`wcost`, forbidden saturates).
#include <algorithm>  // std::sort, std::unique, std::find
#include <cstddef>    // std::size_t
#include <cstdint>    // std::uint32_t
#include <set>        // std::set
#include <span>       // std::span
#include <tuple>      // std::tuple
#include <utility>    // std::pair
#include <vector>     // std::vector

#include "reduce.hpp"  // wcost, wadd, forbidden

namespace autoshard::detail {

/// The variables, their values, and the cost terms of a small min-sum problem.
struct min_sum_problem {
  std::vector<std::size_t> size;          ///< values per variable (each >= 1)
  std::vector<std::vector<wcost>> unary;  ///< [variable][value]
  struct pair_table {
    std::size_t a = 0, b = 0;  ///< a != b
    std::span<const wcost> m;  ///< m[i * size[b] + j] for a at i and b at j (the caller owns it)
  };
  std::vector<pair_table> pairs;
};

/// An elimination order and the table entries it visits (the sum, over the eliminated
/// variables, of its values times the values of every variable it is linked to then).
struct elimination_plan {
  std::vector<std::size_t> order;
  double work = 0.0;
};

namespace min_sum_detail {

/// Adjacency lists, sorted and without repeats or self-links.
inline std::vector<std::vector<std::size_t>> adjacency(std::size_t n,
                                                       const std::vector<std::pair<std::size_t, std::size_t>>& links) {
  std::vector<std::vector<std::size_t>> adj(n);
  for (const auto& [a, b] : links)
    if (a != b) adj[a].push_back(b), adj[b].push_back(a);
  for (std::vector<std::size_t>& l : adj) {
    std::sort(l.begin(), l.end());
    l.erase(std::unique(l.begin(), l.end()), l.end());
  }
  return adj;
}

/// Remove x from the graph, linking its neighbours to each other; returns the entries its
/// elimination visits.
inline double eliminate(std::vector<std::vector<std::size_t>>& adj, const std::vector<std::size_t>& size,
                        std::size_t x) {
  double w = static_cast<double>(size[x]);
  for (std::size_t y : adj[x]) w *= static_cast<double>(size[y]);
  const std::vector<std::size_t> nb = std::move(adj[x]);
  adj[x].clear();
  for (std::size_t y : nb) {
    std::vector<std::size_t>& l = adj[y];
    l.erase(std::find(l.begin(), l.end(), x));
    for (std::size_t z : nb)
      if (z != y && !std::binary_search(l.begin(), l.end(), z)) l.insert(std::lower_bound(l.begin(), l.end(), z), z);
  }
  return w;
}

}  // namespace min_sum_detail

/// The greedy order: at each step the variable whose elimination visits the fewest entries
/// (ties: the fewest links, then the lowest index). Keys live in an ordered set and change only
/// for the neighbours of each eliminated variable, so a forest of m variables plans in
/// O(m log m).
inline elimination_plan plan_elimination(const std::vector<std::size_t>& size,
                                         const std::vector<std::pair<std::size_t, std::size_t>>& links) {
  const std::size_t n = size.size();
  std::vector<std::vector<std::size_t>> adj = min_sum_detail::adjacency(n, links);
  using key = std::tuple<double, std::size_t, std::size_t>;  // (work, links, variable)
  const auto key_of = [&](std::size_t x) {
    double w = static_cast<double>(size[x]);
    for (std::size_t y : adj[x]) w *= static_cast<double>(size[y]);
    return key{w, adj[x].size(), x};
  };
  std::set<key> queue;
  std::vector<key> current(n);
  for (std::size_t x = 0; x < n; ++x) queue.insert(current[x] = key_of(x));
  elimination_plan plan;
  while (!queue.empty()) {
    const std::size_t x = std::get<2>(*queue.begin());
    queue.erase(queue.begin());
    const std::vector<std::size_t> nb = adj[x];
    plan.order.push_back(x);
    plan.work += min_sum_detail::eliminate(adj, size, x);
    for (std::size_t y : nb) {
      queue.erase(current[y]);
      queue.insert(current[y] = key_of(y));
    }
  }
  return plan;
}

/// A given order (a permutation of the variables) and its work.
inline elimination_plan plan_in_order(const std::vector<std::size_t>& size,
                                      const std::vector<std::pair<std::size_t, std::size_t>>& links,
                                      std::vector<std::size_t> order) {
  std::vector<std::vector<std::size_t>> adj = min_sum_detail::adjacency(size.size(), links);
  elimination_plan plan;
  for (std::size_t x : order) plan.work += min_sum_detail::eliminate(adj, size, x);
  plan.order = std::move(order);
  return plan;
}

namespace min_sum_detail {

/// A cost table over some variables: an input pair's (read in place) or one an elimination made.
struct factor {
  std::vector<std::size_t> scope;  // variables, the first one most significant
  std::vector<wcost> own;          // a table made by an elimination (empty for an input pair)
  std::span<const wcost> t;        // the table: an input pair's, or `own`
  bool alive = true;
};

/// What eliminating a variable left for the back-substitution: its minimising value for every
/// assignment of the variables it was linked to then.
struct record {
  std::vector<std::size_t> scope;
  std::vector<std::uint32_t> arg;
};

/// The factors of a min-sum problem and the eliminations done so far.
struct eliminator {
  min_sum_problem& pb;            // its unary costs take in the eliminations' one-variable tables
  std::vector<factor> fs;
  std::vector<std::vector<std::size_t>> touching;  // factor ids per variable
  std::vector<record> rec;

  explicit eliminator(min_sum_problem& problem)
      : pb(problem), touching(problem.size.size()), rec(problem.size.size()) {
    for (const min_sum_problem::pair_table& pt : pb.pairs) {
      touching[pt.a].push_back(fs.size());
      touching[pt.b].push_back(fs.size());
      fs.push_back({{pt.a, pt.b}, {}, pt.m, true});
    }
  }

  /// Eliminate x: combine the live factors that hold it and minimise it out, leaving a table over
  /// the variables it was linked to (added to a unary cost when there is one of them).
  void eliminate(std::size_t x) {
    std::vector<std::size_t> fx, scope;
    gather(x, fx, scope);
    // Strides of every scope variable and of x inside each factor.
    const std::size_t k = scope.size(), nf = fx.size();
    std::vector<std::size_t> stride(nf * k, 0), xstride(nf, 0), off(nf, 0);
    for (std::size_t f = 0; f < nf; ++f) {
      const factor& F = fs[fx[f]];
      std::size_t s = 1;
      for (std::size_t q = F.scope.size(); q-- > 0;) {
        const std::size_t v = F.scope[q];
        if (v == x) {
          xstride[f] = s;
        } else {
          const std::size_t at = static_cast<std::size_t>(std::lower_bound(scope.begin(), scope.end(), v) - scope.begin());
          stride[f * k + at] = s;
        }
        s *= pb.size[v];
      }
    }
    std::size_t cells = 1;
    for (std::size_t v : scope) cells *= pb.size[v];
    std::vector<wcost> out(cells, forbidden);
    record& r = rec[x];
    r.scope = scope;
    r.arg.assign(cells, 0);
    std::vector<std::size_t> digit(k, 0);
    const std::size_t dx = pb.size[x];
    for (std::size_t c = 0; c < cells; ++c) {
      wcost best = forbidden;
      std::uint32_t arg = 0;
      for (std::size_t i = 0; i < dx; ++i) {
        wcost s = pb.unary[x][i];
        for (std::size_t f = 0; f < nf && !is_forbidden_w(s); ++f) s = wadd(s, fs[fx[f]].t[off[f] + i * xstride[f]]);
        if (s < best) best = s, arg = static_cast<std::uint32_t>(i);
      }
      out[c] = best;
      r.arg[c] = arg;
      // Next assignment of the scope (the last variable fastest), offsets kept in step.
      for (std::size_t q = k; q-- > 0;) {
        if (++digit[q] < pb.size[scope[q]]) {
          for (std::size_t f = 0; f < nf; ++f) off[f] += stride[f * k + q];
          break;
        }
        for (std::size_t f = 0; f < nf; ++f) off[f] -= (pb.size[scope[q]] - 1) * stride[f * k + q];
        digit[q] = 0;
      }
    }
    for (std::size_t f : fx) fs[f].alive = false;
    keep(scope, std::move(out));
  }

  /// The best assignment, read back in the reverse of `order` (every variable eliminated).
  std::vector<std::size_t> back_substitute(const std::vector<std::size_t>& order) const {
    std::vector<std::size_t> val(pb.size.size(), 0);
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      const record& r = rec[*it];
      std::size_t idx = 0;
      for (std::size_t v : r.scope) idx = idx * pb.size[v] + val[v];
      val[*it] = r.arg[idx];
    }
    return val;
  }

 private:
  /// The live factors that hold x (each once) and the other variables they hold (sorted).
  void gather(std::size_t x, std::vector<std::size_t>& fx, std::vector<std::size_t>& scope) const {
    for (std::size_t f : touching[x])
      if (fs[f].alive && std::find(fx.begin(), fx.end(), f) == fx.end()) {
        fx.push_back(f);
        for (std::size_t v : fs[f].scope)
          if (v != x) scope.push_back(v);
      }
    std::sort(scope.begin(), scope.end());
    scope.erase(std::unique(scope.begin(), scope.end()), scope.end());
  }

  /// The table an elimination made: into the unary cost of its one variable, or a new factor.
  void keep(const std::vector<std::size_t>& scope, std::vector<wcost> out) {
    if (scope.size() == 1) {
      for (std::size_t i = 0; i < out.size(); ++i) pb.unary[scope[0]][i] = wadd(pb.unary[scope[0]][i], out[i]);
    } else if (scope.size() > 1) {
      for (std::size_t v : scope) touching[v].push_back(fs.size());
      fs.push_back({scope, std::move(out), {}, true});
      fs.back().t = fs.back().own;  // the buffer stays put when `fs` grows (vectors move it)
    }
  }
};

}  // namespace min_sum_detail

/// The exact minimiser of `pb`, eliminating in `plan.order` (every variable exactly once). Its
/// unary costs are consumed (the eliminations add into them); its pair tables are only read.
inline std::vector<std::size_t> solve_min_sum(min_sum_problem pb, const elimination_plan& plan) {
  min_sum_detail::eliminator el(pb);
  for (const std::size_t x : plan.order) el.eliminate(x);
  return el.back_substitute(plan.order);
}

}  // namespace autoshard::detail

#pragma once
/// Validation of a model graph and a topological order of its vertices.
///   autoshard::validate(g);                      // throws graph_error naming the vertex
///   std::vector<autoshard::vertex_t> order = autoshard::topological_order(g);
#include <algorithm>  // std::reverse
#include <string>     // std::string
#include <vector>     // std::vector

#include <boost/graph/topological_sort.hpp>  // topological_sort, not_a_dag

#include "../core/checked.hpp"  // checked_bytes
#include "model.hpp"            // model_graph, infer_shape, operands

namespace autoshard {

/// The most bytes one tensor of a model graph may have: 2^53 (8 PiB).
inline constexpr std::int64_t max_graph_tensor_bytes = std::int64_t{1} << 53;

namespace detail {
/// A cycle as "a -> b -> a", found by an iterative depth-first search.
inline std::string find_cycle(const model_graph& g) {
  const std::size_t n = boost::num_vertices(g);
  std::vector<int> color(n, 0);  // 0 white, 1 on stack, 2 done
  std::vector<vertex_t> parent(n, boost::graph_traits<model_graph>::null_vertex());
  for (vertex_t root = 0; root < n; ++root) {
    if (color[root]) continue;
    std::vector<std::pair<vertex_t, boost::graph_traits<model_graph>::out_edge_iterator>> stack;
    stack.emplace_back(root, boost::out_edges(root, g).first);
    color[root] = 1;
    while (!stack.empty()) {
      auto& [u, it] = stack.back();
      if (it == boost::out_edges(u, g).second) {
        color[u] = 2;
        stack.pop_back();
        continue;
      }
      const vertex_t w = boost::target(*it++, g);
      if (color[w] == 1) {  // back edge u -> w closes a cycle w -> ... -> u -> w
        std::vector<vertex_t> path{w};
        for (vertex_t x = u; x != w; x = parent[x]) path.push_back(x);
        std::reverse(path.begin() + 1, path.end());
        std::string s;
        for (vertex_t x : path) s += quoted_text(g[x].name) + " -> ";
        return s + quoted_text(g[w].name);
      }
      if (color[w] == 0) {
        color[w] = 1;
        parent[w] = u;
        stack.emplace_back(w, boost::out_edges(w, g).first);
      }
    }
  }
  return "(not found)";
}
}  // namespace detail

/// Vertices in dependency order (producers first); throws graph_error naming the vertices
/// of a cycle.
inline std::vector<vertex_t> topological_order(const model_graph& g) {
  std::vector<vertex_t> order;
  order.reserve(boost::num_vertices(g));
  try {
    boost::topological_sort(g, std::back_inserter(order));  // writes reverse order
  } catch (const boost::not_a_dag&) {
    throw graph_error("the graph has a cycle through vertex " + detail::find_cycle(g));
  }
  std::reverse(order.begin(), order.end());
  return order;
}

/// Checks the whole graph; throws graph_error naming the vertex: a cycle, an unknown
/// operator kind, a missing or extra operand, an operand shape that does not fit the
/// operator, a stored output shape that differs from the inferred one, a repeated name.
inline void validate(const model_graph& g) {
  topological_order(g);
  std::vector<std::string> names;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    const node& nd = g[v];
    const std::string who = "vertex " + quoted_text(nd.name);
    if (nd.name.empty()) throw graph_error("vertex " + std::to_string(v) + " has no name");
    names.push_back(nd.name);
    if (!is_known(nd.kind))
      throw graph_error(who + ": unknown operator kind " + std::to_string(static_cast<int>(nd.kind)));
    const auto [lo, hi] = operand_count_range(nd.kind);
    const auto n = static_cast<int>(boost::in_degree(v, g));
    std::vector<bool> seen(static_cast<std::size_t>(std::max(hi, n)), false);
    for (auto [it, end] = boost::in_edges(v, g); it != end; ++it) {
      const int i = g[*it].operand;
      if (i < 0 || i >= hi)
        throw graph_error(who + " (" + std::string(to_string(nd.kind)) + "): operand index " + std::to_string(i) +
                          " is outside 0.." + std::to_string(hi - 1) + " (from " + quoted_text(g[boost::source(*it, g)].name) + ")");
      if (seen[static_cast<std::size_t>(i)])
        throw graph_error(who + " (" + std::string(to_string(nd.kind)) + "): operand " + std::to_string(i) + " is given twice");
      seen[static_cast<std::size_t>(i)] = true;
    }
    for (int i = 0; i < std::max(lo, n); ++i)
      if (!seen[static_cast<std::size_t>(i)])
        throw graph_error(who + " (" + std::string(to_string(nd.kind)) + "): operand " + std::to_string(i) +
                          " is missing (needs " + std::to_string(lo) + (lo == hi ? "" : ".." + std::to_string(hi)) + ")");
    // Sizes that wrap: `plan --batch 2147483647 --seq 2147483647` used to end in "negative
    // usage". One tensor may hold at most 2^53 bytes (8 PiB), so that the cost model's sums and
    // multiples of tensor sizes (optimizer state, live tensors) stay exact and below 2^63.
    std::int64_t bytes = -1;
    try {
      bytes = checked_bytes(nd.shape, static_cast<std::int64_t>(dtype_size(nd.type)), who);
    } catch (const shape_error&) {
    }
    if (bytes < 0 || bytes > max_graph_tensor_bytes)
      throw graph_error(who + ": shape " + to_string(nd.shape) + " of " + std::string(to_string(nd.type)) + " is " +
                        (bytes < 0 ? std::string("more than 2^63-1") : std::to_string(bytes)) +
                        " bytes; one tensor may have at most 2^53 (8 PiB)");
    // A key/value cache is live the whole step and keeps its past through re-sizing: only as
    // an attention's cache operand (3, 4) do those mean what they say; and an attention's cache
    // operands are such inputs (a computed tensor there would be priced as held across steps).
    if (nd.attrs.kv_cache) {
      if (!nd.is_fed_input() || nd.shape.rank != 3 || !is_floating(nd.type))
        throw graph_error(who + ": kv_cache marks a fed input [batch, past, kv_heads*D] of a floating type, not a " +
                          std::string(to_string(nd.kind)) + " " + to_string(nd.shape) + " of " + std::string(to_string(nd.type)));
      for (auto [it, end] = boost::out_edges(v, g); it != end; ++it)
        if (const node& c = g[boost::target(*it, g)]; c.kind != op_kind::attention || g[*it].operand < 3)
          throw graph_error(who + ": a key/value cache is read as an attention's operand 3 or 4, not as operand " +
                            std::to_string(g[*it].operand) + " of " + quoted_text(c.name) + " (" + std::string(to_string(c.kind)) + ")");
    }
    if (nd.kind == op_kind::attention)
      for (auto [it, end] = boost::in_edges(v, g); it != end; ++it)
        if (const node& c = g[boost::source(*it, g)]; g[*it].operand >= 3 && !c.is_kv_cache())
          throw graph_error(who + " (attention): operand " + std::to_string(g[*it].operand) + " " + quoted_text(c.name) +
                            " is not a key/value cache (an input with kv_cache)");
    if (!nd.is_operator()) continue;
    tensor_shape inferred;
    try {
      inferred = infer_shape(nd.kind, nd.attrs, operand_shapes(g, v));
    } catch (const graph_error& e) {
      throw graph_error(who + ": " + std::string(e.message()));
    }
    if (!(inferred == nd.shape))
      throw graph_error(who + " (" + std::string(to_string(nd.kind)) + "): output shape " + to_string(nd.shape) +
                        " does not match " + to_string(inferred) + " computed from its operands");
  }
  std::sort(names.begin(), names.end());
  for (std::size_t i = 1; i < names.size(); ++i)
    if (names[i] == names[i - 1]) throw graph_error("vertex name " + quoted_text(names[i]) + " is used twice");
}

}  // namespace autoshard

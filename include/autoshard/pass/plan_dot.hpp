#pragma once
/// Graphviz DOT of a solved plan that stays readable for deep models: runs of layers that
/// chose the same strategies (tied layers) are drawn once, in a box saying "x N"; operators
/// are filled with a colour per output spec, explained by a legend; an edge whose producer
/// and consumer disagree is labelled with the collectives that reshard it and their modeled
/// time (per step, training counting the backward).
///   std::ofstream f("plan.dot");
///   autoshard::write_plan_dot(f, p.graph(), p.mesh(), p.strategies, p.document.pricing);   // p: a loaded_plan
#include <map>      // std::map
#include <ostream>  // std::ostream
#include <set>      // std::set
#include <string>   // std::string
#include <vector>   // std::vector

#include "../core/cost.hpp"          // price_plan
#include "../core/redistribute.hpp"  // plan_redistribute
#include "../graph/dot.hpp"          // detail::dot_escape, detail::spec_colour
#include "../graph/strategy.hpp"     // strategy, price_edge, settle_target
#include "autosharding.hpp"          // autosharding types
#include "layers.hpp"                // detail::layer_key, detail::layer_index

namespace autoshard {

namespace detail {

/// Runs of consecutive layers that chose the same strategies, drawn once: each layer's run
/// (by its first layer), each run's last layer and size, and each vertex's representative
/// (itself, or its counterpart in the run's first layer).
struct layer_runs {
  std::map<long, long> run_of, run_last, run_count;
  std::vector<vertex_t> rep;

  /// The name a vertex is drawn with: "transformer.h.[0-11].attn" for a run of 12.
  std::string label(const model_graph& g, vertex_t v) const {
    const long i = layer_index(g[v].name);
    if (i < 0 || run_count.at(run_of.at(i)) == 1) return g[v].name;
    const std::string key = layer_key(g[v].name);
    const long first = run_of.at(i);
    return key.substr(0, key.find('#')) + "[" + std::to_string(first) + "-" + std::to_string(run_last.at(first)) + "]" +
           key.substr(key.find('#') + 1);
  }
};

inline layer_runs find_layer_runs(const model_graph& g, const std::vector<strategy>& chosen) {
  const std::size_t n = boost::num_vertices(g);
  // Layers: index -> (layer key -> strategy name); runs of equal signatures collapse.
  std::map<long, std::map<std::string, std::string>> sig;
  for (vertex_t v = 0; v < n; ++v)
    if (const long i = layer_index(g[v].name); i >= 0) sig[i][layer_key(g[v].name)] = chosen[v].name;
  layer_runs r;
  long first = -1, prev = -1;
  for (const auto& [i, s] : sig) {
    if (first < 0 || prev != i - 1 || sig[first] != s) first = i;
    r.run_of[i] = first;
    r.run_last[first] = i;
    ++r.run_count[first];
    prev = i;
  }
  // Every vertex drawn as itself or as its representative in the run's first layer.
  std::map<std::string, vertex_t> by_name;
  for (vertex_t v = 0; v < n; ++v) by_name[g[v].name] = v;
  r.rep.resize(n);
  for (vertex_t v = 0; v < n; ++v) {
    r.rep[v] = v;
    const long i = layer_index(g[v].name);
    if (i < 0 || r.run_of[i] == i) continue;
    const std::string key = layer_key(g[v].name);
    const std::string base = key.substr(0, key.find('#')) + std::to_string(r.run_of[i]) + key.substr(key.find('#') + 1);
    if (auto it = by_name.find(base); it != by_name.end()) r.rep[v] = it->second;
  }
  return r;
}

/// The drawn vertices: those outside layers at top level, one cluster per run; every output
/// spec drawn goes into `specs_used` (for the legend).
inline void write_plan_dot_nodes(std::ostream& os, const model_graph& g, const std::vector<strategy>& chosen, const layer_runs& runs,
                                 std::set<std::string>& specs_used) {
  const auto node_line = [&](vertex_t v) {
    const std::string spec = to_alpa_string(chosen[v].output);
    specs_used.insert(spec);
    os << "    v" << v << " [label=\"" << dot_escape(runs.label(g, v)) << "\\n" << to_string(g[v].kind) << " "
       << to_string(g[v].shape) << "\\n" << dot_escape(spec) << "\", shape=" << (g[v].is_operator() ? "box" : "ellipse")
       << ", style=filled, fillcolor=\"" << spec_colour(spec) << "\"];\n";
  };
  std::map<long, std::vector<vertex_t>> cluster;
  std::vector<vertex_t> loose;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    if (runs.rep[v] != v) continue;
    const long i = layer_index(g[v].name);
    if (i >= 0) cluster[runs.run_of.at(i)].push_back(v);
    else loose.push_back(v);
  }
  for (vertex_t v : loose) node_line(v);
  for (const auto& [i, vs] : cluster) {
    const long cnt = runs.run_count.at(i);
    os << "  subgraph cluster_layer" << i << " {\n    label=\""
       << (cnt > 1 ? "layers " + std::to_string(i) + "-" + std::to_string(runs.run_last.at(i)) + " (x " + std::to_string(cnt) +
                         ", tied: the same strategies)"
                   : "layer " + std::to_string(i))
       << "\";\n    style=rounded;\n";
    for (vertex_t v : vs) node_line(v);
    os << "  }\n";
  }
}

/// A drawn edge: the collectives that reshard it, their modeled time per step summed over
/// every layer it stands for, and how many.
struct dot_edge {
  std::string label;
  double seconds = 0.0;
  int count = 0;
};

/// The collectives on edge `e` ("all_gather (tp) + reduce_scatter (dp) backward"), priced as
/// the pass prices it: forward, and in training the backward (gradient sync); "" when free.
inline std::string edge_collectives(const model_graph& g, edge_t e, const device_mesh& m, const std::vector<strategy>& chosen,
                                    const edge_costs& c) {
  const vertex_t u = boost::source(e, g), v = boost::target(e, g);
  const auto operand = static_cast<std::size_t>(g[e].operand);
  std::string what;
  const auto name_steps = [&](const redist_plan& plan, const char* suffix) {
    for (std::size_t k = 0; k < plan.size(); ++k) {
      if (!is_communication(plan[k].kind) || m.size(plan[k].mesh_axis) == 1) continue;
      const std::string nm(m.axis_name(plan[k].mesh_axis));
      what += (what.empty() ? "" : " + ") + std::string(to_string(plan[k].kind)) + " (" +
              (nm.empty() ? "axis " + std::to_string(plan[k].mesh_axis) : nm) + ")" + suffix;
    }
  };
  name_steps(plan_redistribute(m, chosen[u].output, settle_target(chosen[u].output, chosen[v].inputs.at(operand)), g[u].shape), "");
  if (c.backward > 0)
    name_steps(plan_redistribute(m, chosen[v].grads.at(operand), backward_target(chosen[u]), g[u].shape), " backward");
  return what.empty() ? "local slice" : what;
}

/// Edges between drawn vertices; a collapsed edge counts every layer it stands for.
inline std::map<std::pair<vertex_t, vertex_t>, dot_edge> plan_dot_edges(const model_graph& g, const device_mesh& m,
                                                                         const std::vector<strategy>& chosen,
                                                                         const step_pricing& pricing, const layer_runs& runs) {
  std::map<std::pair<vertex_t, vertex_t>, dot_edge> edges;
  const std::vector<char> grads =
      pricing.mode == run_mode::training ? gradient_flags(g) : std::vector<char>(boost::num_vertices(g), 0);
  const strategy_options so{pricing};
  for (auto [it, end] = boost::edges(g); it != end; ++it) {
    const vertex_t u = boost::source(*it, g), v = boost::target(*it, g);
    const sharding_spec& from = chosen[u].output;
    const sharding_spec& to = chosen[v].inputs.at(static_cast<std::size_t>(g[*it].operand));
    dot_edge& e = edges[{runs.rep[u], runs.rep[v]}];
    ++e.count;
    const edge_costs c = price_edge(g, *it, chosen[u], chosen[v], m, grads[u] != 0, backward_pricing_of(g, *it, so));
    if (from == to && !(c.total() > 0)) continue;
    e.label = edge_collectives(g, *it, m, chosen, c);
    e.seconds += c.total();
  }
  return edges;
}

}  // namespace detail

/// Writes the plan as DOT (see the file comment). `chosen[v]` is vertex v's strategy.
inline void write_plan_dot(std::ostream& os, const model_graph& g, const device_mesh& m,
                           const std::vector<strategy>& chosen, const step_pricing& pricing = {}) {
  const std::size_t n = boost::num_vertices(g);
  if (chosen.size() != n)
    throw solver_error("write_plan_dot: " + std::to_string(chosen.size()) + " strategies for " + std::to_string(n) + " vertices");
  const detail::layer_runs runs = detail::find_layer_runs(g, chosen);
  os << "digraph plan {\n  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10];\n"
        "  edge [fontname=\"Helvetica\", fontsize=9];\n";
  os << "  label=\"" << detail::dot_escape(to_string(m)) << ", " << (pricing.mode == run_mode::training ? "training" : "inference")
     << ": edges name the collectives that reshard a tensor and their modeled time per step\";\n  labelloc=t;\n";
  std::set<std::string> specs_used;
  detail::write_plan_dot_nodes(os, g, chosen, runs, specs_used);
  for (const auto& [uv, e] : detail::plan_dot_edges(g, m, chosen, pricing, runs)) {
    os << "  v" << uv.first << " -> v" << uv.second;
    if (!e.label.empty())
      os << " [label=\"" << detail::dot_escape(e.label) << "\\n" << human_seconds(e.seconds)
         << (e.count > 1 ? " (x " + std::to_string(e.count) + ")" : std::string()) << "\", color=\"#b2182b\", fontcolor=\"#b2182b\"]";
    os << ";\n";
  }
  // The legend: one swatch per output spec drawn.
  os << "  subgraph cluster_legend {\n    label=\"legend: fill = output spec (Alpa notation)\";\n    style=dashed;\n";
  int k = 0;
  for (const std::string& s : specs_used)
    os << "    legend" << k++ << " [label=\"" << detail::dot_escape(s) << "\", shape=box, style=filled, fillcolor=\""
       << detail::spec_colour(s) << "\"];\n";
  os << "    legend_edge [label=\"red edge: resharding\\n(collectives, modeled time)\", shape=plaintext, fontcolor=\"#b2182b\"];\n";
  os << "  }\n}\n";
}

}  // namespace autoshard

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
#include "autosharding.hpp"          // detail::layer_key

namespace autoshard {

namespace detail {

/// The layer index of a name ("transformer.h.7.attn" -> 7), or -1 without a numeric component.
inline long layer_index(const std::string& name) {
  const std::string key = layer_key(name);
  if (key == name) return -1;
  const std::size_t at = key.find('#');
  std::size_t end = at;
  while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
  return end - at > 9 ? -1 : std::stol(name.substr(at, end - at));
}


}  // namespace detail

/// Writes the plan as DOT (see the file comment). `chosen[v]` is vertex v's strategy.
inline void write_plan_dot(std::ostream& os, const model_graph& g, const device_mesh& m,
                           const std::vector<strategy>& chosen, const step_pricing& pricing = {}) {
  const run_mode mode = pricing.mode;
  const std::size_t n = boost::num_vertices(g);
  if (chosen.size() != n)
    throw solver_error("write_plan_dot: " + std::to_string(chosen.size()) + " strategies for " + std::to_string(n) + " vertices");
  // Layers: index -> (layer key -> strategy name); runs of equal signatures collapse.
  std::map<long, std::map<std::string, std::string>> sig;
  for (vertex_t v = 0; v < n; ++v)
    if (const long i = detail::layer_index(g[v].name); i >= 0) sig[i][detail::layer_key(g[v].name)] = chosen[v].name;
  std::map<long, long> run_of;           // layer -> first layer of its run
  std::map<long, long> run_last;         // first layer -> last layer of its run
  std::map<long, long> run_count;        // first layer -> number of layers
  long first = -1, prev = -1;
  for (const auto& [i, s] : sig) {
    if (first < 0 || prev != i - 1 || sig[first] != s) first = i;
    run_of[i] = first;
    run_last[first] = i;
    ++run_count[first];
    prev = i;
  }
  // Every vertex drawn as itself or as its representative in the run's first layer.
  std::map<std::string, vertex_t> by_name;
  for (vertex_t v = 0; v < n; ++v) by_name[g[v].name] = v;
  std::vector<vertex_t> rep(n);
  for (vertex_t v = 0; v < n; ++v) {
    rep[v] = v;
    const long i = detail::layer_index(g[v].name);
    if (i < 0 || run_of[i] == i) continue;
    const std::string key = detail::layer_key(g[v].name);
    const std::string base = key.substr(0, key.find('#')) + std::to_string(run_of[i]) + key.substr(key.find('#') + 1);
    if (auto it = by_name.find(base); it != by_name.end()) rep[v] = it->second;
  }
  auto label_name = [&](vertex_t v) {
    const long i = detail::layer_index(g[v].name);
    if (i < 0 || run_count[run_of[i]] == 1) return g[v].name;
    const std::string key = detail::layer_key(g[v].name);
    return key.substr(0, key.find('#')) + "[" + std::to_string(run_of[i]) + "-" + std::to_string(run_last[run_of[i]]) + "]" +
           key.substr(key.find('#') + 1);
  };
  auto axis_name = [&](std::size_t a) {
    const std::string nm(m.axis_name(a));
    return nm.empty() ? "axis " + std::to_string(a) : nm;
  };

  os << "digraph plan {\n  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10];\n"
        "  edge [fontname=\"Helvetica\", fontsize=9];\n";
  os << "  label=\"" << detail::dot_escape(to_string(m)) << ", " << (mode == run_mode::training ? "training" : "inference")
     << ": edges name the collectives that reshard a tensor and their modeled time per step\";\n  labelloc=t;\n";
  std::set<std::string> specs_used;
  auto node_line = [&](vertex_t v) {
    const std::string spec = to_alpa_string(chosen[v].output);
    specs_used.insert(spec);
    os << "    v" << v << " [label=\"" << detail::dot_escape(label_name(v)) << "\\n" << to_string(g[v].kind) << " "
       << to_string(g[v].shape) << "\\n" << detail::dot_escape(spec) << "\", shape=" << (g[v].is_operator() ? "box" : "ellipse")
       << ", style=filled, fillcolor=\"" << detail::spec_colour(spec) << "\"];\n";
  };
  // Clusters: one per drawn layer (a run), the rest at top level.
  std::map<long, std::vector<vertex_t>> cluster;
  std::vector<vertex_t> loose;
  for (vertex_t v = 0; v < n; ++v) {
    if (rep[v] != v) continue;
    const long i = detail::layer_index(g[v].name);
    if (i >= 0) cluster[run_of[i]].push_back(v);
    else loose.push_back(v);
  }
  for (vertex_t v : loose) node_line(v);
  for (const auto& [i, vs] : cluster) {
    const long cnt = run_count[i];
    os << "  subgraph cluster_layer" << i << " {\n    label=\""
       << (cnt > 1 ? "layers " + std::to_string(i) + "-" + std::to_string(run_last[i]) + " (x " + std::to_string(cnt) +
                         ", tied: the same strategies)"
                   : "layer " + std::to_string(i))
       << "\";\n    style=rounded;\n";
    for (vertex_t v : vs) node_line(v);
    os << "  }\n";
  }
  // Edges between drawn vertices; a collapsed edge counts every layer it stands for.
  struct edge_info {
    std::string label;
    double seconds = 0.0;
    int count = 0;
  };
  std::map<std::pair<vertex_t, vertex_t>, edge_info> edges;
  const std::vector<char> grads = mode == run_mode::training ? detail::gradient_flags(g) : std::vector<char>(n, 0);
  for (auto [it, end] = boost::edges(g); it != end; ++it) {
    const vertex_t u = boost::source(*it, g), v = boost::target(*it, g);
    const sharding_spec& from = chosen[u].output;
    const sharding_spec& to = chosen[v].inputs.at(static_cast<std::size_t>(g[*it].operand));
    edge_info& e = edges[{rep[u], rep[v]}];
    ++e.count;
    // Priced as the pass prices it: forward, and in training the backward (gradient sync).
    const strategy_options so{pricing};
    const bool grad_flows = grads[u] != 0;
    const edge_costs c = price_edge(g, *it, chosen[u], chosen[v], m, grad_flows, backward_pricing_of(g, *it, so));
    if (from == to && !(c.total() > 0)) continue;
    std::string what;
    const auto name_steps = [&](const redist_plan& plan, const char* suffix) {
      for (std::size_t k = 0; k < plan.size(); ++k) {
        if (!is_communication(plan[k].kind) || m.size(plan[k].mesh_axis) == 1) continue;
        what += (what.empty() ? "" : " + ") + std::string(to_string(plan[k].kind)) + " (" + axis_name(plan[k].mesh_axis) + ")" + suffix;
      }
    };
    name_steps(plan_redistribute(m, from, settle_target(from, to), g[u].shape), "");
    if (c.backward > 0)
      name_steps(plan_redistribute(m, chosen[v].grads.at(static_cast<std::size_t>(g[*it].operand)), backward_target(chosen[u]), g[u].shape),
                 " backward");
    if (what.empty()) what = "local slice";
    e.label = what;
    e.seconds += c.total();
  }
  for (const auto& [uv, e] : edges) {
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

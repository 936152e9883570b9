#pragma once
/// Graphviz pictures of the model graph, through Boost.Graph's write_graphviz. Apart from the
/// JSON reader and writer (io.hpp) because boost/graph/graphviz.hpp is the heaviest header the
/// library includes (about 90,000 preprocessed lines on top of Boost.Graph's own): only code
/// that draws pays for it.
///
///   autoshard::write_dot(std::cout, g, {{"transformer.h.0.attn.c_attn", "RS1"}});
#include <cstdint>  // std::uint32_t
#include <map>      // std::map
#include <ostream>  // std::ostream
#include <string>   // std::string

#include <boost/graph/graphviz.hpp>  // write_graphviz

#include "model.hpp"  // model_graph, node, to_string

namespace autoshard {

namespace detail {
inline std::string dot_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}
inline const char* spec_colour(const std::string& spec) {
  static constexpr const char* palette[] = {"#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462",
                                            "#b3de69", "#fccde5", "#bc80bd", "#ccebc5", "#ffed6f", "#d9d9d9"};
  if (spec.find('S') == std::string::npos && spec.find('P') == std::string::npos) return "#ffffff";
  std::uint32_t h = 2166136261u;  // FNV-1a: the same colour for the same spec on every platform
  for (char c : spec) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  return palette[h % (sizeof(palette) / sizeof(palette[0]))];
}
}  // namespace detail

/// Graphviz DOT of the graph: one box per vertex labelled with name, kind, shape and dtype;
/// edges labelled with the operand index. `specs` (vertex name -> spec string, e.g. from a
/// plan) adds the spec to the label and fills the box with a colour per distinct spec.
inline void write_dot(std::ostream& os, const model_graph& g, const std::map<std::string, std::string>& specs = {}) {
  auto vw = [&](std::ostream& out, vertex_t v) {
    const node& n = g[v];
    std::string label = detail::dot_escape(n.name) + "\\n" + std::string(to_string(n.kind)) + " " +
                        to_string(n.shape) + " " + std::string(to_string(n.type));
    auto it = specs.find(n.name);
    if (it != specs.end()) label += "\\n" + detail::dot_escape(it->second);
    out << "[label=\"" << label << "\", shape=" << (n.is_operator() ? "box" : "ellipse");
    if (it != specs.end()) out << ", style=filled, fillcolor=\"" << detail::spec_colour(it->second) << "\"";
    out << "]";
  };
  auto ew = [&](std::ostream& out, edge_t e) { out << "[label=\"" << g[e].operand << "\"]"; };
  auto gw = [](std::ostream& out) { out << "node [fontname=\"Helvetica\", fontsize=10];\n"; };
  boost::write_graphviz(os, g, vw, ew, gw);
}

}  // namespace autoshard

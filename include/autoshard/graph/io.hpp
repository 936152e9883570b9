#pragma once
/// JSON model files and Graphviz pictures.
///
/// JSON format (version 1), one object per vertex; operands by name, in operand order:
///   {"format": "autoshard.graph", "version": 1,
///    "nodes": [
///      {"name": "x", "kind": "input", "shape": [8, 768], "dtype": "bf16"},
///      {"name": "fc.weight", "kind": "parameter", "shape": [3072, 768], "dtype": "bf16"},
///      {"name": "fc", "kind": "linear", "shape": [8, 3072], "dtype": "bf16",
///       "inputs": ["x", "fc.weight"], "attrs": {"transposed_weight": false}}]}
/// "kind" is an op_kind spelling (to_string(op_kind)); "dtype" a dtype spelling ("f32", "bf16",
/// "float16", ...); "attrs" may hold transposed_weight, causal (booleans), axis, heads,
/// kv_heads, start, length (integers) and dims (array of integers); omitted ones keep their
/// defaults. A malformed file throws io_error naming the JSON path
/// ("/nodes/3/shape/1: expected a non-negative integer"); a well-formed file describing an
/// invalid graph throws graph_error naming the vertex (see validate()).
///
///   autoshard::write_json(std::cout, g);
///   autoshard::model_graph h = autoshard::read_json(in);
///   autoshard::write_dot(std::cout, g, {{"transformer.h.0.attn.c_attn", "RS1"}});
#include <cstdint>        // std::uint32_t
#include <fstream>        // std::ifstream
#include <istream>        // std::istream
#include <map>            // std::map
#include <ostream>        // std::ostream
#include <string>         // std::string
#include <unordered_map>  // std::unordered_map

#include <boost/graph/graphviz.hpp>  // write_graphviz
#include <nlohmann/json.hpp>         // nlohmann::json

#include "model.hpp"     // model_graph
#include "validate.hpp"  // validate

namespace autoshard {

/// The graph as a JSON value (format above).
inline nlohmann::json to_json(const model_graph& g) {
  using nlohmann::json;
  json nodes = json::array();
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    const node& n = g[v];
    json j;
    j["name"] = n.name;
    j["kind"] = std::string(to_string(n.kind));
    j["shape"] = n.shape.to_vector();
    j["dtype"] = std::string(to_string(n.type));
    if (n.is_operator()) {
      json ins = json::array();
      for (vertex_t u : operands(g, v)) ins.push_back(g[u].name);
      j["inputs"] = ins;
      const op_attrs& a = n.attrs;
      const op_attrs d{};
      json at = json::object();
      if (a.transposed_weight != d.transposed_weight) at["transposed_weight"] = a.transposed_weight;
      if (a.causal != d.causal) at["causal"] = a.causal;
      if (a.axis != d.axis) at["axis"] = a.axis;
      if (a.heads != d.heads) at["heads"] = a.heads;
      if (a.kv_heads != d.kv_heads) at["kv_heads"] = a.kv_heads;
      if (a.start != d.start) at["start"] = a.start;
      if (a.length != d.length) at["length"] = a.length;
      if (!a.dims.empty()) at["dims"] = a.dims;
      if (!at.empty()) j["attrs"] = at;
    }
    nodes.push_back(std::move(j));
  }
  return json{{"format", "autoshard.graph"}, {"version", 1}, {"nodes", std::move(nodes)}};
}

inline void write_json(std::ostream& os, const model_graph& g, int indent = 1) { os << to_json(g).dump(indent) << '\n'; }

namespace detail {
[[noreturn]] inline void bad_json(const std::string& path, const std::string& why) { throw io_error(path + ": " + why); }

inline const nlohmann::json& member(const nlohmann::json& obj, const std::string& path, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) bad_json(path, std::string("missing \"") + key + "\"");
  return *it;
}
inline std::int64_t json_int(const nlohmann::json& j, const std::string& path, std::int64_t lo, const char* what) {
  if (!j.is_number_integer() || j.get<std::int64_t>() < lo) bad_json(path, std::string("expected ") + what);
  return j.get<std::int64_t>();
}
inline std::string json_string(const nlohmann::json& j, const std::string& path) {
  if (!j.is_string()) bad_json(path, "expected a string");
  return j.get<std::string>();
}
inline std::vector<std::int64_t> json_ints(const nlohmann::json& j, const std::string& path, std::int64_t lo, const char* what) {
  if (!j.is_array()) bad_json(path, "expected an array");
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < j.size(); ++i) out.push_back(json_int(j[i], path + "/" + std::to_string(i), lo, what));
  return out;
}
inline op_attrs json_attrs(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object()) bad_json(path, "expected an object");
  op_attrs a;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string p = path + "/" + it.key();
    const auto& val = it.value();
    auto flag = [&] {
      if (!val.is_boolean()) bad_json(p, "expected true or false");
      return val.get<bool>();
    };
    auto small = [&](std::int64_t lo) {
      const std::int64_t x = json_int(val, p, lo, lo < 0 ? "an integer" : "a non-negative integer");
      if (x > 1'000'000'000) bad_json(p, "value too large");
      return static_cast<int>(x);
    };
    if (it.key() == "transposed_weight") a.transposed_weight = flag();
    else if (it.key() == "causal") a.causal = flag();
    else if (it.key() == "axis") a.axis = small(-64);
    else if (it.key() == "heads") a.heads = small(0);
    else if (it.key() == "kv_heads") a.kv_heads = small(0);
    else if (it.key() == "start") a.start = json_int(val, p, 0, "a non-negative integer");
    else if (it.key() == "length") a.length = json_int(val, p, 0, "a non-negative integer");
    else if (it.key() == "dims") a.dims = json_ints(val, p, 0, "a non-negative integer");
    else bad_json(p, "unknown attribute");
  }
  return a;
}
}  // namespace detail

/// Builds and validates a graph from a JSON value.
inline model_graph from_json(const nlohmann::json& j) {
  using detail::bad_json;
  if (!j.is_object()) bad_json("", "expected an object with \"nodes\"");
  if (auto f = j.find("format"); f != j.end() && (!f->is_string() || *f != "autoshard.graph"))
    bad_json("/format", "expected \"autoshard.graph\"");
  if (auto ver = j.find("version"); ver != j.end() && (!ver->is_number_integer() || *ver != 1))
    bad_json("/version", "only version 1 is supported");
  const auto& nodes = detail::member(j, "", "nodes");
  if (!nodes.is_array()) bad_json("/nodes", "expected an array");
  model_graph g;
  std::unordered_map<std::string, vertex_t> by_name;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const std::string p = "/nodes/" + std::to_string(i);
    const auto& jn = nodes[i];
    if (!jn.is_object()) bad_json(p, "expected an object");
    node n;
    n.name = detail::json_string(detail::member(jn, p, "name"), p + "/name");
    if (n.name.empty()) bad_json(p + "/name", "a name cannot be empty");
    const std::string kind = detail::json_string(detail::member(jn, p, "kind"), p + "/kind");
    auto k = parse_op_kind(kind);
    if (!k) throw graph_error("vertex '" + n.name + "' (" + p + "/kind): unknown operator kind '" + kind + "'");
    n.kind = *k;
    const auto dims = detail::json_ints(detail::member(jn, p, "shape"), p + "/shape", 0, "a non-negative integer");
    if (dims.size() > max_tensor_rank) bad_json(p + "/shape", "a tensor has at most 8 dims");
    n.shape = tensor_shape(dims);
    const std::string ts = detail::json_string(detail::member(jn, p, "dtype"), p + "/dtype");
    auto t = parse_dtype(ts);
    if (!t) bad_json(p + "/dtype", "unknown dtype '" + ts + "'");
    n.type = *t;
    if (auto a = jn.find("attrs"); a != jn.end()) n.attrs = detail::json_attrs(*a, p + "/attrs");
    if (!by_name.emplace(n.name, i).second) bad_json(p + "/name", "name '" + n.name + "' is used twice");
    boost::add_vertex(std::move(n), g);
  }
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const std::string p = "/nodes/" + std::to_string(i);
    auto it = nodes[i].find("inputs");
    if (it == nodes[i].end()) continue;
    if (!it->is_array()) bad_json(p + "/inputs", "expected an array of node names");
    for (std::size_t k = 0; k < it->size(); ++k) {
      const std::string name = detail::json_string((*it)[k], p + "/inputs/" + std::to_string(k));
      auto u = by_name.find(name);
      if (u == by_name.end()) bad_json(p + "/inputs/" + std::to_string(k), "no node is called '" + name + "'");
      boost::add_edge(u->second, i, edge{static_cast<int>(k)}, g);
    }
  }
  validate(g);
  return g;
}

/// Reads a JSON model; a syntax error is an io_error with its byte offset.
inline model_graph read_json(std::istream& in) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e999
    throw io_error(std::string("not valid JSON: ") + e.what());
  }
  return from_json(j);
}

inline model_graph read_json_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw io_error("cannot open '" + path + "'");
  try {
    return read_json(f);
  } catch (const io_error& e) {
    throw io_error(path + ": " + std::string(e.what()).substr(std::string_view("autoshard: io error: ").size()));
  }
}

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

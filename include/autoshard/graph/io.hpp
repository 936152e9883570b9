#pragma once
/// JSON model files (Graphviz pictures: dot.hpp).
///
/// JSON format (version 1), one object per vertex; operands by name, in operand order:
///   {"format": "autoshard.graph", "version": 1,
///    "nodes": [
///      {"name": "x", "kind": "input", "shape": [8, 768], "dtype": "bf16"},
///      {"name": "fc.weight", "kind": "parameter", "shape": [3072, 768], "dtype": "bf16"},
///      {"name": "fc", "kind": "linear", "shape": [8, 3072], "dtype": "bf16",
///       "inputs": ["x", "fc.weight"], "attrs": {"transposed_weight": false}}]}
/// "kind" is an op_kind spelling (to_string(op_kind)); "dtype" a dtype spelling ("f32", "bf16",
/// "float16", ...); "attrs" may hold transposed_weight, causal, dropout, rotary_half (booleans),
/// axis, heads, kv_heads, start, length (integers), window (an integer: a causal attention's
/// sliding window of keys, at most max_attention_window; 0 or absent: none), alibi (an
/// attention's ALiBi position bias, "bloom" or "falcon": alibi_rule; "none" or absent: none), rotary_base (a
/// number above 1), epsilon (a layer_norm's or rms_norm's, a number: checked finite and in (0,
/// max_norm_epsilon] at shape inference, naming the vertex; absent: default_norm_epsilon),
/// weight_offset (a norm's, a finite number: the row times weight_offset + weight, Gemma's 1;
/// absent: 0), scale (an embedding's, a finite number its rows are multiplied by, Gemma's
/// sqrt(hidden); a rotary's, its cos and sin times it, YaRN's attention_factor, checked above 0
/// at shape inference; written only when not 1; absent: 1),
/// rotary_dims (an integer: the dims of each head a rotary turns, at most
/// 2 x max_rotary_frequencies; 0 or absent: the whole head; checked even and within the head at
/// shape inference), rotary_frequencies (array of numbers above 0, one per pair of the turned
/// dims: at most max_rotary_frequencies, the count checked against them), rotary_rule (a
/// rotary's sequence-dependent rope, graph/rope.hpp: {"type": "dynamic", "threshold": M,
/// "factor": f} or {"type": "longrope", "threshold": original_max_position_embeddings,
/// "short_factor": [...], "long_factor": [...]}, threshold an integer in [1, max_rope_threshold],
/// each list at most max_rotary_frequencies; checked at shape inference against the turned dims
/// and the rotary_frequencies, which must be the rule's at the input's sequence after
/// rotary_offset; absent: none), rotary_offset (a rotary's first position, an integer in [0,
/// max_attention_window]: a step after a key/value cache; absent: 0),
/// dims (array of integers), op_type (the source
/// format's operator of an "opaque" vertex, a string) and elementwise (a boolean: an opaque
/// vertex whose operands broadcast to its output, which then has no dims); an "input" vertex's
/// only held (a boolean: data the model holds, not fed each step) and kv_cache (a boolean: a
/// key/value cache an attention reads as its operand 3 or 4; validate()); omitted ones keep their
/// defaults. A malformed file throws io_error naming the JSON path
/// ("nodes[3].shape[1] is -1, not an integer in [0, ...]"); a well-formed file describing an
/// invalid graph throws graph_error naming the vertex (see validate()).
///
///   autoshard::write_json(std::cout, g);
///   autoshard::model_graph h = autoshard::read_json(in);
#include <cstdint>        // std::uint32_t
#include <filesystem>     // std::filesystem::file_size
#include <iterator>       // std::istreambuf_iterator
#include <limits>         // std::numeric_limits
#include <istream>        // std::istream
#include <map>            // std::map
#include <ostream>        // std::ostream
#include <string>         // std::string
#include <unordered_map>  // std::unordered_map

#include <nlohmann/json.hpp>         // nlohmann::json

#include "../io/json.hpp"  // json_in, load_json_file
#include "hf_config.hpp"    // hf_config_max_bytes
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
      if (a.window != d.window) at["window"] = a.window;
      if (a.alibi != d.alibi) at["alibi"] = std::string(to_string(a.alibi));
      if (a.dropout != d.dropout) at["dropout"] = a.dropout;
      if (a.axis != d.axis) at["axis"] = a.axis;
      if (a.heads != d.heads) at["heads"] = a.heads;
      if (a.kv_heads != d.kv_heads) at["kv_heads"] = a.kv_heads;
      if (a.rotary_half != d.rotary_half) at["rotary_half"] = a.rotary_half;
      if (a.rotary_base != d.rotary_base) at["rotary_base"] = a.rotary_base;  // nlohmann writes a double back exactly
      if (a.rotary_dims != d.rotary_dims) at["rotary_dims"] = a.rotary_dims;
      if (a.epsilon != d.epsilon) at["epsilon"] = a.epsilon;  // exactly, as rotary_base
      if (a.weight_offset != d.weight_offset) at["weight_offset"] = a.weight_offset;
      if (a.scale != d.scale) at["scale"] = a.scale;
      if (!a.rotary_frequencies.empty()) at["rotary_frequencies"] = a.rotary_frequencies;
      if (const rope_rule& r = a.rotary_rule; r.kind != rope_rule_kind::none) {
        json rule{{"type", std::string(to_string(r.kind))}, {"threshold", r.threshold}};
        if (r.kind == rope_rule_kind::dynamic) rule["factor"] = r.factor;  // exactly, as rotary_base
        if (r.kind == rope_rule_kind::longrope) rule["short_factor"] = r.short_factor, rule["long_factor"] = r.long_factor;
        at["rotary_rule"] = std::move(rule);
      }
      if (a.rotary_offset != d.rotary_offset) at["rotary_offset"] = a.rotary_offset;
      if (a.start != d.start) at["start"] = a.start;
      if (a.length != d.length) at["length"] = a.length;
      if (!a.dims.empty()) at["dims"] = a.dims;
      if (!a.op_type.empty()) at["op_type"] = a.op_type;
      if (a.elementwise != d.elementwise) at["elementwise"] = a.elementwise;
      if (!at.empty()) j["attrs"] = at;
    } else if (n.is_input() && (n.attrs.held || n.attrs.kv_cache)) {
      json at;  // both set is refused when read back: validate says why
      if (n.attrs.held) at["held"] = true;
      if (n.attrs.kv_cache) at["kv_cache"] = true;
      j["attrs"] = std::move(at);
    }
    nodes.push_back(std::move(j));
  }
  return json{{"format", "autoshard.graph"}, {"version", 1}, {"nodes", std::move(nodes)}};
}

inline void write_json(std::ostream& os, const model_graph& g, int indent = 1) { os << to_json(g).dump(indent) << '\n'; }

namespace detail {
/// A rotary's rule (format above): its type, threshold, and dynamic's factor or longrope's
/// lists, each list at most max_rotary_frequencies long; a member the type does not have is
/// refused. Checked against the rotary's turned dims and frequencies at shape inference.
inline rope_rule json_rope_rule(const json_in& j) {
  rope_rule r;
  r.kind = enum_value(j["type"], all_rope_rule_kinds);
  if (r.kind == rope_rule_kind::none) j["type"].fail("is \"none\": a rotary without a rule has no rotary_rule");
  r.threshold = j["threshold"].integer(1, max_rope_threshold);
  const bool dynamic = r.kind == rope_rule_kind::dynamic;
  for (const auto& [key, val] : j.members()) {
    if (key == "type" || key == "threshold") continue;
    if (dynamic && key == "factor") r.factor = val.number(1e-6, 1e6);
    else if (!dynamic && (key == "short_factor" || key == "long_factor")) {
      std::vector<double>& list = key == "short_factor" ? r.short_factor : r.long_factor;
      for (const json_in& f : val.elements(max_rotary_frequencies))
        list.push_back(f.number(std::numeric_limits<double>::min(), std::numeric_limits<double>::max()));
    } else
      val.fail(dynamic ? "is not a member of a dynamic rule (type, threshold, factor)"
                       : "is not a member of a longrope rule (type, threshold, short_factor, long_factor)");
  }
  if (dynamic && !j.find("factor")) j.fail("has no \"factor\", which a dynamic rule needs");
  if (!dynamic && (!j.find("short_factor") || !j.find("long_factor")))
    j.fail("has no \"" + std::string(j.find("short_factor") ? "long_factor" : "short_factor") + "\", which a longrope rule needs");
  return r;
}

inline op_attrs json_attrs(const json_in& j) {
  op_attrs a;
  for (const auto& [key, val] : j.members()) {
    if (key == "transposed_weight") a.transposed_weight = val.boolean();
    else if (key == "causal") a.causal = val.boolean();
    else if (key == "window") a.window = val.integer(0, max_attention_window);  // checked against causal at shape inference
    else if (key == "alibi") a.alibi = enum_value(val, all_alibi_rules);
    else if (key == "dropout") a.dropout = val.boolean();
    else if (key == "axis") a.axis = val.small_integer(-64, 64);
    else if (key == "heads") a.heads = val.small_integer(0, 1'000'000'000);
    else if (key == "kv_heads") a.kv_heads = val.small_integer(0, 1'000'000'000);
    else if (key == "rotary_half") a.rotary_half = val.boolean();
    else if (key == "rotary_base") a.rotary_base = val.number(1.0, 1e300);
    else if (key == "rotary_dims") a.rotary_dims = val.integer(0, 2 * static_cast<std::int64_t>(max_rotary_frequencies));  // checked against the head at shape inference
    else if (key == "epsilon") a.epsilon = val.number();  // checked against (0, max_norm_epsilon] at shape inference, naming the vertex
    else if (key == "weight_offset") a.weight_offset = val.number();  // finite, checked at shape inference
    else if (key == "scale") a.scale = val.number();
    else if (key == "rotary_frequencies") {  // the count is checked against the turned dims at shape inference
      for (const json_in& f : val.elements(max_rotary_frequencies))
        a.rotary_frequencies.push_back(f.number(std::numeric_limits<double>::min(), std::numeric_limits<double>::max()));
    }
    else if (key == "rotary_rule") a.rotary_rule = json_rope_rule(val.require_object());
    else if (key == "start") a.start = val.integer(0);
    else if (key == "length") a.length = val.integer(0);
    else if (key == "dims") a.dims = val.integers(0, std::numeric_limits<std::int64_t>::max(), max_tensor_rank);
    else if (key == "op_type") a.op_type = val.string();
    else if (key == "elementwise") a.elementwise = val.boolean();
    else if (key == "rotary_offset") a.rotary_offset = val.integer(0, max_attention_window);
    else if (key == "held") a.held = val.boolean();
    else if (key == "kv_cache") a.kv_cache = val.boolean();
    else val.fail("is not an attribute (transposed_weight, causal, window, alibi, dropout, axis, heads, kv_heads, rotary_half, rotary_base, rotary_dims, rotary_frequencies, rotary_rule, rotary_offset, epsilon, weight_offset, scale, start, length, dims, op_type, elementwise, held, kv_cache)");
  }
  return a;
}
}  // namespace detail

/// Builds and validates a graph from a JSON value reached at `j` (a model file, or a plan's
/// "graph" member): io_error naming the JSON path for a malformed value, graph_error naming
/// the vertex for a well-formed invalid graph.
inline model_graph from_json(const json_in& j) {
  j.require_object();
  if (auto f = j.find("format")) f->one_of({"autoshard.graph"});
  if (auto ver = j.find("version"); ver && ver->integer() != 1) ver->fail("is " + detail::json_excerpt(ver->raw()) + "; only version 1 is supported");
  const json_in nodes = j["nodes"];
  const std::size_t count = nodes.size(std::size_t{1} << 24);
  model_graph g;
  std::unordered_map<std::string, vertex_t> by_name;
  for (std::size_t i = 0; i < count; ++i) {
    const json_in jn = nodes[i].require_object();
    node n;
    n.name = jn["name"].string();
    if (n.name.empty()) jn["name"].fail("is empty: a vertex needs a name");
    const std::string kind = jn["kind"].string();
    auto k = parse_op_kind(kind);
    if (!k) throw graph_error("vertex " + quoted_text(n.name) + " (" + jn["kind"].path() + "): unknown operator kind " + quoted_text(kind));
    n.kind = *k;
    n.shape = tensor_shape(jn["shape"].integers(0, std::numeric_limits<std::int64_t>::max(), max_tensor_rank));
    const std::string ts = jn["dtype"].string();
    auto t = parse_dtype(ts);
    if (!t) jn["dtype"].fail("is " + quoted_text(ts) + ", not a dtype (f32, f16, bf16, f64, i32, i64, u8, ...)");
    n.type = *t;
    if (auto a = jn.find("attrs")) n.attrs = detail::json_attrs(a->require_object());
    if (!by_name.emplace(n.name, i).second) jn["name"].fail("is " + quoted_text(n.name) + ", a name used twice");
    boost::add_vertex(std::move(n), g);
  }
  for (std::size_t i = 0; i < count; ++i) {
    auto ins = nodes[i].find("inputs");
    if (!ins) continue;
    const std::size_t k_count = ins->size(64);
    for (std::size_t k = 0; k < k_count; ++k) {
      const json_in in = (*ins)[k];
      const std::string name = in.string();
      auto u = by_name.find(name);
      if (u == by_name.end()) in.fail("names " + quoted_text(name) + ", but no node is called that");
      boost::add_edge(u->second, i, edge{static_cast<int>(k)}, g);
    }
  }
  validate(g);
  return g;
}
inline model_graph from_json(const nlohmann::json& j) { return from_json(json_in(j, "model JSON")); }

/// Reads a JSON model; a syntax error is an io_error with its byte offset.
inline model_graph read_json(std::istream& in) {
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return from_json(parse_json_text(text, "model JSON"));
}

/// Reads a JSON model file (a regular file; io_error naming the file and the JSON path).
inline model_graph read_json_file(const std::string& path) {
  const nlohmann::json j = load_json_file(path, "model file");
  const json_in in(j, "model file " + quoted_path(path));
  // A Hugging Face config too large to be read as one (above hf_config_max_bytes) is named as
  // what it is (it was reported as a model file without "nodes").
  if (j.is_object() && !j.contains("nodes") && j.contains("model_type") && j["model_type"].is_string()) {
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(path, ec);
    in.fail("has a \"model_type\" and no \"nodes\": a Hugging Face config.json, of " +
            (ec ? std::string("unknown size") : std::to_string(bytes) + " bytes") + ", but a config is read only up to " +
            std::to_string(hf_config_max_bytes) + " bytes (16 MiB, hf_config_max_bytes)");
  }
  return from_json(in);
}

}  // namespace autoshard

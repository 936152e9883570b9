#pragma once
/// Read and write the ASPLOS 2025 IOPDDL contest format (google/iopddl):
///   {"problem": {"name": "example",
///                "nodes": {"intervals": [[30, 70], ...], "costs": [[15], ...], "usages": [[10], ...]},
///                "edges": {"nodes": [[0, 1], ...], "costs": [[30, 40], ...]},
///                "usage_limit": 50}}
/// Edge costs are the row-major |S_from| x |S_to| matrix. Intervals are half-open. Costs and
/// usages are int64 as in the contest; a cost >= 1e18 (the contest's infinity) forbids a choice,
/// and so does any larger integer. Two extensions, both optional and ignored by contest tools:
/// "nodes": {"names": [...]}, and the string "inf" for a forbidden cost (read as 1e18). A
/// missing or null usage_limit means none. Solutions are the contest's list of strategy indices.
///   auto p = autoshard::read_iopddl_file("example.json");
///   autoshard::write_iopddl_file("copy.json", p);
///   std::vector<int> s = autoshard::read_iopddl_solution_file("answer.json", p);   // [0, 0, 2, 1, 0]
///   autoshard::write_iopddl_solution_file("answer.json", s);
/// Malformed input throws io_error naming the JSON path, e.g. "problem.edges.costs[2]".
#include <cmath>       // std::trunc
#include <cstdint>     // std::int64_t
#include <limits>      // std::numeric_limits
#include <filesystem>  // std::filesystem::path
#include <iterator>    // std::istreambuf_iterator
#include <optional>    // std::optional
#include <istream>     // std::istream
#include <ostream>     // std::ostream
#include <string>      // std::string
#include <vector>      // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "../core/error.hpp"       // io_error, solver_error
#include "../io/atomic_file.hpp"   // write_file_atomically
#include "../io/json.hpp"          // json_in, load_json_file, parse_json_text
#include "problem.hpp"        // strategy_problem

namespace autoshard {

namespace detail::iopddl {

constexpr std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();

/// An int64 in [lo, hi] (the contest's writers emit integers; an integral float, 3.0, is taken
/// too). Errors are json_in's: "<source>: problem.nodes.usages[1][0] is -4, not ...".
inline std::int64_t whole(const json_in& in, std::int64_t lo, std::int64_t hi) {
  const nlohmann::json& j = in.raw();
  if (j.is_number_float()) {
    const double d = j.get<double>();
    if (std::trunc(d) == d && d >= static_cast<double>(lo) && d <= static_cast<double>(hi) && std::abs(d) < 9.2e18)
      return static_cast<std::int64_t>(d);
  }
  return in.integer(lo, hi);
}

/// An int64 cost: a non-negative integer (an integral float too); any value >= 1e18, beyond
/// int64 included, and the string "inf" forbid the choice. The common case (a non-negative
/// integer) is checked on the raw value; a path is built only for an error.
inline std::int64_t cost(const nlohmann::json& j, const json_in& parent, std::size_t i) {
  if (const std::optional<std::uint64_t> u = json_uint64(j))
    return *u > static_cast<std::uint64_t>(int64_max) ? infinite_cost : static_cast<std::int64_t>(*u);
  if (j.is_number_float()) {
    const double d = j.get<double>();
    if (d >= 0.0 && std::trunc(d) == d) return d >= 1e18 ? infinite_cost : static_cast<std::int64_t>(d);
  }
  if (j.is_string() && (j.get<std::string>() == "inf" || j.get<std::string>() == "Infinity")) return infinite_cost;
  parent[i].fail_expected("a cost (a non-negative integer; 1e18 or more, or \"inf\", forbids the choice)");
}

/// Reads every cost of an array of costs.
inline std::vector<std::int64_t> costs(const json_in& in) {
  in.require_array();
  std::vector<std::int64_t> out;
  out.reserve(in.raw().size());
  for (std::size_t i = 0; i < in.raw().size(); ++i) out.push_back(cost(in.raw()[i], in, i));
  return out;
}

inline strategy_problem parse_iopddl_impl(const json_in& doc) {
  strategy_problem p;
  const json_in prob = doc["problem"];
  if (auto name = prob.find("name")) p.name = name->string();
  const json_in nodes = prob["nodes"];
  const json_in intervals = nodes["intervals"], node_costs = nodes["costs"], usages = nodes["usages"];
  const std::size_t n = node_costs.size();
  if (intervals.size() != n || usages.size() != n)
    nodes.fail("has " + std::to_string(intervals.size()) + " intervals, " + std::to_string(n) + " costs and " +
               std::to_string(usages.size()) + " usages; all three must match");
  const std::optional<json_in> names = nodes.find("names");
  if (names && names->size() != n)
    names->fail("has " + std::to_string(names->size()) + " names for " + std::to_string(n) + " nodes");
  p.nodes.resize(n);
  for (std::size_t v = 0; v < n; ++v) {
    strategy_node& node = p.nodes[v];
    const json_in iv = intervals[v];
    if (iv.size() != 2) iv.fail_expected("[begin, end]");
    node.live = {whole(iv[0], 0, int64_max), whole(iv[1], 0, int64_max)};
    if (node.live.end < node.live.begin) iv.fail("ends before it begins: " + detail::json_excerpt(iv.raw()));
    const json_in cv = node_costs[v];
    node.costs = costs(cv);
    if (node.costs.empty()) cv.fail("is empty; a node needs at least one strategy");
    const json_in uv = usages[v];
    if (uv.size() != node.costs.size())
      uv.fail("has " + std::to_string(uv.size()) + " usages for " + std::to_string(node.costs.size()) + " strategies");
    node.usages.reserve(uv.size());
    for (std::size_t i = 0; i < uv.size(); ++i) node.usages.push_back(whole(uv[i], 0, int64_max));
    if (names) node.name = (*names)[v].string();
  }
  const json_in edges = prob["edges"];
  const json_in ends = edges["nodes"], edge_costs = edges["costs"];
  if (ends.size() != edge_costs.size())
    edges.fail("has " + std::to_string(ends.size()) + " node pairs but " + std::to_string(edge_costs.size()) +
               " cost lists");
  p.edges.resize(ends.size());
  const auto last = static_cast<std::int64_t>(n) - 1;
  for (std::size_t e = 0; e < ends.size(); ++e) {
    const json_in uv = ends[e];
    if (uv.size() != 2) uv.fail_expected("[from, to]");
    if (n == 0) uv.fail("names a node, but the problem has none");
    strategy_edge& ed = p.edges[e];
    ed.from = static_cast<std::size_t>(whole(uv[0], 0, last));
    ed.to = static_cast<std::size_t>(whole(uv[1], 0, last));
    const json_in cv = edge_costs[e];
    ed.costs = costs(cv);
    const std::size_t su = p.nodes[ed.from].costs.size(), sv = p.nodes[ed.to].costs.size();
    if (ed.costs.size() != su * sv)
      cv.fail("has " + std::to_string(ed.costs.size()) + " costs for edge [" + std::to_string(ed.from) + ", " +
              std::to_string(ed.to) + "], expected " + std::to_string(su) + "x" + std::to_string(sv) + " = " +
              std::to_string(su * sv));
  }
  if (auto limit = prob.find("usage_limit")) p.usage_limit = whole(*limit, 0, int64_max);
  return p;
}
}  // namespace detail::iopddl

/// Parse an IOPDDL document; `source` names it in messages ("IOPDDL problem 'x.json'").
inline strategy_problem parse_iopddl(const nlohmann::json& doc, const std::string& source = "IOPDDL document") {
  return detail::iopddl::parse_iopddl_impl(json_in(doc, source));
}

/// Read an IOPDDL document from a stream; `source` names it in messages.
inline strategy_problem read_iopddl(std::istream& in, const std::string& source = "<stream>") {
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return parse_iopddl(parse_json_text(text, source), source);
}

/// Read an IOPDDL file (a regular file: a FIFO or a directory is refused without waiting).
inline strategy_problem read_iopddl_file(const std::filesystem::path& file) {
  const std::string what = "IOPDDL problem";
  return parse_iopddl(load_json_file(file.string(), what), what + " '" + file.string() + "'");
}

/// The IOPDDL document of a problem (names only when some node has one).
inline nlohmann::json to_iopddl_json(const strategy_problem& p) {
  p.validate();
  nlohmann::json intervals = nlohmann::json::array(), costs = nlohmann::json::array(),
                 usages = nlohmann::json::array(), names = nlohmann::json::array();
  bool any_name = false;
  for (const strategy_node& n : p.nodes) {
    intervals.push_back({n.live.begin, n.live.end});
    nlohmann::json c = nlohmann::json::array();
    for (std::int64_t x : n.costs) c.push_back(x);
    costs.push_back(std::move(c));
    usages.push_back(n.usages);
    names.push_back(n.name);
    any_name = any_name || !n.name.empty();
  }
  nlohmann::json ends = nlohmann::json::array(), ecosts = nlohmann::json::array();
  for (const strategy_edge& e : p.edges) {
    ends.push_back({e.from, e.to});
    nlohmann::json c = nlohmann::json::array();
    for (std::int64_t x : e.costs) c.push_back(x);
    ecosts.push_back(std::move(c));
  }
  nlohmann::json nodes = {{"intervals", intervals}, {"costs", costs}, {"usages", usages}};
  if (any_name) nodes["names"] = names;
  nlohmann::json prob = {{"name", p.name}, {"nodes", nodes}, {"edges", {{"nodes", ends}, {"costs", ecosts}}}};
  if (p.usage_limit) prob["usage_limit"] = *p.usage_limit;
  return {{"problem", prob}};
}

/// Write a problem as IOPDDL JSON.
inline void write_iopddl(std::ostream& out, const strategy_problem& p) {
  out << to_iopddl_json(p).dump() << '\n';
  if (!out) throw io_error("writing the IOPDDL document failed");
}

/// Write a problem to an IOPDDL file.
inline void write_iopddl_file(const std::filesystem::path& file, const strategy_problem& p) {
  write_file_atomically(file, to_iopddl_json(p).dump() + "\n");
}

/// Parse a solution in the contest's format, a JSON list of strategy indices, one per node of `p`.
inline std::vector<int> parse_iopddl_solution(const nlohmann::json& doc, const strategy_problem& p,
                                              const std::string& source = "<solution>") {
  const json_in in(doc, source);
  if (!doc.is_array()) in.fail_expected("a list of strategy indices");
  if (doc.size() != p.nodes.size())
    in.fail("has " + std::to_string(doc.size()) + " strategy indices for " + std::to_string(p.nodes.size()) + " nodes");
  std::vector<int> choice(doc.size());
  for (std::size_t v = 0; v < doc.size(); ++v) {
    const std::int64_t count = static_cast<std::int64_t>(p.nodes[v].costs.size());
    const json_in x = in[v];
    const std::optional<std::int64_t> c = json_int64(x.raw());
    if (!c || *c < 0 || *c >= count) x.fail_expected("a strategy index in [0, " + std::to_string(count) + ") of " + p.node_label(v));
    choice[v] = static_cast<int>(*c);
  }
  return choice;
}

/// Read a solution file for `p` (see parse_iopddl_solution).
inline std::vector<int> read_iopddl_solution_file(const std::filesystem::path& file, const strategy_problem& p) {
  const std::string what = "solution";
  return parse_iopddl_solution(load_json_file(file.string(), what), p, what + " '" + file.string() + "'");
}

/// Write a solution in the contest's format: `[0, 0, 2, 1, 0]`.
inline void write_iopddl_solution_file(const std::filesystem::path& file, const std::vector<int>& choice) {
  write_file_atomically(file, nlohmann::json(choice).dump() + "\n");
}

}  // namespace autoshard

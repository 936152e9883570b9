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
#include <fstream>     // std::ifstream, std::ofstream
#include <istream>     // std::istream
#include <ostream>     // std::ostream
#include <stdexcept>   // std::runtime_error
#include <string>      // std::string
#include <system_error>  // std::error_code
#include <vector>      // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "../core/error.hpp"       // io_error, solver_error
#include "../io/atomic_file.hpp"   // write_file_atomically
#include "problem.hpp"        // strategy_problem

namespace autoshard {

namespace detail::iopddl {

/// A malformed document, before the source name is known.
struct bad_json : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline std::string json_kind(const nlohmann::json& j) { return j.type_name(); }

inline const nlohmann::json& json_member(const nlohmann::json& obj, const char* key, const std::string& path) {
  if (!obj.is_object()) throw bad_json(path + ": expected an object, got " + json_kind(obj));
  auto it = obj.find(key);
  if (it == obj.end()) throw bad_json(path + ": missing member \"" + key + "\"");
  return *it;
}

inline const nlohmann::json& json_array(const nlohmann::json& j, const std::string& path) {
  if (!j.is_array()) throw bad_json(path + ": expected an array, got " + json_kind(j));
  return j;
}

inline std::int64_t json_int(const nlohmann::json& j, const std::string& path) {
  if (j.is_number_unsigned() && j.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    throw bad_json(path + ": " + j.dump() + " is beyond int64");
  if (j.is_number_integer()) return j.get<std::int64_t>();
  if (j.is_number_float()) {
    const double d = j.get<double>();
    if (std::trunc(d) == d && std::abs(d) < 9.2e18) return static_cast<std::int64_t>(d);
  }
  throw bad_json(path + ": expected an integer, got " + (j.is_number() ? j.dump() : json_kind(j)));
}

/// An int64 cost: a non-negative integer (an integral float too); any value >= 1e18, beyond
/// int64 included, and the string "inf" forbid the choice.
inline std::int64_t json_cost(const nlohmann::json& j, const std::string& path) {
  if (j.is_number_unsigned() && j.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    return infinite_cost;
  if (j.is_number_integer()) {
    const std::int64_t c = j.get<std::int64_t>();
    if (c < 0) throw bad_json(path + ": negative cost " + std::to_string(c));
    return c;
  }
  if (j.is_number_float()) {
    const double d = j.get<double>();
    if (d >= 0.0 && std::trunc(d) == d) return d >= 1e18 ? infinite_cost : static_cast<std::int64_t>(d);
    throw bad_json(path + ": expected a non-negative integer cost (costs are int64), got " + j.dump());
  }
  if (j.is_string() && (j.get<std::string>() == "inf" || j.get<std::string>() == "Infinity")) return infinite_cost;
  throw bad_json(path + ": expected a cost (an integer or \"inf\"), got " + json_kind(j));
}

inline std::string idx(const std::string& path, std::size_t i) { return path + "[" + std::to_string(i) + "]"; }

}  // namespace detail::iopddl

namespace detail::iopddl {
inline strategy_problem parse_iopddl_impl(const nlohmann::json& doc) {
  strategy_problem p;
  const nlohmann::json& prob = json_member(doc, "problem", "<root>");
  if (auto it = prob.find("name"); prob.is_object() && it != prob.end()) {
    if (!it->is_string()) throw bad_json("problem.name: expected a string, got " + json_kind(*it));
    p.name = it->get<std::string>();
  }
  const nlohmann::json& nodes = json_member(prob, "nodes", "problem");
  const nlohmann::json& intervals = json_array(json_member(nodes, "intervals", "problem.nodes"), "problem.nodes.intervals");
  const nlohmann::json& costs = json_array(json_member(nodes, "costs", "problem.nodes"), "problem.nodes.costs");
  const nlohmann::json& usages = json_array(json_member(nodes, "usages", "problem.nodes"), "problem.nodes.usages");
  const std::size_t n = costs.size();
  if (intervals.size() != n || usages.size() != n)
    throw bad_json("problem.nodes: " + std::to_string(intervals.size()) + " intervals, " + std::to_string(n) +
                   " costs and " + std::to_string(usages.size()) + " usages; all three must match");
  const nlohmann::json* names = nullptr;
  if (auto it = nodes.find("names"); it != nodes.end()) {
    names = &json_array(*it, "problem.nodes.names");
    if (names->size() != n)
      throw bad_json("problem.nodes.names: " + std::to_string(names->size()) + " names for " + std::to_string(n) +
                     " nodes");
  }
  p.nodes.resize(n);
  for (std::size_t v = 0; v < n; ++v) {
    strategy_node& node = p.nodes[v];
    const std::string ip = idx("problem.nodes.intervals", v);
    const nlohmann::json& iv = json_array(intervals[v], ip);
    if (iv.size() != 2) throw bad_json(ip + ": expected [begin, end], got " + iv.dump());
    node.live = {json_int(iv[0], idx(ip, 0)), json_int(iv[1], idx(ip, 1))};
    if (node.live.end < node.live.begin) throw bad_json(ip + ": end before begin in " + iv.dump());
    const std::string cp = idx("problem.nodes.costs", v);
    const nlohmann::json& cv = json_array(costs[v], cp);
    if (cv.empty()) throw bad_json(cp + ": a node needs at least one strategy");
    for (std::size_t i = 0; i < cv.size(); ++i) node.costs.push_back(json_cost(cv[i], idx(cp, i)));
    const std::string up = idx("problem.nodes.usages", v);
    const nlohmann::json& uv = json_array(usages[v], up);
    if (uv.size() != cv.size())
      throw bad_json(up + ": " + std::to_string(uv.size()) + " usages for " + std::to_string(cv.size()) +
                     " strategies");
    for (std::size_t i = 0; i < uv.size(); ++i) {
      const std::int64_t u = json_int(uv[i], idx(up, i));
      if (u < 0) throw bad_json(idx(up, i) + ": negative usage " + std::to_string(u));
      node.usages.push_back(u);
    }
    if (names) {
      if (!(*names)[v].is_string())
        throw bad_json(idx("problem.nodes.names", v) + ": expected a string, got " + json_kind((*names)[v]));
      node.name = (*names)[v].get<std::string>();
    }
  }
  const nlohmann::json& edges = json_member(prob, "edges", "problem");
  const nlohmann::json& ends = json_array(json_member(edges, "nodes", "problem.edges"), "problem.edges.nodes");
  const nlohmann::json& ecosts = json_array(json_member(edges, "costs", "problem.edges"), "problem.edges.costs");
  if (ends.size() != ecosts.size())
    throw bad_json("problem.edges: " + std::to_string(ends.size()) + " node pairs but " +
                   std::to_string(ecosts.size()) + " cost lists");
  p.edges.resize(ends.size());
  for (std::size_t e = 0; e < ends.size(); ++e) {
    const std::string np = idx("problem.edges.nodes", e);
    const nlohmann::json& uv = json_array(ends[e], np);
    if (uv.size() != 2) throw bad_json(np + ": expected [from, to], got " + uv.dump());
    const std::int64_t u = json_int(uv[0], idx(np, 0)), w = json_int(uv[1], idx(np, 1));
    if (u < 0 || w < 0 || static_cast<std::size_t>(u) >= n || static_cast<std::size_t>(w) >= n)
      throw bad_json(np + ": node " + std::to_string(u < 0 || static_cast<std::size_t>(u) >= n ? u : w) +
                     " out of range [0, " + std::to_string(n) + ")");
    strategy_edge& ed = p.edges[e];
    ed.from = static_cast<std::size_t>(u);
    ed.to = static_cast<std::size_t>(w);
    const std::string cp = idx("problem.edges.costs", e);
    const nlohmann::json& cv = json_array(ecosts[e], cp);
    const std::size_t su = p.nodes[ed.from].costs.size(), sv = p.nodes[ed.to].costs.size();
    if (cv.size() != su * sv)
      throw bad_json(cp + ": " + std::to_string(cv.size()) + " costs for edge [" + std::to_string(u) + ", " +
                     std::to_string(w) + "], expected " + std::to_string(su) + "x" + std::to_string(sv) + " = " +
                     std::to_string(su * sv));
    ed.costs.reserve(cv.size());
    for (std::size_t i = 0; i < cv.size(); ++i) ed.costs.push_back(json_cost(cv[i], idx(cp, i)));
  }
  if (auto it = prob.find("usage_limit"); it != prob.end() && !it->is_null()) {
    p.usage_limit = json_int(*it, "problem.usage_limit");
    if (*p.usage_limit < 0) throw bad_json("problem.usage_limit: negative limit " + std::to_string(*p.usage_limit));
  }
  return p;
}
}  // namespace detail::iopddl

/// Parse an IOPDDL document already read as JSON.
inline strategy_problem parse_iopddl(const nlohmann::json& doc) {
  try {
    return detail::iopddl::parse_iopddl_impl(doc);
  } catch (const detail::iopddl::bad_json& e) {
    throw io_error(e.what());
  }
}

/// Read an IOPDDL document from a stream; `source` names it in messages.
inline strategy_problem read_iopddl(std::istream& in, const std::string& source = "<stream>") {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw io_error(source + ": not valid JSON: " + e.what());
  }
  try {
    return detail::iopddl::parse_iopddl_impl(doc);
  } catch (const detail::iopddl::bad_json& e) {
    throw io_error(source + ": " + e.what());
  }
}

/// Read an IOPDDL file.
inline strategy_problem read_iopddl_file(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw io_error("cannot open '" + file.string() + "' for reading");
  return read_iopddl(in, file.string());
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
  if (!doc.is_array()) throw io_error(source + ": expected a list of strategy indices, got " + doc.type_name());
  if (doc.size() != p.nodes.size())
    throw io_error(source + ": " + std::to_string(doc.size()) + " strategy indices for " +
                   std::to_string(p.nodes.size()) + " nodes");
  std::vector<int> choice(doc.size());
  for (std::size_t v = 0; v < doc.size(); ++v) {
    const nlohmann::json& x = doc[v];
    const std::size_t count = p.nodes[v].costs.size();
    const bool ok = x.is_number_integer() && !(x.is_number_unsigned() && x.get<std::uint64_t>() >= count) &&
                    x.get<std::int64_t>() >= 0 && x.get<std::int64_t>() < static_cast<std::int64_t>(count);
    if (!ok)
      throw io_error(source + ": [" + std::to_string(v) + "] is " + x.dump() + ", not a strategy index in [0, " +
                     std::to_string(count) + ") of " + p.node_label(v));
    choice[v] = static_cast<int>(x.get<std::int64_t>());
  }
  return choice;
}

/// Read a solution file for `p` (see parse_iopddl_solution).
inline std::vector<int> read_iopddl_solution_file(const std::filesystem::path& file, const strategy_problem& p) {
  std::ifstream in(file);
  if (!in) throw io_error("cannot open '" + file.string() + "' for reading");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw io_error(file.string() + ": not valid JSON: " + e.what());
  }
  return parse_iopddl_solution(doc, p, file.string());
}


/// Write a solution in the contest's format: `[0, 0, 2, 1, 0]`.
inline void write_iopddl_solution_file(const std::filesystem::path& file, const std::vector<int>& choice) {
  write_file_atomically(file, nlohmann::json(choice).dump() + "\n");
}

}  // namespace autoshard

#pragma once
/// The plan document: everything a solved plan says, as a value, with the one writer and the
/// one reader of plan files (docs/plan-format.md, docs/plan.schema.json). Every command
/// (`plan`, `shard --plan`, `show --plan`, `verify`) and the library (preload_solution,
/// load_plan, the executor) read and write plans through these two functions.
///   autoshard::plan_document d = autoshard::read_plan_file("plan.json");
///   d.mesh.link(1);               // the links the plan was priced with, per axis
///   d.tensors[v].output;          // the spec vertex v of d.graph is produced (or stored) in
///   autoshard::write_plan_file(d, "copy.json");
#include <cmath>       // std::isfinite
#include <cstdio>      // std::snprintf
#include <cstdint>     // std::int64_t
#include <filesystem>  // std::filesystem::path
#include <map>         // std::map
#include <optional>    // std::optional
#include <string>      // std::string
#include <vector>      // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "../core/error.hpp"      // io_error
#include "../core/layout.hpp"     // max_local_shape, check_spec
#include "../core/mesh.hpp"       // device_mesh, link_model
#include "../core/parse.hpp"      // parse_spec, to_alpa_string
#include "../graph/io.hpp"        // to_json(model_graph), from_json(json_in)
#include "../graph/strategy.hpp"  // run_mode, device_model
#include "../io/atomic_file.hpp"  // write_file_atomically
#include "../io/json.hpp"         // json_in, load_json_file
#include "../io/mesh_json.hpp"    // mesh_to_json, mesh_from_json

namespace autoshard {

/// The version this build writes and reads. Version 1 files (before the plan carried its
/// links, options and local shapes) are refused: solve the model again.
inline constexpr int plan_format_version = 2;

/// At most this many vertices in a plan file, checked before the graph is built (the mesh
/// is bounded by mesh_from_json).
inline constexpr std::size_t max_plan_vertices = std::size_t{1} << 24;

/// One vertex of the plan's graph: the strategy chosen for it.
struct plan_tensor {
  std::string strategy;               ///< the strategy's name ("S0R,RS1->S0S1")
  std::vector<sharding_spec> inputs;  ///< the spec each operand is taken in, operand order
  sharding_spec output;               ///< the spec the tensor is produced (a parameter: stored) in
  tensor_shape local_shape;           ///< rank 0's shard of the output, the largest
  double seconds = 0.0;               ///< the strategy's own cost (compute + communication)
  std::int64_t memory_bytes = 0;      ///< per device
  friend bool operator==(const plan_tensor&, const plan_tensor&) = default;
};

/// The options that produced a plan (besides the mesh and the mode, which the document holds).
/// The pass fills every field from its autosharding_options; the defaults here are that
/// struct's (the training ones from graph/strategy.hpp's default_* constants; the plan area sits
/// below the solver's default_time_limit_s and algo names, so the "defaults" test in
/// tests/unit/pass/pass.cpp checks that a default pass records exactly these values).
struct plan_options {
  std::string algo = "alpa";
  double time_limit = 600.0;
  double mip_rel_gap = 0.0;
  bool skip_fully_replicated = false;
  bool tie_layers = true;
  std::optional<std::int64_t> memory_budget;
  std::map<std::string, std::string> pinned;  ///< vertex name -> spec (Alpa notation)
  device_model device{};
  /// How training was priced (strategy_options' fields of the same names): the optimizer's
  /// state per parameter, the gradient buckets, how much of the gradient sync the backward
  /// hides, and whether ZeRO-1/2 storage was offered. The stage each parameter took is in its
  /// strategy's name (" zero-1", " zero-2"). A file without them was priced with
  /// legacy_training() (plan_from_json reads it so).
  optimizer_kind optimizer = optimizer_kind::adam;
  double gradient_bucket_bytes = default_gradient_bucket_bytes;
  gradient_overlap_model gradient_overlap = default_gradient_overlap;
  bool zero = true;
  friend bool operator==(const plan_options& a, const plan_options& b) {
    return a.algo == b.algo && a.time_limit == b.time_limit && a.mip_rel_gap == b.mip_rel_gap &&
           a.skip_fully_replicated == b.skip_fully_replicated && a.tie_layers == b.tie_layers &&
           a.memory_budget == b.memory_budget && a.pinned == b.pinned && a.device.peak_flops == b.device.peak_flops &&
           a.device.memory_bandwidth == b.device.memory_bandwidth && a.device.memory_bytes == b.device.memory_bytes &&
           a.optimizer == b.optimizer && a.gradient_bucket_bytes == b.gradient_bucket_bytes &&
           a.gradient_overlap == b.gradient_overlap && a.zero == b.zero;
  }
};

/// The training settings of every plan file written before they were recorded: adam, 25 MiB
/// buckets, no gradient sync hidden, ZeRO-1/2 offered (the other fields: plan_options'
/// defaults).
inline plan_options legacy_training() {
  plan_options o;
  o.optimizer = optimizer_kind::adam;
  o.gradient_bucket_bytes = default_gradient_bucket_bytes;
  o.gradient_overlap = 0.0;
  o.zero = true;
  return o;
}

/// The strategy_options a plan was priced with: its device, mode and training settings.
inline strategy_options pricing_of(const plan_options& o, run_mode mode) {
  strategy_options so;
  so.device = o.device;
  so.mode = mode;
  so.optimizer = o.optimizer;
  so.gradient_bucket_bytes = o.gradient_bucket_bytes;
  so.gradient_overlap = o.gradient_overlap;
  so.zero = o.zero;
  return so;
}

/// The training settings of a plan in words: "adam, gradient buckets of 25.00 MiB, gradient
/// sync overlapped with each consumer's backward, ZeRO-1/2 offered" (or "0.4 of the gradient
/// sync overlapped"; what `show --plan` and `verify` report).
inline std::string describe_training(const plan_options& o) {
  const std::string overlap = o.gradient_overlap.backward ? std::string("gradient sync overlapped with each consumer's backward")
                                                          : to_string(o.gradient_overlap) + " of the gradient sync overlapped";
  return std::string(o.optimizer == optimizer_kind::sgd ? "sgd" : "adam") + ", gradient buckets of " +
         (o.gradient_bucket_bytes > 0 ? human_bytes(o.gradient_bucket_bytes) : std::string("0 (one per tensor)")) + ", " +
         overlap + ", ZeRO-1/2 " + (o.zero ? "offered" : "not offered");
}

/// The objective and its parts, seconds per step.
struct plan_objective {
  double objective = 0.0;  ///< compute + communication + resharding
  double compute = 0.0;
  double communication = 0.0;  ///< operators' own (gradient all-reduces in training)
  double resharding = 0.0;     ///< on edges
  std::int64_t peak_memory_bytes = 0;
  friend bool operator==(const plan_objective&, const plan_objective&) = default;
};

/// How the solver ended: "optimal" (proven), or "feasible" (stopped with a gap).
struct plan_solver {
  std::string status = "optimal";
  double objective = 0.0;
  double bound = 0.0;  ///< proven lower bound
  double gap = 0.0;    ///< (objective - bound) / |objective|, a fraction
  double seconds = 0.0;
  friend bool operator==(const plan_solver&, const plan_solver&) = default;
};

/// A solved plan, whole: it alone is enough to re-price, shard, draw or execute it.
struct plan_document {
  device_mesh mesh;  ///< with every axis's link, as priced
  run_mode mode = default_run_mode;
  plan_options options;
  model_graph graph;
  std::vector<plan_tensor> tensors;  ///< index = vertex of graph
  plan_objective cost;
  plan_solver solver;
};

/// Field by field, the graph compared as its JSON.
inline bool operator==(const plan_document& a, const plan_document& b) {
  return a.mesh == b.mesh && a.mode == b.mode && a.options == b.options && a.tensors == b.tensors && a.cost == b.cost &&
         a.solver == b.solver && to_json(a.graph) == to_json(b.graph);
}

inline const char* to_string(run_mode m) { return m == run_mode::training ? "training" : "inference"; }

// ---- the document as JSON -------------------------------------------------------------------

namespace detail {

inline nlohmann::json specs_json(const std::vector<sharding_spec>& v) {
  nlohmann::json out = nlohmann::json::array();
  for (const sharding_spec& s : v) out.push_back(to_alpa_string(s));
  return out;
}

/// A spec string of the plan, parsed for its mesh and tensor rank; io_error naming the path.
inline sharding_spec spec_from_json(const json_in& j, const device_mesh& m, const tensor_shape& shape) {
  const std::string text = j.string();
  try {
    sharding_spec s = shape.rank == 0 && text.empty() ? replicated_spec(static_cast<int>(m.ndim()), 0)
                                                      : parse_spec(text, static_cast<int>(m.ndim()), static_cast<int>(shape.rank));
    check_spec(s, m, shape, "a tensor of shape " + to_string(shape));
    return s;
  } catch (const spec_error& e) {
    j.fail("is \"" + text + "\", which does not fit: " + std::string(e.what()));
  }
}

}  // namespace detail

/// The plan as its version-2 JSON document (docs/plan-format.md).
inline nlohmann::json to_json(const plan_document& d) {
  using nlohmann::json;
  const model_graph& g = d.graph;
  json tensors = json::array();
  for (vertex_t v = 0; v < d.tensors.size(); ++v) {
    const plan_tensor& t = d.tensors[v];
    tensors.push_back({{"name", g[v].name},
                       {"kind", std::string(to_string(g[v].kind))},
                       {"shape", g[v].shape.to_vector()},
                       {"strategy", t.strategy},
                       {"inputs", detail::specs_json(t.inputs)},
                       {"output", to_alpa_string(t.output)},
                       {"local_shape", t.local_shape.to_vector()},
                       {"seconds", t.seconds},
                       {"memory_bytes", t.memory_bytes}});
  }
  const plan_options& o = d.options;
  json pinned = json::object();
  for (const auto& [name, spec] : o.pinned) pinned[name] = spec;
  return {{"format", "autoshard.plan"},
          {"version", plan_format_version},
          {"mode", to_string(d.mode)},
          {"mesh", mesh_to_json(d.mesh)},
          {"options",
           {{"algo", o.algo},
            {"time_limit", o.time_limit},
            {"mip_rel_gap", o.mip_rel_gap},
            {"skip_fully_replicated", o.skip_fully_replicated},
            {"tie_layers", o.tie_layers},
            {"memory_budget", o.memory_budget ? json(*o.memory_budget) : json(nullptr)},
            {"pinned", pinned},
            {"device",
             {{"peak_flops", o.device.peak_flops},
              {"memory_bandwidth", o.device.memory_bandwidth},
              {"memory_bytes", o.device.memory_bytes}}},
            {"training",
             {{"optimizer", o.optimizer == optimizer_kind::sgd ? "sgd" : "adam"},
              {"gradient_bucket_bytes", o.gradient_bucket_bytes},
              {"gradient_overlap", o.gradient_overlap.backward ? json("backward") : json(o.gradient_overlap.fraction)},
              {"zero", o.zero}}}}},
          {"cost",
           {{"objective", d.cost.objective},
            {"compute", d.cost.compute},
            {"communication", d.cost.communication},
            {"resharding", d.cost.resharding},
            {"peak_memory_bytes", d.cost.peak_memory_bytes}}},
          {"solver",
           {{"status", d.solver.status},
            {"objective", d.solver.objective},
            {"bound", d.solver.bound},
            {"gap", d.solver.gap},
            {"seconds", d.solver.seconds}}},
          {"tensors", std::move(tensors)},
          {"graph", to_json(g)}};
}

/// The document a version-2 JSON value describes, every member checked (type, range, and
/// that the tensors match the embedded graph, the mesh and each other); io_error naming
/// `source` and the JSON path otherwise (an invalid embedded graph too: "its graph is
/// invalid: graph error: vertex ...").
inline plan_document plan_from_json(const nlohmann::json& doc, const std::string& source) {
  const json_in j(doc, source);
  j.require_object();
  if (!j.has("format") || !j["format"].raw().is_string() || j["format"].string() != "autoshard.plan")
    throw io_error(source + " is not an autoshard plan (\"format\" is not \"autoshard.plan\")");
  const std::int64_t version = j["version"].integer(0, std::numeric_limits<int>::max());
  if (version == 1)
    throw io_error(source + " has version 1, an older format this build no longer reads (it reads version " +
                   std::to_string(plan_format_version) + "): solve the model again with `autoshard plan`");
  if (version != plan_format_version)
    throw io_error(source + " has version " + std::to_string(version) + "; this build reads version " +
                   std::to_string(plan_format_version));
  plan_document d;
  d.mode = j["mode"].one_of({"inference", "training"}) == "training" ? run_mode::training : run_mode::inference;
  d.mesh = mesh_from_json(j["mesh"]);

  const json_in o = j["options"];
  d.options.algo = o["algo"].one_of({"alpa", "megatron", "data_parallel", "zero3", "fully_replicated"});
  d.options.time_limit = o["time_limit"].number(0.0, 1e12);
  d.options.mip_rel_gap = o["mip_rel_gap"].number(0.0, 1.0);
  d.options.skip_fully_replicated = o["skip_fully_replicated"].boolean();
  d.options.tie_layers = o["tie_layers"].boolean();
  if (auto b = o.find("memory_budget")) d.options.memory_budget = b->integer(1);
  for (const auto& [name, spec] : o["pinned"].members()) d.options.pinned[name] = spec.string();
  const json_in dev = o["device"];
  d.options.device.peak_flops = dev["peak_flops"].number(1.0, 1e30);
  d.options.device.memory_bandwidth = dev["memory_bandwidth"].number(1.0, 1e30);
  d.options.device.memory_bytes = dev["memory_bytes"].integer(1);
  if (const auto tr = o.find("training")) {
    d.options.optimizer = (*tr)["optimizer"].one_of({"adam", "sgd"}) == "sgd" ? optimizer_kind::sgd : optimizer_kind::adam;
    d.options.gradient_bucket_bytes = (*tr)["gradient_bucket_bytes"].number(0.0, 1e18);
    const json_in ov = (*tr)["gradient_overlap"];  // "backward" or a fraction (the only form before "backward")
    if (ov.raw().is_string() && ov.raw().get<std::string>() == "backward")
      d.options.gradient_overlap = gradient_overlap_model::behind_backward();
    else if (ov.raw().is_number())
      d.options.gradient_overlap = ov.number(0.0, 1.0);
    else
      ov.fail_expected("\"backward\" or a number in [0, 1]");
    d.options.zero = (*tr)["zero"].boolean();
  } else {  // a file written before they were recorded
    const plan_options legacy = legacy_training();
    d.options.optimizer = legacy.optimizer;
    d.options.gradient_bucket_bytes = legacy.gradient_bucket_bytes;
    d.options.gradient_overlap = legacy.gradient_overlap;
    d.options.zero = legacy.zero;
  }

  const json_in c = j["cost"];
  d.cost.objective = c["objective"].number(0.0);
  d.cost.compute = c["compute"].number(0.0);
  d.cost.communication = c["communication"].number(0.0);
  d.cost.resharding = c["resharding"].number(0.0);
  d.cost.peak_memory_bytes = c["peak_memory_bytes"].integer(0);
  const json_in s = j["solver"];
  d.solver.status = s["status"].one_of({"optimal", "feasible"});
  d.solver.objective = s["objective"].number();
  d.solver.bound = s["bound"].number();
  d.solver.gap = s["gap"].number();
  d.solver.seconds = s["seconds"].number(0.0);

  const json_in ts = j["tensors"];
  ts.size(max_plan_vertices);  // bounded before the graph is built
  try {
    d.graph = from_json(j["graph"]);
  } catch (const graph_error& e) {
    throw io_error(source + ": its graph is invalid: " + std::string(e.what()));
  }
  const model_graph& g = d.graph;
  const std::size_t n = boost::num_vertices(g);
  if (ts.size() != n) ts.fail("has " + std::to_string(ts.size()) + " entries for a graph of " + std::to_string(n) + " vertices");
  for (vertex_t v = 0; v < n; ++v) {
    const json_in t = ts[v];
    const node& nd = g[v];
    if (t["name"].string() != nd.name) t["name"].fail_expected("\"" + nd.name + "\", the name of graph vertex " + std::to_string(v));
    if (t["kind"].string() != to_string(nd.kind)) t["kind"].fail_expected("\"" + std::string(to_string(nd.kind)) + "\", the graph's");
    if (tensor_shape(t["shape"].integers(0, std::numeric_limits<std::int64_t>::max(), max_tensor_rank)) != nd.shape)
      t["shape"].fail_expected(to_string(nd.shape) + ", the graph's");
    plan_tensor p;
    p.strategy = t["strategy"].string();
    const std::vector<vertex_t> ops = operands(g, v);
    const json_in ins = t["inputs"];
    if (ins.size() != ops.size())
      ins.fail("has " + std::to_string(ins.size()) + " specs for " + std::to_string(ops.size()) + " operands");
    for (std::size_t i = 0; i < ops.size(); ++i) p.inputs.push_back(detail::spec_from_json(ins[i], d.mesh, g[ops[i]].shape));
    p.output = detail::spec_from_json(t["output"], d.mesh, nd.shape);
    p.local_shape = tensor_shape(t["local_shape"].integers(0, std::numeric_limits<std::int64_t>::max(), max_tensor_rank));
    if (p.local_shape != max_local_shape(d.mesh, p.output, nd.shape))
      t["local_shape"].fail_expected(to_string(max_local_shape(d.mesh, p.output, nd.shape)) + ", rank 0's shard of " +
                                     to_string(nd.shape) + " under " + to_alpa_string(p.output));
    p.seconds = t["seconds"].number(0.0);
    p.memory_bytes = t["memory_bytes"].integer(0);
    d.tensors.push_back(std::move(p));
  }
  return d;
}

/// The one writer of plan files: atomically (never a half file).
inline void write_plan_file(const plan_document& d, const std::filesystem::path& file) {
  write_file_atomically(file, to_json(d).dump(1) + "\n");
}

/// The one reader of plan files (see plan_from_json for what it checks).
inline plan_document read_plan_file(const std::string& file) {
  return plan_from_json(load_json_file(file, "plan file"), "plan file '" + file + "'");
}

}  // namespace autoshard

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
#include <unordered_map>  // std::unordered_map
#include <vector>      // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "../core/error.hpp"      // io_error
#include "../core/layout.hpp"     // max_local_shape, check_spec
#include "../core/mesh.hpp"       // device_mesh, link_model
#include "../core/parse.hpp"      // parse_spec, to_alpa_string
#include "../graph/io.hpp"        // to_json(model_graph), from_json(json_in)
#include "../graph/pricing.hpp"   // step_pricing, run_mode, optimizer_kind
#include "../graph/resize.hpp"    // graph_batch
#include "../io/atomic_file.hpp"  // write_file_atomically
#include "../io/json.hpp"         // json_in, load_json_file
#include "../io/mesh_json.hpp"    // mesh_to_json, mesh_from_json
#include "algo.hpp"               // algo
#include "pipeline.hpp"           // plan_pipeline, pipeline_schedule

namespace autoshard {

/// The version this build writes. It reads it, version 4 (before a plan could be pipelined:
/// no "pipeline"), version 3 (before the plan recorded its
/// micro-batches, its layers' recomputation, the attention kernel and achievable compute:
/// one step of the whole batch, nothing recomputed, compute at the peaks) and version 2
/// (before the pricing was one value: "mode" at the top, the device and the training settings
/// under "options"). Version 1 files (before the plan carried its links, options and local
/// shapes) are refused: solve the model again.
inline constexpr int plan_format_version = 5;

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
  /// Training: what the operator recomputes in the backward ("full": its layer keeps only its
  /// input and runs its forward again; "selective": the attention core's). A layer's
  /// recomputation is its operators'.
  recompute_kind recompute = recompute_kind::none;
  friend bool operator==(const plan_tensor&, const plan_tensor&) = default;
};

/// How the plan was searched for (besides the mesh and the pricing, which the document holds).
/// The pass fills every field from its autosharding_options; the defaults here are that
/// struct's (the plan area sits below the solver's default_time_limit_s, so the "defaults"
/// test in tests/unit/pass/pass.cpp checks that a default pass records exactly these values).
struct plan_options {
  autoshard::algo algo = autoshard::algo::alpa;
  double time_limit = 600.0;
  double mip_rel_gap = 0.0;
  bool skip_fully_replicated = false;
  bool tie_layers = true;
  std::optional<std::int64_t> memory_budget;
  std::map<std::string, std::string> pinned;  ///< vertex name -> spec (Alpa notation)
  friend bool operator==(const plan_options&, const plan_options&) = default;
};

/// The pricing of every plan file written before the training settings were recorded: adam,
/// 25 MiB buckets, no gradient sync hidden, ZeRO-1/2 offered (the other fields: step_pricing's
/// defaults; a file's mode and device always came with it).
inline step_pricing legacy_pricing() {
  step_pricing p;
  set_before_micro_batches(p);
  p.optimizer = optimizer_kind::adam;
  p.gradient_bucket_bytes = default_gradient_bucket_bytes;
  p.gradient_overlap = 0.0;
  p.zero = true;
  return p;
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
  device_mesh mesh;      ///< with every axis's link, as priced
  step_pricing pricing;  ///< how the plan was priced: device, mode, training settings
  plan_options options;
  model_graph graph;
  std::vector<plan_tensor> tensors;  ///< index = vertex of graph
  plan_objective cost;
  plan_solver solver;
  /// Present for a pipelined plan: `mesh` is then one stage's sub-mesh, `graph` the whole model
  /// at one micro-step of one stage (its batch micro_batch x the data-parallel ranks), and every
  /// layer takes the strategies its stage's plan chose for it (the layers tied).
  std::optional<plan_pipeline> pipeline;
};

/// Field by field, the graph compared as its JSON.
inline bool operator==(const plan_document& a, const plan_document& b) {
  return a.mesh == b.mesh && a.pricing == b.pricing && a.options == b.options && a.tensors == b.tensors && a.cost == b.cost &&
         a.solver == b.solver && a.pipeline == b.pipeline && to_json(a.graph) == to_json(b.graph);
}

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
    j.fail("is " + detail::json_excerpt(j.raw()) + ", which does not fit: " + std::string(e.what()));
  }
}

}  // namespace detail

namespace detail {

inline nlohmann::json plan_options_json(const plan_options& o) {
  nlohmann::json pinned = nlohmann::json::object();
  for (const auto& [name, spec] : o.pinned) pinned[name] = spec;
  return {{"algo", std::string(to_string(o.algo))},
          {"time_limit", o.time_limit},
          {"mip_rel_gap", o.mip_rel_gap},
          {"skip_fully_replicated", o.skip_fully_replicated},
          {"tie_layers", o.tie_layers},
          {"memory_budget", o.memory_budget ? nlohmann::json(*o.memory_budget) : nlohmann::json(nullptr)},
          {"pinned", pinned}};
}

inline nlohmann::json plan_pipeline_json(const plan_pipeline& p) {
  nlohmann::json stages = nlohmann::json::array();
  for (const plan_stage& s : p.stages)
    stages.push_back({{"first_layer", s.first_layer}, {"layers", s.layers}, {"seconds", s.seconds},
                      {"memory_bytes", s.memory_bytes}, {"in_flight", s.in_flight}});
  return {{"schedule", std::string(to_string(p.schedule))},
          {"link", link_to_json(p.link)},
          {"stages", stages},
          {"transfer_seconds", p.transfer_seconds},
          {"step_seconds", p.step_seconds},
          {"bubble_fraction", p.bubble_fraction},
          {"gradient_sync_seconds", p.gradient_sync_seconds},
          {"tied_sync_seconds", p.tied_sync_seconds}};
}

inline nlohmann::json plan_tensors_json(const plan_document& d) {
  const model_graph& g = d.graph;
  nlohmann::json tensors = nlohmann::json::array();
  for (vertex_t v = 0; v < d.tensors.size(); ++v) {
    const plan_tensor& t = d.tensors[v];
    tensors.push_back({{"name", g[v].name},
                       {"kind", std::string(to_string(g[v].kind))},
                       {"shape", g[v].shape.to_vector()},
                       {"strategy", t.strategy},
                       {"inputs", specs_json(t.inputs)},
                       {"output", to_alpa_string(t.output)},
                       {"local_shape", t.local_shape.to_vector()},
                       {"seconds", t.seconds},
                       {"memory_bytes", t.memory_bytes}});
    if (t.recompute != recompute_kind::none) tensors.back()["recompute"] = std::string(to_string(t.recompute));
  }
  return tensors;
}

}  // namespace detail

/// The plan as its version-5 JSON document (docs/plan-format.md); "pipeline" only when pipelined.
inline nlohmann::json to_json(const plan_document& d) {
  nlohmann::json j = {{"format", "autoshard.plan"},
          {"version", plan_format_version},
          {"mesh", mesh_to_json(d.mesh)},
          {"pricing", to_json(d.pricing)},
          {"options", detail::plan_options_json(d.options)},
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
          {"tensors", detail::plan_tensors_json(d)},
          {"graph", to_json(d.graph)}};
  if (d.pipeline) j["pipeline"] = detail::plan_pipeline_json(*d.pipeline);
  return j;
}

namespace detail {

/// The format version of a plan document: 2 to plan_format_version; io_error otherwise.
inline std::int64_t plan_version(const json_in& j, const std::string& source) {
  j.require_object();
  if (!j.has("format") || !j["format"].raw().is_string() || j["format"].string() != "autoshard.plan")
    throw io_error(source + " is not an autoshard plan (\"format\" is not \"autoshard.plan\")");
  const std::int64_t version = j["version"].integer(0, std::numeric_limits<int>::max());
  if (version == 1)
    throw io_error(source + " has version 1, an older format this build no longer reads (it reads versions 2 to " +
                   std::to_string(plan_format_version) + "): solve the model again with `autoshard plan`");
  if (version < 2 || version > plan_format_version)
    throw io_error(source + " has version " + std::to_string(version) + "; this build reads versions 2 to " +
                   std::to_string(plan_format_version));
  return version;
}

/// How a plan was priced: version 3's "pricing"; in version 2, "mode" at the top and the
/// device and the training settings (legacy_pricing() when absent) under "options".
inline step_pricing plan_pricing(const json_in& j, std::int64_t version) {
  if (version != 2) return step_pricing_from_json(j["pricing"]);
  step_pricing p = legacy_pricing();
  p.mode = enum_value(j["mode"], all_run_modes);
  const json_in o = j["options"];
  p.device = device_model_from_json(o["device"]);
  if (const auto tr = o.find("training")) {
    p.optimizer = enum_value((*tr)["optimizer"], all_optimizer_kinds);
    p.gradient_bucket_bytes = (*tr)["gradient_bucket_bytes"].number(0.0, 1e18);
    p.gradient_overlap = gradient_overlap_from_json((*tr)["gradient_overlap"]);
    p.zero = (*tr)["zero"].boolean();
  }
  return p;
}

inline plan_options plan_options_from_json(const json_in& o) {
  plan_options out;
  out.algo = enum_value(o["algo"], all_algos);
  out.time_limit = o["time_limit"].number(0.0, 1e12);
  out.mip_rel_gap = o["mip_rel_gap"].number(0.0, 1.0);
  out.skip_fully_replicated = o["skip_fully_replicated"].boolean();
  out.tie_layers = o["tie_layers"].boolean();
  if (auto b = o.find("memory_budget")) out.memory_budget = b->integer(1);
  for (const auto& [name, spec] : o["pinned"].members()) out.pinned[name] = spec.string();
  return out;
}

inline plan_objective plan_cost_from_json(const json_in& c) {
  return {c["objective"].number(0.0), c["compute"].number(0.0), c["communication"].number(0.0),
          c["resharding"].number(0.0), c["peak_memory_bytes"].integer(0)};
}

inline plan_solver plan_solver_from_json(const json_in& s) {
  return {s["status"].one_of({"optimal", "feasible"}), s["objective"].number(), s["bound"].number(), s["gap"].number(),
          s["seconds"].number(0.0)};
}

/// A plan's "pipeline" for stages of `stage_devices` devices each (bounded first: the stages'
/// devices at most max_parsed_mesh_ranks, like any mesh's) running `micro_batches` per step:
/// its stages consecutive from layer 0, each but the first and the last with a layer, each
/// with a time and memory in range and the micro-batches in flight its schedule implies
/// (in_flight_micro_batches), and one transfer time per boundary. Whether the layers add up to
/// the model's is for whoever maps layers (pass/pipelined.hpp's stages_of_parameters).
inline plan_pipeline plan_pipeline_from_json(const json_in& j, std::int64_t stage_devices, int micro_batches) {
  plan_pipeline p;
  p.schedule = enum_value(j["schedule"], all_pipeline_schedules);
  p.link = link_from_json(j["link"]);
  const json_in st = j["stages"];
  const auto max_stages = static_cast<std::size_t>(max_parsed_mesh_ranks / stage_devices);
  if (st.size() == 0) st.fail("is empty: a pipeline has at least one stage");
  if (st.size() > max_stages)
    st.fail("has " + std::to_string(st.size()) + " stages of " + std::to_string(stage_devices) + " devices, more than the " +
            std::to_string(max_parsed_mesh_ranks) + " devices a plan may have");
  int next = 0;
  for (const json_in& s : st.elements(max_stages)) {
    plan_stage x;
    x.first_layer = s["first_layer"].small_integer(0, std::numeric_limits<int>::max());
    if (x.first_layer != next) s["first_layer"].fail_expected(std::to_string(next) + ", where the stage before ends");
    x.layers = s["layers"].small_integer(0, std::numeric_limits<int>::max() - next);
    // Only the first stage (the embedding) and the last (the head) hold something besides
    // layers: a stage between them without one holds nothing (and `shard --plan` had written
    // the stages before it, then found no tensor for it).
    const std::size_t k = p.stages.size();
    if (x.layers == 0 && k != 0 && k + 1 != st.size())
      s["layers"].fail_expected("an integer in [1, " + std::to_string(std::numeric_limits<int>::max() - next) + "]: stage " +
                                std::to_string(k) + " lies between the first (the embedding) and the last (the head), so it "
                                "holds nothing but its layers");
    next += x.layers;
    x.seconds = s["seconds"].number(0.0, 1e30);
    x.memory_bytes = s["memory_bytes"].integer(0);
    x.in_flight = s["in_flight"].small_integer(1, std::numeric_limits<int>::max());  // each stage holds a micro-batch
    // Only range-checked, a hand-edited count was read and shown (`show --plan`) as what the
    // stage holds, whatever the schedule.
    const int stages = static_cast<int>(st.size()), stage = static_cast<int>(k);
    if (const int want = in_flight_micro_batches(p.schedule, stages, stage, micro_batches); x.in_flight != want)
      s["in_flight"].fail_expected(
          std::to_string(want) + ", what the schedule implies: " +
          (p.schedule == pipeline_schedule::gpipe
               ? "under gpipe every stage holds all " + std::to_string(micro_batches) + " micro-batches of the step"
               : "under 1f1b stage " + std::to_string(stage) + " of " + std::to_string(stages) + " holds min(" +
                     std::to_string(stages) + " - " + std::to_string(stage) + ", " + std::to_string(micro_batches) +
                     " micro-batches of the step) at once"));
    p.stages.push_back(x);
  }
  const json_in tr = j["transfer_seconds"];
  if (tr.size() + 1 != p.stages.size())
    tr.fail("has " + std::to_string(tr.size()) + " times for the " + std::to_string(p.stages.size() - 1) + " boundaries of " +
            std::to_string(p.stages.size()) + " stages");
  for (const json_in& t : tr.elements(max_stages)) p.transfer_seconds.push_back(t.number(0.0, 1e30));
  p.step_seconds = j["step_seconds"].number(0.0, 1e30);
  p.bubble_fraction = j["bubble_fraction"].number(0.0, 1e30);
  p.gradient_sync_seconds = j["gradient_sync_seconds"].number(0.0, 1e30);
  p.tied_sync_seconds = j["tied_sync_seconds"].number(0.0, 1e30);
  return p;
}

/// Tensor v of a plan, checked against vertex v of its graph, the mesh and each other.
inline plan_tensor plan_tensor_from_json(const json_in& t, const model_graph& g, vertex_t v, const device_mesh& mesh) {
  const node& nd = g[v];
  if (t["name"].string() != nd.name) t["name"].fail_expected(quoted_text(nd.name) + ", the name of graph vertex " + std::to_string(v));
  if (t["kind"].string() != to_string(nd.kind)) t["kind"].fail_expected("\"" + std::string(to_string(nd.kind)) + "\", the graph's");
  if (tensor_shape(t["shape"].integers(0, std::numeric_limits<std::int64_t>::max(), max_tensor_rank)) != nd.shape)
    t["shape"].fail_expected(to_string(nd.shape) + ", the graph's");
  plan_tensor p;
  p.strategy = t["strategy"].string();
  const std::vector<vertex_t> ops = operands(g, v);
  const json_in ins = t["inputs"];
  if (ins.size() != ops.size())
    ins.fail("has " + std::to_string(ins.size()) + " specs for " + std::to_string(ops.size()) + " operands");
  for (std::size_t i = 0; i < ops.size(); ++i) p.inputs.push_back(spec_from_json(ins[i], mesh, g[ops[i]].shape));
  p.output = spec_from_json(t["output"], mesh, nd.shape);
  p.local_shape = tensor_shape(t["local_shape"].integers(0, std::numeric_limits<std::int64_t>::max(), max_tensor_rank));
  if (p.local_shape != max_local_shape(mesh, p.output, nd.shape))
    t["local_shape"].fail_expected(to_string(max_local_shape(mesh, p.output, nd.shape)) + ", rank 0's shard of " +
                                   to_string(nd.shape) + " under " + to_alpa_string(p.output));
  // A strategy's name spells the specs it takes and gives ("S0RR,S1R->S0RS1", then " zero-1" or
  // " recompute-full"): the file's inputs and output must be those. shard --plan cuts by the
  // output, every export by the strategy: a hand-edited output "RS1" beside "->S1R zero-1" cut
  // the weight by columns while the exports told the runtime rows.
  std::string spelled;
  for (std::size_t i = 0; i < p.inputs.size(); ++i) spelled += (i ? "," : "") + to_alpa_string(p.inputs[i]);
  spelled += "->" + to_alpa_string(p.output);
  const std::string named = p.strategy.substr(0, p.strategy.find(' '));
  if (named != spelled)
    t["strategy"].fail("is " + detail::json_excerpt(t["strategy"].raw()) + ", which takes and gives " + quoted_text(named) +
                       ", but the inputs and output of " + quoted_text(nd.name) + " are " + quoted_text(spelled));
  p.seconds = t["seconds"].number(0.0);
  p.memory_bytes = t["memory_bytes"].integer(0);
  if (const auto r = t.find("recompute")) p.recompute = enum_value(*r, all_recompute_kinds);
  return p;
}

}  // namespace detail

/// The document a version-2 to -5 JSON value describes, every member checked (type, range,
/// and that the tensors match the embedded graph, the mesh and each other); io_error naming
/// `source` and the JSON path otherwise (an invalid embedded graph too: "its graph is invalid:
/// graph error: vertex ...").
inline plan_document plan_from_json(const nlohmann::json& doc, const std::string& source) {
  const json_in j(doc, source);
  const std::int64_t version = detail::plan_version(j, source);
  plan_document d;
  d.pricing = detail::plan_pricing(j, version);
  d.mesh = mesh_from_json(j["mesh"]);
  d.options = detail::plan_options_from_json(j["options"]);
  d.cost = detail::plan_cost_from_json(j["cost"]);
  d.solver = detail::plan_solver_from_json(j["solver"]);
  if (version >= 5)
    if (const auto p = j.find("pipeline"))
      d.pipeline = detail::plan_pipeline_from_json(*p, d.mesh.num_ranks(),
                                                   d.pricing.mode == run_mode::training ? d.pricing.accumulation() : 1);
  const json_in ts = j["tensors"];
  ts.size(max_plan_vertices);  // bounded before the graph is built
  try {
    d.graph = from_json(j["graph"]);
  } catch (const graph_error& e) {
    throw io_error(source + ": its graph is invalid: " + std::string(e.what()));
  }
  const std::size_t n = boost::num_vertices(d.graph);
  if (ts.size() != n) ts.fail("has " + std::to_string(ts.size()) + " entries for a graph of " + std::to_string(n) + " vertices");
  for (vertex_t v = 0; v < n; ++v) d.tensors.push_back(detail::plan_tensor_from_json(ts[v], d.graph, v, d.mesh));
  // options.pinned: each pin names a tensor of the graph, and (unpipelined: a pipelined plan's
  // tensors are on its stages' meshes) is that tensor's output spec, which the pin forced. A
  // hand-edited pin of a tensor the graph does not have, or of a spec that does not parse
  // ("S9"), was read and written back as the settings the plan was made with.
  if (!d.options.pinned.empty()) {
    std::unordered_map<std::string, vertex_t> by_name;
    for (vertex_t v = 0; v < n; ++v) by_name.emplace(d.graph[v].name, v);
    const json_in pins = j["options"]["pinned"];
    for (const auto& [name, text] : d.options.pinned) {
      const json_in pin = pins[name.c_str()];
      const auto it = by_name.find(name);
      if (it == by_name.end()) pin.fail("pins " + quoted_text(name) + ", which is no tensor of the plan's graph");
      if (d.pipeline) continue;
      const sharding_spec spec = detail::spec_from_json(pin, d.mesh, d.graph[it->second].shape);
      if (!(spec == d.tensors[it->second].output))
        pin.fail_expected(quoted_text(to_alpa_string(d.tensors[it->second].output)) + ", the output spec of " + quoted_text(name) +
                          " in tensors, which the pin forced");
    }
  }
  // A training plan's micro-batch is its graph's batch (one micro-step's) over its data-parallel
  // ranks, rounded up: at most that batch, at least its share on every rank of the mesh. A
  // hand-edited 16777216 over a graph of 8 sequences was read, and `show` described "16777216
  // micro-batches of 16777216 per data-parallel rank".
  // Which micro-batch in these bounds the strategies make, check_micro_batch (pass area) checks.
  const std::int64_t batch = graph_batch(d.graph);
  const std::int64_t mb = d.pricing.micro_batch;
  if (d.pricing.mode == run_mode::training && mb > 0 && batch > 0) {
    const std::int64_t least = (batch + d.mesh.num_ranks() - 1) / d.mesh.num_ranks();
    if (mb > batch || mb < least)
      j["pricing"]["micro_batch"].fail("is " + std::to_string(mb) + ", but the graph's micro-step holds " + std::to_string(batch) +
                                       " sequences: a micro-batch is that batch over the data-parallel ranks, from " +
                                       std::to_string(least) + " (over the mesh's " + std::to_string(d.mesh.num_ranks()) +
                                       " ranks) to " + std::to_string(batch));
  }
  return d;
}

/// The one writer of plan files: atomically (never a half file).
inline void write_plan_file(const plan_document& d, const std::filesystem::path& file) {
  write_file_atomically(file, to_json(d).dump(1) + "\n");
}

/// The one reader of plan files (see plan_from_json for what it checks).
inline plan_document read_plan_file(const std::string& file) {
  return plan_from_json(load_json_file(file, "plan file"), "plan file " + quoted_path(file));
}

}  // namespace autoshard

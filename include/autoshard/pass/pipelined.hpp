#pragma once
/// A training step with pipeline stages, priced from the intra-operator plan of each stage:
/// the devices factored into pipeline x data x tensor parallel ranks (Megatron-LM's order:
/// tensor-parallel ranks adjacent, then data-parallel, then stages), the model's units (what
/// comes before its repeated layers, each layer, what comes after) priced by the ILP on one
/// stage's sub-mesh, partitioned into stages (pass/pipeline.hpp), and the step simulated pass
/// by pass under the schedule.
///   autoshard::pipeline_config c{.pp = 2, .tp = 8, .micro_batch = 1, .recompute = autoshard::recompute_kind::full};
///   autoshard::pipelined_step s = autoshard::price_pipelined(g, mesh, pricing, autoshard::algo::megatron, c);
///   s.step_seconds; s.tflops_per_device; s.stages.count;   // layers per stage
///   autoshard::pipeline_search r = autoshard::search_pipelines(g, mesh, pricing);  // the fastest that fits
///
/// How a stage is priced: the model is cut to its first two layers (with_layers) at one
/// micro-step's batch (micro_batch x dp), priced over the step's m micro-steps (its passes m
/// times, a gradient accumulated and synced once), and the ILP (restricted to `algo`'s
/// strategies, the layers tied) plans it on the stage's sub-mesh; every vertex's cost (its
/// compute, its own collectives, the resharding on its operand edges, forward and backward
/// apart; one micro-batch's share) goes to its unit: the embedding, the first layer, the
/// second (what every later layer costs: tied layers take the same strategies), the head. A
/// parameter's gradient sync, once per step, is charged after its stage's last backward, less
/// what that backward hides (the pass's overlap model); one synced at every micro-step
/// (ZeRO-2's reduce-scatter) in each micro-batch's backward. A parameter used on two stages
/// (tied embedding and head) keeps its gradient in sync with an all-reduce over those stages
/// on the pipeline's link after the flush. A stage's
/// memory is its parameters' state, its activations times the micro-batches its schedule
/// holds in flight (p on the first stage under 1F1B) and the largest working set of a layer it
/// recomputes; stage boundaries send the activation that crosses them, point to point, on the
/// pipeline's link (the network when stages span whole nodes, else NVLink within a node).
/// A step's stages may hold the device's memory less the runtime reserve of its configuration
/// (the CUDA context, its NCCL communicators), or `base.memory_budget` where that is smaller:
/// a budget tightens the search, never loosens it past the device.
#include <algorithm>  // std::max, std::min, std::sort
#include <chrono>     // std::chrono::steady_clock
#include <cmath>      // std::pow, std::abs
#include <cstdio>     // std::snprintf
#include <cstdint>    // std::int64_t
#include <initializer_list>  // std::initializer_list
#include <limits>     // std::numeric_limits
#include <map>        // std::map
#include <memory>     // std::shared_ptr
#include <optional>   // std::optional
#include <set>        // std::set
#include <string>     // std::string
#include <utility>    // std::move, std::pair
#include <vector>     // std::vector

#include "../core/cost.hpp"      // collective_time
#include "../core/mesh.hpp"      // device_mesh
#include "../graph/resize.hpp"   // with_batch_seq
#include "autosharding.hpp"      // detail::pass_model, detail::solve_algo, megatron_mesh
#include "layers.hpp"            // layer_map, map_layers, detail::layer_key
#include "pipeline.hpp"          // partition_stages, simulate_pipeline, pipeline_schedule
#include "step_report.hpp"       // count_step_flops, graph_batch

namespace autoshard {

/// `g` with only its first `keep` repeated layers: every operator outside the layers that read
/// the last layer reads the same operator of layer `keep - 1` instead (what a smaller model of
/// the same family looks like). Throws graph_error when `g` has fewer layers, or a reader of the
/// last layer has no counterpart.
inline model_graph with_layers(const model_graph& g, int keep) {
  const layer_map L = map_layers(g);
  if (keep < 1 || static_cast<std::size_t>(keep) > L.indices.size())
    throw graph_error("cannot keep " + std::to_string(keep) + " layers of a model of " + std::to_string(L.indices.size()));
  if (static_cast<std::size_t>(keep) == L.indices.size()) return g;
  const long last = L.indices.back(), kept = L.indices[static_cast<std::size_t>(keep) - 1];
  std::set<long> keep_set(L.indices.begin(), L.indices.begin() + keep);
  model_graph out;
  std::vector<vertex_t> map(boost::num_vertices(g), boost::graph_traits<model_graph>::null_vertex());
  // Parameters and inputs (the layers' vertices of dropped layers go), then operators in
  // topological order with their operands remapped.
  const auto in_kept_layer = [&](vertex_t v) { return L.layer[v] < 0 || keep_set.count(L.layer[v]) > 0; };
  const auto layer_of_parameter = [&](vertex_t v) {
    const long i = detail::layer_index(g[v].name);
    return i < 0 || keep_set.count(i) > 0;
  };
  for (vertex_t v : topological_order(g)) {
    const node& nd = g[v];
    if (!nd.is_operator()) {
      if (nd.is_parameter() && !layer_of_parameter(v)) continue;
      map[v] = boost::add_vertex(nd, out);
      continue;
    }
    if (!in_kept_layer(v)) continue;
    std::vector<vertex_t> ops;
    for (vertex_t u : operands(g, v)) {
      vertex_t w = u;
      if (L.layer[u] == last && L.layer[v] < 0) {  // a reader of the last layer: the kept layer's operator
        std::string name = detail::layer_key(g[u].name);
        name.replace(name.find('#'), 1, std::to_string(kept));
        const auto found = find_vertex(g, name);
        if (!found) throw graph_error("'" + nd.name + "' reads '" + g[u].name + "', which has no counterpart '" + name + "'");
        w = *found;
      }
      if (map[w] == boost::graph_traits<model_graph>::null_vertex())
        throw graph_error("'" + nd.name + "' reads '" + g[w].name + "' of a dropped layer");
      ops.push_back(map[w]);
    }
    map[v] = boost::add_vertex(nd, out);
    for (std::size_t i = 0; i < ops.size(); ++i) boost::add_edge(ops[i], map[v], edge{static_cast<int>(i)}, out);
  }
  validate(out);
  return out;
}

/// A pipelined configuration: the devices as pp x dp x tp ranks, the micro-batching, the
/// recomputation of every layer and the schedule.
struct pipeline_config {
  int pp = 1;           ///< pipeline stages
  int tp = 1;           ///< tensor-parallel ranks (within a node)
  int dp = 0;           ///< data-parallel ranks; 0: the devices / (pp x tp)
  int micro_batch = 1;  ///< sequences per data-parallel rank per micro-step
  recompute_kind recompute = recompute_kind::none;
  pipeline_schedule schedule = pipeline_schedule::one_f_one_b;
  friend bool operator==(const pipeline_config&, const pipeline_config&) = default;
};

/// "pp 2, tp 8, dp 32, micro-batch 1 x 48, recompute full, 1f1b" (with the micro-batches m;
/// 0: not known, "micro-batch 1", as a configuration the ILP had no plan for is named).
inline std::string describe(const pipeline_config& c, int micro_batches) {
  return "pp " + std::to_string(c.pp) + ", tp " + std::to_string(c.tp) + ", dp " + std::to_string(c.dp) + ", micro-batch " +
         std::to_string(c.micro_batch) + (micro_batches > 0 ? " x " + std::to_string(micro_batches) : std::string()) + ", recompute " +
         std::string(to_string(c.recompute)) + ", " + std::string(to_string(c.schedule));
}

/// What each unit of a planned stage costs (per device, one micro-step unless said).
struct unit_costs {
  std::vector<double> forward, backward;  ///< per unit: seconds of one micro-batch's passes
  std::vector<double> after;              ///< per unit: its gradient sync left exposed, once per step
  std::vector<std::int64_t> state, activation, transient;  ///< per unit: stage_unit's bytes
  std::vector<std::int64_t> boundary;     ///< per unit: bytes per device it sends to the next unit
  /// Parameters used by more than one unit, with the units and their gradient's bytes per device.
  std::vector<std::pair<std::vector<int>, std::int64_t>> shared;
};

/// The bytes of the largest piece (rank 0's) of `nd`'s tensor under `spec` on `mesh`: what one
/// device sends of it at a stage boundary, and the gradient of a parameter shared by two stages
/// that their all-reduce keeps in sync (in its backward_target: a ZeRO parameter's shard).
inline std::int64_t piece_bytes(const device_mesh& mesh, const sharding_spec& spec, const node& nd) {
  return max_local_shape(mesh, spec, nd.shape).numel() * static_cast<std::int64_t>(dtype_size(nd.type));
}

/// The costs of the plan `choice` of `pm` (one micro-step's graph, priced over the step's m
/// micro-steps: pm.sopt.pricing.accumulation()) per unit: one micro-batch's passes (a
/// micro-step's share of what runs at every one), and what runs once per step after the flush.
inline unit_costs price_units(const detail::pass_model& pm, const std::vector<int>& choice) {
  const model_graph& g = pm.g;
  const double m = pm.sopt.pricing.mode == run_mode::training ? pm.sopt.pricing.accumulation() : 1;
  const std::vector<int> unit = detail::unit_of_vertices(g, pm.layers);
  const std::size_t units = pm.layers.indices.size() + 2;
  unit_costs c;
  c.forward.assign(units, 0.0);
  c.backward = c.after = c.forward;
  c.state.assign(units, 0);
  c.activation = c.transient = c.boundary = c.state;
  const auto st = [&](vertex_t v) -> const strategy& { return pm.strategies[v][static_cast<std::size_t>(choice[v])]; };
  for (vertex_t v = 0; v < pm.size(); ++v) {
    const strategy& s = st(v);
    const auto u = static_cast<std::size_t>(unit[v]);
    if (g[v].is_parameter()) {
      std::set<int> users;
      for (auto [e, end] = boost::out_edges(v, g); e != end; ++e) users.insert(unit[boost::target(*e, g)]);
      for (int w : users) c.state[static_cast<std::size_t>(w)] += s.memory_bytes;
      if (users.size() > 1)
        c.shared.push_back({std::vector<int>(users.begin(), users.end()), piece_bytes(pm.mesh, backward_target(s), g[v])});
      c.after[u] += s.comm_seconds;  // ZeRO's all-gather of the updated weight, once per step
      continue;
    }
    c.forward[u] += s.forward_compute_seconds + s.comm_seconds / m;  // its own collectives run every micro-step
    c.backward[u] += s.compute_seconds / m - s.forward_compute_seconds;
    c.activation[u] += s.memory_bytes;
    if (s.recompute == recompute_kind::full) c.transient[u] += s.recomputed_bytes;
    // What crosses to later units: the activation sent point to point at a stage boundary.
    int furthest = unit[v];
    for (auto [e, end] = boost::out_edges(v, g); e != end; ++e) furthest = std::max(furthest, unit[boost::target(*e, g)]);
    if (!g[v].is_input())
      for (int w = unit[v]; w < furthest; ++w) c.boundary[static_cast<std::size_t>(w)] += piece_bytes(pm.mesh, s.output, g[v]);
  }
  for (edge_t e : pm.edges) {
    const vertex_t u = boost::source(e, g), v = boost::target(e, g);
    const edge_costs ec = detail::edge_cost_of(pm, e, choice);
    const auto w = static_cast<std::size_t>(unit[v]);
    c.forward[w] += ec.forward / m;
    if (g[u].is_parameter()) {
      // A gradient synced once per step (accumulated: plain data parallel, ZeRO-1) runs after
      // the flush; one that ends sharded where the consumer's is a Partial sum (ZeRO-2's
      // reduce-scatter) runs in every micro-batch's backward, its exposed part each time.
      if (detail::gradient_syncs_once(pm, e, choice)) c.after[w] += ec.backward;
      else c.backward[w] += ec.backward / m;
      c.backward[w] += ec.regather / m;
    } else {
      c.backward[w] += ec.backward / m;
    }
  }
  return c;
}

/// One pipelined step, priced.
struct pipelined_step {
  pipeline_config config;
  int micro_batches = 1;               ///< per step
  device_mesh stage_mesh;              ///< one stage's sub-mesh, as the ILP planned it
  std::vector<stage_unit> units;       ///< the model's units as the partition saw them
  stage_partition stages;
  pipeline_timeline timeline;
  std::vector<double> boundary_seconds;  ///< per boundary: one transfer
  double sync_seconds = 0.0;           ///< the exposed gradient sync after the flush (the slowest stage's)
  double shared_sync_seconds = 0.0;    ///< parameters used on two stages: their gradients' all-reduce
  double step_seconds = 0.0;
  std::int64_t peak_memory_bytes = 0;  ///< the largest stage's, of the plan's tensors
  /// What each rank's process holds beside them: the CUDA context and one NCCL communicator per
  /// axis of stage_mesh of more than one rank, and one for the stages' sends when pp > 1
  /// (runtime_reserve_of(device, stage_mesh, pp)).
  runtime_reserve runtime;
  /// What the stages' tensors may use: the device's memory less the runtime reserve, or the
  /// memory budget it was priced under (autosharding_options::memory_budget) where smaller.
  std::int64_t budget = 0;
  bool fits = true;                    ///< the peak and the runtime reserve within the device's memory
  bool within_budget = true;           ///< the peak within `budget` (and so the step fits)
  step_flops flops;
  double tflops_per_device = 0.0;
  double mfu = 0.0;
  plan_summary stage_plan;             ///< the intra-operator plan of the two-layer model it was priced from
  plan_solver solver;                  ///< how the ILP of that model ended
  /// The memory per device that model's plan was solved within, where the fastest plan's stages
  /// did not fit `budget` (price_pipelined); none: the fastest plan, whatever its memory.
  std::optional<std::int64_t> stage_plan_limit;
};

namespace detail {

/// "90.12 GiB per device + 2.12 GiB runtime (CUDA context, 3 NCCL communicators)": what step
/// `s` needs per device; the peak alone where the device counts no runtime.
/// A step that fits the device but not the budget it was priced under says so.
inline std::string peak_beside(const pipelined_step& s) {
  return human_bytes(static_cast<double>(s.peak_memory_bytes)) + " per device" +
         (s.runtime.bytes() > 0 ? " + " + to_string(s.runtime) : std::string()) +
         (s.fits && !s.within_budget ? ", over the memory budget of " + human_bytes_exact(s.budget) : std::string());
}

/// The sub-mesh of one stage of `c` on `mesh` (nodes x devices per node, the last axis within a
/// node) as (nodes, data-parallel ranks within a node, tp), size-1 axes dropped, with the
/// tensor-parallel axis (-1: none) and the link the stages' transfers take: solver_error when
/// the configuration does not factor the mesh.
struct stage_mesh {
  device_mesh mesh;
  int tp_axis = -1;
  link_model pp_link;
};
inline stage_mesh stage_mesh_of(const device_mesh& mesh, const pipeline_config& c) {
  const int devices = mesh.num_ranks();
  const int per_node = mesh.size(mesh.ndim() - 1);
  const int stage = c.dp * c.tp;
  if (c.pp < 1 || c.tp < 1 || c.dp < 1 || static_cast<long>(c.pp) * stage != devices || per_node % c.tp != 0) {
    const std::string sizes = "pp " + std::to_string(c.pp) + (c.dp >= 1 ? " x dp " + std::to_string(c.dp) : std::string()) + " x tp " +
                              std::to_string(c.tp);
    const std::string why = c.tp >= 1 && per_node % c.tp != 0
                                ? "tp " + std::to_string(c.tp) + " does not divide a node's " + std::to_string(per_node) + " devices"
                                : "their product is not the " + std::to_string(devices) + " devices";
    throw solver_error(sizes + " does not factor " + to_string(mesh) + ": " + why +
                       (c.dp < 1 && c.pp >= 1 && c.tp >= 1 && static_cast<long>(c.pp) * c.tp > devices
                            ? " (pp x tp alone is " + std::to_string(static_cast<long>(c.pp) * c.tp) + ")"
                            : std::string()));
  }
  if (stage % per_node != 0 && per_node % stage != 0)
    throw solver_error("a stage of dp " + std::to_string(c.dp) + " x tp " + std::to_string(c.tp) + " neither fills whole nodes of " +
                       std::to_string(per_node) + " devices nor divides one");
  const link_model inter = mesh.link(0), intra = mesh.link(mesh.ndim() - 1);
  const bool whole = stage % per_node == 0;
  const int nodes = whole ? stage / per_node : 1;
  std::vector<int> shape;
  std::vector<link_model> links;
  if (nodes > 1) shape.push_back(nodes), links.push_back(inter);
  if (c.dp / nodes > 1) shape.push_back(c.dp / nodes), links.push_back(intra);
  stage_mesh out;
  if (c.tp > 1) out.tp_axis = static_cast<int>(shape.size()), shape.push_back(c.tp), links.push_back(intra);
  if (shape.empty()) shape.push_back(1), links.push_back(intra);
  out.mesh = device_mesh(shape);
  for (std::size_t a = 0; a < links.size(); ++a) out.mesh.set_link(a, links[a]);
  // Stages of whole nodes talk over the network; stages within a node over NVLink (a boundary
  // between two nodes then is priced as the others).
  out.pp_link = whole && mesh.ndim() > 1 ? inter : intra;
  return out;
}

}  // namespace detail

/// One stage planned: the model cut to two layers at one micro-step's batch on one stage's
/// sub-mesh (for megatron, split into data- and tensor-parallel axes), every strategy priced.
/// The recomputation kinds and algos are masks on one such model, so the search builds one per
/// (tp, dp, micro-batch).
struct stage_probe {
  std::shared_ptr<detail::micro_step_model> model;
  link_model pp_link;   ///< the link stage boundaries cross
  int tp_axis = -1;     ///< the tensor-parallel axis of model->pm.mesh (megatron's mask uses it), -1: none
  int micro_batches = 1;
};

namespace detail {
/// Why no pipeline cuts a model of `layers` repeated layers (fewer than 2) into stages.
inline std::string too_few_layers(std::size_t layers) {
  return "a pipeline needs a model of at least two repeated layers, and this one has " + std::to_string(layers);
}
}  // namespace detail

/// The probe of configuration `c` (its dp set) for `g` (the global batch) on `mesh`.
inline stage_probe make_stage_probe(const model_graph& g, const device_mesh& mesh, const step_pricing& pricing,
                                    const pipeline_config& c) {
  const detail::stage_mesh sub = detail::stage_mesh_of(mesh, c);
  const std::int64_t batch = graph_batch(g);
  const std::int64_t step_batch = static_cast<std::int64_t>(c.micro_batch) * c.dp;
  if (c.micro_batch < 1 || batch <= 0 || batch % step_batch != 0)
    throw solver_error("a global batch of " + std::to_string(batch) + " does not run in micro-batches of " +
                       std::to_string(c.micro_batch) + " on each of " + std::to_string(c.dp) + " data-parallel ranks");
  if (const std::size_t n = map_layers(g).indices.size(); n < 2) throw solver_error(detail::too_few_layers(n));
  stage_probe probe;
  probe.pp_link = sub.pp_link;
  probe.tp_axis = sub.tp_axis;
  detail::check_pipeline_shape(c.pp, batch / step_batch);  // before anything is sized by it
  probe.micro_batches = static_cast<int>(batch / step_batch);
  // Priced as the pipelined step runs it: each stage's micro-step passes fill m + p - 1 slots of
  // the schedule (its m micro-batches and the bubble, which lasts as long as p - 1 of the
  // slowest stage's), each parameter's gradient synced once after the flush (accumulated) or
  // in every micro-step's backward (ZeRO-2), so the stage ILP weighs a micro-step's passes,
  // their own collectives included, m + p - 1 times against the once-per-step sync.
  // price_units takes one slot's share, so each unit's time per micro-batch is the same.
  step_pricing p = pricing;
  p.micro_batches = probe.micro_batches + c.pp - 1;
  p.micro_batch = 0;
  p.recompute = recompute_policy::choose;  // every variant: each solve masks the one it prices
  probe.model = std::make_shared<detail::micro_step_model>(with_layers(with_batch_seq(g, step_batch, 0), 2), sub.mesh, p,
                                                           std::nullopt, detail::pass_model::phase_callback{});
  return probe;
}

/// The peak memory of pricing configurations `configs` of `g` (the global batch) on `mesh`: one
/// stage model at a time (make_stage_probe: two layers on the stage's sub-mesh), so the largest
/// over the distinct stage meshes, each charged as planning is (estimate_planning_memory; a
/// micro-step's batch makes no model larger than the global batch's). A configuration that does
/// not factor the mesh, or a model of fewer than two layers, is left to the probe's own error.
inline planning_memory_estimate estimate_pipeline_memory(const model_graph& g, const device_mesh& mesh, const step_pricing& pricing,
                                                         const std::vector<pipeline_config>& configs) {
  planning_memory_estimate worst;
  if (configs.empty() || map_layers(g).indices.size() < 2) return worst;
  const model_graph two = with_layers(g, 2);
  step_pricing p = pricing;
  p.micro_batches = 1;  // the model's size does not depend on the micro-steps it is priced over
  p.micro_batch = 0;
  p.recompute = recompute_policy::choose;  // as make_stage_probe: every variant
  std::set<std::vector<int>> seen;
  for (const pipeline_config& c : configs) {
    device_mesh sub;
    try {
      sub = detail::stage_mesh_of(mesh, c).mesh;
    } catch (const solver_error&) {
      continue;
    }
    if (!seen.insert(sub.shape()).second) continue;
    const planning_memory_estimate e = estimate_planning_memory(two, {{sub, 1}}, p, true);
    if (e.total() > worst.total()) worst = e;
  }
  return worst;
}

/// Throws resource_error, before any stage model is built, when pricing `configs` may need more
/// memory than this process can allocate (estimate_pipeline_memory, check_planning_memory): a
/// model with a large layer planned with --pp was built with no estimate, while the same plan
/// without --pp was refused up front.
inline void check_pipeline_memory(const model_graph& g, const device_mesh& mesh, const step_pricing& pricing,
                                  const std::vector<pipeline_config>& configs,
                                  const machine_limits& m = machine_limits::memory_here()) {
  const planning_memory_estimate e = estimate_pipeline_memory(g, mesh, pricing, configs);
  if (e.models == 0) return;
  try {
    check_planning_memory(e, m);
  } catch (const resource_error& x) {
    throw resource_error("pricing " + std::to_string(configs.size()) + " pipeline configuration" + (configs.size() == 1 ? "" : "s") +
                         " (one stage model of two layers at a time): " + std::string(x.message()));
  }
}

namespace detail {

/// The unit of the probe's two-layer model that unit k of a model of `layers` layers costs as:
/// the embedding, the first layer, every later one as the second, the head.
inline int probe_unit(int k, int layers) { return k == 0 ? 0 : k == layers + 1 ? 3 : k == 1 ? 1 : 2; }

/// The options and request that plan one stage of `c` on `probe`: `a`'s strategies, tied,
/// recomputation c.recompute, the batch split c.dp ways, and no memory budget.
inline std::pair<autosharding_options, solve_request> stage_solve(const stage_probe& probe, algo a, const pipeline_config& c,
                                                                  const autosharding_options& base) {
  const pass_model& pm = probe.model->pm;
  autosharding_options o = base;
  o.mesh = pm.mesh;
  o.pricing = pm.sopt.pricing;
  o.tie_layers = true;
  solve_request rq;
  rq.a = a;
  rq.recompute = 1u << static_cast<unsigned>(c.recompute);
  rq.budget = false;
  rq.batch_shards = c.dp;
  rq.tp_axis = probe.tp_axis;
  return {std::move(o), rq};
}

/// Plan one stage of `c` on `probe` (stage_solve), its memory per device at most `limit` where
/// given; into out.stage_plan, out.solver, out.stage_mesh and out.stage_plan_limit.
inline void solve_stage_plan(const stage_probe& probe, algo a, const pipeline_config& c, const autosharding_options& base,
                             std::optional<std::int64_t> limit, pipelined_step& out) {
  auto [o, rq] = stage_solve(probe, a, c, base);
  rq.usage_limit = limit;
  std::size_t classes = 0;
  auto solved = solve_algo(probe.model->pm, o, rq, classes);
  out.stage_plan = std::move(solved.first);
  out.solver = {to_string(solved.second.status), solved.second.objective_value(), solved.second.bound_value(), solved.second.gap,
                solved.second.seconds};
  out.stage_plan.par.pp = c.pp;
  out.stage_mesh = probe.model->pm.mesh;
  out.stage_plan_limit = limit;
}

/// The least memory per device any plan of one stage of `c` on `probe` reaches (stage_solve's
/// strategies, each operator at its most frugal).
inline std::int64_t least_stage_memory(const stage_probe& probe, algo a, const pipeline_config& c, const autosharding_options& base) {
  const auto [o, rq] = stage_solve(probe, a, c, base);
  return restrict_problem(probe.model->pm, o, rq, restricted_for::memory).q.min_peak_usage().bytes;
}

/// Per unit of the model: the seconds of one micro-batch's forward and backward, and its
/// gradient sync left exposed after the flush.
struct unit_passes {
  std::vector<double> forward, backward, after;
};

/// The model's units (the embedding, `layers` layers, the head) priced as the probe's units
/// `uc`: into out.units, and their passes.
inline unit_passes model_units(const unit_costs& uc, int layers, pipelined_step& out) {
  unit_passes passes;
  for (int k = 0; k < layers + 2; ++k) {
    const auto u = static_cast<std::size_t>(probe_unit(k, layers));
    out.units.push_back({uc.forward[u] + uc.backward[u], uc.state[u], uc.activation[u], uc.transient[u]});
    passes.forward.push_back(uc.forward[u]);
    passes.backward.push_back(uc.backward[u]);
    passes.after.push_back(uc.after[u]);
  }
  return passes;
}

}  // namespace detail

/// Calls `visit(counts)` with the layers per stage of each split Megatron-LM's arguments can give
/// `pp` stages of `layers` layers, every stage at least one: all as many
/// (--pipeline-model-parallel-size alone: the even split, first where pp divides the layers),
/// or the first and the last stage counts of their own and the stages between as many each
/// (--decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers, Megatron Core
/// 0.10 and later; with 2 stages, the first's count alone). None when pp is below 1 or above
/// the layers. About layers^2 / (2 (pp - 2)) splits, visited one at a time in one buffer
/// (4,096 layers in 3 stages are 8 million).
template <class Visit>
void for_each_megatron_split(int pp, int layers, Visit&& visit) {
  if (pp < 1 || layers < pp) return;
  const auto n = static_cast<std::size_t>(pp);
  std::vector<int> c(n, layers / pp);
  if (layers % pp == 0) visit(static_cast<const std::vector<int>&>(c));
  if (pp == 1) return;
  // The stages between hold `mid` layers each (none with 2 stages), the first and the last the rest.
  for (int mid = 1; mid * (pp - 2) <= layers - 2; ++mid) {
    const int ends = layers - mid * (pp - 2);
    std::fill(c.begin(), c.end(), mid);
    for (int first = 1; first < ends; ++first) {
      c.front() = first;
      c.back() = ends - first;
      const bool even = first == ends - first && (pp == 2 || first == mid);
      if (!even) visit(static_cast<const std::vector<int>&>(c));  // the even split came first
    }
    if (pp == 2) break;
  }
}

/// The splits for_each_megatron_split visits, in its order (for small models and tests: a model
/// of thousands of layers has millions).
inline std::vector<std::vector<int>> megatron_stage_counts(int pp, int layers) {
  std::vector<std::vector<int>> out;
  for_each_megatron_split(pp, layers, [&](const std::vector<int>& c) { out.push_back(c); });
  return out;
}

/// How price_pipelined splits the layers over the stages: as given (`counts`, the layers per
/// stage), or chosen: the partition that balances the stages (the default), or with `megatron`
/// the split among for_each_megatron_split's whose slowest stage is fastest within the budget (the
/// first listed on a tie, so the even split where it is as fast).
struct stage_split {
  std::vector<int> counts;
  bool megatron = false;
  stage_split() = default;
  stage_split(std::vector<int> c) : counts(std::move(c)) {}             // NOLINT: implicit, as the counts alone
  stage_split(std::initializer_list<int> c) : counts(c) {}              // NOLINT
  /// Chosen among the splits Megatron-LM's arguments express.
  static stage_split megatron_arguments() {
    stage_split s;
    s.megatron = true;
    return s;
  }
};

namespace detail {

/// The stages of `c` over `out.units` with `stage_counts` layers each (the embedding with the
/// first stage's layers, the head with the last's), priced; solver_error when the counts do not
/// give c.pp stages `layers` layers in all.
inline stage_partition given_stages(const pipelined_step& out, const std::vector<int>& stage_counts, const pipeline_config& c,
                                    int layers) {
  int total = 0;
  for (int n : stage_counts) total += n;
  if (static_cast<int>(stage_counts.size()) != c.pp || total != layers)
    throw solver_error("stage sizes must give " + std::to_string(c.pp) + " stages " + std::to_string(layers) + " layers in all");
  stage_partition s;
  int at = 0;
  for (int k = 0; k < c.pp; ++k) {
    const int n = stage_counts[static_cast<std::size_t>(k)] + (k == 0 ? 1 : 0) + (k + 1 == c.pp ? 1 : 0);
    s.first.push_back(at);
    s.count.push_back(n);
    double t = 0;
    for (int i = at; i < at + n; ++i) t += out.units[static_cast<std::size_t>(i)].seconds;
    s.seconds.push_back(t);
    s.memory.push_back(stage_memory(out.units, at, n, c.schedule, c.pp, k, out.micro_batches));
    s.slowest = std::max(s.slowest, t);
    at += n;
  }
  return s;
}

/// The partition of `out.units` into c.pp stages that balances them within `budget` (or, when
/// none fits, regardless of it: flagged by the caller); solver_error when there are too few units.
inline stage_partition balanced_stages(const pipelined_step& out, const pipeline_config& c, std::int64_t budget, int layers) {
  std::optional<stage_partition> s = partition_stages(out.units, c.pp, c.schedule, out.micro_batches, budget);
  if (!s) s = partition_stages(out.units, c.pp, c.schedule, out.micro_batches);  // none fits: the fastest, flagged below
  if (!s) throw solver_error("a model of " + std::to_string(layers + 2) + " units cannot fill " + std::to_string(c.pp) + " stages");
  return std::move(*s);
}

/// The split among for_each_megatron_split(c.pp, layers)'s whose slowest stage is fastest, among
/// those whose every stage fits `budget` (or, when none fits, regardless of it: flagged by the
/// caller); the first listed on a tie. solver_error when there is none (more stages than layers).
inline stage_partition megatron_stages(const pipelined_step& out, const pipeline_config& c, std::int64_t budget, int layers) {
  // Each split's stages from range sums, O(pp) a split (given_stages walks every unit).
  const unit_sums sums(out.units);
  std::vector<int> best;
  double best_slowest = 0.0;
  bool best_fits = false;
  for_each_megatron_split(c.pp, layers, [&](const std::vector<int>& counts) {
    double slowest = 0.0;
    bool fits = true;
    int at = 0;
    for (int k = 0; k < c.pp; ++k) {
      const int n = counts[static_cast<std::size_t>(k)] + (k == 0 ? 1 : 0) + (k + 1 == c.pp ? 1 : 0);
      slowest = std::max(slowest, sums.seconds(at, at + n));
      fits = fits && sums.memory(at, at + n, in_flight_micro_batches(c.schedule, c.pp, k, out.micro_batches)) <= budget;
      at += n;
    }
    if (best.empty() || (fits && !best_fits) || (fits == best_fits && slowest < best_slowest))
      best = counts, best_slowest = slowest, best_fits = fits;
  });
  if (best.empty())
    throw solver_error("Megatron-LM gives each of its " + std::to_string(c.pp) + " stages at least one of the model's " +
                       count_noun(layers, "layer"));
  return given_stages(out, best, c, layers);
}

/// Per stage of out.stages: the passes of one micro-batch, the gradient sync it runs after the
/// flush, and the stage of every unit.
struct stage_passes {
  std::vector<stage_seconds> per_stage;
  std::vector<double> after;
  std::vector<int> stage_of_unit;
};

/// The stages' passes from the units' `passes`, and each boundary's transfer of the activation
/// the probe's unit `uc` sends (over `link`) into out.boundary_seconds.
inline stage_passes stage_passes_of(const unit_passes& passes, const unit_costs& uc, const link_model& link, int layers,
                                    pipelined_step& out) {
  stage_passes sp;
  sp.stage_of_unit.resize(out.units.size());
  const int pp = out.config.pp;
  for (int k = 0; k < pp; ++k) {
    stage_seconds t;
    double late = 0;
    const auto sk = static_cast<std::size_t>(k);
    for (int i = out.stages.first[sk]; i < out.stages.first[sk] + out.stages.count[sk]; ++i) {
      t.forward += passes.forward[static_cast<std::size_t>(i)];
      t.backward += passes.backward[static_cast<std::size_t>(i)];
      late += passes.after[static_cast<std::size_t>(i)];
      sp.stage_of_unit[static_cast<std::size_t>(i)] = k;
    }
    sp.per_stage.push_back(t);
    sp.after.push_back(late);
    if (k + 1 < pp) {
      const int last = out.stages.first[sk + 1] - 1;
      const auto bytes = static_cast<double>(uc.boundary[static_cast<std::size_t>(probe_unit(last, layers))]);
      out.boundary_seconds.push_back(link.alpha + bytes / link.beta);
    }
  }
  return sp;
}

/// The all-reduce of the gradients of parameters that units on more than one stage use (the
/// probe's `uc.shared`, over `link`).
inline double shared_parameter_sync(const unit_costs& uc, const std::vector<int>& stage_of_unit, const link_model& link, int layers) {
  double sec = 0.0;
  for (const auto& [users, bytes] : uc.shared) {
    std::set<int> stages;
    for (int u : users) stages.insert(stage_of_unit[static_cast<std::size_t>(u == 3 ? layers + 1 : u == 2 ? 2 : u)]);
    if (stages.size() > 1)
      sec += collective_time(collective::all_reduce, link, static_cast<int>(stages.size()), static_cast<double>(bytes));
  }
  return sec;
}

/// The step of out.stages (out.config's schedule, out.micro_batches) from the units' `passes`
/// and the probe's `uc`: each stage's passes and transfers (over `link`) simulated under the
/// schedule, the gradient syncs after the flush and of parameters two stages share, the step,
/// and the largest stage's peak; into `out`.
inline void run_stages(const unit_passes& passes, const unit_costs& uc, const link_model& link, int layers, pipelined_step& out) {
  const stage_passes sp = stage_passes_of(passes, uc, link, layers, out);
  out.timeline = simulate_pipeline(out.config.schedule, sp.per_stage, out.boundary_seconds, out.micro_batches);
  double end = 0;
  for (int k = 0; k < out.config.pp; ++k) {
    end = std::max(end, out.timeline.finish[static_cast<std::size_t>(k)] + sp.after[static_cast<std::size_t>(k)]);
    out.sync_seconds = std::max(out.sync_seconds, sp.after[static_cast<std::size_t>(k)]);
  }
  out.shared_sync_seconds = shared_parameter_sync(uc, sp.stage_of_unit, link, layers);
  out.step_seconds = end + out.shared_sync_seconds;
  for (std::int64_t b : out.stages.memory) out.peak_memory_bytes = std::max(out.peak_memory_bytes, b);
}

}  // namespace detail

namespace detail {

/// The stages of out.units with out.config's split as `split` gives them, ignoring the memory
/// budget: the fastest the units allow.
inline stage_partition stages_ignoring_memory(const pipelined_step& out, const stage_split& split, int layers) {
  const pipeline_config& c = out.config;
  if (!split.counts.empty()) return given_stages(out, split.counts, c, layers);
  if (split.megatron) return megatron_stages(out, c, std::numeric_limits<std::int64_t>::max(), layers);
  return balanced_stages(out, c, std::numeric_limits<std::int64_t>::max(), layers);
}

/// How much memory per device the stages of `out` lack: 0 when its split (out.stages) fits
/// out.budget and is as fast as the split that ignores memory; else the most a stage of that
/// split holds beyond the budget (at least 1 byte).
inline std::int64_t memory_short(const pipelined_step& out, const stage_split& split, int layers) {
  const stage_partition fastest = stages_ignoring_memory(out, split, layers);
  if (out.within_budget && out.stages.slowest <= fastest.slowest) return 0;
  std::int64_t over = 1;
  for (std::int64_t b : fastest.memory) over = std::max(over, b - out.budget);
  return over;
}

/// Whether the stages of `first`'s configuration could fit first.budget at all: with every
/// operator of the two-layer model at its most frugal strategy stage_solve allows (the least
/// memory it holds, the cheaper on a tie), split as `split` splits them. Where they do not,
/// price_pipelined tries no plan at the least memory a plan reaches (a heuristic gate: a
/// stage's memory is not exactly the two-layer model's peak).
inline bool frugal_stages_fit(const stage_probe& probe, algo a, const pipelined_step& first, const stage_split& split,
                              const autosharding_options& base, int layers) {
  const pass_model& pm = probe.model->pm;
  const auto [o, rq] = stage_solve(probe, a, first.config, base);
  const restricted_problem r = restrict_problem(pm, o, rq, restricted_for::memory);
  std::vector<int> choice(pm.size());
  for (vertex_t v = 0; v < pm.size(); ++v) {
    const strategy_node& n = r.untied.nodes[v];
    std::size_t best = n.costs.size();
    for (std::size_t i = 0; i < n.costs.size(); ++i)
      if (!is_forbidden(n.costs[i]) &&
          (best == n.costs.size() || n.usages[i] < n.usages[best] || (n.usages[i] == n.usages[best] && n.costs[i] < n.costs[best])))
        best = i;
    choice[v] = static_cast<int>(best);
  }
  pipelined_step frugal;
  frugal.config = first.config;
  frugal.micro_batches = first.micro_batches;
  model_units(price_units(pm, choice), layers, frugal);
  const pipeline_config& c = first.config;
  const stage_partition s = !split.counts.empty() ? given_stages(frugal, split.counts, c, layers)
                            : split.megatron       ? megatron_stages(frugal, c, first.budget, layers)
                                                   : balanced_stages(frugal, c, first.budget, layers);
  return std::all_of(s.memory.begin(), s.memory.end(), [&](std::int64_t b) { return b <= first.budget; });
}

/// A floor of the step of `out`'s units split any way `split` allows (a leaner stage plan's
/// units are taken to be no faster): the slowest stage of the fastest split runs every one of
/// the m micro-batches, and over every split of the units' total T per micro-batch into p
/// stages the step is at least T / (1 - (1 - 1/m)^p) (pipeline_bound's argument).
inline double step_floor(const pipelined_step& out, const stage_split& split, int layers) {
  const double m = out.micro_batches;
  double total = 0.0;
  for (const stage_unit& u : out.units) total += u.seconds;
  return std::max(m * stages_ignoring_memory(out, split, layers).slowest, total / (1.0 - std::pow(1.0 - 1.0 / m, out.config.pp)));
}

/// price_pipelined's step with the stage plan solved within `limit` (none: the fastest plan).
inline pipelined_step price_stage_plan(const model_graph& g, const device_mesh& mesh, const step_pricing& pricing, algo a,
                                       const pipeline_config& c, const stage_probe& probe, const stage_split& split,
                                       const autosharding_options& base, int layers, std::optional<std::int64_t> limit) {
  pipelined_step out;
  out.config = c;
  out.micro_batches = probe.micro_batches;
  solve_stage_plan(probe, a, c, base, limit, out);
  const unit_costs uc = price_units(probe.model->pm, out.stage_plan.choice);
  const unit_passes passes = model_units(uc, layers, out);
  // The stages' tensors may use the device's memory less what the process holds beside them,
  // or the budget the caller gives where that is smaller.
  out.runtime = runtime_reserve_of(pricing.device, out.stage_mesh, c.pp);
  out.budget = out.runtime.left_on(pricing.device);
  if (base.memory_budget) out.budget = std::min(out.budget, std::max<std::int64_t>(*base.memory_budget, 0));
  out.stages = !split.counts.empty() ? given_stages(out, split.counts, c, layers)
               : split.megatron       ? megatron_stages(out, c, out.budget, layers)
                                      : balanced_stages(out, c, out.budget, layers);
  run_stages(passes, uc, probe.pp_link, layers, out);
  out.fits = out.runtime.fits(out.peak_memory_bytes, pricing.device);
  out.within_budget = out.peak_memory_bytes <= out.budget;
  out.flops = count_step_flops(g, 1, map_layers(g));
  const double devices = mesh.num_ranks();
  out.tflops_per_device = out.flops.megatron / (out.step_seconds * devices) / 1e12;
  out.mfu = out.flops.model / (out.step_seconds * devices * pricing.device.peak_flops);
  return out;
}

}  // namespace detail

/// How many times price_pipelined solves a stage plan again within a memory limit when the
/// fastest plan's stages do not fit.
inline constexpr int max_leaner_stage_plans = 3;

/// The step of `g` (the global batch) on `mesh` under configuration `c`, each stage planned by
/// `a`'s strategies (megatron: its tensor-parallel layout on tp; alpa: the ILP's choice on the
/// stage's sub-mesh, its batch split dp ways) with recomputation c.recompute, on `probe`
/// (make_stage_probe's for c); `split`: the layers per stage as given (Megatron-LM's even
/// split), or chosen (stage_split: the partition that balances them, or the best one
/// Megatron-LM's arguments express). Throws solver_error when the configuration does not
/// factor the mesh or the batch.
///
/// The stage plan is first the fastest the ILP finds for the two-layer model, whatever its
/// memory. Where its stages do not fit the budget, or fit only split more slowly than they
/// would be without it, the plan is solved again (up to max_leaner_stage_plans times) within a
/// limit on the two-layer model's memory: its peak less what the fastest split's fullest stage
/// lacks (memory_short), and again from that plan's peak while its stages still lack memory.
/// A limit below the least any plan reaches is that least, tried for Megatron-LM's layout
/// alone (its distributed optimizer) and only where its stages could fit (frugal_stages_fit).
/// Each is priced as a whole step and the fastest step within the budget kept (the first where
/// none is); none is tried when the fastest plan's step_floor is already `worth_below` (the
/// search's best step so far). The limit is a probe, not
/// a proof: a stage holds its layers' memory many times over and the two-layer model's twice,
/// so a leaner plan than the limits admit may exist; each plan kept is priced exactly.
inline pipelined_step price_pipelined(const model_graph& g, const device_mesh& mesh, const step_pricing& pricing, algo a,
                                      pipeline_config c, const stage_probe& probe, const stage_split& split = {},
                                      const autosharding_options& base = {},
                                      double worth_below = std::numeric_limits<double>::infinity()) {
  if (c.dp == 0 && c.pp > 0 && c.tp > 0) c.dp = mesh.num_ranks() / (c.pp * c.tp);
  const int layers = static_cast<int>(map_layers(g).indices.size());
  pipelined_step out = detail::price_stage_plan(g, mesh, pricing, a, c, probe, split, base, layers, std::nullopt);
  std::int64_t peak = out.stage_plan.peak_memory_bytes, short_by = detail::memory_short(out, split, layers);
  if (short_by > 0 && detail::step_floor(out, split, layers) >= worth_below) short_by = 0;
  std::optional<std::int64_t> least;
  for (int round = 0; round < max_leaner_stage_plans && short_by > 0; ++round) {
    if (!least) least = detail::least_stage_memory(probe, a, c, base);
    if (peak <= *least) break;  // as lean as a plan gets
    // A stage short of more than the two-layer model can shed: the plan of least memory, tried
    // for Megatron-LM's layout alone, and only where its stages could fit. There it is the
    // distributed optimizer (and sequence parallelism), which experts run to fit a model. alpa's
    // least is every operator at its most frugal sharding, never near the fastest, and its ILP,
    // that tight, the hardest to solve (60 s of a LLaMA-70B search's 120).
    if (peak - short_by <= *least && (a != algo::megatron || !detail::frugal_stages_fit(probe, a, out, split, base, layers))) break;
    std::optional<pipelined_step> lean;
    try {
      lean = detail::price_stage_plan(g, mesh, pricing, a, c, probe, split, base, layers, std::max(*least, peak - short_by));
    } catch (const solver_error&) {  // no plan within the limit in the solver's time: the plans so far stand
      break;
    }
    peak = lean->stage_plan.peak_memory_bytes;
    short_by = detail::memory_short(*lean, split, layers);
    if (lean->within_budget && (!out.within_budget || lean->step_seconds < out.step_seconds)) out = std::move(*lean);
  }
  return out;
}

/// price_pipelined on the probe it needs.
inline pipelined_step price_pipelined(const model_graph& g, const device_mesh& mesh, const step_pricing& pricing, algo a,
                                      pipeline_config c, const stage_split& split = {},
                                      const autosharding_options& base = {}) {
  if (c.dp == 0 && c.pp > 0 && c.tp > 0) c.dp = mesh.num_ranks() / (c.pp * c.tp);
  check_pipeline_memory(g, mesh, pricing, {c});  // before the probe's model is built
  return price_pipelined(g, mesh, pricing, a, c, make_stage_probe(g, mesh, pricing, c), split, base);
}

// ---- the outer search -------------------------------------------------------------------------

/// What the pipeline search may try: the schedule, and limits on the space (0: every value).
struct pipeline_search_options {
  algo a = algo::alpa;                  ///< the intra-operator strategies of every stage
  pipeline_schedule schedule = pipeline_schedule::one_f_one_b;
  int pp = 0, tp = 0, dp = 0;           ///< fixed sizes, or 0 for every factorisation
  int micro_batch = 0;                  ///< fixed, or 0 for every divisor of the batch per data-parallel rank up to max_micro_batch
  int max_micro_batch = 8;
  unsigned recompute = 0b111;           ///< recompute_kind bits allowed
  /// The layers split as Megatron-LM's arguments can split them (stage_split::megatron_arguments:
  /// evenly, or the first and the last stage their own counts and the stages between as many
  /// each). false: partitioned to balance the stages.
  bool megatron_stages = false;
  std::size_t alternatives = 5;         ///< the best few configurations kept beside the plan
  /// Solver settings for each stage's ILP (time limit, threads); its memory_budget, where
  /// given, is what a stage's tensors may use when less than the device's memory less the
  /// configuration's runtime reserve (nullopt: that alone).
  autosharding_options base;
};

/// The search's answer: the fastest configuration within its budget (and so the device), the
/// next best, and what was tried.
struct pipeline_search {
  std::optional<pipelined_step> best;   ///< none when no configuration is within its budget
  std::vector<pipelined_step> alternatives;  ///< the next fastest that fit, fastest first
  std::size_t configurations = 0;       ///< in the space
  std::size_t priced = 0;               ///< planned by the ILP (the rest were pruned)
  std::size_t pruned_bound = 0, pruned_recompute = 0, failed = 0;
  double seconds = 0.0;                 ///< wall time of the search
  std::string closest;                  ///< when none fits: the configuration that came closest, in words
  std::vector<std::string> failures;    ///< the first few configurations the ILP had no plan for, and why
  std::string empty;                    ///< when the space has no configuration: why, with the numbers
};

namespace detail {

/// Why the search's space is empty: the sizes it was given against the rules that make one.
inline std::string why_no_configuration(const device_mesh& mesh, const pipeline_search_options& so, std::int64_t batch, int layers) {
  std::string fixed;
  for (auto [flag, v] : {std::pair<const char*, int>{"pp", so.pp}, {"tp", so.tp}, {"dp", so.dp}, {"micro-batch", so.micro_batch}})
    if (v > 0) fixed += std::string(fixed.empty() ? " with " : ", ") + flag + " " + std::to_string(v);
  return "no pipelined configuration" + fixed + " on " + to_string(mesh) + " (" + std::to_string(mesh.num_ranks()) + " devices, " +
         std::to_string(mesh.size(mesh.ndim() - 1)) + " per node) for a global batch of " + std::to_string(batch) + " and " +
         std::to_string(layers) + " layers: pp x tp x dp must be the devices, tp divide a node, a stage (dp x tp) fill whole nodes "
         "or divide one, pp be at most the layers" +
         ", the micro-batch divide each data-parallel rank's share of the batch (a micro-batch of at most " +
         std::to_string(std::max(so.max_micro_batch, so.micro_batch)) + " sequences), and pp x micro-batches be at most " +
         std::to_string(max_pipeline_micro_steps) + " (max_pipeline_micro_steps)";
}

/// The configurations search_pipelines tries for `g` (the global batch, repeated layers `L`) on
/// `mesh`, as `so` limits them (see search_pipelines), in the order listed.
inline std::vector<pipeline_config> pipeline_space(const model_graph& g, const layer_map& L, const device_mesh& mesh,
                                                   const step_pricing& pricing, const pipeline_search_options& so) {
  const int devices = mesh.num_ranks(), per_node = mesh.size(mesh.ndim() - 1);
  const std::int64_t batch = graph_batch(g);
  const int layers = static_cast<int>(L.indices.size());
  std::vector<pipeline_config> space;
  for (int tp = 1; tp <= per_node; ++tp) {
    if (per_node % tp != 0 || (so.tp > 0 && tp != so.tp)) continue;
    for (int pp = 1; pp <= std::min(layers, devices / tp); ++pp) {
      if ((devices / tp) % pp != 0 || (so.pp > 0 && pp != so.pp)) continue;
      const int dp = devices / (tp * pp);
      if ((so.dp > 0 && dp != so.dp) || devices % (tp * pp) != 0) continue;
      const int stage = dp * tp;
      if (stage % per_node != 0 && per_node % stage != 0) continue;
      if (batch % dp != 0) continue;
      const std::int64_t per_rank = batch / dp;
      // A fixed micro-batch is the only one tried: counting up to it (--micro-batch 16777216) was
      // 16 million steps for each (tp, pp).
      for (int b = so.micro_batch > 0 ? so.micro_batch : 1; b <= per_rank && b <= std::max(so.max_micro_batch, so.micro_batch); ++b) {
        if (per_rank % b != 0 || (so.micro_batch > 0 && b != so.micro_batch)) continue;
        if (per_rank / b > max_pipeline_micro_steps / pp) continue;  // a schedule too long to simulate
        for (recompute_kind r : all_recompute_kinds) {
          if (!has_kind(so.recompute, r)) continue;
          // Selective recomputation differs from none only for the unfused attention core.
          if (r == recompute_kind::selective && pricing.attention != attention_kernel::unfused) continue;
          space.push_back({pp, tp, dp, b, r, so.schedule});
        }
      }
    }
  }
  return space;
}

/// A proven lower bound of a configuration's step: stage k cannot start before the stages
/// ahead ran micro-batch 0's forward, runs m micro-batches, and after its last backward the
/// stages ahead run theirs, so the step is at least max_k (sum_{s<k} c_s + m c_k), c_s a stage's
/// time per micro-batch; over every split of their sum T that is at least T / (1 - (1 - 1/m)^p),
/// and T is at least one micro-step's GEMM FLOPs (three passes, four in the layers with full
/// recomputation) over a stage's devices at the fastest rate the device prices a GEMM at.
class pipeline_bound {
 public:
  pipeline_bound(const model_graph& g, const layer_map& L, const step_pricing& pricing)
      : batch_(graph_batch(g)), rate_(pricing.device.matmul_flops(1e30, pricing.achievable)) {  // the large-GEMM rate: no GEMM is priced faster
    // Forward FLOPs of the linears and matmuls (the attention core's are priced per kernel).
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
      if (g[v].kind != op_kind::linear && g[v].kind != op_kind::matmul) continue;
      const tensor_shape in = g[operands(g, v)[0]].shape;
      (L.layer[v] >= 0 ? linear_layers_ : linear_rest_) +=
          2.0 * static_cast<double>(g[v].shape.numel()) * static_cast<double>(in[in.rank - 1u]);
    }
  }

  double operator()(const pipeline_config& c) const {
    const double m = static_cast<double>(batch_) / (static_cast<double>(c.micro_batch) * c.dp);
    const double flops = (c.recompute == recompute_kind::full ? 4 : 3) * linear_layers_ + 3 * linear_rest_;
    const double T = flops / m / (static_cast<double>(c.dp) * c.tp * rate_);
    return T / (1.0 - std::pow(1.0 - 1.0 / m, c.pp));
  }

 private:
  std::int64_t batch_;
  double rate_;
  double linear_layers_ = 0, linear_rest_ = 0;
};

/// A configuration priced: its step, or why it has none.
struct priced_ahead {
  std::optional<pipelined_step> step;
  std::string error;  ///< why it has none
};

/// Prices the configurations of a search's space. The stage model (make_stage_probe: the
/// search's main cost) is built once per (pp, tp, dp, b): the first configuration that needs it
/// prices, on the same model, every later one of the space with those sizes (its other
/// recomputations), kept until the walk reaches it (or dropped when the walk stops or prunes
/// it: the walk's decisions are the same as pricing each when it is reached).
class pipeline_pricer {
 public:
  pipeline_pricer(const model_graph& g, const device_mesh& mesh, const step_pricing& pricing, const pipeline_search_options& so,
                  const std::vector<pipeline_config>& space)
      : g_(g), mesh_(mesh), pricing_(pricing), so_(so), space_(space) {}

  /// Configuration `at` of the space, priced (now, or ahead by an earlier one of its sizes).
  priced_ahead take(std::size_t at) {
    if (!ahead_.count(at)) price_sizes_of(at);
    priced_ahead p = std::move(ahead_.at(at));
    ahead_.erase(at);
    return p;
  }

  /// Configuration `at` pruned: what was priced ahead for it goes.
  void drop(std::size_t at) { ahead_.erase(at); }

  /// The best step found so far: a stage plan leaner than the fastest is not tried where the
  /// fastest's stages cannot beat it (price_pipelined's worth_below).
  void best_so_far(double seconds) { incumbent_ = seconds; }

 private:
  /// Each stage takes the fastest plan for its layers, or where its stages do not fit, a leaner
  /// one (price_pipelined, not tried where it cannot beat the best step so far). Under alpa,
  /// Megatron-LM's layout (a subset of its strategies, storing the optimizer state sharded) is
  /// priced on the same stage model too, and the faster step within the budget kept: the stage
  /// ILP weighs a micro-step's passes m + p - 1 times against the once-per-step gradient sync,
  /// but the pipelined step also holds the boundaries' sends and the stages' imbalance, so its
  /// choice can be the slower step (the small GPT-2 of docs/pipelines.md at pp 2, tp 1, dp 4:
  /// Megatron-LM's layout 235.3 us, faster than the ILP's). alpa's search never loses to
  /// Megatron-LM's layout on a configuration.
  pipelined_step price_on(const pipeline_config& c, const stage_probe& probe) const {
    const stage_split split = so_.megatron_stages ? stage_split::megatron_arguments() : stage_split();
    pipelined_step s = price_pipelined(g_, mesh_, pricing_, so_.a, c, probe, split, so_.base, incumbent_);
    if (so_.a != algo::alpa) return s;
    try {
      pipelined_step m = price_pipelined(g_, mesh_, pricing_, algo::megatron, c, probe, split, so_.base, incumbent_);
      if (m.within_budget && (!s.within_budget || m.step_seconds < s.step_seconds)) s = std::move(m);
    } catch (const solver_error&) {  // a configuration Megatron-LM's layout cannot take: alpa's stands
    }
    return s;
  }

  /// Configuration `at` and every later one of its sizes, on one stage model.
  void price_sizes_of(std::size_t at) {
    const pipeline_config& c = space_[at];
    std::vector<std::size_t> same;
    for (std::size_t j = at; j < space_.size(); ++j)
      if (space_[j].pp == c.pp && space_[j].tp == c.tp && space_[j].dp == c.dp && space_[j].micro_batch == c.micro_batch)
        same.push_back(j);
    try {
      const stage_probe probe = make_stage_probe(g_, mesh_, pricing_, c);
      for (std::size_t j : same) try {
          ahead_[j].step = price_on(space_[j], probe);
        } catch (const solver_error& e) {
          ahead_[j].error = std::string(e.message());
        }
    } catch (const solver_error& e) {
      for (std::size_t j : same) ahead_[j].error = std::string(e.message());
    }
  }

  const model_graph& g_;
  const device_mesh& mesh_;
  const step_pricing& pricing_;
  const pipeline_search_options& so_;
  const std::vector<pipeline_config>& space_;
  std::map<std::size_t, priced_ahead> ahead_;  // by position in the space
  double incumbent_ = std::numeric_limits<double>::infinity();
};

/// `s` among the fastest `alternatives` + 1 plans `fitting` keeps (fastest first): only the best
/// few are kept, bounded memory whatever the space.
inline void keep_fastest(std::vector<pipelined_step>& fitting, pipelined_step s, std::size_t alternatives) {
  const auto pos = std::upper_bound(fitting.begin(), fitting.end(), s.step_seconds,
                                    [](double t, const pipelined_step& x) { return t < x.step_seconds; });
  if (static_cast<std::size_t>(pos - fitting.begin()) <= alternatives) {
    fitting.insert(pos, std::move(s));
    if (fitting.size() > alternatives + 1) fitting.pop_back();
  }
}

}  // namespace detail

/// The fastest pipelined configuration of `g` (the global batch) on `mesh` (nodes x devices per
/// node): every (pp, tp, dp) with pp x tp x dp the devices, tp dividing a node and a stage
/// filling whole nodes or dividing one, pp at most the layers; every micro-batch b dividing the
/// batch per data-parallel rank (up to max_micro_batch); every recomputation allowed; each
/// priced by price_pipelined with the balanced partition, or with the layers split evenly
/// (so.megatron_stages: the fastest split Megatron-LM's arguments express) (each stage the fastest plan `so.a`
/// allows for its layers, tied, on its sub-mesh, or where its stages do not fit, leaner plans
/// as price_pipelined tries them). Exact over that space as far as the stage plans go: a
/// configuration is skipped only when a proven bound says it cannot beat the best so far (the
/// bubble bound, detail::pipeline_bound: the slowest stage's micro-batches plus the pipeline's
/// fill and drain, at the device's fastest GEMM rate), or when the same (pp, tp, dp, b) already
/// fit its fastest stage plan with less recomputation (recomputation only adds time to the same
/// strategies; a fit by a leaner plan prunes nothing). The space is listed up front and walked
/// once; only the best few plans are kept.
inline pipeline_search search_pipelines(const model_graph& g, const device_mesh& mesh, const step_pricing& pricing,
                                        const pipeline_search_options& so = {}) {
  const auto t0 = std::chrono::steady_clock::now();
  pipeline_search out;
  const layer_map L = map_layers(g);
  // Every configuration of a model of one layer fails alike: each was tried, and the refusal
  // blamed the ILP ("found no plan for any of the 10 configurations it tried"), repeating why.
  if (L.indices.size() < 2) {
    out.empty = "no pipelined configuration: " + detail::too_few_layers(L.indices.size());
    return out;
  }
  std::vector<pipeline_config> space = detail::pipeline_space(g, L, mesh, pricing, so);
  out.configurations = space.size();
  check_pipeline_memory(g, mesh, pricing, space);  // before any stage model is built
  if (space.empty()) out.empty = detail::why_no_configuration(mesh, so, graph_batch(g), static_cast<int>(L.indices.size()));
  const detail::pipeline_bound bound(g, L, pricing);
  // Cheapest bound first: the best plans come early and the bound stops the walk. Within one
  // (pp, tp, dp, b) less recomputation comes first (its bound is never higher).
  std::stable_sort(space.begin(), space.end(), [&](const pipeline_config& x, const pipeline_config& y) { return bound(x) < bound(y); });
  std::vector<pipelined_step> fitting;
  double incumbent = std::numeric_limits<double>::infinity();
  std::map<std::vector<int>, recompute_kind> fit_without;  // (pp, tp, dp, b) -> the least recomputation that fit
  std::int64_t closest_bytes = std::numeric_limits<std::int64_t>::max();
  detail::pipeline_pricer pricer(g, mesh, pricing, so, space);
  for (std::size_t at = 0; at < space.size(); ++at) {
    const pipeline_config& c = space[at];
    const std::vector<int> key{c.pp, c.tp, c.dp, c.micro_batch};
    if (const auto it = fit_without.find(key); it != fit_without.end() && it->second < c.recompute) {
      ++out.pruned_recompute;
      pricer.drop(at);
      continue;
    }
    if (bound(c) >= incumbent) {  // and every configuration after it
      out.pruned_bound += space.size() - at;
      break;
    }
    detail::priced_ahead p = pricer.take(at);
    if (!p.step) {
      if (++out.failed <= 3) out.failures.push_back(describe(c, 0) + ": " + p.error);
      continue;
    }
    pipelined_step s = std::move(*p.step);
    ++out.priced;
    if (!s.within_budget) {
      if (s.peak_memory_bytes + s.runtime.bytes() < closest_bytes)
        closest_bytes = s.peak_memory_bytes + s.runtime.bytes(), out.closest = describe(c, s.micro_batches) + ": " + detail::peak_beside(s);
      continue;
    }
    // A leaner stage plan's fit says nothing of a recomputing twin's fastest plan, which may be faster.
    if (!s.stage_plan_limit) fit_without.emplace(key, c.recompute);
    incumbent = std::min(incumbent, s.step_seconds);
    pricer.best_so_far(incumbent);
    detail::keep_fastest(fitting, std::move(s), so.alternatives);
  }
  if (!fitting.empty()) {
    out.best = fitting.front();
    for (std::size_t k = 1; k < fitting.size() && out.alternatives.size() < so.alternatives; ++k) out.alternatives.push_back(fitting[k]);
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

/// Megatron-LM's 3D configuration as people run it: tensor parallel over a node (`tp`, 0: the
/// devices per node), the fewest stages that fit (dividing the layers, stages split evenly as
/// Megatron-LM requires), data parallel over the rest, micro-batches of `micro_batch`, and
/// recomputation `r` on every layer. Throws solver_error saying what came closest when no
/// stage count fits.
inline pipelined_step megatron_pipelined(const model_graph& g, const device_mesh& mesh, const step_pricing& pricing, int tp,
                                         int micro_batch, recompute_kind r, pipeline_schedule schedule = pipeline_schedule::one_f_one_b,
                                         const autosharding_options& base = {}) {
  const int per_node = mesh.size(mesh.ndim() - 1);
  if (tp == 0) tp = per_node;
  const int layers = static_cast<int>(map_layers(g).indices.size());
  std::string tried;
  std::optional<pipelined_step> closest;
  for (int pp = 1; pp <= layers; ++pp) {
    if (layers % pp != 0 || mesh.num_ranks() % (pp * tp) != 0) continue;
    pipeline_config c{pp, tp, mesh.num_ranks() / (pp * tp), micro_batch, r, schedule};
    try {
      pipelined_step s = price_pipelined(g, mesh, pricing, algo::megatron, c, std::vector<int>(static_cast<std::size_t>(pp), layers / pp), base);
      if (s.within_budget) return s;
      if (!closest || s.peak_memory_bytes + s.runtime.bytes() < closest->peak_memory_bytes + closest->runtime.bytes()) closest = std::move(s);
    } catch (const solver_error& e) {
      tried += (tried.empty() ? "" : "; ") + std::string("pp ") + std::to_string(pp) + ": " + std::string(e.message());
    }
  }
  throw solver_error("megatron (tensor parallel " + std::to_string(tp) + ", micro-batch " + std::to_string(micro_batch) + ", " +
                     std::string(to_string(r)) + " recomputation) fits no stage count dividing the " + std::to_string(layers) +
                     " layers" + (closest ? "; the closest, " + describe(closest->config, closest->micro_batches) + ", needs " +
                                                detail::peak_beside(*closest)
                                          : std::string()) +
                     (tried.empty() ? std::string() : " (" + tried + ")"));
}

// ---- the plan document of a pipelined step -----------------------------------------------------

/// The pipeline a plan file records for step `s` (plan/pipeline.hpp): each stage's layers (its
/// units less the embedding and the head), its time, memory and micro-batches in flight.
inline plan_pipeline plan_pipeline_of(const pipelined_step& s, const link_model& link) {
  plan_pipeline p;
  p.schedule = s.config.schedule;
  p.link = link;
  const int layers = static_cast<int>(s.units.size()) - 2;
  for (std::size_t k = 0; k < s.stages.count.size(); ++k) {
    const int a = s.stages.first[k], b = a + s.stages.count[k] - 1;  // its units, inclusive
    const int first = std::max(a, 1) - 1, last = std::min(b, layers) - 1;
    p.stages.push_back({first, std::max(0, last - first + 1), s.stages.seconds[k], s.stages.memory[k], s.timeline.in_flight[k]});
  }
  p.transfer_seconds = s.boundary_seconds;
  p.step_seconds = s.step_seconds;
  p.bubble_fraction = s.timeline.bubble_fraction;
  p.gradient_sync_seconds = s.sync_seconds;
  p.tied_sync_seconds = s.shared_sync_seconds;
  return p;
}

/// "embedding + layers 0-23", "layers 24-47 + head": what stage k of `s` holds.
inline std::string describe_stage(const pipelined_step& s, std::size_t k) { return describe_stage(plan_pipeline_of(s, {}), k); }

namespace detail {

/// The vertex of the two-layer stage model `probe` that vertex v of `full` (the same model
/// with all its layers) takes its strategy from: the same name outside the layers and in the
/// first layer, the second layer's counterpart in every later one (the layers are tied).
inline vertex_t probe_vertex(const model_graph& full, const std::map<long, int>& position, const model_graph& probe,
                             const layer_map& probe_layers, vertex_t v) {
  std::string name = full[v].name;
  const long i = layer_index(name);
  if (const auto at = position.find(i); i >= 0 && at != position.end() && at->second > 0) {
    name = layer_key(name);
    name.replace(name.find('#'), 1, std::to_string(probe_layers.indices[1]));
  }
  const std::optional<vertex_t> u = find_vertex(probe, name);
  if (!u) throw solver_error("the stage model has no counterpart '" + name + "' of '" + full[v].name + "'");
  return *u;
}

/// probe_vertex of every vertex of `full`, by vertex.
inline std::vector<vertex_t> probe_vertices(const model_graph& full, const model_graph& probe, const layer_map& probe_layers) {
  const layer_map L = map_layers(full);
  std::map<long, int> position;
  for (std::size_t k = 0; k < L.indices.size(); ++k) position[L.indices[k]] = static_cast<int>(k);
  std::vector<vertex_t> out;
  for (vertex_t v = 0; v < boost::num_vertices(full); ++v) out.push_back(probe_vertex(full, position, probe, probe_layers, v));
  return out;
}

}  // namespace detail

/// The plan document of pipelined step `s` of `g` (the global batch) on `mesh`, searched with
/// options `o`: the whole model at one micro-step of one stage (micro_batch x dp sequences) on
/// one stage's sub-mesh, every layer in the strategies its stage's plan chose (the first layer
/// as the stage model's first, every later one as its second), and the pipeline. Its cost: the
/// step as simulated (objective), the slowest stage's passes over the step (compute, their own
/// collectives included), the gradient syncs after the flush (communication), no resharding
/// beside the passes', and the largest stage's peak; its solver: the stage model's ILP.
inline plan_document pipelined_document(const model_graph& g, const device_mesh& mesh, const pipelined_step& s,
                                        const autosharding_options& o) {
  const stage_probe probe = make_stage_probe(g, mesh, o.pricing, s.config);
  const detail::pass_model& pm = probe.model->pm;
  plan_document d;
  d.mesh = pm.mesh;
  d.pricing = pm.sopt.pricing;
  d.pricing.micro_batches = s.micro_batches;
  d.pricing.micro_batch = s.config.micro_batch;
  d.pricing.recompute = o.pricing.recompute;
  // The budget its stages were partitioned under: the device's memory less the runtime reserve,
  // or the caller's where smaller.
  d.options = {s.stage_plan.algo, o.time_limit, o.mip_rel_gap, o.skip_fully_replicated, true, s.budget, {}};
  for (const auto& [name, spec] : o.pinned) d.options.pinned[name] = to_alpa_string(spec);
  d.graph = with_batch_seq(g, static_cast<std::int64_t>(s.config.micro_batch) * s.config.dp, 0);
  const std::vector<vertex_t> counterpart = detail::probe_vertices(d.graph, pm.g, pm.layers);
  for (vertex_t v = 0; v < boost::num_vertices(d.graph); ++v) {
    const vertex_t u = counterpart[v];
    const strategy& st = pm.strategies[u][static_cast<std::size_t>(s.stage_plan.choice[u])];
    d.tensors.push_back({st.name, st.inputs, st.output, max_local_shape(pm.mesh, st.output, d.graph[v].shape), st.seconds(),
                         st.memory_bytes, st.recompute});
  }
  double slowest = 0;
  for (double b : s.timeline.busy) slowest = std::max(slowest, b);
  d.cost = {s.step_seconds, slowest, s.sync_seconds + s.shared_sync_seconds, 0.0, s.peak_memory_bytes};
  d.solver = s.solver;
  d.pipeline = plan_pipeline_of(s, probe.pp_link);
  return d;
}

/// The pipeline of pipelined plan `d` priced again from what the file holds (its graph at one
/// micro-step, its stage mesh, its pricing, its strategies, its stages' layers, schedule and
/// link), as the search priced it (make_stage_probe, price_pipelined): the stage model of the
/// first two layers on the stage mesh, each unit's passes over the m + p - 1 slots of the
/// schedule, the stages the file gives. What a reader reports of a pipelined plan (show --plan)
/// comes from here, never from the figures the file records, which another pricing wrote or a
/// hand edited. Throws solver_error when the plan is not one the search writes: a strategy its
/// stage model does not offer, or a layer after the first that does not run as the second (the
/// search prices every later layer as that one).
inline plan_pipeline reprice_pipeline(const plan_document& d) {
  if (!d.pipeline) throw solver_error("the plan has no pipeline stages");
  const plan_pipeline& recorded = *d.pipeline;
  pipelined_step out;
  out.config.pp = static_cast<int>(recorded.stages.size());
  out.config.schedule = recorded.schedule;
  out.micro_batches = d.pricing.mode == run_mode::training ? d.pricing.accumulation() : 1;
  step_pricing p = d.pricing;
  p.micro_batches = out.micro_batches + out.config.pp - 1;
  p.micro_batch = 0;
  p.recompute = recompute_policy::choose;
  const model_graph two = with_layers(d.graph, 2);
  check_planning_memory(estimate_planning_memory(two, {{d.mesh, 1}}, p, true));  // before the stage model is built
  const detail::pass_model pm(two, d.mesh, p);
  // The stage model's strategies, by name, and every vertex of the plan as its counterpart runs.
  std::vector<int> choice(pm.size(), -1);
  for (vertex_t u = 0; u < pm.size(); ++u) {
    const std::optional<vertex_t> v = find_vertex(d.graph, two[u].name);
    if (!v) throw solver_error("the stage model's '" + two[u].name + "' is not in the plan's graph");
    const std::string& want = d.tensors[*v].strategy;
    const auto& ss = pm.strategies[u];
    for (std::size_t i = 0; i < ss.size() && choice[u] < 0; ++i)
      if (ss[i].name == want) choice[u] = static_cast<int>(i);
    if (choice[u] < 0) throw solver_error("'" + two[u].name + "': strategy " + want + " is not one its stage model offers");
  }
  const std::vector<vertex_t> counterpart = detail::probe_vertices(d.graph, two, pm.layers);
  for (vertex_t v = 0; v < boost::num_vertices(d.graph); ++v) {
    const vertex_t u = counterpart[v];
    const std::string& runs = pm.strategies[u][static_cast<std::size_t>(choice[u])].name;
    if (d.tensors[v].strategy != runs)
      throw solver_error("'" + d.graph[v].name + "' runs " + d.tensors[v].strategy + ", but a pipelined plan runs every layer after the "
                         "first as the second, and '" + two[u].name + "' runs " + runs);
  }
  const int layers = static_cast<int>(map_layers(d.graph).indices.size());
  const unit_costs uc = price_units(pm, choice);
  const detail::unit_passes passes = detail::model_units(uc, layers, out);
  std::vector<int> counts;
  for (const plan_stage& s : recorded.stages) counts.push_back(s.layers);
  out.stages = detail::given_stages(out, counts, out.config, layers);
  detail::run_stages(passes, uc, recorded.link, layers, out);
  return plan_pipeline_of(out, recorded.link);
}

/// Where pipeline `recorded` (a plan file's) says other than `priced` (reprice_pipeline of the
/// same plan), in words naming both numbers: "step 4.7 us (priced 473.7 us)"; empty when every
/// figure agrees (to 1e-9 of the larger, the file's decimal digits aside).
inline std::vector<std::string> pipeline_differences(const plan_pipeline& recorded, const plan_pipeline& priced) {
  std::vector<std::string> out;
  const auto same = [](double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b)); };
  const auto seconds = [&](const std::string& what, double a, double b) {
    if (!same(a, b)) out.push_back(what + " " + human_seconds(a) + " (priced " + human_seconds(b) + ")");
  };
  seconds("step", recorded.step_seconds, priced.step_seconds);
  const auto percent = [](double f) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f %%", 100 * f);
    return std::string(buf);
  };
  if (!same(recorded.bubble_fraction, priced.bubble_fraction))
    out.push_back("bubble " + percent(recorded.bubble_fraction) + " (priced " + percent(priced.bubble_fraction) + ")");
  seconds("gradient sync after the flush", recorded.gradient_sync_seconds, priced.gradient_sync_seconds);
  seconds("tied parameters' sync", recorded.tied_sync_seconds, priced.tied_sync_seconds);
  for (std::size_t k = 0; k < recorded.stages.size() && k < priced.stages.size(); ++k) {
    const plan_stage &a = recorded.stages[k], &b = priced.stages[k];
    const std::string st = "stage " + std::to_string(k) + " ";
    seconds(st + "per micro-batch", a.seconds, b.seconds);
    if (a.memory_bytes != b.memory_bytes)
      out.push_back(st + "memory " + human_bytes(static_cast<double>(a.memory_bytes)) + " (priced " +
                    human_bytes(static_cast<double>(b.memory_bytes)) + ")");
    if (a.in_flight != b.in_flight)
      out.push_back(st + "in flight " + std::to_string(a.in_flight) + " (priced " + std::to_string(b.in_flight) + ")");
  }
  for (std::size_t k = 0; k < recorded.transfer_seconds.size() && k < priced.transfer_seconds.size(); ++k)
    seconds("transfer " + std::to_string(k), recorded.transfer_seconds[k], priced.transfer_seconds[k]);
  return out;
}

/// Per vertex of pipelined plan `d`: the stage of an operator, and the stages whose operators
/// read a source, ascending (two for an embedding tied to the head, none for a source nothing
/// reads). Throws solver_error when the stages' layers do not add up to the graph's.
inline std::vector<std::vector<int>> stages_of_vertices(const plan_document& d) {
  if (!d.pipeline) throw solver_error("the plan has no pipeline stages");
  const layer_map L = map_layers(d.graph);
  const plan_pipeline& p = *d.pipeline;
  const int layers = static_cast<int>(L.indices.size());
  if (p.stages.back().first_layer + p.stages.back().layers != layers)
    throw solver_error("the plan's " + std::to_string(p.stages.size()) + " stages hold " +
                       std::to_string(p.stages.back().first_layer + p.stages.back().layers) + " layers, but its graph has " +
                       std::to_string(layers));
  std::vector<int> stage_of_unit(static_cast<std::size_t>(layers) + 2, 0);
  for (std::size_t k = 0; k < p.stages.size(); ++k)
    for (int i = 0; i < p.stages[k].layers; ++i) stage_of_unit[static_cast<std::size_t>(p.stages[k].first_layer + i) + 1] = static_cast<int>(k);
  stage_of_unit.back() = static_cast<int>(p.stages.size()) - 1;
  const std::vector<int> unit = detail::unit_of_vertices(d.graph, L);
  std::vector<std::vector<int>> out(boost::num_vertices(d.graph));
  for (vertex_t v = 0; v < out.size(); ++v)
    if (d.graph[v].is_operator()) out[v] = {stage_of_unit[static_cast<std::size_t>(unit[v])]};
  for (vertex_t v = 0; v < out.size(); ++v) {
    if (d.graph[v].is_operator()) continue;
    std::set<int> stages;
    for (auto [e, end] = boost::out_edges(v, d.graph); e != end; ++e) stages.insert(out[boost::target(*e, d.graph)].front());
    out[v].assign(stages.begin(), stages.end());
  }
  return out;
}

/// The last stage that reads operator v's output, where `stage_of` gives every operator's stage
/// (stages_of_vertices): v's own when no later stage does. The boundaries v crosses are those
/// from its stage up to that one.
inline int last_reading_stage(const model_graph& g, const std::vector<std::vector<int>>& stage_of, vertex_t v) {
  int last = stage_of[v].front();
  for (auto [e, end] = boost::out_edges(v, g); e != end; ++e) last = std::max(last, stage_of[boost::target(*e, g)].front());
  return last;
}

/// Per parameter of pipelined plan `d` (by vertex; empty entries for the rest): the stages that
/// use it, ascending (two for an embedding tied to the head). Throws solver_error when the
/// stages' layers do not add up to the graph's.
inline std::vector<std::vector<int>> stages_of_parameters(const plan_document& d) {
  std::vector<std::vector<int>> out = stages_of_vertices(d);
  for (vertex_t v = 0; v < out.size(); ++v)
    if (!d.graph[v].is_parameter()) out[v].clear();
  return out;
}

/// One point-to-point transfer of a pipelined step as it is priced: the piece of a tensor each
/// device of stage `site.operand` sends to the same device of the next stage (site
/// transfer), or the piece of its gradient sent back (transfer_back), once per micro-step.
struct priced_transfer {
  traffic_site site;
  int mesh_axis = 0;       ///< the pipeline axis: numbered after the stage's own axes
  std::int64_t bytes = 0;  ///< one transfer, per device
  int repeats = 1;         ///< per step: every micro-step
};

/// What a pipelined plan `d` (its strategies `plan`, load_plan's) moves between its stages, as
/// price_pipelined prices it: every
/// operator's output read by a later stage crosses each boundary up to its last reader, its
/// piece in the spec the plan produces it in (piece_bytes, as the boundary's transfer time is
/// priced), forward and its gradient back, every micro-step; and every parameter used on
/// several stages (an embedding tied to the head) has its gradient all-reduced over them on the
/// pipeline axis once per step. Graph inputs are read by each stage that uses them, never sent.
struct pipeline_traffic {
  std::vector<priced_transfer> transfers;
  std::vector<collective_use> collectives;  ///< the shared parameters' all-reduces
};

inline pipeline_traffic pipeline_traffic_of(const plan_document& d, const std::vector<strategy>& plan) {
  const std::vector<std::vector<int>> stages = stages_of_vertices(d);
  const model_graph& g = d.graph;
  const int axis = static_cast<int>(d.mesh.ndim());
  const int m = d.pricing.accumulation();
  pipeline_traffic out;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    const std::int64_t bytes = piece_bytes(d.mesh, plan[v].output, g[v]);
    if (g[v].is_parameter() && stages[v].size() > 1) {
      collective_use c;
      c.where = "gradient of " + g[v].name + " on stages " + std::to_string(stages[v].front()) + " and " + std::to_string(stages[v].back());
      c.kind = collective::all_reduce;
      c.mesh_axis = axis;
      c.bytes = piece_bytes(d.mesh, backward_target(plan[v]), g[v]);
      c.seconds = d.pipeline ? d.pipeline->tied_sync_seconds : 0.0;
      c.site = traffic_site::gradient(v);
      out.collectives.push_back(c);
    }
    if (!g[v].is_operator()) continue;
    for (int b = stages[v].front(), last = last_reading_stage(g, stages, v); b < last; ++b) {
      out.transfers.push_back({traffic_site::transfer(v, b), axis, bytes, m});
      if (!detail::is_integer(g[v].type)) out.transfers.push_back({traffic_site::transfer_back(v, b), axis, bytes, m});
    }
  }
  return out;
}

}  // namespace autoshard

#pragma once
/// The auto-sharding pass (Alpa's intra-operator pass, with MASE's option names): one strategy
/// per vertex of a model graph, chosen by the strategy ILP, priced by the graph's cost model,
/// and compared side by side with real baselines priced by the same model.
///   autoshard::autosharding_options o;
///   o.mesh = autoshard::make_cluster_mesh({2, 4}, {.inter_node_bandwidth = 25e9,    // mesh axis 0
///                                                  .intra_node_bandwidth = 300e9});  // the others
///   o.pricing.mode = autoshard::run_mode::training;  // how a step is priced (graph/pricing.hpp)
///   auto r = autoshard::autosharding_analysis_pass(g, o);
///   r.strategies[v];                   // the chosen strategy of vertex v (specs, costs)
///   std::cout << r.report;             // step time, breakdown, memory, collectives, baselines
///
/// algo (plan/algo.hpp):
///   "alpa"              the ILP over every strategy (default)
///   "megatron"          Megatron-LM: on the last mesh axis the block linears are column-parallel
///                       (c_attn, c_fc, query/key/value, intermediate.dense, q/k/v/gate/up_proj) or
///                       row-parallel (c_proj, attention.output.dense, output.dense, o_proj, down_proj),
///                       and the vocabulary's operators as Megatron-LM's (vocab_operators_of): the
///                       word embedding vocab-parallel (its table split on the vocabulary, the
///                       output a partial sum), the output layer column-parallel over the vocabulary
///                       (tied: the same split table), the cross-entropy vocab-parallel, the other
///                       embeddings' tables (positions, token types) whole; a vocabulary that leaves
///                       a rank no rows is refused (megatron_vocab). Every weight is stored as it is
///                       taken, the norms' whole. On the other axes the batch is split and weights
///                       replicated; every other operator takes its cheapest consistent strategy
///                       under that constraint. The rules, operator by operator, are
///                       megatron_layout.hpp's (megatron_tp_rule, megatron_dp_rule), which
///                       export --to megatron refuses a plan by.
///                       Attention heads are split whole: a head count the last axis does not divide
///                       is refused; key/value heads fewer than its ranks are replicated (their
///                       projections whole on every rank, megatron_kv_whole). Sequence parallelism
///                       is all or none, as Megatron-LM's switch: every layer's norms split on the
///                       sequence, or none; both are solved and the faster kept (solve_algo)
///   "data_parallel"     weights replicated, activations split on the batch dim (or replicated)
///   "zero3"             data_parallel's activations, every parameter stored sharded on every
///                       mesh axis (where it splits that finely) and gathered on use (ZeRO-3, FSDP)
///   "fully_replicated"  every tensor whole on every device
/// Each is the same ILP over a restricted strategy set, so alpa's plan is never costlier than a
/// baseline solved to optimality.
///
/// Repeated layers: vertices whose names differ only in the layer index (".h.7." / ".layer.7." /
/// ".layers.7.") and whose strategy lists (and sliding windows) agree are tied to one strategy (tie_layers, default on):
/// the ILP sees one node per class, with summed costs and edges, so an 80-layer model costs about
/// what one layer does. The plan is optimal among plans that treat identical layers identically.
/// With a memory budget a tied class counts all its members live over the union of their
/// intervals (exact for parameters and, in training, for saved activations; conservative for
/// transient inference activations).
#include <algorithm>   // std::max, std::sort, std::all_of, std::any_of
#include <cmath>       // std::abs
#include <cstdint>     // std::int64_t
#include <functional>  // std::function
#include <limits>      // std::numeric_limits
#include <map>         // std::map
#include <memory>      // std::shared_ptr
#include <optional>    // std::optional
#include <ostream>     // std::ostream
#include <span>        // std::span
#include <string>      // std::string
#include <string_view> // std::string_view
#include <unordered_map> // std::unordered_map
#include <utility>     // std::pair, std::move
#include <vector>      // std::vector

#include "../core/cost.hpp"         // price_plan, collective_time
#include "../core/error.hpp"        // solver_error, io_error
#include "../core/layout.hpp"       // whole_on_unit_axes
#include "../core/mesh.hpp"         // device_mesh
#include "../core/parse.hpp"        // to_alpa_string, parse_spec
#include "../core/redistribute.hpp" // plan_redistribute
#include "../graph/model.hpp"       // model_graph
#include "../graph/strategy.hpp"    // enumerate_all_strategies, resharding_costs
#include "../graph/traffic.hpp"     // traffic_site
#include "../graph/validate.hpp"    // validate, topological_order
#include "../graph/pricing.hpp"     // step_pricing
#include "../plan/algo.hpp"         // algo, all_algos
#include "../plan/document.hpp"     // plan_document, read_plan_file, write_plan_file
#include "../solve/ilp.hpp"         // solve_ilp
#include "../graph/resize.hpp"      // with_batch_seq
#include "layers.hpp"               // layer_map, detail::layer_key, add_recompute_variants
#include "megatron_layout.hpp"      // the megatron algo's layout: megatron_tp_rule, megatron_dp_rule, vocab_operators_of
#include "planning_memory.hpp"      // check_planning_memory: a pass too big for the machine refused up front
#include "step_report.hpp"          // parallelism, step_flops, graph_batch

namespace autoshard {

struct collective_use;  // below: one collective the cost model prices

/// Options, named as MASE's autosharding_analysis_pass names them where it has them. The mesh
/// travels whole, with every axis's link: build it from MASE's mesh_shape,
/// inter/intra_node_bandwidth, latencies and communications_backend with make_cluster_mesh
/// (core/mesh.hpp, the one home of the default links), from a calibration file
/// (calibration_result::mesh()), or set each axis's link yourself.
struct autosharding_options {
  device_mesh mesh = make_cluster_mesh({default_mesh_shape.begin(), default_mesh_shape.end()});
  autoshard::algo algo = autoshard::algo::alpa;  ///< see the header comment
  /// How a step is priced: the device, the mode and the training settings, whole.
  step_pricing pricing{};
  bool skip_fully_replicated = false;            ///< alpa: drop an operator's all-replicated strategy
  double time_limit = default_time_limit_s;      ///< seconds per ILP solve
  double mip_rel_gap = 0.0;                      ///< a fraction: 0.01 = 1% (not percent)
  /// Threads of each solve (solve_options::threads: 0 = the cores available; the ILP on one,
  /// the Lagrangian search on the others) and their seed: a large model's plan improves with
  /// time and cores the way a solver-level request's does.
  int threads = 0;
  unsigned seed = 0;
  bool run_checks = false;                       ///< verify the plan; throws solver_error on a failure
  /// With run_checks, also called with the chosen plan (index = vertex) and the collectives
  /// the cost model priced for it (plan_summary::collectives); throws to fail the check.
  /// exec/verify.hpp's numeric_check() runs the plan on real ranks against the unsharded
  /// graph and audits the collectives they issue against the priced ones.
  std::function<void(const model_graph&, const device_mesh&, const std::vector<strategy>&, const std::vector<collective_use>&)>
      numeric_check;
  /// Read the plan from ilp_solution_file instead of solving. It is priced with the links it
  /// was solved with (the file's mesh), which must have the shape of `mesh`.
  bool preload_solution = false;
  std::string ilp_solution_file;                 ///< where the plan file goes (or comes from); "" = nowhere
  /// Bytes per device the plan's tensors may use (the runtime reserve, runtime_reserve_of, is
  /// beside them: the report still says whether the peak plus the reserve fits the device).
  /// default_memory_budget(o) is the tool's default, the device's memory less the reserve.
  std::optional<std::int64_t> memory_budget;
  std::map<std::string, sharding_spec> pinned;   ///< vertex name -> the spec its output must have
  /// megatron: the tensor-parallel size. 0: the last mesh axis's (devices per node); 1: none,
  /// every axis data parallel; a divisor of the last axis's size: that axis split into
  /// (size / tp) data-parallel and tp tensor-parallel ranks on its links.
  int tensor_parallel = 0;
  bool tie_layers = true;
  bool compare_baselines = true;                 ///< also solve the other algos for the report
  std::function<void(const solve_progress&)> on_progress;
  /// The phases before and around the solve, for a progress display on large models: called
  /// with ("strategies", done, total vertices) around enumerating every operator's strategies,
  /// ("pricing", done, total edges) as each edge's resharding costs are priced, and
  /// ("baselines", done, total) as the compared algos are solved. Must not throw.
  std::function<void(const char* phase, std::size_t done, std::size_t total)> on_phase;
};

/// One collective of the plan.
struct collective_use {
  std::string where;     ///< "edge a -> b" or "gradient of w in v"
  collective kind = collective::all_reduce;
  int mesh_axis = 0;
  std::int64_t bytes = 0;  ///< B of the cost formula (per device, padding included)
  double seconds = 0.0;    ///< as charged: of a parameter's gradient sync, its share of the part the backward does not hide
  traffic_site site;       ///< where an executor charges it (the communication audit, exec/audit.hpp)
  /// The part of `bytes` the model charges here: 1/c for a reduction of a Partial gradient
  /// that the producer's c consumer edges share (one reduction per producer), else 1.
  double share = 1.0;
  /// Times it runs per step (`seconds` is all of them, `bytes` one): every micro-step for
  /// what each runs (twice into a fully recomputed layer), once for a gradient sync accumulated
  /// over them and ZeRO's all-gather of the updated weight.
  int repeats = 1;
};

/// One plan, priced.
struct plan_summary {
  autoshard::algo algo = autoshard::algo::alpa;
  bool feasible = true;
  std::string why_not;            ///< when not feasible (the solver_error's message)
  double step_seconds = 0.0;      ///< compute + communication + resharding
  double compute_seconds = 0.0;
  double communication_seconds = 0.0;  ///< operators' own, and parameters' gradient sync in training
  double resharding_seconds = 0.0;     ///< on edges (forward, and the activations' backward in training)
  std::int64_t peak_memory_bytes = 0;  ///< per device, over the live intervals: the plan's tensors
  /// What each rank's process holds beside them on `mesh` (runtime_reserve_of: the CUDA context
  /// and one NCCL communicator per mesh axis of more than one rank).
  runtime_reserve runtime;
  /// The peak and the runtime reserve are within the device's memory (device_model::
  /// memory_bytes). A plan solved under no budget, or a budget above the device's memory less
  /// the reserve, may not fit: the report says so.
  bool fits = true;
  std::vector<int> choice;             ///< strategy index per vertex
  std::vector<collective_use> collectives;
  /// Training: the micro-batching chosen, the layers' recomputation and the plan in the
  /// words people run jobs in (tp, dp, pp, micro-batch, recompute, ZeRO), on `mesh` (the
  /// pass's, or for megatron with a tensor-parallel size below the last axis, that axis split
  /// in two).
  parallelism par;
  std::map<long, recompute_kind> recompute;  ///< per layer index
  device_mesh mesh;
  /// The step's FLOPs, and what they make of the step time on this mesh: TFLOP/s per device
  /// as Megatron-LM counts them (eq. 3) and the model FLOPs utilisation against the peak.
  step_flops flops;
  double tflops_per_device = 0.0;
  double mfu = 0.0;
  /// The search over micro-batchings: one line per one tried ("4 micro-batches of 8: optimal,
  /// 1.52 s, 61.2 GiB"), and for a plan that could not fit the closest miss in words.
  std::vector<std::string> tried;
};

struct autosharding_report {
  plan_summary plan;                   ///< the requested algo
  std::vector<plan_summary> baselines; ///< the other algos, when compare_baselines
  solve_result solver;                 ///< of the requested algo (empty when preloaded)
  std::size_t vertices = 0, edges = 0, tied_classes = 0;
  device_mesh mesh;
  step_pricing pricing;  ///< as priced: whether a plan fits is against its device's memory_bytes, less its runtime reserve
};

struct autosharding_result {
  /// The graph the strategies are for: the pass's, at one micro-step's batch when the plan
  /// runs the global batch in micro-batches (same vertices, names and parameters).
  model_graph graph;
  std::vector<strategy> strategies;  ///< the chosen strategy per vertex (index = vertex)
  autosharding_report report;
};

namespace detail {

/// The pricing a pass can price with: a device of finite, positive FLOP/s, bandwidth and
/// memory, gradient buckets >= 0 and an overlap of "backward" or a fraction in [0, 1];
/// solver_error naming the numbers otherwise.
inline void check_pricing(const step_pricing& p) {
  const device_model& d = p.device;
  if (!(d.peak_flops > 0 && d.peak_flops < 1e30) || !(d.memory_bandwidth > 0 && d.memory_bandwidth < 1e30) || d.memory_bytes <= 0)
    throw solver_error("the device model needs peak_flops and memory_bandwidth finite and > 0 and memory_bytes > 0, got " +
                       fmt_num(d.peak_flops) + " FLOP/s, " + fmt_num(d.memory_bandwidth) + " bytes/s and " +
                       std::to_string(d.memory_bytes) + " bytes");
  if (d.context_bytes < 0 || d.communicator_bytes < 0 || d.pair_communicator_bytes < 0)
    throw solver_error("the device model's runtime figures must be >= 0, got a CUDA context of " + std::to_string(d.context_bytes) +
                       " bytes and communicators of " + std::to_string(d.communicator_bytes) + " and " +
                       std::to_string(d.pair_communicator_bytes) + " bytes");
  const gradient_overlap_model& ov = p.gradient_overlap;
  if (!(p.gradient_bucket_bytes >= 0) || !(ov.backward || (ov.fraction >= 0 && ov.fraction <= 1)))
    throw solver_error("gradient_bucket_bytes must be >= 0 and gradient_overlap \"backward\" or in [0, 1], got " +
                       fmt_num(p.gradient_bucket_bytes) + " and " + (ov.backward ? "backward" : fmt_num(ov.fraction)));
}

/// Everything the pass derives from the graph once: strategies, the full strategy problem.
///
/// Memory over time: inference runs the forward, a tensor live from its operator to its last
/// consumer; a parameter and a key/value cache (kept for the next step) throughout. Training runs the forward (times 0..N-1, topological order) and then the backward
/// (N..2N-1, the reverse order): a parameter is live throughout, a tensor kept for the
/// backward from its operator to its operator's backward. An operator that may recompute its
/// layer fully has a second problem node, its shadow (after the vertices, tied to it by an edge
/// that allows only the same strategy), for the part of that interval from its layer's backward
/// on: a fully recomputed operator holds nothing (its layer output: the checkpoint) until its
/// layer's backward recomputes it, and then holds what it keeps, as an operator that was never
/// recomputed does. So every layer's working set in the backward is counted where it is live.
struct pass_model {
  /// Called with (phase, done, total) as the strategies are enumerated and the edges priced.
  using phase_callback = std::function<void(const char*, std::size_t, std::size_t)>;

  const model_graph& g;
  device_mesh mesh;
  strategy_options sopt;
  layer_map layers;           // the repeated layers, for recomputation
  std::vector<std::vector<strategy>> strategies;
  std::vector<char> gradients;  // gradient_flags(g): whether each vertex has a gradient
  std::vector<edge_t> edges;  // in problem edge order (the graph's edges, then the shadows')
  std::vector<vertex_t> shadow_of;  // the vertex of each problem node after the vertices
  strategy_problem problem;   // one node per vertex, then the shadows; one edge per graph edge, then the shadows'

  /// Whether the edges are priced (price_edges): until then the problem has its nodes only,
  /// their costs in a provisional unit, enough to say what memory a solve could reach.
  enum class edges_when { now, deferred };

  /// `pricing`: how a step is priced (device, mode, training settings). `when`: deferred
  /// leaves the edges to price_edges() (the micro-batch search prices a micro-batching's edges
  /// only when it solves one: one its memory refuses needs its nodes alone).
  pass_model(const model_graph& graph, const device_mesh& m, const step_pricing& pricing,
             std::optional<std::int64_t> memory_budget = std::nullopt, const phase_callback& on_phase = {},
             edges_when when = edges_when::now)
      : g(graph), mesh(m), sopt{pricing} {
    if (mesh.ndim() == 0) throw solver_error("the mesh has no axes");
    check_pricing(sopt.pricing);
    validate(g);
    if (sopt.pricing.mode == run_mode::training)
      for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
        if (g[v].is_kv_cache())
          throw solver_error("vertex " + quoted_text(g[v].name) + " is a key/value cache: a step after one is inference (a decode "
                             "step), which training does not run; plan it in inference mode");
    const auto phase = [&on_phase](const char* name, std::size_t done, std::size_t total) {
      if (on_phase) on_phase(name, done, total);
    };
    phase("strategies", 0, boost::num_vertices(g));
    gradients = detail::gradient_flags(g);
    strategies.resize(boost::num_vertices(g));
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) strategies[v] = enumerate_strategies(g, v, mesh, sopt, gradients);
    layers = map_layers(g);
    add_recompute_variants(g, layers, strategies, sopt.pricing);
    phase("strategies", boost::num_vertices(g), boost::num_vertices(g));
    add_nodes();
    set_node_costs(0.0);
    for (auto [e, end] = boost::edges(g); e != end; ++e) edges.push_back(*e);
    problem.usage_limit = memory_budget;
    if (when == edges_when::now) price_edges(on_phase);
  }
  pass_model(const model_graph& graph, const autosharding_options& o)
      : pass_model(graph, o.mesh, o.pricing, o.memory_budget) {}
  // `g` is a reference: a temporary graph would dangle as soon as the constructor returns.
  pass_model(model_graph&&, const device_mesh&, const step_pricing&, std::optional<std::int64_t> = std::nullopt,
             const phase_callback& = {}, edges_when = edges_when::now) = delete;
  pass_model(model_graph&&, const autosharding_options&) = delete;

  std::size_t size() const { return strategies.size(); }
  bool edges_priced() const { return priced_; }

  /// Which strategies of each vertex a solve may choose (algo_mask's answer).
  using strategy_mask = std::vector<std::vector<char>>;

  /// One edge per graph edge with its resharding costs (a pair that disagrees on its layer's
  /// recomputation forbidden), then each shadow's edge to its vertex; then every cost, node
  /// and edge, in integer units of one cost_unit (the solver works in exact integers). Once.
  /// `only`: the strategies every solve on the model allows (one algo solved alone): the pairs
  /// of two of them are priced, every other pair is forbidden. Megatron's layout allows a few
  /// of a vertex's dozens, and pricing every pair was most of a `--algo megatron` plan's time.
  /// Asked again for strategies `only` did not allow, every pair is priced.
  void price_edges(const phase_callback& on_phase = {}, const strategy_mask* only = nullptr) {
    if (priced_ && (!priced_only_ || (only != nullptr && within(*only, *priced_only_)))) return;
    if (priced_) {  // priced for fewer strategies than a solve allows now: every pair this time
      problem.edges.clear();
      only = nullptr;
    }
    if (only != nullptr && only->size() != strategies.size())
      throw solver_error("price_edges: a strategy mask of " + std::to_string(only->size()) + " vertices for " +
                         std::to_string(strategies.size()));
    static const std::vector<char> all;  // resharding_costs' every strategy
    const auto used = [&](vertex_t v) -> const std::vector<char>& { return only != nullptr ? (*only)[v] : all; };
    std::vector<std::vector<double>> seconds;
    double largest = 0.0;
    const auto note = [&largest](double x) {
      if (x < std::numeric_limits<double>::infinity()) largest = std::max(largest, x);
    };
    const std::size_t edge_count = boost::num_edges(g);
    if (on_phase) on_phase("pricing", 0, edge_count);
    constexpr double forbidden = std::numeric_limits<double>::infinity();
    plan_price_cache prices(mesh);  // the edges share their tensors' shapes and specs
    // The edges of repeated layers are alike (edge_pricing_inputs): each is priced once and its
    // matrix copied to the others (a layer's ties between its operators' recomputation alike too).
    const auto inputs_of = [&](edge_t e) {
      return edge_pricing_inputs(g, e, strategies[boost::source(e, g)], strategies[boost::target(e, g)], sopt, gradients);
    };
    const auto in_one_layer = [&](vertex_t u, vertex_t v) { return layers.layer[u] >= 0 && layers.layer[u] == layers.layer[v]; };
    std::unordered_map<std::uint64_t, std::vector<std::size_t>> priced_alike;  // hash -> the problem edges priced with it
    for (auto [e, end] = boost::edges(g); e != end; ++e) {
      const vertex_t u = boost::source(*e, g), v = boost::target(*e, g);
      const edge_pricing_inputs in = inputs_of(*e);
      std::vector<std::size_t>& bucket = priced_alike[in.hash() ^ std::uint64_t{in_one_layer(u, v)}];
      const std::size_t k = problem.edges.size();
      const auto same = std::find_if(bucket.begin(), bucket.end(), [&](std::size_t x) {
        const edge_t o = edges[x];
        return in_one_layer(boost::source(o, g), boost::target(o, g)) == in_one_layer(u, v) &&
               used(boost::source(o, g)) == used(u) && used(boost::target(o, g)) == used(v) && inputs_of(o).alike(in);
      });
      if (on_phase) on_phase("pricing", k + 1, edge_count);
      problem.edges.push_back({u, v, {}});
      if (same != bucket.end()) {
        seconds.push_back(seconds[*same]);
        continue;
      }
      cost_matrix c = resharding_costs(g, *e, strategies[u], strategies[v], mesh, sopt, gradients, &prices, used(u), used(v));
      for (std::size_t i = 0; i < c.rows; ++i)
        for (std::size_t j = 0; j < c.cols; ++j)
          if (!recompute_consistent(layers, u, v, strategies[u][i], strategies[v][j])) c.values[i * c.cols + j] = forbidden;
      for (double x : c.values) note(x);
      seconds.push_back(std::move(c.values));
      bucket.push_back(k);
    }
    set_node_costs(largest);
    for (std::size_t k = 0; k < seconds.size(); ++k)
      for (double x : seconds[k]) problem.edges[k].costs.push_back(to_cost_units(x, problem.cost_unit));
    const std::size_t n = strategies.size();
    for (std::size_t k = 0; k < shadow_of.size(); ++k) {
      const vertex_t v = shadow_of[k];
      const std::size_t s = strategies[v].size();
      strategy_edge same{v, n + k, std::vector<std::int64_t>(s * s, infinite_cost)};
      for (std::size_t i = 0; i < s; ++i) same.costs[i * s + i] = 0;
      problem.edges.push_back(std::move(same));
    }
    priced_ = true;
    if (only != nullptr) priced_only_ = *only;
    else priced_only_.reset();
  }

  /// A strategy per problem node from one per vertex: a shadow takes its vertex's.
  std::vector<int> node_choice(const std::vector<int>& choice) const {
    std::vector<int> c = choice;
    for (vertex_t v : shadow_of) c.push_back(choice[v]);
    return c;
  }

 private:
  /// One node per vertex: its strategies' memory and its live interval (see the struct's
  /// comment); then the shadows.
  void add_nodes() {
    const std::vector<vertex_t> order = topological_order(g);
    const std::size_t n = boost::num_vertices(g);
    std::vector<std::int64_t> pos(n), last(n);
    for (std::size_t k = 0; k < order.size(); ++k) pos[order[k]] = static_cast<std::int64_t>(k);
    for (vertex_t v = 0; v < n; ++v) {
      last[v] = pos[v];
      for (auto [e, end] = boost::out_edges(v, g); e != end; ++e)
        last[v] = std::max(last[v], pos[boost::target(*e, g)]);
    }
    // Where each layer's forward ends: its backward (and a full recomputation) starts at 2N - end.
    std::map<long, std::int64_t> layer_end;
    for (vertex_t v = 0; v < n; ++v)
      if (layers.layer[v] >= 0) layer_end[layers.layer[v]] = std::max(layer_end[layers.layer[v]], pos[v] + 1);
    const auto N = static_cast<std::int64_t>(n);
    const bool train = sopt.pricing.mode == run_mode::training;
    problem.name = "autosharding";
    problem.nodes.resize(n);
    for (vertex_t v = 0; v < n; ++v) {
      strategy_node& node = problem.nodes[v];
      node.name = g[v].name;
      for (const strategy& s : strategies[v]) node.usages.push_back(s.memory_bytes);
      if (g[v].is_parameter() || g[v].is_kv_cache())  // a cache is kept for the next step
        node.live = {0, train ? 2 * N : N};
      else if (!train)
        node.live = {pos[v], last[v] + 1};
      else
        node.live = {pos[v], 2 * N - pos[v]};  // kept until its operator's backward
      const bool full = std::any_of(strategies[v].begin(), strategies[v].end(),
                                    [](const strategy& s) { return s.recompute == recompute_kind::full; });
      if (!train || !full) continue;
      // The shadow: from the layer's backward on, every variant holds what the plain one keeps.
      const std::int64_t split = 2 * N - layer_end[layers.layer[v]];
      strategy_node shadow;
      shadow.name = g[v].name + " (kept again in its layer's backward)";
      shadow.live = {split, 2 * N - pos[v]};
      for (const strategy& s : strategies[v]) shadow.usages.push_back(s.recomputed_bytes);
      node.live.end = split;
      problem.nodes.push_back(std::move(shadow));
      shadow_of.push_back(v);
    }
  }

  /// The nodes' costs in the unit of the largest finite cost, `edges_largest` or a node's;
  /// the shadows' are 0.
  void set_node_costs(double edges_largest) {
    double largest = edges_largest;
    for (const std::vector<strategy>& ss : strategies)
      for (const strategy& s : ss)
        if (s.seconds() < std::numeric_limits<double>::infinity()) largest = std::max(largest, s.seconds());
    problem.cost_unit = cost_unit_for(largest);
    for (vertex_t v = 0; v < strategies.size(); ++v) {
      problem.nodes[v].costs.clear();
      for (const strategy& s : strategies[v]) problem.nodes[v].costs.push_back(to_cost_units(s.seconds(), problem.cost_unit));
    }
    for (std::size_t k = 0; k < shadow_of.size(); ++k) problem.nodes[strategies.size() + k].costs.assign(strategies[shadow_of[k]].size(), 0);
  }

  bool priced_ = false;
  std::optional<strategy_mask> priced_only_;  // the strategies priced_edges priced the pairs of (none: all)

  /// Whether mask `a` allows nothing `b` does not.
  static bool within(const strategy_mask& a, const strategy_mask& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t v = 0; v < a.size(); ++v) {
      if (a[v].size() != b[v].size()) return false;
      for (std::size_t i = 0; i < a[v].size(); ++i)
        if (a[v][i] && !b[v][i]) return false;
    }
    return true;
  }
};

/// ZeRO-3 stores a parameter sharded on every mesh axis of more than one rank, where the
/// parameter can be split that finely.
inline bool fully_sharded(const device_mesh& m, const strategy& s) {
  if (s.zero_stage > 0) return false;
  for (std::size_t a = 0; a < m.ndim(); ++a)
    if (m.size(a) > 1 && !s.output[a].is_shard()) return false;
  return true;
}

/// The recomputation kinds algo `a` lets a layer take under `policy`: the policy's, and when
/// the planner chooses, any for the ILP and selective for megatron (its baseline's definition).
constexpr unsigned algo_recompute_kinds(algo a, recompute_policy policy) noexcept {
  if (policy == recompute_policy::choose && a == algo::megatron) return recompute_kinds_of(recompute_policy::selective);
  return recompute_kinds_of(policy);
}

/// The cheapest of `kinds` (recomputation only ever adds time): the one kind a solve without
/// a memory budget needs to consider.
constexpr unsigned cheapest_recompute(unsigned kinds) noexcept { return kinds & (~kinds + 1u); }

/// What the masks of one solve allow beyond the algo: the recomputation kinds, and a fixed
/// number of ways the batch is split (a micro-batch given per data-parallel rank).
struct solve_request {
  algo a = algo::alpa;
  unsigned recompute = 0b111;  ///< recompute_kind bits
  bool budget = true;          ///< the memory budget applies
  /// A limit of the solve's own on the memory per device at each time point, in place of the
  /// budget (a pipeline's stage plan solved again so that its stages fit: price_pipelined).
  std::optional<std::int64_t> usage_limit;
  int batch_shards = 0;        ///< > 0: every batch input splits its dim 0 exactly this many ways
  int tp_axis = -1;            ///< megatron: its tensor-parallel mesh axis (-1: none, every axis data parallel)
  /// megatron: every layer's norms split on the sequence on tp_axis (true: Megatron-LM's
  /// --sequence-parallel) or none of them (false); unset: solve_algo solves both and keeps the faster.
  std::optional<bool> sequence_parallel;
  /// Only plans faster than this (seconds) matter: the fastest the caller already holds. The
  /// solve stops once it proves none is (solve_options::cutoff; cutoff_of).
  double faster_than = std::numeric_limits<double>::infinity();
};

/// Whether strategy `s` holds every operand and its output whole on every device.
inline bool all_replicated(const strategy& s) {
  return s.output.is_replicated() && std::all_of(s.inputs.begin(), s.inputs.end(), [](const sharding_spec& in) { return in.is_replicated(); });
}

/// Whether `rq.a` allows strategy `s` of vertex `v` of operands `ops` (`skip_replicated`: alpa
/// drops the all-replicated strategies, v having others; `can_shard_fully`: v is
/// a parameter with a fully_sharded strategy; `zero1`: v offers a ZeRO-1 variant of s's
/// layout, which megatron's distributed optimizer takes; `batch`: the graph's, graph_batch;
/// `kv_whole`, `vocab`: megatron's key/value projections kept whole and vocabulary operators,
/// megatron_kv_whole and megatron_vocab).
inline bool allows(const solve_request& rq, const pass_model& pm, vertex_t v, const std::vector<vertex_t>& ops,
                   const strategy& s, bool skip_replicated, bool can_shard_fully, bool zero1, std::int64_t batch,
                   bool kv_whole, const vocab_operators& vocab) {
  const model_graph& g = pm.g;
  const std::size_t axes = pm.mesh.ndim();
  if (!recompute_allowed(g, pm.layers, v, s, rq.recompute, pm.sopt.pricing)) return false;
  // A micro-batch given per data-parallel rank: the batch inputs and the layers' linears (what
  // the report's dp is read off) split the batch exactly that many ways.
  const bool batch_tensor = g[v].shape.rank >= 1 && g[v].shape[0] == batch;
  if (rq.batch_shards > 0 && batch_tensor && (g[v].is_fed_input() || (g[v].kind == op_kind::linear && pm.layers.layer[v] >= 0)) &&
      s.output.shard_count(pm.mesh, 0) != rq.batch_shards)
    return false;
  const bool all_rep = all_replicated(s);
  const auto data_parallel_on = [&](int skip_axis, int zero_stage) {
    bool ok = s.zero_stage == zero_stage;
    for (std::size_t x = 0; x < axes && ok; ++x)
      if (static_cast<int>(x) != skip_axis) ok = data_parallel_axis(g, v, ops, s, x);
    return ok;
  };
  switch (rq.a) {
    case algo::alpa: return !(skip_replicated && g[v].is_operator() && all_rep);
    case algo::fully_replicated: return all_rep && s.zero_stage == 0;
    case algo::data_parallel: return data_parallel_on(-1, 0);
    case algo::zero3: return can_shard_fully ? fully_sharded(pm.mesh, s) : data_parallel_on(-1, 0);
    case algo::megatron: {
      // Megatron-LM's layout, operator by operator (megatron_layout.hpp): data parallel on every
      // axis but the tensor-parallel one, each batch activation split over the data-parallel
      // ranks (the search keeps only micro-steps whose batch divides among them), and on the
      // tensor-parallel axis megatron_tp_rule's layout; the distributed optimizer where offered.
      if (s.zero_stage != (zero1 ? 1 : 0)) return false;
      for (std::size_t x = 0; x < axes; ++x)
        if (static_cast<int>(x) != rq.tp_axis && megatron_dp_rule(g, v, ops, s, x, pm.mesh.size(x), batch)) return false;
      if (rq.tp_axis < 0) return true;
      const auto tp = static_cast<std::size_t>(rq.tp_axis);
      if (rq.sequence_parallel && is_layer_norm(g, pm.layers, v) && runs_sequence_parallel(s, tp) != *rq.sequence_parallel)
        return false;
      return megatron_tp_rule(g, v, ops, s, tp, pm.mesh.size(tp), kv_whole, vocab, batch) == nullptr;
    }
  }
  throw solver_error("algo must be " + algo_names() + ", got " + std::to_string(static_cast<int>(rq.a)));
}

/// Which strategies a solve allows, per vertex.
inline std::vector<std::vector<char>> algo_mask(const pass_model& pm, const solve_request& rq, bool skip_replicated) {
  std::vector<std::vector<char>> allow(pm.size());
  const std::int64_t batch = graph_batch(pm.g);
  const std::vector<char> kv_whole = rq.a == algo::megatron ? megatron_kv_whole(pm.g, pm.mesh, rq.tp_axis) : std::vector<char>(pm.size(), 0);
  const vocab_operators vocab = rq.a == algo::megatron ? megatron_vocab(pm.g, pm.mesh, rq.tp_axis) : vocab_operators{};
  for (vertex_t v = 0; v < pm.size(); ++v) {
    const std::vector<strategy>& ss = pm.strategies[v];
    const bool can_shard_fully = pm.g[v].is_parameter() && std::any_of(ss.begin(), ss.end(), [&](const strategy& s) {
                                   return fully_sharded(pm.mesh, s);
                                 });
    const std::vector<vertex_t> ops = operands(pm.g, v);
    // skip_fully_replicated drops an operator's whole strategies only where it has others (an
    // operator that cannot split, or any on a mesh of one device, keeps them).
    const bool skip = skip_replicated && std::any_of(ss.begin(), ss.end(), [](const strategy& s) { return !all_replicated(s); });
    // Megatron-LM's distributed optimizer shards over the data-parallel ranks only: a ZeRO-1
    // variant that shards over the tensor-parallel axis too (a weight whole on it: a norm's,
    // a replicated key/value projection's) is not its layout, and such a weight keeps it all.
    const auto dp_only = [&](const strategy& z) { return megatron_zero1_rule(z, rq.tp_axis) == nullptr; };
    std::vector<const strategy*> dp_zero1;  // the ZeRO-1 variants megatron's optimizer may take (a few of the strategies)
    for (const strategy& z : ss)
      if (z.zero_stage == 1 && dp_only(z)) dp_zero1.push_back(&z);
    for (const strategy& s : ss) {
      const bool zero1 = std::any_of(dp_zero1.begin(), dp_zero1.end(), [&](const strategy* z) { return z->output == s.output; });
      allow[v].push_back((s.zero_stage != 1 || rq.a != algo::megatron || dp_only(s)) &&
                                 allows(rq, pm, v, ops, s, skip, can_shard_fully, zero1, batch, kv_whole[v] != 0, vocab)
                             ? 1
                             : 0);
    }
  }
  return allow;
}

/// Tied classes: vertex -> class id; classes group vertices that differ only in the layer index
/// and have identical strategy lists and sliding windows.
inline std::vector<std::size_t> layer_classes(const pass_model& pm, bool tie, std::size_t& count) {
  std::vector<std::size_t> cls(pm.problem.nodes.size());
  std::vector<std::string> keys(pm.size());
  std::map<std::string, std::size_t> ids;
  for (vertex_t v = 0; v < pm.size(); ++v) {
    const node& nd = pm.g[v];
    std::string key = tie ? layer_key(nd.name) : nd.name;
    if (key == nd.name) key += "\x01" + std::to_string(v);  // not in a repeated layer: its own class
    key += "\x02" + std::string(to_string(nd.kind)) + to_string(nd.shape);
    // Layers alike but for their attention's sliding window (Qwen2's full layers before
    // max_window_layers, sliding after) price their cores otherwise: those are not tied.
    if (nd.attrs.window != 0) key += "\x05" + std::to_string(nd.attrs.window);
    for (const strategy& s : pm.strategies[v]) key += "\x03" + s.name;
    cls[v] = ids.try_emplace(key, ids.size()).first->second;
    keys[v] = std::move(key);
  }
  // A shadow is tied as its vertex is (a class of the shadows of one class's members).
  for (std::size_t k = 0; k < pm.shadow_of.size(); ++k)
    cls[pm.size() + k] = ids.try_emplace(keys[pm.shadow_of[k]] + "\x04shadow", ids.size()).first->second;
  count = ids.size();
  return cls;
}

/// The problem over classes: summed costs, edges between classes (self-loops inside). Memory is
/// counted exactly: the members of a class take the same strategy and have the same usages, so
/// a class's node holds the usage of the members live when its first member is, and every
/// other live interval of its members becomes a shadow node (after the classes) with those
/// usages, no cost and an edge that allows only the class's own strategy: the solver's
/// reductions fold it back into the class as one more live part. Summing every member over the
/// hull of their intervals instead counted 32 inference layers' activations as live at once
/// (llama-7b on 1x8: a smallest budget of 7.26 GiB for plans that peak at 2.2 GiB).
/// `edges`: the edges between `full`'s nodes (full.edges in the overload below; the pass's
/// restricted problems leave theirs in pass_model::problem, which a restriction never changes).
inline strategy_problem quotient(const strategy_problem& full, std::span<const strategy_edge> edges, const std::vector<std::size_t>& cls,
                                 std::size_t count) {
  strategy_problem q;
  q.name = full.name + " (tied layers)";
  q.usage_limit = full.usage_limit;
  q.cost_unit = full.cost_unit;
  q.nodes.resize(count);
  std::vector<char> seen(count, 0);
  // Per class: its live intervals (the node's own first), each with the members' summed usage.
  std::vector<std::vector<std::pair<live_interval, std::vector<std::int64_t>>>> parts(count);
  for (std::size_t v = 0; v < full.nodes.size(); ++v) {
    strategy_node& n = q.nodes[cls[v]];
    const strategy_node& f = full.nodes[v];
    auto& ps = parts[cls[v]];
    if (!seen[cls[v]]) {
      n = f;
      seen[cls[v]] = 1;
      ps.push_back({f.live, f.usages});
      continue;
    }
    n.name += "," + f.name;
    for (std::size_t i = 0; i < n.costs.size(); ++i) n.costs[i] = add_costs(n.costs[i], f.costs[i]);
    if (f.live.empty()) continue;
    auto same = std::find_if(ps.begin(), ps.end(), [&](const auto& pt) { return pt.first == f.live; });
    if (same == ps.end()) {
      ps.push_back({f.live, f.usages});
    } else {
      for (std::size_t i = 0; i < f.usages.size(); ++i) same->second[i] += f.usages[i];
    }
  }
  for (const strategy_edge& e : edges) q.edges.push_back({cls[e.from], cls[e.to], e.costs});
  for (std::size_t c = 0; c < count; ++c) {
    q.nodes[c].usages = parts[c].front().second;
    const std::size_t k = q.nodes[c].costs.size();
    for (std::size_t p = 1; p < parts[c].size(); ++p) {
      // q.nodes grows below: index the class, never hold a reference across the push_back.
      const strategy_node& n = q.nodes[c];
      strategy_node shadow;
      shadow.name = n.name.substr(0, n.name.find(',')) + " (memory of a tied layer)";
      shadow.live = parts[c][p].first;
      shadow.usages = parts[c][p].second;
      for (std::size_t i = 0; i < k; ++i) shadow.costs.push_back(is_forbidden(n.costs[i]) ? infinite_cost : 0);
      strategy_edge same{c, q.nodes.size(), std::vector<std::int64_t>(k * k, infinite_cost)};
      for (std::size_t i = 0; i < k; ++i) same.costs[i * k + i] = 0;
      q.nodes.push_back(std::move(shadow));
      q.edges.push_back(std::move(same));
    }
  }
  return q;
}
inline strategy_problem quotient(const strategy_problem& full, const std::vector<std::size_t>& cls, std::size_t count) {
  return quotient(full, full.edges, cls, count);
}

/// The cost of every edge under `choice`, as the ILP has it.
inline edge_costs edge_cost_of(const pass_model& pm, edge_t e, const std::vector<int>& choice) {
  const model_graph& g = pm.g;
  const vertex_t u = boost::source(e, g), v = boost::target(e, g);
  const bool grad_flows = pm.sopt.pricing.mode == run_mode::training && pm.gradients[u];
  return price_edge(g, e, pm.strategies[u][static_cast<std::size_t>(choice[u])],
                    pm.strategies[v][static_cast<std::size_t>(choice[v])], pm.mesh, grad_flows,
                    backward_pricing_of(g, e, pm.sopt));
}

/// Whether the gradient parameter edge `e` hands its parameter under `choice` is synced once per
/// step (accumulated over the micro-steps) rather than at every micro-step (syncs_once_per_step;
/// an edge that hands no gradient: once).
inline bool gradient_syncs_once(const pass_model& pm, edge_t e, const std::vector<int>& choice) {
  const model_graph& g = pm.g;
  const vertex_t u = boost::source(e, g), v = boost::target(e, g);
  const strategy& su = pm.strategies[u][static_cast<std::size_t>(choice[u])];
  const strategy& sv = pm.strategies[v][static_cast<std::size_t>(choice[v])];
  const auto operand = static_cast<std::size_t>(g[e].operand);
  return operand >= sv.grads.size() || syncs_once_per_step(su, backward_target(su), sv.grads[operand]);
}

/// The collectives an operator's chosen strategy makes itself, into `s`: a vocabulary-parallel
/// loss's three row statistics per axis splitting the vocabulary, and a ZeRO weight's all-gather.
inline void operator_collectives(const pass_model& pm, vertex_t v, const strategy& st, int steps, plan_summary& s) {
  const model_graph& g = pm.g;
  if (g[v].kind == op_kind::cross_entropy) {  // a vocab-parallel loss: three row statistics per axis splitting the vocabulary
    const std::vector<vertex_t> ops = operands(g, v);
    const int vdim = static_cast<int>(g[ops[0]].shape.rank) - 1;
    const std::int64_t b = max_local_shape(pm.mesh, st.inputs[1], g[ops[1]].shape).numel() * 4;
    for (std::size_t a = 0; a < pm.mesh.ndim(); ++a)
      if (st.inputs[0][a].is_shard(vdim) && pm.mesh.size(a) > 1)
        for (const char* what : {"row max", "row sum of exponentials", "target logit"})
          s.collectives.push_back({std::string(what) + " of " + g[v].name, collective::all_reduce, static_cast<int>(a), b,
                                   steps * collective_time(collective::all_reduce, pm.mesh.link(a), pm.mesh.size(a), static_cast<double>(b)),
                                   traffic_site::op(v), 1.0, steps});
  }
  if (st.zero_stage > 0)  // the all-gather of the updated weight
    for (const priced_step& p : price_plan(pm.mesh, plan_redistribute(pm.mesh, st.gradient_spec, st.output, g[v].shape), g[v].shape, g[v].type)) {
      const double sec = bucketed_seconds(pm.mesh, p, pm.sopt.pricing.gradient_bucket_bytes);
      if (sec > 0.0)
        s.collectives.push_back({"ZeRO-" + std::to_string(st.zero_stage) + " all-gather of " + g[v].name, p.step.kind,
                                 p.step.mesh_axis, p.bytes, sec, traffic_site::gradient(v)});
    }
}

/// An edge's resharding and gradient traffic at `choice`, into `s`: its seconds, and each
/// collective of its forward plan (and re-gather), and of its backward or gradient sync.
inline void edge_collectives(const pass_model& pm, edge_t e, const std::vector<int>& choice, int steps, plan_summary& s) {
  const model_graph& g = pm.g;
  const vertex_t u = boost::source(e, g), v = boost::target(e, g);
  const strategy& su = pm.strategies[u][static_cast<std::size_t>(choice[u])];
  const strategy& sv = pm.strategies[v][static_cast<std::size_t>(choice[v])];
  const auto operand = static_cast<std::size_t>(g[e].operand);
  const edge_costs c = edge_cost_of(pm, e, choice);
  s.resharding_seconds += c.forward;
  if (g[u].is_parameter()) s.communication_seconds += c.backward + c.regather;  // gradient sync, re-gather
  else s.resharding_seconds += c.backward;
  if (c.forward > 0.0 && !std::isinf(c.forward)) {
    const plan_cost pc = price_plan(pm.mesh, plan_redistribute(pm.mesh, su.output, settle_target(su.output, sv.inputs[operand]), g[u].shape),
                                    g[u].shape, g[u].type);
    // Every micro-step, twice into a fully recomputed layer; the re-gather happens in the
    // backward: the gradient's site (the forward audit leaves it out).
    const int again = sv.recompute == recompute_kind::full && !g[u].is_parameter() ? 2 : 1;
    for (int k = 0; k < (c.regather > 0.0 ? 2 : 1); ++k)
      for (const priced_step& st : pc)
        if (is_communication(st.step.kind)) {
          const int times = steps * (k ? 1 : again);
          s.collectives.push_back({(k ? "re-gather for the backward: edge " : "edge ") + g[u].name + " -> " + g[v].name,
                                   st.step.kind, st.step.mesh_axis, st.bytes, times * st.seconds,
                                   k ? traffic_site::gradient(u) : traffic_site::edge(v, operand), 1.0, times});
        }
  }
  // A parameter's gradient sync is listed whole (the audit counts its bytes), each step
  // charged its share of the part the backward does not hide.
  const double unhidden = g[u].is_parameter() ? c.sync : c.backward;
  if (unhidden > 0.0) {
    const double exposed = c.backward / unhidden;
    // Activations' backward every micro-step; a parameter's sync once, or every micro-step.
    const int times = g[u].is_parameter() && gradient_syncs_once(pm, e, choice) ? 1 : steps;
    const backward_pricing bp = backward_pricing_of(g, e, pm.sopt);
    const plan_cost pc = price_plan(pm.mesh, plan_redistribute(pm.mesh, sv.grads[operand], backward_target(su), g[u].shape),
                                    g[u].shape, g[u].type);
    const std::string where = g[u].is_parameter() ? "gradient of " + g[u].name + " in " + g[v].name
                                                  : "backward of edge " + g[u].name + " -> " + g[v].name;
    const std::array<bool, redist_plan::capacity> red = reduction_steps(pc);
    for (std::size_t k = 0; k < pc.size(); ++k) {
      const priced_step& st = pc[k];
      const double sec = backward_step_seconds(pm.mesh, st, bp, red[k]);
      if (sec > 0.0)
        s.collectives.push_back({where, st.step.kind, st.step.mesh_axis, st.bytes, times * sec * exposed, traffic_site::gradient(u),
                                 red[k] && bp.consumers > 1 ? 1.0 / bp.consumers : 1.0, times});
    }
  }
}

/// Price a full choice from scratch: breakdown, peak memory, collectives.
inline plan_summary summarize(const pass_model& pm, algo a, std::vector<int> choice) {
  plan_summary s;
  s.algo = a;
  const model_graph& g = pm.g;
  const int steps = pm.sopt.pricing.mode == run_mode::training ? pm.sopt.pricing.accumulation() : 1;
  for (vertex_t v = 0; v < pm.size(); ++v) {
    const strategy& st = pm.strategies[v][static_cast<std::size_t>(choice[v])];
    s.compute_seconds += st.compute_seconds;
    s.communication_seconds += st.comm_seconds;
    operator_collectives(pm, v, st, steps, s);
  }
  for (edge_t e : pm.edges) edge_collectives(pm, e, choice, steps, s);
  s.step_seconds = s.compute_seconds + s.communication_seconds + s.resharding_seconds;
  s.peak_memory_bytes = pm.problem.peak_usage(pm.node_choice(choice)).bytes;
  s.runtime = runtime_reserve_of(pm.sopt.pricing.device, pm.mesh);
  s.fits = s.runtime.fits(s.peak_memory_bytes, pm.sopt.pricing.device);
  s.mesh = pm.mesh;
  std::vector<const strategy*> chosen;
  for (vertex_t v = 0; v < pm.size(); ++v) chosen.push_back(&pm.strategies[v][static_cast<std::size_t>(choice[v])]);
  s.recompute = layer_recomputation(pm.layers, chosen);
  s.par = parallelism_of(g, pm.mesh, chosen, steps, pm.layers);
  s.flops = count_step_flops(g, steps, pm.layers);
  const double devices = pm.mesh.num_ranks();
  if (s.step_seconds > 0 && pm.sopt.pricing.mode == run_mode::training) {
    s.tflops_per_device = s.flops.megatron / (s.step_seconds * devices) / 1e12;
    s.mfu = s.flops.model / (s.step_seconds * devices * pm.sopt.pricing.device.peak_flops);
  }
  s.choice = std::move(choice);
  return s;
}

inline void check_plan(const pass_model& pm, const plan_summary& s, double solver_objective) {
  const model_graph& g = pm.g;
  for (vertex_t v = 0; v < pm.size(); ++v) {
    const strategy& st = pm.strategies[v][static_cast<std::size_t>(s.choice[v])];
    const std::vector<vertex_t> ops = operands(g, v);
    if (st.inputs.size() != ops.size())
      throw solver_error("check: " + quoted_text(g[v].name) + " strategy " + st.name + " has " + std::to_string(st.inputs.size()) +
                         " operand specs for " + std::to_string(ops.size()) + " operands");
    check_spec(st.output, pm.mesh, g[v].shape, "check: output of " + quoted_text(g[v].name));
    for (std::size_t i = 0; i < ops.size(); ++i)
      check_spec(st.inputs[i], pm.mesh, g[ops[i]].shape, "check: operand " + std::to_string(i) + " of " + quoted_text(g[v].name));
  }
  double total = 0.0;
  for (vertex_t v = 0; v < pm.size(); ++v) total += pm.strategies[v][static_cast<std::size_t>(s.choice[v])].seconds();
  for (std::size_t k = 0; k < pm.edges.size(); ++k) {
    const edge_t e = pm.edges[k];
    const vertex_t u = boost::source(e, g), v = boost::target(e, g);
    const sharding_spec& from = pm.strategies[u][static_cast<std::size_t>(s.choice[u])].output;
    const sharding_spec& to =
        pm.strategies[v][static_cast<std::size_t>(s.choice[v])].inputs[static_cast<std::size_t>(g[e].operand)];
    const double sec = edge_cost_of(pm, e, s.choice).total();
    if (!(sec < infinite_cost))
      throw solver_error("check: edge " + quoted_text(g[u].name) + " -> " + quoted_text(g[v].name) + ": " + to_alpa_string(from) + " cannot become " +
                         to_alpa_string(to));
    total += sec;
  }
  const double tol = 1e-9 * std::max(1.0, std::abs(total)) + 1e-12;
  // The solver's total is in integer cost units: each of its terms rounded by up to half a unit.
  const double rounding = pm.problem.cost_unit * static_cast<double>(pm.problem.nodes.size() + pm.problem.edges.size());
  if (std::abs(total - s.step_seconds) > tol ||
      std::abs(total - solver_objective) > 1e-6 * std::max(1e-9, std::abs(total)) + rounding)
    throw solver_error("check: the plan re-priced from scratch costs " + fmt_num(total) + " s but the solver reported " +
                       fmt_num(solver_objective) + " s");
  if (pm.problem.usage_limit && s.peak_memory_bytes > *pm.problem.usage_limit)
    throw solver_error("check: peak memory " + std::to_string(s.peak_memory_bytes) + " bytes exceeds the budget " +
                       std::to_string(*pm.problem.usage_limit));
}

/// The problem one solve sees: `pm.problem` restricted to what `rq` and the pins allow, the
/// budget dropped unless it applies, tied into classes (`cls`: problem node -> class).
/// A restriction changes node costs only: the untied problem's edges are the first
/// `untied_edges` of pm.problem's, not copied (an edge matrix is every pair of two vertices'
/// strategies: most of a model's problem).
struct restricted_problem {
  strategy_problem q;       ///< tied; without pm.problem's edges when restricted for its memory alone
  strategy_problem untied;  ///< the same restricted problem before tying (one node per vertex, then the shadows), no edges
  std::size_t untied_edges = 0;
  std::vector<std::size_t> cls;
  std::size_t classes = 0;
};

/// What restrict_problem builds: the problem to solve, or only its nodes (what min_peak_usage
/// reads: a budget's check before a solve).
enum class restricted_for { solving, memory };

inline restricted_problem restrict_problem(const pass_model& pm, const autosharding_options& o, const solve_request& rq,
                                           restricted_for what = restricted_for::solving) {
  const algo a = rq.a;
  const std::vector<std::vector<char>> allow = algo_mask(pm, rq, o.skip_fully_replicated);
  strategy_problem p;
  p.name = pm.problem.name;
  p.nodes = pm.problem.nodes;
  p.usage_limit = pm.problem.usage_limit;
  p.cost_unit = pm.problem.cost_unit;
  if (!rq.budget) p.usage_limit.reset();
  if (rq.usage_limit) p.usage_limit = rq.usage_limit;
  for (vertex_t v = 0; v < pm.size(); ++v) {
    for (std::size_t i = 0; i < allow[v].size(); ++i)
      if (!allow[v][i]) p.nodes[v].costs[i] = infinite_cost;
    if (std::find(allow[v].begin(), allow[v].end(), 1) == allow[v].end())
      throw solver_error(std::string(to_string(a)) + ": vertex " + quoted_text(pm.g[v].name) + " has no strategy this algo allows on mesh " +
                         to_string(pm.mesh));
  }
  for (const auto& [name, spec] : o.pinned) {
    const auto v = find_vertex(pm.g, name);
    if (!v) throw solver_error("pinned tensor " + quoted_text(name) + " is not a vertex of the graph");
    bool any = false;
    const sharding_spec want = whole_on_unit_axes(pm.mesh, spec);  // a one-rank axis offers only Replicate
    for (std::size_t i = 0; i < pm.strategies[*v].size(); ++i) {
      if (!(pm.strategies[*v][i].output == want)) p.nodes[*v].costs[i] = infinite_cost;
      else any = any || p.nodes[*v].costs[i] < infinite_cost;
    }
    if (!any)
      throw solver_error("pinned tensor " + quoted_text(name) + ": no " + std::string(to_string(a)) + " strategy outputs " + to_alpa_string(spec) +
                         " for shape " + to_string(pm.g[*v].shape) + " on mesh " + to_string(pm.mesh));
  }
  // A shadow allows what its vertex does (so the least memory below is what the solve allows).
  for (std::size_t k = 0; k < pm.shadow_of.size(); ++k) {
    const strategy_node& vertex = p.nodes[pm.shadow_of[k]];
    strategy_node& shadow = p.nodes[pm.size() + k];
    for (std::size_t i = 0; i < shadow.costs.size(); ++i) shadow.costs[i] = is_forbidden(vertex.costs[i]) ? infinite_cost : 0;
  }
  restricted_problem r;
  r.cls = layer_classes(pm, o.tie_layers, r.classes);
  r.untied_edges = pm.problem.edges.size();
  if (!pm.shadow_of.empty() && !has_kind(rq.recompute, recompute_kind::full)) {
    // Nothing recomputes fully: each vertex holds what it keeps throughout, its shadow's part
    // too, and the shadows (the last nodes and edges, and the last classes) go.
    const std::size_t n = pm.size();
    for (std::size_t k = 0; k < pm.shadow_of.size(); ++k) p.nodes[pm.shadow_of[k]].live.end = p.nodes[n + k].live.end;
    p.nodes.resize(n);
    r.untied_edges = std::min(r.untied_edges, pm.edges.size());
    r.cls.resize(n);
    r.classes = 0;
    for (std::size_t c : r.cls) r.classes = std::max(r.classes, c + 1);
  }
  const std::span<const strategy_edge> edges(pm.problem.edges.data(), what == restricted_for::solving ? r.untied_edges : 0);
  r.q = quotient(p, edges, r.cls, r.classes);
  r.untied = std::move(p);
  return r;
}

/// Each parameter and fed input of `choice` stored as its consumers use it where that costs
/// the same: the strategy of least memory among those `p` (restricted_problem::untied: its node
/// costs; the edges are pm.problem's) allows whose node cost plus edges to the consumers' chosen
/// strategies is exactly the chosen one's,
/// in the solver's integer units. The ILP prices time and only bounds memory, so between
/// storing a weight whole and slicing it locally for a consumer that reads a shard (free), or
/// storing the shard, it saw no difference: LLaMA-70B's inference plan on 1x8 held its
/// down_proj, up_proj and v_proj weights whole on every rank (78 GiB where 16 GiB do at the
/// same step time). A source has no operand and no shadow, so its cost is its node's and its
/// out-edges'; the objective is unchanged and the peak can only fall.
inline void store_as_used(const pass_model& pm, const strategy_problem& p, std::vector<int>& choice) {
  std::vector<std::vector<std::size_t>> out(pm.size());
  const std::vector<strategy_edge>& edges = pm.problem.edges;  // p's: a restriction changes node costs only
  for (std::size_t k = 0; k < pm.edges.size() && k < edges.size(); ++k)
    if (edges[k].from < pm.size()) out[edges[k].from].push_back(k);
  for (vertex_t v = 0; v < pm.size(); ++v) {
    if (!(pm.g[v].is_parameter() || pm.g[v].is_fed_input()) || out[v].empty()) continue;
    const strategy_node& nd = p.nodes[v];
    const auto cost = [&](std::size_t i) {
      std::int64_t c = nd.costs[i];
      for (std::size_t k : out[v]) {
        const strategy_edge& e = edges[k];
        const std::size_t cols = p.nodes[e.to].costs.size();
        c = add_costs(c, e.costs[i * cols + static_cast<std::size_t>(choice[e.to])]);
      }
      return c;
    };
    auto best = static_cast<std::size_t>(choice[v]);
    const std::int64_t chosen = cost(best);
    for (std::size_t i = 0; i < nd.costs.size(); ++i)
      if (nd.usages[i] < nd.usages[best] && !is_forbidden(nd.costs[i]) && cost(i) == chosen) best = i;
    choice[v] = static_cast<int>(best);
  }
}

/// Seconds that rounding every node's and edge's cost of `pm` to a whole cost unit can hide:
/// a plan's step time and its cost in units times the unit differ by at most this.
inline double rounding_seconds(const pass_model& pm) {
  return pm.problem.cost_unit * static_cast<double>(pm.problem.nodes.size() + pm.problem.edges.size());
}

/// The least step time every plan of a solve's space takes, as far as the solve proved it: the
/// found plan's own time when the solve proved it optimal, else the solver's proven bound less
/// the rounding.
inline double proven_floor(const pass_model& pm, const plan_summary& s, const solve_result& r) {
  if (r.status == solve_status::optimal) return s.step_seconds;
  return std::max(0.0, r.bound_value() - rounding_seconds(pm));
}

/// The cutoff (problem `q`'s units) at which a solve has proven that no plan is faster than
/// `seconds`: a bound that high leaves a proven_floor of `seconds` or more. Empty for none.
inline std::optional<std::int64_t> cutoff_of(const pass_model& pm, const strategy_problem& q, double seconds) {
  if (!std::isfinite(seconds) || !(q.cost_unit > 0.0)) return std::nullopt;
  const double units = std::ceil((seconds + rounding_seconds(pm)) / q.cost_unit);
  if (!(units < 9.0e18)) return std::nullopt;
  return static_cast<std::int64_t>(units);
}

/// `kept` (plan `s`) is the fastest plan found over several solves, each over a part of one space;
/// another part was proven only to take at least `floor` seconds. Unless that is no faster than
/// `s`, `kept` is no longer proven optimal over the whole space: it becomes feasible, its bound
/// at most `floor` (in its cost units, rounded down) and its gap what follows.
inline void weaken_by(solve_result& kept, const plan_summary& s, double floor) {
  if (!(floor < s.step_seconds)) return;
  const double units = std::floor(std::max(0.0, floor) / kept.cost_unit);
  if (units < static_cast<double>(kept.bound)) kept.bound = static_cast<std::int64_t>(units);
  kept.status = solve_status::feasible;
  kept.gap = kept.objective > 0 ? static_cast<double>(kept.objective - kept.bound) / static_cast<double>(kept.objective) : 0.0;
}

/// The solver proves its answer optimal in whole cost units, each of a plan's node and edge
/// costs rounded to one (cost_unit_for: the largest finite cost is 2^40 units). Where the costs
/// span more than that (a link of a byte a second beside microseconds of compute: edges of
/// 10^5 s, operators of 10^-6 s), the rounding hides whole plans: `plan --inter-bw 1` on 2x4
/// was "optimal" at 4.97 ms beside a plan of 3.64 ms it had rounded to the same units. A
/// result whose rounding, rounding_seconds(pm), could hide more than a millionth of its step
/// is feasible, not optimal, its bound what the rounding leaves proven (weaken_by).
inline constexpr double rounding_tolerance = 1e-6;
inline void unprove_rounding(const pass_model& pm, const plan_summary& s, solve_result& res) {
  const double hidden = rounding_seconds(pm);
  if (!(hidden > rounding_tolerance * s.step_seconds)) return;
  const solve_status was = res.status;
  weaken_by(res, s, std::max(0.0, res.bound_value() - hidden));
  if (was == solve_status::optimal && res.status != was) {
    char why[240];
    std::snprintf(why, sizeof why, "not proven optimal: the ILP's answer is optimal in whole cost units of %.3g s, and its %zu rounded terms may hide %.3g s, ",
                  res.cost_unit, pm.problem.nodes.size() + pm.problem.edges.size(), hidden);
    res.stopped = std::string(why) + "more than " + fmt_num(rounding_tolerance) + " of the plan's " + human_seconds(s.step_seconds) +
                  " (the costs span too wide a range: a link far slower than the rest?)";
  }
}

/// Solve one request as it is masked (solve_algo below): restricted problem, tied, on GLPK;
/// back to one strategy per vertex. A budget no allowed choice meets is refused before the
/// solver runs, with the least memory the allowed strategies reach.
inline std::pair<plan_summary, solve_result> solve_masked(const pass_model& pm, const autosharding_options& o,
                                                          const solve_request& rq, std::size_t& classes) {
  const restricted_problem r = restrict_problem(pm, o, rq);
  classes = r.classes;
  if (r.q.usage_limit) {  // said in the pass's words; solve_ilp's are the IOPDDL format's
    const usage_peak lo = r.q.min_peak_usage();
    if (lo.bytes > *r.q.usage_limit)
      throw solver_error(std::string(to_string(rq.a)) + " cannot meet the memory budget of " + human_bytes_exact(*r.q.usage_limit) +
                         " per device: with every operator at the most memory-frugal strategy " +
                         (rq.a == algo::alpa ? std::string("it offers") : std::string(to_string(rq.a)) + " allows") +
                         ", the peak memory per device is at least " + human_bytes_exact(lo.bytes));
  }
  solve_options so;
  so.time_limit = o.time_limit;
  so.mip_rel_gap = o.mip_rel_gap;
  so.threads = o.threads;
  so.seed = o.seed;
  so.on_progress = o.on_progress;
  so.cutoff = cutoff_of(pm, r.q, rq.faster_than);
  solve_result res = solve_ilp(r.q, so);
  std::vector<int> choice(pm.size());
  for (vertex_t v = 0; v < pm.size(); ++v) choice[v] = res.choice[r.cls[v]];
  store_as_used(pm, r.untied, choice);
  plan_summary s = summarize(pm, rq.a, std::move(choice));
  unprove_rounding(pm, s, res);
  return {std::move(s), std::move(res)};
}

/// `found`, one of several solves over parts of one space, goes into `best` when it is the faster;
/// the proven floor of the one not kept goes into `floors` (to weaken_by once all are solved).
/// Returns whether `found` was kept.
inline bool keep_faster(const pass_model& pm, std::optional<std::pair<plan_summary, solve_result>>& best,
                        std::pair<plan_summary, solve_result> found, std::vector<double>& floors) {
  if (best && !(found.first.step_seconds < best->first.step_seconds)) {
    floors.push_back(proven_floor(pm, found.first, found.second));
    return false;
  }
  if (best) floors.push_back(proven_floor(pm, best->first, best->second));
  best = std::move(found);
  return true;
}

/// Solve one algo (solve_masked). Megatron with tensor parallelism and sequence_parallel unset
/// is solved twice, its layers' norms all split on the sequence and none, and the faster kept:
/// Megatron-LM's --sequence-parallel is one switch for every layer, so a baseline whose norms
/// each chose would be a configuration nobody can run (and export --to megatron refuses it).
/// Throws the first solve's error when neither has a plan.
inline std::pair<plan_summary, solve_result> solve_algo(const pass_model& pm, const autosharding_options& o,
                                                        const solve_request& rq, std::size_t& classes) {
  const bool choose = rq.a == algo::megatron && rq.tp_axis >= 0 && pm.mesh.size(static_cast<std::size_t>(rq.tp_axis)) > 1 &&
                      !rq.sequence_parallel;
  bool norms = false;
  for (vertex_t v = 0; v < pm.size() && choose && !norms; ++v) norms = is_layer_norm(pm.g, pm.layers, v);
  if (!norms) return solve_masked(pm, o, rq, classes);
  std::optional<std::pair<plan_summary, solve_result>> best;
  std::optional<solver_error> first_error;
  std::vector<double> floors;  // each solve's proven floor: the kept plan is optimal only over what they prove
  for (const bool sp : {true, false}) {
    solve_request r = rq;
    r.sequence_parallel = sp;
    if (best) r.faster_than = std::min(r.faster_than, best->first.step_seconds);
    std::size_t c = 0;
    try {
      if (keep_faster(pm, best, solve_masked(pm, o, r, c), floors)) classes = c;
    } catch (const solver_error& e) {
      if (!first_error) first_error = e;
      if (e.unproven()) floors.push_back(0.0);  // no answer in the time: nothing is proven of that half
      if (e.beyond_cutoff()) floors.push_back(r.faster_than);  // none of its plans is faster than that
    }
  }
  if (!best) throw *first_error;
  for (double f : floors) weaken_by(best->second, best->first, f);
  return std::move(*best);
}

// ---- the step: the global batch in micro-batches, searched ----------------------------------

/// The mesh megatron runs on with tensor-parallel size `tp` (autosharding_options::
/// tensor_parallel), and its tensor-parallel axis (-1: none, every axis data parallel).
inline std::pair<device_mesh, int> megatron_mesh(const device_mesh& m, int tp) {
  const std::size_t last = m.ndim() - 1;
  const int size = m.size(last);
  // Megatron-LM's tensor parallelism is on the last axis (split by tp), whatever the axes' names
  // say: `--mesh tp=4,dp=2` planned "tp 2, dp 4", its tensor-parallel all-reduces labelled "mesh
  // axis 1 (dp)", and the exports then took axis 0, the one named tp, as the plan's.
  if (tp != 1 && size > 1) {
    const int named = m.find_axis("tp");
    if ((named >= 0 && named != static_cast<int>(last)) || m.axis_name(last) == "dp")
      throw solver_error("megatron: tensor parallelism runs on the mesh's last axis (the devices of a node), but " + to_string(m) +
                         " names " + (named >= 0 && named != static_cast<int>(last) ? m.axis_label(static_cast<std::size_t>(named))
                                                                                     : m.axis_label(last)) +
                         ": name the last axis tp (e.g. dp=2,tp=4), or leave the names out");
  }
  if (tp == 0 || tp == size) return {m, size > 1 ? static_cast<int>(last) : -1};
  if (tp == 1) return {m, -1};
  if (tp < 1 || size % tp != 0 || m.ndim() == max_mesh_rank)
    throw solver_error("megatron: a tensor-parallel size of " + std::to_string(tp) + " does not divide the last mesh axis's " +
                       std::to_string(size) + " ranks (the devices of a node)" +
                       (m.ndim() == max_mesh_rank ? " or the mesh has no room for one more axis" : ""));
  std::vector<int> shape = m.shape();
  shape.back() = size / tp;
  shape.push_back(tp);
  device_mesh out(shape);
  for (std::size_t a = 0; a < m.ndim(); ++a) out.set_link(a, m.link(a));
  out.set_link(last + 1, m.link(last));
  return {out, static_cast<int>(last + 1)};
}

/// Whether `d` ranks of `m` can hold the batch: the product of some of its axes' sizes.
inline bool axes_make(const device_mesh& m, int d) {
  for (unsigned set = 0; set < (1u << m.ndim()); ++set) {
    long p = 1;
    for (std::size_t a = 0; a < m.ndim(); ++a)
      if ((set >> a) & 1u) p *= m.size(a);
    if (p == d) return true;
  }
  return false;
}

/// One micro-step's graph and everything priced on it (pass_model refers to the graph).
struct micro_step_model {
  model_graph graph;
  pass_model pm;
  micro_step_model(model_graph g, const device_mesh& m, const step_pricing& p, std::optional<std::int64_t> budget,
                   const pass_model::phase_callback& on_phase, pass_model::edges_when when = pass_model::edges_when::now)
      : graph(std::move(g)), pm(graph, m, p, budget, on_phase, when) {}
};

/// The micro-step counts a global batch of `batch` sequences can run in: its divisors up to
/// max_micro_batches, ascending (found in O(sqrt) steps: a batch of 2^31 - 1 is two).
inline std::vector<std::int64_t> micro_step_counts(std::int64_t batch) {
  std::vector<std::int64_t> out;
  for (std::int64_t i = 1; i <= max_micro_batches && i <= batch / i; ++i) {
    if (batch % i != 0) continue;
    out.push_back(i);
    if (batch / i != i && batch / i <= max_micro_batches) out.push_back(batch / i);
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// The micro-step counts m of graph `g`'s global batch that the pricing `p` allows and the
/// graph re-sizes to (micro_step_counts: every divisor, or p.micro_batches alone; one step in
/// inference or for a graph with an operator of fixed shape), and why others could not.
struct micro_steps {
  std::vector<std::int64_t> counts;
  std::string fixed;        ///< an opaque operator of fixed output shape: the graph runs as one step
  std::string unresizable;  ///< the first re-sizing that failed
};
inline micro_steps resizable_micro_steps(const model_graph& g, const step_pricing& p) {
  micro_steps out;
  const std::int64_t batch = graph_batch(g);
  if (p.mode != run_mode::training || batch <= 0) {
    out.counts.push_back(1);
    return out;
  }
  // A graph with an operator of fixed shape, or a view the new batch cannot follow, cannot be
  // re-sized to a micro-step: one step.
  out.fixed = fixed_shape_operator(g);
  for (const std::int64_t m : micro_step_counts(batch)) {
    if ((p.micro_batches > 0 && m != p.micro_batches) || (m > 1 && !out.fixed.empty())) continue;
    if (m > 1) try {
        (void)with_batch_seq(g, batch / m, 0);
      } catch (const graph_error& e) {
        if (out.unresizable.empty()) out.unresizable = std::string(e.message());
        continue;
      }
    out.counts.push_back(m);
  }
  return out;
}

/// The models priced so far, by mesh shape and micro-steps: the algos of one pass share them.
/// Their edges are priced when a search first solves them (pass_model::price_edges).
class model_cache {
 public:
  /// resizable_micro_steps of the pass's graph and pricing, once for every algo and mesh
  /// (each count re-sizes a copy of the graph).
  const micro_steps& steps(const model_graph& g, const step_pricing& p) {
    if (!steps_) steps_ = resizable_micro_steps(g, p);
    return *steps_;
  }

  std::shared_ptr<micro_step_model> get(const model_graph& g, const device_mesh& m, int micro_batches,
                                        const autosharding_options& o) {
    std::vector<int> key = m.shape();
    key.push_back(micro_batches);
    auto& slot = models_[key];
    if (!slot) {
      step_pricing p = o.pricing;
      if (p.mode == run_mode::training) p.micro_batches = micro_batches;
      const std::int64_t batch = graph_batch(g);
      model_graph step = micro_batches > 1 ? with_batch_seq(g, batch / micro_batches, 0) : g;
      slot = std::make_shared<micro_step_model>(std::move(step), m, p, o.memory_budget, o.on_phase,
                                                pass_model::edges_when::deferred);
    }
    return slot;
  }

 private:
  std::map<std::vector<int>, std::shared_ptr<micro_step_model>> models_;
  std::optional<micro_steps> steps_;
};

/// One algo's plan from the search, with the model its choice indexes.
struct algo_plan {
  plan_summary plan;
  solve_result solved;
  std::shared_ptr<micro_step_model> model;
  std::size_t classes = 0;
};

/// "4 micro-batches of 128 sequences": one micro-batching of a global batch in words.
inline std::string micro_batching(int m, std::int64_t batch) {
  return std::to_string(m) + (m == 1 ? " micro-batch of " : " micro-batches of ") + std::to_string(batch / m) +
         (batch / m == 1 ? " sequence" : " sequences");
}

/// The micro-step counts m a search of algo `name` on `mesh` tries for graph `g` (the global
/// batch), each with the ways its batch splits (0: any): every divisor of the batch, or the one
/// the pricing fixes, or those a micro-batch per data-parallel rank allows (over megatron's
/// `dp_fixed` ranks when not 0); one step in inference, or when an operator of fixed shape keeps
/// the graph from being re-sized. Throws solver_error saying why when none can run.
/// `cache`: the pass's, which re-sizes the graph once for every search (none: here).
inline std::vector<std::pair<int, int>> micro_batchings_to_try(const model_graph& g, const step_pricing& p,
                                                               const device_mesh& mesh, int dp_fixed, const std::string& name,
                                                               model_cache* cache = nullptr) {
  const std::int64_t batch = graph_batch(g);
  std::vector<std::pair<int, int>> counts;  // (m, batch shards or 0)
  if (p.mode != run_mode::training || batch <= 0) {
    counts.push_back({1, 0});
    return counts;
  }
  const micro_steps mine = cache != nullptr ? micro_steps{} : resizable_micro_steps(g, p);
  const micro_steps& steps = cache != nullptr ? cache->steps(g, p) : mine;
  const std::string& fixed = steps.fixed;
  const std::string& unresizable = steps.unresizable;
  for (const std::int64_t m : steps.counts) {
    const std::int64_t step = batch / m;
    if (dp_fixed > 0 && step % dp_fixed != 0) continue;
    int shards = 0;
    if (p.micro_batch > 0) {
      if (step % p.micro_batch != 0) continue;
      const std::int64_t d = step / p.micro_batch;
      if ((dp_fixed > 0 && d != dp_fixed) || d > mesh.num_ranks() || !axes_make(mesh, static_cast<int>(d))) continue;
      shards = static_cast<int>(d);
    }
    counts.push_back({static_cast<int>(m), shards});
  }
  if (counts.empty())
    throw solver_error(name + ": the global batch of " + std::to_string(batch) + " sequences cannot run " +
                       (p.micro_batches > 0 ? "in " + std::to_string(p.micro_batches) + (p.micro_batches == 1 ? " micro-batch" : " micro-batches")
                                            : std::string("in micro-batches")) +
                       (p.micro_batch > 0 ? " of " + std::to_string(p.micro_batch) + " per data-parallel rank" : std::string()) +
                       (dp_fixed > 0 ? " over its " + std::to_string(dp_fixed) + " data-parallel ranks" : std::string()) +
                       " on mesh " + to_string(mesh) +
                       (!fixed.empty() ? " (opaque operator " + quoted_text(fixed) + " keeps a fixed output shape, so the graph runs as one step)"
                        : !unresizable.empty() ? " (the graph cannot be re-sized to a micro-step: " + unresizable + ")"
                                               : std::string(" (the micro-step's batch must split evenly)")));
  return counts;
}

/// The micro-step models a pass with options `o` may build for `g` (model_cache's keys, and the
/// preloaded plan's model first when there is one): every micro-batching the walk may visit, on
/// o.mesh and on megatron's mesh when it searches megatron (micro_batchings_to_try without
/// megatron's data-parallel filter: a superset). The planning-memory estimate counts them all
/// kept, as the cache keeps them.
inline std::vector<planned_model> pass_models(const model_graph& g, const autosharding_options& o, const device_mesh* preloaded,
                                              model_cache* cache = nullptr) {
  std::vector<planned_model> out;
  if (preloaded) out.push_back({*preloaded, 1});
  if (preloaded && !o.compare_baselines) return out;
  std::vector<device_mesh> meshes{o.mesh};
  if (o.compare_baselines || o.algo == algo::megatron) try {
      meshes.push_back(megatron_mesh(o.mesh, o.tensor_parallel).first);
    } catch (const solver_error&) {  // megatron is refused before it builds a model
    }
  for (const device_mesh& mesh : meshes) try {
      for (const auto& [m, shards] : micro_batchings_to_try(g, o.pricing, mesh, 0, "the pass", cache)) {
        const planned_model k{mesh, m};
        if (std::none_of(out.begin() + (preloaded ? 1 : 0), out.end(), [&](const planned_model& x) { return x.same_key(k); }))
          out.push_back(k);
      }
    } catch (const solver_error&) {  // no micro-batching runs: the search builds no model
    }
  return out;
}

/// One algo's walk over the micro-batchings of the global batch (search_algo): what it walks
/// with, and what it has found so far (the best plan, the bound U(m) of each m solved ignoring
/// memory, a line per micro-batching, and the one whose most frugal strategies came closest to
/// the budget).
struct micro_batching_walk {
  const model_graph& g;
  const autosharding_options& o;
  const device_mesh& mesh;
  const solve_request& rq;  ///< the algo, its recomputation kinds and tensor-parallel axis
  model_cache& cache;
  int dp_fixed = 0;         ///< megatron's data-parallel ranks (0: any)
  algo_plan best;
  double incumbent = std::numeric_limits<double>::infinity();
  std::vector<std::pair<int, double>> bounds;  // (m, U(m))
  std::vector<std::string> tried;
  std::string closest;
  std::int64_t closest_bytes = std::numeric_limits<std::int64_t>::max();
  std::string last_error;
  std::vector<std::pair<int, double>> floors;  // (m, the least time its plans were proven to take)
  int best_m = 0;

  micro_batching_walk(const model_graph& graph, const autosharding_options& options, const device_mesh& m,
                      const solve_request& request, model_cache& models, int dp)
      : g(graph), o(options), mesh(m), rq(request), cache(models), dp_fixed(dp) {}

  /// Micro-batching m, its batch split `shards` ways (0: any), `what` in words; `last`: the
  /// walk's last, whose bound no later one needs. Skipped when a bound says it cannot beat the
  /// best so far; refused when its most frugal strategies cannot meet the budget; otherwise
  /// solved ignoring memory first (unless it is the last under a budget), and within the budget
  /// when that plan does not fit. One line in `tried` whatever happens.
  void visit(int m, int shards, bool last, const std::string& what) {
    const double lb = bound_of(m);
    if (lb >= incumbent) {
      tried.push_back(what + ": skipped: each of its plans takes at least " + human_seconds(lb) +
                      " (the fastest, ignoring memory, of a micro-batching it divides further), the best so far " +
                      human_seconds(incumbent));
      return;
    }
    const std::shared_ptr<micro_step_model> model = cache.get(g, mesh, m, o);
    const pass_model& pm = model->pm;
    solve_request r = rq;
    r.batch_shards = shards;
    r.faster_than = incumbent;  // a solve may stop once it proves m no faster than the best so far
    double least = lb;  // what every plan of m is proven to take at least, so far
    try {
      if (beyond_budget(pm, r, what)) return;
      std::optional<std::pair<plan_summary, solve_result>> found;
      std::size_t classes = 0;
      if (!last || !pm.problem.usage_limit) {  // the fastest plan ignoring memory: a bound for later m, and m's best when it fits
        solve_request free = r;
        free.recompute = cheapest_recompute(r.recompute);
        free.budget = false;
        price(model->pm, r);
        auto u = solve_algo(pm, o, free, classes);
        least = std::max(least, proven_floor(pm, u.first, u.second));
        bounds.push_back({m, least});
        if (least >= incumbent) {
          const bool proven = u.second.status == solve_status::optimal;
          tried.push_back(what + ": no faster than " + human_seconds(incumbent) + " even ignoring memory (" +
                          (proven ? human_seconds(least)
                                  : "at least " + human_seconds(least) + " proven, " + human_seconds(u.first.step_seconds) +
                                        " found") +
                          ")");
          return;
        }
        if (!pm.problem.usage_limit || u.first.peak_memory_bytes <= *pm.problem.usage_limit) found = std::move(u);
      }
      if (!found) found = fastest_within_budget(*model, r, what, classes);
      floors.push_back({m, std::max(least, proven_floor(pm, found->first, found->second))});
      keep(std::move(*found), model, classes, what, m);
    } catch (const solver_error& e) {
      if (e.beyond_cutoff()) {  // every plan of m that fits takes at least the best so far
        tried.push_back(what + ": no faster than " + human_seconds(incumbent) + " within the budget (" +
                        std::string(e.message()) + ")");
        return;
      }
      last_error = std::string(e.message());
      tried.push_back(what + ": " + last_error);
      if (e.unproven()) floors.push_back({m, least});  // m may have plans no solve found in its time
    }
  }

  /// The best plan is optimal over the walk only where every other micro-batching was proven no
  /// faster: weakened by each one's proven floor (weaken_by).
  void weaken_best() {
    for (const auto& [m, f] : floors)
      if (m != best_m) weaken_by(best.solved, best.plan, f);
  }

  /// U(m)'s bound on every plan of m: the largest U(d) of a d solved so far that divides m.
  double bound_of(int m) const {
    double lb = 0;
    for (const auto& [d, u] : bounds)
      if (m % d == 0) lb = std::max(lb, u);
    return lb;
  }

  /// Micro-batching `what` needing `bytes` at least: the closest so far when it needs the least.
  void missed(const std::string& what, std::int64_t bytes) {
    if (bytes < closest_bytes) closest_bytes = bytes, closest = what;
  }

  /// Prices `pm`'s edges for the solves of request `r` (each of its recomputation kinds, with
  /// and without the budget): only the pairs of the strategies r's algo allows when the pass
  /// solves that algo alone, every pair when the baselines share the model.
  void price(pass_model& pm, const solve_request& r) const {
    if (o.compare_baselines) return pm.price_edges(o.on_phase);
    const pass_model::strategy_mask allow = algo_mask(pm, r, o.skip_fully_replicated);
    pm.price_edges(o.on_phase, &allow);
  }

  /// Whether request `r` on `pm` cannot meet the budget even at its most frugal strategies
  /// (then it is listed so, before the solver runs).
  bool beyond_budget(const pass_model& pm, const solve_request& r, const std::string& what) {
    if (!pm.problem.usage_limit) return false;
    const usage_peak lo = restrict_problem(pm, o, r, restricted_for::memory).q.min_peak_usage();
    if (lo.bytes <= *pm.problem.usage_limit) return false;
    tried.push_back(what + ": cannot fit, the least memory its strategies allow is " + human_bytes(static_cast<double>(lo.bytes)));
    missed(what, lo.bytes);
    return true;
  }

  /// The fastest plan of `r` within the budget, every recomputation it allows. With layers tied
  /// every layer of a class recomputes alike: each kind is its own solve (the fastest that fits
  /// wins), which the solver finishes far sooner than one problem offering them all. Untied, the
  /// ILP chooses per layer among them. Throws solver_error with each kind's least memory when
  /// none can fit.
  std::pair<plan_summary, solve_result> fastest_within_budget(micro_step_model& model, const solve_request& r,
                                                              const std::string& what, std::size_t& classes) {
    const pass_model& pm = model.pm;
    std::vector<unsigned> kinds;
    if (o.tie_layers) {
      for (recompute_kind k : all_recompute_kinds)
        if (has_kind(r.recompute, k)) kinds.push_back(1u << static_cast<unsigned>(k));
    } else {
      kinds.push_back(r.recompute);
    }
    std::optional<std::pair<plan_summary, solve_result>> found;
    std::string misses;
    std::int64_t least = std::numeric_limits<std::int64_t>::max();
    std::vector<double> floors;  // each kind's proven floor
    std::optional<solver_error> cut_off;  // the last kind proven no faster than the cutoff
    std::vector<unsigned> solved;  // the kinds solved so far
    for (unsigned kind : kinds) {
      solve_request rk = r;
      rk.recompute = kind;
      const usage_peak lo = restrict_problem(pm, o, rk, restricted_for::memory).q.min_peak_usage();
      if (lo.bytes > *pm.problem.usage_limit) {
        misses += (misses.empty() ? "" : ", ") + describe_recompute_kinds(kind) + " needs at least " +
                  human_bytes(static_cast<double>(lo.bytes));
        least = std::min(least, lo.bytes);
        continue;
      }
      std::size_t c = 0;
      price(model.pm, r);
      if (same_problem_as_one_of(pm, rk, solved)) continue;
      solved.push_back(kind);
      if (found) rk.faster_than = std::min(rk.faster_than, found->first.step_seconds);
      try {
        if (keep_faster(pm, found, solve_algo(pm, o, rk, c), floors)) classes = c;
      } catch (const solver_error& e) {
        if (!e.beyond_cutoff()) throw;
        floors.push_back(rk.faster_than);  // none of its plans is faster than that
        cut_off = e;
      }
    }
    if (!found && cut_off) throw *cut_off;  // the kinds that fit were proven no faster than the best so far
    if (!found) {
      missed(what, least);
      throw solver_error("cannot fit with any one recomputation: " + misses);
    }
    for (double f : floors) weaken_by(found->second, found->first, f);  // optimal only if every kind was proven
    return std::move(*found);
  }

  /// Whether request `r` restricts `pm` to the same problem as one of the recomputation `kinds`
  /// (selective recomputation with the flash kernel, which keeps no probabilities, is none):
  /// the same plans, none faster. Each is restricted again to compare, one at a time, so that
  /// no restricted problem is kept beside the solve.
  bool same_problem_as_one_of(const pass_model& pm, const solve_request& r, const std::vector<unsigned>& kinds) const {
    if (kinds.empty()) return false;
    const restricted_problem mine = restrict_problem(pm, o, r);
    for (unsigned kind : kinds) {
      solve_request other = r;
      other.recompute = kind;
      const restricted_problem theirs = restrict_problem(pm, o, other);
      if (theirs.cls == mine.cls && theirs.q == mine.q) return true;
    }
    return false;
  }

  /// A plan found for micro-batching `what`: its line, and the best when it is the fastest.
  void keep(std::pair<plan_summary, solve_result> found, const std::shared_ptr<micro_step_model>& model, std::size_t classes,
            const std::string& what, int m) {
    plan_summary& s = found.first;
    tried.push_back(what + ": " + to_string(found.second.status) + ", " + human_seconds(s.step_seconds) + ", " +
                    human_bytes(static_cast<double>(s.peak_memory_bytes)) + ", " + to_string(s.par));
    if (s.step_seconds < incumbent) {
      incumbent = s.step_seconds;
      best = {std::move(found.first), std::move(found.second), model, classes};
      best_m = m;
    }
  }

  /// Why the walk over `counts` micro-batchings found no plan: the last error, or, when the budget
  /// is what stopped it, the budget and the least memory the closest micro-batching needs.
  std::string why_none(std::size_t counts) const {
    if (closest_bytes == std::numeric_limits<std::int64_t>::max()) return last_error;
    const algo a = rq.a;
    const std::string name(to_string(a));
    const bool train = o.pricing.mode == run_mode::training;
    const std::int64_t batch = graph_batch(g);
    return name + (a == algo::megatron ? " (" + (rq.tp_axis < 0 ? std::string("no tensor parallelism") : "tensor parallel " +
                                                 std::to_string(mesh.size(static_cast<std::size_t>(rq.tp_axis)))) +
                                         ", data parallel " + std::to_string(dp_fixed) + ", distributed optimizer)"
                                   : std::string()) +
           " does not fit the memory budget of " + human_bytes_exact(*o.memory_budget) + " per device" +
           (train && batch > 0 ? " with " + describe_recompute_kinds(rq.recompute) + ": tried " + std::to_string(counts) +
                                     (counts == 1 ? " micro-batching" : " micro-batchings") + " of the global batch of " +
                                     std::to_string(batch) + "; with the closest, " + closest + ", and"
                               : std::string(": with")) +
           " every operator at the most memory-frugal strategy " +
           (a == algo::alpa ? std::string("it offers") : name + " allows") + ", the peak memory per device is at least " +
           human_bytes_exact(closest_bytes);
  }
};

/// The plan of algo `a` for graph `g` (the global batch): in training, the search over the
/// number of micro-steps m the global batch B runs in (every divisor of B, or the one the
/// pricing fixes, or those a micro-batch per data-parallel rank allows); exact over that space.
///
/// Why it may stop early: a plan of m micro-steps of B/m sequences costs at least what the
/// same strategies cost in m' micro-steps of B/m' for any m' dividing m (the per-micro-step
/// work scales with its batch, each micro-step pays its own collectives' latencies, and a
/// once-per-step gradient sync is hidden behind a smaller last backward), and recomputation
/// only ever adds time; so the fastest plan of m' ignoring memory (cheapest recomputation, no
/// budget: U(m')) bounds every plan of its multiples. Each m is solved ignoring memory first;
/// when that plan fits it is m's best; otherwise m is solved with the budget and every
/// recomputation allowed. An m whose bound is no better than the best plan so far is
/// skipped, one whose most frugal strategies cannot meet the budget is refused before the
/// solver runs (micro_batching_walk). Throws solver_error saying what was tried and what came
/// closest when no plan fits.
inline algo_plan search_algo(const model_graph& g, const autosharding_options& o, algo a, model_cache& cache) {
  const auto [mesh, tp_axis] = a == algo::megatron ? megatron_mesh(o.mesh, o.tensor_parallel) : std::pair{o.mesh, -1};
  const step_pricing& p = o.pricing;
  const bool train = p.mode == run_mode::training;
  const std::int64_t batch = graph_batch(g);
  const int dp_fixed = a == algo::megatron ? mesh.num_ranks() / (tp_axis < 0 ? 1 : mesh.size(static_cast<std::size_t>(tp_axis))) : 0;
  // Megatron's head counts and vocabulary refuse a mesh whatever the micro-batching: once, before any is priced.
  if (a == algo::megatron) {
    megatron_kv_whole(g, mesh, tp_axis);
    megatron_vocab(g, mesh, tp_axis);
  }
  const std::vector<std::pair<int, int>> counts = micro_batchings_to_try(g, p, mesh, dp_fixed, std::string(to_string(a)), &cache);
  solve_request rq;
  rq.a = a;
  // Inference recomputes nothing: one kind, so the budgeted solve below runs once, not per kind.
  rq.recompute = train ? algo_recompute_kinds(a, p.recompute) : recompute_kinds_of(recompute_policy::none);
  rq.tp_axis = tp_axis;
  micro_batching_walk walk{g, o, mesh, rq, cache, dp_fixed};
  for (std::size_t k = 0; k < counts.size(); ++k) {
    const auto [m, shards] = counts[k];
    walk.visit(m, shards, k + 1 == counts.size(), train && batch > 0 ? micro_batching(m, batch) : "the batch in one step");
  }
  if (!walk.best.model) throw solver_error(walk.why_none(counts.size()));
  walk.weaken_best();
  walk.best.plan.tried = std::move(walk.tried);
  return std::move(walk.best);
}

/// Every algo but `chosen`, each searched as the pass searches its own (an algo that has no
/// plan is listed as not feasible, with what it tried and what came closest).
inline std::vector<plan_summary> solve_baselines(const model_graph& g, const autosharding_options& o, algo chosen,
                                                 model_cache& cache) {
  std::vector<algo> algos;
  for (algo a : all_algos)
    if (a != chosen) algos.push_back(a);
  std::vector<plan_summary> out;
  if (o.on_phase) o.on_phase("baselines", 0, algos.size());
  for (algo a : algos) {
    try {
      out.push_back(search_algo(g, o, a, cache).plan);
    } catch (const solver_error& e) {
      plan_summary s;
      s.algo = a;
      s.feasible = false;
      s.why_not = std::string(e.message());
      out.push_back(std::move(s));
    }
    if (o.on_phase) o.on_phase("baselines", out.size(), algos.size());
  }
  return out;
}

// ---- plan files: through the plan document (plan/document.hpp) ---------------------------------

/// The plan document of a priced choice.
inline plan_document make_plan_document(const pass_model& pm, const autosharding_options& o, const plan_summary& s,
                                        const solve_result& solved) {
  plan_document d;
  d.mesh = pm.mesh;
  d.pricing = pm.sopt.pricing;
  if (d.pricing.mode == run_mode::training) d.pricing.micro_batch = s.par.micro_batch;
  d.options = {s.algo, o.time_limit, o.mip_rel_gap, o.skip_fully_replicated, o.tie_layers, o.memory_budget, {}};
  for (const auto& [name, spec] : o.pinned) d.options.pinned[name] = to_alpa_string(spec);
  d.graph = pm.g;
  for (vertex_t v = 0; v < pm.size(); ++v) {
    const strategy& st = pm.strategies[v][static_cast<std::size_t>(s.choice[v])];
    d.tensors.push_back({st.name, st.inputs, st.output, max_local_shape(pm.mesh, st.output, pm.g[v].shape), st.seconds(),
                         st.memory_bytes, st.recompute});
  }
  d.cost = {s.step_seconds, s.compute_seconds, s.communication_seconds, s.resharding_seconds, s.peak_memory_bytes};
  d.solver = {to_string(solved.status), solved.objective_value(), solved.bound_value(), solved.gap, solved.seconds};  // seconds
  return d;
}

/// Strategy name `name` (operand specs, "->", the output's, then any " zero-1" or
/// " recompute-…") with each spec whole_on_unit_axes of `m`: how a plan written with a Shard on
/// a one-rank axis (an older autoshard's tie, or a hand edit) names the strategy offered now.
/// A name that does not parse comes back as it is.
inline std::string name_on_mesh(const device_mesh& m, const std::string& name) {
  const std::size_t space = name.find(' '), arrow = name.find("->");
  if (arrow == std::string::npos || arrow > space) return name;
  const auto whole = [&](std::string_view spec) {
    return to_alpa_string(whole_on_unit_axes(m, parse_spec(spec, static_cast<int>(m.ndim()))));
  };
  try {
    std::string out;
    const std::string_view ins = std::string_view(name).substr(0, arrow);
    for (std::size_t at = 0; at < ins.size();) {
      const std::size_t comma = std::min(ins.find(',', at), ins.size());
      out += (at ? "," : "") + whole(ins.substr(at, comma - at));
      at = comma + 1;
    }
    const std::size_t end = std::min(space, name.size());
    return out + "->" + whole(std::string_view(name).substr(arrow + 2, end - arrow - 2)) + name.substr(end);
  } catch (const spec_error&) {
    return name;
  }
}

/// The strategy index per vertex that a plan document chose, after checking that the document
/// is for this graph (names, kinds, shapes), mesh shape and mode, and that every strategy is
/// one the vertex offers.
inline std::vector<int> plan_choice(const pass_model& pm, const plan_document& d, const std::string& file) {
  const std::string where = "plan file " + quoted_path(file);
  if (d.mesh.shape() != pm.mesh.shape())
    throw solver_error(where + " is for mesh " + to_string(d.mesh) + ", not " + to_string(pm.mesh));
  if (d.pricing.mode != pm.sopt.pricing.mode)
    throw solver_error(where + (d.pricing.mode == run_mode::training ? " is a training plan" : " is an inference plan") +
                       ", not " + (pm.sopt.pricing.mode == run_mode::training ? "a training" : "an inference") + " one");
  const std::size_t n = boost::num_vertices(d.graph);
  if (n != pm.size())
    throw solver_error(where + " has " + std::to_string(n) + " tensors; the graph has " + std::to_string(pm.size()) + " vertices");
  std::vector<int> choice(pm.size(), -1);
  for (vertex_t v = 0; v < pm.size(); ++v) {
    const node& nd = pm.g[v];
    const auto u = find_vertex(d.graph, nd.name);
    if (!u) throw solver_error(where + " has no tensor " + quoted_text(nd.name));
    if (!(d.graph[*u].shape == nd.shape))
      throw solver_error(where + ": tensor " + quoted_text(nd.name) + " has shape " + to_string(d.graph[*u].shape) +
                         " in the file but " + to_string(nd.shape) + " in the graph");
    const std::string& sname = d.tensors[*u].strategy;
    const std::string whole = name_on_mesh(pm.mesh, sname);
    for (std::size_t i = 0; i < pm.strategies[v].size(); ++i)
      if (pm.strategies[v][i].name == sname || pm.strategies[v][i].name == whole) choice[v] = static_cast<int>(i);
    if (choice[v] < 0)
      throw solver_error(where + ": tensor " + quoted_text(nd.name) + " has strategy " + quoted_text(sname) + ", which it does not offer on mesh " +
                         to_string(pm.mesh));
  }
  return choice;
}

}  // namespace detail

/// The bytes per device a plan of `o` (o.algo on o.mesh) may give its tensors on o.pricing's
/// device: its memory less the runtime reserve of a rank of the mesh the algo plans on
/// (megatron's, with its tensor-parallel axis apart). `autoshard plan`'s default budget.
///   o.memory_budget = autoshard::default_memory_budget(o);
inline std::int64_t default_memory_budget(const autosharding_options& o) {
  const device_mesh mesh = o.algo == algo::megatron ? detail::megatron_mesh(o.mesh, o.tensor_parallel).first : o.mesh;
  return runtime_reserve_of(o.pricing.device, mesh).left_on(o.pricing.device);
}

/// Prints the plan and the baselines side by side.
inline std::ostream& operator<<(std::ostream& os, const autosharding_report& r) {
  os << "auto-sharding on " << to_string(r.mesh) << ": " << r.vertices << " vertices, " << r.edges << " edges, "
     << r.tied_classes << " ILP nodes after tying layers\n";
  os << "  algo              step (s)      compute      comm   reshard  peak mem (MiB)\n";
  auto row = [&](const plan_summary& s) {
    const std::string_view name = to_string(s.algo);
    os << "  " << name << std::string(name.size() < 16 ? 16 - name.size() : 1, ' ');
    if (!s.feasible) {
      os << "  -- " << s.why_not << "\n";
      return;
    }
    os << "  " << s.step_seconds << "  " << s.compute_seconds << "  " << s.communication_seconds << "  "
       << s.resharding_seconds << "  " << static_cast<double>(s.peak_memory_bytes) / (1 << 20) << "\n";
    if (!s.fits)
      os << "    DOES NOT FIT: peak " << human_bytes_exact(s.peak_memory_bytes) << " per device"
         << (s.runtime.bytes() > 0 ? " + " + to_string(s.runtime) : std::string()) << " > the device's "
         << human_bytes_exact(r.pricing.device.memory_bytes) << "\n";
  };
  row(r.plan);
  for (const plan_summary& b : r.baselines) row(b);
  std::map<std::pair<std::string, int>, std::pair<double, double>> agg;  // (kind, axis) -> bytes, seconds
  for (const collective_use& c : r.plan.collectives) {
    auto& a = agg[{std::string(to_string(c.kind)), c.mesh_axis}];
    a.first += static_cast<double>(c.bytes);
    a.second += c.seconds;
  }
  for (const auto& [k, v] : agg)
    os << "  " << k.first << " on mesh axis " << k.second << ": " << v.first / (1 << 20) << " MiB, " << v.second
       << " s\n";
  return os;
}

/// Choose one strategy per vertex of `g` (see the header comment for the options).
/// Throws solver_error for bad options, an infeasible memory budget (with the smallest budget
/// that could fit), a time-out without a plan, a plan file that does not match the graph, or a
/// failed run_checks; io_error for an unreadable or malformed plan file; resource_error, before
/// anything large is allocated, when planning would need more memory than the process can
/// allocate (check_planning_memory).
inline autosharding_result autosharding_analysis_pass(const model_graph& g, const autosharding_options& o = {}) {
  std::optional<plan_document> preloaded;
  if (o.preload_solution) {
    if (o.ilp_solution_file.empty()) throw solver_error("preload_solution needs ilp_solution_file");
    preloaded = read_plan_file(o.ilp_solution_file);
    if (preloaded->pipeline)
      throw solver_error("plan file " + quoted_path(o.ilp_solution_file) + " is pipelined (" + std::to_string(preloaded->pipeline->stages.size()) +
                         " stages): the pass prices one mesh, not its stages; `autoshard show --plan` prints it");
    // The mesh it was solved on: the pass's, or for megatron with a tensor-parallel size
    // below the last axis's that axis split in two (megatron_mesh).
    const std::vector<int> mine = o.mesh.shape(), theirs = preloaded->mesh.shape();
    const bool split = theirs.size() == mine.size() + 1 && std::equal(mine.begin(), mine.end() - 1, theirs.begin()) &&
                       theirs[theirs.size() - 2] * theirs.back() == mine.back();
    if (theirs != mine && !(split && preloaded->options.algo == algo::megatron))
      throw solver_error("plan file " + quoted_path(o.ilp_solution_file) + " is for mesh " + to_string(preloaded->mesh) + ", not " +
                         to_string(o.mesh));
  }
  detail::model_cache cache;
  // Refused here, with the estimate, rather than by the OOM killer halfway (planning_memory.hpp).
  check_planning_memory(estimate_planning_memory(g, detail::pass_models(g, o, preloaded ? &preloaded->mesh : nullptr, &cache),
                                                 o.pricing, o.tie_layers));
  autosharding_result res;
  autosharding_report& rep = res.report;
  std::shared_ptr<detail::micro_step_model> model;
  double solver_objective = 0.0;
  if (preloaded) {
    // A preloaded plan is priced with the links, the training settings and the micro-batching
    // it was solved with, on the device and in the mode asked for now (a plan of another mode
    // is refused by plan_choice). Its graph is one micro-step's: `g` at that batch.
    step_pricing pricing = preloaded->pricing;
    pricing.device = o.pricing.device;
    pricing.mode = o.pricing.mode;
    const std::int64_t batch = graph_batch(preloaded->graph), mine = graph_batch(g);
    model_graph step = batch > 0 && mine > 0 && batch != mine ? with_batch_seq(g, batch, 0) : g;
    model = std::make_shared<detail::micro_step_model>(std::move(step), preloaded->mesh, pricing, o.memory_budget, o.on_phase);
    rep.plan = detail::summarize(model->pm, preloaded->options.algo, detail::plan_choice(model->pm, *preloaded, o.ilp_solution_file));
    solver_objective = rep.plan.step_seconds;
    rep.tied_classes = 0;
  } else {
    detail::algo_plan found = detail::search_algo(g, o, o.algo, cache);
    model = found.model;
    rep.plan = std::move(found.plan);
    rep.tied_classes = found.classes;
    solver_objective = found.solved.objective_value();
    rep.solver = std::move(found.solved);
  }
  const detail::pass_model& pm = model->pm;
  rep.mesh = pm.mesh;
  rep.pricing = pm.sopt.pricing;
  if (rep.pricing.mode == run_mode::training) rep.pricing.micro_batch = rep.plan.par.micro_batch;
  rep.vertices = pm.size();
  rep.edges = pm.edges.size();
  if (o.compare_baselines) rep.baselines = detail::solve_baselines(g, o, rep.plan.algo, cache);
  if (o.run_checks) detail::check_plan(pm, rep.plan, solver_objective);
  for (vertex_t v = 0; v < pm.size(); ++v)
    res.strategies.push_back(pm.strategies[v][static_cast<std::size_t>(rep.plan.choice[v])]);
  res.graph = model->graph;
  if (o.run_checks && o.numeric_check) o.numeric_check(res.graph, pm.mesh, res.strategies, rep.plan.collectives);  // before any file is written
  if (!o.preload_solution && !o.ilp_solution_file.empty())
    write_plan_file(detail::make_plan_document(pm, o, rep.plan, rep.solver), o.ilp_solution_file);
  return res;
}

}  // namespace autoshard

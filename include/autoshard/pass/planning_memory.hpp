#pragma once
/// What planning will take, estimated before anything large is allocated, against what this
/// process can still allocate (core/machine.hpp), as exec/resources.hpp does for a verification.
/// The pass's memory goes to its micro-step models (pass_model): every operator's strategies
/// and problem node, and every problem edge's cost matrix, |S_u| x |S_v| int64 (a graph edge's
/// resharding costs, a fully recomputed operator's tie to its shadow). The model cache keeps
/// every model a pass built until it ends (one per mesh and micro-batching searched). One
/// solve at a time copies the largest model's problem twice more: restricted to the algo, and
/// tied into layer classes, where every member of a tied layer that is live apart from the
/// first adds an |S_v| x |S_v| matrix; the solver's reduced copy comes from the latter.
///   const std::vector<autoshard::planned_model> models{{mesh, 1}, {mesh, 2}};  // two micro-batchings
///   const autoshard::planning_memory_estimate e = autoshard::estimate_planning_memory(g, models, pricing, true);
///   autoshard::check_planning_memory(e);  // resource_error naming the estimate, the limit and what to change
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t
#include <map>      // std::map
#include <string>   // std::string
#include <vector>   // std::vector

#include "../core/dtype.hpp"      // human_bytes
#include "../core/error.hpp"      // resource_error
#include "../core/machine.hpp"    // machine_limits
#include "../core/mesh.hpp"       // device_mesh
#include "../graph/fused.hpp"     // fused_dims
#include "../graph/model.hpp"     // model_graph, operands
#include "../graph/pricing.hpp"   // step_pricing
#include "../graph/strategy.hpp"  // enumerate_strategies, gradient_flags
#include "../graph/validate.hpp"  // validate
#include "layers.hpp"             // layer_map, recompute_variants_of, detail::layer_key

namespace autoshard {

/// What one micro-step model's memory grows with (pass_model).
struct planning_model_size {
  std::uint64_t vertices = 0;
  std::uint64_t strategies = 0;  ///< every vertex's strategies, recomputation and ZeRO variants included
  std::uint64_t pairs = 0;       ///< every problem edge's strategy pairs: the graph's edges, each shadow's tie
  /// Pairs a solve's tied problem adds (detail::quotient): |S_v|^2 for each problem node of a
  /// repeated layer that is not a parameter (a parameter's members are live alike, so they merge).
  std::uint64_t tied_pairs = 0;
  friend bool operator==(const planning_model_size&, const planning_model_size&) = default;
};

/// Bytes per unit of a pass's memory, upper bounds of what the release build took with glibc
/// malloc (docs/reliability.md has the measurements). A strategy, with its name, specs and the
/// problem node's cost and usage, took 270-400 B. A pair is an int64 in its model's problem.
/// One solve at a time copies the largest model's problem restricted (its pairs) and tied (its
/// pairs and tied pairs), then the solver reduces a copy of the latter: at most 16 B per pair and
/// tied pair beside what the model keeps; 11.5 B were measured. What grows with the vertices
/// took 2.5 KiB a vertex with one model (1,024 inference layers) and 1 KiB more per further
/// model: charged 1 KiB in each model (its graph copy, the problem's per-vertex vectors) and
/// 4 KiB once for the result (its graph, the plan document and its JSON text, the DOT).
struct planning_bytes {
  static constexpr std::uint64_t per_strategy = 512;
  static constexpr std::uint64_t per_pair = 8;
  static constexpr std::uint64_t per_working_pair = 16;   ///< of the largest model, in one solve
  static constexpr std::uint64_t per_model_vertex = 1 << 10;
  static constexpr std::uint64_t per_result_vertex = 4 << 10;
  static constexpr std::uint64_t process = 64 << 20;  ///< the program, GLPK, a price cache (16 Ki plans)
};

/// One micro-step model a pass may build (the model cache's key): its mesh, and the micro-steps
/// the global batch runs in.
struct planned_model {
  device_mesh mesh;
  int micro_batches = 1;
  bool same_key(const planned_model& o) const { return micro_batches == o.micro_batches && mesh.shape() == o.mesh.shape(); }
};

/// The peak memory of a pass, estimated before it starts.
struct planning_memory_estimate {
  std::uint64_t models = 0;     ///< micro-step models the pass may keep at once
  planning_model_size largest;  ///< the sizes of the largest of them
  std::uint64_t kept = 0;       ///< bytes: every model kept (strategies, problem, graph)
  std::uint64_t working = 0;    ///< bytes: one solve's copies of the largest model's problem
  std::uint64_t fixed = 0;      ///< bytes: the process and the result
  std::uint64_t total() const noexcept { return kept + working + fixed; }
};

namespace detail {

/// What enumerate_strategies and the recomputation variants read of vertex `v`: its node (kind,
/// type, shape, attributes), fused dim and variants, and its operands' shapes, types, fused dims
/// and gradients. Vertices with one key offer as many strategies (the layers of a model share
/// them); numbers, not text, so that keying a large graph takes a fraction of building it.
inline std::vector<std::int64_t> strategy_count_key(const model_graph& g, vertex_t v, const std::vector<fused_dim>& fused,
                                                    const std::vector<char>& grads, const recompute_variants& r) {
  const node& nd = g[v];
  const op_attrs& a = nd.attrs;
  std::vector<std::int64_t> k{static_cast<std::int64_t>(nd.kind), static_cast<std::int64_t>(nd.type), a.transposed_weight, a.causal,
                              a.window, a.dropout, a.axis, a.heads, a.kv_heads, a.start, a.length, a.elementwise, r.plain, r.selective, r.full};
  const auto tensor = [&](vertex_t u) {
    k.insert(k.end(), {static_cast<std::int64_t>(g[u].shape.rank), static_cast<std::int64_t>(g[u].type), fused[u].dim, fused[u].parts});
    for (std::size_t d = 0; d < g[u].shape.rank; ++d) k.push_back(g[u].shape[d]);
  };
  k.push_back(static_cast<std::int64_t>(a.dims.size()));
  k.insert(k.end(), a.dims.begin(), a.dims.end());
  tensor(v);
  for (vertex_t u : operands(g, v)) {
    tensor(u);
    k.push_back(grads[u]);
  }
  return k;
}

}  // namespace detail

/// The sizes of the pass's model of `g` on `mesh` priced with `p` (pass_model), counted without
/// keeping any strategy: each distinct strategy_count_key is enumerated once. `tie_layers`:
/// whether the solves tie repeated layers (autosharding_options::tie_layers).
inline planning_model_size planning_model_size_of(const model_graph& g, const device_mesh& mesh, const step_pricing& p,
                                                  bool tie_layers) {
  const std::size_t n = boost::num_vertices(g);
  const strategy_options sopt{p};
  const std::vector<char> grads = detail::gradient_flags(g);
  const std::vector<fused_dim> fused = fused_dims(g);
  const layer_map L = map_layers(g);
  std::map<std::vector<std::int64_t>, std::uint64_t> enumerated;
  std::vector<std::uint64_t> count(n);
  planning_model_size s;
  s.vertices = n;
  for (vertex_t v = 0; v < n; ++v) {
    const recompute_variants r = recompute_variants_of(g, L, v, p);
    const auto [it, fresh] = enumerated.try_emplace(detail::strategy_count_key(g, v, fused, grads, r), 0);
    if (fresh) it->second = enumerate_strategies(g, v, mesh, sopt, grads).size() * r.count();
    count[v] = it->second;
    s.strategies += count[v];
    const std::uint64_t nodes = r.full ? 2 : 1;  // a fully recomputed operator's shadow node, tied to it by an edge
    if (r.full) s.pairs += count[v] * count[v];
    if (tie_layers && !g[v].is_parameter() && detail::layer_key(g[v].name) != g[v].name) s.tied_pairs += nodes * count[v] * count[v];
  }
  for (auto [e, end] = boost::edges(g); e != end; ++e) s.pairs += count[boost::source(*e, g)] * count[boost::target(*e, g)];
  return s;
}

/// The peak memory of a pass over `g` (the global batch) whose model cache may hold every model
/// of `models` at once, priced with `p`; `tie_layers` as planning_model_size_of. Each model is
/// charged `g`'s sizes on its mesh: a micro-step's batch, a divisor of the global one, splits no
/// dim more ways than the global batch does (a chunk that is not empty over k ranks is not when
/// m times longer), so no micro-step model has more strategies or pairs. Throws graph_error for
/// a graph validate() refuses, before sizing anything.
inline planning_memory_estimate estimate_planning_memory(const model_graph& g, const std::vector<planned_model>& models,
                                                         const step_pricing& p, bool tie_layers) {
  validate(g);
  planning_memory_estimate e;
  e.models = models.size();
  e.fixed = planning_bytes::process + boost::num_vertices(g) * planning_bytes::per_result_vertex;
  std::map<std::vector<int>, planning_model_size> by_mesh;
  for (const planned_model& m : models) {
    auto [it, fresh] = by_mesh.try_emplace(m.mesh.shape());
    if (fresh) it->second = planning_model_size_of(g, m.mesh, p, tie_layers);
    const planning_model_size& s = it->second;
    e.kept += s.strategies * planning_bytes::per_strategy + s.pairs * planning_bytes::per_pair +
              s.vertices * planning_bytes::per_model_vertex;
    const std::uint64_t working = (s.pairs + s.tied_pairs) * planning_bytes::per_working_pair;
    if (working >= e.working) e.working = working, e.largest = s;
  }
  return e;
}

/// Throws resource_error, before the pass allocates anything large, when estimate `e` is above
/// what this process can allocate (`m.memory()`: MemAvailable, what a cgroup's limit leaves, or
/// the address space left under RLIMIT_AS): running out of memory midway ends in the OOM killer
/// or a bad_alloc after minutes. The message names the estimate, its parts, the limit
/// (`m.memory_source()`) and what to change.
inline void check_planning_memory(const planning_memory_estimate& e, const machine_limits& m = machine_limits::memory_here()) {
  const std::uint64_t have = m.memory();
  if (e.total() <= have) return;
  const planning_model_size& s = e.largest;
  throw resource_error(
      "planning would need about " + human_bytes(static_cast<double>(e.total())) + ": " + std::to_string(e.models) +
      (e.models == 1 ? " model, " : " models kept at once (one per mesh and micro-batching the search may visit), ") +
      human_bytes(static_cast<double>(e.kept)) + ", the largest with " + std::to_string(s.vertices) + " vertices, " +
      std::to_string(s.strategies) + " strategies and " + std::to_string(s.pairs) + " strategy pairs on its edges, and one solve's " +
      "copies of its problem, " + human_bytes(static_cast<double>(e.working)) + "; but this process can allocate " +
      human_bytes(static_cast<double>(have)) + " more (" + m.memory_source() +
      "). Plan fewer layers (--layers), on a mesh of fewer axes (an edge's pairs grow with the square of the strategies, "
      "which multiply with every axis)" + (e.models > 1 ? ", in one micro-batching (--micro-batches)" : "") + "; or free memory" +
      (m.memory_limited() ? " or raise the limit" : ""));
}

}  // namespace autoshard

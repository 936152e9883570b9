// The planning-memory estimate (pass/planning_memory.hpp): its counts are the pass's own, its
// arithmetic is what the header says, it grows with the layers and the mesh, and a pass too big
// for the machine is refused with the numbers.
#include <doctest/doctest.h>

#include <autoshard/pass/pass.hpp>
#include <autoshard/pass/pipelined.hpp>  // estimate_pipeline_memory, check_pipeline_memory

#include <algorithm>  // std::max
#include <cstdint>
#include <string>
#include <vector>

namespace {

using namespace autoshard;

/// GPT-2 in miniature: every operator kind of a layer, at sizes small enough to price in ms.
model_graph tiny_gpt2(int layers, run_mode mode) {
  transformer_config c = transformer_config::gpt2(layers, 64, 4);
  c.vocab = 128;
  c.seq = 16;
  c.batch = 8;
  c.mode = mode;
  return build_gpt2(c);
}

step_pricing pricing_for(run_mode mode) {
  step_pricing p;
  p.mode = mode;
  return p;
}

std::uint64_t estimate_total(const model_graph& g, std::vector<int> mesh, run_mode mode) {
  return estimate_planning_memory(g, {{make_cluster_mesh(mesh), 1}}, pricing_for(mode), true).total();
}

}  // namespace

TEST_CASE("planning memory: a chain's counts and bytes, by hand") {
  // x [8, 2] -> relu a -> relu b at inference. On one axis of 2 every tensor is R, S(0) or S(1):
  // 3 strategies each, 3 x 3 pairs on each edge. On 2 x 2 the 9 picks lose S(1)S(1), which cuts
  // dim 1's 2 into 1 and 1 on axis 0 and each 1 into 1 and 0 on axis 1 (an empty shard): 8
  // each, 64 pairs an edge.
  model_graph g;
  const vertex_t x = add_input(g, "x", {8, 2}, dtype::f32);
  add_op(g, op_kind::relu, "b", {add_op(g, op_kind::relu, "a", {x})});
  const step_pricing p = pricing_for(run_mode::inference);
  CHECK(planning_model_size_of(g, make_cluster_mesh({2}), p, true) == planning_model_size{3, 9, 18, 0});
  const planning_model_size s = planning_model_size_of(g, make_cluster_mesh({2, 2}), p, true);
  CHECK(s == planning_model_size{3, 24, 128, 0});

  // Two micro-batchings on one mesh: both kept, one solve's copies of the larger.
  const planning_memory_estimate e = estimate_planning_memory(g, {{make_cluster_mesh({2, 2}), 1}, {make_cluster_mesh({2}), 1}}, p, true);
  CHECK(e.models == 2);
  CHECK(e.largest == s);
  CHECK(e.kept == (24 + 9) * planning_bytes::per_strategy + (128 + 18) * planning_bytes::per_pair + (3 + 3) * planning_bytes::per_model_vertex);
  CHECK(e.working == 128 * planning_bytes::per_working_pair);
  CHECK(e.fixed == planning_bytes::process + 3 * planning_bytes::per_result_vertex);
  CHECK(e.total() == e.kept + e.working + e.fixed);
}

TEST_CASE("planning memory: the counts are the pass's own, and the tied pairs bound the tied problem's") {
  // Training: recomputation variants, ZeRO variants of the weights, shadows of the fully
  // recomputed operators; then a solve's tied problem with every recomputation allowed.
  const model_graph g = tiny_gpt2(2, run_mode::training);
  const device_mesh mesh = make_cluster_mesh({2, 2});
  const step_pricing p = pricing_for(run_mode::training);
  const planning_model_size s = planning_model_size_of(g, mesh, p, true);
  detail::pass_model pm(g, mesh, p);
  std::uint64_t strategies = 0, pairs = 0;
  for (const auto& ss : pm.strategies) strategies += ss.size();
  for (const strategy_edge& e : pm.problem.edges) pairs += e.costs.size();
  CHECK(s.vertices == pm.size());
  CHECK(s.strategies == strategies);
  CHECK(s.pairs == pairs);
  autosharding_options o;
  o.mesh = mesh;
  o.pricing = p;
  const detail::restricted_problem r = detail::restrict_problem(pm, o, detail::solve_request{});
  std::uint64_t tied = 0;
  for (const strategy_edge& e : r.q.edges) tied += e.costs.size();
  CHECK(tied > pairs);                   // the tied layers' members live apart: matrices of their own
  CHECK(tied <= s.pairs + s.tied_pairs);  // what the estimate charges a solve for
  CHECK(planning_model_size_of(g, mesh, p, false).tied_pairs == 0);  // untied: nothing is merged
}

TEST_CASE("planning memory grows with the layers, the mesh's axes and training") {
  const model_graph two = tiny_gpt2(2, run_mode::training), four = tiny_gpt2(4, run_mode::training);
  CHECK(estimate_total(two, {2, 2}, run_mode::training) < estimate_total(four, {2, 2}, run_mode::training));
  CHECK(estimate_total(two, {1, 2}, run_mode::training) < estimate_total(two, {2, 2}, run_mode::training));
  CHECK(estimate_total(two, {2, 2}, run_mode::training) < estimate_total(two, {2, 2, 2}, run_mode::training));
  const model_graph infer = tiny_gpt2(2, run_mode::inference);
  CHECK(estimate_total(infer, {2, 2}, run_mode::inference) < estimate_total(two, {2, 2}, run_mode::training));
  // A micro-step's batch splits no more ways than the global one (what lets g's sizes bound every model).
  const step_pricing p = pricing_for(run_mode::training);
  const device_mesh mesh = make_cluster_mesh({2, 4});
  const planning_model_size whole = planning_model_size_of(two, mesh, p, true);
  const planning_model_size step = planning_model_size_of(with_batch_seq(two, 1, 0), mesh, p, true);
  CHECK(step.strategies < whole.strategies);
  CHECK(step.pairs < whole.pairs);
}

TEST_CASE("planning memory: the models a pass may keep") {
  const model_graph g = tiny_gpt2(2, run_mode::training);
  autosharding_options o;
  o.mesh = make_cluster_mesh({2, 4});
  o.pricing = pricing_for(run_mode::training);
  const auto keys = [](const std::vector<planned_model>& ms) {
    std::vector<std::pair<std::vector<int>, int>> out;
    for (const planned_model& m : ms) out.emplace_back(m.mesh.shape(), m.micro_batches);
    return out;
  };
  using key_list = std::vector<std::pair<std::vector<int>, int>>;
  // A global batch of 8: every divisor, on the one mesh (megatron's is the same at its default tp).
  CHECK(keys(detail::pass_models(g, o, nullptr)) == key_list{{{2, 4}, 1}, {{2, 4}, 2}, {{2, 4}, 4}, {{2, 4}, 8}});
  o.tensor_parallel = 2;  // megatron's mesh splits the last axis: its models too
  CHECK(detail::pass_models(g, o, nullptr).size() == 8);
  o.pricing.micro_batches = 2;
  CHECK(keys(detail::pass_models(g, o, nullptr)) == key_list{{{2, 4}, 2}, {{2, 2, 2}, 2}});
  o.compare_baselines = false;  // alpa alone: no megatron mesh
  CHECK(keys(detail::pass_models(g, o, nullptr)) == key_list{{{2, 4}, 2}});
  const device_mesh preloaded = make_cluster_mesh({8});
  CHECK(keys(detail::pass_models(g, o, &preloaded)) == key_list{{{8}, 1}});
  o.pricing.mode = run_mode::inference;
  o.compare_baselines = true;
  o.pricing.micro_batches = 0;
  CHECK(keys(detail::pass_models(tiny_gpt2(2, run_mode::inference), o, nullptr)) == key_list{{{2, 4}, 1}, {{2, 2, 2}, 1}});
}

TEST_CASE("planning memory: a pass above what the process can allocate is refused with the numbers") {
  const model_graph g = tiny_gpt2(2, run_mode::training);
  const planning_memory_estimate e =
      estimate_planning_memory(g, {{make_cluster_mesh({2, 2}), 1}, {make_cluster_mesh({2, 2}), 2}}, pricing_for(run_mode::training), true);
  machine_limits m;
  m.mem_available = e.total();
  CHECK_NOTHROW(check_planning_memory(e, m));
  m.mem_available = e.total() - 1;
  CHECK_THROWS_WITH_AS(check_planning_memory(e, m),
                       doctest::Contains("2 models kept at once (one per mesh and micro-batching the search may visit)"), resource_error);
  CHECK_THROWS_WITH_AS(check_planning_memory(e, m), doctest::Contains("more (MemAvailable). Plan fewer layers (--layers)"),
                       resource_error);
  const auto message = [&] {
    try {
      check_planning_memory(e, m);
    } catch (const resource_error& x) {
      return std::string(x.what());
    }
    return std::string("(no error)");
  };
  CHECK(message().find("; or free memory") != std::string::npos);
  CHECK(message().find("raise the limit") == std::string::npos);  // MemAvailable is no limit one raises
  m.mem_available_file = "/sys/fs/cgroup/kubepods/memory.max";  // a container's limit, below MemAvailable
  CHECK_THROWS_WITH_AS(check_planning_memory(e, m),
                       doctest::Contains("more (the cgroup's limit, /sys/fs/cgroup/kubepods/memory.max). Plan fewer"), resource_error);
  CHECK_THROWS_WITH_AS(check_planning_memory(e, m), doctest::Contains("or raise the limit"), resource_error);
  m.address_space = 1 << 20;  // ulimit -v
  CHECK_THROWS_WITH_AS(check_planning_memory(e, m),
                       doctest::Contains("can allocate 1.00 MiB more (the address-space limit, ulimit -v)"), resource_error);
  CHECK_THROWS_WITH_AS(check_planning_memory(e, m), doctest::Contains("or raise the limit"), resource_error);
}

TEST_CASE("planning memory: --pp configurations are weighed before a stage model is built") {
  // search_pipelines built each configuration's stage model with no estimate, while the same
  // model planned without --pp was refused up front. Each stage model is two layers on a stage's
  // sub-mesh, one at a time: the estimate is the largest over the distinct stage meshes.
  const model_graph g = tiny_gpt2(4, run_mode::training);
  const device_mesh mesh = make_cluster_mesh({2, 4});
  const step_pricing p = pricing_for(run_mode::training);
  // pp 2 x tp 4 (stage mesh 4) and pp 4 x dp 2 (stage mesh 2), and one that does not factor the mesh.
  const std::vector<pipeline_config> configs{{2, 4, 1, 1, recompute_kind::none, pipeline_schedule::one_f_one_b},
                                             {4, 1, 2, 1, recompute_kind::none, pipeline_schedule::one_f_one_b},
                                             {3, 1, 1, 1, recompute_kind::none, pipeline_schedule::one_f_one_b}};
  const planning_memory_estimate e = estimate_pipeline_memory(g, mesh, p, configs);
  step_pricing stage = p;
  stage.recompute = recompute_policy::choose;
  const std::uint64_t on4 = estimate_planning_memory(with_layers(g, 2), {{device_mesh{4}, 1}}, stage, true).total();
  const std::uint64_t on2 = estimate_planning_memory(with_layers(g, 2), {{device_mesh{2}, 1}}, stage, true).total();
  CHECK(e.models == 1);
  CHECK(e.total() == std::max(on4, on2));
  machine_limits m;
  m.mem_available = e.total();
  CHECK_NOTHROW(check_pipeline_memory(g, mesh, p, configs, m));
  m.mem_available = e.total() - 1;
  CHECK_THROWS_WITH_AS(check_pipeline_memory(g, mesh, p, configs, m),
                       doctest::Contains("pricing 3 pipeline configurations (one stage model of two layers at a time): planning would need about "),
                       resource_error);
  CHECK(estimate_pipeline_memory(g, mesh, p, {}).models == 0);  // nothing to price, nothing to weigh
}

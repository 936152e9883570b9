// Megatron's head-parallel attention after GPT-2's fused QKV split (graph/fused.hpp): c_attn
// column-parallel with each rank holding the q, k and v columns of its heads, the split handing
// each part on sharded, attention head-parallel, c_proj row-parallel. Run on Gloo ranks and
// compared with the unsharded model, forward and a training step.
#include <doctest/doctest.h>

#include <autoshard/exec/exec.hpp>

#include <string>

#include "../graph/graph_test_util.hpp"

namespace {
using namespace autoshard;
using graph_test::tiny_gpt2;
using graph_test::vertex_named;

std::vector<strategy> megatron_plan(const model_graph& g, run_mode mode) {
  autosharding_options o;
  o.mesh = make_cluster_mesh({1, 4});
  o.pricing.mode = mode;
  o.algo = algo::megatron;
  o.compare_baselines = false;
  return autosharding_analysis_pass(g, o).strategies;
}

// Every layer's attention runs head-parallel on the 4 ranks of mesh axis 1, and nothing is
// gathered between c_attn and the attention.
void check_head_parallel(const model_graph& g, const std::vector<strategy>& plan) {
  for (int l = 0; l < 2; ++l) {
    const std::string n = "transformer.h." + std::to_string(l) + ".attn.";
    CAPTURE(n);
    CHECK(plan[vertex_named(g, n + "c_attn.weight")].output[1].is_shard(1));
    CHECK(plan[vertex_named(g, n + "c_attn.bias")].output[1].is_shard(0));
    CHECK(plan[vertex_named(g, n + "c_attn")].output[1].is_shard(2));
    for (const char* part : {"q", "k", "v"}) {
      const strategy& s = plan[vertex_named(g, n + part)];
      CHECK(s.inputs[0] == plan[vertex_named(g, n + "c_attn")].output);
      CHECK(s.output[1].is_shard(2));
    }
    const strategy& a = plan[vertex_named(g, n + "attention")];
    for (std::size_t i = 0; i < 3; ++i) {
      CHECK(a.inputs[i][1].is_shard(2));
      CHECK(a.inputs[i] == plan[vertex_named(g, n + (i == 0 ? "q" : i == 1 ? "k" : "v"))].output);
    }
    CHECK(plan[vertex_named(g, n + "c_proj")].output[1].is_partial());  // row-parallel
  }
}
}  // namespace

TEST_CASE("head-parallel attention after the fused QKV split runs on 4 Gloo ranks and matches the unsharded forward") {
  const model_graph g = tiny_gpt2(run_mode::inference);
  const std::vector<strategy> plan = megatron_plan(g, run_mode::inference);
  check_head_parallel(g, plan);
  const verify_report r = verify_plan(g, device_mesh{1, 4}, plan);
  INFO(r);
  CHECK(r.passed());
  CHECK(r.max_rel_diff < 1e-12);
}

TEST_CASE("a training step with head-parallel attention after the fused QKV split matches the unsharded step") {
  const model_graph g = tiny_gpt2(run_mode::training);
  const std::vector<strategy> plan = megatron_plan(g, run_mode::training);
  check_head_parallel(g, plan);
  verify_options o;
  o.training = true;
  const verify_report r = verify_plan(g, device_mesh{1, 4}, plan, o);
  INFO(r);
  CHECK(r.passed());
}

TEST_CASE("gathering, slicing and reduce-scattering a fused QKV output keep its per-part layout on 4 Gloo ranks") {
  const model_graph g = tiny_gpt2(run_mode::training);
  std::vector<strategy> plan = megatron_plan(g, run_mode::training);
  const device_mesh m{1, 4};
  auto pick = [&](const std::string& name, auto&& want) {
    const vertex_t v = vertex_named(g, name);
    for (const strategy& s : enumerate_strategies(g, v, m))
      if (want(s)) {
        plan[v] = s;
        return;
      }
    FAIL("no such strategy of " << name);
  };
  // Layer 0: q taken whole from the per-part cut c_attn output, an all-gather that must put q's
  // pieces together (a plain all-gather would give rank 0's q, k, v pieces first), and the
  // backward's slice of q's gradient back into the per-part layout.
  pick("transformer.h.0.attn.q", [](const strategy& s) { return s.inputs[0].is_replicated() && s.output.is_replicated(); });
  // Layer 1: c_attn computed with its contraction dim cut (a Partial output, reduce-scattered
  // into the per-part layout the head-parallel split takes) from a whole weight, sliced on use.
  pick("transformer.h.1.attn.c_attn", [](const strategy& s) {
    return s.inputs[0][1].is_shard(2) && s.output[1].is_partial() && s.output[0].is_replicate();
  });
  pick("transformer.h.1.attn.c_attn.weight", [](const strategy& s) { return s.output.is_replicated() && s.zero_stage == 0; });
  pick("transformer.h.1.attn.c_attn.bias", [](const strategy& s) { return s.output.is_replicated() && s.zero_stage == 0; });
  verify_options o;
  o.training = true;
  const verify_report r = verify_plan(g, m, plan, o);
  INFO(r);
  CHECK(r.passed());
}

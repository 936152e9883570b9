// A training step as Megatron-LM runs one, executed on real Gloo ranks: the global batch in
// micro-batches with gradients accumulated, full activation recomputation on some layers, one
// gradient synchronisation per step. The oracle is the unsharded model on the whole global
// batch (its loss, every parameter's gradient and updated value), computed independently.
#include <doctest/doctest.h>

#include <autoshard/exec/exec.hpp>

#include <set>
#include <string>

#include "unit/exec/tiny_models.hpp"
#include "unit/scratch.hpp"

namespace {
using namespace autoshard;

// The tests' tiny GPT-2 at a global batch of 16 sequences (4 micro-batches of 4: one or two
// per data-parallel rank).
transformer_config accumulation_gpt() {
  transformer_config c = autoshard_test::tiny(transformer_config::gpt2_124m());
  c.batch = 16;
  return c;
}

// The pass's plan of `g` on `mesh` in 4 micro-batches, with every layer fully recomputed, as
// the plan file it writes; then layer 1 taken back to no recomputation (the strategies of one
// layer are chosen together: its plain variant is one the vertex offers), so the plan
// recomputes some layers and not others, and read back whole as verify reads it. The batch is
// pinned split over mesh axis 0 at the embeddings and the head (a model this small is
// cheapest replicated: only the pinned plan is data-parallel), except megatron's, which splits
// it there itself and runs the vocabulary vocab-parallel on axis 1 (a pin would contradict it).
loaded_plan micro_batched_plan(const model_graph& g, const std::vector<int>& mesh, algo a) {
  const autoshard_test::scratch_dir dir;
  autosharding_options o;
  o.mesh = make_cluster_mesh(mesh);
  o.pricing.mode = run_mode::training;
  o.pricing.micro_batches = 4;
  o.pricing.recompute = recompute_policy::full;
  o.compare_baselines = false;
  o.algo = a;
  o.ilp_solution_file = (dir / "plan.json").string();
  if (a != algo::megatron) {  // megatron splits the batch over axis 0 itself, and lays the vocabulary out on axis 1
    o.pinned["transformer.wte"] = parse_spec("S0RR", 2, 3);
    o.pinned["lm_head"] = parse_spec("S0RR", 2, 3);
  }
  (void)autosharding_analysis_pass(g, o);
  plan_document d = read_plan_file(o.ilp_solution_file);
  REQUIRE(d.pricing.micro_batches == 4);
  const std::string suffix = " recompute-full";
  d.pricing.recompute = recompute_policy::choose;  // every variant offered again: a layer's plain one too
  for (vertex_t v = 0; v < boost::num_vertices(d.graph); ++v) {
    plan_tensor& t = d.tensors[v];
    const bool in_layer = d.graph[v].is_operator() && d.graph[v].name.rfind("transformer.h.", 0) == 0;
    REQUIRE_MESSAGE((t.recompute == recompute_kind::full) == in_layer, d.graph[v].name);
    if (!in_layer || d.graph[v].name.rfind("transformer.h.1.", 0) != 0) continue;
    t.strategy.erase(t.strategy.size() - suffix.size());
    t.recompute = recompute_kind::none;
  }
  return load_plan(std::move(d));
}

std::size_t layer_operators(const model_graph& g, const std::string& prefix) {
  std::size_t n = 0;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) n += g[v].is_operator() && g[v].name.rfind(prefix, 0) == 0 ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("4 micro-batches with a recomputed layer on dp x tp Gloo ranks: the unsharded step on the whole global batch") {
  const model_graph g = build_gpt2(accumulation_gpt());
  struct mesh_case {
    std::vector<int> shape;
    algo a;
  };
  for (const mesh_case& m : {mesh_case{{2, 2}, algo::megatron}, mesh_case{{4, 1}, algo::data_parallel},
                             mesh_case{{4, 1}, algo::zero3}, mesh_case{{2, 4}, algo::megatron}}) {
    CAPTURE(to_string(device_mesh(m.shape)));
    CAPTURE(to_string(m.a));
    const loaded_plan p = micro_batched_plan(g, m.shape, m.a);
    const model_graph& step = p.graph();  // one micro-step's graph: 4 of the 16 sequences
    REQUIRE(graph_batch(step) == 4);
    CHECK(plan_micro_batches(p.document) == 4);
    verify_options vo;
    vo.training = true;
    const verify_report r = verify_plan(p, vo);
    INFO(r);
    CHECK(r.passed());
    CHECK(r.micro_batches == 4);
    // The unsharded model ran the whole global batch; every operator was compared there too.
    REQUIRE(r.losses.size() == 1);
    CHECK(r.losses[0].passed);
    CHECK(r.losses[0].ref_max_abs > 1.0);  // a cross-entropy over 96 tokens: about log 96
    std::size_t params = 0;
    for (vertex_t v = 0; v < boost::num_vertices(step); ++v) params += step[v].is_parameter() ? 1 : 0;
    CHECK(r.gradients.size() == params);
    CHECK(r.updates.size() == params);
    // Layer 0 ran its forward again before its backward, in each of the 4 micro-steps; layer 1 did not.
    CHECK(r.replayed_forwards == 4 * layer_operators(step, "transformer.h.0."));
    // The communication the ranks issued over the 4 micro-steps is what the plan was priced:
    // activations' collectives every micro-step (twice into the recomputed layer), the
    // gradient sync once.
    CHECK(r.traffic.checked);
    CHECK(r.traffic.passed());
    // One gradient synchronisation per parameter per step, not one per micro-batch: every
    // parameter a data-parallel axis reduces is reduced once (each gradient accumulated over
    // the 4 micro-steps first), unless the plan reduce-scatters it at every micro-step (a
    // gradient that ends sharded on an axis it is summed over: ZeRO-2, or a weight stored
    // sharded there), as priced.
    std::size_t once = 0;
    for (vertex_t v = 0; v < boost::num_vertices(step); ++v) {
      if (!step[v].is_parameter()) continue;
      CAPTURE(step[v].name);
      const strategy& st = p.strategies[v];
      const sharding_spec& kept = st.zero_stage > 0 ? st.gradient_spec : st.output;  // where its gradient ends
      bool sharded = false;
      for (std::size_t a = 0; a < kept.mesh_rank; ++a) sharded = sharded || (kept[a].is_shard() && m.shape[a] > 1);
      const int syncs = r.gradient_syncs[v];
      CHECK((syncs == 0 || syncs == 1 || (syncs == 4 && sharded)));
      once += syncs == 1 ? 1 : 0;
      // Data parallel: every weight replicated over the 4 data-parallel ranks, reduced once.
      // Megatron: its distributed optimizer (ZeRO-1) reduces once. ZeRO-3: every weight is
      // stored sharded over the data-parallel ranks, and its gradient reduce-scattered at every
      // micro-step (FSDP's memory holds only the shard).
      // The position table is the exception: positions [1, S] are broadcast over the batch, so
      // its lookup's gradient is summed over the data-parallel ranks before it reaches the table.
      const bool positions = step[v].name == "transformer.wpe.weight";
      if (m.a == algo::data_parallel) CHECK(syncs == (positions ? 0 : 1));
      if (m.a == algo::megatron) CHECK(syncs <= 1);
      if (m.a == algo::zero3) CHECK(syncs == (positions ? 0 : 4));
    }
    if (m.a != algo::zero3) CHECK(once > 0);
  }
}

TEST_CASE("accumulation is checked: a gradient reduced at one micro-step only, or a micro-step's inputs taken twice, are caught") {
  const model_graph g = build_gpt2(accumulation_gpt());
  const loaded_plan p = micro_batched_plan(g, {4, 1}, algo::data_parallel);
  verify_options vo;
  vo.training = true;
  // Each rank keeps its own contribution of this weight's gradient (the fault the checker's
  // tests inject): caught at that parameter, after 4 micro-steps of accumulation.
  vo.step.drop_gradient_sync = "transformer.h.1.mlp.c_fc.weight";
  const verify_report r = verify_plan(p, vo);
  INFO(r);
  CHECK_FALSE(r.passed());
  CHECK(r.first_failed == "grad:transformer.h.1.mlp.c_fc.weight");
  // The executor refuses inputs that are neither the graph's batch nor the global batch.
  const std::vector<host_tensor> sources = make_source_values<double>(p.graph(), 1);
  CHECK_THROWS_WITH_AS(detail::micro_batch_inputs(p.graph(), sources, 4), doctest::Contains("no input holds it"), exec_error);
  CHECK_THROWS_WITH_AS(detail::micro_batch_inputs(p.graph(), sources, 0), doctest::Contains("1 to"), exec_error);
}

TEST_CASE("the schedule of a fully recomputed layer keeps only its output to the end of the forward, and runs it again once") {
  const model_graph g = build_gpt2(accumulation_gpt());
  const loaded_plan p = micro_batched_plan(g, {2, 2}, algo::megatron);
  const model_graph& step = p.graph();
  const liveness_schedule s = make_liveness_schedule(step, &p.strategies, run_mode::training);
  // What is alive at the end of the forward: everything produced, less what the forward freed.
  std::set<vertex_t> alive;
  for (vertex_t v : s.order) {
    alive.insert(v);
    for (vertex_t u : s.forward_frees[v]) alive.erase(u);
    if (s.forward_frees_itself[v]) alive.erase(v);
  }
  const layer_map layers = map_layers(step);
  std::size_t kept0 = 0, kept1 = 0;
  for (vertex_t v : alive) {
    if (!step[v].is_operator()) continue;
    if (layers.layer[v] == 0) {
      CAPTURE(step[v].name);
      CHECK(layers.output[v]);  // the recomputed layer keeps its output (the next layer's input) alone
      ++kept0;
    }
    kept1 += layers.layer[v] == 1 ? 1 : 0;
  }
  CHECK(kept0 >= 1);
  CHECK(kept1 > kept0 + 4);  // the plain layer keeps what its backward reads
  // Layer 0's operators run again once, right before the backward of its last operator.
  std::size_t replays = 0;
  for (vertex_t v = 0; v < boost::num_vertices(step); ++v)
    if (!s.replay[v].empty()) {
      ++replays;
      CHECK(s.replay[v].back() == v);
      CHECK(s.replay[v].size() == layer_operators(step, "transformer.h.0."));
    }
  CHECK(replays == 1);
  CHECK(s.replayed_operators == layer_operators(step, "transformer.h.0."));
}

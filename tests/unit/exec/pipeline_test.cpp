// A pipelined training step executed on real Gloo ranks: each stage's ranks hold only its
// layers and run them with the sharded executor on the stage's tensor x data-parallel mesh,
// the stages hand activations forward and their gradients back point to point in 1F1B's order,
// and the tied embedding's gradient is kept in sync across the first and last stages. The
// oracle is the unsharded model on the whole global batch (its loss, every parameter's
// gradient and updated value), computed independently; the audit holds every transfer to what
// the pipelined pricing says moves.
#include <doctest/doctest.h>

#include <autoshard/exec/exec.hpp>
#include <autoshard/gloo/launch.hpp>
#include <autoshard/pass/pipelined.hpp>

#include <string>
#include <vector>

#include "unit/exec/tiny_models.hpp"

namespace {
using namespace autoshard;

// The tests' tiny GPT-2 (2 layers, global batch 16) as `plan --pp 2` writes it for 2x4 devices:
// pp 2 x dp 2 x tp 2 (Megatron-LM's layout on each stage), micro-batches of 2 sequences per
// data-parallel rank (4 of them), 1F1B, one layer a stage, every layer fully recomputed; then
// stage 0's layer taken back to no recomputation (a layer's plain variant is one its vertices
// offer), so one stage recomputes and the other does not.
plan_document pipelined_document_of_tiny(pipeline_schedule schedule = pipeline_schedule::one_f_one_b) {
  transformer_config c = autoshard_test::tiny(transformer_config::gpt2_124m());
  c.batch = 16;
  const model_graph g = build_gpt2(c);
  autosharding_options o;
  o.mesh = make_cluster_mesh({2, 4});
  o.pricing.mode = run_mode::training;
  o.pricing.recompute = recompute_policy::full;
  const pipeline_config config{2, 2, 2, 2, recompute_kind::full, schedule};
  const pipelined_step s = price_pipelined(g, o.mesh, o.pricing, algo::megatron, config, {1, 1}, o);
  plan_document d = pipelined_document(g, o.mesh, s, o);
  const std::string suffix = " recompute-full";
  d.pricing.recompute = recompute_policy::choose;  // every variant offered again: a layer's plain one too
  for (vertex_t v = 0; v < boost::num_vertices(d.graph); ++v) {
    plan_tensor& t = d.tensors[v];
    if (d.graph[v].name.rfind("transformer.h.0.", 0) != 0 || t.recompute != recompute_kind::full) continue;
    t.strategy.erase(t.strategy.size() - suffix.size());
    t.recompute = recompute_kind::none;
  }
  return d;
}

std::size_t count_lines(const traffic_audit& a, const std::string& kind, traffic_site::phase what) {
  std::size_t n = 0;
  for (const traffic_line& l : a.lines) n += l.kind == kind && l.site.what == what ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("gloo point to point: both ends send before they receive, in order, and a message never sent is an error") {
  gloo_options go;
  go.timeout = std::chrono::milliseconds(2000);
  run_ranks(2, [](gloo_communicator& c) {
    const int peer = 1 - c.rank();
    for (int k = 0; k < 3; ++k) {  // sends return at once: no deadlock though both send first
      const double mine[2] = {10.0 * c.rank() + k, -1.0};
      c.send(mine, 2, dtype::f64, peer);
    }
    for (int k = 0; k < 3; ++k) {
      double got[2] = {0, 0};
      c.recv(got, 2, dtype::f64, peer);
      CHECK(got[0] == 10.0 * peer + k);
      CHECK(got[1] == -1.0);
    }
    c.wait_sends();
    CHECK_THROWS_WITH_AS(c.send(&peer, 1, dtype::i32, c.rank()), doctest::Contains("(itself)"), comm_error);
    if (c.rank() == 0) {  // rank 1 sends nothing more
      c.set_timeout(std::chrono::milliseconds(300));
      double never = 0;
      CHECK_THROWS_WITH_AS(c.recv(&never, 1, dtype::f64, 1), doctest::Contains("recv of 1 f64 elements from rank 1 failed"), comm_error);
    }
  }, go);
}

TEST_CASE("pipelined: pp 2 x dp 2 x tp 2 on 8 Gloo ranks, 4 micro-batches in 1F1B, one stage recomputed: the unsharded step") {
  const loaded_plan p = load_plan(pipelined_document_of_tiny());
  REQUIRE(p.document.pipeline);
  REQUIRE(p.document.pipeline->stages.size() == 2);
  CHECK(p.mesh().num_ranks() == 4);  // one stage: dp 2 x tp 2
  verify_options training;
  training.training = true;
  const verify_report r = verify_plan(p, training);
  INFO(r);
  CHECK(r.stages == 2);
  CHECK(r.passed());
  CHECK((r.micro_batches == plan_micro_batches(p.document) && r.micro_batches == 4));
  REQUIRE(r.losses.size() == 1);
  CHECK(r.losses[0].ref_max_abs > 1.0);  // a cross-entropy over 96 tokens: about log 96
  std::size_t params = 0, layer1 = 0;
  const model_graph& g = p.graph();
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    params += g[v].is_parameter() ? 1 : 0;
    layer1 += g[v].is_operator() && g[v].name.rfind("transformer.h.1.", 0) == 0 ? 1 : 0;
  }
  CHECK(r.gradients.size() == params);  // the tied embedding once: its two stages' copies agree
  CHECK(r.updates.size() == params);
  CHECK(r.replayed_forwards == 4 * layer1);  // stage 1's layer ran again before each backward; stage 0's never
  // The audit covers the transfers: each activation crossing the boundary sent by stage 0 and
  // received by stage 1 every micro-step, its gradient back, as priced; and the tied
  // embedding's gradient all-reduced over the pipeline axis (after the stage's own axes) once.
  REQUIRE(r.traffic.checked);
  CHECK(r.traffic.passed());
  const std::size_t crossings = count_lines(r.traffic, "send", traffic_site::phase::transfer);
  CHECK(crossings >= 1);
  CHECK(count_lines(r.traffic, "recv", traffic_site::phase::transfer) == crossings);
  CHECK(count_lines(r.traffic, "send", traffic_site::phase::transfer_back) == crossings);
  CHECK(count_lines(r.traffic, "recv", traffic_site::phase::transfer_back) == crossings);
  bool tied = false;
  for (const traffic_line& l : r.traffic.lines) {
    if (l.site.what == traffic_site::phase::transfer || l.site.what == traffic_site::phase::transfer_back) {
      CHECK(l.mesh_axis == 2);
      CHECK(l.executed_calls == 4);
      CHECK(l.executed_bytes > 0);
      CHECK(l.matches());
    }
    if (l.kind == "all-reduce" && l.mesh_axis == 2) {
      CHECK(l.where == "gradient of transformer.wte.weight");
      CHECK(l.executed_calls == 1);
      CHECK(l.matches());
      tied = true;
    }
  }
  CHECK(tied);
}

TEST_CASE("pipelined: GPipe's order (every micro-batch's forward, then every backward) gives the same step") {
  const loaded_plan p = load_plan(pipelined_document_of_tiny(pipeline_schedule::gpipe));
  REQUIRE(p.document.pipeline);
  CHECK(p.document.pipeline->schedule == pipeline_schedule::gpipe);
  // The order the executor follows on each stage: all four forwards before the first backward.
  for (int stage = 0; stage < 2; ++stage) {
    const std::vector<pipeline_pass> order = schedule_passes(pipeline_schedule::gpipe, 2, stage, 4);
    REQUIRE(order.size() == 8);
    for (std::size_t k = 0; k < order.size(); ++k) CHECK(order[k].backward == (k >= 4));
  }
  verify_options training;
  training.training = true;
  const verify_report r = verify_plan(p, training);
  INFO(r);
  CHECK(r.stages == 2);
  CHECK(r.micro_batches == 4);
  CHECK(r.passed());
  std::size_t params = 0;
  for (vertex_t v = 0; v < boost::num_vertices(p.graph()); ++v) params += p.graph()[v].is_parameter() ? 1 : 0;
  CHECK(r.gradients.size() == params);
  CHECK(r.updates.size() == params);
  REQUIRE(r.traffic.checked);
  CHECK(r.traffic.passed());
  for (const traffic_line& l : r.traffic.lines)
    if (l.site.what == traffic_site::phase::transfer || l.site.what == traffic_site::phase::transfer_back) CHECK(l.executed_calls == 4);
}

TEST_CASE("pipelined: a dropped transfer or a stage boundary other than the priced one is caught") {
  const loaded_plan p = load_plan(pipelined_document_of_tiny());
  verify_options vo;  // the forward alone: the transfers and the operators are compared there too
  vo.pipeline = verify_pipeline_of(p);
  REQUIRE(!vo.pipeline->priced.transfers.empty());
  const std::string crossing = p.graph()[vo.pipeline->priced.transfers.front().site.vertex].name;
  SUBCASE("the activation to stage 1 is never sent: stage 1 computes on zeros, and the audit misses the transfer") {
    vo.pipeline->drop_transfer = crossing;
    const verify_report r = verify_plan(p, vo);
    INFO(r);
    CHECK(r.failed > 0);
    CHECK(!r.traffic.passed());
    CHECK(r.traffic.lines[r.traffic.first_mismatch].where == "transfer of " + crossing + " from stage 0 to 1");
  }
  SUBCASE("both layers on stage 1: the result is right, but what crosses is not what was priced") {
    plan_document moved = p.document;
    moved.pipeline->stages[0].layers = 0;
    moved.pipeline->stages[1] = {0, 2, 0.0, 0, 1};
    vo.pipeline->stage_of = stages_of_vertices(moved);
    const verify_report r = verify_plan(p, vo);
    INFO(r);
    CHECK(r.failed == 0);
    CHECK(!r.traffic.passed());
    bool crossing_missing = false;
    for (const traffic_line& l : r.traffic.lines)
      if (l.where == "transfer of " + crossing + " from stage 0 to 1") crossing_missing = l.executed_bytes == 0 && l.priced_bytes > 0;
    CHECK(crossing_missing);
  }
}

TEST_CASE("the estimate of a step of micro-batches counts the gradient accumulators, a pipelined one each stage's copies and transfers") {
  const loaded_plan p = load_plan(pipelined_document_of_tiny());
  const model_graph global = with_batch_seq(p.graph(), graph_batch(p.graph()) * 4, 0);
  const memory_estimate one = estimate_verify_memory(global, p.mesh(), p.strategies, dtype::f64, true, 1);
  const memory_estimate four = estimate_verify_memory(global, p.mesh(), p.strategies, dtype::f64, true, 4);
  // Every rank holds its gradient contributions from the first micro-step's backward to the last's.
  CHECK(four.parameters > one.parameters);
  CHECK(four.activations == one.activations);
  const memory_estimate piped =
      estimate_pipelined_verify_memory(global, p.mesh(), p.strategies, dtype::f64, stages_of_vertices(p.document), true, 4);
  CHECK(piped.sources > four.sources);          // each stage's copy of what it reads (the tied embedding twice)
  CHECK(piped.activations > four.activations);  // the transfers' buffers
  CHECK(piped.ranks > four.ranks);              // 8 ranks, not one stage's 4
}

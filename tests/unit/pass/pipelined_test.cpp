// A training step with pipeline stages priced from each stage's intra-operator plan: the model
// cut to its first layers, the plan's costs per unit adding up to what the pass prices, a
// stage's memory holding the micro-batches 1F1B keeps in flight, and Megatron-LM's published
// 39.1 B row (Narayanan et al. 2021, Table 1) priced as it ran.
#include <doctest/doctest.h>

#include <autoshard/pass/pass.hpp>
#include <autoshard/pass/pipelined.hpp>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

namespace {

autoshard::model_graph small_gpt(int layers, int batch) {
  autoshard::transformer_config c = autoshard::transformer_config::gpt2(layers, 256, 4);
  c.seq = c.max_positions = 128;
  c.vocab = 1024;
  c.ffn = 1024;
  c.batch = batch;
  c.mode = autoshard::run_mode::training;
  return autoshard::build_gpt2(c);
}

autoshard::step_pricing a100() {
  autoshard::step_pricing p;
  p.device = autoshard::find_device_preset("a100-80g")->device;
  p.mode = autoshard::run_mode::training;
  return p;
}

}  // namespace

TEST_CASE("pipelined: a model cut to its first layers is the smaller model of its family") {
  const autoshard::model_graph cut = autoshard::with_layers(small_gpt(5, 4), 2);
  const autoshard::model_graph two = small_gpt(2, 4);
  REQUIRE(boost::num_vertices(cut) == boost::num_vertices(two));
  CHECK(boost::num_edges(cut) == boost::num_edges(two));
  std::set<std::string> a, b;
  for (autoshard::vertex_t v = 0; v < boost::num_vertices(cut); ++v) a.insert(cut[v].name + " " + autoshard::to_string(cut[v].shape));
  for (autoshard::vertex_t v = 0; v < boost::num_vertices(two); ++v) b.insert(two[v].name + " " + autoshard::to_string(two[v].shape));
  CHECK(a == b);
  CHECK_THROWS_AS(autoshard::with_layers(two, 3), autoshard::graph_error);
}

TEST_CASE("pipelined: the units' costs add up to the pass's price, and stage 0 holds p micro-batches in flight") {
  using namespace autoshard;
  const model_graph g = small_gpt(8, 32);
  const device_mesh mesh = make_cluster_mesh({4, 4});
  for (algo a : {algo::megatron, algo::alpa})
    for (recompute_kind r : {recompute_kind::none, recompute_kind::full}) {
      CAPTURE(to_string(a));
      CAPTURE(to_string(r));
      pipeline_config c;
      c.pp = 4;
      c.tp = 2;
      c.micro_batch = 2;
      c.recompute = r;
      const pipelined_step s = price_pipelined(g, mesh, a100(), a, c);
      CHECK(s.config.dp == 2);
      CHECK(s.micro_batches == 8);  // 32 sequences = 2 per rank x 2 ranks x 8
      // The pass prices the two-layer model (one micro-step) as the sum of its units.
      const stage_probe probe = make_stage_probe(g, mesh, a100(), s.config);
      const unit_costs uc = price_units(probe.model->pm, s.stage_plan.choice);
      double sum = 0;
      for (std::size_t u = 0; u < uc.forward.size(); ++u) sum += uc.forward[u] + uc.backward[u] + uc.after[u];
      CHECK(sum == doctest::Approx(s.stage_plan.step_seconds).epsilon(1e-9));
      // 1F1B keeps min(p - k, m) micro-batches of stage k's activations.
      for (int k = 0; k < c.pp; ++k) {
        std::int64_t state = 0, act = 0, transient = 0;
        const int first = s.stages.first[static_cast<std::size_t>(k)];
        for (int i = first; i < first + s.stages.count[static_cast<std::size_t>(k)]; ++i) {
          state += s.units[static_cast<std::size_t>(i)].state_bytes;
          act += s.units[static_cast<std::size_t>(i)].activation_bytes;
          transient = std::max(transient, s.units[static_cast<std::size_t>(i)].transient_bytes);
        }
        CHECK(s.stages.memory[static_cast<std::size_t>(k)] == state + std::min(c.pp - k, s.micro_batches) * act + transient);
        CHECK(s.timeline.in_flight[static_cast<std::size_t>(k)] == std::min(c.pp - k, s.micro_batches));
      }
      // Every later layer costs what the second does; the step is the simulated flush plus what follows it.
      CHECK(s.units[3].seconds == s.units[2].seconds);
      CHECK(s.step_seconds >= s.timeline.seconds + s.shared_sync_seconds);
      CHECK(s.step_seconds <= s.timeline.seconds + s.sync_seconds + s.shared_sync_seconds + 1e-12);
      // The tied embedding and head live on the first and last stages: their gradients are summed.
      CHECK(s.shared_sync_seconds > 0);
    }
  CHECK_THROWS_AS(price_pipelined(g, mesh, a100(), algo::megatron, pipeline_config{3, 2, 0, 1, recompute_kind::none, {}}),
                  solver_error);  // 16 devices are not 3 stages of tp 2
}

TEST_CASE("pipelined: Megatron-LM's 39.1 B row (tp 8, pp 2, 512 A100s, batch 1536) within 20 % of its 138 TFLOP/s") {
  using namespace autoshard;
  transformer_config c = transformer_config::gpt2(48, 8192, 64);
  c.seq = c.max_positions = 2048;
  c.vocab = 51200;
  c.ffn = 4 * 8192;
  c.batch = 1536;
  c.mode = run_mode::training;
  const model_graph g = build_gpt2(c);
  const device_preset& d = *find_device_preset("a100-80g");
  const device_mesh mesh = make_cluster_mesh({64, 8}, {.inter_node_bandwidth = d.inter_node_link(true),
                                                      .intra_node_bandwidth = d.intra_node_link(true)});
  step_pricing p = a100();
  p.attention = attention_kernel::unfused;  // as Megatron-LM ran in 2021, with full recomputation
  pipeline_config run;
  run.pp = 2;
  run.tp = 8;
  run.micro_batch = 1;
  run.recompute = recompute_kind::full;
  const pipelined_step published = price_pipelined(g, mesh, p, algo::megatron, run, {24, 24});
  CHECK(published.micro_batches == 48);
  CHECK(published.fits);
  CHECK(published.tflops_per_device >= 138 * 0.8);
  CHECK(published.tflops_per_device <= 138 * 1.2);
  // The planner, over tensor parallel 8 and micro-batches of one (the test's share of the space):
  // a plan that fits 80 GB and is no slower.
  pipeline_search_options so;
  so.a = algo::megatron;
  so.tp = 8;
  so.micro_batch = 1;
  const pipeline_search r = search_pipelines(g, mesh, p, so);
  REQUIRE(r.best);
  CHECK(r.best->fits);
  CHECK(r.best->peak_memory_bytes <= d.device.memory_bytes);
  CHECK(r.best->step_seconds <= published.step_seconds * (1 + 1e-9));
  CHECK(r.priced + r.pruned_bound + r.pruned_recompute + r.failed == r.configurations);
}

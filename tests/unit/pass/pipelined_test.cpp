// A training step with pipeline stages priced from each stage's intra-operator plan: the model
// cut to its first layers, the plan's costs per unit adding up to what the pass prices, a
// stage's memory holding the micro-batches 1F1B keeps in flight, and Megatron-LM's published
// 39.1 B row (Narayanan et al. 2021, Table 1) priced as it ran.
#include <doctest/doctest.h>

#include <autoshard/pass/pass.hpp>
#include <autoshard/pass/export.hpp>
#include <autoshard/pass/export_megatron.hpp>
#include <autoshard/pass/loaded_plan.hpp>
#include <autoshard/pass/pipelined.hpp>

#include <algorithm>
#include <functional>
#include <cmath>
#include <limits>
#include <map>
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
      // The stage ILP prices the two-layer model as its units' passes m + p - 1 times (the
      // schedule's slots: 8 micro-batches and a bubble of 3) and what runs once after them.
      const stage_probe probe = make_stage_probe(g, mesh, a100(), s.config);
      CHECK(probe.micro_batches == 8);
      CHECK(probe.model->pm.sopt.pricing.micro_batches == 11);
      const unit_costs uc = price_units(probe.model->pm, s.stage_plan.choice);
      double sum = 0;
      for (std::size_t u = 0; u < uc.forward.size(); ++u) sum += 11 * (uc.forward[u] + uc.backward[u]) + uc.after[u];
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
  // A stage of dp 32 x tp 8 spans 32 nodes: communicators of 32 and 8 ranks (688 MiB each, nccl
  // issue 964), one of the 2 stages (544 MiB), beside a CUDA context of 400 MiB.
  CHECK(published.runtime.communicators == 3);
  CHECK(published.runtime.bytes() == (400LL + 688 + 688 + 544) << 20);
  CHECK(published.peak_memory_bytes + published.runtime.bytes() <= d.device.memory_bytes);
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
  CHECK(r.best->peak_memory_bytes + r.best->runtime.bytes() <= d.device.memory_bytes);
  CHECK(r.best->step_seconds <= published.step_seconds * (1 + 1e-9));
  CHECK(r.priced + r.pruned_bound + r.pruned_recompute + r.failed == r.configurations);
}

TEST_CASE("pipelined: the plan document holds every layer in its stage's strategies, the stages and the schedule, and reads back") {
  using namespace autoshard;
  const model_graph g = small_gpt(8, 32);
  const device_mesh mesh = make_cluster_mesh({4, 4});
  pipeline_config c;
  c.pp = 4;
  c.tp = 2;
  c.micro_batch = 2;
  c.recompute = recompute_kind::full;
  c.schedule = pipeline_schedule::gpipe;
  autosharding_options o;
  o.mesh = mesh;
  o.pricing = a100();
  const pipelined_step s = price_pipelined(g, mesh, o.pricing, algo::megatron, c);
  const plan_document d = pipelined_document(g, mesh, s, o);
  REQUIRE(d.pipeline);
  const plan_pipeline& p = *d.pipeline;
  CHECK(p.schedule == pipeline_schedule::gpipe);
  REQUIRE(p.stages.size() == 4);
  int layers = 0;
  for (std::size_t k = 0; k < p.stages.size(); ++k) {
    CHECK(p.stages[k].first_layer == layers);
    layers += p.stages[k].layers;
    // The units of stage k less the embedding (unit 0) and the head (unit 9).
    const int first = s.stages.first[k], last = first + s.stages.count[k] - 1;
    CHECK(p.stages[k].layers == std::min(last, 8) - std::max(first, 1) + 1);
    CHECK(p.stages[k].seconds == s.stages.seconds[k]);
    CHECK(p.stages[k].in_flight == 8);  // GPipe holds every micro-batch: 32 sequences = 2 x 2 ranks x 8
  }
  CHECK(layers == 8);
  CHECK(p.step_seconds == s.step_seconds);
  CHECK(p.transfer_seconds == s.boundary_seconds);
  CHECK(d.cost.objective == s.step_seconds);
  CHECK(d.cost.peak_memory_bytes == s.peak_memory_bytes);
  CHECK(d.options.algo == algo::megatron);
  // One stage's mesh and one micro-step of one stage: 2 sequences on each of 2 data-parallel ranks.
  CHECK(d.mesh.shape() == s.stage_mesh.shape());
  CHECK(graph_batch(d.graph) == 4);
  CHECK(d.pricing.micro_batches == s.micro_batches);
  CHECK(d.pricing.micro_batch == 2);
  CHECK(boost::num_vertices(d.graph) == boost::num_vertices(with_batch_seq(g, 4, 0)));
  // Every layer in the strategies of the stage model's second layer (its first as the first):
  // the loaded plan finds each of them among what its vertex offers, recomputation included.
  const loaded_plan lp = load_plan(d);
  std::size_t full = 0;
  for (vertex_t v = 0; v < boost::num_vertices(d.graph); ++v) {
    CHECK(lp.strategies[v].name == d.tensors[v].strategy);
    full += lp.strategies[v].recompute == recompute_kind::full;
    const std::string& n = d.graph[v].name;
    if (n.find(".h.7.") == std::string::npos) continue;
    std::string in_layer_1 = n;
    in_layer_1.replace(in_layer_1.find(".h.7."), 5, ".h.1.");
    CHECK(d.tensors[v].strategy == d.tensors[*find_vertex(d.graph, in_layer_1)].strategy);
  }
  CHECK(full > 0);  // the configuration's recomputation is in the layers' strategies
  CHECK(plan_from_json(to_json(d), "p.json") == d);
  // The stages of each parameter: a layer's on the stage of its layer, the tied embedding on the first and last.
  const std::vector<std::vector<int>> on = stages_of_parameters(d);
  for (vertex_t v = 0; v < boost::num_vertices(d.graph); ++v) {
    if (!d.graph[v].is_parameter()) {
      CHECK(on[v].empty());
      continue;
    }
    CAPTURE(d.graph[v].name);
    const long i = detail::layer_index(d.graph[v].name);
    if (d.graph[v].name == "transformer.wte.weight") CHECK(on[v] == std::vector<int>{0, 3});
    else if (i < 0 && d.graph[v].name.find("ln_f") != std::string::npos) CHECK(on[v] == std::vector<int>{3});
    else if (i < 0) CHECK(on[v] == std::vector<int>{0});
    else {
      REQUIRE(on[v].size() == 1);
      const plan_stage& st = p.stages[static_cast<std::size_t>(on[v][0])];
      CHECK(i >= st.first_layer);
      CHECK(i < st.first_layer + st.layers);
    }
  }
  plan_document wrong = d;
  wrong.pipeline->stages.back().layers -= 1;
  CHECK_THROWS_WITH_AS(stages_of_parameters(wrong), doctest::Contains("stages hold 7 layers, but its graph has 8"), solver_error);
}

TEST_CASE("pipelined: a plan file's stage times, memory and step are priced again from its strategies and stages, edits shown as differences") {
  using namespace autoshard;
  const model_graph g = small_gpt(8, 32);
  const device_mesh mesh = make_cluster_mesh({4, 4});
  autosharding_options o;
  o.mesh = mesh;
  o.pricing = a100();
  for (const pipeline_schedule sch : {pipeline_schedule::one_f_one_b, pipeline_schedule::gpipe}) {
    CAPTURE(to_string(sch));
    pipeline_config c;
    c.pp = 4;
    c.tp = 2;
    c.micro_batch = 2;
    c.recompute = sch == pipeline_schedule::gpipe ? recompute_kind::full : recompute_kind::selective;
    c.schedule = sch;
    const pipelined_step s = price_pipelined(g, mesh, o.pricing, algo::megatron, c);
    // Read back from its file, as show reads it: every figure the search wrote (a stage's time
    // summed over its units in another order than the partition's search: to the last bits).
    const plan_document d = plan_from_json(to_json(pipelined_document(g, mesh, s, o)), "p.json");
    const plan_pipeline priced = reprice_pipeline(d);
    CHECK(pipeline_differences(*d.pipeline, priced).empty());
    CHECK(priced.step_seconds == doctest::Approx(s.step_seconds).epsilon(1e-12));
    REQUIRE(priced.stages.size() == d.pipeline->stages.size());
    for (std::size_t k = 0; k < priced.stages.size(); ++k) {
      CHECK(priced.stages[k].memory_bytes == d.pipeline->stages[k].memory_bytes);
      CHECK(priced.stages[k].in_flight == d.pipeline->stages[k].in_flight);
      CHECK(priced.stages[k].seconds == doctest::Approx(d.pipeline->stages[k].seconds).epsilon(1e-12));
    }
    // A hand edit of the figures: priced again regardless, each edit named with both numbers.
    plan_document edited = d;
    edited.pipeline->step_seconds *= 0.01;
    edited.pipeline->stages[1].memory_bytes = 1;
    CHECK(pipeline_differences(*d.pipeline, reprice_pipeline(edited)).empty());
    const std::vector<std::string> diff = pipeline_differences(*edited.pipeline, reprice_pipeline(edited));
    REQUIRE(diff.size() == 2);
    CHECK(diff[0] == "step " + human_seconds(s.step_seconds * 0.01) + " (priced " + human_seconds(s.step_seconds) + ")");
    CHECK(diff[1].find("stage 1 memory 1 B") == 0);
    // Stages that cut the layers elsewhere price otherwise (their own step), not as the file says.
    plan_document moved = d;
    moved.pipeline->stages[0].layers += 1;
    moved.pipeline->stages[1].layers -= 1;
    moved.pipeline->stages[1].first_layer += 1;
    const plan_pipeline other = reprice_pipeline(moved);
    CHECK(other.stages[0].seconds > d.pipeline->stages[0].seconds);
    CHECK_FALSE(pipeline_differences(*moved.pipeline, other).empty());
    // A later layer that runs other than the second: the search never writes it, and its
    // figures would not be the plan's. Refused, naming both.
    plan_document odd = d;
    const vertex_t v = *find_vertex(odd.graph, "transformer.h.5.mlp.c_fc");
    const detail::pass_model offered(odd.graph, odd.mesh, odd.pricing, std::nullopt, {}, detail::pass_model::edges_when::deferred);
    const auto other_strategy = std::find_if(offered.strategies[v].begin(), offered.strategies[v].end(),
                                             [&](const strategy& x) { return x.name != odd.tensors[v].strategy; });
    REQUIRE(other_strategy != offered.strategies[v].end());
    const std::string was = odd.tensors[v].strategy;
    odd.tensors[v].strategy = other_strategy->name;
    const std::string refused = "'transformer.h.5.mlp.c_fc' runs " + other_strategy->name + ", but a pipelined plan runs every "
                                "layer after the first as the second, and 'transformer.h.1.mlp.c_fc' runs " + was;
    CHECK_THROWS_WITH_AS(reprice_pipeline(odd), doctest::Contains(refused.c_str()), solver_error);
  }
}

TEST_CASE("pipelined: layers numbered out of the graph's order are refused, not run as stages that feed earlier ones") {
  using namespace autoshard;
  const model_graph g = small_gpt(4, 32);
  const device_mesh mesh = make_cluster_mesh({2, 2});
  pipeline_config c;
  c.pp = 2;
  c.tp = 2;
  c.micro_batch = 2;
  autosharding_options o;
  o.mesh = mesh;
  o.pricing = a100();
  const pipelined_step s = price_pipelined(g, mesh, o.pricing, algo::megatron, c);
  const plan_document d = pipelined_document(g, mesh, s, o);
  CHECK(stages_of_parameters(d).size() == boost::num_vertices(d.graph));
  // Layer 1 renamed 9 throughout the file (graph and tensors): the stages take layers 0 and 2,
  // then 3 and 9, so layer 2 on stage 0 would read layer "9" on stage 1 (verify crashed).
  std::string text = to_json(d).dump();
  for (std::size_t at = text.find(".h.1."); at != std::string::npos; at = text.find(".h.1.", at)) text.replace(at, 5, ".h.9.");
  const plan_document renamed = plan_from_json(nlohmann::json::parse(text), "p.json");
  std::string what;
  try {
    (void)stages_of_parameters(renamed);
  } catch (const graph_error& e) {
    what = e.what();
  }
  CHECK(what.find("graph error: the layers do not run in the order of their numbers: 'transformer.h.9.") == 0);
  CHECK(what.find("(layer 9) feeds 'transformer.h.2.") != std::string::npos);
  CHECK(what.find("(layer 2), which a pipeline would place before it") != std::string::npos);
}

TEST_CASE("pipelined: export --to megatron gives the stages, the first and last stage's own counts, and refuses what Megatron-LM cannot split") {
  using namespace autoshard;
  const model_graph g = small_gpt(8, 32);
  const device_mesh mesh = make_cluster_mesh({4, 4});
  autosharding_options o;
  o.mesh = mesh;
  o.pricing = a100();
  pipeline_config c{.pp = 2, .tp = 2, .dp = 0, .micro_batch = 2, .recompute = recompute_kind::none};
  const pipelined_step s = price_pipelined(g, mesh, o.pricing, algo::megatron, c, std::vector<int>{4, 4});
  loaded_plan lp = load_plan(pipelined_document(g, mesh, s, o));
  const auto args = [](const megatron_export& e) {
    std::map<std::string, std::string> m;
    for (const megatron_argument& a : e.arguments) m[a.flag] = a.value;
    return m;
  };
  megatron_export e = export_megatron(lp);
  REQUIRE(e.problems.empty());
  std::map<std::string, std::string> a = args(e);
  CHECK(e.pp == 2);
  CHECK(e.tp == 2);
  CHECK(e.dp == 4);
  CHECK(a["--pipeline-model-parallel-size"] == "2");
  CHECK(a["--tensor-model-parallel-size"] == "2");
  CHECK(a["--micro-batch-size"] == "2");
  CHECK(a["--global-batch-size"] == "32");  // 2 per rank x 4 data-parallel ranks x 4 micro-batches
  CHECK(a["--num-layers"] == "8");
  CHECK(!a.count("--decoder-first-pipeline-num-layers"));
  CHECK(!a.count("--decoder-last-pipeline-num-layers"));
  // Stages of their own counts, as the plan file says them.
  plan_pipeline& p = *lp.document.pipeline;
  const auto set_layers = [&p](std::vector<int> counts, pipeline_schedule sched = pipeline_schedule::one_f_one_b) {
    p.stages.assign(counts.size(), plan_stage{});
    p.transfer_seconds.assign(counts.size() - 1, 0.0);
    p.schedule = sched;
    int at = 0;
    for (std::size_t k = 0; k < counts.size(); ++k) p.stages[k] = {at, counts[k], 0.0, 0, 1}, at += counts[k];
  };
  set_layers({3, 5});
  a = args(e = export_megatron(lp));
  CHECK(a["--pipeline-model-parallel-size"] == "2");
  CHECK(a["--decoder-first-pipeline-num-layers"] == "3");  // the one stage after it takes the other 5
  CHECK(!a.count("--decoder-last-pipeline-num-layers"));
  set_layers({1, 3, 3, 1});
  a = args(e = export_megatron(lp));
  CHECK(a["--pipeline-model-parallel-size"] == "4");
  CHECK(a["--decoder-first-pipeline-num-layers"] == "1");
  CHECK(a["--decoder-last-pipeline-num-layers"] == "1");
  set_layers({2, 2, 2, 2});
  a = args(e = export_megatron(lp));
  CHECK(a["--pipeline-model-parallel-size"] == "4");
  CHECK(!a.count("--decoder-first-pipeline-num-layers"));
  set_layers({2, 3, 2, 1});
  e = export_megatron(lp);
  REQUIRE(e.problems.size() == 1);
  CHECK(e.problems[0] == "its stages hold 2, 3, 2, 1 layers: Megatron-LM gives the stages between the first and the last as many layers each");
  CHECK_THROWS_WITH_AS(megatron_arguments(e), doctest::Contains("2, 3, 2, 1 layers"), spec_error);
  set_layers({0, 8});
  e = export_megatron(lp);
  REQUIRE(!e.problems.empty());
  CHECK(e.problems[0] == "stage 0 holds embedding without a layer: each of Megatron-LM's stages holds transformer layers");
  set_layers({4, 4}, pipeline_schedule::gpipe);
  e = export_megatron(lp);
  REQUIRE(e.problems.size() == 1);
  CHECK(e.problems[0] == "its stages run the gpipe schedule: Megatron-LM runs 1F1B (its schedule without virtual stages)");
  set_layers({4, 3});
  e = export_megatron(lp);
  REQUIRE(e.problems.size() == 1);
  CHECK(e.problems[0] == "its stages hold 7 layers of the model's 8");
  // The other exports place the whole model on one mesh: refused, naming the stages.
  CHECK_THROWS_WITH_AS(export_tensor_parallel(lp), doctest::Contains("the plan is pipelined (2 stages)"), spec_error);
}

TEST_CASE("pipelined: a model of one layer is refused before any configuration is tried") {
  // Each of its configurations failed alike, and the tool blamed the ILP: "no pipelined
  // configuration could be planned: the ILP found no plan for any of the 10 configurations it
  // tried (...: a pipeline needs a model of at least two repeated layers; ...)".
  const autoshard::model_graph g = small_gpt(1, 8);
  const autoshard::device_mesh mesh(std::vector<int>{2, 2});
  const autoshard::pipeline_search r = autoshard::search_pipelines(g, mesh, a100(), {});
  CHECK(r.configurations == 0);
  CHECK(r.failed == 0);
  CHECK_FALSE(r.best);
  CHECK(r.empty == "no pipelined configuration: a pipeline needs a model of at least two repeated layers, and this one has 1");
  const autoshard::pipeline_config c{1, 2, 2, 1, autoshard::recompute_kind::none, autoshard::pipeline_schedule::one_f_one_b};
  CHECK_THROWS_WITH_AS(autoshard::make_stage_probe(g, mesh, a100(), c),
                       "solver error: a pipeline needs a model of at least two repeated layers, and this one has 1",
                       autoshard::solver_error);
}

TEST_CASE("pipelined: sizes that admit no configuration are refused with the numbers, not as memory") {
  const autoshard::model_graph g = small_gpt(4, 16);
  const autoshard::device_mesh mesh(std::vector<int>{2, 4});
  autoshard::pipeline_search_options so;
  so.pp = 3;  // divides neither the 8 devices nor leaves a stage
  const autoshard::pipeline_search r = autoshard::search_pipelines(g, mesh, a100(), so);
  CHECK(r.configurations == 0);
  CHECK_FALSE(r.best);
  CHECK(r.empty.find("with pp 3") != std::string::npos);
  CHECK(r.empty.find("8 devices, 4 per node") != std::string::npos);
  CHECK(r.empty.find("global batch of 16 and 4 layers") != std::string::npos);
  so.pp = 2;
  so.micro_batch = 3;  // divides no data-parallel rank's share of 16
  const autoshard::pipeline_search m = autoshard::search_pipelines(g, mesh, a100(), so);
  CHECK(m.configurations == 0);
  CHECK(m.empty.find("with pp 2, micro-batch 3") != std::string::npos);
  so.micro_batch = 2;  // a space with configurations says nothing here
  CHECK(autoshard::search_pipelines(g, mesh, a100(), so).empty.empty());
  // A configuration priced directly names what does not factor.
  const autoshard::pipeline_config c{4, 4, 0, 1, autoshard::recompute_kind::none, autoshard::pipeline_schedule::one_f_one_b};
  try {
    autoshard::detail::stage_mesh_of(mesh, c);
    FAIL("pp 4 x tp 4 on 8 devices factored");
  } catch (const autoshard::solver_error& e) {
    const std::string w = e.what();
    CHECK(w.find("pp 4 x tp 4 does not factor") != std::string::npos);
    CHECK(w.find("(pp x tp alone is 16)") != std::string::npos);
    CHECK(w.find("dp 0") == std::string::npos);
  }
}

TEST_CASE("pipelined: a memory budget tightens the search and the stages, and never loosens them past the device") {
  using namespace autoshard;
  const model_graph g = small_gpt(4, 16);
  const device_mesh mesh(std::vector<int>{2, 4});
  pipeline_search_options so;  // two configurations: pp 2, tp 2, micro-batches of 2, recomputed or not
  so.pp = 2;
  so.tp = 2;
  so.micro_batch = 2;
  const pipeline_search free = search_pipelines(g, mesh, a100(), so);
  REQUIRE(free.best);
  CHECK(free.best->budget == free.best->runtime.left_on(a100().device));  // no budget given: the device's
  CHECK(free.best->config.recompute == recompute_kind::none);
  // A budget one byte below the fastest plan's peak: that plan is out, and the answer (Megatron-LM's
  // layout of the same configuration, or recomputation) is within it and no faster.
  so.base.memory_budget = free.best->peak_memory_bytes - 1;
  const pipeline_search tight = search_pipelines(g, mesh, a100(), so);
  REQUIRE(tight.best);
  CHECK(tight.best->budget == free.best->peak_memory_bytes - 1);
  CHECK(tight.best->within_budget);
  CHECK(tight.best->peak_memory_bytes <= *so.base.memory_budget);
  CHECK(tight.best->step_seconds >= free.best->step_seconds);
  for (const pipelined_step& s : tight.alternatives) CHECK(s.peak_memory_bytes <= *so.base.memory_budget);
  // A budget no configuration meets: none is chosen, and the closest says it fits the device
  // but not the budget.
  so.base.memory_budget = 1024;
  const pipeline_search none = search_pipelines(g, mesh, a100(), so);
  CHECK_FALSE(none.best);
  CHECK(none.closest.find("over the memory budget of 1.00 KiB (1024 bytes)") != std::string::npos);
  // One configuration priced under it: it fits the device, is over the budget, and its plan
  // file records the budget its stages were partitioned under.
  autosharding_options base;
  base.memory_budget = 1024;
  const pipelined_step s = price_pipelined(g, mesh, a100(), algo::megatron, pipeline_config{2, 2, 0, 1, recompute_kind::none, {}}, {}, base);
  CHECK(s.fits);
  CHECK_FALSE(s.within_budget);
  CHECK(s.budget == 1024);
  base.pricing = a100();
  base.mesh = mesh;
  CHECK(pipelined_document(g, mesh, s, base).options.memory_budget == 1024);
  // A budget above the device's memory leaves the device's (less the runtime reserve).
  base.memory_budget = a100().device.memory_bytes * 2;
  const pipelined_step big = price_pipelined(g, mesh, a100(), algo::megatron, pipeline_config{2, 2, 0, 1, recompute_kind::none, {}}, {}, base);
  CHECK(big.budget == big.runtime.left_on(a100().device));
  CHECK(big.within_budget);
}

TEST_CASE("pipelined: alpa's search keeps Megatron-LM's layout of a configuration where that step is faster") {
  using namespace autoshard;
  // The stage ILP weighs a micro-step's passes m + p - 1 times against the once-per-step
  // gradient sync, but not the boundaries' sends or the stages' imbalance that the simulated
  // step holds: at pp 2, tp 1, dp 4 and micro-batches of 2 its plan is the slower step.
  const model_graph g = small_gpt(4, 16);
  const device_mesh mesh(std::vector<int>{2, 4});
  const pipeline_config c{2, 1, 4, 2, recompute_kind::none, pipeline_schedule::one_f_one_b};
  const pipelined_step own = price_pipelined(g, mesh, a100(), algo::alpa, c);
  const pipelined_step meg = price_pipelined(g, mesh, a100(), algo::megatron, c);
  REQUIRE(meg.step_seconds < own.step_seconds);
  pipeline_search_options so;
  so.pp = 2;
  so.tp = 1;
  so.micro_batch = 2;
  so.recompute = 1u << static_cast<unsigned>(recompute_kind::none);
  const pipeline_search r = search_pipelines(g, mesh, a100(), so);
  REQUIRE(r.best);
  CHECK(r.best->step_seconds == meg.step_seconds);
  CHECK(r.best->stage_plan.algo == algo::megatron);
}

TEST_CASE("pipelined: megatron_stage_counts lists every split Megatron-LM's arguments express, the even one first") {
  using namespace autoshard;
  // 6 layers in 4 stages: the two between hold 1 layer each (the first and last 4 together) or
  // 2 each (the ends 1 and 1); 4 does not divide 6.
  CHECK(megatron_stage_counts(4, 6) == std::vector<std::vector<int>>{{1, 1, 1, 3}, {2, 1, 1, 2}, {3, 1, 1, 1}, {1, 2, 2, 1}});
  CHECK(megatron_stage_counts(2, 6) == std::vector<std::vector<int>>{{3, 3}, {1, 5}, {2, 4}, {4, 2}, {5, 1}});
  CHECK(megatron_stage_counts(1, 6) == std::vector<std::vector<int>>{{6}});
  CHECK(megatron_stage_counts(7, 6).empty());
  CHECK(megatron_stage_counts(0, 6).empty());
  // Against every composition of the layers into positive stage counts whose stages between the
  // first and the last hold as many each: the same set, each once, the even split first.
  for (int layers : {5, 8, 12})
    for (int pp = 1; pp <= layers; ++pp) {
      CAPTURE(layers);
      CAPTURE(pp);
      std::set<std::vector<int>> all;
      std::vector<int> c(static_cast<std::size_t>(pp), 1);
      const std::function<void(int, int)> compose = [&](int k, int left) {
        if (k + 1 == pp) {
          c[static_cast<std::size_t>(k)] = left;
          bool mid_equal = true;
          for (int i = 2; i + 1 < pp; ++i) mid_equal = mid_equal && c[static_cast<std::size_t>(i)] == c[1];
          if (mid_equal) all.insert(c);
          return;
        }
        for (int n = 1; n <= left - (pp - k - 1); ++n) {
          c[static_cast<std::size_t>(k)] = n;
          compose(k + 1, left - n);
        }
      };
      compose(0, layers);
      const std::vector<std::vector<int>> listed = megatron_stage_counts(pp, layers);
      CHECK(std::set<std::vector<int>>(listed.begin(), listed.end()) == all);
      CHECK(listed.size() == all.size());
      if (layers % pp == 0) CHECK(listed.front() == std::vector<int>(static_cast<std::size_t>(pp), layers / pp));
    }
}

TEST_CASE("pipelined: megatron's search splits the layers as Megatron-LM's arguments can, is the fastest configuration it runs, and exports") {
  using namespace autoshard;
  // 6 layers on 8 devices: 4 stages only as 1, 1, 1, 3 or the like (--decoder-first/last-
  // pipeline-num-layers), 2 stages as 3 and 3 or unevenly. The head (a vocabulary of 32,768)
  // weighs as much as several layers, so the even split's last stage is the slowest.
  transformer_config cfg = transformer_config::gpt2(6, 256, 4);
  cfg.seq = cfg.max_positions = 128;
  cfg.vocab = 32768;
  cfg.ffn = 1024;
  cfg.batch = 16;
  cfg.mode = run_mode::training;
  const model_graph g = build_gpt2(cfg);
  const device_mesh mesh = make_cluster_mesh({2, 4});
  pipeline_search_options so;
  so.a = algo::megatron;
  so.micro_batch = 2;
  so.recompute = 1u << static_cast<unsigned>(recompute_kind::none);
  so.base.mesh = mesh;
  so.base.pricing = a100();
  so.megatron_stages = true;
  const std::vector<pipeline_config> space = detail::pipeline_space(g, map_layers(g), mesh, a100(), so);
  CHECK(std::any_of(space.begin(), space.end(), [](const pipeline_config& c) { return c.pp == 4; }));
  // Each configuration's split: no split its arguments express has a faster slowest stage
  // within the budget; at 2 stages that is not the even one, and the step beats the even split's.
  bool uneven_won = false;
  for (const pipeline_config& c : space) {
    CAPTURE(describe(c, 0));
    const pipelined_step s = price_pipelined(g, mesh, a100(), algo::megatron, c, stage_split::megatron_arguments(), so.base);
    for (const std::vector<int>& counts : megatron_stage_counts(c.pp, 6)) {
      const stage_partition p = detail::given_stages(s, counts, s.config, 6);
      const bool fits = std::all_of(p.memory.begin(), p.memory.end(), [&](std::int64_t m) { return m <= s.budget; });
      if (fits) CHECK(s.stages.slowest <= p.slowest);
    }
    if (c.pp == 2) {
      const pipelined_step even = price_pipelined(g, mesh, a100(), algo::megatron, c, {3, 3}, so.base);
      CHECK(s.stages.count.front() > s.stages.count.back());  // the head's stage holds fewer layers
      CHECK(s.step_seconds < even.step_seconds);
      uneven_won = true;
    }
  }
  CHECK(uneven_won);
  const pipeline_search r = search_pipelines(g, mesh, a100(), so);
  REQUIRE(r.best);
  // The search against every configuration priced on its own: the fastest within the budget is
  // its answer (the bound prunes none that could win).
  double fastest = std::numeric_limits<double>::infinity();
  for (const pipeline_config& c : space) {
    const pipelined_step s = price_pipelined(g, mesh, a100(), algo::megatron, c, stage_split::megatron_arguments(), so.base);
    if (s.within_budget) fastest = std::min(fastest, s.step_seconds);
  }
  CHECK(r.best->step_seconds == fastest);
  std::vector<pipelined_step> steps = r.alternatives;
  steps.insert(steps.begin(), *r.best);
  for (const pipelined_step& s : steps) {
    CAPTURE(describe(s.config, s.micro_batches));
    CHECK(s.stage_plan.algo == algo::megatron);
    const plan_document d = pipelined_document(g, mesh, s, so.base);
    REQUIRE(d.pipeline);
    REQUIRE(d.pipeline->stages.size() == static_cast<std::size_t>(s.config.pp));
    std::vector<int> counts;
    for (const plan_stage& st : d.pipeline->stages) counts.push_back(st.layers);
    const std::vector<std::vector<int>> expressed = megatron_stage_counts(s.config.pp, 6);
    CHECK(std::find(expressed.begin(), expressed.end(), counts) != expressed.end());
    // What it chose, Megatron-LM's arguments say exactly.
    const megatron_export e = export_megatron(load_plan(d));
    CHECK(e.problems.empty());
    CHECK(e.pp == s.config.pp);
    CHECK(e.tp == s.config.tp);
  }
}

TEST_CASE("pipelined: one stage's step is the pass's step of the same plan in m micro-batches, ZeRO-2's per-micro-batch sync included") {
  using namespace autoshard;
  // The pass prices m micro-steps with the gradient accumulated (a sync once per step) or, where
  // the gradient ends sharded over a Partial sum (ZeRO-2's reduce-scatter), synced in every
  // micro-step: one stage's step, built from one micro-batch's share per unit, must agree, for
  // the plan as chosen and with every parameter that offers it stored ZeRO-2.
  const model_graph g = small_gpt(2, 16);
  const device_mesh mesh(std::vector<int>{1, 4});
  const pipeline_config c{1, 1, 4, 1, recompute_kind::none, pipeline_schedule::one_f_one_b};
  const pipelined_step s = price_pipelined(g, mesh, a100(), algo::alpa, c);
  REQUIRE(s.micro_batches == 4);  // 16 sequences = 1 per rank x 4 ranks x 4
  const stage_probe probe = make_stage_probe(g, mesh, a100(), s.config);
  const detail::pass_model& pm = probe.model->pm;
  REQUIRE(pm.sopt.pricing.micro_batches == 4);
  for (int zero : {0, 2}) {
    CAPTURE(zero);
    std::vector<int> choice = s.stage_plan.choice;
    int switched = 0;
    for (vertex_t v = 0; zero == 2 && v < pm.size(); ++v) {  // in the layout it had where it can
      if (!pm.g[v].is_parameter()) continue;
      const strategy& was = pm.strategies[v][static_cast<std::size_t>(choice[v])];
      int any = -1, same = -1;
      for (std::size_t k = 0; k < pm.strategies[v].size(); ++k)
        if (pm.strategies[v][k].zero_stage == 2) {
          if (any < 0) any = static_cast<int>(k);
          if (same < 0 && pm.strategies[v][k].output == was.output) same = static_cast<int>(k);
        }
      if (any >= 0) choice[v] = same >= 0 ? same : any, ++switched;
    }
    const unit_costs uc = price_units(pm, choice);
    double units = 0, after = 0, gathers = 0;
    for (std::size_t u = 0; u < uc.forward.size(); ++u) units += s.micro_batches * (uc.forward[u] + uc.backward[u]) + uc.after[u];
    CHECK(units == doctest::Approx(detail::summarize(pm, algo::alpa, choice).step_seconds).epsilon(1e-9));
    if (zero != 2) continue;
    // A ZeRO-2 parameter's reduce-scatter runs in each micro-batch's backward: what runs after
    // the flush is the all-gathers of the updated weights and the syncs of the parameters that
    // offer no ZeRO-2 (stored plainly, synced once).
    REQUIRE(switched > 0);
    double plain = 0;
    for (vertex_t v = 0; v < pm.size(); ++v) {
      if (!pm.g[v].is_parameter()) continue;
      const strategy& st = pm.strategies[v][static_cast<std::size_t>(choice[v])];
      gathers += st.comm_seconds;
      if (st.zero_stage == 0)
        for (auto [e, end] = boost::out_edges(v, pm.g); e != end; ++e) plain += detail::edge_cost_of(pm, *e, choice).backward;
    }
    for (double a : uc.after) after += a;
    CHECK(gathers > 0);
    CHECK(after == doctest::Approx(gathers + plain).epsilon(1e-12));
  }
}

TEST_CASE("pipelined: where the fastest stage plan's stages do not fit, a plan solved within a limit of memory does") {
  using namespace autoshard;
  // Megatron-LM's layout of pp 2, tp 2, dp 2 with the layers split 2 and 2. A budget one byte
  // below the fastest stage plan's largest stage leaves no other split, so only a leaner stage
  // plan can fit. (On LLaMA-70B that plan is the distributed optimizer: docs/pipelines.md.)
  const model_graph g = small_gpt(4, 16);
  const device_mesh mesh(std::vector<int>{2, 4});
  const pipeline_config c{2, 2, 2, 1, recompute_kind::none, pipeline_schedule::one_f_one_b};
  const stage_split even(std::vector<int>{2, 2});
  const pipelined_step fastest = price_pipelined(g, mesh, a100(), algo::megatron, c, even);
  REQUIRE(fastest.within_budget);
  CHECK_FALSE(fastest.stage_plan_limit);
  autosharding_options base;
  base.memory_budget = fastest.peak_memory_bytes - 1;
  const pipelined_step lean = price_pipelined(g, mesh, a100(), algo::megatron, c, even, base);
  REQUIRE(lean.within_budget);
  REQUIRE(lean.stage_plan_limit);
  CHECK(*lean.stage_plan_limit < fastest.stage_plan.peak_memory_bytes);
  CHECK(lean.stage_plan.peak_memory_bytes <= *lean.stage_plan_limit);
  CHECK(lean.peak_memory_bytes <= *base.memory_budget);
  CHECK(lean.step_seconds >= fastest.step_seconds);  // the limit only takes plans away
  // The same configuration's search keeps it: before, its stage plan alone was tried, over the
  // budget, and the search had only recomputation left.
  pipeline_search_options so;
  so.a = algo::megatron;
  so.pp = 2;
  so.tp = 2;
  so.micro_batch = 1;
  so.megatron_stages = true;
  so.base = base;
  const pipeline_search r = search_pipelines(g, mesh, a100(), so);
  REQUIRE(r.best);
  CHECK(r.best->within_budget);
  CHECK(r.best->step_seconds <= lean.step_seconds);
  // A limit no plan of its stages can meet leaves the fastest plan, flagged over the budget.
  base.memory_budget = 1024;
  const pipelined_step none = price_pipelined(g, mesh, a100(), algo::megatron, c, even, base);
  CHECK_FALSE(none.within_budget);
  CHECK_FALSE(none.stage_plan_limit);
}

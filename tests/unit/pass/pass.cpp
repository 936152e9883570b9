// The auto-sharding pass on GPT-2-shaped graphs. Two layers at GPT-2 124M widths: the ILP's
// size does not depend on the widths, and real widths make the trade-offs real.
#include <doctest/doctest.h>

#include <autoshard/pass/pass.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>
#include "unit/scratch.hpp"

namespace {

autoshard::transformer_config gpt2_small(int batch, autoshard::run_mode mode) {
  auto c = autoshard::transformer_config::gpt2(2, 768, 12);
  c.seq = 1024;
  c.batch = batch;
  c.mode = mode;
  return c;
}

const autoshard::plan_summary& baseline(const autoshard::autosharding_report& r, const std::string& algo) {
  for (const auto& b : r.baselines)
    if (to_string(b.algo) == algo) return b;
  FAIL("no baseline " << algo);
  return r.plan;
}

const autoshard::strategy& chosen(const autoshard::model_graph& g, const autoshard::autosharding_result& r,
                                  const std::string& name) {
  const auto v = autoshard::find_vertex(g, name);
  REQUIRE(v);
  return r.strategies[*v];
}

std::string temp_file(const char* name) { return autoshard_test::unique_temp_path(name).string(); }

/// Training on `shape`, no baselines, the plan written to a fresh temporary `file`.
autoshard::autosharding_options training_to_file(std::vector<int> shape, const char* file) {
  autoshard::autosharding_options o;
  o.pricing.mode = autoshard::run_mode::training;
  o.mesh = autoshard::make_cluster_mesh(std::move(shape));
  o.compare_baselines = false;
  o.ilp_solution_file = temp_file(file);
  return o;
}

}  // namespace

TEST_CASE("GPT-2 inference on 1x4: the Megatron baseline is Megatron's plan, and alpa is no costlier") {
  // 4 ranks: Megatron splits GPT-2's 12 heads whole (8 ranks would cut them; the baseline refuses).
  const autoshard::model_graph g = autoshard::build_gpt2(gpt2_small(1, autoshard::run_mode::inference));
  autoshard::autosharding_options o;
  o.pricing.mode = autoshard::run_mode::inference;
  o.mesh = autoshard::make_cluster_mesh({1, 4});
  o.run_checks = true;
  o.algo = autoshard::algo::megatron;
  const autoshard::autosharding_result meg = autoshard::autosharding_analysis_pass(g, o);
  // Column-parallel c_attn and c_fc (Conv1D weight [in,out] split on dim 1), row-parallel c_proj
  // (weight split on dim 0, output Partial until the next consumer all-reduces it).
  for (const char* col : {"transformer.h.0.attn.c_attn", "transformer.h.1.mlp.c_fc"}) {
    const autoshard::strategy& s = chosen(g, meg, col);
    CHECK(s.inputs[1][1].is_shard(1));
    CHECK(s.output[1].is_shard(2));
  }
  for (const char* row : {"transformer.h.0.attn.c_proj", "transformer.h.1.mlp.c_proj"}) {
    const autoshard::strategy& s = chosen(g, meg, row);
    CHECK(s.inputs[1][1].is_shard(0));
    CHECK(s.output[1].is_partial());
  }
  // Their weights are stored as they are used, sharded on the tensor-parallel axis (not
  // replicated and sliced on use); the row-parallel bias is added once, so it stays replicated.
  auto param_spec = [&](const char* name) { return meg.strategies[*autoshard::find_vertex(g, name)].output; };
  CHECK(param_spec("transformer.h.0.attn.c_attn.weight")[1].is_shard(1));
  CHECK(param_spec("transformer.h.0.attn.c_attn.bias")[1].is_shard(0));
  CHECK(param_spec("transformer.h.1.mlp.c_proj.weight")[1].is_shard(0));
  CHECK(param_spec("transformer.h.1.mlp.c_proj.bias")[1].is_replicate());
  // The Partial outputs of the row-parallel linears are settled on their out-edges.
  bool settles_partial = false;
  for (const auto& c : meg.report.plan.collectives)
    settles_partial |= c.where.find("mlp.c_proj -> ") != std::string::npos &&
                       (c.kind == autoshard::collective::all_reduce || c.kind == autoshard::collective::reduce_scatter);
  CHECK(settles_partial);

  // alpa searches a superset, so it is never costlier. With batch 1 it finds sequence parallelism
  // cheaper: the linears split the sequence (no communication) and attention gathers q, k and v,
  // where Megatron's plan also re-lays the fused c_attn output (the graph's q/k/v slices keep the
  // sliced dim whole, an all-to-all each) and reduce-scatters plus all-gathers the hidden state
  // around both row-parallel linears of every layer.
  o.algo = autoshard::algo::alpa;
  const autoshard::autosharding_result alpa = autoshard::autosharding_analysis_pass(g, o);
  CHECK(alpa.report.plan.step_seconds <= meg.report.plan.step_seconds * (1 + 1e-9));
  CHECK(baseline(alpa.report, "megatron").step_seconds == doctest::Approx(meg.report.plan.step_seconds).scale(1e-9));
  if (alpa.report.plan.step_seconds < meg.report.plan.step_seconds * (1 - 1e-6)) {
    const autoshard::strategy& fc = chosen(g, alpa, "transformer.h.0.mlp.c_fc");
    CHECK(fc.inputs[0][1].is_shard(1));  // the sequence dim of x [B, S, H]
    CHECK(alpa.report.plan.resharding_seconds < meg.report.plan.resharding_seconds);
  }
  CHECK(alpa.report.solver.status == autoshard::solve_status::optimal);
}

TEST_CASE("GPT-2 training on 2x4: the plan costs no more than every baseline") {
  const autoshard::model_graph g = autoshard::build_gpt2(gpt2_small(8, autoshard::run_mode::training));
  autoshard::autosharding_options o;
  o.mesh = autoshard::make_cluster_mesh({2, 4}, {.inter_node_bandwidth = 25e9, .intra_node_bandwidth = 300e9});
  o.pricing.mode = autoshard::run_mode::training;
  o.run_checks = true;
  const autoshard::autosharding_result r = autoshard::autosharding_analysis_pass(g, o);
  const autoshard::autosharding_report& rep = r.report;
  REQUIRE(rep.baselines.size() == 4);
  for (const char* b : {"megatron", "data_parallel", "zero3", "fully_replicated"}) {
    CAPTURE(b);
    REQUIRE(baseline(rep, b).feasible);
    CHECK(rep.plan.step_seconds <= baseline(rep, b).step_seconds * (1 + 1e-9));
  }
  // Training with a split batch needs gradient all-reduces; the breakdown adds up.
  CHECK(rep.plan.communication_seconds > 0.0);
  CHECK(rep.plan.step_seconds ==
        doctest::Approx(rep.plan.compute_seconds + rep.plan.communication_seconds + rep.plan.resharding_seconds).scale(1e-9));
  CHECK(baseline(rep, "fully_replicated").communication_seconds == 0.0);
  CHECK(baseline(rep, "fully_replicated").resharding_seconds == 0.0);
  // Tying the two layers shrinks the ILP's node count.
  CHECK(rep.tied_classes < rep.vertices);
  CHECK(r.strategies.size() == rep.vertices);
  // The same plan without tying is at least as cheap (a superset of plans).
  o.tie_layers = false;
  o.compare_baselines = false;
  const autoshard::autosharding_result untied = autoshard::autosharding_analysis_pass(g, o);
  CHECK(untied.report.tied_classes == untied.report.vertices);
  CHECK(untied.report.plan.step_seconds <= rep.plan.step_seconds * (1 + 1e-9));
}

TEST_CASE("memory budget: a tight budget is met, an impossible one names the smallest budget") {
  const autoshard::model_graph g = autoshard::build_gpt2(gpt2_small(8, autoshard::run_mode::training));
  autoshard::autosharding_options o;
  o.mesh = autoshard::make_cluster_mesh({2, 4});
  o.pricing.mode = autoshard::run_mode::training;
  o.compare_baselines = false;
  o.run_checks = true;
  const auto free = autoshard::autosharding_analysis_pass(g, o);
  o.memory_budget = free.report.plan.peak_memory_bytes * 3 / 4;
  try {
    const auto tight = autoshard::autosharding_analysis_pass(g, o);
    CHECK(tight.report.plan.peak_memory_bytes <= *o.memory_budget);
    CHECK(tight.report.plan.step_seconds >= free.report.plan.step_seconds * (1 - 1e-9));
  } catch (const autoshard::solver_error& e) {  // only when even the smallest plan does not fit
    CHECK(std::string(e.what()).find("does not fit the memory budget") != std::string::npos);
  }
  // Refused before the solver runs, saying what was tried (every micro-batching of the batch of
  // 8, each with its most frugal strategies and recomputation) and what came closest.
  o.memory_budget = 1024;
  CHECK_THROWS_WITH_AS(autoshard::autosharding_analysis_pass(g, o),
                       doctest::Contains("alpa does not fit the memory budget of 1.00 KiB (1024 bytes) per device with "
                                         "recomputation chosen per layer (none, selective, full): tried 4 micro-batchings of "
                                         "the global batch of 8; with the closest, 8 micro-batches of 1 sequence, and every operator "
                                         "at the most memory-frugal strategy it offers, the peak memory per device is at least "),
                       autoshard::solver_error);
}

TEST_CASE("plan files: write, preload, and clear errors when the file does not match") {
  const autoshard::model_graph g = autoshard::build_gpt2(gpt2_small(8, autoshard::run_mode::inference));
  autoshard::autosharding_options o;
  o.pricing.mode = autoshard::run_mode::inference;
  o.mesh = autoshard::make_cluster_mesh({2, 4});
  o.compare_baselines = false;
  o.ilp_solution_file = temp_file("autoshard_plan_test.json");
  const auto solved = autoshard::autosharding_analysis_pass(g, o);
  o.preload_solution = true;
  o.run_checks = true;
  const auto loaded = autoshard::autosharding_analysis_pass(g, o);
  CHECK(loaded.report.plan.choice == solved.report.plan.choice);
  CHECK(loaded.report.plan.step_seconds == doctest::Approx(solved.report.plan.step_seconds).scale(1e-9));
  {
    std::ifstream in(o.ilp_solution_file);
    const nlohmann::json j = nlohmann::json::parse(in);
    CHECK(j["format"] == "autoshard.plan");
    CHECK(j["version"] == 5);
    CHECK(j["mesh"]["axes"].size() == 2);
    CHECK(j["mesh"]["axes"][1]["size"] == 4);
    CHECK(j["tensors"].size() == boost::num_vertices(g));
    CHECK(j["cost"].contains("resharding"));
  }
  // Another mesh.
  o.mesh = autoshard::make_cluster_mesh({1, 8});
  CHECK_THROWS_WITH_AS(autoshard::autosharding_analysis_pass(g, o), doctest::Contains("is for mesh mesh(2,4), not mesh(1,8)"),
                       autoshard::solver_error);
  o.mesh = autoshard::make_cluster_mesh({2, 4});
  // Another graph: a wider model has the same names but other shapes.
  auto wide = gpt2_small(8, autoshard::run_mode::inference);
  wide.hidden = 1024;
  wide.heads = 16;
  wide.ffn = 4096;
  CHECK_THROWS_WITH_AS(autoshard::autosharding_analysis_pass(autoshard::build_gpt2(wide), o),
                       doctest::Contains("has shape"), autoshard::solver_error);
  // A deeper model has operators the file lacks.
  auto deep = gpt2_small(8, autoshard::run_mode::inference);
  deep.layers = 3;
  CHECK_THROWS_WITH_AS(autoshard::autosharding_analysis_pass(autoshard::build_gpt2(deep), o),
                       doctest::Contains("tensors; the graph has"), autoshard::solver_error);
  // Training plans are not inference plans.
  o.pricing.mode = autoshard::run_mode::training;
  CHECK_THROWS_AS(autoshard::autosharding_analysis_pass(autoshard::build_gpt2(gpt2_small(8, autoshard::run_mode::training)), o),
                  autoshard::solver_error);
  o.pricing.mode = autoshard::run_mode::inference;
  // Not JSON / missing file.
  { std::ofstream(o.ilp_solution_file) << "{ not json"; }
  CHECK_THROWS_WITH_AS(autoshard::autosharding_analysis_pass(g, o), doctest::Contains("is not valid JSON"),
                       autoshard::io_error);
  std::filesystem::remove(o.ilp_solution_file);
  CHECK_THROWS_AS(autoshard::autosharding_analysis_pass(g, o), autoshard::io_error);
}

TEST_CASE("a mesh axis of one rank offers only Replicate, and a pin or a plan file with a Shard there means the same layout") {
  using namespace autoshard;
  const model_graph g = build_gpt2(gpt2_small(8, run_mode::training));
  strategy_options so;
  so.pricing.mode = run_mode::training;
  // A one-rank axis multiplies nothing: every vertex offers on 1x8, 8x1 and 1x1x8 exactly the
  // strategies it offers on the flat 8, none splitting or summing over a one-rank axis.
  const auto flat = enumerate_all_strategies(g, make_cluster_mesh({8}), so);
  for (const std::vector<int>& shape : {std::vector<int>{1, 8}, {8, 1}, {1, 1, 8}}) {
    const device_mesh m = make_cluster_mesh(shape);
    CAPTURE(to_string(m));
    const auto all = enumerate_all_strategies(g, m, so);
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
      CAPTURE(g[v].name);
      CHECK(all[v].size() == flat[v].size());
      for (const strategy& s : all[v]) {
        CHECK(whole_on_unit_axes(m, s.output) == s.output);
        for (const sharding_spec& in : s.inputs) CHECK(whole_on_unit_axes(m, in) == in);
      }
    }
  }
  autosharding_options o = training_to_file({1, 8}, "autoshard_unit_axis.json");
  const autosharding_result solved = autosharding_analysis_pass(g, o);
  // A plan file that says S0 on the one-rank axis 0 wherever its output has dim 0 whole (what an
  // older autoshard could write for a tie, or a hand edit) preloads as the same plan.
  nlohmann::json j;
  {
    std::ifstream in(o.ilp_solution_file);
    j = nlohmann::json::parse(in);
  }
  int edited = 0;
  for (nlohmann::json& t : j["tensors"]) {
    std::string name = t["strategy"];
    const std::size_t arrow = name.find("->");
    if (t["shape"].empty() || name.compare(arrow + 2, 1, "R") != 0) continue;
    t["strategy"] = name.replace(arrow + 2, 1, "S0");
    t["output"] = "S0" + t["output"].get<std::string>().substr(1);
    ++edited;
  }
  CHECK(edited > 10);
  std::ofstream(o.ilp_solution_file) << j.dump();
  o.preload_solution = true;
  o.run_checks = true;
  const autosharding_result loaded = autosharding_analysis_pass(g, o);
  CHECK(loaded.report.plan.choice == solved.report.plan.choice);
  CHECK(loaded.report.plan.step_seconds == doctest::Approx(solved.report.plan.step_seconds).scale(1e-12));
  std::filesystem::remove(o.ilp_solution_file);
  // A pin with a Shard on the one-rank axis pins the layout it means.
  o.preload_solution = false;
  o.ilp_solution_file.clear();
  o.pinned["transformer.h.0.mlp.c_fc"] = parse_spec("S0RS1", 2, 3);
  const autosharding_result pinned = autosharding_analysis_pass(g, o);
  CHECK(to_alpa_string(chosen(g, pinned, "transformer.h.0.mlp.c_fc").output) == "RRS1");
  // skip_fully_replicated on one device keeps the whole strategies: there is nothing else.
  o.pinned.clear();
  o.mesh = make_cluster_mesh({1, 1});
  o.skip_fully_replicated = true;
  const autosharding_result one = autosharding_analysis_pass(g, o);
  for (const strategy& s : one.strategies) CHECK(detail::all_replicated(s));
}

TEST_CASE("plan files: a training plan's micro-batch is the one its strategies make, or the file is refused") {
  using namespace autoshard;
  const model_graph g = build_gpt2(gpt2_small(16, run_mode::training));
  autosharding_options o = training_to_file({2, 4}, "autoshard_micro_batch.json");
  const autosharding_result solved = autosharding_analysis_pass(g, o);
  const int mb = solved.report.plan.par.micro_batch;
  CHECK(mb == 16 / solved.report.plan.par.dp);
  plan_document d = read_plan_file(o.ilp_solution_file);
  CHECK(d.pricing.micro_batch == mb);
  CHECK(document_parallelism(d).dp == solved.report.plan.par.dp);
  CHECK(document_parallelism(d).tp == solved.report.plan.par.tp);
  CHECK_NOTHROW(check_micro_batch(d, document_parallelism(d), o.ilp_solution_file));
  CHECK_NOTHROW((void)load_plan(o.ilp_solution_file));
  // Every other micro-batch the reader's bounds let through (2 to 16 on 8 ranks) is refused,
  // by load_plan (export, shard, verify, preload) and by check_micro_batch (show).
  for (int other = 2; other <= 16; ++other) {
    if (other == mb) continue;
    CAPTURE(other);
    d.pricing.micro_batch = other;
    write_plan_file(d, o.ilp_solution_file);
    const std::string want = "pricing.micro_batch is " + std::to_string(other) + ", but its strategies split the graph's micro-step of 16 "
                             "sequences over " + count_noun(solved.report.plan.par.dp, "data-parallel rank") + ": " + std::to_string(mb) + " per rank";
    CHECK_THROWS_WITH_AS((void)load_plan(o.ilp_solution_file), doctest::Contains(want.c_str()), io_error);
    const plan_document edited = read_plan_file(o.ilp_solution_file);
    CHECK_THROWS_WITH_AS(check_micro_batch(edited, document_parallelism(edited), o.ilp_solution_file), doctest::Contains(want.c_str()), io_error);
  }
  d.pricing.micro_batch = 0;  // not recorded: nothing to check
  CHECK_NOTHROW(check_micro_batch(d, document_parallelism(d), o.ilp_solution_file));
  std::filesystem::remove(o.ilp_solution_file);
}

TEST_CASE("options: pinned specs, bad names, time-out, backends") {
  const autoshard::model_graph g = autoshard::build_gpt2(gpt2_small(8, autoshard::run_mode::inference));
  autoshard::autosharding_options o;
  o.pricing.mode = autoshard::run_mode::inference;
  o.mesh = autoshard::make_cluster_mesh({2, 4});
  o.compare_baselines = false;
  o.pinned["transformer.h.0.mlp.c_fc"] = autoshard::parse_spec("RRS1", 2, 3);
  const auto r = autoshard::autosharding_analysis_pass(g, o);
  CHECK(chosen(g, r, "transformer.h.0.mlp.c_fc").output == autoshard::parse_spec("RRS1", 2, 3));
  o.pinned.clear();
  o.pinned["no.such.tensor"] = autoshard::parse_spec("RR", 2, 2);
  CHECK_THROWS_WITH_AS(autoshard::autosharding_analysis_pass(g, o), doctest::Contains("'no.such.tensor' is not a vertex"),
                       autoshard::solver_error);
  o.pinned.clear();
  CHECK(!autoshard::parse_algo("zero"));  // the algos are an enum: a misspelt one never reaches the pass
  o.algo = static_cast<autoshard::algo>(99);
  CHECK_THROWS_WITH_AS(autoshard::autosharding_analysis_pass(g, o), doctest::Contains("algo must be"), autoshard::solver_error);
  o.algo = autoshard::algo::alpa;
  CHECK_THROWS_WITH_AS(autoshard::make_cluster_mesh({2, 4}, {.communications_backend = "mpi"}),
                       doctest::Contains("\"nccl\" or \"gloo\""), autoshard::spec_error);
  o.mesh = autoshard::make_cluster_mesh({2, 4}, {.communications_backend = "gloo"});  // slower links: never cheaper
  const auto gloo = autoshard::autosharding_analysis_pass(g, o);
  CHECK(gloo.report.mesh.link(0) == autoshard::link_model{1e-4, 12.5e9});  // gloo: its latency, half the bandwidth
  o.mesh = autoshard::make_cluster_mesh({2, 4}, {.communications_backend = "nccl"});
  const auto nccl = autoshard::autosharding_analysis_pass(g, o);
  CHECK(gloo.report.plan.step_seconds >= nccl.report.plan.step_seconds * (1 - 1e-9));
  CHECK_THROWS_WITH_AS(autoshard::make_cluster_mesh({1, 2, 2, 2, 1}), doctest::Contains("1 to 4 axes"), autoshard::spec_error);
  o.time_limit = 0;
  CHECK_THROWS_WITH_AS(autoshard::autosharding_analysis_pass(g, o), doctest::Contains("time_limit must be > 0"),
                       autoshard::solver_error);
}

TEST_CASE("plan files: mesh axis names round-trip through the file and load_plan") {
  const autoshard::model_graph g = autoshard::build_gpt2(gpt2_small(1, autoshard::run_mode::inference));
  autoshard::autosharding_options o;
  o.pricing.mode = autoshard::run_mode::inference;
  o.mesh = autoshard::make_cluster_mesh({2, 4});
  o.mesh.set_axis_name(0, "dp").set_axis_name(1, "tp");
  o.compare_baselines = false;
  o.ilp_solution_file = temp_file("autoshard_plan_names.json");
  const auto solved = autoshard::autosharding_analysis_pass(g, o);
  CHECK(to_string(solved.report.mesh) == "mesh(dp=2,tp=4)");
  {
    std::ifstream in(o.ilp_solution_file);
    const nlohmann::json j = nlohmann::json::parse(in);
    CHECK(j["mesh"]["axis_names"] == nlohmann::json({"dp", "tp"}));
  }
  const autoshard::plan_document d = autoshard::read_plan_file(o.ilp_solution_file);
  CHECK(to_string(d.mesh) == "mesh(dp=2,tp=4)");
  const autoshard::loaded_plan lp = autoshard::load_plan(o.ilp_solution_file);
  CHECK(lp.mesh().axis_name(0) == "dp");
  CHECK(lp.mesh().axis_name(1) == "tp");
  // A name the core refuses, or one per axis missing, is a clear error naming the file's member.
  nlohmann::json j;
  {
    std::ifstream in(o.ilp_solution_file);
    j = nlohmann::json::parse(in);
  }
  j["mesh"]["axis_names"] = {"dp", "dp"};
  std::ofstream(o.ilp_solution_file) << j.dump();
  CHECK_THROWS_WITH_AS(autoshard::load_plan(o.ilp_solution_file), doctest::Contains("'dp' names two axes"), autoshard::io_error);
  j["mesh"]["axis_names"] = {"dp"};
  std::ofstream(o.ilp_solution_file) << j.dump();
  CHECK_THROWS_WITH_AS(autoshard::load_plan(o.ilp_solution_file), doctest::Contains("1 names for a mesh of 2 axes"),
                       autoshard::io_error);
  std::filesystem::remove(o.ilp_solution_file);
}

TEST_CASE("plan document: what the pass writes reads back equal, field by field, links included") {
  const autoshard::model_graph g = autoshard::build_gpt2(gpt2_small(8, autoshard::run_mode::training));
  autoshard::autosharding_options o;
  o.mesh = autoshard::make_cluster_mesh({2, 2, 2});
  o.mesh.set_link(0, {3e-5, 20e9});  // three different links: none may collapse into another
  o.mesh.set_link(1, {7e-6, 150e9});
  o.mesh.set_link(2, {2e-6, 450e9});
  o.pricing.mode = autoshard::run_mode::training;
  o.algo = autoshard::algo::data_parallel;  // gradients all-reduced over every axis: each link is priced
  o.pricing.device = autoshard::find_device_preset("h100-80g")->device;  // its runtime figures travel with it
  o.compare_baselines = false;
  o.ilp_solution_file = temp_file("autoshard_plan_document_test.json");
  const auto r = autoshard::autosharding_analysis_pass(g, o);
  const autoshard::plan_document d = autoshard::read_plan_file(o.ilp_solution_file);
  CHECK(d.pricing.device == o.pricing.device);
  CHECK(d.pricing.device.context_bytes == 400LL << 20);
  CHECK(d.mesh == o.mesh);
  for (std::size_t a = 0; a < 3; ++a) CHECK(d.mesh.link(a) == o.mesh.link(a));
  CHECK(d.pricing.mode == autoshard::run_mode::training);
  CHECK(d.options.algo == autoshard::algo::data_parallel);
  CHECK(d.options.time_limit == o.time_limit);
  CHECK(d.options.tie_layers == o.tie_layers);
  CHECK(autoshard::to_json(d.graph) == autoshard::to_json(g));
  REQUIRE(d.tensors.size() == r.strategies.size());
  for (std::size_t v = 0; v < d.tensors.size(); ++v) {
    CAPTURE(g[v].name);
    CHECK(d.tensors[v].strategy == r.strategies[v].name);
    CHECK(d.tensors[v].output == r.strategies[v].output);
    CHECK(d.tensors[v].inputs == r.strategies[v].inputs);
    CHECK(d.tensors[v].local_shape == autoshard::max_local_shape(o.mesh, r.strategies[v].output, g[v].shape));
    CHECK(d.tensors[v].memory_bytes == r.strategies[v].memory_bytes);
  }
  CHECK(d.cost.objective == r.report.plan.step_seconds);
  CHECK(d.cost.communication == r.report.plan.communication_seconds);
  CHECK(d.cost.peak_memory_bytes == r.report.plan.peak_memory_bytes);
  CHECK(d.solver.status == autoshard::to_string(r.report.solver.status));
  CHECK(d.solver.bound == r.report.solver.bound_value());
  // load_plan (verify, the executor) gives back the very strategies, on the links solved with.
  const autoshard::loaded_plan lp = autoshard::load_plan(o.ilp_solution_file);
  CHECK(lp.mesh() == o.mesh);
  for (std::size_t v = 0; v < lp.strategies.size(); ++v) CHECK(lp.strategies[v].name == r.strategies[v].name);

  // An edited plan with a slower link on axis 2 is priced with it, not with the caller's mesh.
  nlohmann::json j;
  {
    std::ifstream in(o.ilp_solution_file);
    j = nlohmann::json::parse(in);
  }
  j["mesh"]["axes"][2]["bandwidth_Bps"] = 45e9;
  std::ofstream(o.ilp_solution_file) << j.dump();
  o.preload_solution = true;
  const auto edited = autoshard::autosharding_analysis_pass(g, o);
  CHECK(edited.report.mesh.link(2) == autoshard::link_model{2e-6, 45e9});
  CHECK(edited.report.mesh.link(0) == o.mesh.link(0));
  CHECK(edited.report.plan.choice == r.report.plan.choice);
  CHECK(edited.report.plan.communication_seconds > r.report.plan.communication_seconds);
  // Priced exactly as a pass on the edited mesh prices the same choice.
  autoshard::autosharding_options e = o;
  e.mesh.set_link(2, {2e-6, 45e9});
  const autoshard::detail::pass_model pm(g, e);
  CHECK(edited.report.plan.step_seconds == autoshard::detail::summarize(pm, autoshard::algo::data_parallel, r.report.plan.choice).step_seconds);
  std::filesystem::remove(o.ilp_solution_file);
}

// ---- Alpa's test_mlp (tests/shard_parallel/test_mlp.py), ported: a 6-layer MLP trained on 4
// devices. Alpa prices bytes only (its alpha is per collective and the same for every plan
// here), so the links have no latency and one collective per tensor (no gradient buckets).
// The devices are slow (1 TFLOP/s) so that replicating compute is never free: every plan
// below shards all compute 4 ways, and communication decides between them.
namespace {

autoshard::model_graph alpa_mlp(int layers, std::int64_t batch, std::int64_t hidden) {
  using namespace autoshard;
  model_graph g;
  vertex_t x = add_input(g, "x", {batch, hidden}, dtype::f32);
  for (int i = 0; i < layers; ++i) {
    const std::string n = "dense." + std::to_string(i);
    const vertex_t w = add_parameter(g, n + ".weight", {hidden, hidden}, dtype::f32);
    const vertex_t b = add_parameter(g, n + ".bias", {hidden}, dtype::f32);
    x = add_op(g, op_kind::linear, n, {x, w, b});
    if (i + 1 < layers) x = add_op(g, op_kind::relu, "relu." + std::to_string(i), {x});
  }
  return g;
}

autoshard::autosharding_options alpa_options(const std::vector<int>& mesh, double inter_bw = 25e9, double intra_bw = 300e9) {
  autoshard::autosharding_options o;
  // No latency, no per-step term: bytes only.
  o.mesh = autoshard::make_cluster_mesh(mesh, {.inter_node_bandwidth = inter_bw,
                                               .intra_node_bandwidth = intra_bw,
                                               .inter_node_latency = 0,
                                               .intra_node_latency = 0,
                                               .inter_node_hop = 0,
                                               .intra_node_hop = 0});
  o.pricing.mode = autoshard::run_mode::training;
  o.pricing.gradient_bucket_bytes = 0;
  o.pricing.zero = false;  // Alpa has no ZeRO (with no latency, ZeRO-2 costs what an all-reduce does)
  o.pricing.gradient_overlap = 0.0;  // nor overlap: its cost model puts every gradient all-reduce on the critical path
  o.pricing.device.peak_flops = 1e12;
  o.compare_baselines = false;
  o.run_checks = true;
  o.tie_layers = false;
  return o;
}

}  // namespace

TEST_CASE("Alpa test_mlp, data-parallel regime: the cost is 6 gradient all-reduces exactly") {
  using namespace autoshard;
  const int layers = 6;
  const model_graph g = alpa_mlp(layers, 256, 32);  // many rows, small weights
  const autosharding_result r = autosharding_analysis_pass(g, alpa_options({4}));
  const device_mesh& m = r.report.mesh;
  // Alpa: num_layers * (all_reduce_cost(hidden * hidden * 4) + all_reduce_cost(hidden * 4)).
  const double ar_w = collective_time(collective::all_reduce, m.link(0), 4, 32.0 * 32 * 4);
  const double ar_b = collective_time(collective::all_reduce, m.link(0), 4, 32.0 * 4);
  CHECK(r.report.plan.communication_seconds == doctest::Approx(layers * (ar_w + ar_b)).epsilon(1e-12));
  CHECK(r.report.plan.resharding_seconds == 0.0);
  for (int i = 0; i < layers; ++i) {
    const strategy& s = chosen(g, r, "dense." + std::to_string(i));
    CHECK(s.inputs[0] == parse_spec("[S(0)]", 1, 2));  // batch split, weights replicated
    CHECK(s.inputs[1].is_replicated());
  }
  // The priced collectives are data the communication audit can compare: 12 all-reduces.
  int grads = 0;
  for (const collective_use& c : r.report.plan.collectives) grads += c.kind == collective::all_reduce;
  CHECK(grads == 2 * layers);
  // All of it hidden behind the backward: nothing charged, but the same collectives still
  // run, so they are still listed (with the bytes the audit compares), at 0 s each.
  autosharding_options hidden = alpa_options({4});
  hidden.pricing.gradient_overlap = 1.0;
  hidden.algo = autoshard::algo::data_parallel;
  const plan_summary h = autosharding_analysis_pass(g, hidden).report.plan;
  CHECK(h.communication_seconds == 0.0);
  REQUIRE(h.collectives.size() == r.report.plan.collectives.size());
  for (std::size_t k = 0; k < h.collectives.size(); ++k) {
    CHECK(h.collectives[k].bytes == r.report.plan.collectives[k].bytes);
    CHECK(h.collectives[k].seconds == 0.0);
  }
}

TEST_CASE("Alpa test_mlp, model-parallel regime: Megatron alternation pays its all-reduces once") {
  using namespace autoshard;
  const int layers = 6;
  const model_graph g = alpa_mlp(layers, 32, 256);  // few rows, big weights
  autosharding_options o = alpa_options({4});
  // Megatron, pinned: column-parallel (output split on its features) then row-parallel
  // (output Partial), three times. Each row -> column boundary all-reduces the activation
  // forward and the column layer's input gradient backward (Megatron's g and f); an
  // all-reduce's backward is free, and the graph input x takes no gradient: 2 x 2 = 4.
  for (int i = 0; i < layers; ++i)
    o.pinned["dense." + std::to_string(i)] = parse_spec(i % 2 == 0 ? "[S(1)]" : "[P]", 1, 2);
  const autosharding_result meg = autosharding_analysis_pass(g, o);
  const device_mesh& m = meg.report.mesh;
  const double ar = collective_time(collective::all_reduce, m.link(0), 4, 32.0 * 256 * 4);
  CHECK(meg.report.plan.resharding_seconds + meg.report.plan.communication_seconds == doctest::Approx(4 * ar).epsilon(1e-12));
  // Alpa's expectation is (num_layers - 1) = 5 all-reduces of batch * hidden (its loss also
  // reduces the last output); the ILP's plan is priced no higher than either.
  o.pinned.clear();
  const autosharding_result alpa = autosharding_analysis_pass(g, o);
  CHECK(alpa.report.plan.step_seconds <= meg.report.plan.step_seconds * (1 + 1e-12));
  CHECK(alpa.report.plan.resharding_seconds + alpa.report.plan.communication_seconds <= 5 * ar * (1 + 1e-12));
}

TEST_CASE("Alpa test_mlp on a 2x2 mesh with links 10x apart: data parallel on the slow axis, Megatron on the fast one") {
  // Per layer, W = h*h*4 and A = b*h*4 bytes, beta on axis 0 and 10 beta on axis 1 (in units
  // of 1/beta, hierarchical reductions): data parallel on 0 + Megatron on 1 costs about
  // 3 W + A / 5 for the six layers (six gradient all-reduces of W / 2 on the slow axis, two
  // row -> column boundaries with an all-reduce of A / 2 forward and one backward on the fast
  // axis), the swap (Megatron on 0, data parallel on 1) 0.3 W + 2 A. With A = 2.25 W
  // (b = 2.25 h) Alpa's plan costs 3.45 W against 4.8 W; the ILP, which
  // also has 2-D tensor parallelism (weights split over both axes, where the first layer's
  // input, a graph input, needs no gradient), returns a plan priced no higher.
  using namespace autoshard;
  const int layers = 6;
  const model_graph g = alpa_mlp(layers, 144, 64);
  autosharding_options o = alpa_options({2, 2}, 1e9, 10e9);  // axis 0 slow, axis 1 fast
  o.pricing.device.peak_flops = 1e10;     // slower links need slower devices for compute to be worth splitting
  auto pinned = [&](const char* column, const char* row) {
    autosharding_options p = o;
    for (int i = 0; i < layers; ++i) p.pinned["dense." + std::to_string(i)] = parse_spec(i % 2 == 0 ? column : row, 2, 2);
    return autosharding_analysis_pass(g, p).report.plan;
  };
  const plan_summary alpa_plan = pinned("[S(0),S(1)]", "[S(0),P]");  // data parallel on 0, Megatron on 1
  const plan_summary swapped = pinned("[S(1),S(0)]", "[P,S(0)]");    // Megatron on 0, data parallel on 1
  auto comm = [](const plan_summary& p) { return p.communication_seconds + p.resharding_seconds; };
  CHECK(alpa_plan.compute_seconds == doctest::Approx(swapped.compute_seconds).scale(1e-9));
  CHECK(comm(alpa_plan) < 0.8 * comm(swapped));
  const autosharding_result r = autosharding_analysis_pass(g, o);
  CHECK(r.report.plan.step_seconds <= alpa_plan.step_seconds * (1 + 1e-12));
  // Every linear splits its weight on the fast axis, as Megatron does.
  for (int i = 0; i < layers; ++i) {
    const strategy& s = chosen(g, r, "dense." + std::to_string(i));
    CAPTURE(s.name);
    CHECK(s.inputs[1][1].is_shard());
  }
}

TEST_CASE("LLaMA-7B training on 2x8, gradient sync behind the backward: tensor parallelism inside the nodes, in 80 GB") {
  // 2 nodes x 8 GPUs, 25 GB/s between the nodes (mesh axis 0), 300 GB/s inside (axis 1): what
  // every LLaMA training recipe does is Megatron's layout, tensor parallel inside the node and
  // data parallel across. With all gradient sync on the critical path (overlap 0) the ILP cuts
  // the projection weights across the nodes instead (docs/autosharding.md shows both plans;
  // a second 32-layer solve here would double this test's time).
  using namespace autoshard;
  const model_graph g = build_llama(transformer_config::llama_7b());
  autosharding_options o;
  o.mesh = make_cluster_mesh({2, 8});
  o.memory_budget = o.pricing.device.memory_bytes;  // the tool's default budget, 80 GiB
  o.compare_baselines = false;
  REQUIRE(o.pricing.gradient_overlap == gradient_overlap_model::behind_backward());  // the default
  const autosharding_result r = autosharding_analysis_pass(g, o);
  CHECK(r.report.plan.fits);
  CHECK(r.report.plan.peak_memory_bytes <= std::int64_t{80} << 30);
  for (const char* layer : {"model.layers.0.", "model.layers.31."}) {
    const std::string l = layer;
    CAPTURE(l);
    // Column-parallel q_proj (its [out, in] weight split on out over the node's 8 GPUs),
    // row-parallel down_proj (split on in); the batch split across the nodes.
    const strategy& q = chosen(g, r, l + "self_attn.q_proj");
    CHECK(q.inputs[1] == parse_spec("S1R", 2, 2));
    CHECK(q.inputs[0] == parse_spec("S0RR", 2, 3));
    const strategy& down = chosen(g, r, l + "mlp.down_proj");
    CHECK(down.inputs[1] == parse_spec("RS1", 2, 2));
    CHECK(down.inputs[0] == parse_spec("S0RS1", 2, 3));
  }
  // No weight of a layer is cut across the nodes.
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].is_parameter() && g[v].name.rfind("model.layers.", 0) == 0) {
      CAPTURE(g[v].name);
      CHECK(!r.strategies[v].output[0].is_shard());
    }
}

TEST_CASE("GPT-2 124M training on 2x4, gradient sync behind the backward: the batch on all 8 devices") {
  using namespace autoshard;
  const model_graph g = build_gpt2(transformer_config::gpt2_124m());
  autosharding_options o;
  o.mesh = make_cluster_mesh({2, 4});  // 25 GB/s between the nodes, 300 GB/s inside
  o.memory_budget = o.pricing.device.memory_bytes;
  o.compare_baselines = false;
  const autosharding_result r = autosharding_analysis_pass(g, o);
  CHECK(r.report.plan.fits);
  for (const char* op : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"})
    for (int layer : {0, 11}) {
      const strategy& s = chosen(g, r, "transformer.h." + std::to_string(layer) + "." + op);
      CAPTURE(s.name);
      CHECK(s.inputs[0] == parse_spec("S01RR", 2, 3));  // the batch over both mesh axes
      CHECK(s.inputs[1].is_replicated());                // the weights whole
    }
}

namespace {
/// One linear: x [64, 1024] f32 (256 KiB), W [1024, 1024] f32 (4 MiB), y [64, 1024] (256 KiB).
autoshard::model_graph one_linear() {
  using namespace autoshard;
  model_graph g;
  const vertex_t x = add_input(g, "x", {64, 1024}, dtype::f32);
  const vertex_t w = add_parameter(g, "w", {1024, 1024}, dtype::f32);
  add_op(g, op_kind::linear, "y", {x, w});
  return g;
}
/// Inference on `devices` devices of 3 MiB each.
autoshard::autosharding_options on_3mib_devices(int devices) {
  autoshard::autosharding_options o;
  o.mesh = autoshard::make_cluster_mesh({devices});
  o.pricing.device.memory_bytes = 3 << 20;
  o.pricing.mode = autoshard::run_mode::inference;
  return o;
}
}  // namespace

TEST_CASE("a plan above the device's memory says it does not fit, and the device's memory as budget finds one that fits") {
  using namespace autoshard;
  // One linear on a device of 3 MiB. Replicated, W alone is 4 MiB: it cannot fit.
  const model_graph g = one_linear();
  autosharding_options o = on_3mib_devices(1);
  o.run_checks = true;
  const autosharding_result one = autosharding_analysis_pass(g, o);
  CHECK(one.report.plan.peak_memory_bytes >= 4 << 20);
  CHECK_FALSE(one.report.plan.fits);
  CHECK(one.report.pricing.device.memory_bytes == 3 << 20);
  std::ostringstream text;
  text << one.report;
  CHECK(text.str().find("DOES NOT FIT: peak") != std::string::npos);
  // On two devices under the device's memory as budget, W is stored split (2 MiB + at most
  // x and y whole, 512 KiB): it fits, and says so.
  o.mesh = make_cluster_mesh({2});
  o.memory_budget = o.pricing.device.memory_bytes;
  const autosharding_result two = autosharding_analysis_pass(g, o);
  CHECK(two.report.plan.fits);
  CHECK(two.report.plan.peak_memory_bytes <= (2 << 20) + (512 << 10));
  CHECK_FALSE(chosen(g, two, "w").output.is_replicated());
  std::ostringstream text2;
  text2 << two.report;
  CHECK(text2.str().find("DOES NOT FIT") == std::string::npos);
  // A device the cost model cannot price is refused by name.
  o.pricing.device.peak_flops = 0;
  CHECK_THROWS_WITH_AS(autosharding_analysis_pass(g, o), doctest::Contains("peak_flops"), solver_error);
}

TEST_CASE("a plan whose tensors fit the device's memory but not beside its runtime reserve does not fit, and the default budget leaves the reserve free") {
  using namespace autoshard;
  // The linear of the test above on 2 devices of 3 MiB: any plan stores W split (at least 2 MiB)
  // or whole (4 MiB). Beside a CUDA context of 1 MiB and one communicator of 512 KiB (the mesh's
  // one axis of 2 ranks; no pair figure: the communicator's), 1.5 MiB are left: no plan fits.
  const model_graph g = one_linear();
  autosharding_options o = on_3mib_devices(2);
  o.pricing.device.context_bytes = 1 << 20;
  o.pricing.device.communicator_bytes = 512 << 10;
  o.compare_baselines = false;
  o.memory_budget = o.pricing.device.memory_bytes;  // stated: the tensors may use all 3 MiB
  const autosharding_result r = autosharding_analysis_pass(g, o);
  CHECK(r.report.plan.peak_memory_bytes <= 3 << 20);
  CHECK(r.report.plan.peak_memory_bytes >= 2 << 20);
  CHECK(r.report.plan.runtime.communicators == 1);
  CHECK(r.report.plan.runtime.bytes() == (1 << 20) + (512 << 10));
  CHECK_FALSE(r.report.plan.fits);
  std::ostringstream text;
  text << r.report;
  CHECK(text.str().find("per device + 1.50 MiB runtime (CUDA context, 1 NCCL communicator) > the device's 3.00 MiB") !=
        std::string::npos);
  // The default budget is the memory less the reserve, 1.5 MiB: no plan, said so.
  CHECK(default_memory_budget(o) == (3 << 20) - (1 << 20) - (512 << 10));
  o.memory_budget = default_memory_budget(o);
  CHECK_THROWS_WITH_AS(autosharding_analysis_pass(g, o), doctest::Contains("does not fit the memory budget of 1.50 MiB"), solver_error);
  // A reserve of 512 KiB (256 KiB + 256 KiB) leaves 2.5 MiB: the plan fits beside it.
  o.pricing.device.context_bytes = o.pricing.device.communicator_bytes = 256 << 10;
  CHECK(default_memory_budget(o) == (5 << 20) / 2);
  o.memory_budget = default_memory_budget(o);
  const autosharding_result fits = autosharding_analysis_pass(g, o);
  CHECK(fits.report.plan.fits);
  CHECK(fits.report.plan.peak_memory_bytes + (512 << 10) <= 3 << 20);
}

TEST_CASE("ZeRO: under a budget plain data parallelism cannot meet, the weights go ZeRO-1 or -2, and the ZeRO-3 baseline moves 1.5x the bytes") {
  using namespace autoshard;
  // Two f32 [1024, 1024] weights (n = 2^20 elements each, 16 B per element with Adam) trained
  // data-parallel on 8 ranks: every activation pinned batch-split, so each linear takes its
  // weight whole. Per weight: plain 16n, ZeRO-1 8n + 8n/8 = 9n, ZeRO-2 4n + 12n/8 = 5.5n,
  // ZeRO-3 2n. A budget of 20n per device leaves both weights ZeRO-1 or -2 (18n or less;
  // plain + ZeRO-3, 18n too, moves 5 volumes where two ZeRO-1/2 weights move 4).
  const model_graph g = alpa_mlp(2, 64, 1024);
  autosharding_options o;
  o.mesh = make_cluster_mesh({8});
  o.pricing.mode = run_mode::training;
  o.pricing.gradient_bucket_bytes = 0;  // every collective its own latency: the plain formulas
  o.pricing.gradient_overlap = 0.0;     // none hidden behind the backward: the ZeRO paper counts volumes
  o.run_checks = true;
  o.tie_layers = false;
  for (const char* v : {"dense.0", "relu.0", "dense.1"}) o.pinned[v] = parse_spec("[S(0)]", 1, 2);
  const std::int64_t n = 1 << 20;
  o.memory_budget = 20 * n;
  const autosharding_result r = autosharding_analysis_pass(g, o);
  const device_mesh& m = r.report.mesh;
  const double W = 4.0 * n, b = 4.0 * 1024;  // bytes of a weight and of a bias
  for (const char* w : {"dense.0.weight", "dense.1.weight"}) {
    const strategy& s = chosen(g, r, w);
    CAPTURE(s.name);
    CHECK(s.output.is_replicated());
    CHECK((s.zero_stage == 1 || s.zero_stage == 2));
  }
  // Each weight: its gradient reduce-scattered and its update all-gathered; each bias (too
  // small to matter for memory) all-reduced.
  const double rs = collective_time(collective::reduce_scatter, m.link(0), 8, W);
  const double ag = collective_time(collective::all_gather, m.link(0), 8, W);
  const double ar_b = collective_time(collective::all_reduce, m.link(0), 8, b);
  CHECK(r.report.plan.communication_seconds == doctest::Approx(2 * (rs + ag) + 2 * ar_b).epsilon(1e-12));
  CHECK(r.report.plan.resharding_seconds == 0.0);
  CHECK(r.report.plan.peak_memory_bytes <= 20 * n);

  // Bytes only (no latency): ZeRO-3 gathers each parameter for the forward and again for the
  // backward and reduce-scatters its gradient, 3 volumes against plain data parallelism's
  // all-reduce, 2: 1.5x (the ZeRO paper's 3 Psi against 2 Psi), holding 1/8 of the state.
  o.mesh = make_cluster_mesh({8}, {.intra_node_latency = 0, .intra_node_hop = 0});
  o.memory_budget.reset();
  const autosharding_result free = autosharding_analysis_pass(g, o);
  const plan_summary& dp = baseline(free.report, "data_parallel");
  const plan_summary& z3 = baseline(free.report, "zero3");
  REQUIRE(dp.feasible);
  REQUIRE(z3.feasible);
  // (The forward gather of a stored shard is its edge's resharding; the rest communication.)
  auto moved = [](const plan_summary& p) { return p.communication_seconds + p.resharding_seconds; };
  CHECK(dp.resharding_seconds == 0.0);
  CHECK(dp.communication_seconds > 0.0);
  CHECK(moved(z3) == doctest::Approx(1.5 * moved(dp)).epsilon(1e-12));
  CHECK(z3.compute_seconds == doctest::Approx(dp.compute_seconds).epsilon(1e-12));
  const double params = 2.0 * n + 2.0 * 1024;
  CHECK(static_cast<double>(dp.peak_memory_bytes - z3.peak_memory_bytes) == doctest::Approx(16.0 * params * 7 / 8).epsilon(1e-9));
}

TEST_CASE("tied layers: the tied problem counts memory exactly (inference activations live one layer at a time)") {
  // LLaMA-7B widths, 4 layers, inference on 1x8: tying the layers must not change any plan's
  // peak memory nor the smallest budget that can be met (the problem untied is the truth).
  auto c = autoshard::transformer_config::llama_7b();
  c.layers = 4;
  c.seq = 512;
  c.batch = 1;
  c.mode = autoshard::run_mode::inference;
  const autoshard::model_graph g = autoshard::build_llama(c);
  autoshard::autosharding_options o;
  o.mesh = autoshard::make_cluster_mesh({1, 8});
  o.pricing.mode = autoshard::run_mode::inference;
  const autoshard::detail::pass_model pm(g, o);
  std::size_t classes = 0;
  const std::vector<std::size_t> cls = autoshard::detail::layer_classes(pm, true, classes);
  REQUIRE(classes < pm.size());
  const autoshard::strategy_problem q = autoshard::detail::quotient(pm.problem, cls, classes);
  CHECK(q.min_peak_usage().bytes == pm.problem.min_peak_usage().bytes);
  // Any tied choice (each class's first strategy, then its last) peaks as the untied one.
  for (const bool last : {false, true}) {
    std::vector<int> tied(q.nodes.size(), 0), full(pm.size(), 0);
    for (std::size_t k = 0; k < classes; ++k) tied[k] = last ? static_cast<int>(q.nodes[k].costs.size()) - 1 : 0;
    for (std::size_t k = classes; k < q.nodes.size(); ++k)  // a shadow takes its class's strategy
      tied[k] = tied[q.edges[q.edges.size() - (q.nodes.size() - k)].from];
    for (std::size_t v = 0; v < pm.size(); ++v) full[v] = tied[cls[v]];
    CHECK(q.peak_usage(tied).bytes == pm.problem.peak_usage(full).bytes);
    CHECK(q.cost_of(tied) == pm.problem.cost_of(full));
  }
}

namespace {
/// LLaMA (3 layers) in training, every recomputation offered, the gradient sync hidden behind
/// the consumer's backward: the model whose edge pricing the tests below compare.
autoshard::model_graph pricing_llama() {
  auto c = autoshard::transformer_config::llama(3, 64, 4, 2, 128);
  c.seq = 16;
  c.vocab = 64;
  c.batch = 4;
  c.mode = autoshard::run_mode::training;
  return autoshard::build_llama(c);
}
autoshard::step_pricing pricing_llama_step() {
  autoshard::step_pricing p;
  p.mode = autoshard::run_mode::training;
  p.recompute = autoshard::recompute_policy::choose;
  p.gradient_overlap = autoshard::gradient_overlap_model::behind_backward();
  return p;
}

/// Edge `e`'s costs as pm.problem should hold them: each pair's own resharding cost
/// (resharding_costs alone), forbidden where the layer's recomputation is not tied or (with
/// `allow`) a strategy is not allowed, in the problem's unit. Counts the pairs priced (`priced`)
/// and those the ties forbid (`untied`).
std::vector<std::int64_t> priced_alone(const autoshard::detail::pass_model& pm, autoshard::edge_t e,
                                       const autoshard::detail::pass_model::strategy_mask* allow, std::size_t& priced,
                                       std::size_t& untied) {
  const autoshard::model_graph& g = pm.g;
  const autoshard::vertex_t u = boost::source(e, g), v = boost::target(e, g);
  const autoshard::cost_matrix alone = autoshard::resharding_costs(g, e, pm.strategies[u], pm.strategies[v], pm.mesh, pm.sopt);
  std::vector<std::int64_t> want;
  for (std::size_t i = 0; i < alone.rows; ++i)
    for (std::size_t j = 0; j < alone.cols; ++j) {
      const bool both = allow == nullptr || ((*allow)[u][i] && (*allow)[v][j]);
      const bool tied = autoshard::recompute_consistent(pm.layers, u, v, pm.strategies[u][i], pm.strategies[v][j]);
      priced += both ? 1 : 0;
      untied += tied ? 0 : 1;
      want.push_back(autoshard::to_cost_units(both && tied ? alone(i, j) : std::numeric_limits<double>::infinity(), pm.problem.cost_unit));
    }
  return want;
}
}  // namespace

TEST_CASE("pricing a model's edges: repeated layers priced once are every edge priced alone, bit for bit") {
  // LLaMA in training on 2 x 2, every recomputation offered, ZeRO variants, the gradient sync
  // hidden behind the consumer's backward: each problem edge's costs are its own matrix
  // (resharding_costs, a layer's recomputation tied), as the pass priced it before it copied
  // alike edges, in the problem's cost unit.
  const autoshard::model_graph g = pricing_llama();
  const autoshard::detail::pass_model pm(g, autoshard::make_cluster_mesh({2, 2}), pricing_llama_step());
  REQUIRE(pm.layers.indices.size() == 3);
  std::size_t k = 0, priced = 0, forbidden = 0;
  for (auto [e, end] = boost::edges(g); e != end; ++e, ++k) {
    const std::string edge = g[boost::source(*e, g)].name + " -> " + g[boost::target(*e, g)].name;  // INFO cannot capture e (Clang 14)
    INFO(edge);
    CHECK(pm.problem.edges[k].costs == priced_alone(pm, *e, nullptr, priced, forbidden));
  }
  CHECK(forbidden > 0);  // the layers' recomputation ties are part of what is copied
}

TEST_CASE("pricing for one algo alone: the pairs of the strategies it allows as every pair priced, the rest forbidden") {
  // megatron's layout allows a few of a vertex's strategies: a pass that solves it alone
  // (compare_baselines off) prices their pairs only. Each is the pair's own resharding cost, in
  // the problem's unit; asked for more than the mask allowed, the model prices every pair.
  const autoshard::model_graph g = pricing_llama();
  autoshard::detail::pass_model pm(g, autoshard::make_cluster_mesh({2, 2}), pricing_llama_step(), std::nullopt, {},
                                   autoshard::detail::pass_model::edges_when::deferred);
  autoshard::detail::solve_request rq;
  rq.a = autoshard::algo::megatron;
  rq.tp_axis = 1;
  const autoshard::detail::pass_model::strategy_mask allow = autoshard::detail::algo_mask(pm, rq, false);
  const auto check_edges = [&](const autoshard::detail::pass_model::strategy_mask* mask) {
    std::size_t k = 0, priced = 0, pairs = 0, untied = 0;
    for (auto [e, end] = boost::edges(g); e != end; ++e, ++k) {
      const std::string edge = g[boost::source(*e, g)].name + " -> " + g[boost::target(*e, g)].name;
      INFO(edge);
      const std::vector<std::int64_t> want = priced_alone(pm, *e, mask, priced, untied);
      pairs += want.size();
      CHECK(pm.problem.edges[k].costs == want);
    }
    return std::pair{priced, pairs};
  };
  pm.price_edges({}, &allow);
  REQUIRE(pm.edges_priced());
  const auto [priced, pairs] = check_edges(&allow);
  CHECK(priced * 20 < pairs);  // megatron's pairs are a small part of the whole
  pm.price_edges({}, &allow);  // the same mask again: nothing to do
  check_edges(&allow);
  autoshard::detail::solve_request alpa = rq;
  alpa.a = autoshard::algo::alpa;
  const autoshard::detail::pass_model::strategy_mask wider = autoshard::detail::algo_mask(pm, alpa, false);
  pm.price_edges({}, &wider);  // more than the mask allowed: every pair
  CHECK(check_edges(nullptr).first == pairs);
}

TEST_CASE("tied layers: in inference, four more layers add only their weights to the smallest peak") {
  // Inference activations are live one layer at a time, so four more LLaMA-7B layers add only
  // their weights, each cut 8 ways at its most frugal: 4 x (4 d^2 + 3 d f + 2 d) bf16 values / 8
  // (LLaMA's published per-layer count: q, k, v, o; gate, up, down; two RMSNorm weights).
  const auto smallest = [](int layers) {
    auto c = autoshard::transformer_config::llama_7b();
    c.layers = layers;
    c.seq = 512;
    c.batch = 1;
    c.mode = autoshard::run_mode::inference;
    autoshard::autosharding_options o;
    o.mesh = autoshard::make_cluster_mesh({1, 8});
    o.pricing.mode = autoshard::run_mode::inference;
    const autoshard::model_graph g = autoshard::build_llama(c);  // pass_model keeps a reference
    const autoshard::detail::pass_model pm(g, o);
    std::size_t classes = 0;
    const std::vector<std::size_t> cls = autoshard::detail::layer_classes(pm, true, classes);
    return autoshard::detail::quotient(pm.problem, cls, classes).min_peak_usage().bytes;
  };
  const std::int64_t d = 4096, f = 11008;
  CHECK(smallest(8) - smallest(4) == 4 * (4 * d * d + 3 * d * f + 2 * d) * 2 / 8);
}

TEST_CASE("plan files: the training settings the pass priced with travel in the file and price the plan read back") {
  // Non-default settings: sgd, 1 MiB buckets, half the gradient sync overlapped, no ZeRO-1/2.
  auto c = gpt2_small(8, autoshard::run_mode::training);
  c.layers = 1;
  c.seq = 128;
  const autoshard::model_graph g = autoshard::build_gpt2(c);
  autoshard::autosharding_options o;
  o.mesh = autoshard::make_cluster_mesh({2, 4});
  o.pricing.mode = autoshard::run_mode::training;
  o.compare_baselines = false;
  o.pricing.optimizer = autoshard::optimizer_kind::sgd;
  o.pricing.gradient_bucket_bytes = 1 << 20;
  o.pricing.gradient_overlap = 0.5;
  o.pricing.zero = false;
  o.ilp_solution_file = temp_file("autoshard_train_settings.json");
  const auto solved = autoshard::autosharding_analysis_pass(g, o);
  const autoshard::loaded_plan lp = autoshard::load_plan(o.ilp_solution_file);
  CHECK(lp.document.pricing.optimizer == autoshard::optimizer_kind::sgd);
  CHECK(lp.document.pricing.gradient_bucket_bytes == 1 << 20);
  CHECK(lp.document.pricing.gradient_overlap == 0.5);
  CHECK(!lp.document.pricing.zero);
  // Re-priced from the file alone (what verify audits against): the pass's collectives,
  // gradient sync halved by the overlap included. Some gradient sync is priced at all.
  const auto& want = solved.report.plan.collectives;
  REQUIRE(lp.collectives.size() == want.size());
  bool any_gradient = false;
  for (std::size_t k = 0; k < want.size(); ++k) {
    CAPTURE(want[k].where);
    CHECK(lp.collectives[k].seconds == doctest::Approx(want[k].seconds).epsilon(1e-12));
    any_gradient = any_gradient || want[k].where.rfind("gradient of ", 0) == 0;
  }
  CHECK(any_gradient);
  // Preloaded by the pass with default options, the plan keeps the step time it was solved at.
  autoshard::autosharding_options p;
  p.mesh = o.mesh;
  p.pricing.mode = o.pricing.mode;
  p.compare_baselines = false;
  p.preload_solution = true;
  p.ilp_solution_file = o.ilp_solution_file;
  CHECK(autoshard::autosharding_analysis_pass(g, p).report.plan.step_seconds ==
        doctest::Approx(solved.report.plan.step_seconds).epsilon(1e-12));
  std::remove(o.ilp_solution_file.c_str());
}

TEST_CASE("defaults: one pricing value with one run mode, gradient overlap and bucket, from one home each") {
  using namespace autoshard;
  // The choice (issue 18): what the CLI always planned for and what users of an auto-sharder
  // mostly plan, training; ten minutes per solve. tests/tool/cli_test.sh checks the tool
  // against these same constants.
  static_assert(default_run_mode == run_mode::training);
  static_assert(default_time_limit_s == 600.0);
  CHECK(step_pricing{}.mode == default_run_mode);
  CHECK(transformer_config{}.mode == default_run_mode);
  CHECK(transformer_config::llama_7b().mode == default_run_mode);  // the presets start from it too
  CHECK(read_hf_config(nlohmann::json::parse(R"({"model_type": "gpt2", "n_layer": 1, "n_embd": 64, "n_head": 4,
                                                 "vocab_size": 128})"))
            .config.mode == default_run_mode);
  // The pass's options, the cost model's and the plan document hold the pricing whole.
  CHECK(strategy_options{}.pricing == step_pricing{});
  CHECK(autosharding_options{}.pricing == step_pricing{});
  const plan_document empty_plan;  // named: GCC 12 at -O3 warns (maybe-uninitialized) on a temporary's map
  CHECK(empty_plan.pricing == step_pricing{});
  CHECK(solve_options{}.time_limit == default_time_limit_s);
  CHECK(autosharding_options{}.time_limit == default_time_limit_s);
  CHECK(plan_options{}.time_limit == default_time_limit_s);  // the plan area's record, below the solver
  // Gradient sync hidden behind each consumer's backward, as DDP and Megatron-LM run it; a plan
  // file from before it was recorded keeps the price it was solved at (none hidden).
  static_assert(default_gradient_overlap == gradient_overlap_model::behind_backward());
  CHECK(step_pricing{}.gradient_overlap == default_gradient_overlap);
  CHECK(legacy_pricing().gradient_overlap == gradient_overlap_model(0.0));
  // DDP's 25 MiB bucket, from its one home too.
  static_assert(default_gradient_bucket_bytes == 25.0 * (1 << 20));
  CHECK(step_pricing{}.gradient_bucket_bytes == default_gradient_bucket_bytes);
  CHECK(legacy_pricing().gradient_bucket_bytes == default_gradient_bucket_bytes);
  CHECK(autosharding_options{}.algo == plan_options{}.algo);

  // What that means end to end: a decoder built and planned with every default is a training
  // plan (labels, loss, the backward's compute and the optimizer's state priced), and the plan
  // file says so.
  transformer_config c = transformer_config::gpt2(1, 64, 4);
  c.seq = 16;
  c.batch = 8;
  c.vocab = 128;
  c.max_positions = 16;
  const model_graph g = build_gpt2(c);
  REQUIRE(find_vertex(g, "loss"));
  autosharding_options o;
  o.mesh = make_cluster_mesh({2});
  o.compare_baselines = false;
  o.algo = autoshard::algo::fully_replicated;  // the same plan in both modes: only its price differs
  o.ilp_solution_file = temp_file("autoshard_default_mode.json");
  const autosharding_result r = autosharding_analysis_pass(g, o);
  const plan_document d = read_plan_file(o.ilp_solution_file);
  std::filesystem::remove(o.ilp_solution_file);
  CHECK(d.pricing.mode == run_mode::training);
  CHECK(d.options.time_limit == default_time_limit_s);
  // ... priced as the defaults say, with the micro-batching the planner chose recorded: the
  // batch of 8 in one step, 8 sequences on the one data-parallel rank of a replicated plan.
  step_pricing chosen;
  chosen.micro_batches = 1;
  chosen.micro_batch = 8;
  CHECK(d.pricing == chosen);
  // plan_options' defaults are what a default pass records, field by field (its algo aside).
  plan_options recorded;
  recorded.algo = o.algo;
  CHECK(d.options == recorded);
  autosharding_options forward = o;
  forward.pricing.mode = run_mode::inference;
  forward.ilp_solution_file.clear();
  const autosharding_result f = autosharding_analysis_pass(g, forward);
  CHECK(r.report.plan.compute_seconds > 2.5 * f.report.plan.compute_seconds);  // forward + backward: about 3x
  CHECK(r.report.plan.peak_memory_bytes > f.report.plan.peak_memory_bytes);    // gradients, Adam's moments
}

TEST_CASE("Megatron splits whole heads: a head count tp does not divide is refused, fewer key/value heads are replicated") {
  auto small = [](int heads, int kv, autoshard::run_mode mode) {
    auto c = autoshard::transformer_config::llama(2, heads * 8, heads, kv, 128);
    c.seq = 16;
    c.batch = 4;
    c.vocab = 256;
    c.mode = mode;
    return c;
  };
  autoshard::autosharding_options o;
  o.mesh = autoshard::make_cluster_mesh({4});
  o.algo = autoshard::algo::megatron;
  o.compare_baselines = false;
  // Qwen2-0.5B's 14 heads on 4 ranks: q_proj would be cut at 3.5 heads.
  CHECK_THROWS_WITH_AS((void)autoshard::autosharding_analysis_pass(autoshard::build_llama(small(14, 2, o.pricing.mode)), o),
                       doctest::Contains("'model.layers.0.self_attn.attention' has 14 attention heads, which the 4 ranks"),
                       autoshard::solver_error);
  // 3 key/value heads on 4 ranks neither split nor replicate evenly.
  CHECK_THROWS_WITH_AS((void)autoshard::autosharding_analysis_pass(autoshard::build_llama(small(12, 3, o.pricing.mode)), o),
                       doctest::Contains("3 key/value heads"), autoshard::solver_error);
  // 2 key/value heads on 4 ranks: their projections whole on every rank (priced so), the query heads split.
  for (auto mode : {autoshard::run_mode::inference, autoshard::run_mode::training}) {
    o.pricing.mode = mode;
    const autoshard::model_graph g = autoshard::build_llama(small(8, 2, mode));
    const autoshard::autosharding_result r = autoshard::autosharding_analysis_pass(g, o);
    for (const char* kv : {"model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.v_proj"}) {
      CAPTURE(kv);
      CHECK(chosen(g, r, kv).output.is_replicated());
      CHECK(chosen(g, r, std::string(kv) + ".weight").output.is_replicated());
    }
    CHECK(chosen(g, r, "model.layers.1.self_attn.q_proj.weight").output[0].is_shard(0));
    const autoshard::strategy& a = chosen(g, r, "model.layers.1.self_attn.attention");
    CHECK(a.inputs[0][0].is_shard(2));
    CHECK(a.inputs[1][0].is_replicate());
    CHECK(a.output[0].is_shard(2));
    // Priced replicated: k_proj (a quarter of q_proj's width) computes and stores all of it on
    // every rank, as much as q_proj's quarter, 4x what a split k_proj would.
    const autoshard::strategy& q = chosen(g, r, "model.layers.1.self_attn.q_proj");
    const autoshard::strategy& k = chosen(g, r, "model.layers.1.self_attn.k_proj");
    CHECK(k.compute_seconds == doctest::Approx(q.compute_seconds));
    CHECK(chosen(g, r, "model.layers.1.self_attn.k_proj.weight").memory_bytes ==
          chosen(g, r, "model.layers.1.self_attn.q_proj.weight").memory_bytes);
  }
}

TEST_CASE("numbers: a plan is proven optimal only where rounding its costs hides no faster plan") {
  // The solver works in whole units of the largest finite cost / 2^40. On a link of a byte a
  // second, that cost is an edge of 10^5 s and the unit 10^-7 s, so the operators' costs of
  // microseconds rounded away: `plan --inter-bw 1` on 2x4 was "optimal" at 4.97 ms beside a
  // plan of 3.64 ms that never uses the slow link (what the same model plans at 1e9 B/s).
  using namespace autoshard;
  transformer_config c;  // GPT-2 small's sizes, two layers
  c.layers = 2;
  const model_graph g = build_gpt2(c);
  const auto plan_with = [&g](double inter_bw) {
    autosharding_options o;
    cluster_links links;
    links.inter_node_bandwidth = inter_bw;
    o.mesh = make_cluster_mesh({2, 4}, links);
    o.memory_budget = std::int64_t{1} << 30;
    o.compare_baselines = false;
    return autosharding_analysis_pass(g, o).report;
  };
  const autosharding_report fast = plan_with(1e9);
  for (const collective_use& u : fast.plan.collectives)
    REQUIRE(u.mesh_axis != 0);  // the slow link is not used: the plan costs the same at 1 B/s
  CHECK(fast.solver.status == solve_status::optimal);  // a sane link: nothing hidden
  const autosharding_report slow = plan_with(1.0);
  if (slow.plan.step_seconds > fast.plan.step_seconds * (1 + 1e-9)) CHECK(slow.solver.status != solve_status::optimal);
  CHECK(slow.solver.bound_value() <= fast.plan.step_seconds);  // a bound is a proven bound
  CHECK(slow.solver.bound_value() >= 0.0);
}

TEST_CASE("tied layers: attention cores of other sliding windows are not tied (Qwen2's full layers, then sliding ones)") {
  auto c = autoshard::transformer_config::llama(3, 64, 4, 4, 128);
  c.seq = 32;
  c.batch = 2;
  c.vocab = 256;
  c.sliding_window = 8;
  c.max_window_layers = 1;  // layer 0 full, layers 1 and 2 within a window of 8
  const autoshard::model_graph g = autoshard::build_llama(c);
  autoshard::autosharding_options o;
  o.mesh = autoshard::make_cluster_mesh({1, 2});
  const autoshard::detail::pass_model pm(g, o);
  std::size_t classes = 0;
  const std::vector<std::size_t> cls = autoshard::detail::layer_classes(pm, true, classes);
  const auto at = [&](const std::string& name) { return cls[*autoshard::find_vertex(g, name)]; };
  CHECK(at("model.layers.1.self_attn.attention") == at("model.layers.2.self_attn.attention"));
  CHECK(at("model.layers.0.self_attn.attention") != at("model.layers.1.self_attn.attention"));
  CHECK(at("model.layers.0.self_attn.o_proj") == at("model.layers.1.self_attn.o_proj"));  // the rest of the layer still is
}

namespace {
/// One decode step of LLaMA-7B's widths with 2 layers: 8 sequences, one new token each after
/// `past` cached ones; and the pass's options for it on one node of `ranks`.
autoshard::model_graph llama_7b_step(std::int64_t past) {
  autoshard::transformer_config c = autoshard::transformer_config::llama_7b();
  c.layers = 2;
  c.batch = 8;
  c.seq = 1;
  c.past = past;
  c.mode = autoshard::run_mode::inference;
  return autoshard::build_llama(c);
}
autoshard::autosharding_options inference_on_one_node(int ranks) {
  autoshard::autosharding_options o;
  o.pricing.mode = autoshard::run_mode::inference;
  o.mesh = autoshard::make_cluster_mesh({1, ranks});
  o.compare_baselines = false;
  o.run_checks = true;
  return o;
}
}  // namespace

TEST_CASE("a decode step after a key/value cache: the cache split with the heads and live the whole step") {
  // 4,096 cached tokens on one node of 4: the cache (2 x 2 x 8 x 4,096 x 4,096 x 2 B = 2 GiB)
  // is the step's memory.
  const autoshard::model_graph g = llama_7b_step(4096), plain = llama_7b_step(0);
  autoshard::autosharding_options o = inference_on_one_node(4);
  const autoshard::autosharding_result r = autoshard::autosharding_analysis_pass(g, o);
  for (const char* layer : {"model.layers.0", "model.layers.1"}) {
    const autoshard::strategy& att = chosen(g, r, std::string(layer) + ".self_attn.attention");
    REQUIRE(att.inputs.size() == 5);
    CHECK(att.inputs[3][1].is_shard(2));  // the cache's heads, as the step's keys
    CHECK(att.inputs[1] == att.inputs[3]);
  }
  // Each cache input stores its quarter: 8 x 4,096 x 4,096 x 2 B / 4 = 64 MiB, and is live
  // from the step's start to its end, as a weight is.
  const autoshard::detail::pass_model pm(g, o);
  const std::int64_t quarter = std::int64_t{8} * 4096 * 4096 * 2 / 4;
  for (const char* name : {"past_key_values.0.key", "past_key_values.1.value"}) {
    const autoshard::vertex_t v = *autoshard::find_vertex(g, name);
    CHECK(r.strategies[v].output[1].is_shard(2));
    CHECK(r.strategies[v].memory_bytes == quarter);
    CHECK(pm.problem.nodes[v].live.begin == 0);
    CHECK(pm.problem.nodes[v].live.end == static_cast<std::int64_t>(boost::num_vertices(g)));
  }
  // Megatron's plan of the same step without the cache peaks exactly the 4 caches' quarters lower.
  o.algo = autoshard::algo::megatron;
  const autoshard::autosharding_result with = autoshard::autosharding_analysis_pass(g, o), without = autoshard::autosharding_analysis_pass(plain, o);
  CHECK(with.report.plan.peak_memory_bytes - without.report.plan.peak_memory_bytes == 4 * quarter);
  // Reading the cache is the step's largest cost: more than the weights' 2 x 0.4 GB per rank.
  CHECK(with.report.plan.compute_seconds > without.report.plan.compute_seconds * 1.5);
}

TEST_CASE("an inference plan stores each weight as its consumer reads it, where that costs the same") {
  // The ILP prices time and bounds memory: holding a weight whole and slicing it locally (free)
  // for a consumer that reads a shard cost it the same as holding the shard. LLaMA-70B on 1x8
  // kept three of each layer's seven weights whole that way (78 GiB for a 16 GiB plan). Every
  // weight read by one operator is now stored in the spec that operator reads it in.
  const autoshard::model_graph g = llama_7b_step(0);
  const autoshard::autosharding_result r = autoshard::autosharding_analysis_pass(g, inference_on_one_node(8));
  int sharded = 0;
  for (autoshard::vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    if (!g[v].is_parameter() || boost::out_degree(v, g) != 1) continue;
    const auto e = *boost::out_edges(v, g).first;
    const autoshard::sharding_spec& read = r.strategies[boost::target(e, g)].inputs[static_cast<std::size_t>(g[e].operand)];
    CHECK_MESSAGE(r.strategies[v].output == read, g[v].name << " is stored " << to_alpa_string(r.strategies[v].output) << " but read "
                                                            << to_alpa_string(read));
    sharded += !read[1].is_replicate();
  }
  CHECK(sharded >= 14);  // the 7 weights of each layer's linears
  CHECK(r.report.solver.status == autoshard::solve_status::optimal);
}

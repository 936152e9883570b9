// Plans exported as transformers' tp_plan and PyTorch's parallelize_module plan: the Megatron
// baselines of GPT-2 and LLaMA against the plans transformers ships (tests/data/export).
#include <doctest/doctest.h>

#include <autoshard/pass/export.hpp>
#include <autoshard/pass/pass.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include "unit/scratch.hpp"

namespace {

nlohmann::json shipped(const std::string& model) {
  std::ifstream in(std::string(AUTOSHARD_TEST_DATA_DIR) + "/export/hf_tp_plans.json");
  REQUIRE(in);
  return nlohmann::json::parse(in).at(model);
}

/// Solved in the mode the graph was built for (a training graph ends in its loss).
autoshard::loaded_plan solve_and_load(const autoshard::model_graph& g, const std::string& algo, std::vector<int> mesh,
                                      std::vector<std::string> names = {}) {
  autoshard::autosharding_options o;
  o.pricing.mode = autoshard::find_vertex(g, "loss") ? autoshard::run_mode::training : autoshard::run_mode::inference;
  o.mesh = autoshard::make_cluster_mesh(mesh);
  for (std::size_t a = 0; a < names.size(); ++a) o.mesh.set_axis_name(a, names[a]);
  o.algo = *autoshard::parse_algo(algo);
  o.compare_baselines = false;
  o.ilp_solution_file = autoshard_test::unique_temp_path("export_" + algo + ".json").string();
  (void)autoshard::autosharding_analysis_pass(g, o);
  autoshard::loaded_plan p = autoshard::load_plan(o.ilp_solution_file);  // the one plan reader
  std::filesystem::remove(o.ilp_solution_file);
  return p;
}

autoshard::transformer_config small_llama(autoshard::run_mode mode) {
  auto c = autoshard::transformer_config::llama(3, 256, 8, 8, 688);
  c.seq = 64;
  c.batch = 8;
  c.vocab = 512;
  c.mode = mode;
  return c;
}

autoshard::transformer_config small_gpt2(autoshard::run_mode mode) {
  auto c = autoshard::transformer_config::gpt2(3, 256, 8);
  c.seq = 64;
  c.batch = 8;
  c.vocab = 512;
  c.max_positions = 64;
  c.mode = mode;
  return c;
}

}  // namespace

TEST_CASE("export: LLaMA's Megatron plan is the tp_plan transformers ships") {
  for (auto mode : {autoshard::run_mode::inference, autoshard::run_mode::training}) {
    for (const std::vector<int>& mesh : {std::vector<int>{4}, std::vector<int>{2, 4}}) {
      CAPTURE(mesh.size());
      const auto p = solve_and_load(autoshard::build_llama(small_llama(mode)), "megatron", mesh);
      const autoshard::tp_export e = autoshard::export_tensor_parallel(p);
      CHECK(e.problems.empty());
      CHECK(e.tp_axis == static_cast<int>(mesh.size()) - 1);
      const nlohmann::json hf = autoshard::to_hf_tp_plan(e);
      const nlohmann::json want = shipped("llama");
      CHECK(hf["base_model_prefix"] == want["base_model_prefix"]);
      CHECK(hf["base_model_tp_plan"] == want["base_model_tp_plan"]);
      CHECK(hf["format"] == "autoshard.hf_tp_plan");
      CHECK(hf["tp_size"] == 4);
      // The full-model plan holds the same modules under the base model's prefix.
      for (const auto& [k, v] : want["base_model_tp_plan"].items()) CHECK(hf["tp_plan"]["model." + k] == v);
    }
  }
}

TEST_CASE("export: GPT-2's Megatron plan is Megatron-LM's documented partition (transformers ships none)") {
  const auto p = solve_and_load(autoshard::build_gpt2(small_gpt2(autoshard::run_mode::training)), "megatron", {2, 4});
  const autoshard::tp_export e = autoshard::export_tensor_parallel(p);
  CHECK(e.problems.empty());
  const nlohmann::json hf = autoshard::to_hf_tp_plan(e);
  const nlohmann::json want = shipped("gpt2");
  CHECK(hf["base_model_prefix"] == want["base_model_prefix"]);
  CHECK(hf["base_model_tp_plan"] == want["base_model_tp_plan"]);
  // The notes say what the strings leave out: GPT-2's Conv1D stores its weights [in,out].
  bool conv1d_noted = false;
  for (const auto& n : hf["notes"]) conv1d_noted = conv1d_noted || n.get<std::string>().find("Conv1D") != std::string::npos;
  CHECK(conv1d_noted);
  // PyTorch's ColwiseParallel and RowwiseParallel take nn.Linear only: the dtensor export
  // refuses, naming the modules, instead of writing a plan that would not apply.
  CHECK_THROWS_WITH_AS(autoshard::to_dtensor_plan(e), doctest::Contains("'transformer.h.0.attn.c_attn' (linear): its weight is stored [in,out]"),
                       autoshard::spec_error);
}

TEST_CASE("export: the dtensor plan carries the layouts, Megatron's sequence parallelism included") {
  const auto p = solve_and_load(autoshard::build_llama(small_llama(autoshard::run_mode::training)), "megatron", {2, 4}, {"dp", "tp"});
  const autoshard::tp_export e = autoshard::export_tensor_parallel(p);
  REQUIRE(e.problems.empty());
  const nlohmann::json j = autoshard::to_dtensor_plan(e);
  CHECK(j["format"] == "autoshard.dtensor_plan");
  CHECK(j["tp_axis_name"] == "tp");
  CHECK(j["mesh"] == "mesh(dp=2,tp=4)");
  const nlohmann::json& plan = j["plan"];
  for (int layer = 0; layer < 3; ++layer) {
    const std::string l = "model.layers." + std::to_string(layer) + ".";
    for (const char* col : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"}) {
      CAPTURE(col);
      REQUIRE(plan.contains(l + col));
      CHECK(plan[l + col]["style"] == "ColwiseParallel");
      CHECK(plan[l + col]["kwargs"]["output_layouts"] == "Shard(-1)");
    }
    for (const char* row : {"self_attn.o_proj", "mlp.down_proj"}) {
      CAPTURE(row);
      REQUIRE(plan.contains(l + row));
      CHECK(plan[l + row]["style"] == "RowwiseParallel");
      CHECK(plan[l + row]["kwargs"]["input_layouts"] == "Shard(-1)");
      // Replicate() (an all-reduce) or Shard(d) (a reduce-scatter, e.g. into a sequence parallel region).
      const std::string out = plan[l + row]["kwargs"]["output_layouts"];
      CAPTURE(out);
      CHECK((out == "Replicate()" || out.rfind("Shard(", 0) == 0));
    }
  }
  // Every module the plan lists is one the graph has, and every style is one PyTorch has.
  for (const auto& item : plan.items()) {
    const std::string mod = item.key();
    const auto& entry = item.value();
    CAPTURE(mod);
    CHECK(autoshard::find_vertex(p.graph(), mod).has_value());
    const std::string style = entry["style"];
    CHECK((style == "ColwiseParallel" || style == "RowwiseParallel" || style == "SequenceParallel"));
  }
}

TEST_CASE("export: what no style expresses is reported, not approximated") {
  // Weights split over two mesh axes (2-D tensor parallelism): hand-made from the Megatron plan.
  auto p = solve_and_load(autoshard::build_llama(small_llama(autoshard::run_mode::inference)), "megatron", {2, 4});
  const auto w = autoshard::find_vertex(p.graph(), "model.layers.1.mlp.up_proj.weight");
  const auto up = autoshard::find_vertex(p.graph(), "model.layers.1.mlp.up_proj");
  REQUIRE((w && up));
  p.strategies[*w].output = autoshard::parse_spec("S01R", 2, 2);
  p.strategies[*up].inputs[1] = autoshard::parse_spec("S01R", 2, 2);
  const autoshard::tp_export e = autoshard::export_tensor_parallel(p);
  REQUIRE(e.problems.size() == 1);
  CHECK(e.problems[0].find("'model.layers.1.mlp.up_proj' (linear)") != std::string::npos);
  CHECK(e.problems[0].find("2-D tensor parallelism") != std::string::npos);
  CHECK_THROWS_WITH_AS(autoshard::to_hf_tp_plan(e), doctest::Contains("1 operator(s) no parallel style expresses"), autoshard::spec_error);
  CHECK_THROWS_AS(autoshard::to_dtensor_plan(e), autoshard::spec_error);
  // A weight kept as partial sums.
  p.strategies[*w].output = autoshard::parse_spec("[R,P]", 2, 2);
  p.strategies[*up].inputs[1] = autoshard::parse_spec("[R,P]", 2, 2);
  const autoshard::tp_export e2 = autoshard::export_tensor_parallel(p);
  REQUIRE(e2.problems.size() == 1);
  CHECK(e2.problems[0].find("Partial") != std::string::npos);
  // An axis the mesh lacks.
  CHECK_THROWS_AS(autoshard::export_tensor_parallel(p, 2), autoshard::spec_error);
}

TEST_CASE("export: a fully replicated plan exports an empty plan, a data-parallel one too") {
  for (const char* algo : {"fully_replicated", "data_parallel"}) {
    CAPTURE(algo);
    const auto p = solve_and_load(autoshard::build_llama(small_llama(autoshard::run_mode::training)), algo, {2, 4});
    const autoshard::tp_export e = autoshard::export_tensor_parallel(p);
    CHECK(e.problems.empty());
    CHECK(autoshard::to_hf_tp_plan(e)["tp_plan"].empty());
    CHECK(autoshard::to_dtensor_plan(e)["plan"].empty());
  }
}

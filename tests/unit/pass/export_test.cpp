// Plans exported as PyTorch's parallelize_module plan and transformers' tp_plan: what each
// style and layout is for a plan, and what is refused. tests/client/exports_test.py applies
// the exports in PyTorch and transformers and compares with the unsharded model.
#include <doctest/doctest.h>

#include <autoshard/graph/hf_config.hpp>
#include <autoshard/pass/export.hpp>
#include <autoshard/pass/pass.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include "unit/scratch.hpp"

namespace {

using autoshard::export_target;
using nlohmann::literals::operator""_json_pointer;

nlohmann::json shipped(const std::string& model) {
  std::ifstream in(std::string(AUTOSHARD_TEST_DATA_DIR) + "/export/hf_tp_plans.json");
  REQUIRE(in);
  return nlohmann::json::parse(in).at(model);
}

struct solve_with {
  std::string algo = "megatron";
  std::vector<int> mesh{4};
  std::vector<std::string> names{};
  bool no_latency = false;  ///< links with no latency: the cost model then picks sequence parallelism at small sizes
  std::map<std::string, std::string> pins{};
  int micro_batches = 0;  ///< training: 0, the planner chooses
  bool tie_layers = true;
};

/// Solved in the mode the graph was built for (a training graph ends in its loss).
autoshard::loaded_plan solve_and_load(const autoshard::model_graph& g, const solve_with& w) {
  autoshard::autosharding_options o;
  o.pricing.mode = autoshard::find_vertex(g, "loss") ? autoshard::run_mode::training : autoshard::run_mode::inference;
  autoshard::cluster_links links;
  if (w.no_latency) links.inter_node_latency = links.intra_node_latency = links.inter_node_hop = links.intra_node_hop = 0;
  o.mesh = autoshard::make_cluster_mesh(w.mesh, links);
  for (std::size_t a = 0; a < w.names.size(); ++a) o.mesh.set_axis_name(a, w.names[a]);
  for (const auto& [name, spec] : w.pins)
    o.pinned[name] = autoshard::parse_spec(spec, static_cast<int>(w.mesh.size()),
                                           static_cast<int>(g[*autoshard::find_vertex(g, name)].shape.rank));
  o.algo = *autoshard::parse_algo(w.algo);
  o.pricing.micro_batches = w.micro_batches;
  o.tie_layers = w.tie_layers;
  o.compare_baselines = false;
  o.ilp_solution_file = autoshard_test::unique_temp_path("export_" + w.algo + ".json").string();
  (void)autoshard::autosharding_analysis_pass(g, o);
  autoshard::loaded_plan p = autoshard::load_plan(o.ilp_solution_file);  // the one plan reader
  std::filesystem::remove(o.ilp_solution_file);
  return p;
}

/// LLaMA `c`'s plan of a step without a key/value cache and of the same step after one of 16
/// tokens, each solved as `w` says: what a decode plan's export is compared with.
std::pair<autoshard::loaded_plan, autoshard::loaded_plan> prefill_and_decode(autoshard::transformer_config c, const solve_with& w) {
  c.past = 0;
  autoshard::loaded_plan prefill = solve_and_load(autoshard::build_llama(c), w);
  c.past = 16;
  return {std::move(prefill), solve_and_load(autoshard::build_llama(c), w)};
}

autoshard::tp_export exported(const autoshard::loaded_plan& p, export_target t, int transformers = 5) {
  autoshard::export_options o;
  o.target = t;
  o.transformers_major = transformers;
  return autoshard::export_tensor_parallel(p, o);
}

autoshard::transformer_config small_llama(autoshard::run_mode mode, int layers = 3) {
  auto c = autoshard::transformer_config::llama(layers, 256, 8, 8, 688);
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

bool mentions(const std::vector<std::string>& v, const std::string& a, const std::string& b) {
  for (const std::string& s : v)
    if (s.find(a) != std::string::npos && s.find(b) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("export: LLaMA's Megatron plan is the tp_plan transformers ships, every module named") {
  for (auto mode : {autoshard::run_mode::inference, autoshard::run_mode::training}) {
    for (const std::vector<int>& mesh : {std::vector<int>{4}, std::vector<int>{2, 4}}) {
      CAPTURE(mesh.size());
      const auto p = solve_and_load(autoshard::build_llama(small_llama(mode)), {.mesh = mesh});
      const autoshard::tp_export e = exported(p, export_target::hf);
      CHECK(e.problems.empty());
      CHECK(e.tp_axis == static_cast<int>(mesh.size()) - 1);
      const nlohmann::json hf = autoshard::to_hf_tp_plan(e);
      const nlohmann::json want = shipped("llama");
      CHECK(hf["base_model_prefix"] == want["base_model_prefix"]);
      CHECK(hf["format"] == "autoshard.hf_tp_plan");
      CHECK(hf["transformers"] == 5);
      CHECK(hf["tp_size"] == 4);
      for (const auto& [k, v] : want["base_model_tp_plan"].items()) {
        CHECK(hf["base_model_tp_plan"][k] == v);
        CHECK(hf["tp_plan"]["model." + k] == v);  // the full model's names, layer numbers as *
      }
      // The vocabulary's modules are named too, as Megatron-LM lays them out: embed_tokens split
      // on the vocabulary, lm_head column-parallel over it (its logits gathered where
      // transformers computes the loss), the class's own plan.
      CHECK(hf["tp_plan"]["model.embed_tokens"] == "embedding_rowwise");
      CHECK(hf["tp_plan"]["lm_head"] == "colwise_gather_output");
      CHECK(hf["tp_plan"].size() == want["base_model_tp_plan"].size() + 2);
    }
  }
}

TEST_CASE("export: GPT-2's Conv1D weights are refused by both targets, naming the modules") {
  const auto p = solve_and_load(autoshard::build_gpt2(small_gpt2(autoshard::run_mode::training)), {.mesh = {2, 4}});
  for (export_target t : {export_target::dtensor, export_target::hf}) {
    const autoshard::tp_export e = exported(p, t);
    CHECK(mentions(e.problems, "'transformer.h.0.attn.c_attn' (linear)", "stored [in,out]"));
    CHECK(mentions(e.problems, "'transformer.h.2.mlp.c_proj' (linear)", "stored [in,out]"));
    if (t == export_target::dtensor)
      CHECK_THROWS_WITH_AS(autoshard::to_dtensor_plan(e), doctest::Contains("'transformer.h.0.attn.c_attn' (linear): its weight is stored [in,out]"),
                           autoshard::spec_error);
    else
      CHECK_THROWS_AS(autoshard::to_hf_tp_plan(e), autoshard::spec_error);
  }
}

TEST_CASE("export: Megatron's sequence parallelism in PyTorch's layouts") {
  // Links with no latency, one norm pinned on the sequence: the Megatron plan of this small
  // LLaMA runs every layer's norms sequence parallel (Megatron-LM's switch is all or none),
  // reduce-scatters into those regions on tp and reads the logits vocabulary-parallel in its loss.
  auto c = autoshard::transformer_config::llama(3, 64, 8, 8, 128);
  c.seq = 16;
  c.batch = 8;
  c.vocab = 256;
  c.mode = autoshard::run_mode::training;
  const auto p = solve_and_load(autoshard::build_llama(c), {.mesh = {2, 4}, .names = {"dp", "tp"}, .no_latency = true,
                                                            .pins = {{"model.layers.1.post_attention_layernorm", "S0S1R"}}});
  const autoshard::tp_export e = exported(p, export_target::dtensor);
  REQUIRE(e.problems.empty());
  const nlohmann::json j = autoshard::to_dtensor_plan(e);
  CHECK(j["format"] == "autoshard.dtensor_plan");
  CHECK(j["version"] == 5);
  CHECK(j["fsdp"].is_null());  // no parameter is stored ZeRO-3
  CHECK(j["tp_axis_name"] == "tp");
  CHECK(j["mesh_shape"] == nlohmann::json::array({2, 4}));
  CHECK(j["mesh_dim_names"] == nlohmann::json::array({"dp", "tp"}));
  const nlohmann::json& plan = j["plan"];
  int reduce_scatters = 0, sequence_norms = 0;
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
      reduce_scatters += plan[l + row]["kwargs"]["output_layouts"] == "Shard(1)";
    }
    for (const char* norm : {"input_layernorm", "post_attention_layernorm"})
      sequence_norms += plan.contains(l + norm) && plan[l + norm]["style"] == "SequenceParallel";
  }
  CHECK(reduce_scatters > 0);
  CHECK(sequence_norms == 6);
  // The vocabulary-parallel embedding reduce-scatters into the first layer's sequence slices
  // itself: PyTorch's RowwiseParallel on an nn.Embedding leaves a MaskPartial, which it cannot
  // hand over as Partial() (torchtitan's output_layouts=Shard(1)). Its output stays a DTensor, so
  // that the model's code reads the whole sequence length off it; the layer takes the local slice.
  CHECK(plan["model.embed_tokens"]["style"] == "RowwiseParallel");
  CHECK(plan["model.embed_tokens"]["kwargs"]["output_layouts"] == "Shard(1)");
  CHECK(plan["model.embed_tokens"]["kwargs"]["use_local_output"] == false);
  CHECK(plan["model.layers.0"]["style"] == "PrepareModuleInput");
  CHECK(plan["model.layers.0"]["kwargs"]["input_layouts"] == "Shard(1)");
  CHECK(plan["model.layers.0"]["kwargs"]["desired_input_layouts"] == "Shard(1)");
  CHECK(plan["model.layers.0"]["kwargs"]["use_local_output"] == true);
  for (const auto& item : plan.items()) CHECK(item.value()["kwargs"].value("output_layouts", "") != "Partial()");
  // The vocabulary-parallel loss reads lm_head's output as a DTensor under loss_parallel().
  CHECK(j["loss_parallel"] == true);
  CHECK(plan["lm_head"]["kwargs"]["use_local_output"] == false);
  // Split sequences need the plan's input shapes.
  CHECK(j["fixed_inputs"].contains("input_ids"));
  // Every module is one the graph has or a layer of it, and every style one PyTorch has.
  for (const auto& item : plan.items()) {
    CAPTURE(item.key());
    const std::string style = item.value()["style"];
    CHECK((style == "ColwiseParallel" || style == "RowwiseParallel" || style == "SequenceParallel" ||
           style == "PrepareModuleInput" || style == "PrepareModuleOutput" || style == "PrepareModuleInputOutput"));
    if (style != "PrepareModuleInput") CHECK(autoshard::find_vertex(p.graph(), item.key()).has_value());
  }
  // transformers' rowwise all-reduces: the hf export computes the same numbers and says so.
  const autoshard::tp_export h = exported(p, export_target::hf);
  CHECK(h.problems.empty());
  CHECK(mentions(h.notes, "o_proj", "all-reduces it: the same numbers"));
  CHECK(autoshard::to_hf_tp_plan(h)["tp_plan"]["lm_head"] == "colwise_gather_output");
}

TEST_CASE("export: a tied table split for both its uses is one parameter again after the styles") {
  // Qwen2's layout (lm_head tied to the token embedding), Megatron's vocabulary: the one table
  // stored Shard(0), the embedding RowwiseParallel and lm_head ColwiseParallel on it. Each style
  // registers a parameter of its own, so the export says to assign the embedding's to lm_head.
  for (const autoshard::run_mode mode : {autoshard::run_mode::inference, autoshard::run_mode::training}) {
    CAPTURE(static_cast<int>(mode));
    auto c = small_llama(mode, 2);
    c.tie_embeddings = true;
    const autoshard::loaded_plan p = solve_and_load(autoshard::build_llama(c), {});
    const autoshard::tp_export e = exported(p, export_target::dtensor);
    REQUIRE(e.problems.empty());
    const nlohmann::json j = autoshard::to_dtensor_plan(e);
    CHECK(j["plan"]["model.embed_tokens"]["style"] == "RowwiseParallel");
    CHECK(j["plan"]["lm_head"]["style"] == "ColwiseParallel");
    CHECK(j["tied"] == nlohmann::json({{"lm_head.weight", "model.embed_tokens.weight"}}));
    CHECK(mentions(e.notes, "'lm_head.weight' is 'model.embed_tokens.weight' (tied)", "assign the one to both"));
    // transformers re-ties after its tp_plan: nothing to say there.
    CHECK(exported(p, export_target::hf).problems.empty());
  }
  // Untied (LLaMA's own): nothing to tie.
  const autoshard::loaded_plan untied = solve_and_load(autoshard::build_llama(small_llama(autoshard::run_mode::inference, 2)), {});
  CHECK(autoshard::to_dtensor_plan(exported(untied, export_target::dtensor))["tied"] == nlohmann::json::object());
}

TEST_CASE("export: transformers' vocabulary, current and previous major release") {
  // The embedding split on the vocabulary, lm_head on its output features (gathered).
  const auto p = solve_and_load(autoshard::build_llama(small_llama(autoshard::run_mode::inference)),
                                {.pins = {{"model.embed_tokens.weight", "S0R"}, {"model.embed_tokens", "[P]"}, {"lm_head.weight", "S0R"}, {"lm_head", "RRS0"}}});
  const nlohmann::json v5 = autoshard::to_hf_tp_plan(exported(p, export_target::hf, 5));
  CHECK(v5["tp_plan"]["model.embed_tokens"] == "embedding_rowwise");
  CHECK(v5["tp_plan"]["lm_head"] == "colwise_gather_output");
  const nlohmann::json v4 = autoshard::to_hf_tp_plan(exported(p, export_target::hf, 4));
  CHECK(v4["transformers"] == 4);
  CHECK(v4["tp_plan"]["model.embed_tokens"] == "rowwise");
  CHECK(v4["tp_plan"]["lm_head"] == "colwise_rep");
  // The DTensor export: the embedding vocabulary-parallel, lm_head's output gathered for the model's output.
  const nlohmann::json d = autoshard::to_dtensor_plan(exported(p, export_target::dtensor));
  CHECK(d["plan"].value("/model.embed_tokens/style"_json_pointer, "") == "RowwiseParallel");
  CHECK(d["plan"].value("/lm_head/style"_json_pointer, "") == "ColwiseParallel");
  CHECK(d["plan"].value("/lm_head/kwargs/output_layouts"_json_pointer, "") == "Replicate()");
  CHECK_THROWS_AS(exported(p, export_target::hf, 3), autoshard::spec_error);
}

TEST_CASE("export: an uneven split hands the output over as a DTensor") {
  auto c = small_llama(autoshard::run_mode::inference, 2);
  c.ffn = 100;  // 100 over 8 ranks: 13 each, 9 on the last
  const auto p = solve_and_load(autoshard::build_llama(c), {.mesh = {8}});
  const nlohmann::json d = autoshard::to_dtensor_plan(exported(p, export_target::dtensor));
  CHECK(d["plan"]["model.layers.0.mlp.up_proj"]["kwargs"]["use_local_output"] == false);
  CHECK(d["plan"]["model.layers.0.self_attn.q_proj"]["kwargs"]["use_local_output"] == true);
  // transformers 5's rowwise reads the shard sizes off in_features; 4's assumes even shards.
  CHECK(exported(p, export_target::hf, 5).problems.empty());
  CHECK(mentions(exported(p, export_target::hf, 4).problems, "mlp.up_proj", "do not divide"));
}

TEST_CASE("export: what no style expresses is reported, not approximated") {
  auto p = solve_and_load(autoshard::build_llama(small_llama(autoshard::run_mode::inference)), {.mesh = {2, 4}});
  const auto w = autoshard::find_vertex(p.graph(), "model.layers.1.mlp.up_proj.weight");
  const auto up = autoshard::find_vertex(p.graph(), "model.layers.1.mlp.up_proj");
  REQUIRE((w && up));
  {  // Weights split over two mesh axes (2-D tensor parallelism).
    auto q = p;
    q.strategies[*w].output = autoshard::parse_spec("S01R", 2, 2);
    q.strategies[*up].inputs[1] = autoshard::parse_spec("S01R", 2, 2);
    const autoshard::tp_export e = exported(q, export_target::dtensor);
    CHECK(mentions(e.problems, "'model.layers.1.mlp.up_proj.weight'", "2-D tensor parallelism"));
    const std::string said = autoshard::count_noun(e.problems.size(), "operator") + " it cannot express:";  // "1 operator(s)" was said
    CHECK_THROWS_WITH_AS(autoshard::to_dtensor_plan(e), doctest::Contains(said.c_str()), autoshard::spec_error);
  }
  {  // A weight kept as partial sums.
    auto q = p;
    q.strategies[*w].output = autoshard::parse_spec("[R,P]", 2, 2);
    q.strategies[*up].inputs[1] = autoshard::parse_spec("[R,P]", 2, 2);
    CHECK(mentions(exported(q, export_target::dtensor).problems, "'model.layers.1.mlp.up_proj' (linear)", "Partial"));
  }
  {  // A gather between two operators that are not modules: rotary's output gathered for attention.
    auto q = p;
    const auto rot = autoshard::find_vertex(q.graph(), "model.layers.1.self_attn.rotary_q");
    const auto att = autoshard::find_vertex(q.graph(), "model.layers.1.self_attn.attention");
    REQUIRE((rot && att));
    REQUIRE(q.strategies[*rot].output[1].is_shard(2));
    q.strategies[*att].inputs[0][1] = autoshard::Replicate();
    CHECK(mentions(exported(q, export_target::dtensor).problems, "'model.layers.1.self_attn.attention' (attention)", "rotary_q"));
    // transformers runs the attention on the heads it is handed: the same numbers, no problem.
    CHECK(exported(q, export_target::hf).problems.empty());
  }
  // An axis the mesh lacks.
  autoshard::export_options bad;
  bad.tp_axis = 2;
  CHECK_THROWS_AS(autoshard::export_tensor_parallel(p, bad), autoshard::spec_error);
}

TEST_CASE("export: the hf export refuses layers that differ, which no wildcard key says") {
  auto p = solve_and_load(autoshard::build_llama(small_llama(autoshard::run_mode::inference)), {});
  const auto w = autoshard::find_vertex(p.graph(), "model.layers.2.mlp.up_proj.weight");
  const auto up = autoshard::find_vertex(p.graph(), "model.layers.2.mlp.up_proj");
  const auto act = autoshard::find_vertex(p.graph(), "model.layers.2.mlp.gate_mul");
  REQUIRE((w && up && act));
  // Layer 2's up_proj gathered: colwise_gather_output where the others are colwise.
  const autoshard::tp_export e = exported(p, export_target::hf);
  REQUIRE(e.problems.empty());
  auto q = p;
  q.strategies[*act].inputs[1][0] = autoshard::Replicate();
  q.strategies[*act].inputs[0][0] = autoshard::Replicate();
  q.strategies[*act].output[0] = autoshard::Replicate();
  const autoshard::tp_export d = exported(q, export_target::hf);
  CHECK_THROWS_WITH_AS(autoshard::to_hf_tp_plan(d), doctest::Contains("model.layers.*.mlp.up_proj"), autoshard::spec_error);
}

TEST_CASE("export: module names with control characters are escaped in problems, never raw") {
  // A plan file's names: layers that differ name both modules and their key, each quoted.
  const std::string hostile = "a\x1B[31mb\nc";
  autoshard::tp_export e;
  e.options.target = export_target::hf;
  e.modules = {{"m.0." + hostile, "colwise"}, {"m.1." + hostile, "rowwise"}};
  std::string msg;
  try {
    (void)autoshard::to_hf_tp_plan(e);
  } catch (const autoshard::spec_error& x) {
    msg = x.what();
  }
  CHECK(msg.find("'m.1.a\\x1B[31mb\\x0Ac' (rowwise) and 'm.0.a\\x1B[31mb\\x0Ac' (colwise): the plan treats layers of "
                 "'m.*.a\\x1B[31mb\\x0Ac' differently") != std::string::npos);
  CHECK(msg.find('\x1B') == std::string::npos);
}

TEST_CASE("export: a fully replicated plan exports nothing split, a data-parallel one too") {
  for (const char* algo : {"fully_replicated", "data_parallel"}) {
    CAPTURE(algo);
    const auto p = solve_and_load(autoshard::build_llama(small_llama(autoshard::run_mode::training)), {.algo = algo, .mesh = {2, 4}});
    const autoshard::tp_export h = exported(p, export_target::hf);
    CHECK(h.problems.empty());
    // Named, not iterated as to_hf_tp_plan(h)["tp_plan"]: a range-for keeps only the outermost
    // temporary alive, and items() of a member of a dead json read freed memory (ASan).
    const nlohmann::json hf = autoshard::to_hf_tp_plan(h);
    for (const auto& [k, v] : hf["tp_plan"].items()) CHECK(v == "replicate");
    const autoshard::tp_export d = exported(p, export_target::dtensor);
    CHECK(d.problems.empty());
    const nlohmann::json dt = autoshard::to_dtensor_plan(d);
    for (const auto& item : dt["plan"].items()) {
      CAPTURE(item.key());
      CHECK(item.value()["style"].get<std::string>().rfind("Prepare", 0) == 0);  // at most where the batch is cut or gathered
    }
  }
}

TEST_CASE("export: ZeRO-3 on data-parallel axes is FSDP2 in the DTensor export, refused by tp_plan") {
  const auto g = autoshard::build_llama(small_llama(autoshard::run_mode::training, 2));
  {  // The zero3 baseline on one axis: the tp axis only splits the batch, every weight FSDP-sharded.
    const auto p = solve_and_load(g, {.algo = "zero3", .mesh = {4}});
    const autoshard::tp_export e = exported(p, export_target::dtensor);
    REQUIRE(e.problems.empty());
    REQUIRE(e.fsdp.has_value());
    REQUIRE(e.fsdp->units.size() == 3);  // the layers, then the model
    for (const autoshard::fsdp_unit& u : e.fsdp->units) {
      CHECK(u.shard_axes == std::vector<int>{0});
      CHECK(u.replicate_axes.empty());
    }
    CHECK(e.modules.empty());  // no tensor parallelism
    // Every parameter is FSDP's (on the dim the plan stores it split on) or left whole; the
    // layers first, the model last.
    std::size_t params = 0;
    for (autoshard::vertex_t v = 0; v < boost::num_vertices(p.graph()); ++v) {
      if (!p.graph()[v].is_parameter()) continue;
      ++params;
      const std::string& n = p.graph()[v].name;
      const auto it = e.fsdp->shard_dims.find(n);
      const bool ignored = std::find(e.fsdp->ignored.begin(), e.fsdp->ignored.end(), n) != e.fsdp->ignored.end();
      CAPTURE(n);
      CHECK(ignored != (it != e.fsdp->shard_dims.end()));
      if (it != e.fsdp->shard_dims.end()) CHECK(p.strategies[v].output[0].is_shard(it->second));
      else CHECK(p.strategies[v].output[0].is_replicate());
    }
    CHECK(e.fsdp->shard_dims.size() + e.fsdp->ignored.size() == params);
    CHECK(e.fsdp->other_storage.empty());
    CHECK(e.fsdp->shard_dims.count("model.layers.1.mlp.up_proj.weight") == 1);
    CHECK(e.fsdp->units[0].module == "model.layers.0");
    CHECK(e.fsdp->units[1].module == "model.layers.1");
    CHECK(e.fsdp->units[2].module == "");
    CHECK(e.fsdp->gradient_divide_factor == 4);  // FSDP2's default: only the batch is split
    CHECK(mentions(e.notes, "FSDP2 (fully_shard, 3 units)", "ZeRO-3): over mesh axis 0 for 21"));
    const nlohmann::json j = autoshard::to_dtensor_plan(e);
    CHECK(j["fsdp"]["units"][0]["shard_axes"] == nlohmann::json::array({"tp"}));
    CHECK(j["fsdp"]["reshard_after_forward"] == true);
    CHECK(j["fsdp"]["units"].back()["module"] == "");
    CHECK(j["data_parallel_axes"] == nlohmann::json::array({"tp"}));
    // transformers' tp_plan has no FSDP of its own to say it with.
    const autoshard::tp_export h = exported(p, export_target::hf);
    CHECK(mentions(h.problems, "'model.layers.1.mlp.up_proj' (linear)", "the DTensor export writes that as FSDP2"));
  }
  // Megatron's plan on dp=2,tp=4 with one weight stored ZeRO-3 on dp besides its tensor-parallel
  // split: FSDP2 over dp (the rest left whole), unless both split the same dim.
  const auto p = solve_and_load(g, {.mesh = {2, 4}, .names = {"dp", "tp"}});
  const auto w = autoshard::find_vertex(p.graph(), "model.layers.1.mlp.up_proj.weight");
  const auto up = autoshard::find_vertex(p.graph(), "model.layers.1.mlp.up_proj");
  REQUIRE((w && up));
  REQUIRE(p.strategies[*up].inputs[1][1].is_shard(0));  // column-parallel on tp
  {
    auto q = p;
    q.strategies[*w].output = autoshard::parse_spec("[S(1),S(0)]", 2, 2);  // in-features over dp, out-features over tp
    const autoshard::tp_export e = exported(q, export_target::dtensor);
    REQUIRE(e.problems.empty());
    REQUIRE(e.fsdp.has_value());
    REQUIRE(e.fsdp->units.size() == 2);
    CHECK(e.fsdp->units[0].module == "model.layers.1");
    CHECK(e.fsdp->units[0].shard_axes == std::vector<int>{0});
    CHECK(e.fsdp->units[1].module == "");
    CHECK(e.fsdp->units[1].shard_axes == std::vector<int>{0});  // no parameter of its own: the first unit's mesh
    CHECK(e.fsdp->shard_dims == std::map<std::string, int>{{"model.layers.1.mlp.up_proj.weight", 1}});
    CHECK(e.fsdp->other_storage.empty());
    CHECK(mentions(e.notes, "parameters the plan keeps whole on every data-parallel axis (ignored_params)", "average them"));
    CHECK(e.modules.size() > 0);  // the tensor-parallel styles stay
  }
  {  // Out-features over dp (outer) and tp: FSDP2 shards each rank's tensor-parallel shard again
     // (tp outer), the same numbers in other blocks, and says so.
    auto q = p;
    q.strategies[*w].output = autoshard::parse_spec("S01R", 2, 2);
    const autoshard::tp_export e = exported(q, export_target::dtensor);
    REQUIRE(e.problems.empty());
    REQUIRE(e.fsdp.has_value());
    CHECK(e.fsdp->shard_dims == std::map<std::string, int>{{"model.layers.1.mlp.up_proj.weight", 0}});
    CHECK(e.fsdp->other_storage == std::vector<std::string>{"model.layers.1.mlp.up_proj.weight"});
    CHECK(mentions(e.notes, "1 parameter (other_storage, the first 'model.layers.1.mlp.up_proj.weight')", "the same numbers"));
  }
  {  // Used split on dp: computing on it there is not data parallelism.
    auto q = p;
    q.strategies[*w].output = autoshard::parse_spec("[S(1),S(0)]", 2, 2);
    q.strategies[*up].inputs[1] = autoshard::parse_spec("[S(1),S(0)]", 2, 2);
    CHECK(mentions(exported(q, export_target::dtensor).problems, "'model.layers.1.mlp.up_proj.weight'", "2-D tensor parallelism"));
  }
}

TEST_CASE("export: a rotary model sliced on the batch from its token embedding on") {
  // The planner's own LLaMA-7B plan on 8 H100s, small: the embedding split on its hidden dim,
  // every layer on a slice of the batch. The model computes its causal mask off the embedding's
  // output, so the batch is sliced there (not at the first layer's entry).
  const auto g = autoshard::build_llama(small_llama(autoshard::run_mode::training, 2));
  const std::map<std::string, std::string> pins{{"model.embed_tokens.weight", "[S(1)]"},
                                                {"model.embed_tokens", "[S(2)]"},
                                                {"model.layers.0.self_attn.attention", "[S(0)]"},
                                                {"model.layers.1.self_attn.attention", "[S(0)]"}};
  const auto p = solve_and_load(g, {.algo = "alpa", .mesh = {4}, .pins = pins, .micro_batches = 1});
  const autoshard::tp_export e = exported(p, export_target::dtensor);
  REQUIRE(e.problems.empty());
  const nlohmann::json j = autoshard::to_dtensor_plan(e);
  CHECK(j["plan"]["model.embed_tokens"]["style"] == "ColwiseParallel");
  CHECK(j["plan"]["model.embed_tokens"]["kwargs"]["output_layouts"] == "Shard(0)");
  CHECK(j["plan"]["model.embed_tokens"]["kwargs"]["use_local_output"] == true);
  CHECK_FALSE(j["plan"].contains("model.layers.0"));  // no conversion at the first layer's entry
  CHECK(j["plan"]["lm_head"]["kwargs"]["desired_output_layouts"] == "Replicate()");
  CHECK(mentions(e.notes, "'model.embed_tokens'", "an attention_mask passed to the model must be the rank's slice"));
  // The linears kept whole run on each rank's rows with no style: their gradients are shares,
  // summed over tp; the embedding's and the norms' are DTensors of their styles.
  const auto sums = [&](const std::string& n) {
    return std::find(e.tp_gradient_sums.begin(), e.tp_gradient_sums.end(), n) != e.tp_gradient_sums.end();
  };
  CHECK(sums("model.layers.0.self_attn.q_proj.weight"));
  CHECK(sums("model.layers.1.mlp.down_proj.weight"));
  CHECK(sums("lm_head.weight"));
  CHECK_FALSE(sums("model.embed_tokens.weight"));
  CHECK_FALSE(sums("model.layers.0.input_layernorm.weight"));
  CHECK(j["tp_gradient_sums"].size() == e.tp_gradient_sums.size());
  // One layer's attention on its heads instead: the mask would not fit, the slices are refused.
  auto heads = pins;
  heads["model.layers.1.self_attn.attention"] = "[S(2)]";
  const auto q = solve_and_load(g, {.algo = "alpa", .mesh = {4}, .pins = heads, .micro_batches = 1, .tie_layers = false});
  CHECK(mentions(exported(q, export_target::dtensor).problems, "'model.layers.0.self_attn.rotary_q' (rotary)",
                 "it runs on a slice of dim 0 (the batch)"));
}

TEST_CASE("export: the hf export says where transformers runs on the whole what the plan slices") {
  // The planner's own GPT-2 plans, small: the embeddings split on their hidden dim over tp, every
  // layer on a slice of the batch. transformers' styles hand the layers their inputs whole: each
  // rank of tp computes every row, which the export must say (exact numbers, n times the work).
  const auto g = autoshard::build_gpt2(small_gpt2(autoshard::run_mode::inference));
  std::map<std::string, std::string> pins{{"transformer.wte.weight", "[S(1)]"}, {"transformer.wte", "[S(2)]"}};
  for (int l = 0; l < 3; ++l) pins["transformer.h." + std::to_string(l) + ".attn.attention"] = "[S(0)]";
  const auto p = solve_and_load(g, {.algo = "alpa", .mesh = {4}, .pins = pins});
  const autoshard::tp_export hf = exported(p, export_target::hf);
  REQUIRE(hf.problems.empty());
  CHECK(mentions(hf.notes, "the plan runs on a slice of the batch over mesh axis 0 run on the whole on each of its 4 ranks",
                 "up to 4 times the plan's compute"));
  CHECK(mentions(hf.notes, "(the first 'transformer.", "operators"));
  // The DTensor export keeps the plan's slices, which GPT-2's code cannot take: its attention mask
  // is the whole batch's. The refusal names what this model computes, and the way that exports.
  const autoshard::tp_export dt = exported(p, export_target::dtensor);
  CHECK(mentions(dt.problems, "'transformer.h.0.attn.attention' (attention): it runs on a slice of dim 0 (the batch)",
                 "the model computes the attention mask (and ALiBi's biases, where it has them) for the whole batch"));
  CHECK(mentions(dt.problems, "'transformer.h.0.attn.attention'", "only as data parallelism, every rank fed its own rows (plan with --algo data_parallel)"));
  CHECK_FALSE(mentions(dt.problems, "attention", "rotary angles"));
  // A plan that keeps every activation whole on tp has nothing to say so.
  const auto whole = solve_and_load(g, {.algo = "alpa", .mesh = {4}, .pins = {{"transformer.wte.weight", "[S(1)]"},
                                                                                {"transformer.h.0.attn.attention", "[R]"},
                                                                                {"transformer.h.1.attn.attention", "[R]"},
                                                                                {"transformer.h.2.attn.attention", "[R]"}}});
  const autoshard::tp_export whole_hf = exported(whole, export_target::hf);
  REQUIRE(whole_hf.problems.empty());  // written, its notes read: not a refusal without notes
  CHECK_FALSE(mentions(whole_hf.notes, "run on the whole on each of its", "ranks"));
}

TEST_CASE("export: the hf export names the heads where the plan slices BLOOM's q, k, v on them") {
  // BLOOM views query_key_value's output as [B, S, heads, 3D] and slices q, k, v from it: with
  // each attention pinned to its heads split, the plan runs those slices on a slice of dim 2, the
  // heads, which transformers runs on the whole on each rank. The note says the heads, not "the
  // batch or sequence" (the plan slices neither). query_key_value's weight is pinned whole: the
  // heads' slice is then cut from it on each rank, as transformers runs it (stored as its
  // consumer reads it, a slice, the export refuses BLOOM's views by its own head counts).
  autoshard::hf_model m = autoshard::read_hf_config(
      nlohmann::json{{"model_type", "bloom"}, {"n_layer", 2}, {"hidden_size", 64}, {"n_head", 4}, {"vocab_size", 128}}, "bloom.json");
  m.config.batch = 2;
  m.config.seq = 8;
  m.config.mode = autoshard::run_mode::inference;
  const auto g = autoshard::build_hf(m);
  const auto p = solve_and_load(g, {.algo = "alpa",
                                    .mesh = {2},
                                    .pins = {{"transformer.h.0.self_attention.attention", "[S(2)]"},
                                             {"transformer.h.1.self_attention.attention", "[S(2)]"},
                                             {"transformer.h.0.self_attention.query_key_value.weight", "[R]"},
                                             {"transformer.h.1.self_attention.query_key_value.weight", "[R]"},
                                             {"transformer.h.0.self_attention.query_key_value.bias", "[R]"},
                                             {"transformer.h.1.self_attention.query_key_value.bias", "[R]"}}});
  const autoshard::tp_export hf = exported(p, export_target::hf);
  CHECK(mentions(hf.notes, "the plan runs on a slice of the heads over mesh axis 0 run on the whole on each of its 2 ranks",
                 "(the first 'transformer.h.0.self_attention."));
  CHECK_FALSE(mentions(hf.notes, "batch", "run on the whole on each of its"));
  CHECK_FALSE(mentions(hf.notes, "sequence", "run on the whole on each of its"));
}

// Pins for the small LLaMA on dp=2,tp=2 as the planner's plans for LLaMA on two or more nodes:
// the embedding split on its hidden dim over tp, the attention on a slice of the batch over
// both axes; `per_layer` adds each layer's own ("model.layers.N." prefixed).
std::map<std::string, std::string> batch_sliced_on_tp(const std::map<std::string, std::string>& per_layer) {
  std::map<std::string, std::string> pins{{"model.embed_tokens.weight", "[R,S(1)]"}, {"model.embed_tokens", "[S(0),S(2)]"}};
  for (int l = 0; l < 2; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    pins[pre + "self_attn.attention"] = "[S(0),S(0)]";
    for (const auto& [name, spec] : per_layer) pins[pre + name] = spec;
  }
  return pins;
}

TEST_CASE("export: ZeRO-3 on the tp axis of a batch sliced from its embedding is FSDP2 over tp, summing the shares") {
  // The planner's own LLaMA-7B plan on 2x8 H100s, small: the embedding split on its hidden dim
  // over tp, every layer on a slice of the batch over both axes, weights stored split over tp and
  // gathered whole at each use. Each tp rank's gradient is its slice's share of one loss: FSDP2
  // over tp must sum them (divide by the dp ranks only), HSDP's replicate dim over dp.
  const auto g = autoshard::build_llama(small_llama(autoshard::run_mode::training, 2));
  const auto pins = batch_sliced_on_tp({{"mlp.up_proj.weight", "[R,S(0)]"}, {"mlp.up_proj", "[S(0),S(0)]"}});
  const auto p = solve_and_load(g, {.algo = "alpa", .mesh = {2, 2}, .names = {"dp", "tp"}, .pins = pins, .micro_batches = 1});
  const autoshard::tp_export e = exported(p, export_target::dtensor);
  REQUIRE(e.problems.empty());
  REQUIRE(e.fsdp.has_value());
  REQUIRE(e.fsdp->units.size() == 3);
  for (const autoshard::fsdp_unit& u : e.fsdp->units) {
    CHECK(u.shard_axes == std::vector<int>{1});
    CHECK(u.replicate_axes == std::vector<int>{0});
  }
  CHECK(e.fsdp->gradient_divide_factor == 2);  // the dp ranks; FSDP2's default would be 4
  CHECK(e.data_parallel_axes == std::vector<int>{0});
  CHECK(e.fsdp->shard_dims.at("model.layers.1.mlp.up_proj.weight") == 0);
  const auto has = [](const std::vector<std::string>& v, const std::string& n) { return std::find(v.begin(), v.end(), n) != v.end(); };
  CHECK(has(e.fsdp->ignored, "model.embed_tokens.weight"));  // its ColwiseParallel's DTensor on tp
  CHECK_FALSE(has(e.tp_gradient_sums, "model.layers.1.mlp.up_proj.weight"));  // FSDP2's reduce-scatter sums it
  CHECK(mentions(e.notes, "FSDP2 (fully_shard, 3 units)", "over mesh axis 1 (tp) for 2, replicated over mesh axis 0 (dp) (HSDP)"));
  CHECK(mentions(e.notes, "FSDP2 (fully_shard, 3 units)", "set_gradient_divide_factor(2)"));
  const nlohmann::json j = autoshard::to_dtensor_plan(e);
  CHECK(j["version"] == 5);
  CHECK(j["fsdp"]["gradient_divide_factor"] == 2);
  CHECK(j["data_parallel_axes"] == nlohmann::json::array({"dp"}));
  // The same weight gathered for a module computing on whole rows over tp: every tp rank's
  // gradient would be whole, and FSDP2's sum over tp wrong.
  auto whole = pins;
  whole.erase("model.embed_tokens");
  for (int l = 0; l < 2; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    whole[pre + "self_attn.attention"] = "[S(0),S(2)]";
    whole[pre + "mlp.up_proj"] = "[S(0),R]";
  }
  whole["model.embed_tokens.weight"] = "[R,R]";
  const auto q = solve_and_load(g, {.algo = "alpa", .mesh = {2, 2}, .names = {"dp", "tp"}, .pins = whole, .micro_batches = 1});
  CHECK(mentions(exported(q, export_target::dtensor).problems, "'model.layers.0.mlp.up_proj.weight' (parameter)",
                 "FSDP2 over mesh axis 1 (tp) would sum the gradient every rank computes whole"));
}

TEST_CASE("export: a layer whose parameters are ZeRO-3 over different axes is several FSDP2 units") {
  // The planner's own LLaMA-70B plan on 8x8 H100s, small: the attention on a slice of the batch
  // over both axes, its weights ZeRO-3 over tp (gathered whole at each use); the MLP
  // tensor-parallel on tp, its weights ZeRO-3 over dp besides. FSDP2 cannot shard the MLP's
  // tensor-parallel weights over tp again: each submodule is a unit over its own axes.
  const auto g = autoshard::build_llama(small_llama(autoshard::run_mode::training, 2));
  std::map<std::string, std::string> layer{{"self_attn.o_proj.weight", "[R,S(1)]"}, {"mlp.down_proj.weight", "[S(0),S(1)]"}};
  for (const char* w : {"q_proj", "k_proj", "v_proj"}) layer[std::string("self_attn.") + w + ".weight"] = "[R,S(0)]";
  for (const char* w : {"gate_proj", "up_proj"}) {
    layer[std::string("mlp.") + w + ".weight"] = "[S(1),S(0)]";
    layer[std::string("mlp.") + w] = "[S(0),S(2)]";
  }
  for (const char* o : {"input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                        "self_attn.residual", "post_attention_layernorm", "mlp.residual"})
    layer[o] = "[S(0),S(0)]";
  const auto pins = batch_sliced_on_tp(layer);
  const auto p = solve_and_load(g, {.algo = "alpa", .mesh = {2, 2}, .names = {"dp", "tp"}, .pins = pins, .micro_batches = 1});
  const autoshard::tp_export e = exported(p, export_target::dtensor);
  REQUIRE(e.problems.empty());
  REQUIRE(e.fsdp.has_value());
  std::map<std::string, autoshard::fsdp_unit> units;
  for (const autoshard::fsdp_unit& u : e.fsdp->units) units[u.module] = u;
  CHECK(e.fsdp->units.back().module == "");
  REQUIRE(units.count("model.layers.1.self_attn") == 1);
  REQUIRE(units.count("model.layers.1.mlp") == 1);
  CHECK(units.count("model.layers.1") == 0);  // its parameters differ: its submodules are the units
  CHECK(units["model.layers.1.self_attn"].shard_axes == std::vector<int>{1});
  CHECK(units["model.layers.1.self_attn"].replicate_axes == std::vector<int>{0});
  CHECK(units["model.layers.1.mlp"].shard_axes == std::vector<int>{0});
  CHECK(units["model.layers.1.mlp"].replicate_axes.empty());
  CHECK(e.fsdp->gradient_divide_factor == 2);  // the attention's unit sums over tp; the MLP's world is dp's 2 anyway
  CHECK(e.fsdp->shard_dims.at("model.layers.1.mlp.gate_proj.weight") == 1);
  CHECK(e.fsdp->shard_dims.at("model.layers.1.self_attn.o_proj.weight") == 1);
  CHECK(mentions(e.notes, "FSDP2 (fully_shard, ", "over mesh axis 0 (dp) for 6; over mesh axis 1 (tp) for 8, replicated"));
  // One module's weight ZeRO-3 over tp and its bias over dp: no submodule to split it into.
  auto c = small_llama(autoshard::run_mode::training, 2);
  c.qkv_bias = true;
  const auto q = solve_and_load(autoshard::build_llama(c), {.algo = "alpa", .mesh = {2, 2}, .names = {"dp", "tp"},
                                                            .pins = batch_sliced_on_tp({{"self_attn.q_proj.weight", "[R,S(0)]"},
                                                                                        {"self_attn.q_proj.bias", "[S(0),R]"},
                                                                                        {"self_attn.q_proj", "[S(0),S(0)]"}}),
                                                            .micro_batches = 1});
  CHECK(mentions(exported(q, export_target::dtensor).problems, "'model.layers.0.self_attn.q_proj.",
                 "stored ZeRO-3 over other mesh axes than another parameter of 'model.layers.0.self_attn.q_proj'"));
}

TEST_CASE("export: key/value heads replicated over tp export for inference, refused for training") {
  for (auto mode : {autoshard::run_mode::inference, autoshard::run_mode::training}) {
    auto c = autoshard::transformer_config::llama(2, 256, 8, 2, 688);  // 2 key/value heads on 4 ranks
    c.seq = 64;
    c.batch = 8;
    c.vocab = 512;
    c.mode = mode;
    const auto p = solve_and_load(autoshard::build_llama(c), {.mesh = {4}});
    const autoshard::tp_export e = exported(p, export_target::dtensor);
    CAPTURE(static_cast<int>(mode));
    if (mode == autoshard::run_mode::inference) {
      CHECK(e.problems.empty());
      CHECK(e.meshes.count("kv_heads_2") == 1);
    } else {
      // The backward of the slice on a sub-mesh sums nothing over a head's replicas (the client
      // test measured 0.4-1.3 relative errors in the gradients).
      CHECK(mentions(e.problems, "'model.layers.0.self_attn.k_proj' (linear)", "sums no gradient over the ranks that share a head"));
    }
  }
}

TEST_CASE("export: a decode step after a key/value cache exports as its prefill plan, the cache held as the step's keys") {
  // In PyTorch the cache is the attention module's state (transformers' DynamicCache), the keys
  // and values the module computed on each rank in earlier steps: it arrives as the step's own k
  // and v do (the rank's heads under a colwise k_proj, or the rank's key/value heads where they
  // are replicated over the ranks), never handed over whole by the user.
  for (const int kv : {4, 2}) {  // 4 key/value heads split over 4 ranks, 2 replicated over them
    CAPTURE(kv);
    auto c = autoshard::transformer_config::llama(2, 256, 8, kv, 688);
    c.seq = 1;
    c.batch = 8;
    c.vocab = 512;
    c.mode = autoshard::run_mode::inference;
    const auto [prefill, decode] = prefill_and_decode(c, {.mesh = {4}});
    REQUIRE(autoshard::find_vertex(decode.graph(), "past_key_values.1.value"));
    const autoshard::tp_export pd = exported(prefill, export_target::dtensor), dd = exported(decode, export_target::dtensor);
    const autoshard::tp_export ph = exported(prefill, export_target::hf), dh = exported(decode, export_target::hf);
    CHECK(dd.problems.empty());
    CHECK(dh.problems.empty());
    REQUIRE(pd.problems.empty());
    REQUIRE(ph.problems.empty());
    CHECK(autoshard::to_dtensor_plan(dd) == autoshard::to_dtensor_plan(pd));
    CHECK(autoshard::to_hf_tp_plan(dh) == autoshard::to_hf_tp_plan(ph));
  }
  // The planner's own plan sliced on the batch from the token embedding on: the cache too is
  // each rank's rows, kept by the module; the user feeds only the step's tokens (fixed_inputs),
  // and the layers' entries convert the hidden states as in the prefill plan.
  auto c = autoshard::transformer_config::llama(2, 256, 8, 4, 688);
  c.seq = 1;
  c.batch = 8;
  c.vocab = 512;
  c.mode = autoshard::run_mode::inference;
  const std::map<std::string, std::string> pins{{"model.embed_tokens.weight", "[S(1)]"},
                                                {"model.embed_tokens", "[S(2)]"},
                                                {"model.layers.0.self_attn.attention", "[S(0)]"},
                                                {"model.layers.1.self_attn.attention", "[S(0)]"}};
  const auto [prefill, decode] = prefill_and_decode(c, {.algo = "alpa", .mesh = {4}, .pins = pins});
  const autoshard::tp_export pd = exported(prefill, export_target::dtensor), dd = exported(decode, export_target::dtensor);
  CHECK(dd.problems.empty());
  REQUIRE(pd.problems.empty());
  CHECK(dd.fixed_inputs.size() == 1);
  CHECK(dd.fixed_inputs.count("input_ids") == 1);
  CHECK(autoshard::to_dtensor_plan(dd) == autoshard::to_dtensor_plan(pd));
  // The first layer's input norm on a slice of the batch: the layer's entry slices the hidden
  // states (PrepareModuleInput, the one tensor entering it; the cache enters no layer).
  const std::map<std::string, std::string> entry{{"model.layers.0.input_layernorm", "[S(0)]"},
                                                 {"model.layers.0.self_attn.attention", "[S(2)]"}};
  const auto [prefill_entry, decode_entry] = prefill_and_decode(c, {.algo = "alpa", .mesh = {4}, .pins = entry});
  const autoshard::tp_export pe = exported(prefill_entry, export_target::dtensor), de = exported(decode_entry, export_target::dtensor);
  CHECK(de.problems.empty());
  REQUIRE(pe.problems.empty());
  const nlohmann::json pj = autoshard::to_dtensor_plan(pe);
  CHECK(pj["plan"]["model.layers.0"]["style"] == "PrepareModuleInput");
  CHECK(autoshard::to_dtensor_plan(de) == pj);
}

TEST_CASE("export: a key/value cache the plan keeps in another layout than the attention reads is refused, naming it") {
  // The cache kept split on the batch over tp and moved to the attention's heads each step:
  // PyTorch keeps a cache where its attention computed it, and moves none.
  auto c = autoshard::transformer_config::llama(2, 256, 8, 4, 688);
  c.seq = 1;
  c.batch = 8;
  c.vocab = 512;
  c.past = 16;
  c.mode = autoshard::run_mode::inference;
  const auto p = solve_and_load(autoshard::build_llama(c), {.algo = "alpa",
                                                            .mesh = {4},
                                                            .pins = {{"model.layers.0.self_attn.attention", "[S(2)]"},
                                                                     {"past_key_values.0.key", "[S(0)]"}}});
  REQUIRE(p.strategies[*autoshard::find_vertex(p.graph(), "past_key_values.0.key")].output[0].is_shard(0));
  for (const export_target t : {export_target::dtensor, export_target::hf}) {
    CAPTURE(static_cast<int>(t));
    const autoshard::tp_export e = exported(p, t);
    CHECK(mentions(e.problems, "'past_key_values.0.key' (input): the plan keeps it S(0) on mesh axis 0",
                   "reads it S(2), but a key/value cache is the attention module's state"));
    CHECK_FALSE(mentions(e.problems, "'past_key_values.0.value'", ""));  // kept as read
  }
}

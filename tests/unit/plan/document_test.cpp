// The plan document: one writer, one reader, every member checked.
#include <autoshard/plan/plan.hpp>
#include <autoshard/graph/resize.hpp>

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace fs = std::filesystem;
using namespace autoshard;

namespace {

/// x [8,16] -> fc = linear(x, w [32,16]) on a 2x2 mesh with three different links, the
/// weight column-split over axis 1, the batch split over axis 0.
plan_document small_plan() {
  plan_document d;
  d.mesh = device_mesh{2, 2};
  d.mesh.set_link(0, {3e-5, 20e9});
  d.mesh.set_link(1, {4e-6, 250e9});
  d.pricing.mode = run_mode::training;
  d.options.algo = algo::megatron;
  d.options.time_limit = 12.5;
  d.options.mip_rel_gap = 0.01;
  d.options.memory_budget = 1 << 20;
  d.options.pinned["x"] = "S0R";
  const vertex_t x = add_input(d.graph, "x", {8, 16}, dtype::f32);
  const vertex_t w = add_parameter(d.graph, "w", {32, 16}, dtype::f32);
  add_op(d.graph, op_kind::linear, "fc", {x, w});
  const sharding_spec sx = parse_spec("S0R", 2, 2);
  const sharding_spec w_col = parse_spec("S1R", 2, 2), fc_out = parse_spec("S0S1", 2, 2);
  d.tensors.push_back({"->S0R", {}, sx, tensor_shape{4, 16}, 0.0, 256});
  d.tensors.push_back({"->S1R", {}, w_col, tensor_shape{16, 16}, 0.0, 1024});
  d.tensors.push_back({"S0R,S1R->S0S1", {sx, w_col}, fc_out, tensor_shape{4, 16}, 1.5e-9, 256});
  d.cost = {2.5e-9, 1.5e-9, 1e-9, 0.0, 1536};
  d.solver = {"feasible", 2.5e-9, 2.0e-9, 0.2, 0.125};
  return d;
}

struct temp_plan {
  fs::path path = fs::temp_directory_path() / ("autoshard-plan-doc-" + std::to_string(::getpid()) + ".json");
  ~temp_plan() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

/// The document as a version-2 file spelled it: "mode" at the top, the device and the training
/// settings under "options" (what every plan written before version 3 looks like).
nlohmann::json as_version_2(const plan_document& d) {
  nlohmann::json j = to_json(d);
  const nlohmann::json p = j["pricing"];
  j.erase("pricing");
  j["version"] = 2;
  j["mode"] = p["mode"];
  j["options"]["device"] = p["device"];
  j["options"]["training"] = {{"optimizer", p["optimizer"]}, {"gradient_bucket_bytes", p["gradient_bucket_bytes"]},
                              {"gradient_overlap", p["gradient_overlap"]}, {"zero", p["zero"]}};
  return j;
}

std::string read_error(const nlohmann::json& j) {
  try {
    (void)plan_from_json(j, "plan file 'p.json'");
  } catch (const error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("plan document: written and read back, it compares equal field by field, links included") {
  const plan_document d = small_plan();
  temp_plan f;
  write_plan_file(d, f.path);
  const plan_document back = read_plan_file(f.path.string());
  CHECK(back.mesh == d.mesh);
  CHECK(back.mesh.link(0) == link_model{3e-5, 20e9});
  CHECK(back.mesh.link(1) == link_model{4e-6, 250e9});
  CHECK(back.pricing == d.pricing);
  CHECK(back.options == d.options);
  CHECK(back.tensors == d.tensors);
  CHECK(back.cost == d.cost);
  CHECK(back.solver == d.solver);
  CHECK(to_json(back.graph) == to_json(d.graph));
  CHECK(back == d);
  // The file spells the links one way and says its version.
  const nlohmann::json j = to_json(d);
  CHECK(j["version"] == 5);
  CHECK(j["mesh"]["axes"][1] == nlohmann::json{{"size", 2}, {"latency_s", 4e-6}, {"bandwidth_Bps", 250e9}, {"hop_s", 0.0}});
  CHECK(j["tensors"][1]["local_shape"] == nlohmann::json{16, 16});
}

TEST_CASE("plan document: a rotary's rope rule (longrope) is written with its graph and read back, so a re-sized plan turns by it") {
  plan_document d = small_plan();
  const vertex_t fc = *find_vertex(d.graph, "fc");
  op_attrs a;  // fc's [8, 32] as 4 heads of 8 over 8 positions (its dim -2, here the graph's batch)
  a.heads = 4;
  a.rotary_half = true;
  a.rotary_rule = rope_rule{rope_rule_kind::longrope, 1.0, 4, {1.0, 1.5, 2.0, 4.0}, {2.0, 4.0, 8.0, 16.0}};
  a.rotary_frequencies = rope_rule_frequencies(a.rotary_base, 8, a.rotary_rule, 8);  // past 4: the long factors
  add_op(d.graph, op_kind::rotary, "rot", {fc}, a);
  const sharding_spec out = parse_spec("S0S1", 2, 2);
  d.tensors.push_back({"S0S1->S0S1", {out}, out, tensor_shape{4, 16}, 0.0, 256});
  temp_plan f;
  write_plan_file(d, f.path);
  const plan_document back = read_plan_file(f.path.string());
  CHECK(back == d);
  const vertex_t rot = *find_vertex(back.graph, "rot");
  CHECK(back.graph[rot].attrs == d.graph[rot].attrs);
  // Re-sized to 4 rows, 4 positions within the threshold, the plan's graph turns by the short factors.
  CHECK(with_batch_seq(back.graph, 4, 0)[rot].attrs.rotary_frequencies ==
        rope_rule_frequencies(a.rotary_base, 8, a.rotary_rule, 4));
}

TEST_CASE("plan document: an unknown, newer or older version fails naming both versions") {
  nlohmann::json j = to_json(small_plan());
  j["version"] = 6;
  CHECK(read_error(j) == "io error: plan file 'p.json' has version 6; this build reads versions 2 to 5");
  j["version"] = 1;
  CHECK(read_error(j).find("has version 1, an older format this build no longer reads (it reads versions 2 to 5)") !=
        std::string::npos);
  j.erase("version");
  CHECK(read_error(j) == "io error: plan file 'p.json': the document has no member \"version\"");
  j["version"] = 2;
  j["format"] = "autoshard.graph";
  CHECK(read_error(j).find("is not an autoshard plan") != std::string::npos);
}

TEST_CASE("plan document: a missing field, a wrong type or an out-of-range integer fails naming the field") {
  const nlohmann::json good = to_json(small_plan());
  auto edited = [&](const char* pointer, const nlohmann::json& value) {
    nlohmann::json j = good;
    j[nlohmann::json::json_pointer(pointer)] = value;
    return read_error(j);
  };
  auto without = [&](const char* parent, const char* key) {
    nlohmann::json j = good;
    j[nlohmann::json::json_pointer(parent)].erase(key);
    return read_error(j);
  };
  CHECK(without("/mesh/axes/1", "bandwidth_Bps") == "io error: plan file 'p.json': mesh.axes[1] has no member \"bandwidth_Bps\"");
  CHECK(without("/tensors/2", "output") == "io error: plan file 'p.json': tensors[2] has no member \"output\"");
  CHECK(without("/options", "tie_layers") == "io error: plan file 'p.json': options has no member \"tie_layers\"");
  CHECK(edited("/mesh/axes/0/latency_s", "fast") ==
        "io error: plan file 'p.json': mesh.axes[0].latency_s is \"fast\", not a number in [0, 1000]");
  CHECK(edited("/mesh/axes/0/bandwidth_Bps", -1) ==
        "io error: plan file 'p.json': mesh.axes[0].bandwidth_Bps is -1, not a number in [1, 1e+18]");
  CHECK(edited("/options/tie_layers", 1) == "io error: plan file 'p.json': options.tie_layers is 1, not true or false");
  CHECK(edited("/tensors/1/memory_bytes", nlohmann::json::parse("18446744073709551615")).find(
            "tensors[1].memory_bytes is 18446744073709551615, not an integer in [0, ") != std::string::npos);
  CHECK(edited("/mesh/axes/1/size", 3.0).find("mesh.axes[1].size is 3.0, not an integer in [1, 1000000]") != std::string::npos);
  CHECK(edited("/pricing/mode", "serving") ==
        "io error: plan file 'p.json': pricing.mode is \"serving\", not \"inference\" or \"training\"");
  CHECK(edited("/solver/status", "optimal?").find("solver.status is \"optimal?\"") != std::string::npos);
  // Consistency with the embedded graph and the mesh.
  CHECK(edited("/tensors/2/name", "fc2").find("tensors[2].name is \"fc2\", not 'fc', the name of graph vertex 2") !=
        std::string::npos);
  CHECK(edited("/tensors/2/output", "S0S0").find("tensors[2].output is \"S0S0\", which does not fit") != std::string::npos);
  CHECK(edited("/tensors/1/local_shape", nlohmann::json{32, 16}).find(
            "tensors[1].local_shape is [32,16], not [16,16], rank 0's shard of [32,16] under S1R") != std::string::npos);
  CHECK(edited("/tensors/2/inputs", nlohmann::json{"S0R"}).find("tensors[2].inputs has 1 specs for 2 operands") !=
        std::string::npos);
  CHECK(edited("/graph/nodes/2/shape", nlohmann::json{8, 33}).find("its graph is invalid: graph error:") != std::string::npos);
}

TEST_CASE("plan document: the mesh's sizes are bounded before anything is allocated") {
  const nlohmann::json good = to_json(small_plan());
  nlohmann::json j = good;
  for (auto& a : j["mesh"]["axes"]) a["size"] = 99999999;
  CHECK(read_error(j).find("mesh.axes[0].size is 99999999, not an integer in [1, 1000000]") != std::string::npos);
  j = good;  // each axis in range, 2^21 ranks in all: check_mesh_size's bound
  j["mesh"]["axes"][0]["size"] = 2048;
  j["mesh"]["axes"][1]["size"] = 1024;
  CHECK(read_error(j).find("mesh.axes the mesh has more than 1048576 ranks") != std::string::npos);
  j = good;
  const nlohmann::json axis = j["mesh"]["axes"][0];
  j["mesh"]["axes"] = {axis, axis, axis, axis, axis};
  CHECK(read_error(j).find("mesh.axes has 5 elements; at most 4 are allowed") != std::string::npos);
  j["mesh"]["axes"] = nlohmann::json::array();
  CHECK(read_error(j).find("mesh.axes is empty") != std::string::npos);
}

TEST_CASE("plan document: reading a directory or a missing file is an io_error naming it") {
  CHECK_THROWS_WITH_AS(read_plan_file(fs::temp_directory_path().string()), doctest::Contains("is a directory"), io_error);
  CHECK_THROWS_WITH_AS(read_plan_file("/nonexistent/plan.json"), doctest::Contains("cannot open plan file '/nonexistent/plan.json'"),
                       io_error);
}

TEST_CASE("plan document: the pricing a plan was priced with is written whole, read back and checked") {
  plan_document d = small_plan();
  d.pricing.optimizer = optimizer_kind::sgd;
  d.pricing.gradient_bucket_bytes = 4.0 * (1 << 20);
  d.pricing.gradient_overlap = 0.25;
  d.pricing.zero = false;
  d.pricing.device.memory_bytes = 40LL << 30;
  d.pricing.device.context_bytes = 400LL << 20;  // the runtime reserve's figures travel with the device
  d.pricing.device.communicator_bytes = 688LL << 20;
  d.pricing.device.pair_communicator_bytes = 544LL << 20;
  d.pricing.micro_batch = 2;
  d.pricing.micro_batches = 16;
  d.pricing.recompute = recompute_policy::full;
  d.pricing.attention = attention_kernel::unfused;
  d.pricing.achievable = false;
  temp_plan f;
  write_plan_file(d, f.path);
  const plan_document back = read_plan_file(f.path.string());
  CHECK(back.pricing == d.pricing);
  CHECK(back == d);
  const nlohmann::json j = to_json(d);
  CHECK(j["pricing"] == nlohmann::json{{"mode", "training"},
                                       {"device",
                                        {{"peak_flops", 312e12},
                                         {"memory_bandwidth", 2e12},
                                         {"memory_bytes", 40LL << 30},
                                         {"large_matmul_flops", 0.0},
                                         {"sliced_matmul_flops", 0.0},
                                         {"achievable_memory_bandwidth", 0.0},
                                         {"context_bytes", 400LL << 20},
                                         {"communicator_bytes", 688LL << 20},
                                         {"pair_communicator_bytes", 544LL << 20}}},
                                       {"optimizer", "sgd"},
                                       {"gradient_bucket_bytes", 4194304.0},
                                       {"gradient_overlap", 0.25},
                                       {"zero", false},
                                       {"micro_batch", 2},
                                       {"micro_batches", 16},
                                       {"recompute", "full"},
                                       {"attention", "unfused"},
                                       {"achievable", false}});
  CHECK(j["pricing"] == to_json(d.pricing));  // the one spelling of the value
  CHECK(describe_training(back.pricing) ==
        "sgd, gradient buckets of 4.00 MiB, 0.25 of the gradient sync overlapped, ZeRO-1/2 not offered, 16 micro-batches of 2 "
        "per data-parallel rank, full recomputation, unfused attention, compute at peak rates");
  // Each setting set back to its default alone: the document differs (none is ignored).
  const std::map<std::string, nlohmann::json> defaults{{"mode", "inference"},
                                                       {"optimizer", "adam"},
                                                       {"gradient_bucket_bytes", 26214400.0},
                                                       {"gradient_overlap", 0.0},
                                                       {"zero", true},
                                                       {"device", to_json(device_model{})},
                                                       {"micro_batch", 0},
                                                       {"micro_batches", 0},
                                                       {"recompute", "choose"},
                                                       {"attention", "flash"},
                                                       {"achievable", true}};
  for (const auto& entry : defaults) {
    const std::string key = entry.first;  // Clang 14 refuses a structured binding in CAPTURE
    CAPTURE(key);
    nlohmann::json k = j;
    k["pricing"][key] = entry.second;
    CHECK(!(plan_from_json(k, "p.json").pricing == d.pricing));
  }
  // Hidden behind each consumer's backward: written as "backward", read back as that model.
  d.pricing.gradient_overlap = gradient_overlap_model::behind_backward();
  const nlohmann::json jb = to_json(d);
  CHECK(jb["pricing"]["gradient_overlap"] == "backward");
  CHECK(plan_from_json(jb, "p.json").pricing == d.pricing);
  CHECK(describe_training(d.pricing) ==
        "sgd, gradient buckets of 4.00 MiB, gradient sync overlapped with each consumer's backward, ZeRO-1/2 not offered, "
        "16 micro-batches of 2 per data-parallel rank, full recomputation, unfused attention, compute at peak rates");
  // Out of range or of the wrong type: named.
  nlohmann::json bad = j;
  bad["pricing"]["gradient_overlap"] = 1.5;
  CHECK(read_error(bad) == "io error: plan file 'p.json': pricing.gradient_overlap is 1.5, not a number in [0, 1]");
  bad["pricing"]["gradient_overlap"] = "forward";
  CHECK(read_error(bad) ==
        "io error: plan file 'p.json': pricing.gradient_overlap is \"forward\", not \"backward\" or a number in [0, 1]");
  bad = j;
  bad["pricing"]["optimizer"] = "lamb";
  CHECK(read_error(bad) == "io error: plan file 'p.json': pricing.optimizer is \"lamb\", not \"none\", \"sgd\" or \"adam\"");
  bad = j;
  bad["pricing"].erase("zero");
  CHECK(read_error(bad) == "io error: plan file 'p.json': pricing has no member \"zero\"");
  bad = j;
  bad["pricing"]["recompute"] = "some";
  CHECK(read_error(bad) ==
        "io error: plan file 'p.json': pricing.recompute is \"some\", not \"choose\", \"none\", \"selective\" or \"full\"");
  bad = j;
  bad["pricing"]["micro_batches"] = -1;
  CHECK(read_error(bad).find("pricing.micro_batches is -1") != std::string::npos);
  // A file written before the runtime reserve was counted has no runtime figures: none.
  nlohmann::json older = j;
  for (const char* key : {"context_bytes", "communicator_bytes", "pair_communicator_bytes"}) older["pricing"]["device"].erase(key);
  step_pricing no_reserve = plan_from_json(j, "p.json").pricing;
  no_reserve.device.context_bytes = no_reserve.device.communicator_bytes = no_reserve.device.pair_communicator_bytes = 0;
  CHECK(plan_from_json(older, "p.json").pricing == no_reserve);
  bad = j;
  bad["pricing"]["device"]["context_bytes"] = -1;
  CHECK(read_error(bad).find("pricing.device.context_bytes is -1") != std::string::npos);
  bad = j;
  bad["pricing"]["device"]["large_matmul_flops"] = 400e12;  // above the device's peak
  CHECK(read_error(bad).find("pricing.device.large_matmul_flops is ") != std::string::npos);
  CHECK(read_error(bad).find("not a number in [0, 3.12e+14]") != std::string::npos);
}

TEST_CASE("numbers: a training plan's micro-batch is its graph's batch over data-parallel ranks") {
  // A hand-edited micro_batch of 16777216 over a graph of 8 sequences was read: `show` said
  // "16777216 micro-batches of 16777216 per data-parallel rank".
  plan_document d = small_plan();  // x [8,16] on 2x2: a micro-batch of 2 (dp 4) to 8 (dp 1)
  d.pricing.micro_batch = 2;
  nlohmann::json j = to_json(d);
  CHECK(read_error(j) == "(no error)");
  for (int mb : {16777216, 9, 1}) {
    j["pricing"]["micro_batch"] = mb;
    CHECK(read_error(j) == "io error: plan file 'p.json': pricing.micro_batch is " + std::to_string(mb) +
                               ", but the graph's micro-step holds 8 sequences: a micro-batch is that batch over the data-parallel "
                               "ranks, from 2 (over the mesh's 4 ranks) to 8");
  }
  j["pricing"]["micro_batch"] = 0;  // the planner's choice, not recorded
  CHECK(read_error(j) == "(no error)");
}

TEST_CASE("plan document: a version-3 file (before micro-batches and recomputation) reads as one step, nothing recomputed, at peak compute") {
  plan_document d = small_plan();
  nlohmann::json v3 = to_json(d);
  v3["version"] = 3;
  for (const char* key : {"micro_batch", "micro_batches", "recompute", "attention", "achievable"}) v3["pricing"].erase(key);
  for (const char* key : {"large_matmul_flops", "sliced_matmul_flops", "achievable_memory_bandwidth", "context_bytes",
                          "communicator_bytes", "pair_communicator_bytes"})
    v3["pricing"]["device"].erase(key);
  const plan_document back = plan_from_json(v3, "p.json");
  CHECK(back.pricing.micro_batches == 1);
  CHECK(back.pricing.micro_batch == 0);
  CHECK(back.pricing.recompute == recompute_policy::none);
  CHECK(back.pricing.attention == attention_kernel::flash);
  CHECK(!back.pricing.achievable);
  CHECK(back.pricing.device == d.pricing.device);
  step_pricing expect = d.pricing;
  set_before_micro_batches(expect);
  CHECK(back.pricing == expect);
}

TEST_CASE("plan document: a version-2 file (mode at the top, device and training under options) reads as the same document") {
  plan_document d = small_plan();
  d.pricing.optimizer = optimizer_kind::sgd;
  d.pricing.gradient_bucket_bytes = 4.0 * (1 << 20);
  d.pricing.gradient_overlap = gradient_overlap_model::behind_backward();
  d.pricing.zero = false;
  const nlohmann::json v2 = as_version_2(d);
  set_before_micro_batches(d.pricing);  // what a file before version 4 was priced as
  CHECK(plan_from_json(v2, "p.json") == d);
  // One written before the training settings were recorded was priced with legacy_pricing().
  nlohmann::json old = v2;
  old["options"].erase("training");
  const step_pricing legacy = plan_from_json(old, "p.json").pricing;
  CHECK(legacy.mode == run_mode::training);  // the file's own mode and device
  CHECK(legacy.device == d.pricing.device);
  CHECK(legacy.optimizer == optimizer_kind::adam);
  CHECK(legacy.gradient_bucket_bytes == 25.0 * (1 << 20));
  CHECK(legacy.gradient_overlap == 0.0);
  CHECK(legacy.zero);
  // Its members are checked where version 2 kept them.
  nlohmann::json bad = v2;
  bad["options"]["training"]["optimizer"] = "lamb";
  CHECK(read_error(bad).find("options.training.optimizer is \"lamb\"") != std::string::npos);
  bad = v2;
  bad["mode"] = "serving";
  CHECK(read_error(bad) == "io error: plan file 'p.json': mode is \"serving\", not \"inference\" or \"training\"");
  bad = v2;
  bad["options"]["device"]["memory_bytes"] = 0;
  CHECK(read_error(bad).find("options.device.memory_bytes is 0, not an integer in [1, ") != std::string::npos);
}

TEST_CASE("pricing enums: to_string and parse are inverse, and an unknown spelling parses to nothing") {
  for (run_mode m : all_run_modes) CHECK(parse_run_mode(to_string(m)) == m);
  for (optimizer_kind o : all_optimizer_kinds) CHECK(parse_optimizer_kind(to_string(o)) == o);
  for (algo a : all_algos) CHECK(parse_algo(to_string(a)) == a);
  CHECK(to_string(optimizer_kind::none) == "none");  // it printed as "adam"
  CHECK(!parse_run_mode("train"));
  CHECK(!parse_optimizer_kind("lamb"));
  CHECK(!parse_algo("zero"));
  CHECK(algo_names() == "\"alpa\", \"megatron\", \"data_parallel\", \"zero3\" or \"fully_replicated\"");
}

TEST_CASE("plan document: what an operator recomputes is written beside it and read back") {
  plan_document d = small_plan();
  d.tensors[2].recompute = recompute_kind::full;
  const nlohmann::json j = to_json(d);
  CHECK(j["tensors"][2]["recompute"] == "full");
  CHECK(!j["tensors"][1].contains("recompute"));  // none is not written
  CHECK(plan_from_json(j, "p.json") == d);
  nlohmann::json bad = j;
  bad["tensors"][2]["recompute"] = "half";
  CHECK(read_error(bad) ==
        "io error: plan file 'p.json': tensors[2].recompute is \"half\", not \"none\", \"selective\" or \"full\"");
}

namespace {

/// small_plan as stage 0's mesh of a pipeline of three stages over 7 layers.
plan_document pipelined_plan() {
  plan_document d = small_plan();
  d.pricing.micro_batches = 3;  // GPipe: every stage holds all 3 (in_flight_micro_batches)
  plan_pipeline p;
  p.schedule = pipeline_schedule::gpipe;
  p.link = {2.5e-5, 12.5e9, 1e-6};
  p.stages = {{0, 2, 0.25, 1000, 3}, {2, 3, 0.375, 2000, 3}, {5, 2, 0.25, 3000, 3}};
  p.transfer_seconds = {1e-4, 2e-4};
  p.step_seconds = 4.5;
  p.bubble_fraction = 0.2;
  p.gradient_sync_seconds = 0.125;
  p.tied_sync_seconds = 0.0625;
  d.pipeline = p;
  return d;
}

}  // namespace

TEST_CASE("plan document: a pipelined plan's stages and schedule are written and read back, and a plan without one writes none") {
  const plan_document d = pipelined_plan();
  const nlohmann::json j = to_json(d);
  REQUIRE(j.contains("pipeline"));
  CHECK(j["pipeline"]["schedule"] == "gpipe");
  CHECK(j["pipeline"]["stages"].size() == 3);
  CHECK(j["pipeline"]["stages"][1]["first_layer"] == 2);
  CHECK(j["pipeline"]["stages"][1]["layers"] == 3);
  CHECK(j["pipeline"]["link"]["bandwidth_Bps"] == 12.5e9);
  const plan_document back = plan_from_json(j, "p.json");
  REQUIRE(back.pipeline);
  CHECK(*back.pipeline == *d.pipeline);
  CHECK(back == d);
  plan_document other = d;
  other.pipeline.value().stages.at(2).in_flight = 1;
  CHECK(!(other == d));  // the pipeline takes part in equality
  CHECK(!to_json(small_plan()).contains("pipeline"));
  CHECK(!plan_from_json(to_json(small_plan()), "p.json").pipeline);
  // Through the one writer and reader.
  temp_plan f;
  write_plan_file(d, f.path);
  CHECK(read_plan_file(f.path.string()) == d);
}

TEST_CASE("plan document: a version-4 file (before pipelines) reads without a pipeline, even one that has the member") {
  nlohmann::json j = to_json(pipelined_plan());
  j["version"] = 4;
  j["pipeline"]["stages"] = "not read";
  CHECK(!plan_from_json(j, "p.json").pipeline);
}

TEST_CASE("plan document: a pipeline whose stages do not follow each other, or whose numbers are out of range, is refused by name") {
  const nlohmann::json j = to_json(pipelined_plan());
  nlohmann::json bad = j;
  bad["pipeline"]["stages"][1]["first_layer"] = 3;
  CHECK(read_error(bad) == "io error: plan file 'p.json': pipeline.stages[1].first_layer is 3, not 2, where the stage before ends");
  bad = j;
  bad["pipeline"]["stages"][0]["first_layer"] = 1;
  CHECK(read_error(bad) == "io error: plan file 'p.json': pipeline.stages[0].first_layer is 1, not 0, where the stage before ends");
  bad = j;
  bad["pipeline"]["stages"] = nlohmann::json::array();
  CHECK(read_error(bad) == "io error: plan file 'p.json': pipeline.stages is empty: a pipeline has at least one stage");
  bad = j;
  bad["pipeline"]["transfer_seconds"] = {1e-4};
  CHECK(read_error(bad) ==
        "io error: plan file 'p.json': pipeline.transfer_seconds has 1 times for the 2 boundaries of 3 stages");
  bad = j;
  bad["pipeline"]["schedule"] = "interleaved";
  CHECK(read_error(bad) == "io error: plan file 'p.json': pipeline.schedule is \"interleaved\", not \"1f1b\" or \"gpipe\"");
  bad = j;
  bad["pipeline"]["stages"][2]["layers"] = -1;
  CHECK(read_error(bad).find("pipeline.stages[2].layers is -1") != std::string::npos);
  bad = j;
  bad["pipeline"]["step_seconds"] = "fast";
  CHECK(read_error(bad).find("pipeline.step_seconds is \"fast\"") != std::string::npos);
  bad = j;
  bad["pipeline"]["link"]["bandwidth_Bps"] = 0;
  CHECK(read_error(bad).find("pipeline.link.bandwidth_Bps is 0") != std::string::npos);
  // A stage between the first and the last holds layers or nothing (`shard --plan` wrote the
  // stages before such a stage, then failed on it); the first and the last may hold none (the
  // embedding alone, the head alone), and every stage holds a micro-batch in flight.
  bad = j;
  bad["pipeline"]["stages"][1]["layers"] = 0;
  bad["pipeline"]["stages"][2]["first_layer"] = 2;
  CHECK(read_error(bad) == "io error: plan file 'p.json': pipeline.stages[1].layers is 0, not an integer in [1, 2147483645]: "
                           "stage 1 lies between the first (the embedding) and the last (the head), so it holds nothing but its layers");
  nlohmann::json ends = j;
  ends["pipeline"]["stages"][0]["layers"] = 0;
  ends["pipeline"]["stages"][1]["first_layer"] = 0;
  ends["pipeline"]["stages"][2]["first_layer"] = 3;
  ends["pipeline"]["stages"][2]["layers"] = 0;
  CHECK(plan_from_json(ends, "p.json").pipeline->stages.at(2).layers == 0);
  bad = j;
  bad["pipeline"]["stages"][0]["in_flight"] = 0;
  CHECK(read_error(bad) == "io error: plan file 'p.json': pipeline.stages[0].in_flight is 0, not an integer in [1, 2147483647]");
  // In range but not what the schedule implies (round nine's pipe-in-flight): GPipe holds every
  // micro-batch on every stage, 1F1B min(stages - k, micro-batches) on stage k.
  bad = j;
  bad["pipeline"]["stages"][1]["in_flight"] = 2;
  CHECK(read_error(bad) == "io error: plan file 'p.json': pipeline.stages[1].in_flight is 2, not 3, what the schedule implies: "
                           "under gpipe every stage holds all 3 micro-batches of the step");
  nlohmann::json one_f = j;
  one_f["pipeline"]["schedule"] = "1f1b";
  for (int k = 0; k < 3; ++k) one_f["pipeline"]["stages"][k]["in_flight"] = 3 - k;
  CHECK(plan_from_json(one_f, "p.json").pipeline->stages.at(1).in_flight == 2);
  one_f["pipeline"]["stages"][2]["in_flight"] = 3;
  CHECK(read_error(one_f) == "io error: plan file 'p.json': pipeline.stages[2].in_flight is 3, not 1, what the schedule implies: "
                             "under 1f1b stage 2 of 3 holds min(3 - 2, 3 micro-batches of the step) at once");
  // Stages times the stage's devices bounded like any mesh's, before a stage is read: 2^18 + 1
  // stages of 4 devices are more than 2^20.
  bad = j;
  bad["pipeline"]["stages"] = std::vector<int>((1 << 18) + 1, 0);
  CHECK(read_error(bad) == "io error: plan file 'p.json': pipeline.stages has 262145 stages of 4 devices, more than the 1048576 "
                           "devices a plan may have");
}

// Hardening round ten: options.pinned was read as it stood, pins of tensors the graph does not
// have or of specs that do not parse (a hand edit) included, and written back as the settings
// the plan was made with.
TEST_CASE("hardening: a plan's pins name its tensors and are their output specs") {
  const nlohmann::json j = to_json(small_plan());  // pins x to S0R, x's output
  CHECK(read_error(j) == "(no error)");
  nlohmann::json bad = j;
  bad["options"]["pinned"]["nope"] = "S0R";
  CHECK(read_error(bad) == "io error: plan file 'p.json': options.pinned.nope pins 'nope', which is no tensor of the plan's graph");
  bad = j;
  bad["options"]["pinned"]["x"] = "S9";
  CHECK(read_error(bad).find("options.pinned.x is \"S9\", which does not fit: spec error: ") != std::string::npos);
  bad["options"]["pinned"]["x"] = "RS1";
  CHECK(read_error(bad) == "io error: plan file 'p.json': options.pinned.x is \"RS1\", not 'S0R', the output spec of 'x' in tensors, "
                           "which the pin forced");
}

// Hardening round ten: a strategy's name spells its specs, and the file's inputs and output were
// read beside it unchecked: a hand-edited output "RS1" beside "->S1R zero-1" (with its local
// shape) made shard --plan cut the weight by columns while every export told the runtime rows.
TEST_CASE("hardening: a plan tensor's inputs and output are the specs its strategy names") {
  nlohmann::json j = to_json(small_plan());
  j["tensors"][1]["strategy"] = "->S1R zero-1";  // a suffix after the specs is the strategy's own
  CHECK(read_error(j) == "(no error)");
  j["tensors"][1]["output"] = "RS1";
  j["tensors"][1]["local_shape"] = {32, 8};
  j["tensors"][2]["inputs"][1] = "RS1";
  CHECK(read_error(j) == "io error: plan file 'p.json': tensors[1].strategy is \"->S1R zero-1\", which takes and gives '->S1R', but the "
                         "inputs and output of 'w' are '->RS1'");
  j = to_json(small_plan());
  j["tensors"][2]["inputs"][0] = "RR";
  CHECK(read_error(j) == "io error: plan file 'p.json': tensors[2].strategy is \"S0R,S1R->S0S1\", which takes and gives 'S0R,S1R->S0S1', "
                         "but the inputs and output of 'fc' are 'RR,S1R->S0S1'");
}

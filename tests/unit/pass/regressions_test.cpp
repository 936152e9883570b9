// Inputs the fuzzers (fuzz/, docs/fuzzing.md) found crashing, each fed to the library and
// required to give a clean error.
#include <doctest/doctest.h>

#include <autoshard/pass/pass.hpp>
#include <unistd.h>
#include <filesystem>
#include <fstream>

#include <string>

TEST_CASE("regression: fuzz_plan_json, integers beyond 2^64 and floats where a plan file has integers") {
  // fuzz_plan_json crash-d8ee5153 (the long campaign): "version": 18446744073750591615 parses
  // as a double, and nlohmann's get<int> of it was undefined behaviour (UBSan: outside the
  // range of int). Every integer of a plan file is now checked: io_error naming the member.
  autoshard::model_graph g;
  const auto x = autoshard::add_input(g, "x", {8, 16}, autoshard::dtype::f32);
  const auto w = autoshard::add_parameter(g, "w", {4, 16}, autoshard::dtype::f32);
  autoshard::add_op(g, autoshard::op_kind::linear, "fc", {x, w});
  autoshard::autosharding_options o;
  o.mesh = autoshard::make_cluster_mesh({2, 2});
  o.compare_baselines = false;
  const std::string path = (std::filesystem::temp_directory_path() / ("autoshard-crash-" + std::to_string(::getpid()) + ".json")).string();
  o.ilp_solution_file = path;
  (void)autoshard::autosharding_analysis_pass(g, o);
  nlohmann::json good;
  {
    std::ifstream in(path);
    good = nlohmann::json::parse(in);
  }
  std::filesystem::remove(path);
  auto load = [&](const std::string& edit_path, const nlohmann::json& value) {
    nlohmann::json j = good;
    j[nlohmann::json::json_pointer(edit_path)] = value;
    return autoshard::plan_from_json(j, "crash.json");
  };
  CHECK_THROWS_WITH_AS(load("/version", nlohmann::json::parse("18446744073750591615")),
                       doctest::Contains("version is 1.844674407375059"), autoshard::io_error);
  CHECK_THROWS_WITH_AS(load("/version", 1.5), doctest::Contains("version is 1.5, not an integer"), autoshard::io_error);
  CHECK_THROWS_WITH_AS(load("/mesh/axes/0/size", 1e30), doctest::Contains("mesh.axes[0].size is 1e+30"), autoshard::io_error);
  CHECK_THROWS_WITH_AS(load("/mesh/axes/1/size", -2), doctest::Contains("mesh.axes[1].size is -2"), autoshard::io_error);
  CHECK_THROWS_WITH_AS(load("/tensors/0/local_shape/1", 9.5e40), doctest::Contains("tensors[0].local_shape[1] is 9.5e+40"),
                       autoshard::io_error);
}

TEST_CASE("regression: a plan whose mesh asks for 10^16 devices is refused before anything is allocated") {
  // Issue 17 item 2: a plan with mesh [99999999, 99999999] grew memory without end.
  const nlohmann::json axis{{"size", 99999999}, {"latency_s", 5e-6}, {"bandwidth_Bps", 1e11}};
  const nlohmann::json huge{{"axes", {axis, axis}}};
  CHECK_THROWS_WITH_AS(autoshard::mesh_from_json(autoshard::json_in(huge, "plan file 'p.json'", "mesh")),
                       "io error: plan file 'p.json': mesh.axes[0].size is 99999999, not an integer in [1, 1000000]",
                       autoshard::io_error);
  nlohmann::json wide = huge;  // each axis allowed, the product not
  for (auto& a : wide["axes"]) a["size"] = 4096;
  CHECK_THROWS_WITH_AS(autoshard::mesh_from_json(autoshard::json_in(wide, "plan file 'p.json'", "mesh")),
                       doctest::Contains("mesh.axes the mesh has more than 1048576 ranks"), autoshard::io_error);
}

TEST_CASE("regression: megatron refuses a mesh whose names put tensor parallelism off its last axis") {
  // Hardening round thirteen, megatron-names: on --mesh tp=4,dp=2 megatron split its tensor
  // parallelism over the last axis, named dp, and reported "tp 2, dp 4" with its all-reduces on
  // "mesh axis 1 (dp)"; the exports then took axis 0, named tp, for the plan's.
  autoshard::model_graph g;
  const auto x = autoshard::add_input(g, "x", {8, 16}, autoshard::dtype::f32);
  autoshard::add_op(g, autoshard::op_kind::linear, "fc", {x, autoshard::add_parameter(g, "w", {8, 16}, autoshard::dtype::f32)});
  autoshard::autosharding_options o;
  o.algo = autoshard::algo::megatron;
  o.pricing.mode = autoshard::run_mode::inference;
  o.compare_baselines = false;
  o.mesh = autoshard::parse_mesh("tp=4,dp=2");
  CHECK_THROWS_WITH_AS((void)autoshard::autosharding_analysis_pass(g, o),
                       "solver error: megatron: tensor parallelism runs on the mesh's last axis (the devices of a node), but "
                       "mesh(tp=4,dp=2) names mesh axis 0 (tp): name the last axis tp (e.g. dp=2,tp=4), or leave the names out",
                       autoshard::solver_error);
  o.mesh = autoshard::parse_mesh("a=2,dp=4");
  CHECK_THROWS_WITH_AS((void)autoshard::autosharding_analysis_pass(g, o), doctest::Contains("names mesh axis 1 (dp): name the last axis tp"),
                       autoshard::solver_error);
  // The names where megatron puts them, no names, or no tensor parallelism at all (--tp 1): planned.
  for (const char* mesh : {"dp=2,tp=4", "2x4", "tp=8"}) {
    o.mesh = autoshard::parse_mesh(mesh);
    CHECK(autoshard::autosharding_analysis_pass(g, o).report.plan.feasible);
  }
  o.mesh = autoshard::parse_mesh("tp=4,dp=2");
  o.tensor_parallel = 1;
  CHECK(autoshard::autosharding_analysis_pass(g, o).report.plan.feasible);
  // As alpa's baseline, megatron is not feasible, and says why; alpa plans.
  o.algo = autoshard::algo::alpa;
  o.tensor_parallel = 0;
  o.compare_baselines = true;
  const autoshard::autosharding_result r = autoshard::autosharding_analysis_pass(g, o);
  CHECK(r.report.plan.feasible);
  bool said = false;
  for (const auto& b : r.report.baselines)
    said = said || (b.algo == autoshard::algo::megatron && !b.feasible && b.why_not.find("names mesh axis 0 (tp)") != std::string::npos);
  CHECK(said);
}

// Plan files fed to preload_solution that do not fit: two inputs fuzz_plan_json found
// crashing (regressions) and a plan for another model (fault injection).
#include <doctest/doctest.h>

#include <autoshard/graph/graph.hpp>
#include <autoshard/pass/pass.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace {
namespace fs = std::filesystem;

struct plan_fixture {
  autoshard::model_graph g = autoshard::from_json(nlohmann::json::parse(R"({"nodes": [
    {"name": "x", "kind": "input", "shape": [8, 16], "dtype": "f32"},
    {"name": "w", "kind": "parameter", "shape": [32, 16], "dtype": "f32"},
    {"name": "fc", "kind": "linear", "shape": [8, 32], "dtype": "f32", "inputs": ["x", "w"]}]})"));
  fs::path file = fs::temp_directory_path() / ("autoshard-plan-faults-" + std::to_string(::getpid()) + ".json");
  autoshard::autosharding_options opt;
  plan_fixture() {
    opt.pricing.mode = autoshard::run_mode::inference;  // "another mode" below asks for training
    opt.mesh = autoshard::make_cluster_mesh({2, 2});
    opt.compare_baselines = false;
    opt.ilp_solution_file = file.string();
    autoshard::autosharding_analysis_pass(g, opt);  // writes a valid plan
    opt.preload_solution = true;
  }
  ~plan_fixture() {
    std::error_code ec;
    fs::remove(file, ec);
  }
  nlohmann::json plan() const {
    std::ifstream in(file);
    return nlohmann::json::parse(in);
  }
  void write(const nlohmann::json& j) const { std::ofstream(file) << j.dump(); }
  template <class E>
  std::string error() const {
    try {
      autoshard::autosharding_analysis_pass(g, opt);
    } catch (const E& e) {
      return e.what();
    }
    return "(no error)";
  }
};
}  // namespace

autoshard::model_graph mlp(std::int64_t width, const char* name = "fc") {
  autoshard::model_graph g;
  const auto x = autoshard::add_input(g, "x", {8, 16}, autoshard::dtype::f32);
  const auto w = autoshard::add_parameter(g, "w", {width, 16}, autoshard::dtype::f32);
  autoshard::add_op(g, autoshard::op_kind::linear, name, {x, w});
  return g;
}

TEST_CASE("regression: fuzz_plan_json, \"algo\" that is not a string") {
  // fuzz_plan_json crash-c6cc646b: j.value("algo", ...) threw nlohmann type_error past the pass.
  plan_fixture f;
  auto j = f.plan();
  j["options"]["algo"] = 7;
  f.write(j);
  CHECK(f.error<autoshard::io_error>().find("options.algo is 7, not a string") != std::string::npos);
}

TEST_CASE("regression: fuzz_plan_json, a mesh shape with a 0 axis") {
  // fuzz_plan_json crash-bda968bb: the mismatch message built a device_mesh from the file's
  // shape [0], which threw spec_error instead of the documented error; a 0 axis is now
  // refused as it is read, as an io_error naming the member.
  plan_fixture f;
  auto j = f.plan();
  j["mesh"]["axes"][0]["size"] = 0;
  f.write(j);
  CHECK(f.error<autoshard::io_error>().find("mesh.axes[0].size is 0, not an integer in [1, ") != std::string::npos);
}

TEST_CASE("faults: a plan file for another model is a solver_error naming the difference") {
  plan_fixture f;
  SUBCASE("another graph: a vertex the plan does not have") {
    f.g = mlp(32, "fc2");
    CHECK(f.error<autoshard::solver_error>().find("has no tensor 'fc2'") != std::string::npos);
  }
  SUBCASE("another shape") {
    f.g = mlp(64);
    CHECK(f.error<autoshard::solver_error>().find("tensor 'w' has shape [32,16] in the file but [64,16] in the graph") !=
          std::string::npos);
  }
  SUBCASE("another mode") {
    f.opt.pricing.mode = autoshard::run_mode::training;
    CHECK(f.error<autoshard::solver_error>().find("is a inference plan") == std::string::npos);
    CHECK(f.error<autoshard::solver_error>().find("is an inference plan") != std::string::npos);
  }
  SUBCASE("another mesh shape") {
    f.opt.mesh = autoshard::make_cluster_mesh({4});
    CHECK(f.error<autoshard::solver_error>().find("is for mesh mesh(2,2), not mesh(4)") != std::string::npos);
  }
  SUBCASE("not JSON") {
    std::ofstream(f.file) << "{";
    CHECK(f.error<autoshard::io_error>().find("is not valid JSON") != std::string::npos);
  }
}

// Inputs the fuzzers (fuzz/, docs/fuzzing.md) found crashing, each fed to the library and
// required to give a clean error.
#include <doctest/doctest.h>

#include <autoshard/solve/solve.hpp>

#include <sstream>
#include <string>
#include <vector>

TEST_CASE("regression: fuzz_iopddl, usages whose sum overflows int64") {
  // fuzz_iopddl crash-cf14c157: two live nodes of 9e18 bytes each; the usage sweep added them
  // in int64 (UBSan: signed integer overflow in problem.hpp).
  std::istringstream in(R"({"problem":{"nodes":{"intervals":[[0,2],[1,3]],"costs":[[1],[1]],)"
                        R"("usages":[[9000000000000000000],[9000000000000000000]]},)"
                        R"("edges":{"nodes":[[0,1]],"costs":[[0]]}}})");
  const autoshard::strategy_problem p = autoshard::read_iopddl(in, "crash.json");
  CHECK_NOTHROW(p.validate());
  std::string msg;
  try {
    (void)p.min_peak_usage();
  } catch (const autoshard::solver_error& e) {
    msg = e.what();
  }
  CHECK(msg == "solver error: summed usage at time 1 exceeds 2^63-1 bytes");
  const std::vector<int> choice{0, 0};
  CHECK_THROWS_AS((void)p.peak_usage(choice), autoshard::solver_error);
}

TEST_CASE("regression: fuzz_plan_json, integers beyond 2^64 and floats where a plan file has integers") {
  // fuzz_plan_json crash-d8ee5153 (the long campaign): "version": 18446744073750591615 parses
  // as a double, and nlohmann's get<int> of it was undefined behaviour (UBSan: outside the
  // range of int). Every integer of a plan file is now checked: io_error naming the member.
  autoshard::model_graph g;
  const auto x = autoshard::add_input(g, "x", {8, 16}, autoshard::dtype::f32);
  const auto w = autoshard::add_parameter(g, "w", {4, 16}, autoshard::dtype::f32);
  autoshard::add_op(g, autoshard::op_kind::linear, "fc", {x, w});
  autoshard::autosharding_options o;
  o.mesh_shape = {2, 2};
  o.compare_baselines = false;
  const autoshard::detail::pass_model pm(g, o);
  auto load = [&](const std::string& text) {
    const nlohmann::json j = nlohmann::json::parse(text);
    return autoshard::detail::plan_from_json(pm, j, "crash.json");
  };
  CHECK_THROWS_WITH_AS(load(R"({"format": "autoshard.plan", "version": 18446744073750591615})"),
                       doctest::Contains("version is 1.844674407375059"), autoshard::io_error);
  CHECK_THROWS_WITH_AS(load(R"({"format": "autoshard.plan", "version": 1.5})"), doctest::Contains("version is 1.5, not an integer"),
                       autoshard::io_error);
  CHECK_THROWS_WITH_AS(load(R"({"format": "autoshard.plan", "version": 1, "mesh": {"shape": [1e30, 2]}})"),
                       doctest::Contains("mesh.shape[0] is 1e+30"), autoshard::io_error);
  CHECK_THROWS_WITH_AS(load(R"({"format": "autoshard.plan", "version": 1, "mesh": {"shape": [2, -2]}})"),
                       doctest::Contains("mesh.shape[1] is -2"), autoshard::io_error);
  CHECK_THROWS_WITH_AS(load(R"({"format": "autoshard.plan", "version": 1, "mesh": {"shape": [2, 2]}, "mode": "inference",
      "operators": [{"name": "x", "shape": [8, 9.5e40], "strategy": "->RR"}, {"name": "w"}, {"name": "fc"}]})"),
                       doctest::Contains("operator 'x'.shape[1] is 9.5e+40"), autoshard::io_error);
}

// strategy_problem evaluation and the IOPDDL reader/writer.
#include <doctest/doctest.h>

#include <autoshard/solve/solve.hpp>

#include <filesystem>
#include <random>
#include <sstream>
#include <string>

#include "brute.hpp"

namespace {

autoshard::strategy_problem example() {
  return autoshard::read_iopddl_file(AUTOSHARD_TEST_DATA_DIR "/solve/example.json");
}

// Parse `text`; expect an io_error whose message contains `needle`.
void expect_io_error(const std::string& text, const std::string& needle) {
  CAPTURE(text);
  std::istringstream in(text);
  CHECK_THROWS_WITH_AS(autoshard::read_iopddl(in, "doc.json"), doctest::Contains(needle.c_str()),
                       autoshard::io_error);
}

const char* const good_prefix = R"({"problem":{"name":"x","nodes":{"intervals":[[0,2],[1,3]],)";

}  // namespace

TEST_CASE("the IOPDDL example reads as the contest README describes") {
  const autoshard::strategy_problem p = example();
  CHECK(p.name == "example");
  REQUIRE(p.nodes.size() == 5);
  CHECK(p.nodes[2].costs == std::vector<double>{25, 45, 35});
  CHECK(p.nodes[2].usages == std::vector<std::int64_t>{15, 20, 15});
  CHECK(p.nodes[2].live == autoshard::live_interval{50, 120});
  REQUIRE(p.edges.size() == 5);
  CHECK(p.edges[2].from == 1);
  CHECK(p.edges[2].to == 3);
  CHECK(p.usage_limit == 50);
  // The README's answer [0, 0, 2, 1, 0]: 15+55+35+75+95 node, 30+40+10+30+60 edge costs.
  CHECK(p.cost_of({0, 0, 2, 1, 0}) == 445.0);
  // Peak at [50, 70): nodes 0, 1, 2 live = 10 + 25 + 15.
  const autoshard::usage_peak pk = p.peak_usage(std::vector<int>{0, 0, 2, 1, 0});
  CHECK(pk.bytes == 50);
  CHECK(pk.time == 50);
  // Half-open intervals: nodes 3, 4 start at 110 while node 2 ends at 120: 15 + 10 + 15.
  CHECK(p.peak_usage(std::vector<int>{0, 0, 1, 0, 0}).bytes == 55);
}

TEST_CASE("IOPDDL round trip: write then read gives the same problem") {
  std::mt19937 rng(42);
  solve_test::random_spec spec;
  spec.p_inf = 0.1;  // "inf" extension
  for (int k = 0; k < 20; ++k) {
    autoshard::strategy_problem p = solve_test::random_problem(rng, spec);
    p.name = "random " + std::to_string(k);
    if (k % 2) p.usage_limit = 17;
    if (k % 3 == 0) p.nodes[0].name = "layer.0/attn";
    std::ostringstream out;
    autoshard::write_iopddl(out, p);
    std::istringstream in(out.str());
    CHECK(autoshard::read_iopddl(in) == p);
  }
  // Fractional costs keep their value (seconds), integral ones are written as integers.
  autoshard::strategy_problem q = example();
  q.nodes[1].costs[0] = 1.25e-6;
  const nlohmann::json j = autoshard::to_iopddl_json(q);
  CHECK(j["problem"]["nodes"]["costs"][0][0].is_number_integer());
  CHECK(j["problem"]["nodes"]["costs"][1][0].get<double>() == 1.25e-6);
  CHECK(autoshard::parse_iopddl(j) == q);
  // Through a file as well.
  const auto file = std::filesystem::temp_directory_path() / "autoshard_solve_roundtrip.json";
  autoshard::write_iopddl_file(file, q);
  CHECK(autoshard::read_iopddl_file(file) == q);
  std::filesystem::remove(file);
}

TEST_CASE("malformed IOPDDL documents name the JSON path") {
  expect_io_error("{", "doc.json: not valid JSON");
  expect_io_error("[]", "<root>: expected an object, got array");
  expect_io_error(R"({"problem":{}})", "problem: missing member \"nodes\"");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2]],"usages":[[0],[0]]}}})",
                  "problem: missing member \"edges\"");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],"two"],"usages":[[0],[0]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.costs[1]: expected an array, got string");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[true]],"usages":[[0],[0]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.costs[1][0]: expected a cost");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2,3]],"usages":[[0],[0]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.usages[1]: 1 usages for 2 strategies");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2]],"usages":[[0],[-4]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.usages[1][0]: negative usage -4");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[]],"usages":[[0],[]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.costs[1]: a node needs at least one strategy");
  expect_io_error(R"({"problem":{"nodes":{"intervals":[[3,2]],"costs":[[1]],"usages":[[0]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.intervals[0]: end before begin");
  expect_io_error(R"({"problem":{"nodes":{"intervals":[[0,1.5]],"costs":[[1]],"usages":[[0]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.intervals[0][1]: expected an integer, got 1.5");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2,3]],"usages":[[0],[0,0]]},"edges":{"nodes":[[0,2]],"costs":[[1,2]]}}})",
                  "problem.edges.nodes[0]: node 2 out of range [0, 2)");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2,3]],"usages":[[0],[0,0]]},"edges":{"nodes":[[0,1]],"costs":[[1,2,3]]}}})",
                  "problem.edges.costs[0]: 3 costs for edge [0, 1], expected 1x2 = 2");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2,3]],"usages":[[0],[0,0]]},"edges":{"nodes":[[0,1]],"costs":[]}}})",
                  "problem.edges: 1 node pairs but 0 cost lists");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2]],"usages":[[0],[0]]},"edges":{"nodes":[],"costs":[]},"usage_limit":"lots"}})",
                  "problem.usage_limit: expected an integer, got string");
  CHECK_THROWS_WITH_AS(autoshard::read_iopddl_file("/nonexistent/x.json"),
                       doctest::Contains("cannot open '/nonexistent/x.json'"), autoshard::io_error);
  // A null usage_limit means none.
  std::istringstream ok(std::string(good_prefix) +
                        R"("costs":[[1],[2]],"usages":[[0],[0]]},"edges":{"nodes":[],"costs":[]},"usage_limit":null}})");
  CHECK_FALSE(autoshard::read_iopddl(ok).usage_limit.has_value());
}

TEST_CASE("validate and cost_of reject malformed problems and choices") {
  autoshard::strategy_problem p = example();
  CHECK_THROWS_WITH_AS(p.cost_of({0, 0, 3, 0, 0}), doctest::Contains("node 2: strategy 3 out of range [0, 3)"),
                       autoshard::solver_error);
  CHECK_THROWS_WITH_AS(p.cost_of({0, 0}), doctest::Contains("2 entries for 5 nodes"), autoshard::solver_error);
  p.nodes[1].usages.push_back(3);
  CHECK_THROWS_WITH_AS(p.validate(), doctest::Contains("node 1 has 2 costs but 3 usages"), autoshard::solver_error);
  p = example();
  p.edges[4].to = 9;
  CHECK_THROWS_WITH_AS(p.validate(), doctest::Contains("edge 4 [3, 9] names a node beyond the 5 nodes"),
                       autoshard::solver_error);
  p = example();
  p.nodes[0].costs[0] = std::nan("");
  CHECK_THROWS_AS(p.validate(), autoshard::solver_error);
}

// strategy_problem evaluation and the IOPDDL reader/writer.
#include <doctest/doctest.h>

#include <autoshard/solve/solve.hpp>

#include <filesystem>
#include <random>
#include <sstream>
#include <string>

#include "brute.hpp"
#include "unit/scratch.hpp"

namespace {

constexpr std::int64_t infinite_cost_minus_one() { return autoshard::infinite_cost - 1; }

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
  CHECK(p.nodes[2].costs == std::vector<std::int64_t>{25, 45, 35});
  CHECK(p.nodes[2].usages == std::vector<std::int64_t>{15, 20, 15});
  CHECK(p.nodes[2].live == autoshard::live_interval{50, 120});
  REQUIRE(p.edges.size() == 5);
  CHECK(p.edges[2].from == 1);
  CHECK(p.edges[2].to == 3);
  CHECK(p.usage_limit == 50);
  // The README's answer [0, 0, 2, 1, 0]: 15+55+35+75+95 node, 30+40+10+30+60 edge costs.
  CHECK(p.cost_of({0, 0, 2, 1, 0}) == 445);
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
  // Forbidden costs are written as the integers they are (the contest's 1e18, or larger).
  autoshard::strategy_problem q = example();
  q.nodes[1].costs[0] = autoshard::infinite_cost;
  q.nodes[1].costs[1] = autoshard::infinite_cost + 5;
  const nlohmann::json j = autoshard::to_iopddl_json(q);
  CHECK(j["problem"]["nodes"]["costs"][1][0].get<std::int64_t>() == 1000000000000000000);
  CHECK(autoshard::parse_iopddl(j) == q);
  // Through a file as well.
  const auto file = autoshard_test::unique_temp_path("solve_roundtrip.json");
  autoshard::write_iopddl_file(file, q);
  CHECK(autoshard::read_iopddl_file(file) == q);
  std::filesystem::remove(file);
}

TEST_CASE("malformed IOPDDL documents name the JSON path") {
  expect_io_error("{", "doc.json is not valid JSON");
  expect_io_error("[]", "doc.json: the document is [], not an object");
  expect_io_error(R"({"problem":{}})", "doc.json: problem has no member \"nodes\"");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2]],"usages":[[0],[0]]}}})",
                  "doc.json: problem has no member \"edges\"");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],"two"],"usages":[[0],[0]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.costs[1] is \"two\", not an array");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[true]],"usages":[[0],[0]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.costs[1][0] is true, not a cost");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2,3]],"usages":[[0],[0]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.usages[1] has 1 usages for 2 strategies");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2]],"usages":[[0],[-4]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.usages[1][0] is -4, not an integer in [0, ");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[]],"usages":[[0],[]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.costs[1] is empty; a node needs at least one strategy");
  expect_io_error(R"({"problem":{"nodes":{"intervals":[[3,2]],"costs":[[1]],"usages":[[0]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.intervals[0] ends before it begins: [3,2]");
  expect_io_error(R"({"problem":{"nodes":{"intervals":[[0,1.5]],"costs":[[1]],"usages":[[0]]},"edges":{"nodes":[],"costs":[]}}})",
                  "problem.nodes.intervals[0][1] is 1.5, not an integer");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2,3]],"usages":[[0],[0,0]]},"edges":{"nodes":[[0,2]],"costs":[[1,2]]}}})",
                  "problem.edges.nodes[0][1] is 2, not an integer in [0, 1]");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2,3]],"usages":[[0],[0,0]]},"edges":{"nodes":[[0,1]],"costs":[[1,2,3]]}}})",
                  "problem.edges.costs[0] has 3 costs for edge [0, 1], expected 1x2 = 2");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2,3]],"usages":[[0],[0,0]]},"edges":{"nodes":[[0,1]],"costs":[]}}})",
                  "problem.edges has 1 node pairs but 0 cost lists");
  expect_io_error(std::string(good_prefix) + R"("costs":[[1],[2]],"usages":[[0],[0]]},"edges":{"nodes":[],"costs":[]},"usage_limit":"lots"}})",
                  "problem.usage_limit is \"lots\", not an integer");
  CHECK_THROWS_WITH_AS(autoshard::read_iopddl_file("/nonexistent/x.json"),
                       doctest::Contains("cannot open IOPDDL problem '/nonexistent/x.json'"), autoshard::io_error);
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
  p.nodes[0].costs[0] = -1;
  CHECK_THROWS_WITH_AS(p.validate(), doctest::Contains("node 0 strategy 0 has negative cost -1"),
                       autoshard::solver_error);
}

TEST_CASE("evaluate is the contest's Evaluate: forbidden picks, the limit at every time point, exact totals") {
  autoshard::strategy_problem p = example();
  const std::vector<int> answer{0, 0, 2, 1, 0};
  autoshard::evaluation ev = p.evaluate(answer);
  CHECK(ev.feasible);
  CHECK(ev.objective == 445);
  CHECK(ev.peak.bytes == 50);
  // Over the limit: [0, 0, 1, 0, 0] reaches 55 at time 50 (nodes 0, 1, 2 live: 10 + 25 + 20).
  ev = p.evaluate(std::vector<int>{0, 0, 1, 0, 0});
  CHECK_FALSE(ev.feasible);
  CHECK(ev.why == "summed usage 55 at time 50 exceeds usage_limit 50");
  // A node cost of 1e18 is a forbidden pick, not a term; so is an edge entry above it.
  p.nodes[2].costs[2] = autoshard::infinite_cost;
  ev = p.evaluate(answer);
  CHECK_FALSE(ev.feasible);
  CHECK(ev.why == "node 2 strategy 2 is forbidden (cost 1000000000000000000 >= 1e18)");
  p = example();
  p.edges[2].costs[1] = autoshard::infinite_cost + 1;  // edge [1, 3]: node 1 at 0, node 3 at 1
  ev = p.evaluate(answer);
  CHECK_FALSE(ev.feasible);
  CHECK(ev.why.find("edge 2 [1, 3] pair (0, 1) is forbidden") == 0);
  // Finite costs whose total reaches 1e18 (int64 sums would overflow past 2^63): infeasible.
  p = example();
  for (auto& n : p.nodes)
    for (auto& c : n.costs) c = infinite_cost_minus_one();
  ev = p.evaluate(answer);
  CHECK_FALSE(ev.feasible);
  CHECK(ev.why == "the total cost 5000000000000000165 reaches the contest's infinity 1e18");
  CHECK(p.cost_of(answer) == autoshard::infinite_cost);
}

TEST_CASE("solution files: the contest's list of indices, written then read, and clear errors") {
  const autoshard::strategy_problem p = example();
  const auto file = autoshard_test::unique_temp_path("solve_solution.json");
  autoshard::write_iopddl_solution_file(file, {0, 0, 2, 1, 0});
  CHECK(autoshard::read_iopddl_solution_file(file, p) == std::vector<int>{0, 0, 2, 1, 0});
  CHECK_THROWS_WITH_AS(autoshard::parse_iopddl_solution(nlohmann::json::parse("[0, 0, 3, 1, 0]"), p, "s.json"),
                       doctest::Contains("s.json: [2] is 3, not a strategy index in [0, 3) of node 2"),
                       autoshard::io_error);
  CHECK_THROWS_WITH_AS(autoshard::parse_iopddl_solution(nlohmann::json::parse("[0, 0]"), p, "s.json"),
                       doctest::Contains("2 strategy indices for 5 nodes"), autoshard::io_error);
  CHECK_THROWS_WITH_AS(autoshard::parse_iopddl_solution(nlohmann::json::parse("[0, 0, 18446744073709551615, 1, 0]"), p),
                       doctest::Contains("not a strategy index"), autoshard::io_error);
  std::filesystem::remove(file);
}

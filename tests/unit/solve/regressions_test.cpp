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

// Hardening round ten: a node whose smallest allowed usage is exactly 2^63-1 was counted as
// using nothing (2^63-1 was min_peak_usage's "no allowed strategy" sentinel), so the usage limit
// passed its check and the ILP's refusal blamed the forbidden pairs: "usage_limit 50 cannot be
// met together with the forbidden (infinite-cost) pairs; the smallest budget ignoring them is 40".
TEST_CASE("hardening: a usage of 2^63-1 counts in the smallest peak") {
  std::istringstream in(R"({"problem":{"nodes":{"intervals":[[0,2],[5,6]],"costs":[[1],[1]],)"
                        R"("usages":[[9223372036854775807],[40]]},)"
                        R"("edges":{"nodes":[[0,1]],"costs":[[0]]},"usage_limit":50}})");
  const autoshard::strategy_problem p = autoshard::read_iopddl(in, "max.json");
  CHECK(p.min_peak_usage().bytes == 9223372036854775807);
  CHECK(p.min_peak_usage().time == 0);
  autoshard::solve_options o;
  o.time_limit = 10;
  CHECK_THROWS_WITH_AS((void)autoshard::solve_ilp(p, o),
                       "solver error: usage_limit 50 cannot be met: the smallest budget that could fit is 9223372036854775807 "
                       "(every node at its smallest usage, peak at time 0)",
                       autoshard::solver_error);
}

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

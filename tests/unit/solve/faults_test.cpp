// Bad inputs to the solver, each with its documented error: a time limit of 0, a memory
// budget below the largest single tensor (a model graph with a cycle or a dangling operand:
// tests/unit/graph/model.cpp).
// docs/reliability.md records what each one shows the user.
#include <doctest/doctest.h>

#include <autoshard/solve/solve.hpp>

#include <string>

namespace {
autoshard::strategy_problem fault_problem() {
  return autoshard::read_iopddl_file(AUTOSHARD_TEST_DATA_DIR "/solve/example.json");
}
template <class E, class F>
std::string fault_error(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST_CASE("faults: a time limit of 0 is a solver_error before GLPK runs") {
  const auto p = fault_problem();
  autoshard::solve_options o;
  o.time_limit = 0;
  CHECK(fault_error<autoshard::solver_error>([&] { (void)autoshard::solve_ilp(p, o); }) ==
        "solver error: time_limit must be > 0 seconds, got 0");
}

TEST_CASE("faults: a memory budget below the largest single tensor names the smallest budget that fits") {
  auto p = fault_problem();  // node 1 uses 25 at least, whatever its strategy
  p.usage_limit = 20;
  const std::string m = fault_error<autoshard::solver_error>([&] { (void)autoshard::solve_ilp(p, {}); });
  CHECK(m.find("solver error: usage_limit 20 cannot be met: the smallest budget that could fit is ") == 0);
}

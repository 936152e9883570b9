// Bad inputs to the solver, each with its documented error: a time limit of 0, a memory
// budget below the largest single tensor (a model graph with a cycle or a dangling operand:
// tests/unit/graph/model.cpp).
// docs/reliability.md records what each one shows the user.
#include <doctest/doctest.h>

#include <autoshard/solve/solve.hpp>

#include <string>

#include "brute.hpp"

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

TEST_CASE("faults: GLPK failing in the LP relaxation or the branch and bound leaves the answer to the search, re-evaluated") {
  // GLPK's simplex failed (GLP_EFAIL) on the LP of a large model (LLaMA-70B's 8x1x8 mesh before
  // one-rank axes offered Replicate only): the solve threw "GLPK simplex failed with code 5",
  // and the pass dropped that micro-batching. Now the phase ends and the search goes on: after a
  // failed LP relaxation the Lagrangian search keeps the time and the answer is claimed feasible
  // only; after a failed branch and bound the exact search proves what it can.
  const autoshard::strategy_problem p = solve_test::frustrated_grid(11, 12, 5);  // reaches the branch and bound
  autoshard::solve_options o;
  o.threads = 1;
  o.time_limit = 30;
  const autoshard::solve_result clean = autoshard::solve_ilp(p, o);
  REQUIRE(clean.status == autoshard::solve_status::optimal);
  REQUIRE(clean.rounds >= 1);
  autoshard::solve_options f = o;
  f.glpk_fault.relaxation = 5;  // GLP_EFAIL
  const autoshard::solve_result lp = autoshard::solve_ilp(p, f);
  CHECK(lp.status == autoshard::solve_status::feasible);
  CHECK(lp.stopped.find("GLPK's simplex failed (code 5) in the LP relaxation") != std::string::npos);
  CHECK(p.evaluate(lp.choice).objective == lp.objective);
  CHECK(lp.objective >= clean.objective);
  CHECK(lp.bound <= clean.objective);
  f = o;
  f.glpk_fault.branch_and_bound = 5;
  const autoshard::solve_result bb = autoshard::solve_ilp(p, f);
  CHECK(bb.rounds >= 1);  // it got that far
  CHECK(p.evaluate(bb.choice).objective == bb.objective);
  CHECK(bb.objective >= clean.objective);
  CHECK(bb.bound <= clean.objective);
  if (bb.status == autoshard::solve_status::optimal) CHECK(bb.objective == clean.objective);
}

TEST_CASE("regression: GLPK finding no cheaper integer answer after reduced-cost fixing proves the answer, not an internal error") {
  // A 10 x 10 frustrated grid of 5 strategies: after the LP's reduced costs forbade everything
  // that cannot be in an answer cheaper than the heuristic's, GLPK's branch and bound found no
  // integer answer (the heuristic's was optimal), and the solve threw "internal: the ILP is
  // infeasible although a feasible answer is known". The exact search now proves it optimal;
  // the plain ILP (no reductions) agrees.
  const autoshard::strategy_problem p = solve_test::frustrated_grid(5, 10, 5);
  autoshard::solve_options o;
  o.threads = 1;
  o.time_limit = 30;
  const autoshard::solve_result r = autoshard::solve_ilp(p, o);
  CHECK(r.status == autoshard::solve_status::optimal);
  o.reduce = false;
  const autoshard::solve_result plain = autoshard::solve_ilp(p, o);
  REQUIRE(plain.status == autoshard::solve_status::optimal);
  CHECK(r.objective == plain.objective);
  CHECK(r.objective == 74632);
}

#pragma once
/// autoshard's solve area: the graph-free strategy ILP (problem, GLPK backend, IOPDDL files,
/// reductions, heuristics). Needs GLPK and nlohmann-json, never Boost.Graph; link
/// autoshard::solve (or its older name autoshard::glpk). The auto-sharding pass that feeds it a
/// model graph is the pass area (<autoshard/pass/pass.hpp>).
///   auto p = autoshard::read_iopddl_file("example.json");
///   auto r = autoshard::solve_ilp(p, {.time_limit = 60, .mip_rel_gap = 0.0});
///   std::cout << r;   // objective, status, bound, gap, ILP size after each reduction
#include "ilp.hpp"      // solve_ilp, solve_options, solve_result
#include "iopddl.hpp"   // read_iopddl, write_iopddl
#include "problem.hpp"  // strategy_problem

#pragma once
/// autoshard's solve area: the strategy ILP on GLPK (and, with the graph area, the
/// auto-sharding pass). Needs GLPK and nlohmann-json; link autoshard::glpk.
///   auto p = autoshard::read_iopddl_file("example.json");
///   auto r = autoshard::solve_ilp(p, {.time_limit = 60, .mip_rel_gap = 0.0});
///   std::cout << r;   // objective, status, bound, gap, ILP size after each reduction
#include "ilp.hpp"      // solve_ilp, solve_options, solve_result
#include "iopddl.hpp"   // read_iopddl, write_iopddl
#include "problem.hpp"  // strategy_problem
#include "../graph/graph.hpp"  // the models the pass takes: builders, Hugging Face configs, JSON
#include "pass.hpp"       // autosharding_analysis_pass (needs the graph area)
#include "plan_file.hpp"  // load_plan: a plan file back with its graph
#include "export.hpp"     // export_tensor_parallel, to_hf_tp_plan, to_dtensor_plan
#include "plan_dot.hpp"   // write_plan_dot

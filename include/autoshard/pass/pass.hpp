#pragma once
/// autoshard's pass area: the auto-sharding pass over a model graph (strategies priced by the
/// graph's cost model, solved by the solve area's ILP), plan files read back as strategies,
/// exports and the plan's picture. Needs the graph, plan and solve areas; link autoshard::pass.
///   autoshard::autosharding_options o;
///   auto r = autoshard::autosharding_analysis_pass(g, o);
///   std::cout << r.report;   // the plan next to the baselines
#include "../graph/graph.hpp"  // the models the pass takes: builders, Hugging Face configs, JSON
#include "../solve/solve.hpp"  // solve_ilp, the strategy problem
#include "autosharding.hpp"    // autosharding_analysis_pass, autosharding_options
#include "export.hpp"          // export_tensor_parallel, to_hf_tp_plan, to_dtensor_plan
#include "export_megatron.hpp" // export_megatron, megatron_arguments
#include "loaded_plan.hpp"     // load_plan: a plan file back with its graph
#include "pipeline.hpp"        // pipeline stages: the 1F1B order, its step, the stage partition
#include "plan_dot.hpp"        // write_plan_dot

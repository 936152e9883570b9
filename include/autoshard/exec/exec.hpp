#pragma once
/// autoshard's execution area: host reference kernels for every operator kind, running a
/// graph unsharded or sharded by a plan on real ranks, and numeric verification of plans.
///   #include <autoshard/exec/exec.hpp>
#include "audit.hpp"     // audit_traffic, traffic_audit: executed against priced collectives
#include "backward.hpp"  // run_kernel_backward
#include "executor.hpp"  // make_source_values, run_unsharded, run_sharded
#include "kernels.hpp"   // run_kernel, local_context, exec_error
#include "parallel.hpp"  // column/row-parallel linear, vocab-parallel embedding and cross-entropy
#include "pipeline.hpp"  // a pipelined plan's stages on real ranks: stage graphs, transfers, 1F1B
#include "redistribute.hpp"  // redistribute of host tensors
#include "traffic.hpp"   // detail::charge: collectives charged to their traffic_site
#include "training.hpp"  // train_sharded, train_unsharded, training_step
#include "resources.hpp" // machine_limits, check_rank_threads, estimate_verify_memory
#include "schedule.hpp"  // liveness_schedule: when the run frees what it holds (the estimate walks it too)
#include "verify.hpp"    // verify_plan, verify_report, numeric_check
#include "workspace.hpp"  // kernel_workspace_bytes: what a kernel allocates beside its tensors
#include "../graph/graph.hpp"  // the models it runs: builders, Hugging Face configs, JSON
#include "../pass/loaded_plan.hpp"  // load_plan

#pragma once
/// autoshard's umbrella header: the dependency-free core only (standard library).
/// Areas with heavier dependencies are included on their own:
///   <autoshard/io/io.hpp>            nlohmann-json (checked JSON reading, atomic files)
///   <autoshard/graph/graph.hpp>      Boost.Graph, nlohmann-json
///   <autoshard/plan/plan.hpp>        the plan document (graph area + io)
///   <autoshard/solve/solve.hpp>      GLPK (the graph-free ILP)
///   <autoshard/pass/pass.hpp>        the auto-sharding pass (graph, plan and solve areas)
///   <autoshard/tensor/tensor.hpp>    Eigen
///   <autoshard/comm/comm.hpp>        backend-free collectives; <autoshard/gloo/gloo.hpp> Gloo
///   <autoshard/exec/exec.hpp>        the reference executor (all of the above)
///   <autoshard/device/placement.hpp> CUDA; <autoshard/device/nccl.hpp> NCCL
/// (scripts/check_docs.py checks that every header named in a comment or a doc exists)
#include "core/cost.hpp"          // collective_time, price_plan
#include "core/dtype.hpp"         // dtype
#include "core/enum_text.hpp"     // parse_enum, enum_names
#include "core/error.hpp"         // error hierarchy
#include "core/layout.hpp"        // split rule, local_box
#include "core/mesh.hpp"          // device_mesh, mesh_extents
#include "core/parse.hpp"         // parse_spec, "S0R"_spec
#include "core/placement.hpp"     // Replicate, Shard, Partial
#include "core/redistribute.hpp"  // plan_redistribute
#include "core/shape.hpp"         // tensor_shape
#include "core/spec.hpp"          // sharding_spec
#include "core/typed.hpp"         // sharded_tensor

/// Library version.
#define AUTOSHARD_VERSION_MAJOR 0
#define AUTOSHARD_VERSION_MINOR 1
#define AUTOSHARD_VERSION_PATCH 0

#pragma once
/// autoshard's communication area (Gloo): communicators, launching ranks, executing
/// redistribute plans, tensor-parallel layers and link calibration.
///   #include <autoshard/comm/comm.hpp>
#include "communicator.hpp"  // communicator concept, self_communicator, reduce_elements
#include "gloo.hpp"          // gloo_store, gloo_communicator, mesh_communicator
#include "launch.hpp"        // run_ranks, spawn_ranks, connect_from_env
#include "redistribute.hpp"  // redistribute, execute_step
#include "parallel.hpp"      // column/row-parallel linear, vocab-parallel embedding and cross-entropy
#include "calibrate.hpp"     // calibrate, save/load_calibration, apply_calibration

#pragma once
/// autoshard's communication area (Gloo): communicators, rendezvous stores, launching ranks, executing
/// redistribute plans, tensor-parallel layers and link calibration.
///   #include <autoshard/comm/comm.hpp>
#include "communicator.hpp"  // communicator concept, self_communicator, reduce_elements
#include "tcp_store.hpp"     // tcp_store: Gloo rendezvous over TCP, across machines
#include "gloo.hpp"          // gloo_store, gloo_communicator, mesh_communicator
#include "launch.hpp"        // run_ranks, spawn_ranks, connect_from_env, open_store
#include "redistribute.hpp"  // redistribute, execute_step
#include "parallel.hpp"      // column/row-parallel linear, vocab-parallel embedding and cross-entropy
#include "calibrate.hpp"     // calibrate, save/load_calibration, apply_calibration

#pragma once
/// autoshard's Gloo backend (CPU collectives over TCP): gloo_communicator and its stores, the
/// TCP rendezvous store, starting ranks (threads, forked processes, or a cluster launcher's
/// environment) and the calibration file. Includes the backend-free comm area.
///   #include <autoshard/gloo/gloo.hpp>
#include "../comm/comm.hpp"      // communicator concept, mesh communicators, redistribute, calibrate
#include "tcp_store.hpp"         // tcp_store: Gloo rendezvous over TCP, across machines
#include "communicator.hpp"      // gloo_store, gloo_communicator, mesh_communicator
#include "launch.hpp"            // run_ranks, spawn_ranks, connect_from_env, open_store
#include "calibration_file.hpp"  // save/load_calibration, calibration_to/from_json

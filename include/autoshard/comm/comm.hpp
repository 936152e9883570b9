#pragma once
/// autoshard's communication area, backend-free (core and the standard library only): the
/// communicator concept, a mesh of communicators, executing redistribute plans on real
/// shards, and link calibration over any backend. The backends: gloo/ (Gloo, with its TCP
/// store and launcher) and device/ (NCCL).
///   #include <autoshard/comm/comm.hpp>
#include "communicator.hpp"       // communicator concept, self_communicator, reduce_elements
#include "ledger.hpp"             // collective_ledger, counted_communicator: the collectives a rank issued
#include "mesh_communicator.hpp"  // basic_mesh_communicator, mesh_communicator_like
#include "redistribute.hpp"       // redistribute, execute_step
#include "calibrate.hpp"          // calibrate, apply_calibration
#include "launch_env.hpp"         // launch_env, read_launch_env: torchrun, Slurm, mpirun

#pragma once
/// Where this process sits in a run that a cluster launcher started: torchrun (RANK,
/// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Slurm (SLURM_PROCID, SLURM_NTASKS,
/// SLURM_LOCALID) or Open MPI's mpirun (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
/// OMPI_COMM_WORLD_LOCAL_RANK). Backend-free: the Gloo backend connects from it
/// (gloo/launch.hpp, connect_from_env), and an NCCL rank reads its device from local_rank
/// and exchanges its unique id through the same store.
///   autoshard::launch_env env = autoshard::read_launch_env();   // comm_error if unusable
///   env.check_mesh(autoshard::device_mesh{2, 4});                 // WORLD_SIZE must be 8
/// Every variable is validated: integers in range, a rank inside the world, a local rank
/// inside the local world, a port in 1..65535; errors name the variable and its value.
#include <charconv>     // std::from_chars
#include <cstdint>      // std::uint16_t
#include <cstdlib>      // std::getenv
#include <functional>   // std::function
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <system_error>  // std::errc

#include "../core/error.hpp"  // comm_error
#include "../core/mesh.hpp"   // device_mesh

namespace autoshard {

/// This process's place in a launched run, and where the ranks meet.
struct launch_env {
  int rank = 0;
  int world_size = 1;
  int local_rank = -1;        ///< rank on this node; -1 when the launcher does not say
  int local_world_size = -1;  ///< ranks on this node; -1 when the launcher does not say
  /// The rendezvous: MASTER_ADDR and MASTER_PORT (empty / 0 when not set).
  std::string master_addr;
  std::uint16_t master_port = 0;
  /// Which variables gave the rank: "torchrun" (RANK, also what spawn_ranks sets), "slurm"
  /// or "open mpi".
  std::string launcher;

  /// comm_error unless the world has exactly the mesh's ranks.
  void check_mesh(const device_mesh& mesh) const {
    if (world_size != mesh.num_ranks())
      throw comm_error("the launch has " + std::to_string(world_size) + " ranks (" + world_variable() + "=" +
                       std::to_string(world_size) + ") but " + to_string(mesh) + " needs " +
                       std::to_string(mesh.num_ranks()) + ": start " + std::to_string(mesh.num_ranks()) +
                       " ranks, or give the mesh of the run");
  }
  /// The variable the world size came from.
  std::string world_variable() const {
    return launcher == "slurm" ? "SLURM_NTASKS" : launcher == "open mpi" ? "OMPI_COMM_WORLD_SIZE" : "WORLD_SIZE";
  }
};

/// Looks an environment variable up: null when unset.
using env_lookup = std::function<const char*(const char*)>;

/// This process's environment (std::getenv).
inline const char* process_env(const char* name) { return std::getenv(name); }

namespace detail {

/// The most ranks a launch may describe (a bound before anything is sized from it).
inline constexpr int max_launch_ranks = 1 << 20;

/// An integer variable in [lo, hi]: comm_error naming it and its value otherwise.
inline int env_integer(const char* name, const char* value, long long lo, long long hi) {
  const std::string_view v(value);
  long long x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec == std::errc::invalid_argument || end != v.data() + v.size())
    throw comm_error(std::string("environment variable ") + name + "=" + quoted_text(v) + " is not an integer");
  if (ec == std::errc::result_out_of_range || x < lo || x > hi)
    throw comm_error(std::string("environment variable ") + name + "=" + std::string(v) + " is outside [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<int>(x);
}

/// Set and not empty.
inline const char* env_value(const env_lookup& get, const char* name) {
  const char* v = get(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

}  // namespace detail

/// Reads the launch from `get` (the process environment by default). The first family of
/// variables that holds a rank wins: RANK (torchrun, torch.distributed.launch, spawn_ranks),
/// then OMPI_COMM_WORLD_RANK (mpirun), then SLURM_PROCID (srun); the world size and local
/// rank come from the same family. comm_error when no family is set, when the family's
/// world size is missing, or when any value is malformed or out of range.
inline launch_env read_launch_env(const env_lookup& get = process_env) {
  struct family {
    const char* name;
    const char* rank;
    const char* size;
    const char* local_rank;
    const char* local_size;
  };
  static constexpr family families[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"open mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
  };
  const family* f = nullptr;
  for (const family& c : families)
    if (detail::env_value(get, c.rank) != nullptr) {
      f = &c;
      break;
    }
  if (f == nullptr)
    throw comm_error(
        "no rank in the environment: set RANK and WORLD_SIZE (as torchrun does), or run under Slurm (SLURM_PROCID, "
        "SLURM_NTASKS) or Open MPI's mpirun (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE)");
  launch_env e;
  e.launcher = f->name;
  const char* size = detail::env_value(get, f->size);
  if (size == nullptr)
    throw comm_error(std::string("environment variable ") + f->rank + " is set but " + f->size +
                     " is not: both are needed");
  e.world_size = detail::env_integer(f->size, size, 1, detail::max_launch_ranks);
  e.rank = detail::env_integer(f->rank, detail::env_value(get, f->rank), 0, detail::max_launch_ranks);
  if (e.rank >= e.world_size)
    throw comm_error(std::string("environment: ") + f->rank + "=" + std::to_string(e.rank) + " is outside " +
                     f->size + "=" + std::to_string(e.world_size) + " (ranks are 0.." +
                     std::to_string(e.world_size - 1) + ")");
  if (const char* lr = detail::env_value(get, f->local_rank))
    e.local_rank = detail::env_integer(f->local_rank, lr, 0, e.world_size - 1);
  // SLURM_NTASKS_PER_NODE may read "4(x2)" on uneven allocations: only a plain count is used.
  if (const char* ls = detail::env_value(get, f->local_size);
      ls != nullptr && std::string_view(ls).find_first_not_of("0123456789") == std::string_view::npos) {
    e.local_world_size = detail::env_integer(f->local_size, ls, 1, e.world_size);
    if (e.local_rank >= e.local_world_size)
      throw comm_error(std::string("environment: ") + f->local_rank + "=" + std::to_string(e.local_rank) +
                       " is outside " + f->local_size + "=" + std::to_string(e.local_world_size));
  }
  if (const char* a = detail::env_value(get, "MASTER_ADDR")) e.master_addr = a;
  if (const char* p = detail::env_value(get, "MASTER_PORT"))
    e.master_port = static_cast<std::uint16_t>(detail::env_integer("MASTER_PORT", p, 1, 65535));
  return e;
}

}  // namespace autoshard

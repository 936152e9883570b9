#pragma once
/// What a run on rank threads will take, estimated before it starts, against what this
/// machine gives (core/machine.hpp): memory, threads, file descriptors (every Gloo rank holds
/// a socket to every peer of the world and of each mesh axis) and address space (every
/// thread reserves a stack).
///   autoshard::machine_limits m = autoshard::machine_limits::here();
///   autoshard::check_rank_threads(mesh, m);                // exec_error when they cannot run
///   autoshard::memory_estimate e = autoshard::estimate_verify_memory(g, mesh, plan, dtype::f64);
#include <algorithm>  // std::max, std::min
#include <cstdint>    // std::uint64_t
#include <limits>     // std::numeric_limits
#include <string>     // std::string
#include <vector>     // std::vector

#include "../core/dtype.hpp"    // human_bytes
#include "../core/layout.hpp"   // local_box
#include "../graph/strategy.hpp"  // model_graph, strategy
#include "../core/machine.hpp"  // machine_limits
#include "../graph/validate.hpp"  // topological_order
#include "kernels.hpp"          // exec_error

namespace autoshard {

/// What running `mesh.num_ranks()` Gloo ranks as threads of this process takes.
struct rank_thread_cost {
  std::uint64_t ranks = 0;
  std::uint64_t threads = 0;        ///< a rank thread and its TCP device's loop thread each
  std::uint64_t files = 0;          ///< a socket per peer of the world and of every mesh axis, an epoll, a listener
  std::uint64_t address_space = 0;  ///< the threads' stacks
  std::uint64_t memory = 0;         ///< resident bytes: stacks touched, connection buffers
};

inline rank_thread_cost rank_threads_cost(const device_mesh& mesh, std::uint64_t stack = 8u << 20) {
  rank_thread_cost c;
  c.ranks = static_cast<std::uint64_t>(mesh.num_ranks());
  std::uint64_t peers = c.ranks - 1;
  for (std::size_t a = 0; a < mesh.ndim(); ++a) peers += static_cast<std::uint64_t>(mesh.size(a)) - 1;
  c.threads = 2 * c.ranks;
  c.files = c.ranks * (peers + 3);
  c.address_space = c.threads * (stack + (64u << 10));
  c.memory = c.ranks * ((1u << 20) + peers * (16u << 10));  // measured: ~1 MiB a rank, ~16 KiB a connection
  return c;
}

/// Throws exec_error, naming the count and the limit, when the mesh's ranks cannot all run
/// as threads here: a half-started world would only wait for its missing peers.
inline void check_rank_threads(const device_mesh& mesh, const machine_limits& m) {
  const rank_thread_cost c = rank_threads_cost(mesh, m.stack);
  const auto refuse = [&](const std::string& what, std::uint64_t need, std::uint64_t have, const std::string& unit) {
    throw exec_error(std::to_string(c.ranks) + " ranks on " + to_string(mesh) + " need " + std::to_string(need) + " " +
                     unit + " as threads of one process, but " + what + " allows " + std::to_string(have) +
                     "; verify a plan for a smaller mesh (e.g. `autoshard plan --mesh 2x4`)");
  };
  if (c.threads > m.threads) refuse("the thread limit (RLIMIT_NPROC, kernel.threads-max)", c.threads, m.threads, "threads");
  if (c.files > m.files) refuse("the open-file limit (ulimit -n)", c.files, m.files, "sockets");
  if (c.address_space > m.address_space)
    refuse("the address-space limit (ulimit -v)", c.address_space, m.address_space, "bytes of stacks");
}

/// The peak memory of a verification run, estimated before it starts.
struct memory_estimate {
  std::uint64_t sources = 0;     ///< the global inputs and parameters, held once
  std::uint64_t activations = 0; ///< the reference run's and every rank's live pieces at the worst step
  std::uint64_t ranks = 0;       ///< threads and connections
  std::string worst_step;        ///< the vertex computed at the worst step
  std::uint64_t total() const noexcept { return sources + activations + ranks; }
};

namespace detail {
inline std::uint64_t bytes_of(const tensor_shape& s, dtype t) {
  return static_cast<std::uint64_t>(s.numel()) * static_cast<std::uint64_t>(dtype_size(t));
}
inline bool all_replicated(const sharding_spec& s) {
  for (std::size_t a = 0; a < s.mesh_rank; ++a)
    if (!s[a].is_replicate()) return false;
  return true;
}
}  // namespace detail

/// The peak of verify_plan's forward run in `compute` (f32 or f64): the sources held once,
/// then step by step in topological order the reference values still needed plus every
/// rank's live pieces, its resharded operands (twice: a collective's buffer and its result),
/// its output and the replicated copy a Partial output is compared through.
inline memory_estimate estimate_verify_memory(const model_graph& g, const device_mesh& mesh,
                                              const std::vector<strategy>& plan, dtype compute, bool training = false) {
  const std::size_t n = boost::num_vertices(g);
  if (plan.size() != n)
    throw exec_error("the plan has " + std::to_string(plan.size()) + " strategies for a graph of " + std::to_string(n) + " vertices");
  const auto type_of = [&](vertex_t v) { return detail::is_integer(g[v].type) ? dtype::i64 : compute; };
  const int ranks = mesh.num_ranks();
  memory_estimate e;
  e.ranks = rank_threads_cost(mesh).memory;
  std::vector<std::size_t> uses(n, 0);
  std::vector<std::uint64_t> piece_sum(n, 0);  // every rank's piece of v together
  for (vertex_t v = 0; v < n; ++v) {
    uses[v] = boost::out_degree(v, g);
    if (!g[v].is_operator()) {
      e.sources += detail::bytes_of(g[v].shape, type_of(v));
      if (detail::all_replicated(plan[v].output)) continue;  // ranks read the source itself
    }
    for (int r = 0; r < ranks; ++r) piece_sum[v] += detail::bytes_of(local_box(mesh, plan[v].output, g[v].shape, r).shape, type_of(v));
  }
  std::uint64_t live = 0;  // reference values and pieces alive between steps
  for (vertex_t v : topological_order(g)) {
    std::uint64_t step = 0;
    if (g[v].is_operator()) {
      const std::vector<vertex_t> ops = operands(g, v);
      for (std::size_t i = 0; i < ops.size() && i < plan[v].inputs.size(); ++i) {
        const vertex_t u = ops[i];
        if (plan[u].output == plan[v].inputs[i]) continue;
        for (int r = 0; r < ranks; ++r)
          step += 2 * detail::bytes_of(local_box(mesh, plan[v].inputs[i], g[u].shape, r).shape, type_of(u));
      }
      const std::uint64_t whole = detail::bytes_of(g[v].shape, type_of(v));
      step += whole;  // the reference output
      bool partial = false;
      for (std::size_t a = 0; a < plan[v].output.mesh_rank; ++a) partial |= plan[v].output[a].is_partial();
      step += partial ? 2 * whole : whole / static_cast<std::uint64_t>(ranks) + 1;  // the compared block, one rank at a time
      if (e.sources + live + piece_sum[v] + step + e.ranks > e.total()) {
        e.activations = live + piece_sum[v] + step;
        e.worst_step = g[v].name;
      }
      live += piece_sum[v] + whole;
      for (vertex_t u : ops)
        if (--uses[u] == 0) live -= piece_sum[u] + (g[u].is_operator() ? detail::bytes_of(g[u].shape, type_of(u)) : 0);
    } else {
      live += piece_sum[v];
    }
    if (uses[v] == 0) live -= piece_sum[v] + (g[v].is_operator() ? detail::bytes_of(g[v].shape, type_of(v)) : 0);
  }
  if (training) {  // every value and piece is kept for the backward, and gradients come alike
    std::uint64_t kept = 0;
    for (vertex_t v = 0; v < n; ++v)
      kept += piece_sum[v] + (g[v].is_operator() ? detail::bytes_of(g[v].shape, type_of(v)) : 0);
    e.activations += 2 * kept;
  }
  return e;
}

}  // namespace autoshard

#pragma once
/// Executing a redistribute plan on each rank's local shard (row-major, contiguous).
///   mesh_communicator mc(std::move(world), device_mesh{2, 4});
///   std::vector<float> out = autoshard::redistribute(mc, std::span<const float>(shard),
///                                                    {13, 6}, "S0R"_spec, "RS1"_spec);
/// Every step works on the global boxes that core's local_box gives each rank before and
/// after the step, so uneven shards (padded to ceil(n/k) for the collective, narrowed
/// after), any tensor dim and nested splits come out of one rule: the result is exactly
/// the target spec's shard of the global tensor.
#include <algorithm>  // std::max, std::min
#include <cstddef>    // std::byte, std::size_t
#include <cstdint>    // std::int64_t
#include <cstring>    // std::memcpy
#include <span>       // std::span
#include <string>     // std::string
#include <vector>     // std::vector

#include "../core/dtype.hpp"         // dtype, dtype_size
#include "../core/error.hpp"         // shape_error, comm_error
#include "../core/layout.hpp"        // local_box, shard_box
#include "../core/mesh.hpp"          // device_mesh
#include "../core/parse.hpp"         // to_string(sharding_spec)
#include "../core/redistribute.hpp"  // plan_redistribute, redist_step, collective
#include "../core/spec.hpp"          // sharding_spec, check_spec
#include "../core/typed.hpp"         // element_type, dtype_of
#include "communicator.hpp"          // communicator, fill_identity
#include "mesh_communicator.hpp"     // mesh_communicator_like

namespace autoshard {

namespace detail {

/// Copies the block `ext` at `src_off` inside a row-major `src_shape` array to `dst_off`
/// inside a row-major `dst_shape` array; contiguous runs along the last dim are memcpy'd.
inline void copy_region(const std::byte* src, const tensor_shape& src_shape, const tensor_shape& src_off,
                        std::byte* dst, const tensor_shape& dst_shape, const tensor_shape& dst_off,
                        const tensor_shape& ext, std::size_t esz) {
  const std::size_t nd = ext.rank;
  if (ext.numel() == 0) return;
  if (nd == 0) {
    std::memcpy(dst, src, esz);
    return;
  }
  std::int64_t src_stride[max_tensor_rank], dst_stride[max_tensor_rank];
  src_stride[nd - 1] = dst_stride[nd - 1] = 1;
  for (std::size_t d = nd - 1; d-- > 0;) {
    src_stride[d] = src_stride[d + 1] * src_shape[d + 1];
    dst_stride[d] = dst_stride[d + 1] * dst_shape[d + 1];
  }
  const std::size_t run = static_cast<std::size_t>(ext[nd - 1]) * esz;
  std::int64_t idx[max_tensor_rank] = {};
  for (;;) {
    std::int64_t s = 0, t = 0;
    for (std::size_t d = 0; d < nd; ++d) {
      s += (src_off[d] + (d + 1 < nd ? idx[d] : 0)) * src_stride[d];
      t += (dst_off[d] + (d + 1 < nd ? idx[d] : 0)) * dst_stride[d];
    }
    std::memcpy(dst + static_cast<std::size_t>(t) * esz, src + static_cast<std::size_t>(s) * esz, run);
    std::size_t d = nd - 1;  // odometer over every dim but the last
    while (d > 0) {
      --d;
      if (++idx[d] < ext[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (nd == 1) return;
  }
}

/// The overlap of two boxes (an empty box if they do not meet).
inline shard_box intersect(const shard_box& a, const shard_box& b) {
  shard_box r;
  r.shape.rank = r.offset.rank = a.shape.rank;
  for (std::size_t d = 0; d < a.shape.rank; ++d) {
    const std::int64_t lo = std::max(a.offset[d], b.offset[d]);
    const std::int64_t hi = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    r.offset[d] = lo;
    r.shape[d] = hi > lo ? hi - lo : 0;
  }
  return r;
}

inline tensor_shape relative(const tensor_shape& off, const tensor_shape& origin) {
  tensor_shape r = off;
  for (std::size_t d = 0; d < r.rank; ++d) r[d] -= origin[d];
  return r;
}

inline void grow_to(tensor_shape& acc, const tensor_shape& s) {
  for (std::size_t d = 0; d < s.rank; ++d) acc[d] = std::max(acc[d], s[d]);
}

inline tensor_shape zeros_like(const tensor_shape& s) {
  tensor_shape z = s;
  for (std::size_t d = 0; d < z.rank; ++d) z[d] = 0;
  return z;
}

[[noreturn]] inline void bad_tiling(const redist_step& st, const device_mesh& m, int rank) {
  throw spec_error("rank " + std::to_string(rank) + ": step '" + std::string(to_string(st.kind)) + "' on axis " +
                   std::to_string(st.mesh_axis) + " of " + to_string(m) + " from " + to_string(st.before) + " to " +
                   to_string(st.after) + " cannot be done within the axis group (another axis splits the same "
                   "tensor dim inside it); use plan_redistribute's order");
}

}  // namespace detail

namespace detail {

/// What one step is on this rank: its shard boxes before and after it, those of every
/// member of its axis group (in group order), the element size, its place in the group.
struct step_geometry {
  redist_step st;
  const device_mesh* mesh_ptr = nullptr;
  int rank = 0;
  std::size_t esz = 0;
  int k = 0;   ///< the axis group's size
  int me = 0;  ///< this rank's place in it
  shard_box bme, ame;
  std::vector<shard_box> before, after;
  tensor_shape zero;
  const device_mesh& mesh() const { return *mesh_ptr; }
};

inline step_geometry geometry_of(const device_mesh& mesh, int rank, const redist_step& st, const tensor_shape& global, dtype t) {
  step_geometry g;
  g.st = st;
  g.mesh_ptr = &mesh;
  g.rank = rank;
  g.esz = dtype_size(t);
  const std::size_t axis = st.mesh_axis;
  g.k = mesh.size(axis);
  const std::vector<int> group = mesh.group(axis, rank);
  g.me = mesh.coordinate(rank)[axis];
  g.bme = local_box(mesh, st.before, global, rank);
  g.ame = local_box(mesh, st.after, global, rank);
  g.before.resize(static_cast<std::size_t>(g.k));
  g.after.resize(static_cast<std::size_t>(g.k));
  for (int j = 0; j < g.k; ++j) {
    g.before[static_cast<std::size_t>(j)] = local_box(mesh, st.before, global, group[static_cast<std::size_t>(j)]);
    g.after[static_cast<std::size_t>(j)] = local_box(mesh, st.after, global, group[static_cast<std::size_t>(j)]);
  }
  g.zero = zeros_like(global);
  return g;
}

/// All-gather along the step's axis: every member's `before` box into this rank's `after` box (each sent padded to the largest).
template <class C>
void all_gather_step(C& comm, const step_geometry& s, std::span<const std::byte> in, dtype t, std::vector<std::byte>& out) {
  tensor_shape slot = s.zero;
  std::int64_t covered = 0;
  for (const shard_box& b : s.before) {
    if (!b.empty() && !(intersect(b, s.ame) == b)) bad_tiling(s.st, s.mesh(), s.rank);
    covered += b.shape.numel();
    grow_to(slot, b.shape);
  }
  if (covered != s.ame.shape.numel()) bad_tiling(s.st, s.mesh(), s.rank);
  const auto n = static_cast<std::size_t>(slot.numel());
  std::vector<std::byte> send(n * s.esz), recv(n * s.esz * static_cast<std::size_t>(s.k));
  copy_region(in.data(), s.bme.shape, s.zero, send.data(), slot, s.zero, s.bme.shape, s.esz);
  comm.all_gather(send.data(), recv.data(), n, t);
  for (int j = 0; j < s.k; ++j) {
    const shard_box& b = s.before[static_cast<std::size_t>(j)];
    copy_region(recv.data() + static_cast<std::size_t>(j) * n * s.esz, slot, s.zero, out.data(), s.ame.shape,
                relative(b.offset, s.ame.offset), b.shape, s.esz);
  }
}

/// Reduce-scatter along the step's axis: this rank's piece of each member's `after` box, reduced into its own.
template <class C>
void reduce_scatter_step(C& comm, const step_geometry& s, std::span<const std::byte> in, dtype t, std::vector<std::byte>& out) {
  tensor_shape slot = s.zero;
  for (const shard_box& a : s.after) {
    if (!a.empty() && !(intersect(a, s.bme) == a)) bad_tiling(s.st, s.mesh(), s.rank);
    grow_to(slot, a.shape);
  }
  const auto n = static_cast<std::size_t>(slot.numel());
  std::vector<std::byte> send(n * s.esz * static_cast<std::size_t>(s.k)), recv(n * s.esz);
  for (int j = 0; j < s.k; ++j) {
    const shard_box& a = s.after[static_cast<std::size_t>(j)];
    copy_region(in.data(), s.bme.shape, relative(a.offset, s.bme.offset),
                send.data() + static_cast<std::size_t>(j) * n * s.esz, slot, s.zero, a.shape, s.esz);
  }
  comm.reduce_scatter(send.data(), recv.data(), n, t, s.st.from.op);
  copy_region(recv.data(), slot, s.zero, out.data(), s.ame.shape, s.zero, s.ame.shape, s.esz);
}

/// All-to-all along the step's axis: rank i sends rank j the overlap of its old box with j's new box.
template <class C>
void all_to_all_step(C& comm, const step_geometry& s, std::span<const std::byte> in, dtype t, std::vector<std::byte>& out) {
  tensor_shape slot = s.zero;
  for (const shard_box& b : s.before)
    for (const shard_box& a : s.after) grow_to(slot, intersect(b, a).shape);
  std::int64_t covered = 0;
  for (const shard_box& b : s.before) covered += intersect(b, s.ame).shape.numel();
  if (covered != s.ame.shape.numel()) bad_tiling(s.st, s.mesh(), s.rank);
  const auto n = static_cast<std::size_t>(slot.numel());
  std::vector<std::byte> send(n * s.esz * static_cast<std::size_t>(s.k)), recv(n * s.esz * static_cast<std::size_t>(s.k));
  for (int j = 0; j < s.k; ++j) {
    const shard_box x = intersect(s.bme, s.after[static_cast<std::size_t>(j)]);
    copy_region(in.data(), s.bme.shape, relative(x.offset, s.bme.offset),
                send.data() + static_cast<std::size_t>(j) * n * s.esz, slot, s.zero, x.shape, s.esz);
  }
  comm.all_to_all(send.data(), recv.data(), n, t);
  for (int i = 0; i < s.k; ++i) {
    const shard_box x = intersect(s.before[static_cast<std::size_t>(i)], s.ame);
    copy_region(recv.data() + static_cast<std::size_t>(i) * n * s.esz, slot, s.zero, out.data(), s.ame.shape,
                relative(x.offset, s.ame.offset), x.shape, s.esz);
  }
}

}  // namespace detail

/// Runs one plan step on this rank's shard `in` (the `st.before` shard of `global`) and
/// returns its `st.after` shard. Every rank of the mesh calls it with the same step.
template <mesh_communicator_like M>
std::vector<std::byte> execute_step(M& mc, const redist_step& st, std::span<const std::byte> in, dtype t,
                                    const tensor_shape& global) {
  const device_mesh& mesh = mc.mesh();
  const int rank = mc.rank();
  const detail::step_geometry g = detail::geometry_of(mesh, rank, st, global, t);
  const shard_box& bme = g.bme;
  const shard_box& ame = g.ame;
  const std::size_t esz = g.esz;
  if (in.size() != static_cast<std::size_t>(bme.shape.numel()) * esz)
    throw shape_error("rank " + std::to_string(rank) + ": the " + to_string(st.before) + " shard of " +
                      to_string(global) + " is " + to_string(bme.shape) + " (" +
                      std::to_string(bme.shape.numel() * static_cast<std::int64_t>(esz)) + " bytes of " +
                      std::string(to_string(t)) + "), got " + std::to_string(in.size()) + " bytes");
  std::vector<std::byte> out(static_cast<std::size_t>(ame.shape.numel()) * esz);
  auto& comm = mc.axis(st.mesh_axis);
  const tensor_shape& zero = g.zero;

  switch (st.kind) {
    case collective::local_slice: {
      if (!ame.empty() && !(detail::intersect(ame, bme) == ame)) detail::bad_tiling(st, mesh, rank);
      detail::copy_region(in.data(), bme.shape, detail::relative(ame.offset, bme.offset), out.data(), ame.shape, zero,
                          ame.shape, esz);
      return out;
    }
    case collective::local_partial: {
      if (g.me == 0) {
        if (!in.empty()) std::memcpy(out.data(), in.data(), in.size());  // an empty piece has no data() to copy from
      } else {
        fill_identity(out.data(), static_cast<std::size_t>(ame.shape.numel()), t, st.to.op);
      }
      return out;
    }
    case collective::all_reduce: {
      if (!in.empty()) std::memcpy(out.data(), in.data(), in.size());  // an empty piece has no data() to copy from
      comm.all_reduce(out.data(), static_cast<std::size_t>(ame.shape.numel()), t, st.from.op);
      return out;
    }
    case collective::all_gather:
      detail::all_gather_step(comm, g, in, t, out);
      return out;
    case collective::reduce_scatter:
      detail::reduce_scatter_step(comm, g, in, t, out);
      return out;
    case collective::all_to_all:
      detail::all_to_all_step(comm, g, in, t, out);
      return out;
  }
  return out;
}

/// Turns this rank's `src` shard of a tensor of shape `global` into its `dst` shard,
/// running plan_redistribute(mesh, src, dst, global) step by step. Collective over the mesh.
template <mesh_communicator_like M>
std::vector<std::byte> redistribute(M& mc, std::span<const std::byte> local, dtype t, const tensor_shape& global,
                                    const sharding_spec& src, const sharding_spec& dst) {
  check_spec(src, mc.mesh(), global, "redistribute source");
  check_spec(dst, mc.mesh(), global, "redistribute target");
  const redist_plan plan = plan_redistribute(mc.mesh(), src, dst, global);
  const tensor_shape want = local_box(mc.mesh(), src, global, mc.rank()).shape;
  if (local.size() != static_cast<std::size_t>(want.numel()) * dtype_size(t))
    throw shape_error("rank " + std::to_string(mc.rank()) + ": redistribute " + to_string(src) + " -> " +
                      to_string(dst) + " of " + to_string(global) + " expects a local shard " + to_string(want) +
                      " of " + std::string(to_string(t)) + " (" +
                      std::to_string(want.numel() * static_cast<std::int64_t>(dtype_size(t))) + " bytes), got " +
                      std::to_string(local.size()) + " bytes");
  if (plan.empty()) return std::vector<std::byte>(local.begin(), local.end());
  // The first step reads `local` in place: no copy of a tensor as large as a whole parameter.
  std::vector<std::byte> cur = execute_step(mc, plan[0], local, t, global);
  for (std::size_t i = 1; i < plan.size(); ++i) cur = execute_step(mc, plan[i], std::span<const std::byte>(cur), t, global);
  return cur;
}

/// Typed form: `local` is this rank's `src` shard; returns its `dst` shard.
template <mesh_communicator_like M, element_type T>
std::vector<T> redistribute(M& mc, std::span<const T> local, const tensor_shape& global, const sharding_spec& src,
                            const sharding_spec& dst) {
  std::vector<std::byte> raw = redistribute(mc, std::as_bytes(local), dtype_of<T>(), global, src, dst);
  std::vector<T> out(raw.size() / sizeof(T));
  if (!raw.empty()) std::memcpy(out.data(), raw.data(), raw.size());
  return out;
}

}  // namespace autoshard

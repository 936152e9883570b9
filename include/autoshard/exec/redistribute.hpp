#pragma once
/// Redistributing host tensors: comm's redistribute (which works on typed spans and bytes,
/// backend-free and free of any tensor type) for the tensor area's host_tensor, as the
/// executor and the verifier hold their pieces.
///   autoshard::host_tensor out = autoshard::redistribute(mc, piece.view(), global, "S0R"_spec, "RS1"_spec);
#include <cstring>  // std::memcpy
#include <string>   // std::string
#include <vector>   // std::vector

#include "../comm/mesh_communicator.hpp"  // mesh_communicator_like
#include "../comm/redistribute.hpp"       // redistribute (bytes)
#include "../core/error.hpp"              // shape_error
#include "../core/layout.hpp"             // local_box
#include "../core/parse.hpp"              // to_string(sharding_spec)
#include "../core/spec.hpp"               // sharding_spec, check_spec
#include "../tensor/host_tensor.hpp"      // host_tensor, const_tensor_view

namespace autoshard {

/// Host-tensor form: `local` is this rank's `src`
/// shard, of any dtype; returns its `dst` shard.
template <mesh_communicator_like M>
host_tensor redistribute(M& mc, const_tensor_view local, const tensor_shape& global, const sharding_spec& src,
                         const sharding_spec& dst) {
  check_spec(src, mc.mesh(), global, "redistribute source");
  const tensor_shape want = local_box(mc.mesh(), src, global, mc.rank()).shape;
  if (!(local.shape() == want))
    throw shape_error("rank " + std::to_string(mc.rank()) + ": redistribute " + to_string(src) + " -> " +
                      to_string(dst) + " of " + to_string(global) + " expects a local shard " + to_string(want) +
                      ", got " + to_string(local.shape()));
  const std::vector<std::byte> raw = redistribute(mc, local.bytes(), local.type(), global, src, dst);
  host_tensor out(local.type(), local_box(mc.mesh(), dst, global, mc.rank()).shape);
  if (!raw.empty()) std::memcpy(out.data(), raw.data(), raw.size());
  return out;
}

}  // namespace autoshard

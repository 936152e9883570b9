#pragma once
/// What a host kernel (kernels.hpp, backward.hpp) allocates beside its operands, its output and
/// its operands' gradients while it runs: score matrices, gradients at a broadcast shape, row
/// statistics and the packing buffers of Eigen's matrix products. The memory estimates
/// (resources.hpp) add it at every operator, on every rank that runs it at once.
///   std::uint64_t b = autoshard::kernel_workspace_bytes(g[v], operand_shapes, g[v].shape, dtype::f64, /*backward=*/true);
///   std::uint64_t all = autoshard::workspace_on_ranks(g, mesh, plan, v, dtype::f64, false);  // every rank's at once
#include <algorithm>         // std::max
#include <array>             // std::array
#include <cstdint>           // std::int64_t, std::uint64_t
#include <initializer_list>  // std::initializer_list
#include <vector>            // std::vector

#include <Eigen/Core>  // Eigen::internal::computeProductBlockingSizes

#include "../core/dtype.hpp"       // dtype, dtype_size
#include "../core/layout.hpp"      // local_box
#include "../core/shape.hpp"       // tensor_shape
#include "../graph/model.hpp"      // node, op_kind, is_binary_elementwise, attention_keys
#include "../graph/strategy.hpp"   // model_graph, strategy, operands

namespace autoshard {

namespace detail {
/// The packing buffers Eigen's matrix product of an m x k by a k x n matrix allocates (its
/// blocking sizes, from this machine's caches: what the product itself computes).
inline std::uint64_t gemm_buffer_bytes(std::int64_t m, std::int64_t k, std::int64_t n, dtype t) {
  Eigen::Index kc = k, mc = m, nc = n;
  if (t == dtype::f64) Eigen::internal::computeProductBlockingSizes<double, double, 1, Eigen::Index>(kc, mc, nc, 1);
  else Eigen::internal::computeProductBlockingSizes<float, float, 1, Eigen::Index>(kc, mc, nc, 1);
  return static_cast<std::uint64_t>(kc * mc + kc * nc) * dtype_size(t);
}
}  // namespace detail

/// Bytes a kernel allocates beside its operands, output and operand gradients while it runs
/// (kernels.hpp and backward.hpp), in `t`, from its operands' local shapes `in` and its output's
/// `out`: attention's S x Sk score matrix (two in the backward, the scores and their gradient,
/// and Eigen's temporary of a scaled product, at most S x width), a broadcasting binary
/// operator's and where's two gradients at the output's shape before they are summed back,
/// the row statistics of cross_entropy and of a norm's backward, and the packing buffers of
/// the largest matrix product a linear, matmul or attention kernel runs (gemm_buffer_bytes;
/// attention's head width bounded by the local width). The attention matrices grow with the
/// square of the sequence: without them verify's estimate was 10x below the heap it took at
/// sequence 2,048 (issue 30 class 12).
inline std::uint64_t kernel_workspace_bytes(const node& nd, const std::vector<tensor_shape>& in, const tensor_shape& out, dtype t,
                                            bool backward) {
  const auto n = [](const tensor_shape& s) { return static_cast<std::uint64_t>(s.numel()); };
  const auto gemm = [t](std::initializer_list<std::array<std::int64_t, 3>> products) {
    std::uint64_t most = 0;
    for (const auto& [m, k, nn] : products) most = std::max(most, detail::gemm_buffer_bytes(m, k, nn, t));
    return most;
  };
  const std::uint64_t e = dtype_size(t);
  switch (nd.kind) {
    case op_kind::attention: {
      if (in.size() < 2 || in[0].rank < 3 || in[1].rank < 3) return 0;
      const std::int64_t S = in[0][1], Sk = detail::attention_keys(in), D = std::max(in[0][2], in[1][2]);
      const auto s = static_cast<std::uint64_t>(S), sk = static_cast<std::uint64_t>(Sk), d = static_cast<std::uint64_t>(D);
      // A key/value cache: the keys and values copied after it, [B, P + S, kv width] each (after_cache).
      const std::uint64_t cached = in.size() == 5 ? 2 * static_cast<std::uint64_t>(in[0][0]) * sk * static_cast<std::uint64_t>(in[1][2]) * e : 0;
      if (!backward) return cached + s * sk * e + gemm({{S, D, Sk}, {S, Sk, D}});
      return (2 * s * sk + std::max(s, sk) * d) * e + gemm({{Sk, S, D}, {S, D, Sk}, {S, Sk, D}});
    }
    case op_kind::linear:
    case op_kind::matmul: {
      if (in.size() < 2 || in[0].rank < 1 || out.rank < 1 || in[1].rank < 2) return 0;
      const std::int64_t C = in[0][in[0].rank - 1u], O = out[out.rank - 1u];
      const std::int64_t rows = C > 0 ? in[0].numel() / C : 0;
      const std::int64_t m = nd.kind == op_kind::matmul && in[0].rank >= 2 ? in[0][in[0].rank - 2u] : rows;
      return backward ? gemm({{m, O, C}, {C, m, O}, {O, m, C}}) : gemm({{m, C, O}});
    }
    case op_kind::where: return backward ? 2 * n(out) * e : 0;
    case op_kind::cross_entropy: return in.size() > 1 ? (backward ? 2u : 3u) * n(in[1]) * e : 0;
    case op_kind::layer_norm:
    case op_kind::rms_norm: return backward && !in.empty() && in[0].rank > 0 ? 2 * static_cast<std::uint64_t>(in[0][in[0].rank - 1u]) * e : 0;
    default: return backward && is_binary_elementwise(nd.kind) ? 2 * n(out) * e : 0;
  }
}

/// kernel_workspace_bytes of operator v run unsharded, on its operands' and output's global shapes.
inline std::uint64_t workspace_unsharded(const model_graph& g, vertex_t v, dtype t, bool backward) {
  std::vector<tensor_shape> in;
  for (vertex_t u : operands(g, v)) in.push_back(g[u].shape);
  return kernel_workspace_bytes(g[v], in, g[v].shape, t, backward);
}

/// kernel_workspace_bytes of operator v summed over every rank of `mesh`, which run it at once
/// on the local boxes of the specs `plan[v]` takes its operands in and gives its output.
inline std::uint64_t workspace_on_ranks(const model_graph& g, const device_mesh& mesh, const std::vector<strategy>& plan, vertex_t v,
                                        dtype t, bool backward) {
  const std::vector<vertex_t> ops = operands(g, v);
  std::uint64_t sum = 0;
  std::vector<tensor_shape> in;
  for (int r = 0; r < mesh.num_ranks(); ++r) {
    in.clear();
    for (std::size_t i = 0; i < ops.size() && i < plan[v].inputs.size(); ++i)
      in.push_back(local_box(mesh, plan[v].inputs[i], g[ops[i]].shape, r).shape);
    sum += kernel_workspace_bytes(g[v], in, local_box(mesh, plan[v].output, g[v].shape, r).shape, t, backward);
  }
  return sum;
}

}  // namespace autoshard

#pragma once
/// Output-spec rules for static specs, usable in constant expressions (needs only core):
///   using namespace autoshard::literals;
///   static_assert(autoshard::matmul_output_spec("S0R"_spec, "RS1"_spec) == "S0S1"_spec);
///   static_assert(autoshard::matmul_output_spec("RS0"_spec, "S0R"_spec) == "RRP0"_spec);
/// A combination that no strategy produces fails to compile and the compiler names the
/// function on the error path, e.g. bad_rule::matmul_placements_do_not_combine_on_mesh_axis.
/// At run time the same functions throw spec_error.
#include <string>  // std::string

#include "../core/error.hpp"  // spec_error
#include "../core/spec.hpp"   // sharding_spec, placement

namespace autoshard {

namespace bad_rule {
// Not constexpr on purpose: in a constant expression the compiler prints these names.
[[noreturn]] inline void specs_have_different_mesh_rank(int a, int b) {
  throw spec_error("operand specs are for meshes of " + std::to_string(a) + " and " + std::to_string(b) + " axes");
}
[[noreturn]] inline void matmul_operand_needs_rank_at_least_2(int rank) {
  throw spec_error("matmul operands need rank >= 2, got rank " + std::to_string(rank));
}
[[noreturn]] inline void matmul_batched_operands_need_equal_rank(int a, int b) {
  throw spec_error("batched matmul operands need equal rank, got " + std::to_string(a) + " and " + std::to_string(b));
}
[[noreturn]] inline void matmul_placements_do_not_combine_on_mesh_axis(int axis, const placement& a, const placement& b) {
  throw spec_error("matmul: placements " + to_string(a) + " and " + to_string(b) + " on mesh axis " +
                   std::to_string(axis) + " match no strategy (shard m of a, n of b, k of both, a batch dim of both, "
                   "or replicate)");
}
[[noreturn]] inline void elementwise_operands_need_equal_rank(int a, int b) {
  throw spec_error("elementwise operands need equal rank, got " + std::to_string(a) + " and " + std::to_string(b));
}
[[noreturn]] inline void elementwise_placements_differ_on_mesh_axis(int axis, const placement& a, const placement& b) {
  throw spec_error("elementwise: placements " + to_string(a) + " and " + to_string(b) + " differ on mesh axis " +
                   std::to_string(axis));
}
[[noreturn]] inline void normalised_dim_is_sharded_on_mesh_axis(int axis, int dim) {
  throw spec_error("the normalised dim " + std::to_string(dim) + " is sharded on mesh axis " + std::to_string(axis) +
                   "; norms and softmax need it whole");
}
}  // namespace bad_rule

/// Output spec of a[...,m,k] @ b[...,k,n] (or b[k,n]) under DTensor's einsum rule.
constexpr sharding_spec matmul_output_spec(const sharding_spec& a, const sharding_spec& b) {
  if (a.mesh_rank != b.mesh_rank) bad_rule::specs_have_different_mesh_rank(a.mesh_rank, b.mesh_rank);
  const int ra = a.tensor_rank, rb = b.tensor_rank;
  if (ra < 2) bad_rule::matmul_operand_needs_rank_at_least_2(ra);
  if (rb < 2) bad_rule::matmul_operand_needs_rank_at_least_2(rb);
  if (rb > 2 && rb != ra) bad_rule::matmul_batched_operands_need_equal_rank(ra, rb);
  sharding_spec out = replicated_spec(a.mesh_rank, ra);
  for (std::size_t i = 0; i < a.mesh_rank; ++i) {
    const placement pa = a[i], pb = b[i];
    placement o{};
    bool ok = true;
    if (pa.is_replicate() && pb.is_replicate()) o = Replicate();
    else if (pa.is_shard() && pa.dim < ra - 2 && (rb == 2 ? pb.is_replicate() : pb.is_shard(pa.dim))) o = pa;
    else if (pa.is_shard(ra - 2) && pb.is_replicate()) o = Shard(ra - 2);
    else if (pa.is_replicate() && pb.is_shard(rb - 1)) o = Shard(ra - 1);
    else if (pa.is_shard(ra - 1) && pb.is_shard(rb - 2)) o = Partial();
    else if (pa.is_partial() && pb.is_replicate()) o = pa;
    else if (pa.is_replicate() && pb.is_partial() && pb.op == reduce_op::sum) o = pb;
    else ok = false;
    if (!ok) bad_rule::matmul_placements_do_not_combine_on_mesh_axis(static_cast<int>(i), pa, pb);
    out[i] = o;
  }
  return out;
}

/// Output spec of x[...,in] @ W^T for W [out,in] (or [in,out] when `transposed_weight`).
constexpr sharding_spec linear_output_spec(const sharding_spec& x, const sharding_spec& w, bool transposed_weight = false) {
  sharding_spec wt = w;  // view W as the [in,out] right operand of a matmul
  if (!transposed_weight)
    for (std::size_t i = 0; i < w.mesh_rank; ++i)
      if (w[i].is_shard()) wt[i] = Shard(1 - w[i].dim);
  if (x.tensor_rank >= 2) return matmul_output_spec(x, wt);
  // a vector input: lift to [1,in] and drop the leading dim again
  sharding_spec x2 = x;
  x2.tensor_rank = 2;
  for (std::size_t i = 0; i < x.mesh_rank; ++i)
    if (x[i].is_shard()) x2[i] = Shard(x[i].dim + 1);
  sharding_spec o = matmul_output_spec(x2, wt);
  o.tensor_rank = 1;
  for (std::size_t i = 0; i < o.mesh_rank; ++i)
    if (o[i].is_shard()) o[i] = Shard(o[i].dim - 1);
  return o;
}

/// Output spec of an elementwise binary op on equal-rank operands: the placements must agree
/// (Partial only for add/sub, where a sum of partial sums is a partial sum).
constexpr sharding_spec elementwise_output_spec(const sharding_spec& a, const sharding_spec& b, bool linear_op = true) {
  if (a.mesh_rank != b.mesh_rank) bad_rule::specs_have_different_mesh_rank(a.mesh_rank, b.mesh_rank);
  if (a.tensor_rank != b.tensor_rank) bad_rule::elementwise_operands_need_equal_rank(a.tensor_rank, b.tensor_rank);
  for (std::size_t i = 0; i < a.mesh_rank; ++i)
    if (!(a[i] == b[i]) || (a[i].is_partial() && !linear_op))
      bad_rule::elementwise_placements_differ_on_mesh_axis(static_cast<int>(i), a[i], b[i]);
  return a;
}

/// Output spec of a norm / softmax over `dim`: the input's, which must not shard `dim`.
constexpr sharding_spec normalised_output_spec(const sharding_spec& x, int dim) {
  for (std::size_t i = 0; i < x.mesh_rank; ++i)
    if (x[i].is_shard(dim) || x[i].is_partial()) bad_rule::normalised_dim_is_sharded_on_mesh_axis(static_cast<int>(i), dim);
  return x;
}

}  // namespace autoshard

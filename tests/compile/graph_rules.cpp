// Compile-time output-spec rules of the graph area: every line is a static_assert.
#include <autoshard/graph/graph.hpp>

namespace {
using autoshard::matmul_output_spec;
// Alpa notation with the mesh rank (2) and the tensor rank spelled out.
constexpr autoshard::sharding_spec s2(std::string_view text, int tensor_rank) {
  return autoshard::parse_spec(text, 2, tensor_rank);
}

// mm on a 2-D mesh, DTensor's einsum "mk,kn->mn": shard m, n, k (Partial) or replicate.
static_assert(matmul_output_spec(s2("S0R", 2), s2("RR", 2)) == s2("S0R", 2));
static_assert(matmul_output_spec(s2("RR", 2), s2("RS1", 2)) == s2("RS1", 2));
static_assert(matmul_output_spec(s2("S0R", 2), s2("RS1", 2)) == s2("S0S1", 2));
static_assert(matmul_output_spec(s2("RS0", 2), s2("S0R", 2)) == s2("RRP0", 2));
static_assert(matmul_output_spec(s2("S0S1", 2), s2("S1R", 2)) == s2("S0RP1", 2));
static_assert(matmul_output_spec(s2("S01R", 2), s2("RR", 2)) == s2("S01R", 2));
// bmm "bmk,bkn->bmn": the batch dim sharded in both operands.
static_assert(matmul_output_spec(s2("S0RR", 3), s2("S0RR", 3)) == s2("S0RR", 3));
static_assert(matmul_output_spec(s2("S0RS1", 3), s2("S0S1R", 3)) == s2("S0RRP1", 3));
// x @ W with a 3-D activation and a 2-D weight: batch and sequence dims shard x alone.
static_assert(matmul_output_spec(s2("RS0R", 3), s2("RS1", 2)) == s2("RS0S1", 3));

// linear: W [out,in] (column-parallel shards out, row-parallel shards in) or Conv1D [in,out].
static_assert(autoshard::linear_output_spec(s2("RRR", 3), s2("S0R", 2)) == s2("RRS0", 3));
static_assert(autoshard::linear_output_spec(s2("RRS0", 3), s2("RS0", 2)) == s2("RRRP0", 3));
static_assert(autoshard::linear_output_spec(s2("RRR", 3), s2("RS0", 2), true) == s2("RRS0", 3));
static_assert(autoshard::linear_output_spec(s2("S0S1", 2), s2("RS1", 2)) == s2("S0RP1", 2));
static_assert(autoshard::linear_output_spec(s2("S1", 1), s2("S0S1", 2)) == s2("S0P1", 1));

// elementwise and normalisation
static_assert(autoshard::elementwise_output_spec(s2("S0R", 2), s2("S0R", 2)) == s2("S0R", 2));
static_assert(autoshard::elementwise_output_spec(s2("RRP0", 2), s2("RRP0", 2)) == s2("RRP0", 2));
static_assert(autoshard::normalised_output_spec(s2("S0S1R", 3), 2) == s2("S0S1R", 3));
static_assert(matmul_output_spec(s2("RS0", 2), s2("S0R", 2)).has_partial());

// op kinds round-trip through their spelling at compile time
static_assert(autoshard::parse_op_kind(autoshard::to_string(autoshard::op_kind::attention)) ==
              autoshard::op_kind::attention);
static_assert(!autoshard::parse_op_kind("conv3d").has_value());
}  // namespace

// The core at compile time: building this file is the test (static_asserts only).
// Every fact below is computed by the same constexpr code the runtime uses.
#include <autoshard/autoshard.hpp>

#include <type_traits>  // std::is_empty_v

namespace as = autoshard;
using namespace autoshard::literals;
using as::collective;
using as::tensor_shape;

namespace {

constexpr bool near(double a, double b) { return (a - b < 0 ? b - a : a - b) <= 1e-12 * (b < 0 ? -b : b); }

// ---- meshes: static sizes cost nothing, dynamic ones one int each
static_assert(std::is_empty_v<as::mesh_extents<2, 4>>);
static_assert(sizeof(as::mesh_extents<2, as::dyn>) == sizeof(int));
static_assert(as::mesh_extents<2, 4>::rank() == 2 && as::mesh_extents<2, 4>::is_static());
static_assert(as::mesh_extents<2, as::dyn, 3>(5).size(1) == 5);
static_assert(as::device_mesh(as::mesh_extents<2, 4>{}).num_ranks() == 8);
constexpr as::device_mesh m24 = as::make_mesh_2d(2, 4, 25e9, 300e9);
static_assert(m24.rank_of({1, 2}) == 6 && m24.coordinate(6)[0] == 1 && m24.coordinate(6)[1] == 2);
static_assert(m24.group_member(0, 6, 0) == 2 && m24.group_index(1, 6) == 1);
static_assert(m24.link(0).beta == 25e9 && m24.link(1).alpha == 5e-6);
// Axis names (PyTorch's mesh_dim_names) are constexpr too, and labels only.
constexpr as::device_mesh named24 = as::device_mesh{2, 4}.set_axis_name(0, "dp").set_axis_name(1, "tp");
static_assert(named24.axis_name(1) == "tp" && named24.find_axis("dp") == 0 && named24 == as::device_mesh{2, 4});

// ---- specs: literals in both notations, checked while compiling
static_assert("S0R"_spec == as::make_spec(2, {as::Shard(0)}));  // Alpa infers the mesh rank from the axes it names
static_assert("S0R"_spec.tensor_rank == 2 && "S0R"_spec.mesh_rank == 1);
static_assert("[S(0),R]"_spec.mesh_rank == 2 && "[S(0),R]"_spec.tensor_rank == 1);
static_assert("S01R"_spec == as::parse_spec("[S(0),S(0)]", 2, 2));
static_assert("RS1"_spec == as::make_spec(2, {as::Replicate(), as::Shard(1)}));
static_assert("RRPmax0"_spec[0] == as::Partial(as::reduce_op::max));
static_assert(as::parse_spec("S0R", 2) == as::parse_spec("[S(0),R]", 2, 2));
static_assert(as::parse_spec("[Shard(1), Partial(min)]", 2, 2) == as::parse_spec("RS0Pmin1", 2, 2));

// PyTorch's printed spellings, at compile time too: tuples, dim=, negative dims (resolved
// against the tensor's rank), quoted reduce ops, the one-element tuple's trailing comma.
static_assert("(Replicate(), Shard(dim=1))"_spec == "[R,S(1)]"_spec);
static_assert("[Shard(0), Partial()]"_spec == as::parse_spec("[S(0),P]"));
static_assert("(Shard(dim=0),)"_spec == "[S(0)]"_spec);
static_assert(as::parse_spec("[Shard(-1), R]", 2, 3) == as::parse_spec("[S(2),R]", 2, 3));
static_assert(as::parse_spec("(Shard(dim=-2),)", 1, 2) == "S0R"_spec);
static_assert("[Partial(\"max\"), Partial('min')]"_spec == "[P(max),P(min)]"_spec);
static_assert("[Partial(reduce_op=\"sum\")]"_spec == "[P]"_spec);
using last_dim = as::sharded_tensor<float, as::mesh_extents<2, 4>, "(Replicate(), Shard(dim=-1))", 768, 2304>;
static_assert(last_dim::spec == as::parse_spec("RS1", 2, 2));

constexpr as::sharding_spec take(as::spec_literal s) { return s; }
static_assert(take("[S(0),R]") == "[S(0),R]"_spec);
static_assert(take("S1R").mesh_rank == 2);

// ---- layout: the worked numbers of the split rule
static_assert(as::split_range(5, 4, 2) == as::dim_range{4, 1} && as::split_range(5, 4, 3) == as::dim_range{5, 0});
static_assert(as::split_range(6, 4, 3) == as::dim_range{6, 0});
static_assert(as::split_range(6, 4, 3, as::split_rule::balanced) == as::dim_range{5, 1});
constexpr as::device_mesh plain24{2, 4};
static_assert(as::local_box(plain24, "S01R"_spec, {10, 3}, 5) == as::shard_box{{2, 3}, {7, 0}});
static_assert(as::max_local_shape(plain24, "S01R"_spec, {10, 3}) == tensor_shape{2, 3});
static_assert(!as::divides_evenly(plain24, "S01R"_spec, {10, 3}) && as::divides_evenly(plain24, "S01R"_spec, {16, 3}));
static_assert(!as::no_empty_shards(as::device_mesh{4}, "S0"_spec, {6}));  // 6 over 4 -> 2,2,2,0

// ---- the typed front end: a GPT-2 c_attn weight, column-parallel over the GPUs of a node
using c_attn = as::sharded_tensor<float, as::mesh_extents<2, 4>, "RS1", 768, 2304>;
static_assert(c_attn::spec == as::parse_spec("[R,S(1)]", 2, 2));
static_assert(c_attn::type == as::dtype::f32);
static_assert(c_attn::global_shape == tensor_shape{768, 2304});
static_assert(c_attn::local_shape(0) == tensor_shape{768, 576});
static_assert(c_attn::local_shape(5) == tensor_shape{768, 576});
static_assert(c_attn::local_box(7).offset == tensor_shape{0, 1728});
static_assert(c_attn::max_local_elements() == 768 * 576);
static_assert(c_attn::lower() == as::sharded_desc{{768, 2304}, as::dtype::f32, as::parse_spec("RS1", 2, 2)});

// Plans are constant expressions: [R,S(1)] -> [S(0),R] gathers dim 1 inside the node, then
// each node keeps its half of dim 0.
constexpr as::redist_plan to_rows = c_attn::plan_to<"S0R">();
static_assert(to_rows.size() == 2 && to_rows.communication_steps() == 1);
static_assert(to_rows[0].mesh_axis == 1 && to_rows[0].kind == collective::all_gather);
static_assert(to_rows[0].from == as::Shard(1) && to_rows[0].to == as::Replicate());
static_assert(to_rows[1].mesh_axis == 0 && to_rows[1].kind == collective::local_slice);
static_assert(to_rows[1].after == as::parse_spec("S0R", 2, 2));
static_assert(c_attn::plan_to<"[R,S(1)]">().empty());
static_assert(c_attn::plan_to<"S1R">()[0].kind == collective::all_to_all);

// Its cost: the all-gather moves the whole weight over the node's 4 GPUs.
constexpr as::plan_cost to_rows_cost = c_attn::cost_to<"S0R">(m24);
static_assert(to_rows_cost[0].bytes == 768 * 2304 * 4);
static_assert(near(to_rows_cost.seconds, 5e-6 + 0.75 * 768 * 2304 * 4 / 300e9));
static_assert(to_rows_cost[1].seconds == 0.0);

// Uneven and empty shards: 5 rows over 4 ranks are 2,2,1,0, the empty one at offset 5.
using uneven = as::sharded_tensor<as::bf16_t, as::mesh_extents<4>, "S0", 5>;
static_assert(uneven::local_shape(0)[0] == 2 && uneven::local_shape(2)[0] == 1 && uneven::local_shape(3)[0] == 0);
static_assert(uneven::local_box(3).offset[0] == 5);
static_assert(uneven::cost_to<"R">(as::device_mesh{4})[0].bytes == 8 * 2);  // padded to 2 each

// Partial sums: reduce-scatter into a shard, all-reduce into a replica.
using partial = as::sharded_tensor<float, as::mesh_extents<2, 4>, "RRP1", 8, 8>;
static_assert(partial::plan_to<"RS1">()[0].kind == collective::reduce_scatter);
static_assert(partial::plan_to<"RR">()[0].kind == collective::all_reduce);
static_assert(near(partial::cost_to<"RR">(m24).seconds, 5e-6 + 2 * 0.75 * 256 / 300e9));  // one alpha per collective
// A Partial over both axes is reduced hierarchically, at compile time too.
using partial2 = as::sharded_tensor<float, as::mesh_extents<2, 4>, "RRP01", 8, 8>;
static_assert(partial2::plan_to<"RR">().size() == 3 && partial2::plan_to<"RR">()[0].kind == collective::reduce_scatter &&
              partial2::plan_to<"RR">()[0].mesh_axis == 1 && partial2::plan_to<"RR">()[1].kind == collective::all_reduce);

// Size-1 axes never communicate, and dynamic meshes still plan at compile time.
using thin = as::sharded_tensor<float, as::mesh_extents<1, 4>, "S0R", 8, 8>;
static_assert(thin::plan_to<"S1R">().size() == 1 && thin::plan_to<"S1R">()[0].kind == collective::local_slice);
using dynamic = as::sharded_tensor<float, as::mesh_extents<as::dyn, 4>, "S0R", 8, 8>;
static_assert(dynamic::plan_to<"S1R">().size() == 2);  // sizes unknown: nothing skipped
static_assert(dynamic::local_box(as::mesh_extents<as::dyn, 4>(2), 5).offset == tensor_shape{4, 0});

// The plan depends on placements only: the same on a 2x2 as on a 2x4 mesh.
static_assert(as::plan_redistribute("[S(0),S(0)]"_spec, "[R,S(0)]"_spec).size() == 3);
static_assert(as::plan_redistribute(as::device_mesh{2, 2}, "[S(0),S(0)]"_spec, "[R,S(0)]"_spec).size() == 3);

}  // namespace

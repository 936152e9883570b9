// A GPT-2 attention weight described entirely by its type, and everything autoshard can say
// about it computed while compiling: each rank's shard, the plan to another layout, its cost.
//
// c_attn is GPT-2's fused QKV projection, a Conv1D whose weight is stored [in, out] =
// [768, 2304]. Column-parallel inside a node splits the out dim over the node's 4 GPUs and
// replicates over the 2 nodes: [R, S(1)], "RS1" in Alpa's notation.
#include <autoshard/autoshard.hpp>  // sharded_tensor, mesh_extents, make_mesh_2d

#include <cstdio>    // std::printf
#include <iostream>  // std::cout
#include <string>    // std::string

namespace as = autoshard;

using mesh = as::mesh_extents<2, 4>;  // 2 nodes x 4 GPUs, all static
using c_attn = as::sharded_tensor<float, mesh, "RS1", 768, 2304>;

// Every rank holds all 768 rows and a quarter of the 2304 columns.
static_assert(c_attn::local_shape(0) == as::tensor_shape{768, 576});
static_assert(c_attn::local_shape(7) == as::tensor_shape{768, 576});
static_assert(c_attn::local_box(6).offset == as::tensor_shape{0, 1152});  // rank 6 = node 1, GPU 2
static_assert(c_attn::max_local_elements() * 4 == 1769472);               // bytes each GPU allocates

// Moving to row-parallel across nodes ([S(0), R]): gather the columns inside each node, then
// each node keeps its half of the rows (free). A constant expression, like the shapes.
constexpr as::redist_plan to_rows = c_attn::plan_to<"S0R">();
static_assert(to_rows.size() == 2);
static_assert(to_rows[0].kind == as::collective::all_gather && to_rows[0].mesh_axis == 1);
static_assert(to_rows[1].kind == as::collective::local_slice && to_rows[1].mesh_axis == 0);

// Priced with 25 GB/s between nodes and 300 GB/s inside a node.
constexpr as::device_mesh links = as::make_mesh_2d(2, 4, 25e9, 300e9);
constexpr as::plan_cost to_rows_cost = c_attn::cost_to<"S0R">(links);
static_assert(to_rows_cost[0].bytes == 768 * 2304 * 4);
static_assert(to_rows_cost.seconds > 22e-6 && to_rows_cost.seconds < 23e-6);  // 5 us + 3/4 of 7 MB at 300 GB/s

// A spec the tensor cannot have does not compile, e.g. "[S(2),R]" (dim 2 of a rank-2 tensor):
//   error: call to non-constexpr function '... bad_spec::shard_dim_outside_tensor(...)'

int main() {
  std::cout << "c_attn [768,2304] f32 on " << as::device_mesh(mesh{}) << " as " << c_attn::spec << " = "
            << as::to_alpa_string(c_attn::spec) << "\n";
  for (int r = 0; r < 8; ++r) {
    const auto b = c_attn::local_box(r);
    std::cout << "  rank " << r << ": shape " << b.shape << " at offset " << b.offset << "\n";
  }
  std::cout << "plan " << to_rows << "\n";
  for (const auto& s : to_rows_cost)
    std::printf("  axis %d %-14s %10lld bytes  %8.3f us\n", int(s.step.mesh_axis),
                std::string(as::to_string(s.step.kind)).c_str(), static_cast<long long>(s.bytes), s.seconds * 1e6);
  std::printf("total %.3f us\n", to_rows_cost.seconds * 1e6);

  // The same numbers at run time, from a spec read as text: one code path.
  const auto runtime = as::price_plan(links, as::plan_redistribute(links, as::parse_spec("[R,S(1)]"), as::parse_spec("S0R", 2)),
                                      {768, 2304}, as::dtype::f32);
  return runtime.seconds == to_rows_cost.seconds ? 0 : 1;
}

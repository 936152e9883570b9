// expect: matmul_placements_do_not_combine_on_mesh_axis
// Sharding m of a together with k of b is no matmul strategy: a compile error that names it.
#include <autoshard/graph/rules.hpp>
#include <autoshard/core/parse.hpp>

constexpr auto bad = autoshard::matmul_output_spec(autoshard::parse_spec("S0R", 2, 2),
                                                   autoshard::parse_spec("S0R", 2, 2));
int main() { return bad.mesh_rank; }

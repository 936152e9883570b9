// expect: partial_to_different_partial
// A partial sum cannot become a partial max without reducing first.
#include <autoshard/autoshard.hpp>

using W = autoshard::sharded_tensor<float, autoshard::mesh_extents<2, 4>, "RRP1", 8, 8>;

static_assert(W::plan_to<"RRPmax1">().size() == 1);

int main() {}

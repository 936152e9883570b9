// expect: a device mesh has 1 to 4 axes
// A mesh has at most four axes.
#include <autoshard/autoshard.hpp>

using W = autoshard::sharded_tensor<float, autoshard::mesh_extents<2, 2, 2, 2, 2>, "RR", 8, 8>;

int main() { return W::spec.mesh_rank; }

// expect: shard_dim_outside_tensor
// A typed tensor of rank 2 cannot be sharded on tensor dim 2.
#include <autoshard/autoshard.hpp>

using W = autoshard::sharded_tensor<float, autoshard::mesh_extents<2, 4>, "[S(2),R]", 768, 2304>;

int main() { return W::spec.mesh_rank; }

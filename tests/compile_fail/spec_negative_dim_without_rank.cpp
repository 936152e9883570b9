// expect: negative_shard_dim_needs_tensor_rank
// Shard(-1) counts from the end of the tensor's dims; a bare literal does not know the tensor's
// rank, so it cannot be resolved (sharded_tensor<..., "[S(-1)]", dims...> can: it passes the rank).
#include <autoshard/autoshard.hpp>

using namespace autoshard::literals;

constexpr autoshard::sharding_spec s = "[Shard(-1)]"_spec;

int main() { return s.mesh_rank; }

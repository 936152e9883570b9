// expect: reduce_op_not_supported
// PyTorch's Partial("avg") has no counterpart in this cost model and executor: the literal fails
// to compile, and the compiler names bad_spec::reduce_op_not_supported (at run time the same
// path throws "Partial(avg) is not supported: the supported reduce ops are sum, max and min").
#include <autoshard/autoshard.hpp>

using namespace autoshard::literals;

constexpr autoshard::sharding_spec s = "[Partial(\"avg\")]"_spec;

int main() { return s.mesh_rank; }

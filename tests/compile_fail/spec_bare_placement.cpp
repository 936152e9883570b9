// expect: bare_placement
// "S(0)" alone is one placement, not a spec: the compiler names bad_spec::bare_placement, whose
// run-time message shows the bracketed spellings ([S(0)], (Shard(dim=0),)) and Alpa's (S0R).
#include <autoshard/autoshard.hpp>

using namespace autoshard::literals;

constexpr autoshard::sharding_spec s = "S(0)"_spec;

int main() { return s.mesh_rank; }

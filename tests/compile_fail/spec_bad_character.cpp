// expect: unexpected_character
// A spec literal with a character neither notation knows: "S0X" fails to compile, and the
// compiler names bad_spec::unexpected_character, the function the parser calls on that path.
#include <autoshard/autoshard.hpp>

using namespace autoshard::literals;

constexpr autoshard::sharding_spec s = "S0X"_spec;

int main() { return s.mesh_rank; }

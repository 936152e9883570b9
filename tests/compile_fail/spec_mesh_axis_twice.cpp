// expect: mesh_axis_used_twice
// One mesh axis cannot split two tensor dims: "S0S0" uses mesh axis 0 for dims 0 and 1.
#include <autoshard/autoshard.hpp>

void takes_a_spec(autoshard::spec_literal) {}

int main() { takes_a_spec("S0S0"); }

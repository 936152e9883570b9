// expect: a device mesh has 1 to 4 axes
// A mesh needs at least one axis.
#include <autoshard/autoshard.hpp>

autoshard::mesh_extents<> m;

int main() {}

#include "all.hpp"
int odr_b() { return static_cast<int>(autoshard::parse_spec("[S(0),R]").mesh_rank); }

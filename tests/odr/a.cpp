#include "all.hpp"
int odr_a() { return static_cast<int>(autoshard::parse_spec("S0R").tensor_rank); }

#include "all.hpp"
// The include-order check (tests/odr/public_names.py): every public header, then every public
// class and enum named as a type.
#if defined(AUTOSHARD_ODR_NAMES)
#include "public_names.inc"
#endif
int odr_b() { return static_cast<int>(autoshard::parse_spec("[S(0),R]").mesh_rank); }

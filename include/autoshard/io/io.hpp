#pragma once
/// The io area: checked JSON reading (json.hpp) and atomic file writing (atomic_file.hpp),
/// the one home of both for every reader and writer of autoshard.
#include "atomic_file.hpp"  // atomic_file, write_file_atomically, remove_live_temporaries
#include "json.hpp"         // json_in, load_json_file, parse_json_text, read_regular_file
#include "mesh_json.hpp"    // mesh_to_json, mesh_from_json

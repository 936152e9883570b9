// libFuzzer target: the JSON model reader (graph/io.hpp). Input: a model file. Only
// io_error and graph_error may escape; a model that reads must validate, write back to JSON
// and read again to the same vertices and edges, and draw as Graphviz.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include <autoshard/graph/dot.hpp>
#include <autoshard/graph/io.hpp>

#include "target.hpp"

namespace autoshard_fuzz::model_json_target {

int one_input(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  autoshard::model_graph g;
  try {
    g = autoshard::read_json(in);
  } catch (const autoshard::io_error&) {
    return 0;
  } catch (const autoshard::graph_error&) {
    return 0;
  }
  const std::string text = autoshard::to_json(g).dump();
  autoshard::model_graph h;
  try {
    h = autoshard::from_json(nlohmann::json::parse(text));
  } catch (const autoshard::error& e) {
    std::fprintf(stderr, "fuzz_model_json: written model does not read back: %s\n%s\n", e.what(), text.c_str());
    std::abort();
  }
  if (autoshard::to_json(h).dump() != text || boost::num_edges(h) != boost::num_edges(g)) {
    std::fprintf(stderr, "fuzz_model_json: round trip changed the model\n%s\n", text.c_str());
    std::abort();
  }
  std::ostringstream dot;
  autoshard::write_dot(dot, g);
  return 0;
}

}  // namespace autoshard_fuzz::model_json_target

AUTOSHARD_FUZZ_TARGET(model_json)

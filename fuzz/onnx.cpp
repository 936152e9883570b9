// libFuzzer target: the ONNX reader (onnx/onnx.hpp). Input: the bytes of an ONNX file. Only
// io_error and graph_error may escape; a model that reads must give a valid graph whose JSON
// reads back to the same graph, and every opaque vertex must be listed with its op_type. The
// graph's JSON must serialize (as a plan file embeds it) and the graph draw as Graphviz.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>

#include <autoshard/graph/dot.hpp>
#include <autoshard/graph/graph.hpp>
#include <autoshard/onnx/onnx.hpp>

#include "target.hpp"

namespace autoshard_fuzz::onnx_target {

int one_input(const std::uint8_t* data, std::size_t size) {
  autoshard::onnx_options o;
  // Keep each input fast and small: shapes, not sizes, are what the reader decides.
  o.max_file_bytes = std::uint64_t{1} << 20;
  o.max_nodes = 4096;
  o.batch = 2;
  o.seq = 3;
  autoshard::onnx_import r;
  try {
    r = autoshard::read_onnx(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.onnx", o);
  } catch (const autoshard::io_error&) {
    return 0;
  } catch (const autoshard::graph_error&) {
    return 0;
  }
  const autoshard::model_graph& g = r.graph;
  autoshard::validate(g);
  std::size_t opaque = 0;
  for (autoshard::vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].kind == autoshard::op_kind::opaque) {
      ++opaque;
      if (g[v].attrs.op_type.empty()) std::abort();
    }
  if (opaque != r.opaque.size()) {
    std::fprintf(stderr, "fuzz_onnx: %zu opaque vertices but %zu listed\n", opaque, r.opaque.size());
    std::abort();
  }
  const nlohmann::json j = autoshard::to_json(g);
  // What a plan file embeds and `autoshard plan` writes: it must serialize (every string in it
  // valid UTF-8; nlohmann's dump() throws type_error otherwise) and parse back to the same JSON.
  const std::string text = j.dump();
  if (nlohmann::json::parse(text) != j) {
    std::fprintf(stderr, "fuzz_onnx: the graph's JSON text does not parse back to the same JSON\n");
    std::abort();
  }
  std::ostringstream dot;
  autoshard::write_dot(dot, g);
  if (autoshard::to_json(autoshard::from_json(j)) != j) {
    std::fprintf(stderr, "fuzz_onnx: the graph's JSON does not read back to the same graph\n");
    std::abort();
  }
  return 0;
}

}  // namespace autoshard_fuzz::onnx_target

AUTOSHARD_FUZZ_TARGET(onnx)

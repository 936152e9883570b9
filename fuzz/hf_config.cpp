// libFuzzer target: the Hugging Face config.json reader (graph/hf_config.hpp). Input: a config
// file. Only io_error and graph_error may escape; a config that reads must build a valid graph,
// and the config written back from it must read to the same graph.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <autoshard/graph/graph.hpp>

#include "target.hpp"

namespace autoshard_fuzz::hf_config_target {

int one_input(const std::uint8_t* data, std::size_t size) {
  nlohmann::json j;
  try {  // as the tool reads a config.json: depth-checked first (io/json.hpp)
    j = autoshard::parse_json_text(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
  } catch (const autoshard::io_error&) {
    return 0;
  }
  autoshard::hf_model m;
  autoshard::model_graph g;
  try {
    m = autoshard::read_hf_config(j, "fuzz.json");
    // Keep each input fast: shapes, not depth or activation sizes, are what the reader decides.
    m.config.layers = m.config.layers > 3 ? 3 : m.config.layers;
    m.config.seq = 1;
    m.config.batch = 1;
    g = autoshard::build_hf(m);
  } catch (const autoshard::io_error&) {
    return 0;
  } catch (const autoshard::graph_error&) {
    return 0;
  }
  autoshard::validate(g);
  if (autoshard::parameter_count(g) <= 0) std::abort();
  autoshard::hf_model back;
  try {
    back = autoshard::read_hf_config(autoshard::to_hf_config(m), "written.json");
  } catch (const autoshard::error& e) {
    std::fprintf(stderr, "fuzz_hf_config: written config does not read back: %s\n%s\n", e.what(),
                 autoshard::to_hf_config(m).dump().c_str());
    std::abort();
  }
  back.config.seq = 1;
  back.config.batch = 1;
  if (autoshard::to_json(autoshard::build_hf(back)) != autoshard::to_json(g)) {
    std::fprintf(stderr, "fuzz_hf_config: round trip changed the graph\n%s\n", autoshard::to_hf_config(m).dump().c_str());
    std::abort();
  }
  return 0;
}

}  // namespace autoshard_fuzz::hf_config_target

AUTOSHARD_FUZZ_TARGET(hf_config)

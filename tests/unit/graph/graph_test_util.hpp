// Helpers shared by the graph and exec tests: a GPT-2 small enough to run on Gloo ranks in
// milliseconds, and a vertex looked up by name that fails the test when it is missing.
#pragma once
#include <doctest/doctest.h>

#include <autoshard/graph/graph.hpp>

#include <string>  // std::string

namespace graph_test {

/// GPT-2 with 2 layers, hidden 64, 4 heads, sequence 8, batch 2, a 96-token vocabulary.
inline autoshard::model_graph tiny_gpt2(autoshard::run_mode mode) {
  autoshard::transformer_config c = autoshard::transformer_config::gpt2(2, 64, 4);
  c.seq = 8;
  c.batch = 2;
  c.vocab = 96;
  c.max_positions = 8;
  c.mode = mode;
  return autoshard::build_gpt2(c);
}

/// The vertex called `name`; REQUIRE fails (naming it) when there is none.
inline autoshard::vertex_t vertex_named(const autoshard::model_graph& g, const std::string& name) {
  const auto v = autoshard::find_vertex(g, name);
  REQUIRE_MESSAGE(v, name);
  return *v;
}

}  // namespace graph_test

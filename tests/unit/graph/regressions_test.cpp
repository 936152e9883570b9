// Inputs the fuzzers (fuzz/, docs/fuzzing.md) found crashing, each fed to the library and
// required to give a clean error.
#include <doctest/doctest.h>

#include <autoshard/graph/graph.hpp>

#include <sstream>
#include <string>

TEST_CASE("regression: fuzz_model_json, a number too large for a double") {
  // fuzz_model_json crash-e6ec9065: "301e40072" made nlohmann::json throw out_of_range (406),
  // which read_json did not turn into io_error: std::terminate.
  std::istringstream in(R"({"nodes": [{"name": "x", "kind": "input", "shape": [301e40072], "dtype": "f32"}]})");
  std::string msg;
  try {
    (void)autoshard::read_json(in);
  } catch (const autoshard::io_error& e) {
    msg = e.what();
  }
  CHECK(msg.find("io error: model JSON is not valid JSON") == 0);
  CHECK(msg.find("number overflow") != std::string::npos);
}

TEST_CASE("regression: an embedding of no rows, a loss of no label or class, a mean and an attention over nothing are refused") {
  // Hardening round thirteen, empty-lookups: each was a valid graph, planned; verify then failed
  // at run time ("id 1 outside the table of 0 rows", "label 1 outside the vocabulary of 0") or
  // blamed the plan for the NaN of a mean over no label ("the plan's result differs").
  using namespace autoshard;
  model_graph g;
  const vertex_t ids = add_input(g, "ids", {4, 8}, dtype::i64);
  CHECK_THROWS_WITH_AS(add_op(g, op_kind::embedding, "emb", {ids, add_parameter(g, "tab", {0, 16}, dtype::f32)}),
                       "graph error: vertex 'emb': embedding: table [0,16] has no rows, so none of the ids [4,8] can be looked up",
                       graph_error);
  const vertex_t x = add_input(g, "x", {4, 8}, dtype::f32);
  const vertex_t none = add_op(g, op_kind::linear, "none", {x, add_parameter(g, "w0", {0, 8}, dtype::f32)});
  CHECK_THROWS_WITH_AS(add_op(g, op_kind::cross_entropy, "loss", {none, add_input(g, "labels", {4}, dtype::i64)}),
                       "graph error: vertex 'loss': cross_entropy: logits [4,0] have no class (last dim 0) for the labels [4] to name",
                       graph_error);
  const vertex_t rows0 = add_op(g, op_kind::linear, "rows0", {add_input(g, "x0", {0, 8}, dtype::f32), add_parameter(g, "w", {4, 8}, dtype::f32)});
  CHECK_THROWS_WITH_AS(add_op(g, op_kind::cross_entropy, "loss0", {rows0, add_input(g, "labels0", {0}, dtype::i64)}),
                       "graph error: vertex 'loss0': cross_entropy: labels [0] hold no label: the mean loss over none is 0/0", graph_error);
  // No id to look up in a table of no rows: an empty lookup, still a valid graph.
  const vertex_t empty = add_op(g, op_kind::embedding, "empty", {add_input(g, "ids0", {0, 8}, dtype::i64), add_parameter(g, "tab0", {0, 16}, dtype::f32)});
  CHECK(g[empty].shape == tensor_shape{0, 8, 16});
  // A mean over an empty dim: 0/0 for every element of its output (the executor wrote 0).
  op_attrs over1;
  over1.dims = {1};
  CHECK_THROWS_WITH_AS(add_op(g, op_kind::reduce_mean, "mean", {add_input(g, "e", {4, 0}, dtype::f32)}, over1),
                       "graph error: vertex 'mean': reduce_mean: reduced dim 1 of [4,0] is empty: each mean of [4] would be over no element, 0/0",
                       graph_error);
  CHECK(g[add_op(g, op_kind::reduce_sum, "sum", {*find_vertex(g, "e")}, over1)].shape == tensor_shape{4});
  // Attention over no key: each query's softmax over none.
  op_attrs heads;
  heads.heads = 2;
  const vertex_t q = add_input(g, "q", {2, 4, 8}, dtype::f32), kv = add_input(g, "kv", {2, 0, 8}, dtype::f32);
  CHECK_THROWS_WITH_AS(add_op(g, op_kind::attention, "att", {q, kv, kv}, heads),
                       "graph error: vertex 'att': attention: k and v [2,0,8] hold no key: each query of [2,4,8] would weigh none, 0/0",
                       graph_error);
}

// The opaque operator kind: what an importer makes of an operator it cannot map.
#include <doctest/doctest.h>

#include <autoshard/graph/graph.hpp>

#include <sstream>

namespace {
using namespace autoshard;

model_graph opaque_graph() {
  model_graph g;
  const vertex_t x = add_input(g, "x", {8, 32}, dtype::f32);
  const vertex_t w = add_parameter(g, "w", {32, 16}, dtype::f32);
  op_attrs a;
  a.dims = {8, 2, 16};  // not inferable from the operands: given
  a.op_type = "com.example.FancyOp";
  add_op(g, op_kind::opaque, "fancy", {x, w}, a);
  return g;
}
}  // namespace

TEST_CASE("an opaque operator offers only Replicate, keeps its given shape and reads back from JSON") {
  const model_graph g = opaque_graph();
  const vertex_t v = *find_vertex(g, "fancy");
  CHECK(g[v].shape == tensor_shape{8, 2, 16});
  const std::vector<strategy> s = enumerate_strategies(g, v, make_mesh_2d(2, 2, 25e9, 300e9));
  REQUIRE(s.size() == 1);
  CHECK(s[0].name == "RR,RR->RRR");
  CHECK(s[0].memory_bytes == 8 * 2 * 16 * 4);
  std::stringstream js;
  write_json(js, g);
  CHECK(js.str().find("\"op_type\": \"com.example.FancyOp\"") != std::string::npos);
  const model_graph back = read_json(js);
  CHECK(to_json(back) == to_json(g));
  CHECK(back[*find_vertex(back, "fancy")].attrs.op_type == "com.example.FancyOp");
  // With no operands (a generator), and the shape checks of every kind.
  model_graph h;
  op_attrs gen;
  gen.dims = {4};
  add_op(h, op_kind::opaque, "gen", std::initializer_list<vertex_t>{}, gen);
  CHECK(enumerate_strategies(h, 0, make_mesh_2d(2, 2, 25e9, 300e9)).size() == 1);
  gen.dims = {-1};
  CHECK_THROWS_AS(add_op(h, op_kind::opaque, "bad", std::initializer_list<vertex_t>{}, gen), graph_error);
  CHECK(parse_op_kind("opaque") == op_kind::opaque);
}

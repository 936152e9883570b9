// An opaque operator (imported with no mapping) can be planned but not run: verify says so,
// naming it, before any rank starts; its kernel says the same if called directly.
#include <doctest/doctest.h>

#include <autoshard/exec/exec.hpp>

TEST_CASE("verify refuses a graph with an opaque operator, naming it, and its kernel throws") {
  using namespace autoshard;
  model_graph g;
  const vertex_t x = add_input(g, "x", {4, 8}, dtype::f32);
  op_attrs a;
  a.dims = {4, 8};
  a.op_type = "NonMaxSuppression";
  const vertex_t o = add_op(g, op_kind::opaque, "nms", {x}, a);
  add_op(g, op_kind::relu, "act", {o});
  const device_mesh m = make_mesh_2d(1, 2, 25e9, 300e9);
  std::vector<strategy> plan;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) plan.push_back(enumerate_strategies(g, v, m).front());
  std::string msg;
  try {
    verify_plan(g, m, plan);
  } catch (const exec_error& e) {
    msg = e.what();
  }
  CHECK(msg.find("1 opaque operator with no kernel ('nms' ('NonMaxSuppression'))") != std::string::npos);
  host_tensor t(dtype::f32, {4, 8});
  const host_tensor* in[] = {&t};
  CHECK_THROWS_WITH_AS(run_kernel<float>(g[o], in, local_context{}),
                       doctest::Contains("has no kernel: it is an imported operator with no mapping ('NonMaxSuppression')"), exec_error);
}

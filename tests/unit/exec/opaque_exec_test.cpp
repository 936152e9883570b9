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

TEST_CASE("verify compares an integer operator in its own dtype, whatever the compute dtype") {
  // An imported model views its token ids (torch's dynamo exporter writes Reshape(input_ids));
  // the view is i64 when the run computes in f64 or f32.
  using namespace autoshard;
  model_graph g;
  const vertex_t ids = add_input(g, "ids", {4, 8}, dtype::i64);
  op_attrs a;
  a.dims = {4, 8};
  const vertex_t view = add_op(g, op_kind::reshape, "view", {ids}, a);
  const vertex_t table = add_parameter(g, "wte", {16, 4}, dtype::f32);
  add_op(g, op_kind::embedding, "embed", {view, table});
  const device_mesh m = make_mesh_2d(1, 2, 25e9, 300e9);
  std::vector<strategy> plan;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) plan.push_back(enumerate_strategies(g, v, m).front());
  for (dtype t : {dtype::f64, dtype::f32}) {
    verify_options o;
    o.compute = t;
    const verify_report r = verify_plan(g, m, plan, o);
    CHECK(r.passed());
    bool seen = false;
    for (const vertex_check& c : r.checks)
      if (c.name == "view") {
        seen = true;
        CHECK(c.max_abs_diff == 0.0);
        CHECK(c.ref_max_abs > 0.0);
      }
    CHECK(seen);
  }
}

namespace {
autoshard::vertex_t elementwise_op(autoshard::model_graph& g, const std::string& name, const std::string& op_type,
                                   const std::vector<autoshard::vertex_t>& in, autoshard::dtype t = autoshard::dtype::f32) {
  autoshard::op_attrs a;
  a.elementwise = true;
  a.op_type = op_type;
  return autoshard::add_op(g, autoshard::op_kind::opaque, name, in, a, t);
}
}  // namespace

TEST_CASE("imported elementwise operators run with ONNX's semantics, in the vertex's type") {
  using namespace autoshard;
  model_graph g;
  const vertex_t x = add_input(g, "x", {2, 2}, dtype::f32);
  const vertex_t ids = add_input(g, "ids", {2, 1}, dtype::i64);
  const vertex_t row = add_input(g, "row", {1, 3}, dtype::i64);
  const vertex_t sin = elementwise_op(g, "sin", "Sin", {x});
  const vertex_t cast = elementwise_op(g, "cast", "Cast", {x}, dtype::i64);
  const vertex_t eq = elementwise_op(g, "eq", "LessOrEqual", {row, ids}, dtype::boolean);
  const vertex_t elu = elementwise_op(g, "elu", "Elu", {x});  // its alpha is not recorded
  host_tensor xt(dtype::f64, {2, 2}), it(dtype::i64, {2, 1}), rt(dtype::i64, {1, 3});
  const double xs[] = {-1.5, 2.7, 0.25, -0.0};
  std::copy(std::begin(xs), std::end(xs), xt.as<double>());
  it.as<std::int64_t>()[0] = 0, it.as<std::int64_t>()[1] = 2;
  for (int j = 0; j < 3; ++j) rt.as<std::int64_t>()[j] = j;
  const auto run = [&](vertex_t v, std::vector<const host_tensor*> in) {
    local_context c;
    c.out_shape = g[v].shape;
    return run_kernel<double>(g[v], in, c);
  };
  const host_tensor s = run(sin, {&xt});
  for (int i = 0; i < 4; ++i) CHECK(s.as<double>()[i] == std::sin(xs[i]));
  const host_tensor ct = run(cast, {&xt});  // truncated toward zero
  CHECK(ct.type() == dtype::i64);
  CHECK(std::vector<std::int64_t>(ct.as<std::int64_t>(), ct.as<std::int64_t>() + 4) == std::vector<std::int64_t>{-1, 2, 0, 0});
  const host_tensor m = run(eq, {&rt, &it});  // [1,3] <= [2,1]: column j against row i's id, a causal band
  CHECK(m.shape() == tensor_shape{2, 3});
  CHECK(std::vector<std::int64_t>(m.as<std::int64_t>(), m.as<std::int64_t>() + 6) == std::vector<std::int64_t>{1, 0, 0, 1, 1, 1});
  CHECK_THROWS_WITH_AS(run(elu, {&xt}), doctest::Contains("has no kernel: it is an imported operator with no mapping ('Elu')"), exec_error);
}

TEST_CASE("verify runs imported elementwise operators forward, and refuses their backward up front") {
  using namespace autoshard;
  model_graph g;
  const vertex_t x = add_input(g, "x", {4, 8}, dtype::f32);
  const vertex_t w = add_parameter(g, "w", {8, 8}, dtype::f32);
  const vertex_t y = add_op(g, op_kind::matmul, "y", {x, w});
  const vertex_t c = elementwise_op(g, "cos", "Cos", {y});
  const vertex_t nan = elementwise_op(g, "nan", "IsNaN", {c}, dtype::boolean);
  const vertex_t zero = add_input(g, "zero", {}, dtype::f32);
  add_op(g, op_kind::where, "guard", {nan, zero, c});
  const device_mesh m = make_mesh_2d(1, 2, 25e9, 300e9);
  std::vector<strategy> plan;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    // every operator split on its rows where it can be: the opaque ones run on pieces
    const std::vector<strategy> all = enumerate_strategies(g, v, m);
    const auto split = std::find_if(all.begin(), all.end(), [](const strategy& s) { return to_alpa_string(s.output) == "S1R"; });
    plan.push_back(g[v].shape.rank == 2 && split != all.end() ? *split : all.front());
  }
  CHECK(to_alpa_string(plan[c].output) == "S1R");
  const verify_report r = verify_plan(g, m, plan);
  CHECK(r.passed());
  verify_options t;
  t.training = true;
  CHECK_THROWS_WITH_AS(verify_plan(g, m, plan, t),
                       doctest::Contains("1 imported elementwise operator on the gradient's path has a forward kernel only ('cos' ('Cos'))"),
                       exec_error);
}

// Uses the installed headers of every requested component.
#include <autoshard/autoshard.hpp>
#if defined(AUTOSHARD_HAVE_GRAPH)
#include <autoshard/graph/graph.hpp>
#endif
#if defined(AUTOSHARD_HAVE_PLAN)
#include <autoshard/plan/plan.hpp>
#endif
#if defined(AUTOSHARD_HAVE_SOLVE)
#include <autoshard/solve/solve.hpp>
#endif
#if defined(AUTOSHARD_HAVE_PASS)
#include <autoshard/pass/pass.hpp>
#endif
#if defined(AUTOSHARD_HAVE_TENSOR)
#include <autoshard/tensor/tensor.hpp>
#endif
#if defined(AUTOSHARD_HAVE_COMM)
#include <autoshard/comm/comm.hpp>
#endif
#if defined(AUTOSHARD_HAVE_GLOO)
#include <autoshard/gloo/gloo.hpp>
#endif
#if defined(AUTOSHARD_HAVE_ONNX)
#include <autoshard/onnx/onnx.hpp>
#endif
#include <iostream>

int main() {
  using namespace autoshard;
  constexpr device_mesh mesh = make_mesh_2d(2, 4, 25e9, 300e9);
  constexpr sharding_spec from = parse_spec("[R,S(1)]", 2, 2);
  constexpr sharding_spec to = parse_spec("S0R", 2, 2);
  constexpr plan_cost cost = price_plan(mesh, plan_redistribute(mesh, from, to), {768, 2304}, dtype::f32);
  static_assert(cost.size() == 2);
  const tensor_shape local = local_shape(mesh, to, {768, 2304}, 7);
  std::cout << "rank 7 holds " << local << "; plan costs " << cost.seconds << " s\n";
#if defined(AUTOSHARD_HAVE_ONNX)
  try {  // links libonnx and protobuf: an empty file is no model
    read_onnx("", "empty.onnx");
    return 1;
  } catch (const io_error& e) {
    std::cout << e.what() << "\n";
  }
#endif
#if defined(AUTOSHARD_HAVE_SOLVE)
  {  // links GLPK: two nodes of two strategies, the edge prefers they agree
    strategy_problem p;
    p.nodes = {{"a", {3, 1}, {0, 0}, {}}, {"b", {1, 2}, {0, 0}, {}}};  // name, costs, usages, live
    p.edges = {{0, 1, {0, 5, 5, 0}}};
    const solve_result r = solve_ilp(p);
    std::cout << "solver: objective " << r.objective_value() << "\n";
    if (r.objective_value() != 3) return 1;
  }
#endif
  return local == tensor_shape{384, 2304} ? 0 : 1;
}

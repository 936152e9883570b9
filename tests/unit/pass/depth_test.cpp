// The pass on deep graphs (issue 30 class 6): every step over the graph is one sweep, so the
// work grows linearly with the depth. requires_grad walked a vertex's ancestors for every
// operand and edge, and a 32,768-operator chain took 30-45 s to plan against 2-2.6 s for 8,192.
#include <doctest/doctest.h>

#include <autoshard/pass/pass.hpp>

#include <algorithm>
#include <string>

#include "unit/scratch.hpp"

namespace {

/// A chain of `n` GELUs from a parameter: in training every vertex has a gradient, found only
/// at the chain's root.
autoshard::model_graph gelu_chain(int n) {
  using namespace autoshard;
  model_graph g;
  vertex_t v = add_parameter(g, "w", {8, 64}, dtype::f32);
  for (int i = 0; i < n; ++i) v = add_op(g, op_kind::gelu, "g" + std::to_string(i), {v});
  return g;
}

/// The best of three builds of the pass's model (strategies and every edge priced) on two
/// devices (few strategies: what grows with the depth shows), in this thread's CPU time.
double model_seconds(const autoshard::model_graph& g) {
  autoshard::step_pricing pricing;
  pricing.mode = autoshard::run_mode::training;
  double best = 1e9;
  for (int run = 0; run < 3; ++run) {
    const double t0 = autoshard_test::thread_cpu_seconds();
    const autoshard::detail::pass_model pm(g, autoshard::make_cluster_mesh({2}), pricing);
    best = std::min(best, autoshard_test::thread_cpu_seconds() - t0);
    REQUIRE(pm.problem.edges.size() == boost::num_edges(g));
  }
  return best;
}

}  // namespace

TEST_CASE("hardening: the pass's model of a chain grows linearly with its depth (strategies, gradients, pricing)") {
  // The growth, not a time, so that it holds in every build: 4x the depth may cost at most 8x
  // (linear ~4x, n log n ~5x; before, 11.6x in a debug build, quadratic 16x).
  const autoshard::model_graph small = gelu_chain(500), large = gelu_chain(2000);
  const double ts = model_seconds(small), tl = model_seconds(large);
  INFO("500 operators: " << ts << " s, 2,000 operators: " << tl << " s");
  CHECK(tl < 8 * ts);
  // The one sweep agrees with the per-vertex walk.
  const std::vector<char> grads = autoshard::detail::gradient_flags(small);
  for (autoshard::vertex_t v = 0; v < boost::num_vertices(small); v += 37)
    CHECK(static_cast<bool>(grads[v]) == autoshard::detail::requires_grad(small, v));
}

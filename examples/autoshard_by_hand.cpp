// Auto-sharding a model built by hand with the graph API: a two-layer MLP block with a
// softmax head, planned for training on a 2x4 mesh with and without a memory budget.
//   build/gcc/examples/example_autoshard_by_hand
#include <autoshard/graph/graph.hpp>
#include <autoshard/pass/pass.hpp>

#include <iostream>

int main() {
  using namespace autoshard;
  // Tokens x hidden activations in, two linears with a GELU between, a residual, a softmax.
  model_graph g;
  const dtype t = dtype::bf16;
  const vertex_t x = add_input(g, "x", {4096, 1024}, t);  // batch*seq tokens, hidden 1024
  const vertex_t w1 = add_parameter(g, "mlp.fc1.weight", {4096, 1024}, t);  // [out, in]
  const vertex_t b1 = add_parameter(g, "mlp.fc1.bias", {4096}, t);
  const vertex_t w2 = add_parameter(g, "mlp.fc2.weight", {1024, 4096}, t);
  const vertex_t h = add_op(g, op_kind::linear, "mlp.fc1", {x, w1, b1});
  const vertex_t a = add_op(g, op_kind::gelu, "mlp.act", {h});
  const vertex_t y = add_op(g, op_kind::linear, "mlp.fc2", {a, w2});
  const vertex_t r = add_op(g, op_kind::add, "mlp.residual", {x, y});
  op_attrs last;
  last.axis = -1;
  add_op(g, op_kind::softmax, "head.softmax", {r}, last);
  validate(g);

  autosharding_options o;
  o.mesh = make_cluster_mesh({2, 4},    // 2 nodes x 4 devices
                             {.inter_node_bandwidth = 25e9,     // bytes/s on mesh axis 0
                              .intra_node_bandwidth = 300e9});  // bytes/s on mesh axis 1
  o.pricing.mode = run_mode::training;
  o.run_checks = true;                  // re-price the plan from scratch and check every edge

  for (bool budget : {false, true}) {
    if (budget) o.memory_budget = 40ll << 20;  // 40 MiB per device: weights must be split
    const autosharding_result res = autosharding_analysis_pass(g, o);
    std::cout << (budget ? "\nwith a 40 MiB budget per device:\n" : "without a memory budget:\n");
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
      std::cout << "  " << g[v].name << ": " << res.strategies[v].name << "\n";
    std::cout << res.report << "\n";
    if (budget && res.report.plan.peak_memory_bytes > *o.memory_budget) return 1;  // the pass kept the budget
  }
  return 0;
}

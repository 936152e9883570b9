// Fused dims (graph/fused.hpp): which tensors are laid out per part, the split's per-part
// sharding, and the edges that would move a fused dim, priced as forbidden.
#include <doctest/doctest.h>

#include <autoshard/graph/graph.hpp>

#include <algorithm>
#include <cmath>
#include <string>

#include "graph_test_util.hpp"

namespace {
using namespace autoshard;
using graph_test::tiny_gpt2;
using graph_test::vertex_named;

const strategy* find_strategy(const std::vector<strategy>& s, const std::string& name) {
  for (const strategy& x : s)
    if (x.name == name) return &x;
  return nullptr;
}
}  // namespace

TEST_CASE("fused dims: GPT-2's c_attn output, weight and bias are q | k | v, nothing else is fused") {
  const model_graph g = tiny_gpt2(run_mode::inference);
  CHECK(fused_dim_of(g, vertex_named(g, "transformer.h.0.attn.c_attn")) == fused_dim{2, 3});
  CHECK(fused_dim_of(g, vertex_named(g, "transformer.h.0.attn.c_attn.weight")) == fused_dim{1, 3});  // Conv1D [in, out]
  CHECK(fused_dim_of(g, vertex_named(g, "transformer.h.1.attn.c_attn.bias")) == fused_dim{0, 3});
  for (const char* plain : {"transformer.h.0.ln_1", "transformer.h.0.attn.q", "transformer.h.0.attn.c_proj",
                            "transformer.h.0.mlp.c_fc.weight", "transformer.wte.weight", "input_ids"})
    CHECK_MESSAGE(!fused_dim_of(g, vertex_named(g, plain)).any(), plain);
  const std::vector<fused_dim> all = fused_dims(g);
  CHECK(std::count_if(all.begin(), all.end(), [](fused_dim f) { return f.any(); }) == 2 * 3);
}

TEST_CASE("fused dims: only whole, equal, all-read parts of a tensor used nowhere else") {
  model_graph g;
  const vertex_t x = add_input(g, "x", {4, 8}, dtype::f32);
  const vertex_t w = add_parameter(g, "w", {12, 8}, dtype::f32);  // [out, in]
  const vertex_t y = add_op(g, op_kind::linear, "y", {x, w});
  auto slice = [&](const std::string& n, vertex_t of, std::int64_t start, std::int64_t len) {
    op_attrs a;
    a.axis = -1;
    a.start = start;
    a.length = len;
    return add_op(g, op_kind::split, n, {of}, a);
  };
  slice("a", y, 0, 4);
  slice("b", y, 4, 4);
  CHECK(!fused_dim_of(g, y).any());  // part [8, 12) is never read: not a fused q | k | v
  slice("c", y, 8, 4);
  CHECK(fused_dim_of(g, y) == fused_dim{1, 3});
  CHECK(fused_dim_of(g, w) == fused_dim{0, 3});  // [out, in]: the output dim is dim 0
  CHECK(!fused_dim_of(g, x).any());
  // A second use of the weight (tied) would see its columns in another order: nothing is fused.
  add_op(g, op_kind::linear, "tied", {x, w});
  CHECK(!fused_dim_of(g, y).any());
  CHECK(!fused_dim_of(g, w).any());

  model_graph u;  // unequal parts (GQA's q | k | v) are not a fused_dim
  const vertex_t t = add_input(u, "t", {4, 12}, dtype::f32);
  op_attrs a;
  a.axis = 1;
  a.start = 0;
  a.length = 8;
  add_op(u, op_kind::split, "q", {t}, a);
  a.start = 8;
  a.length = 4;
  add_op(u, op_kind::split, "k", {t}, a);
  CHECK(!fused_dim_of(u, t).any());
}

TEST_CASE("fused dims: the split offers the per-part Shard, and resharding a fused tensor is priced as a plain Shard") {
  const model_graph g = tiny_gpt2(run_mode::inference);
  const device_mesh m = make_mesh_2d(1, 4, 25e9, 300e9);
  strategy_options o;
  o.pricing.mode = run_mode::inference;
  const vertex_t qkv = vertex_named(g, "transformer.h.0.attn.c_attn"), q = vertex_named(g, "transformer.h.0.attn.q");
  const std::vector<strategy> sq = enumerate_strategies(g, q, m, o);
  const strategy* heads = find_strategy(sq, "RRS1->RRS1");  // [2, 8, 192] cut per part -> q [2, 8, 64] cut
  REQUIRE(heads);
  CHECK(max_local_shape(m, heads->output, g[q].shape) == tensor_shape{2, 8, 16});
  CHECK(max_local_shape(m, heads->inputs[0], g[qkv].shape) == tensor_shape{2, 8, 48});  // 16 of each of q, k, v
  // A plain split (not of a fused tensor) still keeps its axis whole.
  model_graph p;
  op_attrs a;
  a.axis = 1;
  a.length = 4;
  add_op(p, op_kind::split, "s", {add_input(p, "x", {4, 8}, dtype::f32)}, a);
  for (const strategy& s : enumerate_strategies(p, 1, m, o)) CHECK_MESSAGE(!s.inputs[0].is_sharded(1), s.name);

  // c_attn column-parallel (its output cut per part) into the head-parallel split is free. Into
  // a split that wants q whole it is an all-gather, from a Partial c_attn a reduce-scatter, and
  // from a whole one a local slice, each priced as a plain Shard's (the executor runs them on
  // core's fused_view, which keeps the per-part layout, with the same bytes).
  const std::vector<strategy> sc = enumerate_strategies(g, qkv, m, o);
  const strategy* column = find_strategy(sc, "RRR,RS1,S1->RRS1");
  const strategy* rowwise = find_strategy(sc, "RRS1,S1R,RP1->RRRP1");
  const strategy* whole = find_strategy(sc, "RRR,RR,R->RRR");
  const strategy* q_whole = find_strategy(sq, "RRR->RRR");
  REQUIRE(column);
  REQUIRE(rowwise);
  REQUIRE(whole);
  REQUIRE(q_whole);
  edge_t e{};
  for (auto [it, end] = boost::in_edges(q, g); it != end; ++it) e = *it;
  const cost_matrix c = resharding_costs(g, e, {*column, *rowwise, *whole}, {*heads, *q_whole}, m, o);
  const tensor_shape qkv_shape = g[qkv].shape;
  const auto plain = [&](const strategy& from, const strategy& to) {
    return resharding_seconds(m, from.output, to.inputs[0], qkv_shape, g[qkv].type, run_mode::inference);
  };
  CHECK(c(0, 0) == 0.0);
  CHECK(c(0, 1) == doctest::Approx(plain(*column, *q_whole)));
  CHECK(c(0, 1) > 0.0);
  CHECK(c(1, 0) == doctest::Approx(plain(*rowwise, *heads)));
  CHECK(c(1, 0) < c(1, 1));  // reduce-scatter < all-reduce
  CHECK(c(2, 0) == 0.0);     // a local slice
  CHECK(c(2, 1) == 0.0);
  // The view the executor redistributes on: [2, 8, 192] cut per part is [2, 8, 3, 64] cut on dim 3.
  const fused_dim f = fused_dim_of(g, qkv);
  CHECK(fused_view(f, qkv_shape) == tensor_shape{2, 8, 3, 64});
  CHECK(fused_view(f, column->output) == make_spec(4, {Replicate(), Shard(3)}));
  CHECK(fused_view(f, make_spec(3, {Shard(0), Partial()})) == make_spec(4, {Shard(0), Partial()}));  // dims before it stay
}

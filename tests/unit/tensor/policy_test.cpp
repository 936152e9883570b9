// Tensor-parallel rules, fused layouts and built-in policies, checked with labels: every weight
// holds its element indices, and each rank must hold exactly what Megatron's layer would hold
// (the expected indices are computed here from the layer's definition, not from the library).
#include <autoshard/autoshard.hpp>
#include <autoshard/tensor/tensor.hpp>
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

using namespace autoshard;

namespace {
host_tensor labels(tensor_shape s) {
  host_tensor t(dtype::i64, s);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.as<std::int64_t>()[i] = i;
  return t;
}
// Rank r's 2-D shard must be [rows, cols] with element (i, j) == label of (row_of(i), col_of(j)).
void expect_2d(const tensor_shards& p, int r, std::int64_t rows, std::int64_t cols,
               const std::function<std::int64_t(std::int64_t)>& row_of,
               const std::function<std::int64_t(std::int64_t)>& col_of) {
  CAPTURE(p.name);
  CAPTURE(r);
  host_tensor g = labels(p.global);
  host_tensor s = extract(g.view(), p.ranks[static_cast<std::size_t>(r)]);
  REQUIRE(s.shape() == tensor_shape{rows, cols});
  const auto* v = s.as<std::int64_t>();
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::int64_t want = row_of(i) * p.global[1] + col_of(j);
      if (v[i * cols + j] != want) {
        FAIL_CHECK("(" << i << "," << j << ") holds " << v[i * cols + j] << ", Megatron's layer holds " << want);
        return;
      }
    }
  // And the shards put back together give the original.
  host_tensor back(dtype::i64, p.global);
  for (std::size_t q = 0; q < p.ranks.size(); ++q) insert(extract(g.view(), p.ranks[q]).view(), p.ranks[q], back.view());
  CHECK(bitwise_equal(back.view(), g.view()));
}
void expect_1d(const tensor_shards& p, int r, std::int64_t n, const std::function<std::int64_t(std::int64_t)>& at) {
  host_tensor g = labels(p.global);
  host_tensor s = extract(g.view(), p.ranks[static_cast<std::size_t>(r)]);
  REQUIRE(s.shape() == tensor_shape{n});
  for (std::int64_t j = 0; j < n; ++j) CHECK(s.as<std::int64_t>()[j] == at(j));
}
auto same = [](std::int64_t i) { return i; };
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const error& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("glob patterns match Hugging Face names") {
  CHECK(glob_match("*.attn.c_attn.weight", "transformer.h.11.attn.c_attn.weight"));
  CHECK(glob_match("*.attn.c_attn.weight", "h.0.attn.c_attn.weight"));
  CHECK(!glob_match("*.attn.c_attn.weight", "attn.c_attn.weight"));
  CHECK(glob_match("*.mlp.c_proj.*", "h.0.mlp.c_proj.bias"));
  CHECK(!glob_match("*.mlp.c_proj.*", "h.0.attn.c_proj.bias"));
  CHECK(glob_match("h.?.ln_1.*", "h.3.ln_1.weight"));
  CHECK(glob_match("*", ""));
}

TEST_CASE("GPT-2 c_attn [768, 2304] over 4 ranks: columns r*192..r*192+191 of q, k, v, in that order") {
  const model_config cfg{{"n_head", 12}, {"n_embd", 768}};
  auto p = shards_of(policies::gpt2(), "transformer.h.0.attn.c_attn.weight", {768, 2304}, dtype::f32, 4, cfg);
  CHECK(p.rule == "column");
  CHECK(to_string(p.spec) == "[S(1)]");
  for (int r = 0; r < 4; ++r)
    expect_2d(p, r, 768, 576, same, [r](std::int64_t j) { return (j / 192) * 768 + r * 192 + j % 192; });
  auto b = shards_of(policies::gpt2(), "transformer.h.0.attn.c_attn.bias", {2304}, dtype::f32, 4, cfg);
  for (int r = 0; r < 4; ++r)
    expect_1d(b, r, 576, [r](std::int64_t j) { return (j / 192) * 768 + r * 192 + j % 192; });
}

TEST_CASE("a plan over a fused dim cuts each part: c_attn as the gpt2 policy cuts it, nested and on labels") {
  // A plan's c_attn [768, 2304] with dim 1 fused in 3 parts (graph/fused.hpp) and spec S(1)
  // over 4 ranks: rank r holds columns [r*192, (r+1)*192) of q, of k and of v, concatenated,
  // exactly the Megatron policy's layout (one home: parts_layout).
  plan_policy plan{device_mesh{4}, {{"h.0.attn.c_attn.weight", make_spec(2, {Shard(1)})}, {"h.0.attn.c_attn.bias", make_spec(1, {Shard(0)})}}};
  plan.fused = {{"h.0.attn.c_attn.weight", fused_dim{1, 3}}, {"h.0.attn.c_attn.bias", fused_dim{0, 3}}};
  const model_config cfg{{"n_head", 12}, {"n_embd", 768}};
  const tensor_shards by_plan = shards_of(plan, "h.0.attn.c_attn.weight", {768, 2304}, dtype::f32);
  const tensor_shards by_policy = shards_of(policies::gpt2(), "h.0.attn.c_attn.weight", {768, 2304}, dtype::f32, 4, cfg);
  CHECK(by_plan.fused == "3 equal parts");
  for (int r = 0; r < 4; ++r) {
    expect_2d(by_plan, r, 768, 576, same, [r](std::int64_t j) { return (j / 192) * 768 + r * 192 + j % 192; });
    CHECK(by_plan.ranks[static_cast<std::size_t>(r)].pieces == by_policy.ranks[static_cast<std::size_t>(r)].pieces);
  }
  const tensor_shards bias = shards_of(plan, "h.0.attn.c_attn.bias", {2304}, dtype::f32);
  for (int r = 0; r < 4; ++r) expect_1d(bias, r, 576, [r](std::int64_t j) { return (j / 192) * 768 + r * 192 + j % 192; });
  // Without the fused dim the same spec is one contiguous run (a plain Shard).
  plan.fused.clear();
  expect_2d(shards_of(plan, "h.0.attn.c_attn.weight", {768, 2304}, dtype::f32), 1, 768, 576, same,
            [](std::int64_t j) { return 576 + j; });

  // Nested over both axes of 2x2 ([S(1),S(1)]): 12 columns in 3 parts of 4, one column of each
  // part per rank, the outer axis first: rank (a, b) holds columns 2a + b, 4 + 2a + b, 8 + 2a + b.
  const device_mesh m{2, 2};
  const host_tensor g = labels({2, 12});
  for (int r = 0; r < 4; ++r) {
    const host_tensor s = shard_of(g.view(), m, make_spec(2, {Shard(1), Shard(1)}), r, split_rule::chunk, fused_dim{1, 3});
    REQUIRE(s.shape() == tensor_shape{2, 3});
    for (std::int64_t i = 0; i < 2; ++i)
      for (std::int64_t j = 0; j < 3; ++j) CHECK(s.as<std::int64_t>()[i * 3 + j] == i * 12 + j * 4 + r);
  }
  // Another dim cut too ([S(0),S(1)]): rank (a, b) holds rows [2a, 2a + 2) of columns
  // [2b, 2b + 2) of each part of 4.
  const host_tensor g2 = labels({4, 12});
  for (int r = 0; r < 4; ++r) {
    const host_tensor s = shard_of(g2.view(), m, make_spec(2, {Shard(0), Shard(1)}), r, split_rule::chunk, fused_dim{1, 3});
    REQUIRE(s.shape() == tensor_shape{2, 6});
    for (std::int64_t i = 0; i < 2; ++i)
      for (std::int64_t j = 0; j < 6; ++j)
        CHECK(s.as<std::int64_t>()[i * 6 + j] == (2 * (r / 2) + i) * 12 + (j / 2) * 4 + 2 * (r % 2) + j % 2);
  }
  // Parts that do not cut evenly are refused, naming the parts.
  CHECK(message_of([&] { (void)shard_of(labels({2, 6}).view(), m, make_spec(2, {Shard(1), Shard(1)}), 0, split_rule::chunk, fused_dim{1, 3}); })
            .find("3 fused parts") != std::string::npos);
}

TEST_CASE("column, row, bias and vocab rules in both layouts") {
  tp_policy p{"t", {}, {}};
  p.add("col.weight", column()).add("col.bias", column()).add("row.weight", row()).add("row.bias", row());
  p.add("tcol.weight", column(weight_layout::in_out)).add("trow.weight", row(weight_layout::in_out));
  p.add("emb.weight", vocab());
  SUBCASE("column [out,in]: rows r*2..r*2+1") {
    auto t = shards_of(p, "col.weight", {8, 6}, dtype::f32, 4);
    for (int r = 0; r < 4; ++r) expect_2d(t, r, 2, 6, [r](std::int64_t i) { return r * 2 + i; }, same);
    auto b = shards_of(p, "col.bias", {8}, dtype::f32, 4);
    CHECK(!b.add_after_allreduce);
    for (int r = 0; r < 4; ++r) expect_1d(b, r, 2, [r](std::int64_t j) { return r * 2 + j; });
  }
  SUBCASE("row [out,in]: input columns split, bias whole, added once after the all-reduce") {
    auto t = shards_of(p, "row.weight", {6, 8}, dtype::f32, 4);
    CHECK(to_string(t.spec) == "[S(1)]");
    for (int r = 0; r < 4; ++r) expect_2d(t, r, 6, 2, same, [r](std::int64_t j) { return r * 2 + j; });
    auto b = shards_of(p, "row.bias", {6}, dtype::f32, 4);
    CHECK(b.add_after_allreduce);
    CHECK(b.spec.is_replicated());
    for (int r = 0; r < 4; ++r) expect_1d(b, r, 6, same);
  }
  SUBCASE("transposed [in,out] (Conv1D): column splits dim 1, row splits dim 0") {
    auto c = shards_of(p, "tcol.weight", {6, 8}, dtype::f32, 4);
    for (int r = 0; r < 4; ++r) expect_2d(c, r, 6, 2, same, [r](std::int64_t j) { return r * 2 + j; });
    auto w = shards_of(p, "trow.weight", {8, 6}, dtype::f32, 4);
    for (int r = 0; r < 4; ++r) expect_2d(w, r, 2, 6, [r](std::int64_t i) { return r * 2 + i; }, same);
  }
  SUBCASE("vocab-parallel embedding: rows by the chunk rule, 10 over 4 -> 3,3,3,1") {
    auto e = shards_of(p, "emb.weight", {10, 4}, dtype::f32, 4);
    expect_2d(e, 0, 3, 4, same, same);
    expect_2d(e, 3, 1, 4, [](std::int64_t) { return 9; }, same);
  }
  SUBCASE("unmatched parameters are replicated") {
    auto n = shards_of(p, "ln.weight", {8}, dtype::f32, 4);
    CHECK(n.rule == "replicate");
    for (int r = 0; r < 4; ++r) expect_1d(n, r, 8, same);
  }
  SUBCASE("sizes that do not divide are shape_errors naming tensor, dim, size and tp") {
    auto msg = message_of([&] { (void)shards_of(p, "col.weight", {6, 4}, dtype::f32, 4); });
    CHECK(msg.find("'col.weight'") != std::string::npos);
    CHECK(msg.find("dim 0 of size 6") != std::string::npos);
    CHECK(msg.find("tensor-parallel size 4") != std::string::npos);
    CHECK_THROWS_AS((void)shards_of(p, "row.weight", {4, 6}, dtype::f32, 4), shape_error);
  }
}

TEST_CASE("fused layouts: equal parts, grouped-query heads, BLOOM per-head interleaving, gate/up") {
  SUBCASE("grouped-query q|k|v: 4 q heads, 2 kv heads, head_dim 3, over 2 ranks") {
    tp_policy p{"gqa", {}, {}};
    p.add("*.qkv_proj.weight", column().fused_heads({"num_attention_heads", "num_key_value_heads", "num_key_value_heads"}));
    const model_config cfg{{"num_attention_heads", 4}, {"num_key_value_heads", 2}};
    auto t = shards_of(p, "model.layers.0.self_attn.qkv_proj.weight", {24, 5}, dtype::bf16, 2, cfg);
    for (int r = 0; r < 2; ++r)
      expect_2d(t, r, 12, 5, [r](std::int64_t i) {
        if (i < 6) return r * 6 + i;                // q heads 2r, 2r+1
        if (i < 9) return 12 + r * 3 + (i - 6);     // k head r
        return 18 + r * 3 + (i - 9);                // v head r
      }, same);
    auto msg = message_of([&] { (void)shards_of(p, "m.qkv_proj.weight", {24, 5}, dtype::bf16, 4, cfg); });
    CHECK(msg.find("'num_key_value_heads' = 2 heads does not divide over tensor-parallel size 4") != std::string::npos);
    CHECK_THROWS_AS((void)shards_of(p, "m.qkv_proj.weight", {25, 5}, dtype::bf16, 2, cfg), shape_error);
    CHECK_THROWS_AS((void)shards_of(p, "m.qkv_proj.weight", {24, 5}, dtype::bf16, 2, {}), shape_error);
  }
  SUBCASE("BLOOM query_key_value [3*hidden, hidden] as [heads, 3, head_dim, hidden]: whole heads per rank") {
    const model_config cfg{{"n_head", 4}, {"hidden_size", 8}};
    auto t = shards_of(policies::bloom(), "transformer.h.0.self_attention.query_key_value.weight", {24, 8},
                         dtype::f16, 2, cfg);
    // Megatron/BLOOM: rank r owns heads 2r, 2r+1, each with its q, k, v rows (3 x head_dim 2).
    for (int r = 0; r < 2; ++r)
      expect_2d(t, r, 12, 8, [r](std::int64_t i) {
        const std::int64_t head = r * 2 + i / 6, within = i % 6;  // within = part * head_dim + d
        return head * 6 + within;
      }, same);
    auto b = shards_of(policies::bloom(), "transformer.h.0.self_attention.query_key_value.bias", {24}, dtype::f16, 2, cfg);
    expect_1d(b, 1, 12, [](std::int64_t j) { return 12 + j; });
    CHECK_THROWS_AS((void)shards_of(policies::bloom(), "transformer.h.0.self_attention.query_key_value.weight",
                                      {24, 8}, dtype::f16, 3, {{"n_head", 3}}),
                    shape_error);  // 24 rows are not whole heads of 3
  }
  SUBCASE("gate|up fused pair over 3 ranks") {
    tp_policy p{"phi", {}, {}};
    p.add("*.gate_up_proj.weight", column().fused(2));
    auto t = shards_of(p, "model.layers.0.mlp.gate_up_proj.weight", {12, 4}, dtype::f32, 3);
    for (int r = 0; r < 3; ++r)
      expect_2d(t, r, 4, 4, [r](std::int64_t i) { return i < 2 ? r * 2 + i : 6 + r * 2 + (i - 2); }, same);
    CHECK_THROWS_AS((void)shards_of(p, "x.gate_up_proj.weight", {8, 4}, dtype::f32, 3), shape_error);
  }
  SUBCASE("LLaMA k_proj: 2 kv heads of 4 rows on 4 ranks are replicated, each on 2 (never cut at half a head)") {
    const model_config cfg{{"num_attention_heads", 8}, {"num_key_value_heads", 2}};
    auto t = shards_of(policies::llama(), "model.layers.0.self_attn.k_proj.weight", {8, 16}, dtype::bf16, 4, cfg);
    for (int r = 0; r < 4; ++r)  // rank r: head r / 2, whole (vLLM's and transformers' unit_colwise layout)
      expect_2d(t, r, 4, 16, [r](std::int64_t i) { return (r / 2) * 4 + i; }, same);
    CHECK(t.fused.find("2 heads replicated over 4 ranks, each on 2") != std::string::npos);
    auto b = shards_of(policies::llama(), "model.layers.0.self_attn.v_proj.bias", {8}, dtype::bf16, 4, cfg);
    expect_1d(b, 3, 4, [](std::int64_t j) { return 4 + j; });
    CHECK(rescale_attributes(policies::llama(), cfg, 4).at("self_attn.num_key_value_heads") == 1);
    // 3 ranks neither split 2 heads nor replicate them evenly.
    auto msg = message_of([&] {
      (void)shards_of(policies::llama(), "model.layers.0.self_attn.k_proj.weight", {8, 16}, dtype::bf16, 3, cfg);
    });
    CHECK(msg.find("'num_key_value_heads' = 2") != std::string::npos);
    auto ok = shards_of(policies::llama(), "model.layers.0.self_attn.k_proj.weight", {8, 16}, dtype::bf16, 2, cfg);
    expect_2d(ok, 1, 4, 16, [](std::int64_t i) { return 4 + i; }, same);
  }
}

TEST_CASE("attributes are rescaled per rank, a remainder names the attribute, value and size") {
  const model_config cfg{{"n_head", 12}, {"n_embd", 768}};
  auto a = rescale_attributes(policies::gpt2(), cfg, 4);
  CHECK(a.at("attn.num_heads") == 3);
  CHECK(a.at("attn.embed_dim") == 192);
  CHECK(a.at("mlp.width") == 768);  // n_inner absent: 4 * n_embd / 4
  auto b = rescale_attributes(policies::gpt2(), {{"n_head", 12}, {"n_embd", 768}, {"n_inner", 1024}}, 4);
  CHECK(b.at("mlp.width") == 256);
  auto msg = message_of([&] { (void)rescale_attributes(policies::gpt2(), cfg, 5); });
  CHECK(msg.find("shape error") != std::string::npos);
  CHECK(msg.find("'n_head' = 12") != std::string::npos);
  CHECK(msg.find("tensor-parallel size 5") != std::string::npos);
  auto l = rescale_attributes(policies::llama(),
                              {{"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"hidden_size", 4096},
                               {"intermediate_size", 11008}},
                              8);
  CHECK(l.at("self_attn.num_key_value_heads") == 1);
  CHECK(l.at("mlp.intermediate_size") == 1376);
  CHECK_THROWS_AS(policies::by_model_type("t5"), spec_error);
  CHECK(policies::by_model_type("gpt_neox").name == "gpt_neox");
}

TEST_CASE("built-in policies pick the Megatron rule for real Hugging Face names") {
  struct row_t {
    tp_policy policy;
    const char* name;
    tensor_shape shape;
    const char* rule;
    const char* spec;
  };
  const row_t table[] = {
      {policies::gpt2(), "transformer.h.3.mlp.c_fc.weight", {8, 32}, "column", "[S(1)]"},
      {policies::gpt2(), "transformer.h.3.mlp.c_proj.weight", {32, 8}, "row", "[S(0)]"},
      {policies::gpt2(), "transformer.wte.weight", {50, 8}, "replicate", "[R]"},
      {policies::bert(), "bert.encoder.layer.0.attention.self.key.weight", {8, 8}, "column", "[S(0)]"},
      {policies::bert(), "bert.encoder.layer.0.attention.output.dense.weight", {8, 8}, "row", "[S(1)]"},
      {policies::bert(), "bert.encoder.layer.0.intermediate.dense.weight", {32, 8}, "column", "[S(0)]"},
      {policies::bert(), "bert.encoder.layer.0.output.dense.weight", {8, 32}, "row", "[S(1)]"},
      {policies::bert(), "bert.encoder.layer.0.output.LayerNorm.weight", {8}, "replicate", "[R]"},
      {policies::opt(), "model.decoder.layers.1.self_attn.out_proj.weight", {8, 8}, "row", "[S(1)]"},
      {policies::opt(), "model.decoder.layers.1.fc1.weight", {32, 8}, "column", "[S(0)]"},
      {policies::gpt_neox(), "gpt_neox.layers.0.mlp.dense_4h_to_h.weight", {8, 32}, "row", "[S(1)]"},
      {policies::gpt_neox(), "gpt_neox.layers.0.attention.query_key_value.weight", {24, 8}, "column", "[S(0)]"},
      {policies::bloom(), "transformer.h.0.mlp.dense_h_to_4h.weight", {32, 8}, "column", "[S(0)]"},
      {policies::llama(), "model.layers.0.mlp.down_proj.weight", {8, 32}, "row", "[S(1)]"},
      {policies::llama(), "model.layers.0.self_attn.q_proj.weight", {8, 8}, "column", "[S(0)]"},
      {policies::llama(), "model.embed_tokens.weight", {50, 8}, "replicate", "[R]"},
  };
  const model_config cfg{{"n_head", 4}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}};
  for (const auto& t : table) {
    CAPTURE(t.name);
    auto p = shards_of(t.policy, t.name, t.shape, dtype::f32, 2, cfg);
    CHECK(p.rule == t.rule);
    CHECK(to_string(p.spec) == t.spec);
  }
}

TEST_CASE("plan_policy: the ILP's name -> spec map on a 2-D mesh, uneven nested splits") {
  plan_policy plan{device_mesh{2, 2}, {{"w", parse_spec("S01R", 2, 2)}, {"v", parse_spec("RS0", 2, 2)}}, split_rule::chunk};
  auto w = shards_of(plan, "w", {7, 3}, dtype::f32);
  for (int r = 0; r < 4; ++r) {
    const auto box = local_box(plan.mesh, plan.specs.at("w"), {7, 3}, r);
    REQUIRE(w.ranks[static_cast<std::size_t>(r)].pieces.size() == 1);
    CHECK(w.ranks[static_cast<std::size_t>(r)].pieces[0] == shard_piece{box.offset, box.shape});
  }
  expect_2d(w, 3, 1, 3, [](std::int64_t) { return 6; }, same);  // 7 -> 4|3 -> 2,2|2,1
  auto v = shards_of(plan, "v", {4, 6}, dtype::f32);
  expect_2d(v, 1, 4, 3, same, same);                                   // RS0: mesh axis 0 splits dim 1
  expect_2d(v, 2, 4, 3, same, [](std::int64_t j) { return 3 + j; });
  auto u = shards_of(plan, "unlisted", {4, 6}, dtype::f32);
  CHECK(u.spec.is_replicated());
  plan.specs["p"] = parse_spec("[P,R]", 2, 2);
  CHECK_THROWS_AS((void)shards_of(plan, "p", {4, 6}, dtype::f32), spec_error);
  // A plan file's tensor name reaches the message escaped (no ESC or newline of the file's).
  const std::string hostile = "a\x1B[31mb\nc";
  plan.specs[hostile] = parse_spec("[P,R]", 2, 2);
  const std::string msg = message_of([&] { (void)shards_of(plan, hostile, {4, 6}, dtype::f32); });
  CHECK(msg.find("tensor 'a\\x1B[31mb\\x0Ac' [4,6] with spec ") != std::string::npos);
  CHECK(msg.find_first_of("\x1B\n") == std::string::npos);
}

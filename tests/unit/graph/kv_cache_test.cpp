// A decode step after a key/value cache: the builders' cache inputs and rotary offsets, the
// attention's cache operands checked, the graph file, re-sizing, and the pairs a causal core
// after a cache weighs.
#include <doctest/doctest.h>

#include <autoshard/graph/graph.hpp>

#include <string>
#include <vector>

namespace kv_cache_test {
using namespace autoshard;

transformer_config small_llama(std::int64_t past, int seq) {
  transformer_config c = transformer_config::llama(2, 64, 8, 4, 96);
  c.vocab = 128;
  c.batch = 2;
  c.seq = seq;
  c.past = past;
  c.mode = run_mode::inference;
  return c;
}

bool throws_with(const auto& f, const std::string& text) {
  try {
    f();
  } catch (const error& e) {
    if (std::string(e.what()).find(text) != std::string::npos) return true;
    MESSAGE("the error was: " << e.what());
    return false;
  }
  return false;
}
}  // namespace kv_cache_test

TEST_CASE("a decode step: the cache as each attention's operands 3 and 4, the rotaries turning from the past") {
  using namespace kv_cache_test;
  const model_graph g = build_llama(small_llama(5, 1));
  validate(g);
  const auto key = find_vertex(g, "past_key_values.1.key"), value = find_vertex(g, "past_key_values.1.value");
  REQUIRE(key);
  REQUIRE(value);
  CHECK(g[*key].attrs.kv_cache);
  CHECK(g[*key].shape == tensor_shape{2, 5, 32});  // [batch, past, 4 kv heads x 8]
  const auto att = find_vertex(g, "model.layers.1.self_attn.attention");
  REQUIRE(att);
  const std::vector<vertex_t> ops = operands(g, *att);
  REQUIRE(ops.size() == 5);
  CHECK(ops[3] == *key);
  CHECK(ops[4] == *value);
  CHECK(g[*find_vertex(g, "model.layers.0.self_attn.rotary_k")].attrs.rotary_offset == 5);
  // The sequence is the step's tokens, not the cache's past; re-sizing keeps the past.
  CHECK(graph_sequence(g) == 1);
  const model_graph h = with_batch_seq(g, 4, 3);
  CHECK(h[*key].shape == tensor_shape{4, 5, 32});
  CHECK(h[*att].shape == tensor_shape{4, 3, 64});
  // A graph without a past has none of it.
  const model_graph plain = build_llama(small_llama(0, 1));
  CHECK_FALSE(find_vertex(plain, "past_key_values.0.key"));
  CHECK(operands(plain, *find_vertex(plain, "model.layers.0.self_attn.attention")).size() == 3);
}

TEST_CASE("a decode step's graph file keeps its cache inputs and rotary offsets") {
  using namespace kv_cache_test;
  const model_graph g = build_llama(small_llama(7, 2));
  const model_graph back = from_json(to_json(g));
  CHECK(to_json(back) == to_json(g));
  const vertex_t k = *find_vertex(back, "past_key_values.0.key");
  CHECK(back[k].attrs.kv_cache);
  CHECK(back[*find_vertex(back, "model.layers.1.self_attn.rotary_q")].attrs.rotary_offset == 7);
  CHECK(back[*find_vertex(back, "model.layers.1.self_attn.rotary_q")].attrs == g[*find_vertex(g, "model.layers.1.self_attn.rotary_q")].attrs);
}

TEST_CASE("a dynamic rope after a cache turns by the rule at past + the step's tokens, as transformers' max(position_ids) + 1") {
  using namespace kv_cache_test;
  transformer_config c = small_llama(0, 12);
  c.rope_scaling.type = "dynamic";
  c.rope_scaling.factor = 2.0;
  c.rope_scaling.original_max_positions = 8;
  const auto freqs = [](const model_graph& g) { return g[*find_vertex(g, "model.layers.0.self_attn.rotary_q")].attrs.rotary_frequencies; };
  const model_graph whole = build_llama(c);  // 12 tokens at once: past max_position_embeddings
  c.past = 11;
  c.seq = 1;
  const model_graph step = build_llama(c);  // the 12th after 11 cached
  CHECK(freqs(step) == freqs(whole));
  c.past = 0;
  CHECK(freqs(build_llama(c)) != freqs(whole));  // 1 token alone: within it, the default base
  // Re-sizing the step to 2 tokens turns at 13.
  c.past = 11;
  c.seq = 2;
  CHECK(freqs(with_batch_seq(step, 0, 2)) == freqs(build_llama(c)));
}

TEST_CASE("a causal core after P cached keys weighs query i against the P + i + 1 keys up to it, or its window's") {
  // attention_pairs against the pairs counted one by one.
  for (std::int64_t S = 1; S <= 6; ++S)
    for (std::int64_t P = 0; P <= 6; ++P)
      for (std::int64_t W : {0, 1, 2, 3, 5, 7, 20}) {
        autoshard::op_attrs a;
        a.causal = true;
        a.window = W;
        double pairs = 0;
        for (std::int64_t i = 0; i < S; ++i)
          for (std::int64_t j = 0; j < P + S; ++j) pairs += j <= P + i && (W == 0 || j > P + i - W) ? 1 : 0;
        CHECK_MESSAGE(autoshard::detail::attention_pairs(a, S, P) == pairs, "S " << S << " P " << P << " W " << W);
      }
}

TEST_CASE("a key/value cache is refused where it would mean something else, naming what is wrong") {
  using namespace kv_cache_test;
  using namespace autoshard;
  transformer_config train = small_llama(4, 1);
  train.mode = run_mode::training;
  CHECK(throws_with([&] { build_llama(train); }, "a key/value cache of 4 tokens makes a decode step, which is inference"));
  transformer_config bert = transformer_config::bert(1, 32, 4);
  bert.past = 3;
  bert.mode = run_mode::inference;
  CHECK(throws_with([&] { build_bert(bert); }, "bert config: a key/value cache (past 3) is for a decoder's step after cached tokens, "
                                               "but bert is an encoder"));

  model_graph g;
  const vertex_t q = add_input(g, "q", {2, 3, 8}, dtype::f32), k = add_input(g, "k", {2, 3, 4}, dtype::f32),
                 v = add_input(g, "v", {2, 3, 4}, dtype::f32);
  const vertex_t ck = add_kv_cache(g, "ck", {2, 5, 4}, dtype::f32), cv = add_kv_cache(g, "cv", {2, 5, 4}, dtype::f32);
  op_attrs a;
  a.heads = 4;
  a.kv_heads = 2;
  a.causal = true;
  CHECK(throws_with([&] { add_op(g, op_kind::attention, "four", {q, k, v, ck}, a); }, "3 or 5 operands, got 4"));
  const vertex_t wide = add_kv_cache(g, "wide", {2, 5, 8}, dtype::f32);
  CHECK(throws_with([&] { add_op(g, op_kind::attention, "wide_cache", {q, k, v, wide, wide}, a); },
                    "the key/value cache must be two [2, past, 4] (k and v's batch and width), got [2,5,8], [2,5,8]"));
  op_attrs short_q = a;
  const vertex_t q1 = add_input(g, "q1", {2, 1, 8}, dtype::f32);
  CHECK(throws_with([&] { add_op(g, op_kind::attention, "short", {q1, k, v, ck, cv}, short_q); }, "causal attention needs equal q and k lengths"));

  // Wiring: a cache read by something else, and an attention's operand 3 that is no cache.
  model_graph ok = g;
  add_op(ok, op_kind::attention, "att", {q, k, v, ck, cv}, a);
  CHECK_NOTHROW(validate(ok));
  model_graph misread = ok;
  add_op(misread, op_kind::add, "sum", {ck, cv});
  CHECK(throws_with([&] { validate(misread); }, "a key/value cache is read as an attention's operand 3 or 4, not as operand 0 of 'sum' (add)"));
  model_graph fed = g;
  const vertex_t plain = add_input(fed, "plain", {2, 5, 4}, dtype::f32);
  add_op(fed, op_kind::attention, "att", {q, k, v, plain, cv}, a);
  CHECK(throws_with([&] { validate(fed); }, "operand 3 'plain' is not a key/value cache (an input with kv_cache)"));
  model_graph param = g;
  const vertex_t pk = add_parameter(param, "pk", {2, 5, 4}, dtype::f32);
  param[pk].attrs.kv_cache = true;
  add_op(param, op_kind::attention, "att", {q, k, v, pk, cv}, a);
  CHECK(throws_with([&] { validate(param); }, "kv_cache marks a fed input [batch, past, kv_heads*D] of a floating type, not a parameter"));
  op_attrs r;
  r.heads = 2;
  r.rotary_offset = -1;
  CHECK(throws_with([&] { add_op(g, op_kind::rotary, "rot", {k}, r); }, "rotary_offset -1 is not a position in 0.."));
}

TEST_CASE("GPT-2 and OPT after a cache: each attention takes its layer's cache, the position table read from row past (+ offset) on") {
  using namespace kv_cache_test;
  for (const bool opt : {false, true}) {
    CAPTURE(opt);
    transformer_config c = transformer_config::gpt2(2, 32, 4);
    c.vocab = 64;
    c.max_positions = opt ? 20 + 2 : 20;
    c.position_offset = opt ? 2 : 0;
    c.batch = 2;
    c.seq = 3;
    c.past = 5;
    c.mode = run_mode::inference;
    const model_graph g = opt ? build_opt(c) : build_gpt2(c);
    validate(g);
    const std::string att = opt ? "model.decoder.layers.1.self_attn.attention" : "transformer.h.1.attn.attention";
    const std::vector<vertex_t> ops = operands(g, *find_vertex(g, att));
    REQUIRE(ops.size() == 5);
    CHECK(ops[3] == *find_vertex(g, "past_key_values.1.key"));
    CHECK(ops[4] == *find_vertex(g, "past_key_values.1.value"));
    CHECK(g[ops[3]].shape == tensor_shape{2, 5, 32});  // [batch, past, heads x D]
    // position_ids 0..2 look up rows offset + 5.. of the table: a slice of its rows from there on
    const std::string table = opt ? "model.decoder.embed_positions" : "transformer.wpe";
    const auto rows = find_vertex(g, table + ".past_offset");
    REQUIRE(rows);
    CHECK(g[*rows].attrs.axis == 0);
    CHECK(g[*rows].attrs.start == c.position_offset + 5);
    CHECK(g[*rows].shape == tensor_shape{20 - 5, 32});
    CHECK(operands(g, *find_vertex(g, table))[1] == *rows);
    CHECK(g[*find_vertex(g, "position_ids")].shape == tensor_shape{1, 3});
    // the table holds past + seq (+ offset) rows at most: 5 + 15 fit, 5 + 16 do not
    c.seq = 15;
    CHECK_NOTHROW(opt ? build_opt(c) : build_gpt2(c));
    c.seq = 16;
    const std::string want = opt ? "opt config: past 5 + seq 16 + position offset 2 = 23 exceeds max_positions 22, the rows of the "
                                   "learned position table (the step's last token is at position 20)"
                                 : "gpt2 config: past 5 + seq 16 = 21 exceeds max_positions 20, the rows of the learned position table "
                                   "(the step's last token is at position 20)";
    CHECK(throws_with([&] { opt ? build_opt(c) : build_gpt2(c); }, want));
    // without a past, GPT-2 reads its table whole (no slice), OPT past its offset only
    c.past = 0;
    c.seq = 3;
    const model_graph prefill = opt ? build_opt(c) : build_gpt2(c);
    CHECK_FALSE(find_vertex(prefill, "past_key_values.0.key"));
    CHECK(bool(find_vertex(prefill, table + ".past_offset")) == opt);
  }
}

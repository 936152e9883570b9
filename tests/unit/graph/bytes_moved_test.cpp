// The bytes an operator moves as its kernel moves them (compute.hpp bytes_moved,
// backward_seconds): an embedding gathers the rows its ids select, not its table; a split of a
// position table's leading rows is a view (PyTorch's narrow); an embedding's backward writes a
// gradient of its whole table. Expected figures are worked by hand from an H100's data sheet
// (3.35 TB/s of HBM3, priced at the peak: achievable = false).
#include <doctest/doctest.h>

#include <autoshard/graph/graph.hpp>

#include <string>
#include <vector>

namespace {
using namespace autoshard;

constexpr double h100_hbm = 3.35e12;  // bytes/s, H100 SXM5 data sheet

strategy_options h100(run_mode mode) {
  strategy_options o;
  o.pricing.device = find_device_preset("h100-80g")->device;
  o.pricing.mode = mode;
  o.pricing.achievable = false;
  return o;
}

// An embedding of `batch` x `seq` ids into a [vocab, hidden] f16 table, its strategies on `m`.
std::vector<strategy> embedding_strategies(std::int64_t vocab, std::int64_t batch, std::int64_t seq, std::int64_t hidden,
                                           const device_mesh& m, run_mode mode) {
  model_graph g;
  const vertex_t ids = add_input(g, "input_ids", {batch, seq}, dtype::i64);
  const vertex_t table = add_parameter(g, "wte.weight", {vocab, hidden}, dtype::f16);
  return enumerate_strategies(g, add_op(g, op_kind::embedding, "wte", {ids, table}), m, h100(mode));
}

const strategy& named(const std::vector<strategy>& ss, const std::string& name) {
  std::string names;
  for (const strategy& s : ss) {
    if (s.name == name) return s;
    names += " " + s.name;
  }
  FAIL("no strategy " << name << " among" << names);
  return ss.front();
}
}  // namespace

TEST_CASE("an embedding's forward reads the rows its ids select: its time follows batch x seq, not the vocabulary") {
  // A decode step of GPT-2 (hidden 768) for 4 sequences: 4 ids of 8 bytes, 4 rows of 768 f16
  // read from the table and written out. GPT-2's 50257-row table and LLaMA-3's 128256 rows
  // (as wide here) cost the same; reading the table, 50257 x 768 x 2 = 77.2 MB, would be 23 us.
  const double bytes = 4.0 * 8 + 2.0 * (4 * 768 * 2);
  const device_mesh one{1};
  for (const std::int64_t vocab : {50257, 128256}) {
    CAPTURE(vocab);
    const std::vector<strategy> s = embedding_strategies(vocab, 4, 1, 768, one, run_mode::inference);
    REQUIRE(s.size() == 1);
    CHECK(s.front().compute_seconds == doctest::Approx(bytes / h100_hbm).scale(1e-15));
    CHECK(s.front().memory_bytes == 4 * 768 * 2);  // its output
  }
  // A prefill of 8 x 512 tokens: 4096 rows, whatever the vocabulary.
  const double prefill = 8.0 * 512 * 8 + 2.0 * (8 * 512 * 768 * 2);
  for (const std::int64_t vocab : {50257, 128256})
    CHECK(embedding_strategies(vocab, 8, 512, 768, one, run_mode::inference).front().compute_seconds ==
          doctest::Approx(prefill / h100_hbm).scale(1e-15));
  // Vocab-parallel on 4 ranks (Megatron-LM's VocabParallelEmbedding: mask the ids outside the
  // shard, gather, zero those rows): each rank still reads and writes the 4 rows, its output
  // a partial sum. A quarter of the table is no cheaper than the whole one.
  const device_mesh four{4};
  for (const std::int64_t vocab : {50257, 128256}) {
    const strategy vp = named(embedding_strategies(vocab, 4, 1, 768, four, run_mode::inference), "RR,S0R->RRRP0");
    CHECK(vp.compute_seconds == doctest::Approx(bytes / h100_hbm).scale(1e-15));
  }
  // Column-parallel (the table split on the hidden dim): a quarter of each row.
  const strategy col = named(embedding_strategies(50257, 4, 1, 768, four, run_mode::inference), "RR,RS0->RRS0");
  CHECK(col.compute_seconds == doctest::Approx((4.0 * 8 + 2.0 * (4 * 192 * 2)) / h100_hbm).scale(1e-15));
}

TEST_CASE("an embedding's training backward writes its whole local table's gradient once") {
  // embedding_dense_backward: zero-fill a [vocab, hidden] gradient, read the output's gradient
  // and add its rows in; the ids have no gradient. GPT-2's table at 8 x 512 tokens:
  // 77.2 MB written, 6.3 MB of output gradient read and 6.3 MB of rows written.
  const double ids = 8.0 * 512 * 8, rows = 8.0 * 512 * 768 * 2;
  const device_mesh one{1};
  for (const std::int64_t vocab : {50257, 128256}) {
    CAPTURE(vocab);
    const strategy s = embedding_strategies(vocab, 8, 512, 768, one, run_mode::training).front();
    const double table = static_cast<double>(vocab) * 768 * 2;
    CHECK(s.forward_compute_seconds == doctest::Approx((ids + 2 * rows) / h100_hbm).scale(1e-15));
    CHECK(s.backward_compute_seconds == doctest::Approx((ids + table + 2 * rows) / h100_hbm).scale(1e-15));
    CHECK(s.compute_seconds == doctest::Approx(s.forward_compute_seconds + s.backward_compute_seconds).scale(1e-15));
  }
  // Vocab-parallel on 4 ranks: each zero-fills its quarter (12565 rows of 50257) and adds the
  // rows its ids select (all 4096 of them, the masked ones as zeros).
  const strategy vp = named(embedding_strategies(50257, 8, 512, 768, device_mesh{4}, run_mode::training), "RR,S0R->RRRP0");
  CHECK(vp.backward_compute_seconds == doctest::Approx((ids + 12565.0 * 768 * 2 + 2 * rows) / h100_hbm).scale(1e-15));
}

TEST_CASE("a position table's leading rows (past_offset) are a view: no bytes moved, no memory held") {
  // GPT-2 after a key/value cache of 5 tokens reads its position table from row 5 on, OPT from
  // row 2 (its offset) on in training: `table[first:]`, a view, in PyTorch narrow.
  for (const bool opt : {false, true}) {
    CAPTURE(opt);
    transformer_config c = transformer_config::gpt2(2, 32, 4);
    c.vocab = 64;
    c.max_positions = 20 + (opt ? 2 : 0);
    c.position_offset = opt ? 2 : 0;
    c.batch = 2;
    c.seq = 3;
    c.past = opt ? 0 : 5;
    c.mode = opt ? run_mode::training : run_mode::inference;
    const model_graph g = opt ? build_opt(c) : build_gpt2(c);
    const std::string table = opt ? "model.decoder.embed_positions" : "transformer.wpe";
    const auto rows = find_vertex(g, table + ".past_offset");
    REQUIRE(rows);
    const std::vector<strategy> ss = enumerate_strategies(g, *rows, make_mesh_2d(2, 2, 25e9, 300e9), h100(c.mode));
    REQUIRE(!ss.empty());
    for (const strategy& s : ss) {
      CAPTURE(s.name);
      CHECK(s.compute_seconds == 0.0);
      CHECK(s.memory_bytes == 0);
    }
  }
  // A split of a [2, 3, 96] activation on its last axis (a fused QKV's) is a strided view its
  // consumers copy: priced as a copy, read 2 x 3 x 96 and write 2 x 3 x 32 f32.
  model_graph g;
  const vertex_t qkv = add_input(g, "qkv", {2, 3, 96}, dtype::f32);
  op_attrs a;
  a.axis = 2;
  a.start = 32;
  a.length = 32;
  const vertex_t k = add_op(g, op_kind::split, "k", {qkv}, a);
  const strategy copy = enumerate_strategies(g, k, device_mesh{1}, h100(run_mode::inference)).front();
  CHECK(copy.compute_seconds == doctest::Approx((2.0 * 3 * 96 + 2.0 * 3 * 32) * 4 / h100_hbm).scale(1e-15));
  CHECK(copy.memory_bytes == 2 * 3 * 32 * 4);
  // One sequence's single token ([1, 1, 96]): every dim before the axis is 1, a contiguous
  // range; it moves nothing, and its bytes stay counted (it keeps the activation alive).
  model_graph one;
  const vertex_t t = add_input(one, "qkv", {1, 1, 96}, dtype::f32);
  const strategy view = enumerate_strategies(one, add_op(one, op_kind::split, "k", {t}, a), device_mesh{1}, h100(run_mode::inference)).front();
  CHECK(view.compute_seconds == 0.0);
  CHECK(view.memory_bytes == 32 * 4);
}

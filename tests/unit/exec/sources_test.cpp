// verify with the caller's values (a checkpoint's weights, given token ids) instead of the
// seed, the values it keeps for a client to compare (the inputs, the unsharded and the
// sharded outputs), what they add to the memory check, and the learned position tables
// read past their offset as transformers reads them (OPT, RoBERTa).
#include <doctest/doctest.h>

#include <autoshard/exec/exec.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "unit/exec/tiny_models.hpp"

using namespace autoshard;
using autoshard_test::tiny;

namespace {

struct small_plan {
  model_graph g;
  device_mesh mesh{2, 2};
  std::vector<strategy> plan;
};

/// A tiny GPT-2 in inference, solved on 2x2.
small_plan gpt2_on_2x2() {
  transformer_config c = tiny(transformer_config::gpt2_124m());
  c.mode = run_mode::inference;
  c.batch = 2;
  small_plan p{build_gpt2(c), device_mesh{2, 2}, {}};
  autosharding_options o;
  o.mesh = make_cluster_mesh({2, 2});
  o.pricing.mode = run_mode::inference;
  o.compare_baselines = false;
  p.plan = autosharding_analysis_pass(p.g, o).strategies;
  return p;
}

double max_abs_diff(const host_tensor& a, const host_tensor& b) {
  REQUIRE(a.shape() == b.shape());
  double d = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i) d = std::max(d, std::abs(a.as<double>()[i] - b.as<double>()[i]));
  return d;
}

}  // namespace

TEST_CASE("verify runs the caller's source values, seeds the rest, and keeps the inputs and both runs' outputs") {
  const small_plan p = gpt2_on_2x2();
  const model_graph& g = p.g;
  // The caller's: every parameter twice its seeded value (another model), input_ids its own.
  std::vector<host_tensor> mine = make_source_values<double>(g, 1);
  const vertex_t ids = *find_vertex(g, "input_ids");
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].is_parameter())
      for (std::int64_t i = 0; i < mine[v].numel(); ++i) mine[v].as<double>()[i] *= 2.0;
  for (std::int64_t i = 0; i < mine[ids].numel(); ++i) mine[ids].as<std::int64_t>()[i] = (7 * i) % 96;
  int calls = 0;
  verify_options o;
  o.keep_outputs = true;
  o.source_values = [&](const model_graph& run, dtype compute) {
    ++calls;
    CHECK(compute == dtype::f64);
    CHECK(boost::num_vertices(run) == boost::num_vertices(g));
    std::vector<host_tensor> out(boost::num_vertices(run));
    for (vertex_t v = 0; v < out.size(); ++v)
      if (g[v].is_parameter() || v == ids) out[v] = host_tensor::copy_of(mine[v].view());
    return out;  // position_ids left empty: seeded
  };
  const verify_report r = verify_plan(g, p.mesh, p.plan, o);
  CHECK(calls == 1);
  CHECK(r.passed());
  // The inputs it ran: the ids given, the positions seeded (0..S-1).
  REQUIRE(r.inputs.size() == 2);
  CHECK(r.inputs[0].name == "input_ids");
  CHECK(bitwise_equal(r.inputs[0].value.view(), mine[ids].view()));
  CHECK(r.inputs[1].name == "position_ids");
  CHECK(bitwise_equal(r.inputs[1].value.view(), make_source_value<double>(g, *find_vertex(g, "position_ids")).view()));
  // The output (the logits): the unsharded run of the caller's values, bit for bit, and the
  // sharded run gathered whole within the tolerance.
  mine[*find_vertex(g, "position_ids")] = make_source_value<double>(g, *find_vertex(g, "position_ids"));
  const std::vector<host_tensor> want = run_unsharded<double>(g, mine);
  REQUIRE(r.unsharded_outputs.size() == 1);
  REQUIRE(r.sharded_outputs.size() == 1);
  CHECK(r.unsharded_outputs[0].name == "lm_head");
  CHECK(r.sharded_outputs[0].name == "lm_head");
  const host_tensor& logits = want[*find_vertex(g, "lm_head")];
  CHECK(bitwise_equal(r.unsharded_outputs[0].value.view(), logits.view()));
  CHECK(max_abs_diff(r.sharded_outputs[0].value, logits) <= 1e-9 * 10);
  // Not the seeded model's logits: the values given are the ones run.
  const std::vector<host_tensor> seeded = run_unsharded<double>(g, make_source_values<double>(g, 1));
  CHECK(max_abs_diff(r.unsharded_outputs[0].value, seeded[*find_vertex(g, "lm_head")]) > 1e-3);
  // The sharded output is the ranks' own, gathered: a plan that forgets a reduction (a
  // row-parallel projection's partial sums claimed replicated) gives other logits there.
  std::vector<strategy> wrong = p.plan;
  const vertex_t proj = *find_vertex(g, "transformer.h.0.mlp.c_proj");
  bool found = false;
  for (const strategy& s : enumerate_strategies(g, proj, p.mesh))
    if (!found && s.output[1].is_partial() && s.output[0].is_replicate()) {
      wrong[proj] = s;
      wrong[proj].output[1] = Replicate();
      found = true;
    }
  REQUIRE(found);
  const verify_report w = verify_plan(g, p.mesh, wrong, o);
  CHECK_FALSE(w.passed());
  REQUIRE(w.sharded_outputs.size() == 1);
  CHECK(bitwise_equal(w.unsharded_outputs[0].value.view(), logits.view()));
  CHECK(max_abs_diff(w.sharded_outputs[0].value, logits) > 1e-6);
  // Without keep_outputs nothing is kept.
  verify_options plain;
  const verify_report q = verify_plan(g, p.mesh, p.plan, plain);
  CHECK(q.inputs.empty());
  CHECK(q.unsharded_outputs.empty());
  CHECK(q.sharded_outputs.empty());
}

TEST_CASE("the caller's source values are checked before a rank starts: count, shape, dtype, ids inside their table") {
  const small_plan p = gpt2_on_2x2();
  const model_graph& g = p.g;
  const vertex_t ids = *find_vertex(g, "input_ids");
  const vertex_t wte = *find_vertex(g, "transformer.wte.weight");
  auto with = [&](auto change) {
    verify_options o;
    o.source_values = [change, &g](const model_graph&, dtype) {
      std::vector<host_tensor> s = make_source_values<double>(g, 1);
      change(s);
      return s;
    };
    return o;
  };
  CHECK_THROWS_WITH_AS(verify_plan(g, p.mesh, p.plan, with([](std::vector<host_tensor>& s) { s.pop_back(); })),
                       doctest::Contains("source values are"), exec_error);
  CHECK_THROWS_WITH_AS(verify_plan(g, p.mesh, p.plan, with([&](std::vector<host_tensor>& s) { s[wte] = host_tensor(dtype::f64, {3, 4}); })),
                       doctest::Contains("source 'transformer.wte.weight' is [96,32] f64 in the graph but its value is [3,4] f64"),
                       exec_error);
  CHECK_THROWS_WITH_AS(verify_plan(g, p.mesh, p.plan, with([&](std::vector<host_tensor>& s) { s[wte] = convert(s[wte].view(), dtype::f32); })),
                       doctest::Contains("but its value is [96,32] f32"), exec_error);
  // An id past the vocabulary: named with its place and the table, not a rank's failure.
  CHECK_THROWS_WITH_AS(verify_plan(g, p.mesh, p.plan, with([&](std::vector<host_tensor>& s) { s[ids].as<std::int64_t>()[9] = 96; })),
                       doctest::Contains("source 'input_ids' holds 96 at [1,1], outside 0 to 95: 'transformer.wte' (embedding) looks it "
                                         "up in a table of 96 rows"),
                       exec_error);
  CHECK_THROWS_WITH_AS(verify_plan(g, p.mesh, p.plan, with([&](std::vector<host_tensor>& s) { s[ids].as<std::int64_t>()[0] = -1; })),
                       doctest::Contains("holds -1 at [0,0]"), exec_error);
  CHECK_NOTHROW(check_source_values(g, make_source_values<double>(g, 3), dtype::f64));
}

TEST_CASE("what the caller's values and the kept outputs hold is in the memory check") {
  const small_plan p = gpt2_on_2x2();
  verify_options o;
  const std::uint64_t base = verify_plan(p.g, p.mesh, p.plan, o).estimate.total();
  o.keep_outputs = true;
  o.source_overhead = 1 << 20;
  const verify_report r = verify_plan(p.g, p.mesh, p.plan, o);
  // the inputs once, the logits [2, 8, 96] f64 unsharded, sharded and gathered on each of the 4 ranks
  const std::uint64_t kept = (2 * 8 + 8) * 8 + 2 * 8 * 96 * 8 * (2 + 4);
  CHECK(r.estimate.held == (1u << 20) + kept);
  CHECK(r.estimate.total() == base + (1u << 20) + kept);
  o.max_memory = r.estimate.total() - 1;
  CHECK_THROWS_WITH_AS(verify_plan(p.g, p.mesh, p.plan, o), doctest::Contains("the outputs kept and the sources' making 1.07 MiB"), exec_error);
}

namespace {
/// The row of position table `table` (embedding `table`, weight `table`.weight, rows of
/// `hidden`) that each position of g's one sequence reads, run unsharded with row r holding r.
std::vector<double> rows_looked_up(const model_graph& g, const std::string& table, std::int64_t hidden) {
  std::vector<host_tensor> s = make_source_values<double>(g, 1);
  host_tensor& rows = s[*find_vertex(g, table + ".weight")];
  for (std::int64_t i = 0; i < rows.numel(); ++i) rows.as<double>()[i] = static_cast<double>(i / hidden);  // row r holds r
  const std::vector<host_tensor> val = run_unsharded<double>(g, s);
  const host_tensor& looked_up = val[*find_vertex(g, table)];
  REQUIRE(looked_up.shape().rank == 3);
  REQUIRE(looked_up.shape()[0] == 1);
  REQUIRE(looked_up.shape()[2] == hidden);
  std::vector<double> out;
  for (std::int64_t q = 0; q < looked_up.shape()[1]; ++q) out.push_back(looked_up.as<double>()[q * hidden]);
  return out;
}
}  // namespace

TEST_CASE("OPT's and RoBERTa's position tables are read past their offset, as transformers reads them") {
  // position p reads row p + offset of the table (OPT: 2; RoBERTa: pad_token_id + 1)
  for (const char* family : {"opt", "roberta"}) {
    CAPTURE(family);
    const bool opt = std::string(family) == "opt";
    transformer_config c = tiny(opt ? transformer_config::gpt2_124m() : transformer_config::bert_base());
    c.mode = run_mode::inference;
    c.position_offset = 2;
    c.max_positions = 16 + 2;
    c.batch = 1;
    if (!opt) c.prefix = "roberta";
    const model_graph g = opt ? build_opt(c) : build_bert(c);
    const std::string table = opt ? "model.decoder.embed_positions" : "roberta.embeddings.position_embeddings";
    CHECK(rows_looked_up(g, table, c.hidden) == std::vector<double>{2, 3, 4, 5, 6, 7, 8, 9});
    // the graph's positions run to the table's last row, not past it
    CHECK_THROWS_WITH_AS(check_position_tables(with_batch_seq(g, 0, 17)), doctest::Contains("a table of 16 rows"), exec_error);
  }
}

TEST_CASE("GPT-2's and OPT's position tables after a cache of P are read from row P (+ offset) on, as transformers reads them") {
  // a step of 3 tokens after 5 cached: position_ids 0..2 read rows offset + 5 + q (GPT2Model's
  // cache_position, OPT's mask cumsum cut at the past, + 2)
  for (const bool opt : {false, true}) {
    CAPTURE(opt);
    transformer_config c = tiny(transformer_config::gpt2_124m());
    c.mode = run_mode::inference;
    c.position_offset = opt ? 2 : 0;
    c.max_positions = 16 + c.position_offset;
    c.batch = 1;
    c.seq = 3;
    c.past = 5;
    const model_graph g = opt ? build_opt(c) : build_gpt2(c);
    const std::string table = opt ? "model.decoder.embed_positions" : "transformer.wpe";
    const double first = static_cast<double>(c.position_offset + 5);
    CHECK(rows_looked_up(g, table, c.hidden) == std::vector<double>{first, first + 1, first + 2});
    // a step re-sized past the table's last row after the cache is refused before it runs
    CHECK_NOTHROW(check_position_tables(with_batch_seq(g, 0, 11)));
    CHECK_THROWS_WITH_AS(check_position_tables(with_batch_seq(g, 0, 12)), doctest::Contains("a table of 11 rows"), exec_error);
  }
}

// The megatron baseline lays the vocabulary's operators out as Megatron-LM does: the word
// embedding vocab-parallel (VocabParallelEmbedding), the output layer column-parallel over the
// vocabulary, the loss vocab_parallel_cross_entropy, position embeddings whole, and every one
// of their weights stored split as it is taken.
#include <doctest/doctest.h>

#include <autoshard/pass/export_megatron.hpp>
#include <autoshard/pass/pass.hpp>

#include <cstdint>
#include <string>

namespace {

using namespace autoshard;

const strategy& vocab_chosen(const autosharding_result& r, const std::string& name) {
  const auto v = find_vertex(r.graph, name);
  REQUIRE(v);
  return r.strategies[*v];
}

autosharding_options vocab_megatron_on(std::vector<int> shape) {
  autosharding_options o;
  o.mesh = make_cluster_mesh(shape);
  o.algo = algo::megatron;
  o.compare_baselines = false;
  o.pricing.micro_batches = 1;
  return o;
}

/// Bytes per device of the parameters a plan stores (weight, gradient and optimizer state).
std::int64_t vocab_parameter_bytes(const autosharding_result& r) {
  std::int64_t sum = 0;
  for (vertex_t v = 0; v < boost::num_vertices(r.graph); ++v)
    if (r.graph[v].is_parameter()) sum += r.strategies[v].memory_bytes;
  return sum;
}

}  // namespace

TEST_CASE("vocab operators: the word embedding is the head's, not the positions', tied or not, and none without a head") {
  transformer_config c = transformer_config::gpt2(1, 64, 4);
  c.vocab = 1000;
  c.max_positions = 1000;  // as many position rows as the vocabulary: the head's table tells them apart
  c.seq = 16;
  c.batch = 1;             // the token ids are [1, 16] like the positions
  c.mode = run_mode::training;
  const model_graph gpt = build_gpt2(c);
  const detail::vocab_operators t = detail::vocab_operators_of(gpt);
  REQUIRE(t.embedding);
  CHECK(gpt[*t.embedding].name == "transformer.wte");
  CHECK(gpt[*t.head].name == "lm_head");
  CHECK(gpt[*t.loss].name == "loss");
  CHECK(t.tied);
  CHECK(t.vocab == 1000);
  // Untied (LLaMA), and at inference (no loss) the head is the unconsumed linear over the vocabulary.
  transformer_config l = transformer_config::llama(1, 64, 4, 4, 128);
  l.vocab = 500;
  l.seq = 16;
  l.mode = run_mode::inference;
  const model_graph llama = build_llama(l);
  const detail::vocab_operators u = detail::vocab_operators_of(llama);
  REQUIRE(u.head);
  CHECK(llama[*u.embedding].name == "model.embed_tokens");
  CHECK(llama[*u.head].name == "lm_head");
  CHECK_FALSE(u.loss);
  CHECK_FALSE(u.tied);
  CHECK(u.vocab == 500);
  // export --to megatron reads the same vocabulary (one home of the test): before, GPT-2 at a
  // micro-batch of 1 read its token ids as positions and found no vocabulary.
  const layer_map layers = map_layers(gpt);
  const detail::megatron_model md = detail::megatron_model_of(gpt, layers, detail::megatron_linears(gpt));
  CHECK(md.vocab == 1000);
  CHECK(md.tied);
  CHECK(md.learned_positions);
  // BERT's encoder has no head: its word embedding is the first whose ids are not the positions.
  transformer_config b = transformer_config::bert(1, 64, 4);
  b.seq = 16;
  b.mode = run_mode::inference;
  const model_graph bert = build_bert(b);
  const detail::vocab_operators e = detail::vocab_operators_of(bert);
  CHECK(bert[*e.embedding].name == "bert.embeddings.word_embeddings");
  CHECK_FALSE(e.head);
  CHECK_FALSE(e.loss);
}

TEST_CASE("megatron lays GPT-2's tied vocabulary out as Megatron-LM: vocab-parallel embedding, head and loss, wpe whole") {
  // 50257 rows over 4 ranks: 12565 a rank, the last 12562 (the split rule's uneven piece,
  // priced padded as Megatron-LM pads the vocabulary).
  transformer_config c = transformer_config::gpt2(2, 256, 4);
  c.seq = 128;
  c.batch = 8;
  c.mode = run_mode::training;
  const model_graph g = build_gpt2(c);
  for (const std::vector<int>& shape : {std::vector<int>{1, 4}, std::vector<int>{2, 4}}) {
    CAPTURE(shape.front());
    const autosharding_result r = autosharding_analysis_pass(g, vocab_megatron_on(shape));
    const std::size_t tp = 1;
    const strategy& wte = vocab_chosen(r, "transformer.wte");
    CHECK(wte.inputs[0][tp].is_replicate());  // each rank looks up every id in its rows
    CHECK(wte.inputs[1][tp].is_shard(0));
    CHECK(wte.output[tp].is_partial());       // a partial sum, reduced by its consumer
    // The one tied table: stored split on the vocabulary, as both its uses take it.
    CHECK(vocab_chosen(r, "transformer.wte.weight").output[tp].is_shard(0));
    const strategy& head = vocab_chosen(r, "lm_head");
    CHECK(head.inputs[1][tp].is_shard(0));
    CHECK(head.inputs[0][tp].is_replicate());
    CHECK(head.output[tp].is_shard(2));  // the logits split on the vocabulary
    const strategy& loss = vocab_chosen(r, "loss");
    CHECK(loss.inputs[0][tp].is_shard(2));
    CHECK(loss.inputs[1][tp].is_replicate());
    // Learned positions are a plain torch.nn.Embedding in Megatron-LM: whole on every tp rank.
    CHECK(vocab_chosen(r, "transformer.wpe.weight").output[tp].is_replicate());
    CHECK(vocab_chosen(r, "transformer.wpe").inputs[1][tp].is_replicate());
    // Data parallel on the other axis: the batch split, the table replicated (ZeRO-1 at most).
    if (shape.front() > 1) {
      CHECK(wte.inputs[0][0].is_shard(0));
      CHECK(wte.inputs[1][0].is_replicate());
      CHECK(head.output[0].is_shard(0));
      CHECK(vocab_chosen(r, "transformer.wte.weight").zero_stage <= 1);
    }
    // The table on each rank: 12565 rows of 256, with its gradient and Adam's state (16 B each in bf16).
    const std::int64_t table = std::int64_t{12565} * 256 * 16;
    if (shape.front() == 1) CHECK(vocab_chosen(r, "transformer.wte.weight").memory_bytes == table);
    else CHECK(vocab_chosen(r, "transformer.wte.weight").memory_bytes <= table);
  }
}

TEST_CASE("megatron stores LLaMA's untied embedding and head split on the vocabulary: the head's share of memory saved") {
  // On 1x4 (tp 4, dp 1) every weight but the norms' is split four ways. Before, the ILP kept
  // lm_head whole (computed on sequence slices) and split embed_tokens on the hidden dim: the
  // parameters then held V h x 16 B x (1 - 1/4) more per device than Megatron-LM's layout.
  const std::int64_t V = 32000, h = 256, f = 688, L = 2, tp = 4, state = 16;  // bf16 Adam: weight, gradient, fp32 master and moments
  transformer_config c = transformer_config::llama(L, h, 8, 8, f);
  c.seq = 256;
  c.batch = 8;
  c.mode = run_mode::training;
  const model_graph g = build_llama(c);
  const autosharding_result r = autosharding_analysis_pass(g, vocab_megatron_on({1, 4}));
  const strategy& embed = vocab_chosen(r, "model.embed_tokens");
  CHECK(embed.inputs[1][1].is_shard(0));
  CHECK(embed.output[1].is_partial());
  const strategy& head = vocab_chosen(r, "lm_head");
  CHECK(head.inputs[1][1].is_shard(0));
  CHECK(head.inputs[0][1].is_replicate());
  CHECK(head.output[1].is_shard(2));
  CHECK(vocab_chosen(r, "loss").inputs[0][1].is_shard(2));
  for (const char* table : {"model.embed_tokens.weight", "lm_head.weight"}) {
    CAPTURE(table);
    CHECK(vocab_chosen(r, table).output[1].is_shard(0));
    CHECK(vocab_chosen(r, table).memory_bytes == V / tp * h * state);
  }
  // Every parameter, counted from the shapes: the block's matrices, the embedding and the head
  // split four ways, the norms whole.
  const std::int64_t split = 2 * V * h + L * (4 * h * h + 3 * h * f), whole = (2 * L + 1) * h;
  const std::int64_t expected = (split / tp + whole) * state;
  CHECK(vocab_parameter_bytes(r) == expected);
  CHECK(r.report.plan.peak_memory_bytes >= expected);
}

TEST_CASE("megatron refuses a vocabulary that leaves a tensor-parallel rank no rows, naming the numbers") {
  transformer_config c = transformer_config::llama(1, 64, 8, 8, 128);
  c.vocab = 6;  // 2 rows a rank on 4 ranks: 2, 2, 2, 0
  c.seq = 16;
  c.batch = 4;
  c.mode = run_mode::training;
  CHECK_THROWS_WITH_AS((void)autosharding_analysis_pass(build_llama(c), vocab_megatron_on({1, 4})),
                       doctest::Contains("megatron: the vocabulary of 6 rows of 'model.embed_tokens' does not split over the 4 "
                                         "ranks of mesh axis 1: 2 rows a rank leave the last none"),
                       solver_error);
  c.vocab = 7;  // 2, 2, 2, 1: uneven, the split rule's, and planned
  CHECK(autosharding_analysis_pass(build_llama(c), vocab_megatron_on({1, 4})).report.plan.feasible);
}

TEST_CASE("megatron plans an imported model whose opaque operators compute over the batch whole on every rank") {
  // torch's dynamo exporter builds the attention mask with an arange over the batch, an opaque
  // vertex of shape [B]: megatron required every batch-sized activation split over the
  // data-parallel ranks, which an opaque operator cannot be ('has no strategy this algo allows').
  transformer_config c = transformer_config::gpt2(2, 64, 4);
  c.seq = 16;
  c.max_positions = 16;
  c.vocab = 256;
  c.batch = 8;
  c.mode = run_mode::training;
  model_graph g = build_gpt2(c);
  op_attrs a;
  a.dims = {8};
  a.op_type = "Range";
  const vertex_t ar = add_op(g, op_kind::opaque, "batch_arange", {}, a, dtype::i64);
  const autosharding_result r = autosharding_analysis_pass(g, vocab_megatron_on({2, 4}));
  CHECK(r.strategies[ar].output.is_replicated());
  CHECK(vocab_chosen(r, "transformer.h.0.attn.c_attn").inputs[0].shard_count(r.report.mesh, 0) == 2);  // dp 2
}

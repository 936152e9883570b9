// export --to megatron describes exactly the layout the plan priced, or refuses: every operator
// Megatron-LM's tensor-parallel layout names (the block linears, the word embedding, the output
// layer, the loss, the attention core, the norms and position embeddings) is checked against
// the rules the megatron baseline is solved under (megatron_layout.hpp), and each disagreement
// names the operator, the plan's strategy and what Megatron-LM does.
#include <doctest/doctest.h>

#include <autoshard/pass/export_megatron.hpp>
#include <autoshard/pass/pass.hpp>
#include <autoshard/pass/pipelined.hpp>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>
#include "unit/scratch.hpp"

namespace {

using namespace autoshard;

transformer_config mx_gpt2(int layers) {
  transformer_config c = transformer_config::gpt2(layers, 256, 4);
  c.seq = 64;
  c.max_positions = 64;
  c.vocab = 256;
  c.batch = 16;
  c.mode = run_mode::training;
  return c;
}

transformer_config mx_llama(int layers) {
  transformer_config c = transformer_config::llama(layers, 256, 8, 8, 512);
  c.seq = 64;
  c.vocab = 256;
  c.batch = 16;
  c.mode = run_mode::training;
  return c;
}

/// The plan document `o` (algo, mesh, --tp, recomputation) writes for `g`, read back.
plan_document mx_plan(const model_graph& g, autosharding_options o) {
  o.compare_baselines = false;
  o.ilp_solution_file = autoshard_test::unique_temp_path("megatron_export.json").string();
  autosharding_analysis_pass(g, o);
  plan_document d = read_plan_file(o.ilp_solution_file);
  std::filesystem::remove(o.ilp_solution_file);
  return d;
}

autosharding_options mx_megatron(std::vector<int> shape, int tp = 0) {
  autosharding_options o;
  o.mesh = make_cluster_mesh(shape);
  o.algo = algo::megatron;
  o.tensor_parallel = tp;
  o.pricing.micro_batches = 1;
  o.pricing.attention = attention_kernel::unfused;  // selective recomputation has the core's probabilities to drop
  return o;
}

/// The export of `g`'s Megatron-LM plan on 2 x 4 devices at tensor parallel 2, the layout most
/// tests read the arguments (or the problems) of.
megatron_export mx_exported(const model_graph& g) { return export_megatron(load_plan(mx_plan(g, mx_megatron({2, 4}, 2)))); }

/// Plan `d` with tensor `name` switched to the first other strategy it offers that `want`
/// accepts, stored at the same ZeRO stage and laid out as before on every mesh axis but
/// `axis` (so only what changes there is Megatron-LM's business): a hand-edited plan file.
plan_document mx_edited(plan_document d, const std::string& name, std::size_t axis, const std::function<bool(const strategy&)>& want) {
  const detail::pass_model pm(d.graph, d.mesh, d.pricing, std::nullopt, {}, detail::pass_model::edges_when::deferred);
  const auto v = find_vertex(d.graph, name);
  REQUIRE(v);
  const std::vector<strategy>& ss = pm.strategies[*v];
  const strategy* was = nullptr;
  for (const strategy& s : ss) was = s.name == d.tensors[*v].strategy ? &s : was;
  REQUIRE(was);
  const auto same_off_axis = [&](const sharding_spec& a, const sharding_spec& b) {
    for (std::size_t x = 0; x < d.mesh.ndim(); ++x)
      if (x != axis && !(a[x] == b[x])) return false;
    return true;
  };
  for (const strategy& s : ss) {
    bool same = s.name != was->name && s.zero_stage == was->zero_stage && s.recompute == was->recompute &&
                same_off_axis(s.output, was->output);
    for (std::size_t i = 0; i < s.inputs.size() && same; ++i) same = same_off_axis(s.inputs[i], was->inputs[i]);
    if (same && want(s)) {
      d.tensors[*v].strategy = s.name;
      return d;
    }
  }
  FAIL("no other strategy of " << name << " fits");
  return d;
}

std::vector<std::string> mx_problems(const plan_document& d) { return export_megatron(load_plan(d)).problems; }

/// Flag -> value of an export's arguments.
std::map<std::string, std::string> mx_arguments(const megatron_export& e) {
  std::map<std::string, std::string> m;
  for (const megatron_argument& a : e.arguments) m[a.flag] = a.value;
  return m;
}

}  // namespace

TEST_CASE("export --to megatron refuses a hand-edited plan whose row-parallel linear, embedding, head, loss or attention is not Megatron-LM's") {
  // GPT-2 on two nodes of four: tensor parallel on mesh axis 1. Each edit changes one tensor's
  // layout on that axis and nothing else; the export names it, the plan's strategy and what
  // Megatron-LM does, and nothing more.
  const plan_document d = mx_plan(build_gpt2(mx_gpt2(2)), mx_megatron({2, 4}));
  REQUIRE(mx_problems(d).empty());
  static constexpr std::size_t tp = 1;
  struct edit {
    const char* tensor;
    std::function<bool(const strategy&)> want;
    const char* megatron;  // what the problem quotes
  };
  const std::vector<edit> edits = {
      // the attention output projection column-parallel (GPT-2's Conv1D: [in,out], out is dim 1)
      {"transformer.h.0.attn.c_proj", [](const strategy& s) { return s.inputs[1][tp].is_shard(1) && !s.output[tp].is_partial(); },
       "Megatron-LM's RowParallelLinear takes its input split on the last dim and its weight on the input dim, and gives a partial sum"},
      {"transformer.h.1.mlp.c_proj", [](const strategy& s) { return s.inputs[1][tp].is_replicate() && s.output[tp].is_replicate(); },
       "Megatron-LM's RowParallelLinear takes its input split on the last dim"},
      {"transformer.h.0.attn.c_proj.bias", [](const strategy& s) { return s.output[tp].is_shard(0); },
       "Megatron-LM's RowParallelLinear stores its weight split on the input dim and its bias whole"},
      // the word embedding looked up in the whole table on every rank
      {"transformer.wte", [](const strategy& s) { return s.inputs[1][tp].is_replicate(); },
       "Megatron-LM's VocabParallelEmbedding looks the ids up whole in its table split on the vocabulary and gives a partial sum"},
      {"transformer.wpe.weight", [](const strategy& s) { return s.output[tp].is_shard(0); },
       "Megatron-LM keeps the tables of the embeddings other than the word one (positions, token types) whole"},
      // the head split on its input (row-parallel) instead of over the vocabulary
      {"lm_head", [](const strategy& s) { return s.output[tp].is_partial(); },
       "Megatron-LM's output layer is column-parallel over the vocabulary"},
      {"loss", [](const strategy& s) { return s.inputs[0][tp].is_replicate(); },
       "Megatron-LM's vocab_parallel_cross_entropy takes the logits split on the vocabulary and the labels whole"},
      // the attention core whole, or split otherwise than over its heads
      {"transformer.h.1.attn.attention", [](const strategy& s) { return !s.inputs[0][tp].is_shard(2); },
       "Megatron-LM splits the attention core over its heads"},
      {"transformer.h.0.ln_2.weight", [](const strategy& s) { return s.output[tp].is_shard(0); },
       "Megatron-LM keeps the norms' weights whole on every tensor-parallel rank"},
  };
  for (const edit& x : edits) {
    CAPTURE(x.tensor);
    const plan_document bad = mx_edited(d, x.tensor, tp, x.want);
    const auto v = *find_vertex(bad.graph, x.tensor);
    const std::vector<std::string> problems = mx_problems(bad);
    REQUIRE(problems.size() == 1);
    CHECK(problems[0].starts_with("'" + std::string(x.tensor) + "': the plan does not split it as Megatron-LM does on the tensor-parallel " +
                                  "mesh axis 1 (" + bad.tensors[v].strategy + "): "));
    CHECK(problems[0].find(x.megatron) != std::string::npos);
    CHECK_THROWS_WITH_AS(megatron_arguments(export_megatron(load_plan(bad))), doctest::Contains(problems[0].c_str()), spec_error);
  }
}

TEST_CASE("export --to megatron refuses a plan that keeps the batch whole on a data-parallel axis: Megatron-LM splits it over every rank") {
  // The work repeated on mesh axis 0's two ranks: Megatron-LM's arguments would say 8
  // data-parallel ranks of a micro-batch each, not the 4 of 2 the plan priced.
  const plan_document d = mx_plan(build_gpt2(mx_gpt2(1)), mx_megatron({2, 4}, 1));
  REQUIRE(mx_problems(d).empty());
  const plan_document bad = mx_edited(d, "transformer.h.0.mlp.act", 0, [](const strategy& s) { return s.output[0].is_replicate(); });
  const std::vector<std::string> problems = mx_problems(bad);
  REQUIRE(problems.size() == 1);
  CHECK(problems[0] == "'transformer.h.0.mlp.act': the plan does not split its batch on mesh axis 0, a data-parallel axis (" +
                           bad.tensors[*find_vertex(bad.graph, "transformer.h.0.mlp.act")].strategy +
                           "): Megatron-LM splits the batch over every data-parallel rank");
}

TEST_CASE("export --to megatron refuses alpa's plan of GPT-2 on four ranks, naming the attention core, the head and the loss") {
  // Alpa splits this GPT-2's layers on the batch over the four ranks and its MLP over
  // columns: no Megatron-LM layout. Before, only the block linears were checked, and the
  // attention core, the head and the loss went unremarked.
  transformer_config c = transformer_config::gpt2(2, 1024, 16);
  c.seq = 256;
  c.max_positions = 256;
  c.vocab = 4096;
  c.batch = 4;
  c.mode = run_mode::training;
  autosharding_options o;
  o.mesh = make_cluster_mesh({1, 4});
  o.pricing.micro_batches = 1;
  const plan_document d = mx_plan(build_gpt2(c), o);
  const megatron_export e = export_megatron(load_plan(d));
  REQUIRE(e.tp == 4);  // its MLP's linears split on mesh axis 1: Megatron-LM's tensor-parallel axis
  const auto named = [&](const std::string& start, const std::string& megatron) {
    for (const std::string& p : e.problems)
      if (p.starts_with(start) && p.find(megatron) != std::string::npos) return true;
    return false;
  };
  CHECK(named("'transformer.h.0.attn.attention': the plan does not split it as Megatron-LM does on the tensor-parallel mesh axis 1 (",
              "): Megatron-LM splits the attention core over its heads"));
  CHECK(named("'lm_head': ", "Megatron-LM's output layer is column-parallel over the vocabulary"));
  CHECK(named("'loss': ", "Megatron-LM's vocab_parallel_cross_entropy"));
  CHECK(named("'transformer.wte': ", "Megatron-LM's VocabParallelEmbedding"));
  for (const std::string& p : e.problems) {
    CAPTURE(p);
    CHECK(p.find("Megatron-LM") != std::string::npos);
  }
}

TEST_CASE("export --to megatron refuses a LLaMA whose rotaries turn by scaled frequencies (Llama-3.1's rope_scaling)") {
  transformer_config c = mx_llama(2);
  c.rope_theta = 500000.0;
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = 8.0;
  const std::vector<std::string> problems = mx_problems(mx_plan(build_llama(c), mx_megatron({2, 4}, 2)));
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].find("'model.layers.0.self_attn.rotary_q' (rotary) turns by frequencies given outright") != std::string::npos);
  c.rope_scaling = {};  // the same model without the scaling exports
  CHECK(mx_problems(mx_plan(build_llama(c), mx_megatron({2, 4}, 2))).empty());
  // YaRN: blended frequencies and cos and sin scaled by its attention_factor; a rotary scaled alone is refused too.
  c.rope_scaling.type = "yarn";
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.original_max_positions = 16;
  const std::vector<std::string> yarn = mx_problems(mx_plan(build_llama(c), mx_megatron({2, 4}, 2)));
  REQUIRE(yarn.size() == 1);
  CHECK(yarn[0].find("scales its cos and sin (a scaled rope, as Llama-3.1's or YaRN's rope_scaling)") != std::string::npos);
  c.rope_scaling = {};
  model_graph scaled = build_llama(c);
  for (vertex_t v = 0; v < boost::num_vertices(scaled); ++v)
    if (scaled[v].kind == op_kind::rotary) scaled[v].attrs.scale = 1.25;
  CHECK(mx_problems(mx_plan(scaled, mx_megatron({2, 4}, 2))).size() == 1);
  // Dynamic NTK past max_position_embeddings turns by a scaled base (refused); up to it, by the default one.
  c.rope_scaling.type = "dynamic";
  c.rope_scaling.factor = 2.0;
  c.rope_scaling.original_max_positions = c.seq - 1;
  CHECK(mx_problems(mx_plan(build_llama(c), mx_megatron({2, 4}, 2))).size() == 1);
  c.rope_scaling.original_max_positions = c.seq;
  CHECK(mx_problems(mx_plan(build_llama(c), mx_megatron({2, 4}, 2))).empty());
}

TEST_CASE("export --to megatron: megatron's plans of GPT-2 and LLaMA still export, at tp 2 and 4, with and without sequence parallelism and a pipeline") {
  for (const bool llama : {false, true}) {
    const model_graph g = llama ? build_llama(mx_llama(2)) : build_gpt2(mx_gpt2(2));
    for (const int tp : {2, 4})
      for (const recompute_policy r : {recompute_policy::none, recompute_policy::selective, recompute_policy::full}) {
        CAPTURE(llama);
        CAPTURE(tp);
        autosharding_options o = mx_megatron({2, 4}, tp);
        o.pricing.recompute = r;
        const megatron_export e = export_megatron(load_plan(mx_plan(g, o)));
        CHECK(e.problems.empty());
        const std::map<std::string, std::string> a = mx_arguments(e);
        CHECK(a.at("--tensor-model-parallel-size") == std::to_string(tp));
        CHECK(a.at("--micro-batch-size") == std::to_string(16 * tp / 8));
        CHECK(a.at("--global-batch-size") == "16");
        CHECK(a.count("--use-distributed-optimizer") == 1);
        CHECK(a.count("--recompute-granularity") == (r == recompute_policy::none ? 0u : 1u));
      }
  }
  // Sequence parallelism: LLaMA-7B's widths and a GPT-2 as wide, one sequence of 4096 on four ranks.
  transformer_config c = transformer_config::llama_7b();
  c.layers = 2;
  c.seq = 4096;
  c.batch = 1;
  c.mode = run_mode::training;
  transformer_config gc = transformer_config::gpt2(2, 2048, 16);
  gc.seq = 4096;
  gc.max_positions = 4096;
  gc.batch = 1;
  gc.mode = run_mode::training;
  for (const model_graph& g : {build_llama(c), build_gpt2(gc)}) {
    const megatron_export e = export_megatron(load_plan(mx_plan(g, mx_megatron({1, 4}))));
    CHECK(e.problems.empty());
    CHECK(mx_arguments(e).count("--sequence-parallel") == 1);
  }
  // A pipeline of two stages of LLaMA's layers, each stage tensor parallel 2 and data parallel 2.
  const model_graph g = build_llama(mx_llama(4));
  autosharding_options o = mx_megatron({2, 4});
  o.pricing.mode = run_mode::training;
  const pipeline_config pc{.pp = 2, .tp = 2, .dp = 0, .micro_batch = 2, .recompute = recompute_kind::full,
                           .schedule = pipeline_schedule::one_f_one_b};
  const pipelined_step st = price_pipelined(g, o.mesh, o.pricing, algo::megatron, pc, std::vector<int>{2, 2});
  const megatron_export e = export_megatron(load_plan(pipelined_document(g, o.mesh, st, o)));
  CHECK(e.problems.empty());
  const std::map<std::string, std::string> a = mx_arguments(e);
  CHECK(a.at("--pipeline-model-parallel-size") == "2");
  CHECK(a.at("--tensor-model-parallel-size") == "2");
  CHECK(a.at("--micro-batch-size") == "2");
  CHECK(a.at("--recompute-granularity") == "full");
}

TEST_CASE("export --to megatron writes the rotary's base, turned part and layout where they are not Megatron-LM's defaults") {
  // Megatron-LM's arguments.py: --rotary-base (type=int, default 10000), --rotary-percent (float,
  // default 1.0: RotaryEmbedding turns dim = int(kv_channels * rotary_percent) dims of each head,
  // the rest passed through), --rotary-interleaved (pairs (2i, 2i+1)). LLaMA-3's base 500000
  // exported without its flag was a model of base 10000.
  transformer_config c = mx_llama(2);  // heads of 256 / 8 = 32
  c.rope_theta = 500000.0;
  megatron_export e = mx_exported(build_llama(c));
  REQUIRE(e.problems.empty());
  CHECK(megatron_arguments(e).find("--position-embedding-type rope \\\n--rotary-base 500000 \\\n--normalization RMSNorm \\\n") !=
        std::string::npos);
  CHECK(mx_arguments(e).count("--rotary-percent") == 0);
  CHECK(mx_arguments(e).count("--rotary-interleaved") == 0);
  c.rope_theta = 10000.0;  // Megatron-LM's default: no flag
  CHECK(mx_arguments(mx_exported(build_llama(c))).count("--rotary-base") == 0);
  // A partial rotary (GPT-NeoX's rotary_pct): 8 of each head's 32 dims.
  c.rotary_pct = 0.25;
  e = mx_exported(build_llama(c));
  REQUIRE(e.problems.empty());
  CHECK(megatron_arguments(e).find("--position-embedding-type rope \\\n--rotary-percent 0.25 \\\n") != std::string::npos);
  // Interleaved pairs (Meta's layout) say --rotary-interleaved; with a part of the head as well.
  model_graph g = build_llama(c);
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].kind == op_kind::rotary) g[v].attrs.rotary_half = false;
  e = mx_exported(g);
  REQUIRE(e.problems.empty());
  CHECK(megatron_arguments(e).find("--position-embedding-type rope \\\n--rotary-percent 0.25 \\\n--rotary-interleaved \\\n") !=
        std::string::npos);
  // A base that is not an integer is refused, never rounded; so are rotaries that turn unalike
  // (Megatron-LM's arguments say one rotary for every layer).
  c.rotary_pct = 1.0;
  c.rope_theta = 10000.5;
  std::vector<std::string> problems = mx_exported(build_llama(c)).problems;
  REQUIRE(problems.size() == 1);
  CHECK(problems[0] == "'model.layers.0.self_attn.rotary_q' (rotary) turns at base 10000.5: Megatron-LM's --rotary-base is an integer "
                       "(arguments.py: type=int), and the base is not rounded");
  c.rope_theta = 10000.0;
  g = build_llama(c);
  g[*find_vertex(g, "model.layers.1.self_attn.rotary_k")].attrs.rotary_dims = 16;
  problems = mx_exported(g).problems;
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].find("'model.layers.1.self_attn.rotary_k' (rotary) turns otherwise than 'model.layers.0.self_attn.rotary_q' (rotary)") == 0);
  CHECK(problems[0].find("Megatron-LM's rotary arguments are one for every layer") != std::string::npos);
}

TEST_CASE("export --to megatron writes the norms' epsilon (--norm-epsilon) where it is not Megatron-LM's default, and refuses unlike ones") {
  // Megatron-LM's arguments.py: --norm-epsilon (type=float, default 1e-5), which
  // core_transformer_config_from_args makes TransformerConfig.layernorm_epsilon: every norm's.
  // Qwen2's rms_norm_eps 1e-6 exported without it was a model whose norms add 1e-5.
  transformer_config c = mx_llama(1);
  c.norm_epsilon = 1e-6;
  megatron_export e = mx_exported(build_llama(c));
  REQUIRE(e.problems.empty());
  CHECK(megatron_arguments(e).find("--normalization RMSNorm \\\n--norm-epsilon 1e-06 \\\n") != std::string::npos);
  c.norm_epsilon = 1e-5;  // Megatron-LM's default: no flag
  CHECK(mx_arguments(mx_exported(build_llama(c))).count("--norm-epsilon") == 0);
  transformer_config b = mx_gpt2(1);  // a LayerNorm's as well: BERT's 1e-12 in a decoder
  b.norm_epsilon = 1e-12;
  e = mx_exported(build_gpt2(b));
  REQUIRE(e.problems.empty());
  CHECK(mx_arguments(e).at("--norm-epsilon") == "1e-12");
  CHECK(mx_arguments(e).count("--normalization") == 0);
  // Norms of unlike epsilons: refused, listing each epsilon with a norm that has it.
  c.norm_epsilon = 1e-6;
  model_graph g = build_llama(c);
  g[*find_vertex(g, "model.layers.0.post_attention_layernorm")].attrs.epsilon = 1e-5;
  g[*find_vertex(g, "model.norm")].attrs.epsilon = 0.25;
  const std::vector<std::string> problems = mx_exported(g).problems;
  REQUIRE(problems.size() == 1);
  CHECK(problems[0] == "the norms add unlike epsilons ('model.layers.0.input_layernorm' 1e-06, "
                       "'model.layers.0.post_attention_layernorm' 1e-05, 'model.norm' 0.25): Megatron-LM's --norm-epsilon "
                       "(TransformerConfig.layernorm_epsilon) is one for every norm");
  CHECK_THROWS_WITH_AS(megatron_arguments(mx_exported(g)), doctest::Contains("the norms add unlike epsilons"), spec_error);
}

TEST_CASE("export --to megatron writes --kv-channels where a head is not hidden / heads wide (Gemma-7B's 256 on 3072 / 16)") {
  // Megatron-LM's validate_args sets kv_channels = hidden_size // num_attention_heads when
  // --kv-channels is absent: heads of 64 on a hidden of 256 / 8 exported without it built
  // heads of 32 (query/key/value and the output projection of other shapes), and the hidden
  // size was read from the attention core's width, 8 x 64 = 512.
  transformer_config c = mx_llama(1);  // hidden 256, 8 heads
  c.head_size = 64;
  megatron_export e = mx_exported(build_llama(c));
  REQUIRE(e.problems.empty());
  CHECK(megatron_arguments(e).find("--hidden-size 256 \\\n--ffn-hidden-size 512 \\\n--num-attention-heads 8 \\\n--kv-channels 64 \\\n") !=
        std::string::npos);
  // Grouped-query attention too: the head's width is the query heads', not the groups'.
  c.kv_heads = 2;
  e = mx_exported(build_llama(c));
  REQUIRE(e.problems.empty());
  CHECK(mx_arguments(e).at("--kv-channels") == "64");
  CHECK(mx_arguments(e).at("--num-query-groups") == "2");
  CHECK(mx_arguments(e).at("--hidden-size") == "256");
  // Heads of hidden / heads: Megatron-LM's default, no flag.
  c.head_size = 32;
  CHECK(mx_arguments(mx_exported(build_llama(c))).count("--kv-channels") == 0);
  c.head_size = 0;
  CHECK(mx_arguments(mx_exported(build_llama(c))).count("--kv-channels") == 0);
  CHECK(mx_arguments(mx_exported(build_gpt2(mx_gpt2(1)))).count("--kv-channels") == 0);
}

TEST_CASE("export --to megatron writes --ffn-hidden-size of a fused gate|up (Phi-3's gate_up_proj) too") {
  // The MLP's width was read from its up projection only: Phi-3's fused gate_up_proj left the
  // flag out, and Megatron-LM's --swiglu default int(8 x 256 / 3 / 64) x 64 = 640 is not 384.
  transformer_config c = mx_llama(1);
  c.ffn = 384;
  c.fused_qkv = true;
  const megatron_export e = mx_exported(build_llama(c));
  REQUIRE(e.problems.empty());
  CHECK(mx_arguments(e).at("--ffn-hidden-size") == "384");
  CHECK(mx_arguments(e).count("--swiglu") == 1);
}

TEST_CASE("export --to megatron: --max-position-embeddings is the learned position table's rows, not the sequence's") {
  // Megatron-LM's LanguageModelEmbedding holds --max-position-embeddings rows of positions:
  // GPT-2's 64-row table exported as the sequence's 16 rows was another model, into which the
  // checkpoint's table does not load.
  transformer_config c = mx_gpt2(1);  // max_positions 64
  c.seq = 16;
  megatron_export e = mx_exported(build_gpt2(c));
  REQUIRE(e.problems.empty());
  CHECK(mx_arguments(e).at("--seq-length") == "16");
  CHECK(mx_arguments(e).at("--max-position-embeddings") == "64");
  CHECK(mx_arguments(e).at("--position-embedding-type") == "learned_absolute");
  // A rotary has no table: the sequence's.
  transformer_config l = mx_llama(1);
  l.seq = 16;
  e = mx_exported(build_llama(l));
  REQUIRE(e.problems.empty());
  CHECK(mx_arguments(e).at("--max-position-embeddings") == "16");
}

TEST_CASE("export --to megatron says the MLP's activation as megatron.core's MLP computes it, or refuses it") {
  // megatron.core's MLP: --swiglu gates SiLU; otherwise F.gelu (exact), which bias_gelu_fusion
  // (Megatron-LM's default, wherever the first projection has a bias) replaces by
  // fused_bias_gelu's tanh form. GPT-2's tanh GELU with biases is the default; an exact GELU
  // with biases needs --no-bias-gelu-fusion; nothing says a GELU gate, ReLU or an ungated SiLU.
  transformer_config c = mx_gpt2(1);
  megatron_export e = mx_exported(build_gpt2(c));
  REQUIRE(e.problems.empty());
  CHECK(mx_arguments(e).count("--no-bias-gelu-fusion") == 0);
  CHECK(mx_arguments(e).count("--swiglu") == 0);
  c.activation = op_kind::gelu_erf;
  e = mx_exported(build_gpt2(c));
  REQUIRE(e.problems.empty());
  CHECK(mx_arguments(e).count("--no-bias-gelu-fusion") == 1);
  c.activation = op_kind::relu;
  std::vector<std::string> problems = mx_exported(build_gpt2(c)).problems;
  REQUIRE(problems.size() == 1);
  CHECK(problems[0] == "'transformer.h.0.mlp.act' (relu) is not an activation Megatron-LM's arguments say (GELU, or SiLU gated by --swiglu)");
  transformer_config l = mx_llama(1);
  CHECK(mx_arguments(mx_exported(build_llama(l))).count("--swiglu") == 1);
  // An encoder (BERT's attention sees every position) is not Megatron-LM's GPTModel.
  transformer_config b = transformer_config::bert(2, 256, 4);
  b.seq = 64, b.vocab = 256, b.batch = 16, b.mode = run_mode::training;
  const std::vector<std::string> bert = mx_exported(build_bert(b)).problems;
  CHECK(std::find(bert.begin(), bert.end(), "'bert.encoder.layer.0.attention.self.attention' (attention) attends to every position, "
                                            "an encoder's: Megatron-LM's arguments build GPTModel, a causal decoder") != bert.end());
  l.activation = op_kind::gelu;  // Gemma's GeGLU
  problems = mx_exported(build_llama(l)).problems;
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].find("(gelu) gates the MLP (GeGLU): Megatron-LM's arguments gate SiLU (--swiglu)") != std::string::npos);
}

TEST_CASE("export --to megatron: biases on all block linears, none, or query/key/value's only (--add-qkv-bias)") {
  // Megatron-LM's --disable-bias-linear drops every block linear's bias and --add-qkv-bias keeps
  // linear_qkv's. Qwen2's query/key/value biases exported without either built biases on the
  // attention output and the MLP too, parameters the model does not have.
  transformer_config c = mx_llama(1);
  std::map<std::string, std::string> a = mx_arguments(mx_exported(build_llama(c)));
  CHECK(a.count("--disable-bias-linear") == 1);
  CHECK(a.count("--add-qkv-bias") == 0);
  c.qkv_bias = true;  // Qwen2's
  megatron_export e = mx_exported(build_llama(c));
  REQUIRE(e.problems.empty());
  CHECK(megatron_arguments(e).find("--disable-bias-linear \\\n--add-qkv-bias \\\n") != std::string::npos);
  c.out_bias = true;  // LLaMA's attention_bias: the output projection's too, not the MLP's
  std::vector<std::string> problems = mx_exported(build_llama(c)).problems;
  REQUIRE(problems.size() == 1);
  CHECK(problems[0] == "'model.layers.0.self_attn.q_proj' has a bias and 'model.layers.0.mlp.gate_proj' none: Megatron-LM's block "
                       "linears have biases all (its default), none (--disable-bias-linear) or only query/key/value's (--add-qkv-bias)");
  c.mlp_bias = true;  // all of them: Megatron-LM's default
  a = mx_arguments(mx_exported(build_llama(c)));
  CHECK(a.count("--disable-bias-linear") == 0);
  CHECK(a.count("--add-qkv-bias") == 0);
  a = mx_arguments(mx_exported(build_gpt2(mx_gpt2(1))));
  CHECK(a.count("--disable-bias-linear") == 0);
  CHECK(a.count("--add-qkv-bias") == 0);
}

TEST_CASE("export --to megatron refuses Gemma's scaling: norms by 1 + weight, embeddings by sqrt(hidden)") {
  // megatron.core's local norms (WrappedTorchNorm) refuse zero-centred gamma (--apply-layernorm-1p),
  // and GPTModel does not scale its embeddings: exported without a word, it was another model.
  transformer_config c = mx_llama(1);
  c.gemma_scaling = true;
  const std::vector<std::string> problems = mx_exported(build_llama(c)).problems;
  REQUIRE(problems.size() == 2);
  CHECK(problems[0] == "'model.layers.0.input_layernorm' scales by 1 + weight (Gemma's norms): no Megatron-LM argument says it for the "
                       "local layer spec");
  CHECK(problems[1] == "'model.embed_tokens' (embedding) multiplies its rows by 16 (Gemma's normalizer): Megatron-LM's GPTModel does not");
}

TEST_CASE("export --to megatron: --rotary-percent is a decimal Megatron-LM's int(D * p) reads back as exactly R dims") {
  // 30 of 44 dims: 30/44 is 0.6818181818181818, and int(44 * 0.6818181818181818) is 29 in
  // double (as in Python); the next double up, 0.6818181818181819, gives 30.
  CHECK(detail::megatron_rotary_percent(30, 44) == "0.6818181818181819");
  CHECK(detail::megatron_rotary_percent(16, 64) == "0.25");
  CHECK(detail::megatron_rotary_percent(24, 32) == "0.75");
  for (std::int64_t D = 2; D <= 512; ++D)
    for (std::int64_t R = 2; R < D; R += 2) {
      const std::optional<std::string> p = detail::megatron_rotary_percent(R, D);
      REQUIRE(p);
      const double read = std::stod(*p);
      if (!(read < 1.0) || static_cast<std::int64_t>(static_cast<double>(D) * read) != R) FAIL("R " << R << " of D " << D << ": " << *p);
    }
}

TEST_CASE("export --to megatron refuses a sliding window shorter than the sequence, naming it, and exports one at least the sequence") {
  // megatron.core's window_size is not written (its local attention makes the window's mask on
  // CUDA only, which the CPU check of the arguments cannot run): a window that masks something
  // at the plan's sequence would be dropped, so it is refused; one at least the sequence masks nothing.
  transformer_config c = mx_llama(2);
  c.sliding_window = c.seq - 1;
  const std::vector<std::string> problems = mx_exported(build_llama(c)).problems;
  REQUIRE(problems.size() == 1);
  CHECK(problems[0] == "'model.layers.0.self_attn.attention' (attention) sees a sliding window of " + std::to_string(c.seq - 1) +
                           " keys, shorter than the sequence of " + std::to_string(c.seq) +
                           ": the arguments would say full causal attention (megatron-core's --window-size is not written)");
  c.max_window_layers = 1;  // Qwen2's layers from max_window_layers on: the second layer's is named
  CHECK(mx_exported(build_llama(c)).problems.at(0).find("'model.layers.1.self_attn.attention' (attention)") == 0);
  c.max_window_layers = 0;
  c.sliding_window = c.seq;
  const megatron_export e = mx_exported(build_llama(c));
  CHECK(e.problems.empty());
  CHECK(mx_arguments(e).count("--window-size") == 0);
}

TEST_CASE("export --to megatron refuses ALiBi, naming the attention (Megatron-LM has none), for BLOOM as for any graph") {
  // A LLaMA graph whose attention adds BLOOM's biases: everything else exports.
  model_graph g = build_llama(mx_llama(2));
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].kind == op_kind::attention) g[v].attrs.alibi = alibi_rule::bloom;
  const std::vector<std::string> problems = mx_exported(g).problems;
  REQUIRE(problems.size() == 1);
  CHECK(problems[0] == "'model.layers.0.self_attn.attention' (attention) adds ALiBi's position biases (bloom's): Megatron-LM has no "
                       "ALiBi (its --position-embedding-type is learned_absolute, rope, mrope, yarn or none)");
  CHECK(mx_exported(build_llama(mx_llama(2))).problems.empty());  // the same graph without
  // BLOOM itself, and Falcon with alibi: true, name it among their problems.
  transformer_config c = mx_gpt2(2);
  c.ffn = 4 * c.hidden;
  const auto names_alibi = [](const std::vector<std::string>& ps, const std::string& rule) {
    return std::any_of(ps.begin(), ps.end(), [&](const std::string& p) { return p.find("adds ALiBi's position biases (" + rule + "'s)") != std::string::npos; });
  };
  CHECK(names_alibi(mx_exported(build_bloom(c)).problems, "bloom"));
  c.rotary = false;
  c.kv_heads = c.heads;
  CHECK(names_alibi(mx_exported(build_falcon(c)).problems, "falcon"));
}

// Hugging Face config.json -> graph: parameter counts equal the published ones, names and
// shapes follow the checkpoints, and bad configs are errors naming the key.
#include <doctest/doctest.h>

#include <autoshard/graph/graph.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace {
using namespace autoshard;

const std::string hf_dir = std::string(AUTOSHARD_TEST_DATA_DIR) + "/hf/";

std::string hf_error(const std::string& text) {
  try {
    read_hf_config(nlohmann::json::parse(text), "c.json");
  } catch (const io_error& e) {
    return e.what();
  }
  return "(no error)";
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const node& param(const model_graph& g, const std::string& name) {
  auto v = find_vertex(g, name);
  REQUIRE_MESSAGE(v.has_value(), name);
  REQUIRE(g[*v].is_parameter());
  return g[*v];
}
}  // namespace

// The counts are transformers' model.num_parameters() for the published checkpoints (tied
// embeddings counted once; BERT and RoBERTa as BertModel/RobertaModel with the pooler).
TEST_CASE("Hugging Face configs of published models give their published parameter counts") {
  const std::map<std::string, std::int64_t> published{
      {"gpt2.json", 124'439'808},          {"bert-base-uncased.json", 109'482'240},
      {"roberta-base.json", 124'645'632},  {"opt-125m.json", 125'239'296},
      {"pythia-160m.json", 162'322'944},   {"bloom-560m.json", 559'214'592},
      {"qwen2-0.5b.json", 494'032'768},    {"mistral-7b-v0.1.json", 7'241'732'096},
      {"llama-2-7b.json", 6'738'415'616},  {"gemma-2b.json", 2'506'172'416},
      {"falcon-7b.json", 6'921'720'704},   {"phi-3-mini-4k.json", 3'821'079'552},
      {"llama-3.1-8b.json", 8'030'261'248}};
  std::map<std::string, bool> families;
  for (const auto& entry : published) {
    const std::string& file = entry.first;  // a plain name: Clang 14's CAPTURE cannot take a structured binding
    const std::int64_t count = entry.second;
    CAPTURE(file);
    hf_model m = read_hf_config_file(hf_dir + file);
    m.config.seq = 16;  // the count does not depend on the sequence; keep shape inference cheap
    m.config.batch = 1;
    m.config.mode = run_mode::inference;  // BertModel / RobertaModel (the decoders count the same in training)
    const model_graph g = build_hf(m);
    CHECK(parameter_count(g) == count);
    validate(g);
    families[m.model_type] = true;
  }
  for (std::string_view t : hf_model_types) CHECK_MESSAGE(families.count(std::string(t)) == 1, t);
}

// In training, bert and roberta are the masked LMs: transformers' BertForMaskedLM and
// RobertaForMaskedLM num_parameters() (no pooler; the head's dense, LayerNorm and decoder
// bias; the decoder's weight is the word embeddings, counted once).
TEST_CASE("Hugging Face BERT and RoBERTa in training are the masked LMs, with their published parameter counts") {
  const std::map<std::string, std::int64_t> published{{"bert-base-uncased.json", 109'514'298}, {"roberta-base.json", 124'697'433}};
  for (const auto& entry : published) {
    const std::string& file = entry.first;
    CAPTURE(file);
    hf_model m = read_hf_config_file(hf_dir + file);
    m.config.seq = 16;
    m.config.batch = 1;
    m.config.mode = run_mode::training;
    const model_graph g = build_hf(m);
    CHECK(parameter_count(g) == entry.second);
    validate(g);
    const std::string pre = m.model_type;
    const std::string head = pre == "bert" ? "cls.predictions" : "lm_head";
    CHECK_FALSE(find_vertex(g, pre + ".pooler.dense.weight"));
    CHECK(parameter_names(g, *find_vertex(g, head + ".decoder")) ==
          std::vector<std::string>{pre + ".embeddings.word_embeddings.weight", head + ".bias"});
    CHECK(g[*find_vertex(g, "loss")].kind == op_kind::cross_entropy);
    CHECK(g[*find_vertex(g, "labels")].shape == tensor_shape{1, 16});
  }
  hf_model m = read_hf_config_file(hf_dir + "bert-base-uncased.json");
  m.config.seq = 16;
  m.config.batch = 1;
  m.config.mode = run_mode::inference;
  CHECK(parameter_count(build_hf(m)) == 109'482'240);  // inference: BertModel, with the pooler
}

TEST_CASE("Hugging Face names and shapes per family") {
  auto build = [](const std::string& file) {
    hf_model m = read_hf_config_file(hf_dir + file);
    m.config.seq = 8;
    m.config.batch = 1;
    m.config.mode = run_mode::inference;  // the base models' names (RoBERTa's pooler below)
    return build_hf(m);
  };
  SUBCASE("qwen2: q/k/v biases, no o_proj bias, GQA widths, tied lm_head") {
    const model_graph g = build("qwen2-0.5b.json");
    CHECK(param(g, "model.layers.3.self_attn.k_proj.weight").shape == tensor_shape{128, 896});
    CHECK(param(g, "model.layers.3.self_attn.k_proj.bias").shape == tensor_shape{128});
    CHECK(param(g, "model.layers.3.self_attn.q_proj.bias").shape == tensor_shape{896});
    CHECK_FALSE(find_vertex(g, "model.layers.3.self_attn.o_proj.bias"));
    CHECK_FALSE(find_vertex(g, "lm_head.weight"));
    CHECK(parameter_names(g, *find_vertex(g, "lm_head")) == std::vector<std::string>{"model.embed_tokens.weight"});
    CHECK(param(g, "model.norm.weight").type == dtype::bf16);  // torch_dtype
    const node& rot = g[*find_vertex(g, "model.layers.3.self_attn.rotary_k")];
    CHECK(rot.attrs.rotary_half);            // Hugging Face's rotate_half
    CHECK(rot.attrs.rotary_base == 1e6);     // its rope_theta
    CHECK(rot.attrs.heads == 2);
  }
  SUBCASE("gemma: head_dim 256 with 8 heads and 1 key/value head") {
    const model_graph g = build("gemma-2b.json");
    CHECK(param(g, "model.layers.0.self_attn.q_proj.weight").shape == tensor_shape{2048, 2048});
    CHECK(param(g, "model.layers.0.self_attn.k_proj.weight").shape == tensor_shape{256, 2048});
    CHECK(param(g, "model.layers.0.self_attn.o_proj.weight").shape == tensor_shape{2048, 2048});
    CHECK(g[*find_vertex(g, "model.layers.0.mlp.act")].kind == op_kind::gelu);
    CHECK_FALSE(find_vertex(g, "lm_head.weight"));
  }
  SUBCASE("phi3: fused qkv_proj and gate_up_proj") {
    const model_graph g = build("phi-3-mini-4k.json");
    CHECK(param(g, "model.layers.31.self_attn.qkv_proj.weight").shape == tensor_shape{9216, 3072});
    CHECK(param(g, "model.layers.31.mlp.gate_up_proj.weight").shape == tensor_shape{16384, 3072});
    CHECK(param(g, "lm_head.weight").shape == tensor_shape{32064, 3072});
    CHECK_FALSE(find_vertex(g, "model.layers.0.self_attn.q_proj.weight"));
  }
  SUBCASE("falcon-7b: multi-query query_key_value, no biases, one layer norm per block") {
    const model_graph g = build("falcon-7b.json");
    CHECK(param(g, "transformer.h.0.self_attention.query_key_value.weight").shape == tensor_shape{4672, 4544});
    CHECK_FALSE(find_vertex(g, "transformer.h.0.self_attention.query_key_value.bias"));
    CHECK(find_vertex(g, "transformer.h.0.input_layernorm.bias"));
    CHECK_FALSE(find_vertex(g, "transformer.h.0.post_attention_layernorm.weight"));
    const node& att = g[*find_vertex(g, "transformer.h.0.self_attention.attention")];
    CHECK(att.attrs.heads == 71);
    CHECK(att.attrs.kv_heads == 1);
    CHECK(att.attrs.alibi == alibi_rule::none);  // rotary: alibi false
  }
  SUBCASE("pythia: per-head interleaved query_key_value, untied embed_out, rotary") {
    const model_graph g = build("pythia-160m.json");
    CHECK(param(g, "gpt_neox.layers.0.attention.query_key_value.weight").shape == tensor_shape{2304, 768});
    CHECK(param(g, "embed_out.weight").shape == tensor_shape{50304, 768});
    CHECK(g[*find_vertex(g, "gpt_neox.layers.0.attention.rotary_q")].attrs.rotary_base == 10000.0);  // rotary_emb_base
    CHECK(param(g, "gpt_neox.final_layer_norm.bias").type == dtype::f16);
  }
  SUBCASE("opt: position table of max_position_embeddings + 2 rows, tied lm_head") {
    const model_graph g = build("opt-125m.json");
    CHECK(param(g, "model.decoder.embed_positions.weight").shape == tensor_shape{2050, 768});
    CHECK(param(g, "model.decoder.layers.11.fc1.bias").shape == tensor_shape{3072});
    CHECK(g[*find_vertex(g, "model.decoder.layers.0.activation_fn")].kind == op_kind::relu);
    CHECK_FALSE(find_vertex(g, "lm_head.weight"));
  }
  SUBCASE("bloom: word_embeddings_layernorm, ALiBi (no rotary)") {
    const model_graph g = build("bloom-560m.json");
    CHECK(param(g, "transformer.word_embeddings_layernorm.weight").shape == tensor_shape{1024});
    CHECK(param(g, "transformer.h.23.self_attention.query_key_value.bias").shape == tensor_shape{3072});
    CHECK_FALSE(find_vertex(g, "transformer.h.0.self_attention.rotary_q"));
    for (const char* a : {"transformer.h.0.self_attention.attention", "transformer.h.23.self_attention.attention"})
      CHECK(g[*find_vertex(g, a)].attrs.alibi == alibi_rule::bloom);
  }
  SUBCASE("roberta: RoBERTa names, one token type, 514 positions") {
    const model_graph g = build("roberta-base.json");
    CHECK(param(g, "roberta.embeddings.position_embeddings.weight").shape == tensor_shape{514, 768});
    CHECK(param(g, "roberta.embeddings.token_type_embeddings.weight").shape == tensor_shape{1, 768});
    CHECK(find_vertex(g, "roberta.pooler.dense.weight"));
  }
  SUBCASE("the default sequence is the position table less its offset, at most 2048") {
    CHECK(read_hf_config_file(hf_dir + "roberta-base.json").config.seq == 512);
    CHECK(read_hf_config_file(hf_dir + "opt-125m.json").config.seq == 2048);
    CHECK(read_hf_config_file(hf_dir + "gpt2.json").config.seq == 1024);
    CHECK(read_hf_config_file(hf_dir + "qwen2-0.5b.json").config.seq == 2048);
  }
}

TEST_CASE("a written config reads back to the same graph, for every family") {
  for (const char* file : {"gpt2.json", "bert-base-uncased.json", "roberta-base.json", "opt-125m.json",
                           "pythia-160m.json", "bloom-560m.json", "qwen2-0.5b.json", "mistral-7b-v0.1.json",
                           "llama-2-7b.json", "gemma-2b.json", "falcon-7b.json", "phi-3-mini-4k.json", "llama-3.1-8b.json"}) {
    CAPTURE(file);
    hf_model m = read_hf_config_file(hf_dir + file);
    m.config.layers = 2;
    hf_model back = read_hf_config(to_hf_config(m));
    CHECK(back.model_type == m.model_type);
    m.config.seq = back.config.seq = 8;
    m.config.batch = back.config.batch = 1;
    const model_graph a = build_hf(m), b = build_hf(back);
    CHECK(to_json(a) == to_json(b));
  }
}

TEST_CASE("falcon's new decoder architecture: grouped query_key_value and two layer norms") {
  // Falcon-40B's published sizes; the layout is [kv, heads/kv + 2, head_dim] rows.
  const hf_model m = read_hf_config(nlohmann::json::parse(R"({"model_type": "falcon", "hidden_size": 8192,
      "num_hidden_layers": 2, "num_attention_heads": 128, "num_kv_heads": 8, "new_decoder_architecture": true,
      "vocab_size": 65024})"));
  hf_model small = m;
  small.config.seq = 4;
  small.config.batch = 1;
  const model_graph g = build_hf(small);
  CHECK(param(g, "transformer.h.1.self_attention.query_key_value.weight").shape == tensor_shape{(128 + 16) * 64, 8192});
  CHECK(find_vertex(g, "transformer.h.1.ln_attn.weight"));
  CHECK(find_vertex(g, "transformer.h.1.ln_mlp.bias"));
  CHECK(g[*find_vertex(g, "transformer.h.1.self_attention.k")].shape == tensor_shape{1, 4, 8 * 64});
  CHECK(g[*find_vertex(g, "transformer.h.1.self_attention.q")].shape == tensor_shape{1, 4, 128 * 64});
}

TEST_CASE("falcon with alibi: true: no rotary, Falcon's ALiBi on every attention, written back") {
  // Falcon-RW-1B's published sizes (alibi, per-head query_key_value, sequential attention and MLP).
  hf_model m = read_hf_config(nlohmann::json::parse(R"({"model_type": "falcon", "hidden_size": 2048,
      "num_hidden_layers": 2, "num_attention_heads": 32, "multi_query": false, "alibi": true, "parallel_attn": false,
      "bias": true, "vocab_size": 50304})"));
  m.config.seq = 4;
  m.config.batch = 1;
  const model_graph g = build_hf(m);
  CHECK_FALSE(find_vertex(g, "transformer.h.0.self_attention.rotary_q"));
  for (const char* a : {"transformer.h.0.self_attention.attention", "transformer.h.1.self_attention.attention"}) {
    CHECK(g[*find_vertex(g, a)].attrs.alibi == alibi_rule::falcon);
    CHECK(g[*find_vertex(g, a)].attrs.heads == 32);
  }
  CHECK(to_hf_config(m)["alibi"] == true);
  hf_model back = read_hf_config(to_hf_config(m));
  back.config.seq = 4;
  back.config.batch = 1;
  CHECK(to_json(build_hf(back)) == to_json(g));
}

TEST_CASE("bad Hugging Face configs are errors naming the key and the value") {
  const std::string unsupported = hf_error(R"({"model_type": "t5", "d_model": 512})");
  CHECK(has(unsupported, "model_type 't5' is not supported"));
  for (std::string_view t : hf_model_types) CHECK(has(unsupported, std::string(t)));
  CHECK(has(hf_error(R"({"hidden_size": 8})"), "no \"model_type\""));
  CHECK(has(hf_error(R"([1, 2])"), "JSON object"));
  const std::string llama = R"({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
                                "intermediate_size": 64, "vocab_size": 100, )";
  CHECK(has(hf_error(llama + R"("hidden_size": -3})"), "c.json: hidden_size is -3, not an integer in [1, 1048576]"));
  CHECK(has(hf_error(llama + R"("n_embd": 1e30})"), "n_embd is 1e+30, not an integer"));
  CHECK(has(hf_error(llama + R"("hidden_size": 18446744073709551615})"), "not an integer in [1, 1048576]"));
  CHECK(has(hf_error(llama + R"("hidden_size": "big"})"), "hidden_size is \"big\", not an integer"));
  CHECK(has(hf_error(llama + R"("hidden_size": 32.5})"), "not an integer"));
  CHECK(has(hf_error(llama + R"("hidden_size": 30})"), "not a multiple of 4 heads"));
  CHECK(has(hf_error(llama + R"("hidden_size": 32, "num_key_value_heads": 3})"), "not a multiple of 3 key/value heads"));
  CHECK(has(hf_error(llama + R"("hidden_size": 32, "torch_dtype": "int8"})"), "torch_dtype is \"int8\", not float32, float16, bfloat16 or float64"));
  CHECK(has(hf_error(llama + R"("hidden_size": 32, "hidden_act": "mish"})"), "hidden_act is \"mish\", not an activation"));
  CHECK(has(hf_error(llama + R"("hidden_size": 32, "tie_word_embeddings": 1})"), "tie_word_embeddings is 1, not true or false"));
  CHECK(has(hf_error(R"({"model_type": "gpt2", "n_layer": 1, "n_head": 2, "vocab_size": 10})"), "missing \"hidden_size\""));
  CHECK(has(hf_error(llama + R"("hidden_size": 32, "rope_theta": 1})"), "rope_theta is 1, not a number in [1"));
  CHECK(has(hf_error(llama + R"("hidden_size": 32, "rope_parameters": 5})"), "rope_parameters is 5, not an object"));
  // Rotary's base as transformers 5 writes it, and as earlier versions did.
  CHECK(read_hf_config(nlohmann::json::parse(llama + R"("hidden_size": 32, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}})"))
            .config.rope_theta == 500000.0);
  CHECK(read_hf_config(nlohmann::json::parse(llama + R"("hidden_size": 32, "rope_theta": 1e6})")).config.rope_theta == 1e6);
  // null means the default.
  CHECK(read_hf_config(nlohmann::json::parse(llama + R"("hidden_size": 32, "num_key_value_heads": null})")).config.kv() == 4);
  CHECK(read_hf_config(nlohmann::json::parse(llama + R"("hidden_size": 32, "rope_theta": null})")).config.rope_theta == 10000.0);
  CHECK_THROWS_AS(read_hf_config_file(hf_dir + "no-such-config.json"), io_error);
}

// transformers 5.25's ROPE_INIT_FUNCTIONS["llama3"] / ["linear"] on a LlamaConfig with
// hidden_size 64, 4 heads (head_dim 16), rope_theta 500000 and Llama-3.1's rope_scaling
// (factor 8, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192), or
// {"rope_type": "linear", "factor": 4}: the inv_freq tensors it returns, printed with repr
// (float32, so 1e-6 relative). Pairs 0-3 keep their frequency, 4 is interpolated, 5-7 divided.
const std::vector<double> transformers_llama3_inv_freq{1.0, 0.193922758102417, 0.03760603070259094, 0.00729266507551074,
                                                       0.0005248460220173001, 3.428102354519069e-05, 6.647869668086059e-06,
                                                       1.289173155782919e-06};
const std::vector<double> transformers_linear_inv_freq{0.25, 0.04848068952560425, 0.009401507675647736, 0.001823166268877685,
                                                       0.0003535533614922315, 6.856204709038138e-05, 1.3295739336172119e-05,
                                                       2.578346311565838e-06};

TEST_CASE("rope_scaling: llama3 and linear frequencies are transformers', under every spelling") {
  const std::string llama = R"({"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 4, "hidden_size": 64,
                                "intermediate_size": 64, "vocab_size": 100, "max_position_embeddings": 131072, )";
  const auto freqs = [&](const std::string& rest) {
    hf_model m = read_hf_config(nlohmann::json::parse(llama + rest), "c.json");
    m.config.seq = 4;
    m.config.batch = 1;
    const model_graph g = build_hf(m);
    const op_attrs q = g[*find_vertex(g, "model.layers.0.self_attn.rotary_q")].attrs;
    CHECK(g[*find_vertex(g, "model.layers.0.self_attn.rotary_k")].attrs.rotary_frequencies == q.rotary_frequencies);
    return q.rotary_frequencies;
  };
  const auto near = [](const std::vector<double>& got, const std::vector<double>& want) {
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-6));
  };
  const std::string l31 = R"("factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192)";
  // transformers 4's rope_scaling, with rope_type or its legacy spelling type; transformers 5's rope_parameters.
  near(freqs(R"("rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", )" + l31 + "}}"), transformers_llama3_inv_freq);
  near(freqs(R"("rope_theta": 500000.0, "rope_scaling": {"type": "llama3", )" + l31 + "}}"), transformers_llama3_inv_freq);
  near(freqs(R"("rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", )" + l31 + "}}"), transformers_llama3_inv_freq);
  // original_max_position_embeddings: the config's own member first, else max_position_embeddings (transformers 5).
  near(freqs(R"("rope_theta": 500000.0, "original_max_position_embeddings": 8192, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})"),
       transformers_llama3_inv_freq);
  const std::vector<double> fallback = freqs(R"("rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0}})");  // 131072 positions: pair 4 is kept, not interpolated
  CHECK(fallback[4] == doctest::Approx(std::pow(500000.0, -8.0 / 16)).epsilon(1e-12));
  CHECK(fallback[7] == doctest::Approx(std::pow(500000.0, -14.0 / 16) / 8).epsilon(1e-12));
  near(freqs(R"("rope_theta": 500000.0, "rope_scaling": {"rope_type": "linear", "factor": 4.0}})"), transformers_linear_inv_freq);
  // No scaling: the op's own base^(-2i/D), no list.
  CHECK(freqs(R"("rope_theta": 500000.0, "rope_scaling": null})").empty());
  CHECK(freqs(R"("rope_theta": 500000.0, "rope_scaling": {"rope_type": "default"}})").empty());
  CHECK(freqs(R"("rope_parameters": {"rope_theta": 500000.0}})").empty());
  CHECK(freqs(R"("rope_theta": 500000.0})").empty());
  // A written config reads back to the same scaling (autoshard synth).
  const hf_model m = read_hf_config(nlohmann::json::parse(llama + R"("rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", )" + l31 + "}}"));
  CHECK(m.config.rope_scaling.type == "llama3");
  CHECK(read_hf_config(to_hf_config(m)).config.rope_scaling == m.config.rope_scaling);
  const hf_model lin = read_hf_config(nlohmann::json::parse(llama + R"("rope_scaling": {"type": "linear", "factor": 2.5}})"));
  CHECK(read_hf_config(to_hf_config(lin)).config.rope_scaling == lin.config.rope_scaling);
  CHECK_FALSE(to_hf_config(read_hf_config(nlohmann::json::parse(llama + "\"rope_theta\": 1e4}"))).contains("rope_scaling"));
}

// transformers 5.25's _compute_dynamic_ntk_parameters on a LlamaConfig with hidden_size 64, 4
// heads (head_dim 16), max_position_embeddings 4096, rope_theta 500000 and rope_scaling
// {"rope_type": "dynamic", "factor": 2.0}, at seq_len torch.tensor(10000) (as its forward's
// dynamic_rope_update passes it): the inv_freq it returns, printed with repr, computed under
// tests/client/real_weights_test.py's float64_everywhere (its scaled base stays float32, as on
// its seq_len tensor; the powers float64), so to 1e-12.
const std::vector<double> transformers_dynamic_inv_freq{1.0, 0.1597588678503935, 0.025522895856839495, 0.004077508946352177,
                                                        0.0006514182129190746, 0.00010406983619307795, 1.6626079207582038e-05,
                                                        2.6561635909942743e-06};

TEST_CASE("rope_scaling: dynamic frequencies are transformers' at the plan's sequence past max_position_embeddings") {
  const std::string llama = R"({"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 4, "hidden_size": 64,
                                "intermediate_size": 64, "vocab_size": 100, "max_position_embeddings": 4096, "rope_theta": 500000.0, )";
  const auto freqs = [&](const std::string& rest, int seq) {
    hf_model m = read_hf_config(nlohmann::json::parse(llama + rest), "c.json");
    m.config.seq = seq;
    m.config.batch = 1;
    const model_graph g = build_hf(m);
    return g[*find_vertex(g, "model.layers.0.self_attn.rotary_q")].attrs.rotary_frequencies;
  };
  for (const char* member : {R"("rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})", R"("rope_scaling": {"type": "dynamic", "factor": 2.0}})",
                             R"("rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 500000.0}})"}) {
    CAPTURE(member);
    const hf_model m = read_hf_config(nlohmann::json::parse(llama + member), "c.json");
    CHECK(m.config.rope_scaling.type == "dynamic");
    CHECK(m.config.rope_scaling.original_max_positions == 4096);
    CHECK(m.notes.empty());
    const std::vector<double> f = freqs(member, 10000);
    REQUIRE(f.size() == transformers_dynamic_inv_freq.size());
    for (std::size_t i = 0; i < f.size(); ++i) CHECK(f[i] == doctest::Approx(transformers_dynamic_inv_freq[i]).epsilon(1e-12));
    // Up to max_position_embeddings transformers keeps its initial (default) inv_freq: the op's own.
    CHECK(freqs(member, 4096).empty());
    CHECK(freqs(member, 16).empty());
    // synth writes it back (max_position_embeddings as read, not the sequence: past it the base scales).
    const nlohmann::json written = to_hf_config(m);
    CHECK(written["max_position_embeddings"] == 4096);
    CHECK(read_hf_config(written).config.rope_scaling == m.config.rope_scaling);
  }
  CHECK(has(hf_error(llama + R"("rope_scaling": {"rope_type": "dynamic"}})"), "rope_scaling has no \"factor\", which rope type \"dynamic\" needs"));
  CHECK(has(hf_error(llama + R"("rope_scaling": {"rope_type": "dynamic", "factor": 1e7}})"), "rope_scaling.factor is 10000000.0, not a number in [1e-06, 1e+06]"));
  // Two turned dims: transformers' D / (D - 2) divides by zero; a base scaled past float32 is refused too.
  rope_scaling_config dyn;
  dyn.type = "dynamic";
  dyn.factor = 2.0;
  dyn.original_max_positions = 4096;
  CHECK_THROWS_WITH_AS(rope_frequencies(1e4, 2, dyn, 8192), doctest::Contains("at sequence 8192 turns 2 dims: its base's power D / (D - 2) needs D above 2"),
                       graph_error);
  CHECK(rope_frequencies(1e4, 2, dyn, 4096).empty());
  dyn.factor = 1e6;
  dyn.original_max_positions = 1;
  CHECK_THROWS_WITH_AS(rope_frequencies(1e12, 4, dyn, 1 << 25), doctest::Contains("(float32, as transformers computes it) is not a finite number above 1"),
                       graph_error);
}

// transformers 5.25's _compute_yarn_parameters (inv_freq, attention_factor) under
// tests/client/real_weights_test.py's float64_everywhere (so to 1e-12), printed with repr, on a
// Qwen2Config with hidden_size 64, 4 heads (head_dim 16), max_position_embeddings 131072 and
// Qwen2.5's yarn: rope_theta 1e6, {"factor": 4, "original_max_position_embeddings": 32768}; and
// with rope_theta 1e4, {"factor": 8, "original_max_position_embeddings": 4096, "beta_fast": 16,
// "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": false}.
const std::vector<double> transformers_yarn_inv_freq{1.0, 0.17782794100389226, 0.03162277660168379, 0.004217559938927618,
                                                     0.0005, 4.445698525097307e-05, 7.905694150420949e-06, 1.4058533129758728e-06};
const double transformers_yarn_attention_factor = 1.138629436111989;
const std::vector<double> transformers_yarn_mscale_inv_freq{1.0, 0.31622776601683794, 0.1, 0.03162277660168379, 0.006221889068862788,
                                                            0.00043557547602531194, 0.000125, 3.952847075210474e-05};
const double transformers_yarn_mscale_attention_factor = 0.9495608824621653;

TEST_CASE("rope_scaling: yarn frequencies and attention factor are transformers'") {
  const std::string qwen = R"({"model_type": "qwen2", "num_hidden_layers": 1, "num_attention_heads": 4, "hidden_size": 64,
                               "intermediate_size": 64, "vocab_size": 100, "max_position_embeddings": 131072, )";
  const auto rotary = [&](const std::string& rest) {
    hf_model m = read_hf_config(nlohmann::json::parse(qwen + rest), "c.json");
    CHECK(m.notes.empty());
    CHECK(read_hf_config(to_hf_config(m)).config.rope_scaling == m.config.rope_scaling);  // synth writes it back
    m.config.seq = 4;
    m.config.batch = 1;
    const model_graph g = build_hf(m);
    const op_attrs q = g[*find_vertex(g, "model.layers.0.self_attn.rotary_q")].attrs;
    CHECK(g[*find_vertex(g, "model.layers.0.self_attn.rotary_k")].attrs == q);  // q and k both scaled
    return q;
  };
  const auto near = [](const op_attrs& got, const std::vector<double>& want, double factor) {
    REQUIRE(got.rotary_frequencies.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(got.rotary_frequencies[i] == doctest::Approx(want[i]).epsilon(1e-12));
    CHECK(got.scale == doctest::Approx(factor).epsilon(1e-14));
  };
  const std::string q25 = R"("factor": 4.0, "original_max_position_embeddings": 32768)";
  near(rotary(R"("rope_theta": 1e6, "rope_scaling": {"rope_type": "yarn", )" + q25 + "}}"), transformers_yarn_inv_freq,
       transformers_yarn_attention_factor);
  near(rotary(R"("rope_theta": 1e6, "rope_scaling": {"type": "yarn", )" + q25 + "}}"), transformers_yarn_inv_freq,
       transformers_yarn_attention_factor);
  near(rotary(R"("rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn", )" + q25 + "}}"), transformers_yarn_inv_freq,
       transformers_yarn_attention_factor);
  near(rotary(R"("rope_theta": 1e4, "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096,
                 "beta_fast": 16, "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": false}})"),
       transformers_yarn_mscale_inv_freq, transformers_yarn_mscale_attention_factor);
  // attention_factor given: taken as it is.
  CHECK(rotary(R"("rope_theta": 1e6, "rope_scaling": {"rope_type": "yarn", "attention_factor": 1.5, )" + q25 + "}}").scale == 1.5);
  // Without a scaling the rotary's scale stays 1 (and graph io writes none).
  CHECK(rotary(R"("rope_theta": 1e6})").scale == 1.0);
  // Bounds, naming the member.
  const std::string y = R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0, )";
  CHECK(has(hf_error(qwen + y + R"("beta_fast": 0}})"), "rope_scaling.beta_fast is 0, not a number in [1e-06, 1e+06]"));
  CHECK(has(hf_error(qwen + y + R"("mscale": -1}})"), "rope_scaling.mscale is -1, not a number in [0, 1e+06]"));
  CHECK(has(hf_error(qwen + y + R"("attention_factor": 0}})"), "rope_scaling.attention_factor is 0, not a number in [1e-06, 1e+06]"));
  CHECK(has(hf_error(qwen + y + R"("truncate": 1}})"), "rope_scaling.truncate is 1, not true or false"));
  CHECK(has(hf_error(qwen + R"("rope_scaling": {"rope_type": "yarn"}})"), "rope_scaling has no \"factor\", which rope type \"yarn\" needs"));
}

// transformers 5.25's _compute_longrope_parameters under tests/client/real_weights_test.py's
// float64_everywhere (so to 1e-12), printed with repr, on a Phi3Config with hidden_size 64, 4
// heads (head_dim 16), max_position_embeddings 131072, original_max_position_embeddings 4096
// (Phi-3-mini-128k's, at the config's top level), rope_theta 1e4 and rope_scaling longrope with
// the short and long factors below (no factor: 131072 / 4096 = 32), at seq_len None (its init:
// short) and 4097 (longrope_frequency_update's long ones past 4096).
const std::vector<double> longrope_short{1.0, 1.02, 1.05, 1.1, 1.3, 1.6, 2.0, 2.5}, longrope_long{1.0, 1.5, 2.5, 4.0, 8.0, 16.0, 24.0, 32.0};
const std::vector<double> transformers_longrope_short_inv_freq{1.0, 0.3100272215851352, 0.09523809523809523, 0.02874797872880345,
                                                               0.007692307692307693, 0.001976423537605237, 0.0005, 0.00012649110640673515};
const std::vector<double> transformers_longrope_long_inv_freq{1.0, 0.21081851067789195, 0.04, 0.007905694150420948, 0.00125,
                                                              0.00019764235376052369, 4.1666666666666665e-05, 9.882117688026186e-06};
const double transformers_longrope_attention_factor = 1.1902380714238083;

TEST_CASE("rope_scaling: longrope frequencies (short up to original_max_position_embeddings, long past it) are transformers'") {
  const auto list = [](const std::vector<double>& v) { return nlohmann::json(v).dump(); };
  const std::string phi = R"({"model_type": "phi3", "num_hidden_layers": 1, "num_attention_heads": 4, "hidden_size": 64,
                              "intermediate_size": 64, "vocab_size": 100, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, )";
  const std::string member = R"("rope_scaling": {"rope_type": "longrope", "short_factor": )" + list(longrope_short) +
                             R"(, "long_factor": )" + list(longrope_long) + "}}";
  const hf_model m = read_hf_config(nlohmann::json::parse(phi + member), "c.json");
  CHECK(m.notes.empty());
  CHECK(m.config.rope_scaling.factor == 32.0);
  CHECK(m.config.rope_scaling.original_max_positions == 4096);
  CHECK(read_hf_config(to_hf_config(m)).config.rope_scaling == m.config.rope_scaling);  // synth writes it back
  const auto rotary = [&](int seq) {
    hf_model s = m;
    s.config.seq = seq;
    s.config.batch = 1;
    const model_graph g = build_hf(s);
    return g[*find_vertex(g, "model.layers.0.self_attn.rotary_q")].attrs;
  };
  for (const auto& [seq, want] : {std::pair<int, const std::vector<double>*>{4096, &transformers_longrope_short_inv_freq},
                                  {4097, &transformers_longrope_long_inv_freq}}) {
    const int n = seq;  // a structured binding: Clang 14's CAPTURE cannot take it
    CAPTURE(n);
    const op_attrs a = rotary(seq);
    REQUIRE(a.rotary_frequencies.size() == want->size());
    for (std::size_t i = 0; i < want->size(); ++i) CHECK(a.rotary_frequencies[i] == doctest::Approx((*want)[i]).epsilon(1e-12));
    CHECK(a.scale == doctest::Approx(transformers_longrope_attention_factor).epsilon(1e-14));
  }
  // Phi3Config reads an older "su" or "yarn" as "longrope".
  for (const char* older : {"su", "yarn"}) {
    CAPTURE(older);
    std::string given = member;
    given.replace(given.find("longrope"), 8, older);
    CHECK(read_hf_config(nlohmann::json::parse(phi + given)).config.rope_scaling == m.config.rope_scaling);
  }
  CHECK(has(hf_error(phi + R"("rope_scaling": {"rope_type": "longrope", "long_factor": [1, 2]}})"),
            "rope_scaling has no \"short_factor\", which rope type \"longrope\" needs"));
  CHECK(has(hf_error(phi + R"("rope_scaling": {"rope_type": "longrope", "short_factor": [1, 2], "long_factor": [1, 2]}})"),
            "rope scaling's short_factor has 2 factors, but the rotaries turn 16 dims of each head: one a pair, 8, is needed"));
  CHECK(has(hf_error(phi + R"("rope_scaling": {"rope_type": "longrope", "short_factor": [1, 0], "long_factor": [1, 2]}})"),
            "rope_scaling.short_factor[1] is 0, not a number in [1e-06, 1e+06]"));
}

TEST_CASE("rope rule: a dynamic or longrope graph re-sized to another sequence is the graph built there, on both sides of the threshold") {
  // A graph built at s1 and re-sized (with_batch_seq: verify --seq, --tokens of another length)
  // to s2 turns as transformers does at s2: its rotaries' frequencies the build's at s2, bit for
  // bit; dynamic's threshold is max_position_embeddings (4096), longrope's
  // original_max_position_embeddings (4096).
  const std::string head = R"({"num_hidden_layers": 1, "num_attention_heads": 4, "hidden_size": 64, "intermediate_size": 64, "vocab_size": 100, )";
  const auto list = [](const std::vector<double>& v) { return nlohmann::json(v).dump(); };
  const std::string dynamic = head + R"("model_type": "llama", "max_position_embeddings": 4096, "rope_theta": 500000.0,
                                        "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})";
  const std::string longrope = head + R"("model_type": "phi3", "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
                                         "rope_scaling": {"rope_type": "longrope", "short_factor": )" + list(longrope_short) +
                               R"(, "long_factor": )" + list(longrope_long) + "}}";
  for (const std::string* text : {&dynamic, &longrope}) {
    const hf_model m = read_hf_config(nlohmann::json::parse(*text), "c.json");
    CAPTURE(m.config.rope_scaling.type);
    const auto built = [&](int seq) {
      hf_model s = m;
      s.config.seq = seq;
      s.config.batch = 1;
      return build_hf(s);
    };
    const std::vector<int> seqs{16, 4096, 4097, 10000};
    for (const int s1 : seqs)
      for (const int s2 : seqs) {
        CAPTURE(s1);
        CAPTURE(s2);
        const model_graph want = built(s2), got = with_batch_seq(built(s1), 0, s2);
        REQUIRE(boost::num_vertices(got) == boost::num_vertices(want));
        int rotaries = 0;
        for (vertex_t v = 0; v < boost::num_vertices(want); ++v) {
          CHECK(got[v].shape == want[v].shape);
          CHECK(got[v].attrs == want[v].attrs);  // frequencies and rule bit for bit
          rotaries += want[v].kind == op_kind::rotary;
        }
        CHECK(rotaries == 2);
      }
    // The rule survives a graph file (a plan's graph), and the graph read back re-sizes as well.
    const model_graph short_one = built(16);
    const model_graph read = from_json(to_json(short_one));
    const vertex_t q = *find_vertex(read, "model.layers.0.self_attn.rotary_q");
    CHECK(read[q].attrs == short_one[q].attrs);
    CHECK(read[q].attrs.rotary_rule.kind != rope_rule_kind::none);
    CHECK(with_batch_seq(read, 0, 10000)[q].attrs == built(10000)[q].attrs);
    // Only the sequence moves them: another batch keeps them.
    CHECK(with_batch_seq(built(10000), 3, 0)[q].attrs == built(10000)[q].attrs);
  }
  // The two sides differ (the check above could not pass by accident): past the threshold the
  // frequencies are transformers' grown (dynamic) or long (longrope) ones.
  // The first rotary's attributes of `config` built at sequence `from`, re-sized to `to`.
  const auto resized = [](const std::string& config, std::int64_t from, std::int64_t to) {
    hf_model m = read_hf_config(nlohmann::json::parse(config), "c.json");
    m.config.seq = static_cast<int>(from);
    m.config.batch = 1;
    const model_graph g = with_batch_seq(build_hf(m), 0, to);
    return g[*find_vertex(g, "model.layers.0.self_attn.rotary_q")].attrs;
  };
  const auto matches = [](const std::vector<double>& got, const auto& want) {
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-12));
  };
  matches(resized(dynamic, 16, 10000).rotary_frequencies, transformers_dynamic_inv_freq);
  const op_attrs lq = resized(longrope, 10000, 4096);
  matches(lq.rotary_frequencies, transformers_longrope_short_inv_freq);
  CHECK(lq.scale == doctest::Approx(transformers_longrope_attention_factor).epsilon(1e-14));  // the same at every length
}

TEST_CASE("rope_scaling: a type autoshard does not compute is noted and kept, bad numbers are refused, naming the member") {
  const std::string llama = R"({"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 4, "hidden_size": 64,
                                "intermediate_size": 64, "vocab_size": 100, "max_position_embeddings": 4096, )";
  const std::string l3 = R"("rope_scaling": {"rope_type": "llama3", )";
  // A plan's shapes and prices do not depend on the frequencies: Phi-3's older su plans as its
  // model, the rotaries at base^(-2i/D), with a note saying so; synth writes the member back as given.
  for (const auto& [member, type] : {std::pair<std::string, std::string>{R"("rope_parameters": {"rope_type": "su"})", "su"},
                                     {R"("rope_scaling": {"type": "su"})", "su"}}) {
    const std::string t = type;  // a structured binding: Clang 14's CAPTURE cannot take it
    CAPTURE(t);
    const hf_model m = read_hf_config(nlohmann::json::parse(llama + member + "}"));
    CHECK(m.config.rope_scaling.uncomputed == type);
    CHECK(m.config.rope_scaling.type.empty());
    CHECK(rope_frequencies(m.config.rope_theta, 16, m.config.rope_scaling, m.config.seq).empty());
    REQUIRE(m.notes.size() == 1);
    CHECK(m.notes[0] == "rope type '" + type + "' (rope_scaling) is not computed: the rotaries turn at rope_theta^(-2i/D), which the "
                        "plan's shapes and prices do not depend on, and verify runs them so (computed: \"default\", \"linear\", \"llama3\", \"dynamic\", \"yarn\", \"longrope\")");
    const nlohmann::json written = to_hf_config(m);
    CHECK(written["rope_scaling"] == nlohmann::json::parse(member.substr(member.find('{'))));
    CHECK(read_hf_config(written).config.rope_scaling == m.config.rope_scaling);
  }
  CHECK(has(hf_error(llama + R"("rope_scaling": {"rope_type": 3}})"), "rope_scaling.rope_type is 3, not a string"));
  CHECK(has(hf_error(llama + R"("rope_scaling": "llama3"})"), "rope_scaling is \"llama3\", not an object"));
  CHECK(has(hf_error(llama + R"("rope_parameters": {"full_attention": {"rope_type": "default"}}})"),
            "rope_parameters.full_attention is a rope configuration of its own (one per layer type)"));
  CHECK(has(hf_error(llama + R"("rope_scaling": {"rope_type": "linear"}})"), "rope_scaling has no \"factor\", which rope type \"linear\" needs"));
  CHECK(has(hf_error(llama + R"("rope_scaling": {"rope_type": "linear", "factor": 0}})"), "rope_scaling.factor is 0, not a number in [1e-06, 1e+06]"));
  CHECK(has(hf_error(llama + R"("rope_scaling": {"rope_type": "linear", "factor": -2.0}})"), "rope_scaling.factor is -2.0, not a number"));
  CHECK(has(hf_error(llama + R"("rope_scaling": {"rope_type": "linear", "factor": "8"}})"), "rope_scaling.factor is \"8\", not a number"));
  CHECK(has(hf_error(llama + l3 + R"("factor": 8.0, "high_freq_factor": 4.0}})"), "rope_scaling has no \"low_freq_factor\", which rope type \"llama3\" needs"));
  CHECK(has(hf_error(llama + l3 + R"("factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0}})"),
            "rope_scaling has high_freq_factor 4.0, not above its low_freq_factor 4.0"));
  CHECK(has(hf_error(llama + l3 + R"("factor": 8.0, "low_freq_factor": 0, "high_freq_factor": 4.0}})"), "rope_scaling.low_freq_factor is 0, not a number"));
  CHECK(has(hf_error(llama + l3 + R"("factor": 8.0, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 0}})"),
            "rope_scaling.original_max_position_embeddings is 0, not an integer in [1, 16777216]"));
  CHECK(has(hf_error(llama + l3 + R"("factor": 8.0, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 81.5}})"),
            "rope_scaling.original_max_position_embeddings is 81.5, not an integer"));
}

TEST_CASE("every vertex of every family's graph has a replicated strategy and finite costs") {
  const device_mesh mesh = make_mesh_2d(2, 2, 25e9, 300e9);
  for (const char* file : {"opt-125m.json", "pythia-160m.json", "bloom-560m.json", "falcon-7b.json", "gemma-2b.json",
                           "phi-3-mini-4k.json", "qwen2-0.5b.json", "roberta-base.json"}) {
    CAPTURE(file);
    hf_model m = read_hf_config_file(hf_dir + file);
    transformer_config& c = m.config;
    c.layers = 1;
    c.hidden = 64;
    c.heads = 4;
    c.kv_heads = c.kv_heads > 0 ? std::min(c.kv_heads, 2) : 0;  // GQA and multi-query stay so
    c.head_size = c.head_size > 0 ? 32 : 0;
    c.ffn = 96;
    c.vocab = 80;
    if (c.embed_proj > 0) c.embed_proj = 64;
    c.seq = 8;
    c.batch = 4;
    c.mode = m.model_type == "roberta" ? run_mode::inference : run_mode::training;
    const model_graph g = build_hf(m);
    strategy_options opt;
    opt.pricing.mode = c.mode;
    const auto all = enumerate_all_strategies(g, mesh, opt);
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
      CAPTURE(g[v].name);
      REQUIRE(!all[v].empty());
      bool replicated = false;
      for (const strategy& s : all[v]) {
        CHECK(std::isfinite(s.seconds()));
        replicated = replicated || (s.output.is_replicated() && s.comm_seconds == 0.0);
      }
      CHECK(replicated);
    }
    for (auto [it, end] = boost::edges(g); it != end; ++it) {
      const cost_matrix cm = resharding_costs(g, *it, all[boost::source(*it, g)], all[boost::target(*it, g)], mesh, opt);
      for (double x : cm.values) REQUIRE((std::isfinite(x) && x >= 0));
    }
  }
}

// transformers 5.25's GPTNeoXForCausalLM(GPTNeoXConfig(hidden_size=64, num_attention_heads=4,
// rotary_pct=0.5, rope_scaling={"rope_type": "linear", "factor": 4.0})).gpt_neox.rotary_emb.inv_freq
// (R = int(16 x 0.5) = 8: four pairs) and Phi3ForCausalLM(Phi3Config(hidden_size=96,
// num_attention_heads=4, partial_rotary_factor=0.75)).model.rotary_emb.inv_freq (R = int(24 x
// 0.75) = 18: nine pairs, 10000^(-2i/18)), printed with repr (float32: 1e-6 relative).
const std::vector<double> transformers_neox_partial_linear_inv_freq{0.25, 0.02500000037252903, 0.0024999999441206455,
                                                                    0.0002500000118743628};
const std::vector<double> transformers_phi3_partial_inv_freq{1.0, 0.35938137769699097, 0.1291549652814865, 0.04641588404774666,
                                                             0.01668100617825985, 0.005994841456413269, 0.002154434332624078,
                                                             0.0007742635789327323, 0.00027825593133457005};

TEST_CASE("partial rotary: GPT-NeoX's rotary_pct and Phi's partial_rotary_factor turn transformers' first int(head_dim x part) dims") {
  const auto small = [](hf_model m) {
    m.config.layers = 1;
    m.config.seq = 4;
    m.config.batch = 1;
    return build_hf(m);
  };
  // Pythia-160m: rotary_pct 0.25 of heads of 64, the first 16 dims, pair i at 10000^(-2i/16).
  const hf_model py = read_hf_config_file(hf_dir + "pythia-160m.json");
  CHECK(py.config.rotary_pct == 0.25);
  CHECK(py.config.rotary_dims() == 16);
  const model_graph pg = small(py);
  for (const char* r : {"gpt_neox.layers.0.attention.rotary_q", "gpt_neox.layers.0.attention.rotary_k"}) {
    CAPTURE(r);
    const op_attrs& a = pg[*find_vertex(pg, r)].attrs;
    CHECK(a.rotary_dims == 16);
    CHECK(a.rotary_half);
    CHECK(a.rotary_frequencies.empty());
    CHECK(rotary_frequency(a, 1, 64) == std::pow(10000.0, -2.0 / 16.0));
  }
  const std::string neox = R"({"model_type": "gpt_neox", "num_hidden_layers": 1, "num_attention_heads": 4, "hidden_size": 64,
                               "intermediate_size": 128, "vocab_size": 100)";
  const auto pct = [](const std::string& text) { return read_hf_config(nlohmann::json::parse(text), "c.json").config.rotary_pct; };
  CHECK(pct(neox + "}") == 0.25);  // GPTNeoXConfig's default
  CHECK(pct(neox + R"(, "rotary_pct": 1.0})") == 1.0);
  CHECK(pct(neox + R"(, "partial_rotary_factor": 0.5})") == 0.25);  // GPTNeoXConfig reads rotary_pct only
  // transformers 5 writes it in rope_parameters, which comes first.
  CHECK(pct(neox + R"(, "rotary_pct": 1.0, "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5, "rope_type": "default"}})") == 0.5);
  {
    const model_graph g = small(read_hf_config(nlohmann::json::parse(neox + R"(, "rotary_pct": 1.0})")));
    CHECK(g[*find_vertex(g, "gpt_neox.layers.0.attention.rotary_q")].attrs.rotary_dims == 0);  // the whole head
  }
  // Scaled frequencies are those of the R turned dims: transformers' inv_freq.
  {
    const model_graph g = small(read_hf_config(nlohmann::json::parse(neox + R"(, "rotary_pct": 0.5, "rope_scaling": {"rope_type": "linear", "factor": 4.0}})")));
    const op_attrs& a = g[*find_vertex(g, "gpt_neox.layers.0.attention.rotary_q")].attrs;
    CHECK(a.rotary_dims == 8);
    REQUIRE(a.rotary_frequencies.size() == transformers_neox_partial_linear_inv_freq.size());
    for (std::size_t i = 0; i < a.rotary_frequencies.size(); ++i)
      CHECK(a.rotary_frequencies[i] == doctest::Approx(transformers_neox_partial_linear_inv_freq[i]).epsilon(1e-6));
  }
  // Phi-3 / Phi-4-mini: partial_rotary_factor (the config's own member, or rope_parameters').
  const std::string phi3 = R"({"model_type": "phi3", "num_hidden_layers": 1, "num_attention_heads": 4, "hidden_size": 96,
                               "intermediate_size": 128, "vocab_size": 100)";
  for (const std::string& member : {std::string(R"(, "partial_rotary_factor": 0.75})"),
                                    std::string(R"(, "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.75}})")}) {
    CAPTURE(member);
    const hf_model m = read_hf_config(nlohmann::json::parse(phi3 + member));
    CHECK(m.config.rotary_dims() == 18);
    const model_graph g = small(m);
    const op_attrs& a = g[*find_vertex(g, "model.layers.0.self_attn.rotary_k")].attrs;
    CHECK(a.rotary_dims == 18);
    for (std::size_t i = 0; i < transformers_phi3_partial_inv_freq.size(); ++i)
      CHECK(rotary_frequency(a, static_cast<std::int64_t>(i), 24) == doctest::Approx(transformers_phi3_partial_inv_freq[i]).epsilon(1e-6));
  }
  CHECK(pct(phi3 + "}") == 1.0);
  // The part is written back, and reads back to the same graph (GPT-NeoX's always: its default is not 1).
  for (const std::string& text : {neox + R"(, "rotary_pct": 0.5})", neox + R"(, "rotary_pct": 1.0})", phi3 + R"(, "partial_rotary_factor": 0.75})"}) {
    CAPTURE(text);
    const hf_model m = read_hf_config(nlohmann::json::parse(text));
    const nlohmann::json written = to_hf_config(m);
    CHECK(written.value(m.model_type == "gpt_neox" ? "rotary_pct" : "partial_rotary_factor", -1.0) == m.config.rotary_pct);
    const hf_model back = read_hf_config(written);
    CHECK(back.config.rotary_pct == m.config.rotary_pct);
    CHECK(to_json(small(back)) == to_json(small(m)));
  }
  CHECK_FALSE(to_hf_config(read_hf_config(nlohmann::json::parse(phi3 + "}"))).contains("partial_rotary_factor"));
  // Refused, naming the member and the numbers: an odd or empty part, a part out of [0, 1], and
  // a part where transformers' family turns the whole head (LLaMA's apply_rotary_pos_emb).
  CHECK(has(hf_error(neox + R"(, "rotary_pct": 0.2})"),
            "c.json: rotary_pct 0.2 of heads of 16 turns int(16 x 0.2) = 3 dims: rotary turns an even number of dims, at least 2"));
  CHECK(has(hf_error(neox + R"(, "rotary_pct": 0})"), "rotary_pct 0 of heads of 16 turns int(16 x 0) = 0 dims"));
  CHECK(has(hf_error(neox + R"(, "rotary_pct": 1.5})"), "c.json: rotary_pct is 1.5, not a number in [0, 1]"));
  CHECK(has(hf_error(phi3 + R"(, "rope_parameters": {"partial_rotary_factor": "half"}})"),
            "rope_parameters.partial_rotary_factor is \"half\", not a number"));
  const std::string llama = R"({"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 4, "hidden_size": 64,
                                "intermediate_size": 128, "vocab_size": 100, "partial_rotary_factor": )";
  CHECK(has(hf_error(llama + "0.5}"), "c.json: partial_rotary_factor 0.5 of heads of 16 turns int(16 x 0.5) = 8 dims, but "
                                      "transformers' llama turns the whole head"));
  CHECK(pct(llama + "1.0}") == 1.0);
  // The builder refuses a part it cannot turn, as transformers would fail.
  transformer_config c = py.config;
  c.rotary_pct = 0.2;  // heads of 64: int(12.8) = 12 dims, even
  CHECK(c.rotary_dims() == 12);
  c.rotary_pct = 0.01;  // 0 dims
  CHECK_THROWS_WITH_AS(build_gpt_neox(c), doctest::Contains("rotary_pct 0.01 of heads of 64 turns 0 dims"), graph_error);
}

// Each family's norms' epsilon as transformers 5.25 reads it: the key of its configuration class
// and that class's default (configuration_<family>.py), OPT's fixed in modeling_opt.py
// (nn.LayerNorm's 1e-5, no key). The published configs give their own.
TEST_CASE("norm epsilon: each family's key and transformers' default, on every norm, written back") {
  struct family {
    const char* file;
    const char* key;  // nullptr: OPT's, not read
    double fallback, published;
  };
  const family families[] = {
      {"gpt2.json", "layer_norm_epsilon", 1e-5, 1e-5},      {"bert-base-uncased.json", "layer_norm_eps", 1e-12, 1e-12},
      {"roberta-base.json", "layer_norm_eps", 1e-12, 1e-5}, {"opt-125m.json", nullptr, 1e-5, 1e-5},
      {"pythia-160m.json", "layer_norm_eps", 1e-5, 1e-5},   {"bloom-560m.json", "layer_norm_epsilon", 1e-5, 1e-5},
      {"qwen2-0.5b.json", "rms_norm_eps", 1e-6, 1e-6},      {"mistral-7b-v0.1.json", "rms_norm_eps", 1e-6, 1e-5},
      {"llama-2-7b.json", "rms_norm_eps", 1e-6, 1e-5},      {"gemma-2b.json", "rms_norm_eps", 1e-6, 1e-6},
      {"falcon-7b.json", "layer_norm_epsilon", 1e-5, 1e-5}, {"phi-3-mini-4k.json", "rms_norm_eps", 1e-5, 1e-5},
      {"llama-3.1-8b.json", "rms_norm_eps", 1e-6, 1e-5}};
  const auto norms_epsilons = [](hf_model m) {  // every norm's epsilon in a 2-layer graph
    m.config.layers = 2;
    m.config.seq = 4;
    m.config.batch = 1;
    const model_graph g = build_hf(m);
    std::vector<double> eps;
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
      if (g[v].kind == op_kind::layer_norm || g[v].kind == op_kind::rms_norm) eps.push_back(g[v].attrs.epsilon);
    return eps;
  };
  for (const family& f : families) {
    CAPTURE(f.file);
    std::ifstream in(hf_dir + f.file);
    nlohmann::json j = nlohmann::json::parse(in);
    const hf_model published = read_hf_config(j);
    CHECK(published.config.norm_epsilon == f.published);
    const std::vector<double> eps = norms_epsilons(published);
    CHECK(eps.size() >= 3);  // one or two per layer, and the final (or the embeddings') norm
    CHECK(std::all_of(eps.begin(), eps.end(), [&](double e) { return e == f.published; }));
    if (f.key) j.erase(f.key);
    CHECK(read_hf_config(j).config.norm_epsilon == f.fallback);  // the key absent: transformers' default
    if (f.key) j[f.key] = nullptr;
    CHECK(read_hf_config(j).config.norm_epsilon == f.fallback);  // null: the default, as every key
    // Another epsilon reaches every norm, and to_hf_config writes it back under the family's key.
    if (!f.key) continue;
    j[f.key] = 0.25;
    const hf_model m = read_hf_config(j);
    const std::vector<double> quarter = norms_epsilons(m);
    CHECK(std::all_of(quarter.begin(), quarter.end(), [](double e) { return e == 0.25; }));
    const nlohmann::json written = to_hf_config(m);
    CHECK(written.at(f.key) == 0.25);
    CHECK(read_hf_config(written).config.norm_epsilon == 0.25);
  }
  // OPT's norms are fixed at 1e-5: a key is not read, and another epsilon cannot be written.
  nlohmann::json opt = nlohmann::json::parse(std::ifstream(hf_dir + "opt-125m.json"));
  opt["layer_norm_eps"] = 0.25;
  CHECK(read_hf_config(opt).config.norm_epsilon == 1e-5);
  CHECK_FALSE(to_hf_config(read_hf_config(opt)).contains("layer_norm_eps"));
  hf_model opt_other = read_hf_config(opt);
  opt_other.config.norm_epsilon = 1e-6;
  CHECK_THROWS_WITH_AS(to_hf_config(opt_other),
                       doctest::Contains("opt config: its norms' epsilon 1e-06 is not 1e-05, which transformers' opt fixes"), graph_error);
  // Read as graph files are checked: a finite number in (0, 1], an error naming the key and the value.
  const std::string qwen = R"({"model_type": "qwen2", "num_hidden_layers": 1, "num_attention_heads": 4, "hidden_size": 32,
                               "intermediate_size": 64, "vocab_size": 100, "rms_norm_eps": )";
  CHECK(has(hf_error(qwen + "0}"), "c.json: rms_norm_eps is 0, not a norm epsilon: a finite number in (0, 1]"));
  CHECK(has(hf_error(qwen + "-1e-06}"), "c.json: rms_norm_eps is -1e-06, not a norm epsilon"));
  CHECK(has(hf_error(qwen + "2}"), "c.json: rms_norm_eps is 2, not a norm epsilon"));
  CHECK(has(hf_error(qwen + "\"1e-6\"}"), "c.json: rms_norm_eps is \"1e-6\", not a number"));
  CHECK(read_hf_config(nlohmann::json::parse(qwen + "1}")).config.norm_epsilon == 1.0);
  // The builders refuse one as well, naming it.
  transformer_config c = transformer_config::gpt2(1, 64, 4);
  c.norm_epsilon = 0;
  CHECK_THROWS_WITH_AS(build_gpt2(c), doctest::Contains("gpt2 config: norm epsilon 0 is not a finite number in (0, 1]"), graph_error);
}

// modeling_gemma.py: GemmaRMSNorm returns norm(x) * (1 + weight), and GemmaModel multiplies the
// embeddings by hidden_size ** 0.5 in the weight's dtype (GemmaTextScaledWordEmbedding).
TEST_CASE("gemma: every norm scales by 1 + weight, the embeddings by sqrt(hidden) in the model's dtype") {
  nlohmann::json j = nlohmann::json::parse(std::ifstream(hf_dir + "gemma-2b.json"));
  hf_model m = read_hf_config(j);
  m.config.layers = 2;
  m.config.seq = 4;
  m.config.batch = 1;
  CHECK(m.config.gemma_scaling);
  const model_graph g = build_hf(m);
  int norms = 0;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].kind == op_kind::rms_norm) {
      CHECK(g[v].attrs.weight_offset == 1.0);
      ++norms;
    }
  CHECK(norms == 5);  // two a layer and the final norm
  const auto embed = find_vertex(g, "model.embed_tokens");
  REQUIRE(embed);
  CHECK(g[*embed].attrs.scale == 45.25);  // sqrt(2048) = 45.2548 in bfloat16, gemma-2b's torch_dtype
  j["torch_dtype"] = "float32";
  hf_model f32 = read_hf_config(j);
  f32.config.layers = 1;
  const model_graph g32 = build_hf(f32);
  CHECK(g32[*find_vertex(g32, "model.embed_tokens")].attrs.scale == static_cast<double>(static_cast<float>(std::sqrt(2048.0))));
  // Mistral and LLaMA: neither.
  nlohmann::json l = nlohmann::json::parse(std::ifstream(hf_dir + "llama-2-7b.json"));
  hf_model lm = read_hf_config(l);
  lm.config.layers = 1;
  CHECK_FALSE(lm.config.gemma_scaling);
  const model_graph lg = build_hf(lm);
  CHECK(lg[*find_vertex(lg, "model.embed_tokens")].attrs.scale == 1.0);
  CHECK(lg[*find_vertex(lg, "model.norm")].attrs.weight_offset == 0.0);
  // No key says it: a config of another model_type cannot carry it, nor a gemma one drop it.
  lm.config.gemma_scaling = true;
  CHECK_THROWS_WITH_AS(to_hf_config(lm), doctest::Contains("llama config: Gemma's scaling"), graph_error);
  m.config.gemma_scaling = false;
  CHECK_THROWS_WITH_AS(to_hf_config(m), doctest::Contains("gemma config: transformers' gemma scales its norms by 1 + weight"), graph_error);
}

TEST_CASE("sliding window: Mistral's, Phi-3's and Qwen2's read per layer as transformers applies them, and written back") {
  const auto windows = [](const hf_model& m) {
    hf_model s = m;
    s.config.seq = 8;  // below every window here but 4 and 5: a window at least the sequence is kept, it is the model
    s.config.batch = 1;
    const model_graph g = build_hf(s);
    std::vector<std::int64_t> w;
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
      if (g[v].kind == op_kind::attention) w.push_back(g[v].attrs.window);
    return w;
  };
  const auto read = [](const std::string& text) { return read_hf_config(nlohmann::json::parse(text), "c.json"); };
  const std::string tiny = R"("hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2, "num_hidden_layers": 3, "vocab_size": 32)";
  SUBCASE("Mistral: every layer; absent is MistralConfig's 4096, null none") {
    hf_model m = read_hf_config_file(hf_dir + "mistral-7b-v0.1.json");
    CHECK(m.config.sliding_window == 4096);
    m.config.layers = 2;
    CHECK(windows(m) == std::vector<std::int64_t>{4096, 4096});
    CHECK(read(R"({"model_type": "mistral", )" + tiny + "}").config.sliding_window == 4096);
    CHECK(read(R"({"model_type": "mistral", "sliding_window": null, )" + tiny + "}").config.sliding_window == 0);
    CHECK(windows(read(R"({"model_type": "mistral", "sliding_window": 4, )" + tiny + "}")) == std::vector<std::int64_t>{4, 4, 4});
    // a layer_types is not Mistral's: MistralModel masks every layer alike
    CHECK(windows(read(R"({"model_type": "mistral", "sliding_window": 4, "layer_types": ["full_attention"], )" + tiny + "}")) ==
          std::vector<std::int64_t>{4, 4, 4});
    // none is written as null, else transformers would take MistralConfig's 4096
    CHECK(to_hf_config(read(R"({"model_type": "mistral", "sliding_window": null, )" + tiny + "}"))["sliding_window"].is_null());
    CHECK(to_hf_config(read(R"({"model_type": "mistral", "sliding_window": 4, )" + tiny + "}"))["sliding_window"] == 4);
  }
  SUBCASE("Phi-3: every layer; absent is none") {
    const hf_model m = read_hf_config_file(hf_dir + "phi-3-mini-4k.json");
    CHECK(m.config.sliding_window == 2047);
    CHECK(read(R"({"model_type": "phi3", )" + tiny + "}").config.sliding_window == 0);
    CHECK(windows(read(R"({"model_type": "phi3", "sliding_window": 5, )" + tiny + "}")) == std::vector<std::int64_t>{5, 5, 5});
    CHECK(to_hf_config(m)["sliding_window"] == 2047);
  }
  SUBCASE("Qwen2: only with use_sliding_window, from max_window_layers on, or on the layers layer_types names") {
    CHECK(read_hf_config_file(hf_dir + "qwen2-0.5b.json").config.sliding_window == 0);
    CHECK(windows(read(R"({"model_type": "qwen2", "sliding_window": 4, )" + tiny + "}")) == std::vector<std::int64_t>{0, 0, 0});
    // Qwen2Config's default max_window_layers 28: none of 3 layers slides
    CHECK(windows(read(R"({"model_type": "qwen2", "use_sliding_window": true, "sliding_window": 4, )" + tiny + "}")) ==
          std::vector<std::int64_t>{0, 0, 0});
    const hf_model from1 = read(R"({"model_type": "qwen2", "use_sliding_window": true, "sliding_window": 4, "max_window_layers": 1, )" + tiny + "}");
    CHECK(windows(from1) == std::vector<std::int64_t>{0, 4, 4});
    CHECK(windows(read(R"({"model_type": "qwen2", "use_sliding_window": true, "max_window_layers": 2, )" + tiny + "}")) ==
          std::vector<std::int64_t>{0, 0, 4096});  // Qwen2Config's default window
    CHECK(windows(read(R"({"model_type": "qwen2", "use_sliding_window": true, "sliding_window": null, "max_window_layers": 0, )" + tiny +
                       "}")) == std::vector<std::int64_t>{0, 0, 0});
    const std::string typed = R"({"model_type": "qwen2", "use_sliding_window": true, "sliding_window": 5, "max_window_layers": 0,
                                 "layer_types": ["sliding_attention", "full_attention", "sliding_attention"], )" + tiny + "}";
    const hf_model t = read(typed);
    CHECK(windows(t) == std::vector<std::int64_t>{5, 0, 5});  // layer_types over max_window_layers
    // Written back: use_sliding_window, the window, max_window_layers, layer_types where the config named them.
    const nlohmann::json w1 = to_hf_config(from1), wt = to_hf_config(t);
    CHECK(w1["use_sliding_window"] == true);
    CHECK(w1["max_window_layers"] == 1);
    CHECK_FALSE(w1.contains("layer_types"));
    CHECK(wt["layer_types"] == nlohmann::json{"sliding_attention", "full_attention", "sliding_attention"});
    CHECK(windows(read_hf_config(w1)) == windows(from1));
    CHECK(windows(read_hf_config(wt)) == windows(t));
    CHECK(to_hf_config(read(R"({"model_type": "qwen2", )" + tiny + "}"))["use_sliding_window"] == false);
  }
  SUBCASE("bad windows are refused, naming the key and the value") {
    CHECK(has(hf_error(R"({"model_type": "mistral", "sliding_window": 0, )" + tiny + "}"), "c.json: sliding_window is 0, not an integer in [1, 16777216]"));
    CHECK(has(hf_error(R"({"model_type": "phi3", "sliding_window": -3, )" + tiny + "}"), "sliding_window is -3"));
    CHECK(has(hf_error(R"({"model_type": "qwen2", "use_sliding_window": true, "sliding_window": 4.5, )" + tiny + "}"), "sliding_window is 4.5"));
    CHECK(has(hf_error(R"({"model_type": "qwen2", "use_sliding_window": true, "layer_types": ["full_attention"], )" + tiny + "}"),
              "layer_types names 1 layer types for 3 layers"));
    CHECK(has(hf_error(R"({"model_type": "qwen2", "use_sliding_window": true, "layer_types": ["full_attention", "local", "full_attention"], )" +
                       tiny + "}"),
              "layer_types[1]"));
    CHECK(has(hf_error(R"({"model_type": "qwen2", "layer_types": ["full_attention", "sliding_attention", "full_attention"], )" + tiny + "}"),
              "layer_types[1] is a sliding layer, but the config has no sliding window (use_sliding_window is not true)"));
  }
}

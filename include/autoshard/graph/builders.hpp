#pragma once
/// Transformer graphs with Hugging Face names, so a plan maps onto a checkpoint:
///   auto g = autoshard::build_gpt2(autoshard::transformer_config::gpt2_124m());
///   autoshard::parameter_count(g);                         // 124'439'808 (tied embeddings)
///   autoshard::parameter_names(g, *autoshard::find_vertex(g, "transformer.h.0.attn.c_attn"));
///     // {"transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias"}
#include <string>  // std::string
#include <vector>  // std::vector

#include "model.hpp"     // model_graph, add_op, add_parameter
#include "strategy.hpp"  // run_mode

namespace autoshard {

/// Sizes of a transformer; the presets are the published models' configurations.
struct transformer_config {
  int layers = 12;
  int hidden = 768;
  int heads = 12;
  int kv_heads = 0;            ///< 0: same as heads (GQA when fewer)
  int ffn = 3072;              ///< MLP width
  int vocab = 50257;
  int max_positions = 1024;    ///< learned position table (GPT-2, BERT)
  int type_vocab = 2;          ///< BERT token types
  int seq = 1024;
  int batch = 8;
  dtype type = dtype::bf16;
  run_mode mode = run_mode::inference;  ///< training adds labels and a cross-entropy loss (GPT-2, LLaMA)

  int kv() const noexcept { return kv_heads > 0 ? kv_heads : heads; }
  int head_dim() const noexcept { return hidden / heads; }

  static transformer_config gpt2(int layers, int hidden, int heads) {
    transformer_config c;
    c.layers = layers;
    c.hidden = hidden;
    c.heads = heads;
    c.ffn = 4 * hidden;
    return c;
  }
  static transformer_config gpt2_124m() { return gpt2(12, 768, 12); }
  static transformer_config gpt2_355m() { return gpt2(24, 1024, 16); }
  static transformer_config gpt2_774m() { return gpt2(36, 1280, 20); }
  static transformer_config gpt2_1_5b() { return gpt2(48, 1600, 25); }
  static transformer_config bert(int layers, int hidden, int heads) {
    transformer_config c = gpt2(layers, hidden, heads);
    c.vocab = 30522;
    c.max_positions = 512;
    c.seq = 512;
    return c;
  }
  static transformer_config bert_base() { return bert(12, 768, 12); }
  static transformer_config bert_large() { return bert(24, 1024, 16); }
  static transformer_config llama(int layers, int hidden, int heads, int kv_heads, int ffn) {
    transformer_config c;
    c.layers = layers;
    c.hidden = hidden;
    c.heads = heads;
    c.kv_heads = kv_heads;
    c.ffn = ffn;
    c.vocab = 32000;
    c.max_positions = 0;
    c.seq = 2048;
    c.batch = 4;
    return c;
  }
  static transformer_config llama_7b() { return llama(32, 4096, 32, 32, 11008); }
  static transformer_config llama_70b() { return llama(80, 8192, 64, 8, 28672); }
};

namespace detail {
inline void check_config(const transformer_config& c, const char* what) {
  auto bad = [&](const std::string& why) { throw graph_error(std::string(what) + " config: " + why); };
  if (c.layers < 0 || c.hidden < 1 || c.heads < 1 || c.ffn < 1 || c.vocab < 1 || c.seq < 1 || c.batch < 1)
    bad("layers, hidden, heads, ffn, vocab, seq and batch must be positive");
  if (c.hidden % c.heads != 0)
    bad("hidden " + std::to_string(c.hidden) + " is not a multiple of heads " + std::to_string(c.heads));
  if (c.heads % c.kv() != 0)
    bad("heads " + std::to_string(c.heads) + " is not a multiple of kv_heads " + std::to_string(c.kv()));
}

struct builder {
  model_graph& g;
  dtype t;
  vertex_t param(const std::string& name, tensor_shape s) { return add_parameter(g, name, s, t); }
  vertex_t linear(const std::string& name, vertex_t x, std::int64_t in, std::int64_t out, bool bias, bool conv1d) {
    vertex_t w = param(name + ".weight", conv1d ? tensor_shape{in, out} : tensor_shape{out, in});
    op_attrs a;
    a.transposed_weight = conv1d;
    if (!bias) return add_op(g, op_kind::linear, name, {x, w}, a);
    vertex_t b = param(name + ".bias", {out});
    return add_op(g, op_kind::linear, name, {x, w, b}, a);
  }
  vertex_t layer_norm(const std::string& name, vertex_t x, std::int64_t h) {
    return add_op(g, op_kind::layer_norm, name, {x, param(name + ".weight", {h}), param(name + ".bias", {h})});
  }
  vertex_t rms_norm(const std::string& name, vertex_t x, std::int64_t h) {
    return add_op(g, op_kind::rms_norm, name, {x, param(name + ".weight", {h})});
  }
  vertex_t op(op_kind k, const std::string& name, std::initializer_list<vertex_t> xs, op_attrs a = {}) {
    return add_op(g, k, name, xs, std::move(a));
  }
  vertex_t slice(const std::string& name, vertex_t x, int axis, std::int64_t start, std::int64_t length) {
    op_attrs a;
    a.axis = axis;
    a.start = start;
    a.length = length;
    return add_op(g, op_kind::split, name, {x}, a);
  }
  vertex_t attention(const std::string& name, vertex_t q, vertex_t k, vertex_t v, int heads, int kv, bool causal) {
    op_attrs a;
    a.heads = heads;
    a.kv_heads = kv;
    a.causal = causal;
    return add_op(g, op_kind::attention, name, {q, k, v}, a);
  }
  void loss(const transformer_config& c, vertex_t logits) {
    if (c.mode != run_mode::training) return;
    vertex_t labels = add_input(g, "labels", {c.batch, c.seq}, dtype::i64);
    add_op(g, op_kind::cross_entropy, "loss", {logits, labels});
  }
};
}  // namespace detail

/// GPT-2 (GPT2LMHeadModel): learned positions, pre-norm blocks, Conv1D ([in,out]) weights,
/// fused c_attn split into q, k, v, causal attention, lm_head tied to transformer.wte.
inline model_graph build_gpt2(const transformer_config& c) {
  detail::check_config(c, "gpt2");
  if (c.seq > c.max_positions)
    throw graph_error("gpt2 config: seq " + std::to_string(c.seq) + " exceeds max_positions " + std::to_string(c.max_positions));
  model_graph g;
  detail::builder b{g, c.type};
  const std::int64_t H = c.hidden;
  vertex_t ids = add_input(g, "input_ids", {c.batch, c.seq}, dtype::i64);
  vertex_t pos = add_input(g, "position_ids", {1, c.seq}, dtype::i64);
  vertex_t wte = b.param("transformer.wte.weight", {c.vocab, H});
  vertex_t x = b.op(op_kind::embedding, "transformer.wte", {ids, wte});
  vertex_t p = b.op(op_kind::embedding, "transformer.wpe", {pos, b.param("transformer.wpe.weight", {c.max_positions, H})});
  x = b.op(op_kind::add, "transformer.embed_add", {x, p});
  x = b.op(op_kind::dropout, "transformer.drop", {x});
  for (int i = 0; i < c.layers; ++i) {
    const std::string n = "transformer.h." + std::to_string(i);
    vertex_t h = b.layer_norm(n + ".ln_1", x, H);
    vertex_t qkv = b.linear(n + ".attn.c_attn", h, H, 3 * H, true, true);
    vertex_t q = b.slice(n + ".attn.q", qkv, 2, 0, H);
    vertex_t k = b.slice(n + ".attn.k", qkv, 2, H, H);
    vertex_t v = b.slice(n + ".attn.v", qkv, 2, 2 * H, H);
    vertex_t a = b.attention(n + ".attn.attention", q, k, v, c.heads, c.heads, true);
    a = b.linear(n + ".attn.c_proj", a, H, H, true, true);
    x = b.op(op_kind::add, n + ".attn.residual", {x, a});
    h = b.layer_norm(n + ".ln_2", x, H);
    h = b.linear(n + ".mlp.c_fc", h, H, c.ffn, true, true);
    h = b.op(op_kind::gelu, n + ".mlp.act", {h});
    h = b.linear(n + ".mlp.c_proj", h, c.ffn, H, true, true);
    x = b.op(op_kind::add, n + ".mlp.residual", {x, h});
  }
  x = b.layer_norm("transformer.ln_f", x, H);
  vertex_t logits = b.op(op_kind::linear, "lm_head", {x, wte});  // tied: lm_head.weight is transformer.wte.weight
  b.loss(c, logits);
  return g;
}

/// BERT (BertModel, as bert-base-uncased: embeddings, post-norm encoder, tanh pooler).
inline model_graph build_bert(const transformer_config& c) {
  detail::check_config(c, "bert");
  if (c.seq > c.max_positions)
    throw graph_error("bert config: seq " + std::to_string(c.seq) + " exceeds max_positions " + std::to_string(c.max_positions));
  model_graph g;
  detail::builder b{g, c.type};
  const std::int64_t H = c.hidden;
  const std::string e = "bert.embeddings";
  vertex_t ids = add_input(g, "input_ids", {c.batch, c.seq}, dtype::i64);
  vertex_t tt = add_input(g, "token_type_ids", {c.batch, c.seq}, dtype::i64);
  vertex_t pos = add_input(g, "position_ids", {1, c.seq}, dtype::i64);
  vertex_t x = b.op(op_kind::embedding, e + ".word_embeddings", {ids, b.param(e + ".word_embeddings.weight", {c.vocab, H})});
  vertex_t p = b.op(op_kind::embedding, e + ".position_embeddings",
                    {pos, b.param(e + ".position_embeddings.weight", {c.max_positions, H})});
  vertex_t t = b.op(op_kind::embedding, e + ".token_type_embeddings",
                    {tt, b.param(e + ".token_type_embeddings.weight", {c.type_vocab, H})});
  x = b.op(op_kind::add, e + ".add_position", {x, p});
  x = b.op(op_kind::add, e + ".add_token_type", {x, t});
  x = b.layer_norm(e + ".LayerNorm", x, H);
  for (int i = 0; i < c.layers; ++i) {
    const std::string n = "bert.encoder.layer." + std::to_string(i);
    vertex_t q = b.linear(n + ".attention.self.query", x, H, H, true, false);
    vertex_t k = b.linear(n + ".attention.self.key", x, H, H, true, false);
    vertex_t v = b.linear(n + ".attention.self.value", x, H, H, true, false);
    vertex_t a = b.attention(n + ".attention.self.attention", q, k, v, c.heads, c.heads, false);
    a = b.linear(n + ".attention.output.dense", a, H, H, true, false);
    a = b.op(op_kind::add, n + ".attention.output.residual", {a, x});
    x = b.layer_norm(n + ".attention.output.LayerNorm", a, H);
    vertex_t h = b.linear(n + ".intermediate.dense", x, H, c.ffn, true, false);
    h = b.op(op_kind::gelu, n + ".intermediate.act", {h});
    h = b.linear(n + ".output.dense", h, c.ffn, H, true, false);
    h = b.op(op_kind::add, n + ".output.residual", {h, x});
    x = b.layer_norm(n + ".output.LayerNorm", h, H);
  }
  vertex_t first = b.slice("bert.pooler.first_token", x, 1, 0, 1);
  op_attrs flat;
  flat.dims = {c.batch, H};
  first = b.op(op_kind::reshape, "bert.pooler.flatten", {first}, flat);
  vertex_t pooled = b.linear("bert.pooler.dense", first, H, H, true, false);
  b.op(op_kind::tanh, "bert.pooler.activation", {pooled});
  return g;
}

/// LLaMA-style decoder (LlamaForCausalLM): RMSNorm, rotary (elementwise on q and k),
/// grouped-query attention, SwiGLU MLP, untied lm_head.
inline model_graph build_llama(const transformer_config& c) {
  detail::check_config(c, "llama");
  model_graph g;
  detail::builder b{g, c.type};
  const std::int64_t H = c.hidden, KV = static_cast<std::int64_t>(c.kv()) * c.head_dim();
  vertex_t ids = add_input(g, "input_ids", {c.batch, c.seq}, dtype::i64);
  vertex_t x = b.op(op_kind::embedding, "model.embed_tokens", {ids, b.param("model.embed_tokens.weight", {c.vocab, H})});
  for (int i = 0; i < c.layers; ++i) {
    const std::string n = "model.layers." + std::to_string(i);
    vertex_t h = b.rms_norm(n + ".input_layernorm", x, H);
    vertex_t q = b.linear(n + ".self_attn.q_proj", h, H, H, false, false);
    vertex_t k = b.linear(n + ".self_attn.k_proj", h, H, KV, false, false);
    vertex_t v = b.linear(n + ".self_attn.v_proj", h, H, KV, false, false);
    op_attrs rq, rk;
    rq.heads = c.heads;
    rk.heads = c.kv();
    q = b.op(op_kind::rotary, n + ".self_attn.rotary_q", {q}, rq);
    k = b.op(op_kind::rotary, n + ".self_attn.rotary_k", {k}, rk);
    vertex_t a = b.attention(n + ".self_attn.attention", q, k, v, c.heads, c.kv(), true);
    a = b.linear(n + ".self_attn.o_proj", a, H, H, false, false);
    x = b.op(op_kind::add, n + ".self_attn.residual", {x, a});
    h = b.rms_norm(n + ".post_attention_layernorm", x, H);
    vertex_t gate = b.linear(n + ".mlp.gate_proj", h, H, c.ffn, false, false);
    vertex_t up = b.linear(n + ".mlp.up_proj", h, H, c.ffn, false, false);
    gate = b.op(op_kind::silu, n + ".mlp.act", {gate});
    h = b.op(op_kind::mul, n + ".mlp.gate_mul", {gate, up});
    h = b.linear(n + ".mlp.down_proj", h, c.ffn, H, false, false);
    x = b.op(op_kind::add, n + ".mlp.residual", {x, h});
  }
  x = b.rms_norm("model.norm", x, H);
  vertex_t logits = b.linear("lm_head", x, H, c.vocab, false, false);
  b.loss(c, logits);
  return g;
}

/// Names of the parameter operands of `v` in operand order: a linear's weight (and bias),
/// a norm's weight and bias, an embedding's table. For GPT-2's tied lm_head this is
/// "transformer.wte.weight".
inline std::vector<std::string> parameter_names(const model_graph& g, vertex_t v) {
  std::vector<std::string> out;
  for (vertex_t u : operands(g, v))
    if (g[u].is_parameter()) out.push_back(g[u].name);
  return out;
}

/// Every linear operator with its parameter names, in vertex order.
inline std::vector<std::pair<std::string, std::vector<std::string>>> linear_weights(const model_graph& g) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v)
    if (g[v].kind == op_kind::linear) out.emplace_back(g[v].name, parameter_names(g, v));
  return out;
}

}  // namespace autoshard

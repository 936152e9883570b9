#pragma once
/// Transformer graphs with Hugging Face names, so a plan maps onto a checkpoint:
///   auto g = autoshard::build_gpt2(autoshard::transformer_config::gpt2_124m());
///   autoshard::parameter_count(g);                         // 124'439'808 (tied embeddings)
///   autoshard::parameter_names(g, *autoshard::find_vertex(g, "transformer.h.0.attn.c_attn"));
///     // {"transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias"}
#include <algorithm>  // std::clamp, std::max, std::min
#include <cmath>    // std::pow, std::sqrt, std::isfinite, std::log, std::floor, std::ceil
#include <cstdint>  // std::int64_t
#include <numbers>  // std::numbers::pi
#include <string>   // std::string
#include <vector>   // std::vector

#include "model.hpp"     // model_graph, add_op, add_parameter
#include "pricing.hpp"   // run_mode, default_run_mode
#include "rope.hpp"      // rope_rule, rope_rule_frequencies

namespace autoshard {

/// Hugging Face's rope_scaling (transformers 5: rope_parameters): how a rotary's frequencies
/// differ from base^(-2i/D). `type`: one autoshard computes; a type it does not compute is kept
/// in `uncomputed` (its rotaries then turn at base^(-2i/D), and hf_config.hpp says so).
struct rope_scaling_config {
  std::string type;                  ///< "" (none: base^(-2i/D)), "linear", "llama3", "dynamic", "yarn" or "longrope"
  /// A rope type read but not computed ("su", ...), and the member as
  /// the config gave it (compact JSON), which to_hf_config writes back; both empty otherwise.
  std::string uncomputed, given;
  double factor = 1.0;               ///< linear, llama3, dynamic, yarn: the scaling factor (Llama-3.1: 8)
  double low_freq_factor = 1.0;      ///< llama3 (Llama-3.1: 1)
  double high_freq_factor = 4.0;     ///< llama3 (Llama-3.1: 4)
  /// llama3, yarn, longrope: the pretraining context (original_max_position_embeddings); dynamic: the
  /// config's max_position_embeddings, past which a sequence scales the base.
  int original_max_positions = 8192;
  double beta_fast = 32.0, beta_slow = 1.0;  ///< yarn: the ramp's rotations (transformers' defaults 32 and 1)
  double mscale = 0.0, mscale_all_dim = 0.0;  ///< yarn: DeepSeek's mscale pair; 0: not given
  double attention_factor = 0.0;     ///< yarn, longrope: cos and sin times this; 0: not given (computed from factor)
  /// longrope: pair i's divisor up to original_max_positions (short) and past it (long), D/2 each.
  std::vector<double> short_factor, long_factor;
  bool truncate = true;              ///< yarn: the ramp's ends rounded outward (floor, ceil)
  friend bool operator==(const rope_scaling_config&, const rope_scaling_config&) = default;
};

/// The sequence-dependent rule of `s` (rope.hpp) the rotary op carries: dynamic (factor,
/// max_position_embeddings) or longrope (original_max_position_embeddings, short and long
/// factors); none for every other type, whose frequencies do not depend on the sequence.
inline rope_rule rope_rule_of(const rope_scaling_config& s) {
  rope_rule r;
  if (s.type == "dynamic") {
    r.kind = rope_rule_kind::dynamic;
    r.factor = s.factor;
  } else if (s.type == "longrope") {
    r.kind = rope_rule_kind::longrope;
    r.short_factor = s.short_factor;
    r.long_factor = s.long_factor;
  } else {
    return r;
  }
  r.threshold = s.original_max_positions;
  return r;
}

/// The frequencies of a rotary's pairs for D turned dims (the head size, or a partial rotary's
/// R) at `base` under `s`, for a run of `seq` positions: empty where there is no scaling (the
/// rotary op's base^(-2i/D)), else the D/2 values of transformers' modeling_rope_utils,
/// computed in double:
///   linear (_compute_linear_scaling_rope_parameters): inv_freq_i / factor, inv_freq_i = base^(-2i/D);
///   llama3 (_compute_llama3_parameters): with wavelen = 2 pi / inv_freq,
///     low_freq_wavelen = original_max_position_embeddings / low_freq_factor,
///     high_freq_wavelen = original_max_position_embeddings / high_freq_factor:
///     wavelen < high_freq_wavelen: inv_freq (kept);  wavelen > low_freq_wavelen: inv_freq / factor;
///     otherwise smooth = (original_max_position_embeddings / wavelen - low_freq_factor) /
///                        (high_freq_factor - low_freq_factor),
///               (1 - smooth) inv_freq / factor + smooth inv_freq.
///   yarn (_compute_yarn_parameters): with pos_i = base^(2i/D) and the ramp's ends
///     low, high = D ln(original / (beta 2 pi)) / (2 ln base) for beta_fast, beta_slow (floored,
///     ceiled when truncate), clamped to [0, D - 1] (high + 0.001 where they meet):
///     ramp_i = clamp((i - low) / (high - low), 0, 1),
///     (1 / (factor pos_i)) ramp_i + (1 / pos_i) (1 - ramp_i)  (rope_attention_factor scales cos and sin);
///   longrope and dynamic, the two that depend on the sequence: rope_rule_frequencies (rope.hpp)
///     of rope_rule_of(s), the rule the rotary op carries so that a re-sized graph turns as
///     transformers does at its new sequence (longrope: short_factor up to
///     original_max_position_embeddings, long_factor past it, rope_attention_factor scaling
///     cos and sin at every length; dynamic: the default up to max_position_embeddings, a
///     grown base past it).
inline std::vector<double> rope_frequencies(double base, int D, const rope_scaling_config& s, std::int64_t seq) {
  std::vector<double> f;
  if (s.type.empty()) return f;
  if (s.type == "dynamic" || s.type == "longrope") return rope_rule_frequencies(base, D, rope_rule_of(s), seq);
  if (s.type == "yarn") {
    const auto correction = [&](double rotations) {
      return D * std::log(s.original_max_positions / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
    };
    double low = correction(s.beta_fast), high = correction(s.beta_slow);
    if (s.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, D - 1.0);
    if (low == high) high += 0.001;  // transformers' linear_ramp_factor: "Prevent singularity"
    for (int i = 0; i < D / 2; ++i) {
      const double pos = std::pow(base, 2.0 * i / D), ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      const double extrapolation = 1 - ramp;
      f.push_back(1.0 / (s.factor * pos) * (1 - extrapolation) + 1.0 / pos * extrapolation);
    }
    return f;
  }
  for (int i = 0; i < D / 2; ++i) {
    const double inv = 1.0 / std::pow(base, 2.0 * i / D);
    if (s.type == "linear") {
      f.push_back(inv / s.factor);
      continue;
    }
    const double wavelen = 2 * std::numbers::pi / inv, old = s.original_max_positions;
    if (wavelen < old / s.high_freq_factor) f.push_back(inv);
    else if (wavelen > old / s.low_freq_factor) f.push_back(inv / s.factor);
    else {
      const double smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f.push_back((1 - smooth) * inv / s.factor + smooth * inv);
    }
  }
  return f;
}

/// What transformers multiplies a rotary's cos and sin by (its attention_scaling): 1 but for
/// longrope (the config's attention_factor, else 1 for factor <= 1, else
/// sqrt(1 + ln(factor) / ln(original_max_position_embeddings))) and yarn, whose attention_factor is the config's where given, else (_compute_yarn_parameters)
/// m(factor, mscale) / m(factor, mscale_all_dim) where both are given (non-zero), else
/// m(factor, 1), with yarn_get_mscale's m(s, k) = 1 for s <= 1, else 0.1 k ln(s) + 1.
inline double rope_attention_factor(const rope_scaling_config& s) {
  if (s.type != "yarn" && s.type != "longrope") return 1.0;
  if (s.attention_factor != 0.0) return s.attention_factor;
  if (s.type == "longrope")
    return s.factor <= 1.0 ? 1.0 : std::sqrt(1 + std::log(s.factor) / std::log(static_cast<double>(s.original_max_positions)));
  const auto m = [&](double k) { return s.factor <= 1 ? 1.0 : 0.1 * k * std::log(s.factor) + 1.0; };
  return s.mscale != 0.0 && s.mscale_all_dim != 0.0 ? m(s.mscale) / m(s.mscale_all_dim) : m(1.0);
}

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
  /// Tokens of each sequence already in a key/value cache: the graph is a step after them (a
  /// decode step at seq 1), its attentions reading the cache (past_key_values.<layer>.key and
  /// .value inputs, [batch, past, kv_heads*D]), its rotaries turning from position past and its
  /// learned position table (GPT-2, OPT) read from row past (+ position_offset) on.
  /// Inference only; the decoders (LLaMA family, GPT-2, OPT, GPT-NeoX, BLOOM, Falcon), not
  /// BERT (an encoder). 0: none, a prefill or a training step.
  std::int64_t past = 0;
  dtype type = dtype::bf16;
  run_mode mode = default_run_mode;  ///< training adds labels and a cross-entropy loss (BERT: its masked-LM head)
  bool dropout = true;         ///< GPT-2 trains with dropouts; false: a config whose dropout probabilities are all 0 has none

  // Per-family details, as Hugging Face's config.json gives them (see hf_config.hpp); the
  // defaults are the GPT-2 / BERT / LLaMA presets'.
  int head_size = 0;            ///< explicit head size (Gemma's head_dim); 0: hidden / heads
  bool tie_embeddings = false;  ///< decoders with a separate lm_head: it is the token embedding
  bool qkv_bias = false;        ///< biases on the query/key/value projections (Qwen2, OPT, GPT-NeoX, ...)
  bool out_bias = false;        ///< bias on the attention output projection
  bool mlp_bias = false;        ///< biases on the MLP projections
  bool fused_qkv = false;       ///< LLaMA family: one qkv_proj and one gate_up_proj (Phi-3)
  op_kind activation = op_kind::gelu;  ///< the MLP's activation (the gate's, for the LLaMA family)
  bool parallel_residual = false;      ///< attention and MLP read the same input (GPT-NeoX, Falcon)
  bool pre_norm = true;         ///< OPT's do_layer_norm_before
  bool final_norm = true;       ///< OPT without do_layer_norm_before has no final_layer_norm
  int embed_proj = 0;           ///< OPT's word_embed_proj_dim when it differs from hidden (project_in/out)
  int position_offset = 0;      ///< rows of the learned position table before position 0 (OPT, RoBERTa: 2)
  bool rotary = true;           ///< GPT-NeoX and Falcon: rotary positions; false: Falcon's ALiBi (no parameters; BLOOM's always)
  double rope_theta = 10000.0;  ///< rotary's base (Hugging Face's rope_theta, GPT-NeoX's rotary_emb_base)
  rope_scaling_config rope_scaling;  ///< rotary's scaled frequencies (Hugging Face's rope_scaling; none by default)
  /// The part of each head rotary turns: its first int(head_dim x rotary_pct) dims, as
  /// transformers computes them (GPT-NeoX's rotary_pct, partial_rotary_factor); 1: the whole head.
  double rotary_pct = 1.0;
  /// The epsilon of every norm built (Hugging Face's layer_norm_eps, layer_norm_epsilon or
  /// rms_norm_eps; hf_config.hpp reads each family's with transformers' default).
  double norm_epsilon = default_norm_epsilon;
  /// Gemma's: every norm scales by 1 + weight (GemmaRMSNorm; op_attrs::weight_offset 1), and the
  /// word embeddings' rows are multiplied by sqrt(hidden) in the model's dtype (GemmaModel's
  /// normalizer; op_attrs::scale). build_llama only.
  bool gemma_scaling = false;
  /// Sliding-window attention (Mistral's, Phi-3's and Qwen2's sliding_window): each query sees
  /// itself and the sliding_window - 1 keys before it (op_attrs::window); 0: none.
  int sliding_window = 0;
  /// The layers the window applies to: one flag per layer (Qwen2's layer_types), else, empty,
  /// the layers from max_window_layers on (Qwen2's max_window_layers; 0: every layer, as
  /// Mistral's and Phi-3's). Read through window_of.
  std::vector<bool> sliding_layers;
  int max_window_layers = 0;
  bool new_decoder_architecture = false;  ///< Falcon-40B/180B: grouped qkv, ln_attn and ln_mlp
  int layer_norms = 1;          ///< Falcon new architecture: 2 is ln_attn + ln_mlp
  std::string prefix;           ///< BERT family: "bert" or "roberta" (empty: "bert")

  int kv() const noexcept { return kv_heads > 0 ? kv_heads : heads; }
  int head_dim() const noexcept { return head_size > 0 ? head_size : hidden / heads; }
  /// R, the dims of each head rotary turns: int(head_dim x rotary_pct), truncated as Python's int().
  int rotary_dims() const noexcept { return static_cast<int>(static_cast<double>(head_dim()) * rotary_pct); }
  /// The sliding window of layer `i`'s attention: sliding_window where it applies, else 0.
  int window_of(int i) const {
    if (sliding_window <= 0 || i < 0) return 0;
    const auto u = static_cast<std::size_t>(i);
    const bool sliding = sliding_layers.empty() ? i >= max_window_layers : u < sliding_layers.size() && sliding_layers[u];
    return sliding ? sliding_window : 0;
  }

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
    c.activation = op_kind::gelu_erf;  // BERT's "gelu" is the exact form
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
    c.activation = op_kind::silu;
    c.vocab = 32000;
    c.max_positions = 0;
    c.seq = 2048;
    c.batch = 4;
    return c;
  }
  static transformer_config llama_7b() { return llama(32, 4096, 32, 32, 11008); }
  static transformer_config llama_70b() { return llama(80, 8192, 64, 8, 28672); }
};

/// The most layers a builder makes: far above any published model (GPT-3 96, the 1 T
/// configuration of Megatron-LM's paper 128), and a bound on what the graph, its strategies
/// and a plan take in memory, which grow with every layer (10,000 layers of GPT-2 took 11 GB to
/// plan: 100,000 would have been killed for memory, not refused).
inline constexpr int max_transformer_layers = 4096;

namespace detail {
inline void check_config(const transformer_config& c, const char* what) {
  auto bad = [&](const std::string& why) { throw graph_error(std::string(what) + " config: " + why); };
  if (c.layers < 0 || c.hidden < 1 || c.heads < 1 || c.ffn < 1 || c.vocab < 1 || c.seq < 1 || c.batch < 1)
    bad("layers, hidden, heads, ffn, vocab, seq and batch must be positive");
  if (c.layers > max_transformer_layers)
    bad("layers " + std::to_string(c.layers) + " exceeds " + std::to_string(max_transformer_layers) +
        " (max_transformer_layers: far above any published model; the graph and its plan grow with every layer)");
  if (c.head_size < 0 || c.embed_proj < 0 || c.position_offset < 0 || c.max_positions < 0 || c.type_vocab < 0)
    bad("head_size, embed_proj, position_offset, max_positions and type_vocab must not be negative");
  if (c.head_size == 0 && c.hidden % c.heads != 0)
    bad("hidden " + std::to_string(c.hidden) + " is not a multiple of heads " + std::to_string(c.heads));
  if (static_cast<std::int64_t>(c.head_dim()) * c.heads > (std::int64_t{1} << 24))
    bad("heads x head size " + std::to_string(static_cast<std::int64_t>(c.head_dim()) * c.heads) + " exceeds 2^24");
  if (!is_unary_elementwise(c.activation) || c.activation == op_kind::rotary || c.activation == op_kind::dropout)
    bad("activation " + std::string(to_string(c.activation)) + " is not an activation");
  if (c.heads % c.kv() != 0)
    bad("heads " + std::to_string(c.heads) + " is not a multiple of kv_heads " + std::to_string(c.kv()));
  if (!valid_norm_epsilon(c.norm_epsilon))
    bad("norm epsilon " + exact_number(c.norm_epsilon) + " is not a finite number in (0, " + exact_number(max_norm_epsilon) + "]");
  if (c.sliding_window < 0 || c.max_window_layers < 0)
    bad("sliding_window " + std::to_string(c.sliding_window) + " or max_window_layers " + std::to_string(c.max_window_layers) +
        " is negative");
  if (!c.sliding_layers.empty() && c.sliding_layers.size() != static_cast<std::size_t>(c.layers))
    bad(std::to_string(c.sliding_layers.size()) + " sliding_layers flags for " + std::to_string(c.layers) + " layers");
  if (c.past < 0 || c.past > max_attention_window)
    bad("past " + std::to_string(c.past) + " is not a count of cached tokens in 0.." + std::to_string(max_attention_window));
  if (c.past > 0 && c.mode == run_mode::training)
    bad("a key/value cache of " + std::to_string(c.past) + " tokens makes a decode step, which is inference, not training");
  if (c.rotary && (!(c.rotary_pct > 0.0) || !(c.rotary_pct <= 1.0)))
    bad("rotary_pct " + exact_number(c.rotary_pct) + " is not a part of the head in (0, 1]");
  if (c.rotary && c.rotary_pct != 1.0 && (c.rotary_dims() < 2 || c.rotary_dims() % 2 != 0))
    bad("rotary_pct " + exact_number(c.rotary_pct) + " of heads of " + std::to_string(c.head_dim()) + " turns " +
        std::to_string(c.rotary_dims()) + " dims (int(head_dim x rotary_pct)), not an even number of at least 2");
}

/// An encoder (BERT, RoBERTa) builds no cache: each token attends to every other, before and
/// after it, so no step adds tokens after cached ones.
inline void check_no_cache(const transformer_config& c, const char* what) {
  if (c.past > 0)
    throw graph_error(std::string(what) + " config: a key/value cache (past " + std::to_string(c.past) + ") is for a decoder's step "
                      "after cached tokens, but " + what + " is an encoder (each token attends to every other, later ones too): no "
                      "decode step");
}

inline void check_no_gqa(const transformer_config& c, const char* what) {
  if (c.kv() != c.heads)
    throw graph_error(std::string(what) + " config: " + std::to_string(c.kv()) + " key/value heads for " +
                      std::to_string(c.heads) + " heads, but " + what + " has no grouped-query attention");
}

/// GemmaModel's normalizer: hidden ** 0.5 as GemmaTextScaledWordEmbedding applies it (a float32
/// tensor .to(the weight's dtype)), rounded to the model's dtype `t` (bf16: sqrt(2048) = 45.2548 is 45.25).
inline double gemma_normalizer(std::int64_t hidden, dtype t) {
  const double s = std::sqrt(static_cast<double>(hidden));
  if (t == dtype::bf16) return bf16_to_float(float_to_bf16(static_cast<float>(s)));
  if (t == dtype::f16) return f16_to_float(float_to_f16(static_cast<float>(s)));
  if (t == dtype::f32) return static_cast<float>(s);
  return s;
}

struct builder {
  model_graph& g;
  dtype t;
  double epsilon;  ///< every norm's (transformer_config::norm_epsilon)
  double weight_offset = 0.0;  ///< every norm's (Gemma's 1: transformer_config::gemma_scaling)
  op_attrs norm_attrs() const {
    op_attrs a;
    a.epsilon = epsilon;
    a.weight_offset = weight_offset;
    return a;
  }
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
    return add_op(g, op_kind::layer_norm, name, {x, param(name + ".weight", {h}), param(name + ".bias", {h})}, norm_attrs());
  }
  vertex_t rms_norm(const std::string& name, vertex_t x, std::int64_t h) {
    return add_op(g, op_kind::rms_norm, name, {x, param(name + ".weight", {h})}, norm_attrs());
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
  /// The attention core over q, k, v and, when `cache` holds them (kv_cache), a key/value
  /// cache's keys and values.
  vertex_t attention(const std::string& name, vertex_t q, vertex_t k, vertex_t v, int heads, int kv, bool causal,
                     bool dropout = false, std::int64_t window = 0, alibi_rule alibi = alibi_rule::none,
                     const std::vector<vertex_t>& cache = {}) {
    op_attrs a;
    a.heads = heads;
    a.kv_heads = kv;
    a.causal = causal;
    a.window = window;
    a.alibi = alibi;
    a.dropout = dropout;
    std::vector<vertex_t> ops{q, k, v};
    ops.insert(ops.end(), cache.begin(), cache.end());
    return add_op(g, op_kind::attention, name, ops, a);
  }
  /// Layer `layer`'s key/value cache of transformer_config::past tokens, keys of `width`
  /// (kv_heads x head size): past_key_values.<layer>.key and .value, as optimum's ONNX exports
  /// name them; none without a past.
  std::vector<vertex_t> kv_cache(const transformer_config& c, int layer, std::int64_t width) {
    if (c.past == 0) return {};
    const std::string n = "past_key_values." + std::to_string(layer);
    return {add_kv_cache(g, n + ".key", {c.batch, c.past, width}, t), add_kv_cache(g, n + ".value", {c.batch, c.past, width}, t)};
  }
  /// A dropout module of the training graph (nothing at inference, where it is the identity).
  vertex_t dropout(const transformer_config& c, const std::string& name, vertex_t x) {
    return c.mode == run_mode::training && c.dropout ? op(op_kind::dropout, name, {x}) : x;
  }
  vertex_t norm(bool rms, const std::string& name, vertex_t x, std::int64_t h) {
    return rms ? rms_norm(name, x, h) : layer_norm(name, x, h);
  }
  /// Splits [B,S,groups*per] into the slice [start, start+length) of each group, as [B,S,groups*length]:
  /// how fused per-head qkv layouts (GPT-NeoX, BLOOM, Falcon) are read.
  vertex_t group_slice(const std::string& name, vertex_t x, std::int64_t groups, std::int64_t start, std::int64_t length) {
    const tensor_shape s = g[x].shape;
    const std::int64_t per = s[2] / groups;
    if (groups == 1) return slice(name, x, 2, start, length);
    op_attrs r;
    r.dims = {s[0], s[1], groups, per};
    vertex_t v = op(op_kind::reshape, name + "_view", {x}, r);
    v = slice(name + "_slice", v, 3, start, length);
    op_attrs back;
    back.dims = {s[0], s[1], groups * length};
    return op(op_kind::reshape, name, {v}, back);
  }
  /// Rotary positions as Hugging Face's models apply them: rotate_half's pairs (i, i + R/2)
  /// within the first R = rotary_dims() dims of each head (all of it, or a partial rotary's
  /// part), at the config's base, with its rope_scaling's frequencies (of R) where it has one.
  vertex_t rope(const transformer_config& c, const std::string& name, vertex_t x, int heads) {
    op_attrs a;
    a.heads = heads;
    a.rotary_half = true;
    a.rotary_base = c.rope_theta;
    const int R = c.rotary_dims();
    a.rotary_dims = R == c.head_dim() ? 0 : R;  // 0: the whole head, as a graph without a partial rotary says it
    a.rotary_offset = c.past;  // the step's tokens come after the cached ones
    a.rotary_frequencies = rope_frequencies(c.rope_theta, R, c.rope_scaling, c.past + c.seq);
    a.rotary_rule = rope_rule_of(c.rope_scaling);  // dynamic, longrope: with_batch_seq turns at another sequence by it
    a.scale = rope_attention_factor(c.rope_scaling);  // yarn's attention_factor: the turned dims' cos and sin times it
    return op(op_kind::rotary, name, {x}, a);
  }
  /// The output head: lm_head of its own, or the token embedding's table when tied.
  vertex_t lm_head(const transformer_config& c, const std::string& name, vertex_t x, vertex_t table, std::int64_t in) {
    if (c.tie_embeddings) return op(op_kind::linear, name, {x, table});
    return linear(name, x, in, c.vocab, false, false);
  }
  void loss(const transformer_config& c, vertex_t logits) {
    if (c.mode != run_mode::training) return;
    vertex_t labels = add_input(g, "labels", {c.batch, c.seq}, dtype::i64);
    add_op(g, op_kind::cross_entropy, "loss", {logits, labels});
  }
};
}  // namespace detail

namespace detail {
/// The learned position table `name`.weight of `shape` as its embedding `name` reads it: the rows
/// from `offset` + `past` on, so that position_ids 0..S-1 look up the rows transformers looks
/// up; a `split` of the table (`name`.past_offset) when that is above 0. The offset: OPT's
/// OPTLearnedPositionalEmbedding adds 2 to every position, RoBERTa's positions start at
/// pad_token_id + 1; without it position p read row p, the first `offset` rows, never trained,
/// were every sequence's first positions, and the logits were another model's. The past
/// (transformer_config::past): a step after P cached tokens is at positions P..P+S-1
/// (GPT2Model's cache_position, OPT's cumsum of the mask cut at the past), its rows
/// offset + P.. of the table.
inline vertex_t position_rows(builder& b, const std::string& name, tensor_shape shape, std::int64_t offset, std::int64_t past) {
  const vertex_t table = b.param(name + ".weight", shape);
  const std::int64_t first = offset + past;
  return first > 0 ? b.slice(name + ".past_offset", table, 0, first, shape[0] - first) : table;
}

/// A learned position table of max_positions rows holds the step's positions: past + seq
/// (+ position_offset, the rows before position 0) at most max_positions.
inline void check_positions(const transformer_config& c, const char* what) {
  const std::int64_t rows = c.past + c.seq + c.position_offset;
  if (rows <= c.max_positions) return;
  std::string sum = (c.past ? "past " + std::to_string(c.past) + " + " : std::string()) + "seq " + std::to_string(c.seq) +
                    (c.position_offset ? " + position offset " + std::to_string(c.position_offset) : std::string());
  if (c.past || c.position_offset) sum += " = " + std::to_string(rows);
  throw graph_error(std::string(what) + " config: " + sum + " exceeds max_positions " + std::to_string(c.max_positions) +
                    ", the rows of the learned position table" +
                    (c.past ? " (the step's last token is at position " + std::to_string(c.past + c.seq - 1) + ")" : std::string()));
}
}  // namespace detail

/// GPT-2 (GPT2LMHeadModel): learned positions, pre-norm blocks, Conv1D ([in,out]) weights,
/// fused c_attn split into q, k, v, causal attention, lm_head tied to transformer.wte.
inline model_graph build_gpt2(const transformer_config& c) {
  detail::check_config(c, "gpt2");
  detail::check_no_gqa(c, "gpt2");
  detail::check_positions(c, "gpt2");
  model_graph g;
  detail::builder b{g, c.type, c.norm_epsilon};
  const std::int64_t H = c.hidden;
  vertex_t ids = add_input(g, "input_ids", {c.batch, c.seq}, dtype::i64);
  vertex_t pos = add_input(g, "position_ids", {1, c.seq}, dtype::i64);
  vertex_t wte = b.param("transformer.wte.weight", {c.vocab, H});
  vertex_t x = b.op(op_kind::embedding, "transformer.wte", {ids, wte});
  vertex_t p = b.op(op_kind::embedding, "transformer.wpe", {pos, detail::position_rows(b, "transformer.wpe", {c.max_positions, H}, 0, c.past)});
  x = b.op(op_kind::add, "transformer.embed_add", {x, p});
  x = b.dropout(c, "transformer.drop", x);
  for (int i = 0; i < c.layers; ++i) {
    const std::string n = "transformer.h." + std::to_string(i);
    vertex_t h = b.layer_norm(n + ".ln_1", x, H);
    vertex_t qkv = b.linear(n + ".attn.c_attn", h, H, 3 * H, true, true);
    vertex_t q = b.slice(n + ".attn.q", qkv, 2, 0, H);
    vertex_t k = b.slice(n + ".attn.k", qkv, 2, H, H);
    vertex_t v = b.slice(n + ".attn.v", qkv, 2, 2 * H, H);
    // GPT2Attention's attn_dropout (on the probabilities, inside the core) and resid_dropout,
    // GPT2MLP's dropout: the dropouts Megatron-LM's GPT layer has too.
    vertex_t a = b.attention(n + ".attn.attention", q, k, v, c.heads, c.heads, true, c.mode == run_mode::training && c.dropout, 0,
                             alibi_rule::none, b.kv_cache(c, i, H));
    a = b.linear(n + ".attn.c_proj", a, H, H, true, true);
    a = b.dropout(c, n + ".attn.resid_dropout", a);
    x = b.op(op_kind::add, n + ".attn.residual", {x, a});
    h = b.layer_norm(n + ".ln_2", x, H);
    h = b.linear(n + ".mlp.c_fc", h, H, c.ffn, true, true);
    h = b.op(c.activation, n + ".mlp.act", {h});
    h = b.linear(n + ".mlp.c_proj", h, c.ffn, H, true, true);
    h = b.dropout(c, n + ".mlp.dropout", h);
    x = b.op(op_kind::add, n + ".mlp.residual", {x, h});
  }
  x = b.layer_norm("transformer.ln_f", x, H);
  vertex_t logits = b.op(op_kind::linear, "lm_head", {x, wte});  // tied: lm_head.weight is transformer.wte.weight
  b.loss(c, logits);
  return g;
}

/// BERT (BertModel, as bert-base-uncased: embeddings, post-norm encoder, tanh pooler); with
/// prefix "roberta" and position_offset 2 it is RobertaModel (same layout, other names).
/// In training mode it is BertForMaskedLM (RobertaForMaskedLM): no pooler, the masked-LM head
/// (cls.predictions.transform.dense, .LayerNorm, the decoder tied to the word embeddings plus
/// cls.predictions.bias), labels and a cross-entropy loss: 109'514'298 parameters for bert-base.
inline model_graph build_bert(const transformer_config& c) {
  const std::string pre = c.prefix.empty() ? "bert" : c.prefix;
  detail::check_config(c, pre.c_str());
  detail::check_no_cache(c, pre.c_str());
  detail::check_no_gqa(c, pre.c_str());
  detail::check_positions(c, pre.c_str());
  model_graph g;
  detail::builder b{g, c.type, c.norm_epsilon};
  const std::int64_t H = c.hidden;
  const std::string e = pre + ".embeddings";
  vertex_t ids = add_input(g, "input_ids", {c.batch, c.seq}, dtype::i64);
  vertex_t tt = c.type_vocab > 0 ? add_input(g, "token_type_ids", {c.batch, c.seq}, dtype::i64) : ids;
  vertex_t pos = add_input(g, "position_ids", {1, c.seq}, dtype::i64);
  vertex_t word = b.param(e + ".word_embeddings.weight", {c.vocab, H});
  vertex_t x = b.op(op_kind::embedding, e + ".word_embeddings", {ids, word});
  vertex_t p = b.op(op_kind::embedding, e + ".position_embeddings",
                    {pos, detail::position_rows(b, e + ".position_embeddings", {c.max_positions, H}, c.position_offset, 0)});
  x = b.op(op_kind::add, e + ".add_position", {x, p});
  if (c.type_vocab > 0) {
    vertex_t t = b.op(op_kind::embedding, e + ".token_type_embeddings",
                      {tt, b.param(e + ".token_type_embeddings.weight", {c.type_vocab, H})});
    x = b.op(op_kind::add, e + ".add_token_type", {x, t});
  }
  x = b.layer_norm(e + ".LayerNorm", x, H);
  for (int i = 0; i < c.layers; ++i) {
    const std::string n = pre + ".encoder.layer." + std::to_string(i);
    vertex_t q = b.linear(n + ".attention.self.query", x, H, H, true, false);
    vertex_t k = b.linear(n + ".attention.self.key", x, H, H, true, false);
    vertex_t v = b.linear(n + ".attention.self.value", x, H, H, true, false);
    vertex_t a = b.attention(n + ".attention.self.attention", q, k, v, c.heads, c.heads, false, c.mode == run_mode::training);
    a = b.linear(n + ".attention.output.dense", a, H, H, true, false);
    a = b.op(op_kind::add, n + ".attention.output.residual", {a, x});
    x = b.layer_norm(n + ".attention.output.LayerNorm", a, H);
    vertex_t h = b.linear(n + ".intermediate.dense", x, H, c.ffn, true, false);
    h = b.op(c.activation, n + ".intermediate.act", {h});
    h = b.linear(n + ".output.dense", h, c.ffn, H, true, false);
    h = b.op(op_kind::add, n + ".output.residual", {h, x});
    x = b.layer_norm(n + ".output.LayerNorm", h, H);
  }
  if (c.mode == run_mode::training) {
    // The masked-LM head (BertForMaskedLM / RobertaForMaskedLM, built without the pooler):
    // dense + activation + LayerNorm, then the decoder tied to the word embeddings with a
    // bias of its own, and the cross-entropy over the labels (every position a target).
    const bool roberta = pre == "roberta";
    const std::string h = roberta ? "lm_head" : "cls.predictions";
    const std::string t = roberta ? "lm_head" : "cls.predictions.transform";
    x = b.linear(t + ".dense", x, H, H, true, false);
    // BERT's transform takes hidden_act; RobertaLMHead calls the exact gelu whatever the config says.
    x = b.op(roberta ? op_kind::gelu_erf : c.activation, t + (roberta ? ".gelu" : ".transform_act_fn"), {x});
    x = b.layer_norm(t + (roberta ? ".layer_norm" : ".LayerNorm"), x, H);
    vertex_t logits = b.op(op_kind::linear, h + ".decoder", {x, word, b.param(h + ".bias", {c.vocab})});
    b.loss(c, logits);
    return g;
  }
  vertex_t first = b.slice(pre + ".pooler.first_token", x, 1, 0, 1);
  op_attrs flat;
  flat.dims = {c.batch, H};
  first = b.op(op_kind::reshape, pre + ".pooler.flatten", {first}, flat);
  vertex_t pooled = b.linear(pre + ".pooler.dense", first, H, H, true, false);
  b.op(op_kind::tanh, pre + ".pooler.activation", {pooled});
  return g;
}

/// LLaMA-style decoder (LlamaForCausalLM): RMSNorm, rotary (elementwise on q and k),
/// grouped-query attention, gated MLP (SwiGLU), lm_head. The same layout with the config's
/// details is Mistral (as LLaMA), Qwen2 (qkv_bias), Gemma (head_size, GELU gate, tied
/// embeddings) and Phi-3 (fused_qkv: qkv_proj = q|k|v and gate_up_proj = gate|up); Mistral's,
/// Qwen2's and Phi-3's sliding window is the attention's window on the layers it applies to.
inline model_graph build_llama(const transformer_config& c) {
  detail::check_config(c, "llama");
  model_graph g;
  detail::builder b{g, c.type, c.norm_epsilon, c.gemma_scaling ? 1.0 : 0.0};
  const std::int64_t H = c.hidden, D = c.head_dim();
  const std::int64_t Q = c.heads * D, KV = static_cast<std::int64_t>(c.kv()) * D;
  vertex_t ids = add_input(g, "input_ids", {c.batch, c.seq}, dtype::i64);
  vertex_t table = b.param("model.embed_tokens.weight", {c.vocab, H});
  op_attrs embed;
  if (c.gemma_scaling) embed.scale = detail::gemma_normalizer(H, c.type);
  vertex_t x = b.op(op_kind::embedding, "model.embed_tokens", {ids, table}, embed);
  for (int i = 0; i < c.layers; ++i) {
    const std::string n = "model.layers." + std::to_string(i);
    vertex_t h = b.rms_norm(n + ".input_layernorm", x, H);
    vertex_t q, k, v;
    if (c.fused_qkv) {
      vertex_t qkv = b.linear(n + ".self_attn.qkv_proj", h, H, Q + 2 * KV, c.qkv_bias, false);
      q = b.slice(n + ".self_attn.q", qkv, 2, 0, Q);
      k = b.slice(n + ".self_attn.k", qkv, 2, Q, KV);
      v = b.slice(n + ".self_attn.v", qkv, 2, Q + KV, KV);
    } else {
      q = b.linear(n + ".self_attn.q_proj", h, H, Q, c.qkv_bias, false);
      k = b.linear(n + ".self_attn.k_proj", h, H, KV, c.qkv_bias, false);
      v = b.linear(n + ".self_attn.v_proj", h, H, KV, c.qkv_bias, false);
    }
    q = b.rope(c, n + ".self_attn.rotary_q", q, c.heads);
    k = b.rope(c, n + ".self_attn.rotary_k", k, c.kv());
    vertex_t a = b.attention(n + ".self_attn.attention", q, k, v, c.heads, c.kv(), true, false, c.window_of(i), alibi_rule::none,
                             b.kv_cache(c, i, KV));
    a = b.linear(n + ".self_attn.o_proj", a, Q, H, c.out_bias, false);
    x = b.op(op_kind::add, n + ".self_attn.residual", {x, a});
    h = b.rms_norm(n + ".post_attention_layernorm", x, H);
    vertex_t gate, up;
    if (c.fused_qkv) {
      vertex_t gu = b.linear(n + ".mlp.gate_up_proj", h, H, 2 * std::int64_t{c.ffn}, c.mlp_bias, false);
      gate = b.slice(n + ".mlp.gate", gu, 2, 0, c.ffn);
      up = b.slice(n + ".mlp.up", gu, 2, c.ffn, c.ffn);
    } else {
      gate = b.linear(n + ".mlp.gate_proj", h, H, c.ffn, c.mlp_bias, false);
      up = b.linear(n + ".mlp.up_proj", h, H, c.ffn, c.mlp_bias, false);
    }
    gate = b.op(c.activation, n + ".mlp.act", {gate});
    h = b.op(op_kind::mul, n + ".mlp.gate_mul", {gate, up});
    h = b.linear(n + ".mlp.down_proj", h, c.ffn, H, c.mlp_bias, false);
    x = b.op(op_kind::add, n + ".mlp.residual", {x, h});
  }
  x = b.rms_norm("model.norm", x, H);
  vertex_t logits = b.lm_head(c, "lm_head", x, table, H);
  b.loss(c, logits);
  return g;
}

/// OPT (OPTForCausalLM): learned positions with an offset of 2, q/k/v/out_proj and fc1/fc2
/// with biases, ReLU, pre-norm (post-norm without do_layer_norm_before), project_in/out when
/// word_embed_proj_dim differs from hidden, lm_head tied to model.decoder.embed_tokens.
inline model_graph build_opt(const transformer_config& c) {
  detail::check_config(c, "opt");
  detail::check_no_gqa(c, "opt");
  detail::check_positions(c, "opt");
  model_graph g;
  detail::builder b{g, c.type, c.norm_epsilon};
  const std::int64_t H = c.hidden, E = c.embed_proj > 0 ? c.embed_proj : c.hidden;
  const std::string d = "model.decoder";
  vertex_t ids = add_input(g, "input_ids", {c.batch, c.seq}, dtype::i64);
  vertex_t pos = add_input(g, "position_ids", {1, c.seq}, dtype::i64);
  vertex_t table = b.param(d + ".embed_tokens.weight", {c.vocab, E});
  vertex_t x = b.op(op_kind::embedding, d + ".embed_tokens", {ids, table});
  if (E != H) x = b.linear(d + ".project_in", x, E, H, false, false);
  vertex_t p = b.op(op_kind::embedding, d + ".embed_positions",
                    {pos, detail::position_rows(b, d + ".embed_positions", {c.max_positions, H}, c.position_offset, c.past)});
  x = b.op(op_kind::add, d + ".embed_add", {x, p});
  for (int i = 0; i < c.layers; ++i) {
    const std::string n = d + ".layers." + std::to_string(i);
    vertex_t h = c.pre_norm ? b.layer_norm(n + ".self_attn_layer_norm", x, H) : x;
    vertex_t q = b.linear(n + ".self_attn.q_proj", h, H, H, c.qkv_bias, false);
    vertex_t k = b.linear(n + ".self_attn.k_proj", h, H, H, c.qkv_bias, false);
    vertex_t v = b.linear(n + ".self_attn.v_proj", h, H, H, c.qkv_bias, false);
    vertex_t a = b.attention(n + ".self_attn.attention", q, k, v, c.heads, c.heads, true, false, 0, alibi_rule::none, b.kv_cache(c, i, H));
    a = b.linear(n + ".self_attn.out_proj", a, H, H, c.out_bias, false);
    x = b.op(op_kind::add, n + ".self_attn.residual", {x, a});
    if (!c.pre_norm) x = b.layer_norm(n + ".self_attn_layer_norm", x, H);
    h = c.pre_norm ? b.layer_norm(n + ".final_layer_norm", x, H) : x;
    h = b.linear(n + ".fc1", h, H, c.ffn, c.mlp_bias, false);
    h = b.op(c.activation, n + ".activation_fn", {h});
    h = b.linear(n + ".fc2", h, c.ffn, H, c.mlp_bias, false);
    x = b.op(op_kind::add, n + ".residual", {x, h});
    if (!c.pre_norm) x = b.layer_norm(n + ".final_layer_norm", x, H);
  }
  if (c.final_norm) x = b.layer_norm(d + ".final_layer_norm", x, H);
  if (E != H) x = b.linear(d + ".project_out", x, H, E, false, false);
  vertex_t logits = b.lm_head(c, "lm_head", x, table, E);
  b.loss(c, logits);
  return g;
}

/// GPT-NeoX (GPTNeoXForCausalLM, the Pythia suite): query_key_value per-head interleaved
/// ([heads, 3, head_dim] rows), rotary on q and k, parallel residual by default, GELU MLP,
/// untied embed_out.
inline model_graph build_gpt_neox(const transformer_config& c) {
  detail::check_config(c, "gpt_neox");
  detail::check_no_gqa(c, "gpt_neox");
  model_graph g;
  detail::builder b{g, c.type, c.norm_epsilon};
  const std::int64_t H = c.hidden, D = c.head_dim();
  vertex_t ids = add_input(g, "input_ids", {c.batch, c.seq}, dtype::i64);
  vertex_t table = b.param("gpt_neox.embed_in.weight", {c.vocab, H});
  vertex_t x = b.op(op_kind::embedding, "gpt_neox.embed_in", {ids, table});
  for (int i = 0; i < c.layers; ++i) {
    const std::string n = "gpt_neox.layers." + std::to_string(i);
    vertex_t h = b.layer_norm(n + ".input_layernorm", x, H);
    vertex_t qkv = b.linear(n + ".attention.query_key_value", h, H, 3 * H, c.qkv_bias, false);
    vertex_t q = b.group_slice(n + ".attention.q", qkv, c.heads, 0, D);
    vertex_t k = b.group_slice(n + ".attention.k", qkv, c.heads, D, D);
    vertex_t v = b.group_slice(n + ".attention.v", qkv, c.heads, 2 * D, D);
    q = b.rope(c, n + ".attention.rotary_q", q, c.heads);
    k = b.rope(c, n + ".attention.rotary_k", k, c.heads);
    vertex_t a = b.attention(n + ".attention.attention", q, k, v, c.heads, c.heads, true, false, 0, alibi_rule::none,
                             b.kv_cache(c, i, H));
    a = b.linear(n + ".attention.dense", a, H, H, c.out_bias, false);
    vertex_t m_in = x;
    if (!c.parallel_residual) m_in = x = b.op(op_kind::add, n + ".attention.residual", {x, a});
    h = b.layer_norm(n + ".post_attention_layernorm", m_in, H);
    h = b.linear(n + ".mlp.dense_h_to_4h", h, H, c.ffn, c.mlp_bias, false);
    h = b.op(c.activation, n + ".mlp.act", {h});
    h = b.linear(n + ".mlp.dense_4h_to_h", h, c.ffn, H, c.mlp_bias, false);
    if (c.parallel_residual) h = b.op(op_kind::add, n + ".attention_mlp", {a, h});
    x = b.op(op_kind::add, n + ".residual", {x, h});
  }
  x = b.layer_norm("gpt_neox.final_layer_norm", x, H);
  vertex_t logits = b.lm_head(c, "embed_out", x, table, H);
  b.loss(c, logits);
  return g;
}

/// BLOOM (BloomForCausalLM): word_embeddings_layernorm, query_key_value per-head interleaved
/// ([heads, 3, head_dim] rows), ALiBi positions (no parameters: the attention's alibi "bloom"),
/// GELU MLP, lm_head tied to transformer.word_embeddings.
inline model_graph build_bloom(const transformer_config& c) {
  detail::check_config(c, "bloom");
  detail::check_no_gqa(c, "bloom");
  model_graph g;
  detail::builder b{g, c.type, c.norm_epsilon};
  const std::int64_t H = c.hidden, D = c.head_dim();
  vertex_t ids = add_input(g, "input_ids", {c.batch, c.seq}, dtype::i64);
  vertex_t table = b.param("transformer.word_embeddings.weight", {c.vocab, H});
  vertex_t x = b.op(op_kind::embedding, "transformer.word_embeddings", {ids, table});
  x = b.layer_norm("transformer.word_embeddings_layernorm", x, H);
  for (int i = 0; i < c.layers; ++i) {
    const std::string n = "transformer.h." + std::to_string(i);
    vertex_t h = b.layer_norm(n + ".input_layernorm", x, H);
    vertex_t qkv = b.linear(n + ".self_attention.query_key_value", h, H, 3 * H, c.qkv_bias, false);
    vertex_t q = b.group_slice(n + ".self_attention.q", qkv, c.heads, 0, D);
    vertex_t k = b.group_slice(n + ".self_attention.k", qkv, c.heads, D, D);
    vertex_t v = b.group_slice(n + ".self_attention.v", qkv, c.heads, 2 * D, D);
    vertex_t a = b.attention(n + ".self_attention.attention", q, k, v, c.heads, c.heads, true, false, 0, alibi_rule::bloom,
                             b.kv_cache(c, i, H));
    a = b.linear(n + ".self_attention.dense", a, H, H, c.out_bias, false);
    x = b.op(op_kind::add, n + ".self_attention.residual", {x, a});
    h = b.layer_norm(n + ".post_attention_layernorm", x, H);
    h = b.linear(n + ".mlp.dense_h_to_4h", h, H, c.ffn, c.mlp_bias, false);
    h = b.op(c.activation, n + ".mlp.gelu_impl", {h});
    h = b.linear(n + ".mlp.dense_4h_to_h", h, c.ffn, H, c.mlp_bias, false);
    x = b.op(op_kind::add, n + ".mlp.residual", {x, h});
  }
  x = b.layer_norm("transformer.ln_f", x, H);
  vertex_t logits = b.lm_head(c, "lm_head", x, table, H);
  b.loss(c, logits);
  return g;
}

/// Falcon (FalconForCausalLM). query_key_value holds q|k|v: multi-query (kv_heads 1) as
/// heads*D | D | D, the new decoder architecture per key/value group as [kv, heads/kv + 2, D]
/// rows, otherwise per head as [heads, 3, D]. Rotary (or, with rotary false, ALiBi: the
/// attention's alibi "falcon"), parallel attention and MLP
/// (one input_layernorm, or ln_attn and ln_mlp), GELU MLP, lm_head tied by default.
inline model_graph build_falcon(const transformer_config& c) {
  detail::check_config(c, "falcon");
  model_graph g;
  detail::builder b{g, c.type, c.norm_epsilon};
  const std::int64_t H = c.hidden, D = c.head_dim(), KV = c.kv(), G = c.heads / c.kv();
  vertex_t ids = add_input(g, "input_ids", {c.batch, c.seq}, dtype::i64);
  vertex_t table = b.param("transformer.word_embeddings.weight", {c.vocab, H});
  vertex_t x = b.op(op_kind::embedding, "transformer.word_embeddings", {ids, table});
  const bool two_norms = c.new_decoder_architecture && c.layer_norms == 2;
  const bool parallel = c.parallel_residual || c.new_decoder_architecture;
  for (int i = 0; i < c.layers; ++i) {
    const std::string n = "transformer.h." + std::to_string(i);
    vertex_t h = b.layer_norm(n + (two_norms ? ".ln_attn" : ".input_layernorm"), x, H);
    vertex_t q, k, v;
    const std::string s = n + ".self_attention";
    if (c.new_decoder_architecture) {
      vertex_t qkv = b.linear(s + ".query_key_value", h, H, (c.heads + 2 * KV) * D, c.qkv_bias, false);
      q = b.group_slice(s + ".q", qkv, KV, 0, G * D);
      k = b.group_slice(s + ".k", qkv, KV, G * D, D);
      v = b.group_slice(s + ".v", qkv, KV, (G + 1) * D, D);
    } else if (KV == 1) {
      vertex_t qkv = b.linear(s + ".query_key_value", h, H, (c.heads + 2) * D, c.qkv_bias, false);
      q = b.slice(s + ".q", qkv, 2, 0, c.heads * D);
      k = b.slice(s + ".k", qkv, 2, c.heads * D, D);
      v = b.slice(s + ".v", qkv, 2, (c.heads + 1) * D, D);
    } else {
      if (KV != c.heads)
        throw graph_error("falcon config: " + std::to_string(KV) + " key/value heads need new_decoder_architecture "
                          "(without it Falcon has 1 (multi_query) or one per head)");
      vertex_t qkv = b.linear(s + ".query_key_value", h, H, 3 * c.heads * D, c.qkv_bias, false);
      q = b.group_slice(s + ".q", qkv, c.heads, 0, D);
      k = b.group_slice(s + ".k", qkv, c.heads, D, D);
      v = b.group_slice(s + ".v", qkv, c.heads, 2 * D, D);
    }
    if (c.rotary) {
      q = b.rope(c, s + ".rotary_q", q, c.heads);
      k = b.rope(c, s + ".rotary_k", k, c.kv());
    }
    vertex_t a = b.attention(s + ".attention", q, k, v, c.heads, c.kv(), true, false, 0, c.rotary ? alibi_rule::none : alibi_rule::falcon,
                             b.kv_cache(c, i, KV * D));
    a = b.linear(s + ".dense", a, c.heads * D, H, c.out_bias, false);
    vertex_t m_in = h;
    if (two_norms) m_in = b.layer_norm(n + ".ln_mlp", x, H);
    else if (!parallel) {
      x = b.op(op_kind::add, s + ".residual", {x, a});
      m_in = b.layer_norm(n + ".post_attention_layernorm", x, H);
    }
    vertex_t m = b.linear(n + ".mlp.dense_h_to_4h", m_in, H, c.ffn, c.mlp_bias, false);
    m = b.op(c.activation, n + ".mlp.act", {m});
    m = b.linear(n + ".mlp.dense_4h_to_h", m, c.ffn, H, c.mlp_bias, false);
    if (parallel) m = b.op(op_kind::add, n + ".attention_mlp", {a, m});
    x = b.op(op_kind::add, n + ".residual", {x, m});
  }
  x = b.layer_norm("transformer.ln_f", x, H);
  vertex_t logits = b.lm_head(c, "lm_head", x, table, H);
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

#pragma once
/// Hugging Face config.json -> the model graph, with the checkpoint's parameter names and shapes:
///   autoshard::hf_model m = autoshard::read_hf_config_file("Qwen2-0.5B");  // DIR or DIR/config.json
///   autoshard::model_graph g = autoshard::build_hf(m);
///   autoshard::parameter_count(g);                                         // 494'032'768
///
/// model_type selects the builder (builders.hpp); the config's sizes, key/value heads,
/// head_dim, tie_word_embeddings, biases, activation, norm placement and torch_dtype fill
/// its transformer_config. Keys are read under every spelling transformers accepts
/// ("n_embd", "n_embed", "hidden_size"); a missing (or null) optional key takes transformers'
/// default for that model_type. Values are read through io/json.hpp: sizes are bounded
/// integers (a config is input), and every error names the file, the key and the value.
#include <algorithm>    // std::min, std::find
#include <cstdint>      // std::int64_t
#include <filesystem>   // std::filesystem::path
#include <initializer_list>  // std::initializer_list
#include <iterator>     // std::begin, std::end
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <tuple>        // std::tie
#include <utility>      // std::pair

#include <nlohmann/json.hpp>  // nlohmann::json

#include "../io/json.hpp"  // json_in, read_regular_file, parse_json_text
#include "builders.hpp"  // transformer_config, build_*
#include "model.hpp"     // model_graph

namespace autoshard {

/// The model_types read_hf_config understands, in the order error messages list them.
inline constexpr std::string_view hf_model_types[] = {"gpt2",    "bert",  "roberta", "llama",    "mistral", "qwen2",
                                                      "gemma",   "phi3",  "opt",     "gpt_neox", "bloom",   "falcon"};

/// A Hugging Face model: its model_type and the sized configuration its builder takes.
struct hf_model {
  std::string model_type;
  transformer_config config;
  bool dtype_given = false;  ///< the config named torch_dtype (else config.type is f32, transformers' default)
  /// What the graph does otherwise than the config says (a rope type not computed), in words.
  std::vector<std::string> notes;
};

namespace detail {

struct hf_reader {
  json_in in;

  [[noreturn]] void fail(const std::string& why) const { throw io_error(in.source() + ": " + why); }

  /// The first of `keys` present and not null (transformers' spellings of one attribute).
  std::optional<json_in> find(std::initializer_list<const char*> keys) const {
    for (const char* k : keys)
      if (std::optional<json_in> v = in.find(k)) return v;
    return std::nullopt;
  }
  static std::string names(std::initializer_list<const char*> keys) {
    std::string s;
    for (const char* k : keys) s += std::string(s.empty() ? "\"" : " or \"") + k + "\"";
    return s;
  }
  /// A required size.
  int need(std::initializer_list<const char*> keys, int lo, int hi) const {
    std::optional<json_in> v = find(keys);
    if (!v) fail("missing " + names(keys));
    return v->small_integer(lo, hi);
  }
  /// An optional size; `fallback` when absent or null.
  int get(std::initializer_list<const char*> keys, int lo, int hi, int fallback) const {
    std::optional<json_in> v = find(keys);
    return v ? v->small_integer(lo, hi) : fallback;
  }
  /// An optional number in [lo, hi]; `fallback` when absent or null.
  double real(std::initializer_list<const char*> keys, double lo, double hi, double fallback) const {
    std::optional<json_in> v = find(keys);
    return v ? v->number(lo, hi) : fallback;
  }
  bool flag(std::initializer_list<const char*> keys, bool fallback) const {
    std::optional<json_in> v = find(keys);
    return v ? v->boolean() : fallback;
  }
  op_kind activation(std::initializer_list<const char*> keys, op_kind fallback) const {
    std::optional<json_in> v = find(keys);
    if (!v) return fallback;
    const std::string a = v->string();
    // transformers' ACT2FN: "gelu" (and gelu_python, gelu_10) is the exact erf form; gelu_new,
    // gelu_pytorch_tanh, gelu_fast, gelu_accurate are the tanh approximation. quick_gelu
    // (x sigmoid(1.702 x)) has no kind of its own: planned as the tanh form, whose cost is the same.
    if (a == "gelu" || a == "gelu_python" || a == "gelu_10") return op_kind::gelu_erf;
    if (a.rfind("gelu", 0) == 0 || a == "quick_gelu") return op_kind::gelu;
    if (a == "silu" || a == "swish") return op_kind::silu;
    if (a == "relu") return op_kind::relu;
    if (a == "tanh") return op_kind::tanh;
    v->fail_expected("an activation autoshard knows (gelu and its variants, silu, swish, relu, tanh)");
  }
};

// Bounds on sizes read from a file: far above any published model, far below overflow.
inline constexpr int hf_max_layers = max_transformer_layers, hf_max_hidden = 1 << 20, hf_max_heads = 1 << 16, hf_max_ffn = 1 << 22,
                     hf_max_vocab = 1 << 24, hf_max_positions = 1 << 24;

}  // namespace detail

namespace detail {

/// Rotary's base: rope_parameters.rope_theta (transformers 5), else rope_theta (earlier
/// versions; Falcon's too) or GPT-NeoX's rotary_emb_base; 10000, every family's default,
/// without one. A number above 1 (a base of 1 or less does not turn, or turns ever faster).
inline double read_rope_theta(const hf_reader& r) {
  constexpr double lo = 1.0000001, hi = 1e12;  // 1e12: far beyond any trained base (LLaMA-3: 500000)
  if (const std::optional<json_in> p = r.find({"rope_parameters"}))
    if (const std::optional<json_in> t = p->require_object().find("rope_theta")) return t->number(lo, hi);
  return r.real({"rope_theta", "rotary_emb_base"}, lo, hi, 10000.0);
}

/// The rope types read_rope_scaling computes (rope_frequencies), in the order notes list them.
inline constexpr std::string_view hf_rope_types[] = {"default", "linear", "llama3", "dynamic", "yarn", "longrope"};

inline std::string known_rope_types() {
  std::string known;
  for (std::string_view k : hf_rope_types) known += (known.empty() ? "\"" : ", \"") + std::string(k) + "\"";
  return known;
}

/// Rotary's scaled frequencies: transformers 5's rope_parameters, else rope_scaling (earlier
/// versions), whose rope_type (or its legacy spelling, type) is "default" (or absent, or the
/// member null: base^(-2i/D)), "linear" (factor) or "llama3" (factor, low_freq_factor,
/// high_freq_factor and original_max_position_embeddings: the config's own member first, then
/// the dict's, then max_position_embeddings, as transformers 5's standardize_rope_params) or
/// "dynamic" (factor and the config's max_position_embeddings, which transformers 5's
/// _compute_dynamic_ntk_parameters reads: the frequencies depend on the plan's sequence, so
/// builders.hpp rope_frequencies computes them at the build's) or "yarn" (factor,
/// original_max_position_embeddings as llama3's, and the optional beta_fast, beta_slow (32 and 1
/// without them), mscale, mscale_all_dim, attention_factor and truncate (true)) or "longrope"
/// (short_factor and long_factor, one a turned pair, checked by read_hf_config against the
/// rotary's dims; original_max_position_embeddings as llama3's; factor, else
/// max_position_embeddings / original_max_position_embeddings; the optional attention_factor).
/// model_type phi3's "su" and "yarn" are its "longrope", as Phi3Config reads them. Any other
/// type (su, ...) is kept as `uncomputed`, with the member as
/// given: a plan's shapes and prices do not depend on the frequencies, and read_hf_config notes
/// that the rotaries turn at base^(-2i/D). Bounds: factor in [1e-6, 1e6], 0 < low_freq_factor <
/// high_freq_factor <= 1e6, original_max_position_embeddings a position count; yarn's beta_fast,
/// beta_slow and attention_factor in [1e-6, 1e6], mscale and mscale_all_dim in [0, 1e6] (0: not
/// given, as transformers' truthiness reads it).
inline rope_scaling_config read_rope_scaling(const hf_reader& r) {
  rope_scaling_config s;
  std::optional<json_in> p = r.find({"rope_parameters"});
  if (!p) p = r.find({"rope_scaling"});
  if (!p) return s;
  for (const auto& [key, v] : p->members())  // Gemma-3's {"full_attention": {...}, "sliding_attention": {...}}
    if (v.raw().is_object()) v.fail("is a rope configuration of its own (one per layer type), which autoshard does not read");
  std::optional<json_in> t = p->find("rope_type");
  if (!t) t = p->find("type");
  std::string type = t ? t->string() : "default";
  // Phi3Config reads an older "su" or "yarn" as "longrope" (configuration_phi3.py, "for backward compatibility").
  if (const std::optional<json_in> mt = r.in.find("model_type"); mt && mt->raw() == "phi3" && (type == "su" || type == "yarn"))
    type = "longrope";
  if (std::find(std::begin(hf_rope_types), std::end(hf_rope_types), type) == std::end(hf_rope_types)) {
    s.uncomputed = type;
    s.given = p->raw().dump();
    return s;
  }
  if (type == "default") return s;
  s.type = type;
  const auto need = [&](const char* key, double lo, double hi) {
    const std::optional<json_in> v = p->find(key);
    if (!v) p->fail("has no \"" + std::string(key) + "\", which rope type \"" + type + "\" needs");
    return v->number(lo, hi);
  };
  const auto optional = [&](const char* key, double lo, double hi, double fallback) {
    const std::optional<json_in> v = p->find(key);
    return v ? v->number(lo, hi) : fallback;
  };
  if (type == "longrope") {
    for (const auto& [key, list] : {std::pair<const char*, std::vector<double>*>{"short_factor", &s.short_factor}, {"long_factor", &s.long_factor}}) {
      const std::optional<json_in> v = p->find(key);
      if (!v) p->fail("has no \"" + std::string(key) + "\", which rope type \"longrope\" needs");
      for (const json_in& e : v->elements(max_rotary_frequencies)) list->push_back(e.number(1e-6, 1e6));
    }
    s.attention_factor = optional("attention_factor", 1e-6, 1e6, 0.0);
  } else {
    s.factor = need("factor", 1e-6, 1e6);
  }
  if (type == "yarn") {
    s.beta_fast = optional("beta_fast", 1e-6, 1e6, 32.0);
    s.beta_slow = optional("beta_slow", 1e-6, 1e6, 1.0);
    s.mscale = optional("mscale", 0.0, 1e6, 0.0);
    s.mscale_all_dim = optional("mscale_all_dim", 0.0, 1e6, 0.0);
    s.attention_factor = optional("attention_factor", 1e-6, 1e6, 0.0);
    if (const std::optional<json_in> v = p->find("truncate")) s.truncate = v->boolean();
  }
  if (type == "llama3" || type == "yarn" || type == "longrope") {
    if (type == "llama3") {
      s.low_freq_factor = need("low_freq_factor", 1e-6, 1e6);
      s.high_freq_factor = need("high_freq_factor", 1e-6, 1e6);
      if (!(s.high_freq_factor > s.low_freq_factor))
        p->fail("has high_freq_factor " + json_excerpt((*p)["high_freq_factor"].raw()) + ", not above its low_freq_factor " +
                json_excerpt((*p)["low_freq_factor"].raw()));
    }
    if (const std::optional<json_in> o = r.find({"original_max_position_embeddings"}))
      s.original_max_positions = o->small_integer(1, hf_max_positions);
    else if (const std::optional<json_in> d = p->find("original_max_position_embeddings"))
      s.original_max_positions = d->small_integer(1, hf_max_positions);
    else
      s.original_max_positions = r.need({"max_position_embeddings"}, 1, hf_max_positions);
  }
  if (type == "dynamic") s.original_max_positions = r.need({"max_position_embeddings"}, 1, hf_max_positions);
  if (type == "longrope") {  // transformers: factor, else the context's growth over the pretraining one
    if (p->find("factor"))
      s.factor = need("factor", 1e-6, 1e6);
    else
      s.factor = static_cast<double>(r.need({"max_position_embeddings"}, 1, hf_max_positions)) / s.original_max_positions;
  }
  return s;
}

/// The part of each head the rotaries turn, as transformers 5 reads it (its R is int(head_dim x
/// the part), _compute_default_rope_parameters): rope_parameters' partial_rotary_factor
/// (rope_scaling's, without rope_parameters, as read_rope_scaling), else GPT-NeoX's rotary_pct
/// (GPTNeoXConfig's default 0.25; a top-level partial_rotary_factor is not read there), else the
/// config's own partial_rotary_factor (Phi-3's, Phi-4-mini's), else 1. A number in [0, 1], and
/// the member it was read from (none: the default), for read_hf_config's checks against the head.
inline std::pair<double, std::optional<json_in>> read_rotary_pct(const hf_reader& r, const std::string& t) {
  std::optional<json_in> p = r.find({"rope_parameters"});
  if (!p) p = r.find({"rope_scaling"});
  std::optional<json_in> v = p ? p->require_object().find("partial_rotary_factor") : std::nullopt;
  if (!v) v = r.find({t == "gpt_neox" ? "rotary_pct" : "partial_rotary_factor"});
  if (!v) return {t == "gpt_neox" ? 0.25 : 1.0, std::nullopt};
  return {v->number(0.0, 1.0), v};
}

/// Where model_type `t`'s configuration class keeps its norms' epsilon, and its default there
/// (transformers' configuration_<t>.py): key nullptr where the modeling code fixes it (OPT's
/// nn.LayerNorm(...) takes torch's 1e-5, its config has no key).
struct hf_norm_epsilon_key {
  const char* key;
  double fallback;
};
inline hf_norm_epsilon_key hf_norm_epsilon_of(const std::string& t) {
  if (t == "gpt2" || t == "bloom" || t == "falcon") return {"layer_norm_epsilon", 1e-5};
  if (t == "bert" || t == "roberta") return {"layer_norm_eps", 1e-12};
  if (t == "gpt_neox") return {"layer_norm_eps", 1e-5};
  if (t == "phi3") return {"rms_norm_eps", 1e-5};
  if (t == "llama" || t == "mistral" || t == "qwen2" || t == "gemma") return {"rms_norm_eps", 1e-6};
  return {nullptr, default_norm_epsilon};  // opt
}

/// The norms' epsilon of model_type `t` (hf_norm_epsilon_of: its key, else its default): a
/// finite number in (0, max_norm_epsilon], an error naming the key and the value otherwise.
inline double read_norm_epsilon(const hf_reader& r, const std::string& t) {
  const hf_norm_epsilon_key k = hf_norm_epsilon_of(t);
  const std::optional<json_in> v = k.key ? r.find({k.key}) : std::nullopt;
  if (!v) return k.fallback;
  const double e = v->number();
  if (!valid_norm_epsilon(e)) v->fail_expected("a norm epsilon: a finite number in (0, " + exact_number(max_norm_epsilon) + "]");
  return e;
}

/// The sliding window of Mistral, Phi-3 and Qwen2 and the layers it applies to, as transformers 5
/// applies it (5.25: masking_utils.py, models/{mistral,phi3,qwen2}/configuration_*.py and
/// modeling_*.py). A sliding layer's query at q keeps the keys k with q - W < k <= q
/// (sliding_window_overlay's kv_idx > q_idx - sliding_window and'd with the causal mask): W keys,
/// itself included (op_attrs::window).
///   mistral: every layer when sliding_window is set (MistralConfig's default 4096 when the key
///     is absent; null: none); a layer_types is not read (MistralModel masks every layer alike).
///   phi3: every layer when sliding_window is set (Phi3Config's default: none).
///   qwen2: none unless use_sliding_window (default false; Qwen2Config then sets sliding_window
///     None); with it, sliding_window (default 4096; null: none) on the layers layer_types names
///     "sliding_attention", or without layer_types on layers i >= max_window_layers (default 28).
///     A layer_types naming a sliding layer without a window is refused (transformers raises
///     "Could not find a `sliding_window` argument in the config" building its mask).
/// W is a key count in [1, hf_max_positions]; a window at least the sequence is kept (it is the
/// model, and masks nothing more at that sequence).
inline void read_sliding_window(const hf_reader& r, const std::string& t, transformer_config& c) {
  if (t != "mistral" && t != "phi3" && t != "qwen2") return;
  const bool qwen_on = t != "qwen2" || r.flag({"use_sliding_window"}, false);
  const int fallback = t == "phi3" ? 0 : 4096;
  int w = 0;
  if (qwen_on) {
    if (!r.in.has("sliding_window")) w = fallback;
    else if (const std::optional<json_in> v = r.in.find("sliding_window")) w = v->small_integer(1, hf_max_positions);
  }
  c.sliding_window = w;
  c.sliding_layers.clear();
  c.max_window_layers = 0;
  if (t != "qwen2") return;
  c.max_window_layers = r.get({"max_window_layers"}, 0, hf_max_layers, 28);
  if (const std::optional<json_in> lt = r.in.find("layer_types")) {
    const std::vector<json_in> types = lt->elements(static_cast<std::size_t>(hf_max_layers));
    if (types.size() != static_cast<std::size_t>(c.layers))
      lt->fail("names " + std::to_string(types.size()) + " layer types for " + std::to_string(c.layers) + " layers");
    for (const json_in& e : types) {
      const bool sliding = e.one_of({"full_attention", "sliding_attention"}) == "sliding_attention";
      if (sliding && w == 0)
        e.fail("is a sliding layer, but the config has no sliding window (" +
               std::string(qwen_on ? "sliding_window is null" : "use_sliding_window is not true") + ")");
      c.sliding_layers.push_back(sliding);
    }
  }
}

/// The members of config.json that only model_type `t`'s architecture has (its MLP width,
/// norms, biases, activation, key/value heads, position offsets, tied embeddings, rotary's base).
inline void read_hf_family(const hf_reader& r, const std::string& t, transformer_config& c) {
  c.norm_epsilon = read_norm_epsilon(r, t);
  if (t != "gpt2" && t != "bert" && t != "roberta" && t != "opt" && t != "bloom") {
    c.rope_theta = read_rope_theta(r);
    c.rope_scaling = read_rope_scaling(r);
  }
  if (t == "gpt2") {
    c.ffn = r.get({"n_inner"}, 1, hf_max_ffn, 4 * c.hidden);
    c.max_positions = r.get({"n_positions", "max_position_embeddings"}, 1, hf_max_positions, 1024);
    c.activation = r.activation({"activation_function"}, op_kind::gelu);
    // transformers' GPT2Config: 0.1 each; a model trained with all three 0 has no dropouts.
    c.dropout = r.real({"resid_pdrop"}, 0, 1, 0.1) > 0 || r.real({"embd_pdrop"}, 0, 1, 0.1) > 0 ||
                r.real({"attn_pdrop"}, 0, 1, 0.1) > 0;
  } else if (t == "bert" || t == "roberta") {
    c.prefix = t;
    c.ffn = r.need({"intermediate_size"}, 1, hf_max_ffn);
    c.max_positions = r.get({"max_position_embeddings"}, 1, hf_max_positions, 512);
    c.type_vocab = r.get({"type_vocab_size"}, 0, hf_max_vocab, 2);
    c.activation = r.activation({"hidden_act"}, op_kind::gelu_erf);
    if (t == "roberta") c.position_offset = r.get({"pad_token_id"}, 0, hf_max_positions, 1) + 1;
  } else if (t == "llama" || t == "mistral" || t == "qwen2" || t == "gemma" || t == "phi3") {
    c.ffn = r.need({"intermediate_size"}, 1, hf_max_ffn);
    c.kv_heads = r.get({"num_key_value_heads"}, 1, hf_max_heads, c.heads);
    c.head_size = r.get({"head_dim"}, 1, hf_max_heads, 0);
    // Gemma reads hidden_activation only; without it transformers uses gelu_pytorch_tanh
    // (older configs' hidden_act "gelu" is ignored, with a warning).
    c.activation = t == "gemma" ? r.activation({"hidden_activation"}, op_kind::gelu)
                                : r.activation({"hidden_act"}, op_kind::silu);
    c.tie_embeddings = r.flag({"tie_word_embeddings"}, t == "gemma");
    // modeling_gemma.py: GemmaRMSNorm scales by 1 + weight, and GemmaModel multiplies the
    // embeddings by its normalizer, sqrt(hidden_size); no config key says either.
    c.gemma_scaling = t == "gemma";
    const bool attention_bias = r.flag({"attention_bias"}, false);
    c.qkv_bias = t == "qwen2" || attention_bias;
    c.out_bias = attention_bias && t != "qwen2";
    c.mlp_bias = r.flag({"mlp_bias"}, false);
    c.fused_qkv = t == "phi3";
  } else if (t == "opt") {
    c.ffn = r.need({"ffn_dim"}, 1, hf_max_ffn);
    c.position_offset = 2;  // OPTLearnedPositionalEmbedding's offset
    c.max_positions = r.get({"max_position_embeddings"}, 1, hf_max_positions, 2048) + 2;
    c.embed_proj = r.get({"word_embed_proj_dim"}, 1, hf_max_hidden, c.hidden);
    c.pre_norm = r.flag({"do_layer_norm_before"}, true);
    c.final_norm = c.pre_norm && !r.flag({"_remove_final_layer_norm"}, false);
    c.qkv_bias = c.out_bias = c.mlp_bias = r.flag({"enable_bias"}, true);
    c.activation = r.activation({"activation_function"}, op_kind::relu);
    c.tie_embeddings = r.flag({"tie_word_embeddings"}, true);
  } else if (t == "gpt_neox") {
    c.ffn = r.need({"intermediate_size"}, 1, hf_max_ffn);
    c.parallel_residual = r.flag({"use_parallel_residual"}, true);
    c.qkv_bias = c.out_bias = r.flag({"attention_bias"}, true);
    c.mlp_bias = true;
    c.activation = r.activation({"hidden_act"}, op_kind::gelu_erf);
    c.tie_embeddings = r.flag({"tie_word_embeddings"}, false);
  } else if (t == "bloom") {
    c.ffn = 4 * c.hidden;
    c.qkv_bias = c.out_bias = c.mlp_bias = true;
    c.rotary = false;  // ALiBi: build_bloom's attention adds BLOOM's biases (alibi "bloom")
    c.tie_embeddings = r.flag({"tie_word_embeddings"}, true);
  } else {  // falcon
    c.ffn = r.get({"ffn_hidden_size"}, 1, hf_max_ffn, 4 * c.hidden);
    c.new_decoder_architecture = r.flag({"new_decoder_architecture"}, false);
    const bool multi_query = r.flag({"multi_query"}, true);
    c.kv_heads = c.new_decoder_architecture ? r.get({"num_kv_heads", "n_head_kv"}, 1, hf_max_heads, c.heads)
                 : multi_query              ? 1
                                            : c.heads;
    c.layer_norms = r.get({"num_ln_in_parallel_attn"}, 1, 2, c.new_decoder_architecture ? 2 : 1);
    c.parallel_residual = r.flag({"parallel_attn"}, true);
    c.qkv_bias = c.out_bias = c.mlp_bias = r.flag({"bias"}, false);
    c.rotary = !r.flag({"alibi"}, false);  // alibi: build_falcon's attention adds Falcon's biases (alibi "falcon")
    c.activation = r.activation({"activation"}, op_kind::gelu_erf);
    c.tie_embeddings = r.flag({"tie_word_embeddings"}, true);
  }
}

/// torch_dtype (or dtype): float32, float16, bfloat16 or float64; float32 when absent.
inline void read_hf_dtype(const hf_reader& r, hf_model& m) {
  transformer_config& c = m.config;
  const std::optional<json_in> dt = r.find({"torch_dtype", "dtype"});
  c.type = dtype::f32;
  if (dt) {
    std::string s = dt->string();
    if (s.rfind("torch.", 0) == 0) s.erase(0, 6);
    const auto p = parse_dtype(s);
    if (!p || (*p != dtype::f32 && *p != dtype::f16 && *p != dtype::bf16 && *p != dtype::f64))
      dt->fail_expected("float32, float16, bfloat16 or float64");
    c.type = *p;
    m.dtype_given = true;
  }
}

}  // namespace detail

/// Reads a parsed config.json. `what` names it in errors (a file name). Throws io_error naming
/// the key for a missing or out-of-range value, and for a model_type it has no builder for.
inline hf_model read_hf_config(const nlohmann::json& j, const std::string& what = "config.json") {
  if (!j.is_object()) throw io_error(what + ": a Hugging Face config.json is a JSON object");
  detail::hf_reader r{json_in(j, what)};
  auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) r.fail("no \"model_type\" string: not a Hugging Face config.json");
  hf_model m;
  m.model_type = mt->get<std::string>();
  std::string known;
  bool supported = false;
  for (std::string_view t : hf_model_types) {
    known += (known.empty() ? "" : ", ") + std::string(t);
    supported = supported || t == m.model_type;
  }
  if (!supported) r.fail("model_type " + quoted_text(m.model_type) + " is not supported (supported: " + known + ")");

  using namespace detail;
  transformer_config& c = m.config;
  const std::string& t = m.model_type;
  c.layers = r.need({"num_hidden_layers", "n_layer", "num_layers"}, 1, hf_max_layers);
  c.hidden = r.need({"hidden_size", "n_embd", "n_embed", "d_model"}, 1, hf_max_hidden);
  c.heads = r.need({"num_attention_heads", "n_head", "num_heads"}, 1, hf_max_heads);
  c.vocab = r.need({"vocab_size"}, 1, hf_max_vocab);
  c.kv_heads = 0;
  c.type_vocab = 0;
  c.max_positions = 0;
  c.batch = 8;
  c.mode = default_run_mode;
  const int positions = r.get({"max_position_embeddings", "n_positions", "seq_length"}, 1, hf_max_positions, 2048);

  read_hf_family(r, t, c);
  read_sliding_window(r, t, c);
  std::optional<json_in> pct_member;
  if (c.rotary && t != "gpt2" && t != "bert" && t != "roberta" && t != "opt" && t != "bloom")
    std::tie(c.rotary_pct, pct_member) = read_rotary_pct(r, t);
  if (!c.rope_scaling.uncomputed.empty())
    m.notes.push_back("rope type " + quoted_text(c.rope_scaling.uncomputed) + " (rope_scaling) is not computed: the rotaries turn at " +
                      "rope_theta^(-2i/D), which the plan's shapes and prices do not depend on, and verify runs them so (computed: " +
                      known_rope_types() + ")");
  if (c.head_size == 0 && c.hidden % c.heads != 0)
    r.fail("hidden size " + std::to_string(c.hidden) + " is not a multiple of " + std::to_string(c.heads) + " heads");
  if (c.heads % c.kv() != 0)
    r.fail(std::to_string(c.heads) + " attention heads are not a multiple of " + std::to_string(c.kv()) +
           " key/value heads");
  if (c.rotary_pct != 1.0) {  // a partial rotary: transformers' R = int(head_dim x part), its first R dims of each head
    const std::string what = (pct_member ? pct_member->path() : std::string("rotary_pct (GPT-NeoX's default)")) + " " +
                             exact_number(c.rotary_pct) + " of heads of " + std::to_string(c.head_dim()) + " turns int(" +
                             std::to_string(c.head_dim()) + " x " + exact_number(c.rotary_pct) + ") = " +
                             std::to_string(c.rotary_dims()) + " dims";
    if (c.rotary_dims() < 2 || c.rotary_dims() % 2 != 0) r.fail(what + ": rotary turns an even number of dims, at least 2");
    if (t != "gpt_neox" && t != "phi3" && c.rotary_dims() != c.head_dim())
      r.fail(what + ", but transformers' " + t + " turns the whole head (its apply_rotary_pos_emb has no part passed through)");
  }
  if (const rope_scaling_config& s = c.rope_scaling; s.type == "longrope")
    for (const auto& [key, list] : {std::pair<const char*, const std::vector<double>*>{"short_factor", &s.short_factor}, {"long_factor", &s.long_factor}})
      if (list->size() != static_cast<std::size_t>(c.rotary_dims() / 2))
        r.fail(std::string("rope scaling's ") + key + " has " + std::to_string(list->size()) + " factors, but the rotaries turn " +
               std::to_string(c.rotary_dims()) + " dims of each head: one a pair, " + std::to_string(c.rotary_dims() / 2) + ", is needed");
  // Default sequence: the whole learned position table (less its offset), else the context, at most 2048.
  const std::int64_t table = c.max_positions > 0 ? c.max_positions - c.position_offset : positions;
  if (table < 1) r.fail("the position table has no row past its offset of " + std::to_string(c.position_offset));
  c.seq = static_cast<int>(std::min<std::int64_t>(table, 2048));

  read_hf_dtype(r, m);
  return m;
}

/// The largest config.json read (published ones have a few KiB; a tokenizer or a chat
/// template pasted in stays far below).
inline constexpr std::uint64_t hf_config_max_bytes = std::uint64_t{16} << 20;

/// Reads DIR/config.json, or a config file itself (a regular file of at most hf_config_max_bytes).
inline hf_model read_hf_config_file(const std::filesystem::path& dir_or_file) {
  std::error_code ec;
  const std::filesystem::path p =
      std::filesystem::is_directory(dir_or_file, ec) ? dir_or_file / "config.json" : dir_or_file;
  const std::string text = read_regular_file(p.string(), "Hugging Face config", hf_config_max_bytes);
  return read_hf_config(parse_json_text(text, quoted_path(p.string())), p.string());
}

/// Builds the graph of a Hugging Face model: for bert and roberta the base model (BertModel /
/// RobertaModel, with the pooler) in inference and the masked LM (BertForMaskedLM /
/// RobertaForMaskedLM) in training; the causal LM otherwise.
inline model_graph build_hf(const hf_model& m) {
  const std::string& t = m.model_type;
  if (t == "gpt2") return build_gpt2(m.config);
  if (t == "bert" || t == "roberta") return build_bert(m.config);
  if (t == "opt") return build_opt(m.config);
  if (t == "gpt_neox") return build_gpt_neox(m.config);
  if (t == "bloom") return build_bloom(m.config);
  if (t == "falcon") return build_falcon(m.config);
  for (std::string_view l : {"llama", "mistral", "qwen2", "gemma", "phi3"})
    if (t == l) return build_llama(m.config);
  throw graph_error("no builder for model_type " + quoted_text(t));
}

/// The config.json of `m`, as the family's configuration class writes it (the keys
/// read_hf_config reads back to the same model), with what transformers needs to compute and
/// generate as the graph does: the norms' epsilon (config.norm_epsilon, under the family's key;
/// OPT's, which no key says, must be its fixed 1e-5: graph_error otherwise), rotary's base (rope_theta,
/// GPT-NeoX's rotary_emb_base), scaling (rope_scaling) and part of the head (partial_rotary_factor,
/// GPT-NeoX's rotary_pct), the sliding window (Mistral's, Phi-3's, Qwen2's, on its layers),
/// and the begin/end-of-sequence ids
/// (LLaMA's 1 and 2, GPT-2's last token).
inline nlohmann::json to_hf_config(const hf_model& m) {
  const transformer_config& c = m.config;
  const std::string& t = m.model_type;
  const char* torch_dtype = c.type == dtype::f16 ? "float16" : c.type == dtype::bf16 ? "bfloat16"
                            : c.type == dtype::f64 ? "float64" : "float32";
  nlohmann::json j{{"model_type", t}, {"vocab_size", c.vocab}, {"torch_dtype", torch_dtype}};
  auto act = [](op_kind k) {  // transformers' ACT2FN names: "gelu" is the exact form
    return k == op_kind::gelu ? std::string("gelu_new") : k == op_kind::gelu_erf ? std::string("gelu") : std::string(to_string(k));
  };
  if (t == "gpt2") {
    j.update({{"n_layer", c.layers}, {"n_embd", c.hidden}, {"n_head", c.heads}, {"n_inner", c.ffn},
              {"n_positions", c.max_positions}, {"n_ctx", c.max_positions}, {"activation_function", act(c.activation)},
              {"bos_token_id", c.vocab - 1}, {"eos_token_id", c.vocab - 1}});
    if (!c.dropout) j.update({{"resid_pdrop", 0.0}, {"embd_pdrop", 0.0}, {"attn_pdrop", 0.0}});
  } else if (t == "bloom") {
    j.update({{"n_layer", c.layers}, {"hidden_size", c.hidden}, {"n_head", c.heads},
              {"tie_word_embeddings", c.tie_embeddings}});
  } else {
    j.update({{"num_hidden_layers", c.layers}, {"hidden_size", c.hidden}, {"num_attention_heads", c.heads}});
    if (t == "bert" || t == "roberta") {
      j.update({{"intermediate_size", c.ffn}, {"max_position_embeddings", c.max_positions},
                {"type_vocab_size", c.type_vocab}, {"hidden_act", act(c.activation)}});
      if (t == "roberta") j["pad_token_id"] = c.position_offset - 1;
    } else if (t == "opt") {
      j.update({{"ffn_dim", c.ffn}, {"max_position_embeddings", c.max_positions - 2},
                {"word_embed_proj_dim", c.embed_proj > 0 ? c.embed_proj : c.hidden}, {"do_layer_norm_before", c.pre_norm},
                {"_remove_final_layer_norm", c.pre_norm && !c.final_norm}, {"enable_bias", c.qkv_bias},
                {"activation_function", act(c.activation)}, {"tie_word_embeddings", c.tie_embeddings}});
    } else if (t == "gpt_neox") {
      j.update({{"intermediate_size", c.ffn}, {"use_parallel_residual", c.parallel_residual},
                {"attention_bias", c.qkv_bias}, {"hidden_act", act(c.activation)},
                {"tie_word_embeddings", c.tie_embeddings}, {"max_position_embeddings", c.seq},
                {"rotary_emb_base", c.rope_theta}, {"rotary_pct", c.rotary_pct}});  // always: GPTNeoXConfig's default is 0.25
    } else if (t == "falcon") {
      j.update({{"ffn_hidden_size", c.ffn}, {"new_decoder_architecture", c.new_decoder_architecture},
                {"multi_query", c.kv() == 1}, {"num_kv_heads", c.kv()}, {"parallel_attn", c.parallel_residual},
                {"bias", c.qkv_bias}, {"alibi", !c.rotary}, {"tie_word_embeddings", c.tie_embeddings},
                {"activation", act(c.activation)}, {"rope_theta", c.rope_theta}});
      if (c.new_decoder_architecture) j["num_ln_in_parallel_attn"] = c.layer_norms;
    } else {  // the LLaMA family
      j.update({{"intermediate_size", c.ffn}, {"num_key_value_heads", c.kv()}, {"hidden_act", act(c.activation)},
                {"tie_word_embeddings", c.tie_embeddings}, {"max_position_embeddings", c.seq},
                {"mlp_bias", c.mlp_bias}, {"rope_theta", c.rope_theta}});
      if (c.vocab > 2) j.update({{"bos_token_id", 1}, {"eos_token_id", 2}});
      if (c.head_size > 0) j["head_dim"] = c.head_size;
      if (t != "qwen2") j["attention_bias"] = c.qkv_bias;
      if (t == "gemma") j["hidden_activation"] = act(c.activation);
      // The sliding window (read_sliding_window): null where there is none, as MistralConfig's
      // default is a 4096-key window; Qwen2's with the layers it applies to, max_window_layers
      // and, where the config named them one by one, layer_types.
      if (t == "mistral" || t == "phi3") j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json();
      if (t == "qwen2") {
        j["use_sliding_window"] = c.sliding_window > 0;
        if (c.sliding_window > 0) {
          j.update({{"sliding_window", c.sliding_window}, {"max_window_layers", c.max_window_layers}});
          if (!c.sliding_layers.empty()) {
            nlohmann::json types = nlohmann::json::array();
            for (int i = 0; i < c.layers; ++i) types.push_back(c.window_of(i) > 0 ? "sliding_attention" : "full_attention");
            j["layer_types"] = std::move(types);
          }
        }
      }
    }
  }
  if (c.gemma_scaling != (t == "gemma"))  // no key says it: transformers' gemma code does it, and only it
    throw graph_error(t + " config: " + (c.gemma_scaling ? "Gemma's scaling (norms by 1 + weight, embeddings by sqrt(hidden)) is "
                                                          "only model_type \"gemma\"'s, which no key of another says"
                                                        : "transformers' gemma scales its norms by 1 + weight and its embeddings by "
                                                          "sqrt(hidden): a config without gemma_scaling is another model"));
  if (const detail::hf_norm_epsilon_key k = detail::hf_norm_epsilon_of(t); k.key)
    j[k.key] = c.norm_epsilon;
  else if (c.norm_epsilon != k.fallback)
    throw graph_error(t + " config: its norms' epsilon " + exact_number(c.norm_epsilon) + " is not " + exact_number(k.fallback) +
                      ", which transformers' " + t + " fixes (its config.json has no key to say another)");
  // A partial rotary (transformers 4's and 5's top-level member; GPT-NeoX's rotary_pct above).
  if (c.rotary && c.rotary_pct != 1.0 && t != "gpt_neox" && j.contains("rope_theta")) j["partial_rotary_factor"] = c.rotary_pct;
  // Scaled rotary frequencies as transformers 4 writes them (transformers 5 reads them too); a
  // type not computed as the config gave it.
  if (c.rotary && !c.rope_scaling.given.empty() && j.contains(t == "gpt_neox" ? "rotary_emb_base" : "rope_theta"))
    j["rope_scaling"] = nlohmann::json::parse(c.rope_scaling.given);
  if (c.rotary && !c.rope_scaling.type.empty() && j.contains(t == "gpt_neox" ? "rotary_emb_base" : "rope_theta")) {
    const rope_scaling_config& s = c.rope_scaling;
    nlohmann::json rs{{"rope_type", s.type}, {"factor", s.factor}};
    if (s.type == "llama3")
      rs.update({{"low_freq_factor", s.low_freq_factor}, {"high_freq_factor", s.high_freq_factor},
                 {"original_max_position_embeddings", s.original_max_positions}});
    if (s.type == "dynamic") j["max_position_embeddings"] = s.original_max_positions;  // past it, the sequence scales the base
    if (s.type == "longrope") {
      rs.update({{"original_max_position_embeddings", s.original_max_positions}, {"short_factor", s.short_factor},
                 {"long_factor", s.long_factor}});
      if (s.attention_factor != 0.0) rs["attention_factor"] = s.attention_factor;
    }
    if (s.type == "yarn") {
      rs.update({{"original_max_position_embeddings", s.original_max_positions}, {"beta_fast", s.beta_fast},
                 {"beta_slow", s.beta_slow}, {"truncate", s.truncate}});
      for (const auto& [key, v] : {std::pair<const char*, double>{"mscale", s.mscale}, {"mscale_all_dim", s.mscale_all_dim},
                                   {"attention_factor", s.attention_factor}})
        if (v != 0.0) rs[key] = v;
    }
    j["rope_scaling"] = rs;
  }
  return j;
}

}  // namespace autoshard

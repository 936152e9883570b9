#pragma once
// --model and its size overrides, shared by `plan` and `synth`.
#include "common.hpp"

#include <autoshard/graph/graph.hpp>
#if defined(AUTOSHARD_TOOL_HAVE_ONNX)
#include <autoshard/onnx/onnx.hpp>  // read_onnx_file: --model model.onnx
#endif
#if defined(AUTOSHARD_TOOL_HAVE_TENSOR)
#include "hf_weights.hpp"  // check_weights_match: a Hugging Face directory's checkpoint against its graph
#endif

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

namespace autoshard::tool {

/// `--mode`'s spelling of a run_mode.
inline const char* mode_flag(run_mode m) { return m == run_mode::training ? "train" : "infer"; }

struct model_options {
  std::string model = "gpt2";
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0, seq = 0, batch = 0;
  std::int64_t kv_cache = 0;  // transformer_config::past
  std::string dtype_name;
  std::string mode = mode_flag(default_run_mode);  // the library's default, not a second one

  /// The size overrides must be positive when given: 0 or -1 used to fall back to the
  /// preset's value without a word (synth --layers -1 wrote 12 layers).
  /// `decode`: offer --kv-cache (plan; synth writes weights, which a cache does not change).
  void add_to(CLI::App& cmd, bool decode = false) {
    cmd.add_option("--model", model,
                   "preset (gpt2, gpt2-medium, gpt2-large, gpt2-xl, bert-base, bert-large, llama-7b, llama-70b), "
                   "a Hugging Face model directory (or its config.json), an ONNX file (.onnx), or a model JSON file")
        ->capture_default_str();
    cmd.add_option("--mode", mode, "train (forward, backward, gradients and optimizer state) or infer (forward only)")
        ->check(CLI::IsMember({mode_flag(run_mode::training), mode_flag(run_mode::inference)}))
        ->capture_default_str();
    cmd.add_option("--layers", layers, "override the preset's number of layers")->check(positive_int());
    cmd.add_option("--hidden", hidden, "override the hidden size")->check(positive_int());
    cmd.add_option("--heads", heads, "override the attention heads")->check(positive_int());
    cmd.add_option("--kv-heads", kv_heads, "override the key/value heads (grouped-query attention)")->check(positive_int());
    cmd.add_option("--ffn", ffn, "override the MLP width (default 4 x hidden for GPT-2 and BERT)")->check(positive_int());
    cmd.add_option("--vocab", vocab, "override the vocabulary size")->check(positive_int());
    cmd.add_option("--seq", seq, "sequence length")->check(positive_int());
    cmd.add_option("--batch", batch, "global batch size")->check(positive_int());
    if (decode)
      cmd.add_option("--kv-cache", kv_cache,
                     "tokens of each sequence already in a key/value cache: plan the step after them (a decode step with --seq 1), "
                     "the cache held on the devices; --mode infer, decoders (LLaMA family, GPT-2, OPT, GPT-NeoX, BLOOM, Falcon; not "
                     "BERT, an encoder)")
          ->check(CLI::Range(std::int64_t{1}, max_attention_window));
    cmd.add_option("--dtype", dtype_name, "parameter and activation dtype (default bf16)")->check(dtype_value());
  }
  run_mode run() const { return mode == mode_flag(run_mode::training) ? run_mode::training : run_mode::inference; }
  /// Usage errors between the options (a subcommand's callback calls this): training needs a
  /// floating-point --dtype (i32, bool, u8 or int64 parameters have no gradients; such a plan
  /// was reported as a training plan).
  void check_flags() const {
    if (run() == run_mode::training && kv_cache > 0)
      throw CLI::ValidationError("--kv-cache", "a step after a key/value cache (" + std::to_string(kv_cache) +
                                                    " tokens) is a decode step, which is inference: give --mode infer");
    if (run() == run_mode::training && !dtype_name.empty() && !is_floating(*parse_dtype(dtype_name)))
      throw CLI::ValidationError("--dtype", "training needs a floating-point dtype (f32, bf16, f16 or f64), not " +
                                                quoted_text(dtype_name) + " (use --mode infer for an integer model)");
  }

  /// --heads and --kv-heads: a model with as many key/value heads as heads (no grouped-query
  /// attention) keeps it with a new --heads (llama-7b --heads 8 is 8 and 8, not 8 and 32).
  void set_heads(transformer_config& c) const {
    const bool mha = c.kv() == c.heads;
    if (heads > 0) c.heads = heads;
    if (kv_heads > 0) c.kv_heads = kv_heads;
    else if (heads > 0 && mha && c.kv_heads > 0) c.kv_heads = heads;
  }
  bool is_preset() const { return !std::filesystem::exists(model); }

  /// The MLP width a new --hidden implies where the model's is 4 x hidden (GPT-2, BERT, BLOOM,
  /// Falcon), computed without overflow: --hidden 2147483647 wrapped to -4 (signed overflow), and
  /// the builder blamed "layers, hidden, heads, ffn, ... must be positive" on sizes given positive.
  int four_hidden() const {
    const std::int64_t w = 4 * std::int64_t{hidden};
    if (w > std::numeric_limits<int>::max())
      throw spec_error("--hidden " + std::to_string(hidden) + ": the MLP width it implies, 4 x hidden = " + std::to_string(w) +
                       ", exceeds 2147483647");
    return static_cast<int>(w);
  }

  /// Whether --model is a Hugging Face directory, or a JSON file named config.json or with a
  /// "model_type".
  bool is_hf() const {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (is_preset()) return false;
    return fs::is_directory(model, ec) || fs::path(model).filename() == "config.json" || has_model_type(model);
  }

#if defined(AUTOSHARD_TOOL_HAVE_TENSOR)
  /// The files of the checkpoint that build() reads beside a Hugging Face config (hf_dir()'s
  /// index and every safetensors file it names, or its model.safetensors); none for other
  /// models. They are inputs: `plan --model DIR --out DIR/model.safetensors` replaced the
  /// weights it had just checked against the config.
  std::vector<std::filesystem::path> checkpoint_files() const {
    if (is_onnx() || !is_hf()) return {};
    return hf_checkpoint_files(hf_dir());
  }
#endif

  /// A Hugging Face directory, or a JSON file with a "model_type": its config with the size
  /// overrides applied; nullopt for presets and autoshard model JSON files.
  std::optional<hf_model> hf() const {
    if (!is_hf()) return std::nullopt;
    hf_model m = read_hf_config_file(model);
    transformer_config& c = m.config;
    if (m.model_type == "bloom" && ffn > 0)
      throw spec_error("--ffn: BLOOM's MLP is 4 x hidden wide (its config.json has no width to set)");
    // Sizes the config derives from hidden follow a new --hidden.
    if (hidden > 0) {
      if (ffn == 0 && c.ffn == 4 * c.hidden) c.ffn = four_hidden();
      if (c.embed_proj == c.hidden) c.embed_proj = hidden;
    }
    if (layers > 0 && !c.sliding_layers.empty() && c.sliding_layers.size() != static_cast<std::size_t>(layers))
      throw spec_error("--layers " + std::to_string(layers) + ": the config's layer_types names the sliding-window layers of " +
                       std::to_string(c.sliding_layers.size()) + " layers one by one; give it as many");
    if (layers > 0) c.layers = layers;
    if (hidden > 0) c.hidden = hidden;
    set_heads(c);
    if (ffn > 0) c.ffn = ffn;
    if (vocab > 0) c.vocab = vocab;
    if (seq > 0) c.seq = seq;  // a learned position table must be long enough: the builder says so
    if (batch > 0) c.batch = batch;
    c.past = kv_cache;
    if (!dtype_name.empty()) {
      c.type = parse_dtype_or_throw(dtype_name);
      m.dtype_given = true;
    }
    c.mode = run();
    return m;
  }

  /// An ONNX file: named *.onnx (any case).
  bool is_onnx() const {
    std::string ext = std::filesystem::path(model).extension().string();
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return ext == ".onnx" && !is_preset();
  }

  /// An ONNX model: --batch and --seq size its inputs' symbolic dims 0 and 1, --kv-cache the
  /// past (dim 2) of its key/value cache inputs [batch, kv_heads, past, head_dim], --dtype every
  /// floating tensor; the size overrides of presets do not apply to it.
  model_graph build_onnx() const {
    if (layers || hidden || heads || kv_heads || ffn || vocab)
      throw spec_error("--layers, --hidden, --heads, --kv-heads, --ffn and --vocab size presets and Hugging Face "
                       "configs; an ONNX model's sizes are its own (only --batch, --seq and --dtype apply)");
#if defined(AUTOSHARD_TOOL_HAVE_ONNX)
    onnx_options o;
    o.batch = batch;
    o.seq = seq;
    o.past = kv_cache;
    if (!dtype_name.empty()) o.float_type = parse_dtype_or_throw(dtype_name);
    onnx_import r = read_onnx_file(model, o);
    // A size the model has no symbolic dim for was ignored: --batch 7 planned a fixed [4,8] at 4.
    for (auto [flag, size, used, dim] : {std::tuple{"--batch", std::int64_t{batch}, r.batch_used, 0},
                                         std::tuple{"--seq", std::int64_t{seq}, r.seq_used, 1},
                                         std::tuple{"--kv-cache", kv_cache, r.past_used, 2}})
      if (size > 0 && !used)
        throw spec_error(std::string(flag) + " " + std::to_string(size) + " sizes nothing: no graph input of ONNX model " + quoted_path(model) +
                         " has a symbolic dim " + std::to_string(dim) + (dim == 2 ? " of four (a key/value cache)" : "") +
                         " (or that size there); its sizes are its own: leave " + flag + " out, or export the model with that dim dynamic");
    bool cached = false;
    for (vertex_t v = 0; v < boost::num_vertices(r.graph); ++v) cached = cached || r.graph[v].is_kv_cache();
    if (kv_cache > 0 && !cached)
      throw spec_error("--kv-cache " + std::to_string(kv_cache) + ": no attention of ONNX model " + quoted_path(model) +
                       " reads a key/value cache (a graph input [batch, kv_heads, past, head_dim] concatenated in front of the "
                       "keys and values of an attention that fuses; one that does not fuse, such as one token's rotary tables of "
                       "explicit frequencies, which one position cannot tell apart, stays as the file computes it: docs/graph.md); "
                       "leave --kv-cache out");
    if (cached && run() == run_mode::training)
      throw spec_error("ONNX model " + quoted_path(model) + " reads a key/value cache: a decode step, which is inference; give --mode infer");
    return std::move(r.graph);
#else
    throw io_error(quoted_path(model) + " is an ONNX model, but this autoshard was built without ONNX (libonnx-dev)");
#endif
  }

  /// The directory a Hugging Face model's weights would be in.
  std::filesystem::path hf_dir() const {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::is_directory(model, ec)) return model;
    const fs::path parent = fs::path(model).parent_path();
    return parent.empty() ? fs::path(".") : parent;
  }

  /// Whether a JSON file is a Hugging Face config (a top-level "model_type" string).
  static bool has_model_type(const std::string& file) {
    nlohmann::json j;
    try {
      j = parse_json_text(read_regular_file(file, "model file", hf_config_max_bytes), "model file " + quoted_path(file));
    } catch (const io_error&) {
      return false;  // not a config; the model reader reports what is wrong with the file
    }
    return j.is_object() && j.contains("model_type") && j["model_type"].is_string();
  }

  /// The family ("gpt2", "bert", "llama") and the sized config of a preset.
  std::pair<std::string, transformer_config> preset() const {
    static const std::map<std::string, std::pair<std::string, transformer_config (*)()>> presets{
        {"gpt2", {"gpt2", &transformer_config::gpt2_124m}},
        {"gpt2-medium", {"gpt2", &transformer_config::gpt2_355m}},
        {"gpt2-large", {"gpt2", &transformer_config::gpt2_774m}},
        {"gpt2-xl", {"gpt2", &transformer_config::gpt2_1_5b}},
        {"bert-base", {"bert", &transformer_config::bert_base}},
        {"bert-large", {"bert", &transformer_config::bert_large}},
        {"llama-7b", {"llama", &transformer_config::llama_7b}},
        {"llama-70b", {"llama", &transformer_config::llama_70b}}};
    auto it = presets.find(model);
    if (it == presets.end()) {
      std::string names;
      for (const auto& [k, v] : presets) names += (names.empty() ? "" : ", ") + k;
      throw graph_error("unknown model " + quoted_path(model) + ": not a file and not a preset (" + names + ")");
    }
    transformer_config c = it->second.second();
    const bool widened = hidden > 0 && ffn == 0 && it->second.first != "llama";
    if (layers > 0) c.layers = layers;
    if (hidden > 0) c.hidden = hidden;
    set_heads(c);
    if (ffn > 0) c.ffn = ffn;
    else if (widened) c.ffn = four_hidden();
    if (vocab > 0) c.vocab = vocab;
    if (seq > 0) {  // a preset's learned position table grows to hold the positions asked for (after a cache's)
      c.seq = seq;
      const std::int64_t positions = seq + kv_cache;  // past int's range: the builder refuses it, naming the numbers
      if (c.max_positions > 0 && c.max_positions < positions && positions <= std::numeric_limits<int>::max())
        c.max_positions = static_cast<int>(positions);
    }
    if (batch > 0) c.batch = batch;
    c.past = kv_cache;
    if (!dtype_name.empty()) c.type = parse_dtype_or_throw(dtype_name);
    c.mode = run();
    return {it->second.first, c};
  }

  /// The model's graph. For a Hugging Face directory with weights (model.safetensors or its
  /// index), the checkpoint must hold exactly the graph's parameters (check_weights = false
  /// skips that, for `synth`, which writes new weights).
  model_graph build(bool check_weights = true) const {
    if (is_onnx()) return build_onnx();
    if (std::optional<hf_model> m = hf()) {
      for (const std::string& n : m->notes) std::cerr << "note: " << n << "\n";
#if defined(AUTOSHARD_TOOL_HAVE_TENSOR)
      if (check_weights) return build_checked(*m, hf_dir(), dtype_name.empty());
#endif
      (void)check_weights;
      return build_hf(*m);
    }
    if (!is_preset()) {
      if (kv_cache > 0)
        throw spec_error("--kv-cache builds a preset's or a Hugging Face config's decode step; a model JSON file's graph is its "
                         "own (give its attentions kv_cache inputs: docs/graph.md)");
      return read_json_file(model);
    }
    auto [family, c] = preset();
    if (family == "gpt2") return build_gpt2(c);
    if (family == "bert") return build_bert(c);
    return build_llama(c);
  }
};

}  // namespace autoshard::tool

#pragma once
// A Hugging Face directory's weights against the graph its config.json builds: every tensor of
// the checkpoint is a parameter of the graph with the same shape and dtype, and every parameter
// is in the checkpoint. (The graph area cannot read safetensors: the tensor area is above it.)
#include "common.hpp"
#include "plan_file.hpp"  // checkpoint_name: Hugging Face files may drop the base-model prefix

#include <autoshard/graph/graph.hpp>
#include <autoshard/tensor/tensor.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <set>

namespace autoshard::tool {

/// The checkpoint in `dir` (model.safetensors.index.json or model.safetensors), if there is one:
/// a name present as anything (checkpoint_file_in) is opened, so a model.safetensors that is a
/// symbolic-link loop is an error, not weights left unchecked without a word.
inline std::optional<checkpoint> hf_checkpoint(const std::filesystem::path& dir) {
  if (!checkpoint_file_in(dir)) return std::nullopt;
  return checkpoint(dir);
}

/// The files of the checkpoint in `dir`: its index (model.safetensors.index.json) and every
/// safetensors file the index names, or its model.safetensors; none when it has neither.
/// Opened as hf_checkpoint opens them, so a broken checkpoint fails here with the same words.
inline std::vector<std::filesystem::path> hf_checkpoint_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  const std::optional<std::filesystem::path> file = checkpoint_file_in(dir);
  if (!file) return files;
  if (file->extension() == ".json") files.push_back(*file);
  const checkpoint ck(dir);
  for (const safetensors_file& f : ck.files()) files.push_back(f.path());
  return files;
}

/// Buffers that transformers saved in older checkpoints (causal masks, rotary frequencies,
/// position ids): not parameters, so not in the graph, and never an error.
inline bool is_saved_buffer(const std::string& name) {
  for (const char* suffix : {".attn.bias", ".attn.masked_bias", ".attention.bias", ".attention.masked_bias",
                             ".rotary_emb.inv_freq", "embeddings.position_ids"})
    if (name.size() >= std::string_view(suffix).size() &&
        name.compare(name.size() - std::string_view(suffix).size(), std::string::npos, suffix) == 0)
      return true;
  return false;
}

/// A tensor of a task head that the graph does not build: pre-training checkpoints carry heads
/// beside the model a config builds (bert-base-uncased is BertForPreTraining: the pooler, the
/// masked-LM head cls.predictions and the next-sentence head cls.seq_relationship), and
/// transformers loads the base model or the masked LM from such a file, reporting the rest as
/// unused; so does autoshard. `name`'s first component, or its second after a base-model
/// prefix, is a head (cls, pooler, classifier, qa_outputs, score, or lm_head with a sub-module
/// such as RoBERTa's lm_head.dense), and no parameter of `g` lies under that head's module.
/// A tensor of a numbered layer is never one: a layer the config lacks is a mismatch.
inline bool is_task_head(const model_graph& g, const std::string& name) {
  if (split_layer_name(name)) return false;
  std::vector<std::string> c;
  for (std::size_t a = 0;;) {
    const std::size_t b = name.find('.', a);
    c.push_back(name.substr(a, b == std::string::npos ? std::string::npos : b - a));
    if (b == std::string::npos) break;
    a = b + 1;
  }
  for (std::size_t i = 0; i < 2 && i + 1 < c.size(); ++i) {
    const std::string& h = c[i];
    const bool head = h == "cls" || h == "pooler" || h == "classifier" || h == "qa_outputs" || h == "score" || h == "lm_head";
    if (!head || (h == "lm_head" && i + 2 >= c.size())) continue;
    std::string module;  // the head and one level below it (not the member itself)
    for (std::size_t k = 0; k <= std::min(i + 1, c.size() - 2); ++k) module += (k ? "." : "") + c[k];
    const std::string under = module + ".", bare = module.find('.') == std::string::npos ? "" : module.substr(module.find('.') + 1) + ".";
    for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
      if (!g[v].is_parameter()) continue;
      const std::string& p = g[v].name;
      const auto pd = p.find('.');
      if (p.rfind(under, 0) == 0 || (pd != std::string::npos && p.compare(pd + 1, under.size(), under) == 0) ||
          (!bare.empty() && p.rfind(bare, 0) == 0))
        return false;
    }
    return true;
  }
  return false;
}

/// What check_weights_match compares, and how its messages name the two sides.
struct weights_check {
  std::string where;                       ///< the checkpoint ("DIR", "ck/model.safetensors")
  std::string config = "its config.json";  ///< the config it is checked against
  bool compare_dtype = true;               ///< dtypes too (plan: not when --dtype sets the graph's)
  bool note_heads = true;                  ///< a note on task-head tensors the graph does not build ("not planned")
};

/// Throws io_error when tensor `copy` of `ck`, a tied parameter saved a second time under the
/// name of the module that ties it (lm_head.weight beside GPT-2's wte.weight or LLaMA's
/// embed_tokens.weight), is not bit for bit tensor `saved` (the same shape): naming both and
/// the first element that differs. Read a MiB at a time under each file's SIGBUS guard.
inline void check_tied_copy(const checkpoint& ck, const std::string& copy, const std::string& saved, const weights_check& how) {
  const safetensors_entry& ec = ck.entry(copy);
  const safetensors_entry& es = ck.entry(saved);
  const std::string head = "the weights in " + quoted_path(how.where) + " do not match " + how.config + ": it ties " + quoted_text(copy) +
                           " to " + quoted_text(saved) + " (tie_word_embeddings), so the checkpoint's " + quoted_text(copy) +
                           " is " + quoted_text(saved) + " saved twice, but ";
  if (ec.type != es.type)
    throw io_error(head + "it is " + std::string(to_string(ec.type)) + " and " + quoted_text(saved) + " " + std::string(to_string(es.type)));
  const safetensors_file& file_c = ck.file_of(copy);
  const safetensors_file& file_s = ck.file_of(saved);
  const std::span<const std::byte> bc = file_c.bytes(ec), bs = file_s.bytes(es);
  std::vector<std::byte> buf(std::min<std::size_t>(bc.size(), std::size_t{1} << 20));
  for (std::size_t at = 0; at < bc.size(); at += buf.size()) {
    const std::size_t n = std::min(buf.size(), bc.size() - at);
    file_c.read_guarded([&] { std::memcpy(buf.data(), bc.data() + at, n); });
    std::size_t same = n;
    file_s.read_guarded([&] { same = static_cast<std::size_t>(std::mismatch(buf.data(), buf.data() + n, bs.data() + at).first - buf.data()); });
    if (same == n) continue;
    std::int64_t k = static_cast<std::int64_t>((at + same) / dtype_size(ec.type));
    const std::int64_t flat = k;
    std::vector<std::int64_t> index(ec.shape.rank);
    for (std::size_t d = ec.shape.rank; d-- > 0;) {
      index[d] = k % ec.shape[d];
      k /= ec.shape[d];
    }
    std::string at_text;
    for (std::size_t d = 0; d < index.size(); ++d) at_text += (d ? "," : "") + std::to_string(index[d]);
    throw io_error(head + "they differ first at element " + std::to_string(flat) + " ([" + at_text + "] of " + to_string(ec.shape) +
                   ")");
  }
}

/// Throws io_error listing the first names that differ between `ck` and the parameters of `g`
/// (shape, and dtype when `how.compare_dtype`).
inline void check_weights_match(const model_graph& g, const checkpoint& ck, const weights_check& how) {
  std::vector<std::string> missing, differ;  // each name quoted (quoted_text): they come from the files
  std::set<std::string> matched;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    if (!g[v].is_parameter()) continue;
    const std::string n = checkpoint_name(ck, g[v].name);
    if (n.empty()) {
      missing.push_back(quoted_text(g[v].name));
      continue;
    }
    matched.insert(n);
    const safetensors_entry& e = ck.entry(n);
    if (!(e.shape == g[v].shape) || (how.compare_dtype && e.type != g[v].type))
      differ.push_back(quoted_text(n) + " (checkpoint " + to_string(e.shape) + " " + std::string(to_string(e.type)) + ", config " +
                       to_string(g[v].shape) + " " + std::string(to_string(g[v].type)) + ")");
  }
  // A tied parameter that the checkpoint saved anyway under its other name (some conversions
  // keep lm_head.weight beside the embedding it equals; BERT's pre-training files keep
  // cls.predictions.decoder.weight and .bias beside the word embeddings and cls.predictions.bias)
  // is the same parameter, not an extra one: X.weight (X.bias) where the graph's linear X takes
  // a weight (bias) of another name and the same shape.
  // Such a copy is the parameter saved twice: its values must be the parameter's (a head
  // trained apart, or another model's, was accepted as the tied one without a word).
  auto tied_copy = [&](const std::string& n) {
    const auto dot = n.rfind('.');
    if (dot == std::string::npos) return false;
    const std::string member = n.substr(dot + 1);
    const std::size_t slot = member == "weight" ? 0 : member == "bias" ? 1 : 2;
    const std::string module = n.substr(0, dot);
    auto v = find_vertex(g, module);
    if (slot > 1 || !v || g[*v].kind != op_kind::linear) return false;
    const std::vector<std::string> w = parameter_names(g, *v);
    if (!(slot < w.size() && w[slot] != n && checkpoint_name(ck, w[slot]) != n && ck.entry(n).shape == g[*find_vertex(g, w[slot])].shape))
      return false;
    if (const std::string saved = checkpoint_name(ck, w[slot]); !saved.empty())  // (none: reported missing below)
      check_tied_copy(ck, n, saved, how);
    return true;
  };
  std::vector<std::string> extra, unused;
  for (const std::string& n : ck.names())
    if (!matched.count(n) && !is_saved_buffer(n) && !tied_copy(n)) (is_task_head(g, n) ? unused : extra).push_back(quoted_text(n));
  auto first = [](const std::vector<std::string>& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size() && i < 5; ++i) s += (i ? ", " : "") + v[i];
    return s + (v.size() > 5 ? ", ..." : "");
  };
  if (missing.empty() && differ.empty() && extra.empty()) {
    if (!unused.empty() && how.note_heads)
      std::cerr << "autoshard: note: " << count_noun(unused.size(), "tensor") << " of " << quoted_path(how.where)
                << (unused.size() == 1 ? " belongs" : " belong") << " to task heads this model does not build, and are not planned: " << first(unused) << "\n";
    return;
  }
  std::string why;
  if (!differ.empty()) why += "; " + std::to_string(differ.size()) + (differ.size() == 1 ? " differs: " : " differ: ") + first(differ);
  if (!missing.empty()) why += "; " + count_noun(missing.size(), "parameter") + (missing.size() == 1 ? " is" : " are") + " not in the checkpoint: " + first(missing);
  if (!extra.empty()) why += "; " + count_noun(extra.size(), "checkpoint tensor") + (extra.size() == 1 ? " is not a parameter: " : " are not parameters: ") + first(extra);
  throw io_error("the weights in " + quoted_path(how.where) + " do not match " + how.config + why);
}

/// The graph of Hugging Face model `m`, checkpoint `ck` checked against it (check_weights_match).
/// Without a torch_dtype in the config (and without --dtype) the parameters take the
/// checkpoint's dtype.
inline model_graph build_checked(hf_model m, const checkpoint& ck, const weights_check& how) {
  if (!m.dtype_given)
    for (const std::string& n : ck.names())
      if (!is_saved_buffer(n)) {
        const dtype t = ck.entry(n).type;
        if (t == dtype::f32 || t == dtype::f16 || t == dtype::bf16 || t == dtype::f64) m.config.type = t;
        break;
      }
  model_graph g = build_hf(m);
  check_weights_match(g, ck, how);
  return g;
}

/// The graph of a Hugging Face model, its weights checked when `dir` has any.
inline model_graph build_checked(hf_model m, const std::filesystem::path& dir, bool compare_dtype) {
  const std::optional<checkpoint> ck = hf_checkpoint(dir);
  if (!ck) return build_hf(m);
  weights_check how;
  how.where = dir.string();
  how.compare_dtype = compare_dtype;
  return build_checked(std::move(m), *ck, how);
}

/// `shard --policy`: throws io_error when checkpoint `ck` (named `where`) is not the model that
/// Hugging Face config `config_json` describes: a tensor of another shape or dtype than the
/// config implies, a parameter missing, a tensor that is none (check_weights_match's words). A
/// policy cuts by names and the config's head counts alone, so a checkpoint of another width
/// was cut as if it were this one. The graph of either run mode will do: BERT's base model
/// (inference) has the pooler, its masked LM (training) the cls.predictions head, and a
/// checkpoint of either is the config's; the first mode's refusal is the one reported.
inline void check_checkpoint_config(const checkpoint& ck, const std::string& where, const std::filesystem::path& config_json) {
  hf_model m = read_hf_config_file(config_json);
  weights_check how;
  how.where = where;
  how.config = quoted_path(config_json.string());
  how.note_heads = false;  // shard cuts every tensor: none is left unplanned
  std::optional<io_error> first;
  for (const run_mode mode : {run_mode::training, run_mode::inference}) {
    m.config.mode = mode;
    try {
      build_checked(m, ck, how);
      return;
    } catch (const io_error& e) {
      if (!first) first = e;
    }
  }
  throw *first;
}

}  // namespace autoshard::tool

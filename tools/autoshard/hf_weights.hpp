#pragma once
// A Hugging Face directory's weights against the graph its config.json builds: every tensor of
// the checkpoint is a parameter of the graph with the same shape and dtype, and every parameter
// is in the checkpoint. (The graph area cannot read safetensors: the tensor area is above it.)
#include "common.hpp"
#include "plan_file.hpp"  // checkpoint_name: Hugging Face files may drop the base-model prefix

#include <autoshard/graph/graph.hpp>
#include <autoshard/tensor/tensor.hpp>

#include <filesystem>
#include <optional>
#include <set>

namespace autoshard::tool {

/// The checkpoint in `dir` (model.safetensors.index.json or model.safetensors), if there is one.
inline std::optional<checkpoint> hf_checkpoint(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::exists(dir / "model.safetensors.index.json", ec) && !std::filesystem::exists(dir / "model.safetensors", ec))
    return std::nullopt;
  return checkpoint(dir);
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

/// Throws io_error listing the first names that differ between `ck` and the parameters of `g`
/// (shape, and dtype when `compare_dtype`).
inline void check_weights_match(const model_graph& g, const checkpoint& ck, const std::string& where, bool compare_dtype) {
  std::vector<std::string> missing, differ;
  std::set<std::string> matched;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    if (!g[v].is_parameter()) continue;
    const std::string n = checkpoint_name(ck, g[v].name);
    if (n.empty()) {
      missing.push_back(g[v].name);
      continue;
    }
    matched.insert(n);
    const safetensors_entry& e = ck.entry(n);
    if (!(e.shape == g[v].shape) || (compare_dtype && e.type != g[v].type))
      differ.push_back(n + " (checkpoint " + to_string(e.shape) + " " + std::string(to_string(e.type)) + ", config " +
                       to_string(g[v].shape) + " " + std::string(to_string(g[v].type)) + ")");
  }
  // A tied output head that the checkpoint saved anyway (some conversions keep lm_head.weight
  // beside the embedding it equals) is the same parameter, not an extra one.
  auto tied_copy = [&](const std::string& n) {
    for (const char* head : {"lm_head", "embed_out"}) {
      auto v = find_vertex(g, head);
      if (n != std::string(head) + ".weight" || !v || g[*v].kind != op_kind::linear) continue;
      const std::vector<std::string> w = parameter_names(g, *v);
      if (!w.empty() && w.front() != n && ck.entry(n).shape == g[*find_vertex(g, w.front())].shape) return true;
    }
    return false;
  };
  std::vector<std::string> extra;
  for (const std::string& n : ck.names())
    if (!matched.count(n) && !is_saved_buffer(n) && !tied_copy(n)) extra.push_back(n);
  if (missing.empty() && differ.empty() && extra.empty()) return;
  auto first = [](const std::vector<std::string>& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size() && i < 5; ++i) s += (i ? ", " : "") + v[i];
    return s + (v.size() > 5 ? ", ..." : "");
  };
  std::string why;
  if (!differ.empty()) why += "; " + std::to_string(differ.size()) + " differ: " + first(differ);
  if (!missing.empty()) why += "; " + std::to_string(missing.size()) + " parameters are not in the checkpoint: " + first(missing);
  if (!extra.empty()) why += "; " + std::to_string(extra.size()) + " checkpoint tensors are not parameters: " + first(extra);
  throw io_error("the weights in '" + where + "' do not match its config.json" + why);
}

/// The graph of a Hugging Face model, its weights checked when `dir` has any. Without a
/// torch_dtype in the config (and without --dtype) the parameters take the checkpoint's dtype.
inline model_graph build_checked(hf_model m, const std::filesystem::path& dir, bool compare_dtype) {
  const std::optional<checkpoint> ck = hf_checkpoint(dir);
  if (!ck) return build_hf(m);
  if (!m.dtype_given)
    for (const std::string& n : ck->names())
      if (!is_saved_buffer(n)) {
        const dtype t = ck->entry(n).type;
        if (t == dtype::f32 || t == dtype::f16 || t == dtype::bf16 || t == dtype::f64) m.config.type = t;
        break;
      }
  model_graph g = build_hf(m);
  check_weights_match(g, *ck, dir.string(), compare_dtype);
  return g;
}

}  // namespace autoshard::tool

#pragma once
/// Tensor-parallel policies (Parallelformers / Megatron rules) and plan policies (the ILP's
/// answer): both turn a parameter name + shape into where each rank's shard comes from.
///   auto p = autoshard::policies::gpt2();                      // Hugging Face names
///   autoshard::model_config cfg{{"n_head", 12}, {"n_embd", 768}};
///   auto t = autoshard::shards_of(p, "h.0.attn.c_attn.weight", {768, 2304}, dtype::f32, 4, cfg);
///   // t.ranks[1]: columns 192..383 of each of q, k, v, concatenated in that order
/// Your own model in a few lines:
///   autoshard::tp_policy mine{"mine"};
///   mine.add("*.qkv.weight", autoshard::column().fused(3))
///       .add("*.out.weight", autoshard::row())
///       .scale("attn.heads", "num_heads");
#include <algorithm>    // std::max
#include <cstdint>      // std::int64_t
#include <limits>       // std::numeric_limits
#include <filesystem>   // std::filesystem::path
#include <map>          // std::map
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <utility>      // std::pair
#include <vector>       // std::vector

#include <nlohmann/json.hpp>  // config.json

#include "../io/json.hpp"  // load_json_file
#include "../core/checked.hpp"  // checked_add, checked_mul: config values are any int64
#include "../core/dtype.hpp"   // dtype
#include "../core/error.hpp"   // shape_error, spec_error, quoted_text
#include "../core/layout.hpp"  // local_box, split_rule
#include "../core/mesh.hpp"    // device_mesh
#include "../core/parse.hpp"   // to_string(sharding_spec)
#include "../core/spec.hpp"    // sharding_spec, make_spec
#include "slice.hpp"           // shard_layout, spec_layout

namespace autoshard {

/// Integer attributes of a model config (Hugging Face config.json keys: "n_head", ...).
using model_config = std::map<std::string, std::int64_t>;

/// The integer fields of a Hugging Face config.json.
inline model_config load_model_config(const std::filesystem::path& config_json) {
  const nlohmann::json j = load_json_file(config_json.string(), "model config");
  model_config c;
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it)
      if (const std::optional<std::int64_t> v = json_int64(it.value()))
        c[it.key()] = *v;  // other members (strings, floats, ints beyond 2^63) are not attributes
  return c;
}

/// config.json's "model_type" ("gpt2", "llama", ...), or "" when it has none.
inline std::string load_model_type(const std::filesystem::path& config_json) {
  const nlohmann::json j = load_json_file(config_json.string(), "model config");
  if (j.is_object() && j.contains("model_type") && j["model_type"].is_string()) return j["model_type"].get<std::string>();
  return {};
}

/// A parameter name split at its layer number: the first dot-separated component made of
/// digits only ("h.3.attn.c_attn.weight" -> {"h.", 3, ".attn.c_attn.weight"}).
struct layer_name {
  std::string stack;  ///< what comes before the number, dot included ("model.layers.")
  std::int64_t index = 0;
  std::string rest;   ///< what comes after it, dot included
};
inline std::optional<layer_name> split_layer_name(std::string_view name) {
  std::size_t b = 0;
  while (b < name.size()) {
    std::size_t e = name.find('.', b);
    if (e == std::string_view::npos) e = name.size();
    const std::string_view c = name.substr(b, e - b);
    if (!c.empty() && c.size() <= 9 && c.find_first_not_of("0123456789") == std::string_view::npos && b > 0)
      return layer_name{std::string(name.substr(0, b)), std::stoll(std::string(c)), std::string(name.substr(e))};
    b = e + 1;
  }
  return std::nullopt;
}

/// The number of layers of each stack of numbered layers in `names` ("h." -> 12), after checking
/// that every layer 0..n-1 of a stack holds the same tensors: a checkpoint missing one tensor of
/// one layer ("h.0.attn.c_attn.bias" while "h.1.attn.c_attn.bias" exists) or a whole layer is an
/// io_error naming the first missing tensor. `what` names the source in the message.
inline std::map<std::string, std::int64_t> check_layer_stacks(const std::vector<std::string>& names,
                                                              const std::string& what) {
  std::map<std::string, std::map<std::string, std::vector<bool>>> stacks;  // stack -> rest -> layers seen
  std::map<std::string, std::int64_t> counts;
  std::vector<layer_name> split;
  for (const auto& n : names)
    if (auto l = split_layer_name(n)) {
      counts[l->stack] = std::max(counts[l->stack], l->index + 1);
      split.push_back(std::move(*l));
    }
  for (const auto& l : split) {
    auto& seen = stacks[l.stack][l.rest];
    seen.resize(static_cast<std::size_t>(counts[l.stack]), false);
    seen[static_cast<std::size_t>(l.index)] = true;
  }
  for (const auto& [stack, rests] : stacks)
    for (const auto& [rest, seen] : rests)
      for (std::size_t i = 0; i < seen.size(); ++i)
        if (!seen[i]) {
          std::size_t have = 0;
          while (!seen[have]) ++have;
          throw io_error(what + " has no tensor " + quoted_text(stack + std::to_string(i) + rest) + " but has " +
                         quoted_text(stack + std::to_string(have) + rest) + ": every layer " +
                         quoted_text(stack + "0.." + std::to_string(seen.size() - 1)) + " should hold the same tensors");
        }
  return counts;
}

/// What a tensor-parallel rule does to one parameter.
enum class tp_kind : std::uint8_t {
  replicate,  ///< every rank holds it whole (embeddings, norms)
  column,     ///< split the output dim; bias split
  row,        ///< split the input dim; bias whole, added once after the all-reduce
  vocab,      ///< vocab-parallel embedding: split dim 0 (rows), chunk rule, may be uneven
};

constexpr std::string_view to_string(tp_kind k) noexcept {
  switch (k) {
    case tp_kind::replicate: return "replicate";
    case tp_kind::column: return "column";
    case tp_kind::row: return "row";
    case tp_kind::vocab: return "vocab";
  }
  return "?";
}

/// Weight layout: nn.Linear stores [out, in]; GPT-2's Conv1D stores [in, out].
enum class weight_layout : std::uint8_t { out_in, in_out };

/// One rule: kind, layout and how a fused projection is built along the split dim.
///   column().fused(3)                                  GPT-2 c_attn: q | k | v, equal parts
///   column().fused_heads({"num_attention_heads", "num_key_value_heads", "num_key_value_heads"})
///                                                      grouped-query q | k | v, sizes in heads
///   column().per_head("n_head")                        BLOOM: [heads, 3, head_dim, in]
///   column().whole_heads("num_key_value_heads")        k_proj: whole heads on every rank
///   column().whole_heads("num_key_value_heads").replicable()
///                                                      ... and fewer heads than ranks (a count the ranks are
///                                                      a multiple of) each on tp / heads ranks, rank r
///                                                      holding head r / (tp / heads), as vLLM and
///                                                      transformers' unit_colwise hold key/value heads
struct tp_rule {
  tp_kind kind = tp_kind::replicate;
  weight_layout layout = weight_layout::out_in;
  int parts = 1;                        ///< equal fused blocks (QKV 3, gate/up 2)
  std::vector<std::string> part_heads;  ///< fused blocks sized in heads by these attributes
  std::string interleaved_heads;        ///< per-head interleaved layout, heads from this attribute
  int parts_per_head = 3;               ///< rows of each head: [heads, parts_per_head, head_dim]
  bool replicate_heads = false;         ///< part_heads fewer than the ranks are replicated (key/value heads)

  tp_rule fused(int n) const {
    tp_rule r = *this;
    r.parts = n;
    return r;
  }
  tp_rule fused_heads(std::vector<std::string> head_attrs) const {
    tp_rule r = *this;
    r.part_heads = std::move(head_attrs);
    r.parts = static_cast<int>(r.part_heads.size());
    return r;
  }
  tp_rule whole_heads(std::string head_attr) const { return fused_heads({std::move(head_attr)}); }
  tp_rule replicable() const {
    tp_rule r = *this;
    r.replicate_heads = true;
    return r;
  }
  tp_rule per_head(std::string head_attr, int parts_per_head = 3) const {
    tp_rule r = *this;
    r.interleaved_heads = std::move(head_attr);
    r.parts_per_head = parts_per_head;
    return r;
  }
  tp_rule transposed() const {
    tp_rule r = *this;
    r.layout = weight_layout::in_out;
    return r;
  }
};

inline tp_rule replicate() { return {}; }
inline tp_rule column(weight_layout l = weight_layout::out_in) { return {tp_kind::column, l, 1, {}, {}, 3, false}; }
inline tp_rule row(weight_layout l = weight_layout::out_in) { return {tp_kind::row, l, 1, {}, {}, 3, false}; }
inline tp_rule vocab() { return {tp_kind::vocab, weight_layout::out_in, 1, {}, {}, 3, false}; }

/// A per-rank attribute: `name` = config[from] * multiplier / tp (checked to divide).
/// Several rules may define one name; the first whose `from` is in the config wins.
struct attribute_rule {
  std::string name;
  std::string from;
  std::int64_t multiplier = 1;
  bool replicable = false;  ///< a head count: fewer than the ranks (they a multiple of it) is 1 per rank
};

/// `*` matches any run of characters (dots included), `?` one; the whole name must match.
inline bool glob_match(std::string_view pattern, std::string_view name) noexcept {
  std::size_t p = 0, n = 0, star = std::string_view::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

/// Parameter name patterns -> rules (first match wins; no match: replicate), plus the
/// attributes a tensor-parallel size rescales.
struct tp_policy {
  std::string name;
  std::vector<std::pair<std::string, tp_rule>> rules;
  std::vector<attribute_rule> attributes;

  tp_policy& add(std::string pattern, tp_rule r) {
    rules.emplace_back(std::move(pattern), std::move(r));
    return *this;
  }
  tp_policy& scale(std::string attr_name, std::string from, std::int64_t multiplier = 1) {
    attributes.push_back({std::move(attr_name), std::move(from), multiplier, false});
    return *this;
  }
  /// A head count whose heads may be replicated (whole_heads): fewer heads than ranks, when
  /// the ranks are a multiple of them, is one head per rank.
  tp_policy& scale_heads(std::string attr_name, std::string from) {
    attributes.push_back({std::move(attr_name), std::move(from), 1, true});
    return *this;
  }
  /// The rule for `param`, or nullptr when none matches (then it is replicated).
  const tp_rule* match(std::string_view param) const noexcept {
    for (const auto& [pat, r] : rules)
      if (glob_match(pat, param)) return &r;
    return nullptr;
  }
};

/// The per-rank attributes of `p` at tensor-parallel size `tp`. A value that does not divide is
/// a shape_error naming the attribute, its value and the size; never floor division.
inline std::map<std::string, std::int64_t> rescale_attributes(const tp_policy& p, const model_config& config,
                                                              int tp) {
  if (tp < 1) throw shape_error("tensor-parallel size must be at least 1, got " + std::to_string(tp));
  std::map<std::string, std::int64_t> out;
  for (const auto& a : p.attributes) {
    if (out.count(a.name)) continue;
    auto it = config.find(a.from);
    if (it == config.end()) continue;
    // A config's integers are any int64 (n_embd 2^62 x 4 was a signed overflow).
    const std::int64_t v =
        a.multiplier == 1 ? it->second
                          : checked_mul(it->second, a.multiplier, "attribute " + quoted_text(a.from) + " (for " + quoted_text(a.name) + ")");
    if (a.replicable && v > 0 && v < tp && tp % v == 0) {
      out[a.name] = 1;
      continue;
    }
    if (v % tp != 0)
      throw shape_error("attribute " + quoted_text(a.from) +
                        (a.multiplier != 1 ? " x" + std::to_string(a.multiplier) : std::string()) + " = " +
                        std::to_string(v) + " (for " + quoted_text(a.name) + ") does not divide over tensor-parallel size " +
                        std::to_string(tp));
    out[a.name] = v / tp;
  }
  return out;
}

/// How one tensor is distributed: its rule, spec and every rank's shard layout.
struct tensor_shards {
  std::string name;
  tensor_shape global;
  dtype type = dtype::f32;
  device_mesh mesh;
  sharding_spec spec;       ///< S(d) on the split dim, or replicated; fused parts are in `ranks`
  std::string rule;         ///< "replicate", "column", "row", "vocab" or "plan"
  std::string fused;        ///< "" or a description of the fused layout
  bool add_after_allreduce = false;  ///< row-parallel bias: whole on every rank, add once
  std::vector<shard_layout> ranks;   ///< one per rank of `mesh`
};

namespace detail {
inline std::int64_t need_attr(const model_config& c, const std::string& attr, const std::string& tensor) {
  auto it = c.find(attr);
  if (it == c.end())
    throw shape_error("tensor " + quoted_text(tensor) + ": its rule counts heads with attribute " + quoted_text(attr) +
                      ", which the model config does not have");
  if (it->second < 1)
    throw shape_error("tensor " + quoted_text(tensor) + ": attribute " + quoted_text(attr) + " = " + std::to_string(it->second));
  return it->second;
}
inline tensor_shards replicated_shards(std::string name, const tensor_shape& g, dtype t, const device_mesh& m) {
  tensor_shards p{std::move(name), g, t, m, replicated_spec(static_cast<int>(m.ndim()), g.rank), "replicate", "", false, {}};
  for (int r = 0; r < m.num_ranks(); ++r) p.ranks.push_back(spec_layout(m, p.spec, g, r));
  return p;
}
}  // namespace detail

namespace detail {

/// The dim a rule splits: [out,in] column -> 0, row -> 1; [in,out] the other way; vocab and
/// 1-D (bias) -> 0.
inline int split_dim_of(const tp_rule& rule, const tensor_shape& global) {
  if (global.rank < 2 || rule.kind == tp_kind::vocab) return 0;
  const bool out_dim = rule.kind == tp_kind::column;
  if (rule.layout == weight_layout::out_in) return out_dim ? 0 : 1;
  return out_dim ? 1 : 0;
}

inline shape_error split_dim_error(const std::string& name, const tensor_shape& global, int d, const std::string& why) {
  return shape_error("tensor " + quoted_text(name) + " " + to_string(global) + ": dim " + std::to_string(d) + " of size " +
                     std::to_string(global[static_cast<std::size_t>(d)]) + " " + why);
}

/// The parts a split dim is made of, each split over the tp ranks, or (replicas[i] > 1) with
/// fewer heads than ranks, each head whole on tp / heads ranks.
struct dim_parts {
  std::vector<std::int64_t> sizes, replicas;
};

/// Parts sized in heads (rule.part_heads), with `fused` saying how.
inline dim_parts head_parts(const tp_rule& rule, const std::string& name, const tensor_shape& global, int d, int tp,
                              const model_config& config, std::string& fused) {
  const std::int64_t n = global[static_cast<std::size_t>(d)];
  dim_parts out;
  std::int64_t total = 0;
  std::vector<std::int64_t> heads;
  for (const auto& a : rule.part_heads)  // head counts are any int64 >= 1 (3 x 2^62 overflowed)
    total = checked_add(total, heads.emplace_back(need_attr(config, a, name)), "tensor " + quoted_text(name) + ": heads in all");
  if (n % total != 0)
    throw split_dim_error(name, global, d, "is not a whole number of heads (" + std::to_string(total) + " heads in all)");
  const std::int64_t head_dim = n / total;
  for (std::size_t i = 0; i < heads.size(); ++i) {
    const bool replicated = rule.replicate_heads && heads[i] < tp && tp % heads[i] == 0;
    if (heads[i] % tp != 0 && !replicated)
      throw shape_error("tensor " + quoted_text(name) + ": attribute " + quoted_text(rule.part_heads[i]) + " = " + std::to_string(heads[i]) +
                        " heads does not divide over tensor-parallel size " + std::to_string(tp) +
                        (rule.replicate_heads ? " (nor do the ranks replicate them evenly: a multiple of the heads)" : ""));
    out.sizes.push_back(heads[i] * head_dim);
    out.replicas.push_back(replicated ? tp / heads[i] : 1);
  }
  if (heads.size() > 1) {
    fused = "heads";
    for (std::size_t i = 0; i < heads.size(); ++i) fused += (i ? "," : " ") + std::to_string(heads[i]);
    fused += " x " + std::to_string(head_dim);
  }
  for (std::size_t i = 0; i < heads.size(); ++i)
    if (out.replicas[i] > 1)
      fused += std::string(fused.empty() ? "" : "; ") + std::to_string(heads[i]) + " heads replicated over " +
               std::to_string(tp) + " ranks, each on " + std::to_string(out.replicas[i]);
  return out;
}

/// The parts of split dim d under `rule` (whole vocabulary, heads, per-head interleaved, or
/// equal fused blocks), each checked to divide over the tp ranks; `fused` says how.
inline dim_parts split_parts_of(const tp_rule& rule, const std::string& name, const tensor_shape& global, int d, int tp,
                                  const model_config& config, std::string& fused) {
  const std::int64_t n = global[static_cast<std::size_t>(d)];
  dim_parts parts;
  if (rule.kind == tp_kind::vocab) {
    parts.sizes = {n};
  } else if (!rule.part_heads.empty()) {
    parts = head_parts(rule, name, global, d, tp, config, fused);
  } else if (!rule.interleaved_heads.empty()) {
    const std::int64_t h = need_attr(config, rule.interleaved_heads, name);
    const std::int64_t per = std::max(1, rule.parts_per_head);
    // h is any int64 >= 1 (2^62 heads x 3 parts overflowed).
    if (n % checked_mul(h, per, "tensor " + quoted_text(name) + ": attribute " + quoted_text(rule.interleaved_heads) + " heads x parts") != 0)
      throw split_dim_error(name, global, d,
                            "is not " + std::to_string(h) + " heads x " + std::to_string(per) + " parts x head_dim");
    if (h % tp != 0)
      throw shape_error("tensor " + quoted_text(name) + ": attribute " + quoted_text(rule.interleaved_heads) + " = " + std::to_string(h) +
                        " heads does not divide over tensor-parallel size " + std::to_string(tp));
    parts.sizes = {n};  // [heads, parts, head_dim]: whole heads per rank are one contiguous block
    fused = "per-head interleaved [" + std::to_string(h) + " heads, " + std::to_string(per) + ", " +
            std::to_string(n / (h * per)) + "]";
  } else {
    if (rule.parts < 1) throw spec_error("tensor " + quoted_text(name) + ": a fused rule needs at least one part");
    if (n % rule.parts != 0)
      throw split_dim_error(name, global, d, "does not split into " + std::to_string(rule.parts) + " equal fused parts");
    parts.sizes.assign(static_cast<std::size_t>(rule.parts), n / rule.parts);
    if (rule.parts > 1) fused = std::to_string(rule.parts) + " equal parts";
  }
  parts.replicas.resize(parts.sizes.size(), 1);
  if (rule.kind != tp_kind::vocab)
    for (std::size_t i = 0; i < parts.sizes.size(); ++i)
      if (const std::int64_t s = parts.sizes[i]; parts.replicas[i] == 1 && s % tp != 0)
        throw split_dim_error(name, global, d,
                              parts.sizes.size() > 1 ? "has fused parts of " + std::to_string(s) +
                                                           " that do not divide over tensor-parallel size " + std::to_string(tp)
                                                     : "does not divide over tensor-parallel size " + std::to_string(tp));
  return parts;
}

/// Every rank's layout of `out` (spec set) split on dim d into `parts`.
inline void rank_layouts(tensor_shards& out, int d, const dim_parts& parts, int tp) {
  const auto du = static_cast<std::size_t>(d);
  for (int r = 0; r < tp; ++r) {
    shard_layout l = parts_layout(out.mesh, out.spec, out.global, d, parts.sizes, r);
    std::int64_t start = 0;
    for (std::size_t i = 0; i < parts.sizes.size(); ++i) {
      if (parts.replicas[i] > 1) {  // head r / replicas of this part, whole: the cut over heads ranks
        const int units = tp / static_cast<int>(parts.replicas[i]);
        tensor_shape part = out.global;
        part[du] = parts.sizes[i];
        shard_box b = local_box(device_mesh{units}, out.spec, part, r / static_cast<int>(parts.replicas[i]));
        b.offset[du] += start;
        l.shape[du] += b.shape[du] - l.pieces[i].shape[du];
        l.pieces[i] = {b.offset, b.shape};
      }
      start += parts.sizes[i];
    }
    out.ranks.push_back(std::move(l));
  }
}

}  // namespace detail

/// How one parameter is cut under tensor-parallel policy `p` over `tp` ranks (mesh {tp}).
inline tensor_shards shards_of(const tp_policy& p, const std::string& name, const tensor_shape& global, dtype type,
                               int tp, const model_config& config = {}) {
  if (tp < 1) throw shape_error("tensor-parallel size must be at least 1, got " + std::to_string(tp));
  const device_mesh mesh{tp};
  const tp_rule* rule = p.match(name);
  if (!rule || rule->kind == tp_kind::replicate || global.rank == 0)
    return detail::replicated_shards(name, global, type, mesh);
  tensor_shards out{name, global, type, mesh, {}, std::string(to_string(rule->kind)), "", false, {}};
  if (rule->kind == tp_kind::row && global.rank == 1) {  // bias of a row-parallel linear
    out = detail::replicated_shards(name, global, type, mesh);
    out.rule = "row";
    out.add_after_allreduce = true;
    return out;
  }
  if ((rule->kind == tp_kind::row || rule->kind == tp_kind::vocab) && (rule->parts != 1 || !rule->interleaved_heads.empty()))
    throw spec_error("tensor " + quoted_text(name) + ": only column-parallel rules may be fused");
  if (rule->layout == weight_layout::in_out && global.rank != 2 && global.rank != 1)
    throw shape_error("tensor " + quoted_text(name) + ": an [in,out] layout needs a 2-D weight, got " + to_string(global));
  const int d = detail::split_dim_of(*rule, global);
  out.spec = make_spec(global.rank, {Shard(d)});
  const detail::dim_parts parts = detail::split_parts_of(*rule, name, global, d, tp, config, out.fused);
  detail::rank_layouts(out, d, parts, tp);
  return out;
}

/// The auto-sharding pass's answer as a policy: parameter name -> spec on `mesh`.
/// Unlisted parameters are replicated. Filled from a plan document (the tool's `shard --plan`); consumed here.
struct plan_policy {
  device_mesh mesh;
  std::map<std::string, sharding_spec> specs;
  split_rule rule = split_rule::chunk;
  /// Parameters with a fused dim (the graph's fused_dim_of, e.g. c_attn.weight: dim 1, 3 parts):
  /// a spec that cuts it cuts each part (parts_layout), as the Megatron policy does.
  std::map<std::string, fused_dim> fused = {};
};

/// How one parameter is cut under a solved plan.
inline tensor_shards shards_of(const plan_policy& p, const std::string& name, const tensor_shape& global, dtype type) {
  auto it = p.specs.find(name);
  if (it == p.specs.end()) return detail::replicated_shards(name, global, type, p.mesh);
  tensor_shards out{name, global, type, p.mesh, it->second, "plan", "", false, {}};
  const auto f = p.fused.find(name);
  const fused_dim fd = f == p.fused.end() ? fused_dim{} : f->second;
  if (fd.any() && it->second.is_sharded(fd.dim)) out.fused = std::to_string(fd.parts) + " equal parts";
  try {
    for (int r = 0; r < p.mesh.num_ranks(); ++r) out.ranks.push_back(spec_layout(p.mesh, it->second, global, r, p.rule, fd));
  } catch (const error& e) {
    throw spec_error("tensor " + quoted_text(name) + " " + to_string(global) + " with spec " + to_string(it->second) + ": " +
                     e.what());
  }
  return out;
}

/// Built-in policies with Hugging Face parameter names (any prefix: "transformer.", "model.").
namespace policies {

/// GPT-2 (Conv1D weights are [in,out]); c_attn fuses q|k|v, each n_embd wide.
inline tp_policy gpt2() {
  tp_policy p{"gpt2", {}, {}};
  const auto T = weight_layout::in_out;
  p.add("*.attn.c_attn.weight", column(T).fused_heads({"n_head", "n_head", "n_head"}))
      .add("*.attn.c_attn.bias", column(T).fused_heads({"n_head", "n_head", "n_head"}))
      .add("*.attn.c_proj.*", row(T))
      .add("*.mlp.c_fc.*", column(T))
      .add("*.mlp.c_proj.*", row(T));
  p.scale("attn.num_heads", "n_head").scale("attn.embed_dim", "n_embd").scale("attn.split_size", "n_embd");
  p.scale("mlp.width", "n_inner").scale("mlp.width", "n_embd", 4);
  return p;
}

/// BERT (BertModel / BertFor*): separate query/key/value.
inline tp_policy bert() {
  tp_policy p{"bert", {}, {}};
  for (const char* qkv : {"query", "key", "value"})
    p.add(std::string("*.attention.self.") + qkv + ".*", column().whole_heads("num_attention_heads"));
  p.add("*.attention.output.dense.*", row()).add("*.intermediate.dense.*", column()).add("*.output.dense.*", row());
  p.scale("attention.num_attention_heads", "num_attention_heads")
      .scale("attention.all_head_size", "hidden_size")
      .scale("intermediate.width", "intermediate_size");
  return p;
}

/// OPT (OPTForCausalLM): q/k/v/out_proj, fc1/fc2.
inline tp_policy opt() {
  tp_policy p{"opt", {}, {}};
  for (const char* qkv : {"q_proj", "k_proj", "v_proj"})
    p.add(std::string("*.self_attn.") + qkv + ".*", column().whole_heads("num_attention_heads"));
  p.add("*.self_attn.out_proj.*", row()).add("*.fc1.*", column()).add("*.fc2.*", row());
  p.scale("self_attn.num_heads", "num_attention_heads")
      .scale("self_attn.embed_dim", "hidden_size")
      .scale("ffn_dim", "ffn_dim");
  return p;
}

/// GPT-NeoX: query_key_value is per-head interleaved [heads, 3, head_dim, hidden].
inline tp_policy gpt_neox() {
  tp_policy p{"gpt_neox", {}, {}};
  p.add("*.attention.query_key_value.*", column().per_head("num_attention_heads"))
      .add("*.attention.dense.*", row())
      .add("*.mlp.dense_h_to_4h.*", column())
      .add("*.mlp.dense_4h_to_h.*", row());
  p.scale("attention.num_attention_heads", "num_attention_heads")
      .scale("attention.hidden_size", "hidden_size")
      .scale("mlp.width", "intermediate_size");
  return p;
}

/// BLOOM: query_key_value is per-head interleaved [n_head, 3, head_dim, hidden].
inline tp_policy bloom() {
  tp_policy p{"bloom", {}, {}};
  p.add("*.self_attention.query_key_value.*", column().per_head("n_head"))
      .add("*.self_attention.dense.*", row())
      .add("*.mlp.dense_h_to_4h.*", column())
      .add("*.mlp.dense_4h_to_h.*", row());
  p.scale("self_attention.num_heads", "n_head")
      .scale("self_attention.hidden_size", "hidden_size")
      .scale("mlp.width", "hidden_size", 4);
  return p;
}

/// LLaMA (grouped-query attention): q_proj by num_attention_heads, k/v_proj by
/// num_key_value_heads (whole heads per rank; fewer than the ranks, each replicated over
/// tp / kv ranks, as vLLM does), gate/up column, down row.
inline tp_policy llama() {
  tp_policy p{"llama", {}, {}};
  p.add("*.self_attn.q_proj.*", column().whole_heads("num_attention_heads"))
      .add("*.self_attn.k_proj.*", column().whole_heads("num_key_value_heads").replicable())
      .add("*.self_attn.v_proj.*", column().whole_heads("num_key_value_heads").replicable())
      .add("*.self_attn.o_proj.*", row())
      .add("*.mlp.gate_proj.*", column())
      .add("*.mlp.up_proj.*", column())
      .add("*.mlp.down_proj.*", row());
  p.scale("self_attn.num_heads", "num_attention_heads")
      .scale_heads("self_attn.num_key_value_heads", "num_key_value_heads")
      .scale("self_attn.hidden_size", "hidden_size")
      .scale("mlp.intermediate_size", "intermediate_size");
  return p;
}

/// A built-in policy by Hugging Face model_type ("gpt2", "bert", "opt", "gpt_neox", "bloom", "llama").
inline tp_policy by_model_type(std::string_view model_type) {
  if (model_type == "gpt2") return gpt2();
  if (model_type == "bert") return bert();
  if (model_type == "opt") return opt();
  if (model_type == "gpt_neox") return gpt_neox();
  if (model_type == "bloom") return bloom();
  if (model_type == "llama") return llama();
  throw spec_error("no built-in tensor-parallel policy for model_type " + quoted_text(model_type) +
                   " (built in: gpt2, bert, opt, gpt_neox, bloom, llama)");
}

}  // namespace policies
}  // namespace autoshard

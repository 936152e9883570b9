#pragma once
/// The repeated layers of a model, found by name ("transformer.h.7.attn.c_attn" is in layer 7),
/// and what activation recomputation offers each layer's operators (Korthikanti et al. 2022).
///   autoshard::detail::layer_key("transformer.h.7.attn");     // "transformer.h.#.attn"
///   autoshard::detail::layer_index("transformer.h.7.attn");   // 7
///   autoshard::layer_map L = autoshard::map_layers(g);
///   autoshard::add_recompute_variants(g, L, strategies, pricing);  // the variants a layer may take
///
/// Recomputation is a choice per layer: every operator of a layer that recomputes `full` takes
/// its " recompute-full" variant (one more forward per micro-step, and it keeps nothing to the
/// end of the forward but the layer's output, the checkpoint the next layer starts from), and
/// an edge between two operators of one layer allows only the same choice on both sides
/// (recompute_consistent). `selective` concerns the attention core alone: with the unfused
/// kernel its " recompute-selective" variant runs the core's forward again in the backward and
/// keeps no probabilities; with the flash kernel the core keeps none anyway (recomputing them
/// is the kernel's own backward), so nothing is offered. The time a fully recomputed layer's
/// activations are live again, in its backward, is the pass's to count (pass_model: the
/// training time axis runs through the backward).
#include <algorithm>  // std::all_of, std::min, std::max
#include <cstdint>    // std::int64_t
#include <map>        // std::map
#include <string>     // std::string
#include <vector>     // std::vector

#include "../core/error.hpp"      // graph_error, quoted_text
#include "../graph/model.hpp"     // model_graph
#include "../graph/pricing.hpp"   // step_pricing, recompute_kind, recompute_policy
#include "../graph/strategy.hpp"  // strategy, recomputed
#include "../graph/validate.hpp"  // topological_order

namespace autoshard {

namespace detail {

/// "transformer.h.7.attn" -> "transformer.h.#.attn"; names without a numeric segment unchanged.
inline std::string layer_key(const std::string& name) {
  std::size_t i = 0;
  while (i < name.size()) {
    std::size_t j = name.find('.', i);
    if (j == std::string::npos) j = name.size();
    const bool digits = j > i && std::all_of(name.begin() + static_cast<long>(i), name.begin() + static_cast<long>(j),
                                             [](char c) { return c >= '0' && c <= '9'; });
    if (digits) return name.substr(0, i) + "#" + name.substr(j);
    i = j + 1;
  }
  return name;
}

/// The layer index of a name ("transformer.h.7.attn" -> 7), or -1 without a numeric component.
inline long layer_index(const std::string& name) {
  const std::string key = layer_key(name);
  if (key == name) return -1;
  const std::size_t at = key.find('#');
  std::size_t end = at;
  while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
  return end - at > 9 ? -1 : std::stol(name.substr(at, end - at));
}

}  // namespace detail

/// Which operators belong to which repeated layer.
struct layer_map {
  std::vector<long> layer;    ///< per vertex: the layer of an operator in one, else -1
  std::vector<char> output;   ///< per vertex: an operator of a layer whose output is read outside it
  std::vector<long> indices;  ///< the layers present, ascending
};

/// The layers of `g`: operators whose names carry a layer index, and which of them hand their
/// output to an operator outside their layer (the next layer's checkpoint).
inline layer_map map_layers(const model_graph& g) {
  const std::size_t n = boost::num_vertices(g);
  layer_map L;
  L.layer.assign(n, -1);
  L.output.assign(n, 0);
  std::map<long, char> seen;
  for (vertex_t v = 0; v < n; ++v)
    if (g[v].is_operator()) {
      L.layer[v] = detail::layer_index(g[v].name);
      if (L.layer[v] >= 0) seen[L.layer[v]] = 1;
    }
  for (vertex_t v = 0; v < n; ++v) {
    if (L.layer[v] < 0) continue;
    for (auto [e, end] = boost::out_edges(v, g); e != end; ++e)
      if (L.layer[boost::target(*e, g)] != L.layer[v]) L.output[v] = 1;
  }
  for (const auto& [i, unused] : seen) L.indices.push_back(i);
  return L;
}

namespace detail {

/// The unit of every vertex: 0 before the layers (what leads to them: the embedding), 1 + k
/// the k-th layer present, layers + 1 after them (the head); a parameter takes its first
/// consumer's unit.
inline std::vector<int> unit_of_vertices(const model_graph& g, const layer_map& L) {
  const std::size_t n = boost::num_vertices(g);
  std::map<long, int> pos;
  for (std::size_t k = 0; k < L.indices.size(); ++k) pos[L.indices[k]] = static_cast<int>(k) + 1;
  const int head = static_cast<int>(L.indices.size()) + 1;
  std::vector<int> unit(n, head);
  std::vector<char> leads(n, 0);  // has a path to a layer's operator
  const std::vector<vertex_t> order = topological_order(g);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const vertex_t v = *it;
    if (L.layer[v] >= 0) {
      leads[v] = 1;
      unit[v] = pos[L.layer[v]];
      continue;
    }
    for (auto [e, end] = boost::out_edges(v, g); e != end; ++e) leads[v] = leads[v] || leads[boost::target(*e, g)];
    unit[v] = leads[v] ? 0 : head;
  }
  // Stages take the units in order, so an operator must not feed one of an earlier unit: layers
  // numbered out of the graph's order (a plan whose layer 1 was renamed 7 put layer 2 on stage 0
  // behind it on stage 1, and `verify` ran the stages into a segfault), or an operator of no
  // layer between two layers, which the first unit takes.
  const auto where = [&](vertex_t v) {
    return quoted_text(g[v].name) + (unit[v] == 0 ? " (of no layer, so with the embedding)" : " (layer " + std::to_string(L.layer[v]) + ")");
  };
  for (vertex_t v = 0; v < n; ++v)
    if (g[v].is_operator())
      for (auto [e, end] = boost::out_edges(v, g); e != end; ++e)
        if (const vertex_t w = boost::target(*e, g); g[w].is_operator() && unit[w] < unit[v])
          throw graph_error("the layers do not run in the order of their numbers: " + where(v) + " feeds " + where(w) +
                            ", which a pipeline would place before it (its stages take the layers by number, and what "
                            "leads to the first of them before them)");
  for (vertex_t v = 0; v < n; ++v)
    if (g[v].is_parameter()) {
      int u = head + 1;
      for (auto [e, end] = boost::out_edges(v, g); e != end; ++e) u = std::min(u, unit[boost::target(*e, g)]);
      unit[v] = std::min(u, head);
    }
  return unit;
}

}  // namespace detail

/// Whether `v` is a norm of a repeated layer (layer_norm or rms_norm): what Megatron-LM's
/// sequence parallelism runs split on the sequence, in every layer or in none.
inline bool is_layer_norm(const model_graph& g, const layer_map& L, vertex_t v) {
  return L.layer[v] >= 0 && (g[v].kind == op_kind::layer_norm || g[v].kind == op_kind::rms_norm);
}

/// The recomputation kinds `policy` lets a layer take, as a bit set over recompute_kind.
constexpr unsigned recompute_kinds_of(recompute_policy policy) noexcept {
  switch (policy) {
    case recompute_policy::choose: return 0b111;
    case recompute_policy::none: return 0b001;
    case recompute_policy::selective: return 0b010;
    case recompute_policy::full: return 0b100;
  }
  return 0b001;
}
constexpr bool has_kind(unsigned kinds, recompute_kind r) noexcept { return (kinds >> static_cast<unsigned>(r)) & 1u; }

/// The kinds in words: "no recomputation", "selective recomputation", "full recomputation",
/// or "recomputation chosen per layer (none, selective or full)".
inline std::string describe_recompute_kinds(unsigned kinds) {
  if (kinds == 0b001) return "no recomputation";
  if (kinds == 0b010) return "selective recomputation";
  if (kinds == 0b100) return "full recomputation";
  std::string s;
  for (recompute_kind r : all_recompute_kinds)
    if (has_kind(kinds, r)) s += (s.empty() ? "" : ", ") + std::string(to_string(r));
  return "recomputation chosen per layer (" + s + ")";
}

/// Whether vertex `v` has a selective variant: the attention core of a layer with the unfused
/// kernel (the flash kernel keeps no probabilities to spare).
inline bool offers_selective(const model_graph& g, const layer_map& L, vertex_t v, const step_pricing& p) {
  return L.layer[v] >= 0 && g[v].kind == op_kind::attention && p.attention == attention_kernel::unfused;
}

/// Whether strategy `s` of vertex `v` is one a layer may take under the kinds in `kinds`
/// (anything outside the layers, or at inference):
/// a " recompute-full" variant when full is allowed; a selective one when selective is; the
/// plain strategy when none is, or when selective is and `v` has no selective variant (it is
/// then what a selective layer runs).
inline bool recompute_allowed(const model_graph& g, const layer_map& L, vertex_t v, const strategy& s, unsigned kinds,
                              const step_pricing& p) {
  if (L.layer[v] < 0 || p.mode != run_mode::training) return true;  // outside the layers nothing is recomputed
  switch (s.recompute) {
    case recompute_kind::full: return has_kind(kinds, recompute_kind::full);
    case recompute_kind::selective: return has_kind(kinds, recompute_kind::selective);
    case recompute_kind::none:
      return has_kind(kinds, recompute_kind::none) ||
             (has_kind(kinds, recompute_kind::selective) && !offers_selective(g, L, v, p));
  }
  return false;
}

/// What each strategy of vertex `v` becomes under `p.recompute` (add_recompute_variants): itself
/// (`plain`), its selective variant, its full one. Outside the layers and at inference, itself.
struct recompute_variants {
  bool plain = true, selective = false, full = false;
  std::size_t count() const noexcept { return std::size_t{plain} + std::size_t{selective} + std::size_t{full}; }
};
inline recompute_variants recompute_variants_of(const model_graph& g, const layer_map& L, vertex_t v, const step_pricing& p) {
  if (p.mode != run_mode::training || L.layer[v] < 0) return {};
  const unsigned kinds = recompute_kinds_of(p.recompute);
  const bool selective = offers_selective(g, L, v, p) && has_kind(kinds, recompute_kind::selective);
  return {has_kind(kinds, recompute_kind::none) || (has_kind(kinds, recompute_kind::selective) && !selective), selective,
          has_kind(kinds, recompute_kind::full)};
}

/// Adds to every operator of a layer the recomputation variants `p.recompute` allows (training
/// only), and drops the plain strategy when the policy does not allow `none` for it (a fixed
/// full or, for the unfused attention core, selective). Memory held to the end of the forward:
/// selective keeps the core's output but not its probabilities; full keeps only a layer
/// output's output (its kept internal bytes, a dropout mask, go too).
inline void add_recompute_variants(const model_graph& g, const layer_map& L, std::vector<std::vector<strategy>>& strategies,
                                   const step_pricing& p) {
  if (p.mode != run_mode::training) return;
  const int steps = p.accumulation();
  for (vertex_t v = 0; v < strategies.size(); ++v) {
    if (L.layer[v] < 0) continue;
    const recompute_variants r = recompute_variants_of(g, L, v, p);
    std::vector<strategy> out;
    for (const strategy& s : strategies[v]) {
      if (r.plain) out.push_back(s);
      if (r.selective) out.push_back(recomputed(s, recompute_kind::selective, s.memory_bytes - s.kept_internal_bytes, steps));
      if (r.full)
        out.push_back(recomputed(s, recompute_kind::full, L.output[v] ? s.memory_bytes - s.kept_internal_bytes : 0, steps));
    }
    strategies[v] = std::move(out);
  }
}

/// Whether strategies `a` of `u` and `b` of `v` agree on their layer's recomputation: two
/// operators of one layer both recompute fully or neither does.
inline bool recompute_consistent(const layer_map& L, vertex_t u, vertex_t v, const strategy& a, const strategy& b) {
  if (L.layer[u] < 0 || L.layer[u] != L.layer[v]) return true;
  return (a.recompute == recompute_kind::full) == (b.recompute == recompute_kind::full);
}

/// What each layer recomputes under per-vertex strategies `chosen`, by layer index: full when
/// its operators recompute fully, selective when its attention core recomputes, else none.
inline std::map<long, recompute_kind> layer_recomputation(const layer_map& L, const std::vector<const strategy*>& chosen) {
  std::map<long, recompute_kind> out;
  for (long i : L.indices) out[i] = recompute_kind::none;
  for (vertex_t v = 0; v < chosen.size(); ++v) {
    if (L.layer[v] < 0 || !chosen[v]) continue;
    recompute_kind& r = out[L.layer[v]];
    if (chosen[v]->recompute == recompute_kind::full) r = recompute_kind::full;
    else if (chosen[v]->recompute == recompute_kind::selective && r == recompute_kind::none) r = recompute_kind::selective;
  }
  return out;
}

/// "full on all 24 layers", "selective on layers 0-11, none on 12-23": a per-layer choice in words.
inline std::string describe_recomputation(const std::map<long, recompute_kind>& layers) {
  if (layers.empty()) return "none (no repeated layers)";
  std::string s;
  auto it = layers.begin();
  while (it != layers.end()) {
    auto run = it;
    long last = it->first;
    while (std::next(run) != layers.end() && std::next(run)->second == it->second && std::next(run)->first == last + 1) {
      ++run;
      last = run->first;
    }
    if (!s.empty()) s += ", ";
    s += std::string(to_string(it->second));
    if (it == layers.begin() && std::next(run) == layers.end())
      s += " on all " + std::to_string(layers.size()) + " layers";
    else
      s += it->first == last ? " on layer " + std::to_string(it->first)
                             : " on layers " + std::to_string(it->first) + "-" + std::to_string(last);
    it = std::next(run);
  }
  return s;
}

}  // namespace autoshard

#pragma once
// Tensor names as users write them, for `show --plan --tensor` and `plan --pin`: the graph's
// own name, Hugging Face's checkpoint spelling without the first component
// ("h.0.attn.c_attn.weight"), or a module's state-dict name for a tied weight
// ("lm_head.weight" is GPT-2's "transformer.wte.weight"); and close names when none fits.
#include <autoshard/graph/model.hpp>

#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace autoshard::tool {

namespace detail {
inline std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0u : 1u)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

inline std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// The vertex named `name`, or the one vertex whose name without its first component is `name`.
inline std::optional<vertex_t> by_name(const model_graph& g, const std::string& name) {
  if (std::optional<vertex_t> v = find_vertex(g, name)) return v;
  std::optional<vertex_t> only;
  int n = 0;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    const std::string& full = g[v].name;
    const auto dot = full.find('.');
    if (dot != std::string::npos && full.compare(dot + 1, std::string::npos, name) == 0) only = v, ++n;
  }
  return n == 1 ? only : std::nullopt;
}
}  // namespace detail

/// The vertex `want` names: exactly, or in checkpoint spelling (the one vertex whose name
/// without its first component it is), or as a module's ".weight" / ".bias" in Hugging Face's
/// state-dict spelling that the graph stores as another parameter because it is tied: the
/// operator named by the module takes it as operand 1 (weight) or 2 (bias). `note` then says
/// so ("'lm_head.weight' is 'transformer.wte.weight' (tied: ...)"). nullopt when nothing fits.
inline std::optional<vertex_t> find_tensor(const model_graph& g, const std::string& want, std::string* note = nullptr) {
  if (std::optional<vertex_t> v = detail::by_name(g, want)) return v;
  for (const auto& [suffix, operand] : {std::pair<std::string, std::size_t>{".weight", 1}, {".bias", 2}}) {
    if (want.size() <= suffix.size() || want.compare(want.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::optional<vertex_t> op = detail::by_name(g, want.substr(0, want.size() - suffix.size()));
    if (!op || !g[*op].is_operator()) continue;
    const std::vector<vertex_t> ins = operands(g, *op);
    if (operand >= ins.size() || !g[ins[operand]].is_parameter()) continue;
    if (note)
      *note = quoted_text(want) + " is " + quoted_text(g[ins[operand]].name) + " (tied: operator " + quoted_text(g[*op].name) + " uses it as its " +
              suffix.substr(1) + ")";
    return ins[operand];
  }
  return std::nullopt;
}

/// Up to three vertex names close to `want` (within a third of its length in edits, also in
/// checkpoint spelling, or containing it), closest first, as "; did you mean 'a', 'b' or
/// 'c'?"; empty when none is close.
inline std::string did_you_mean(const model_graph& g, const std::string& want) {
  const std::string w = detail::lower(want);
  const std::size_t limit = std::max<std::size_t>(2, w.size() / 3);
  std::vector<std::pair<std::size_t, std::string>> scored;
  for (vertex_t v = 0; v < boost::num_vertices(g); ++v) {
    const std::string l = detail::lower(g[v].name);
    // The edit distance is at least the difference in length: a 100 KB name is near no
    // tensor's, and was compared with every one of them in full.
    if (w.size() > l.size() + limit) continue;
    std::size_t d = detail::edit_distance(l, w);
    if (const auto dot = l.find('.'); dot != std::string::npos)  // the checkpoint spelling
      d = std::min(d, detail::edit_distance(l.substr(dot + 1), w));
    if (!w.empty() && l.find(w) != std::string::npos) d = std::min(d, (l.size() - w.size()) / 8);
    if (d <= limit) scored.emplace_back(d, g[v].name);
  }
  std::sort(scored.begin(), scored.end());
  std::string out;
  const std::size_t n = std::min<std::size_t>(3, scored.size());
  for (std::size_t k = 0; k < n; ++k)
    out += (k == 0 ? "; did you mean " : k + 1 == n ? " or " : ", ") + quoted_text(scored[k].second);
  return n == 0 ? out : out + "?";
}

}  // namespace autoshard::tool

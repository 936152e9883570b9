#pragma once
/// A rotary's sequence-dependent rule (op_attrs::rotary_rule): the two Hugging Face rope types
/// whose frequencies depend on the run's sequence, carried by the rotary op so that a graph
/// re-sized to another sequence (with_batch_seq: verify --seq, --tokens of another length)
/// turns as transformers turns at that length, not at the length the graph was built for.
///   dynamic (DynamicNTK): past `threshold` (max_position_embeddings, M) positions the base
///     grows with the sequence; up to it, the default base^(-2i/R);
///   longrope (LongRoPE): base^(-2i/R) / short_factor_i up to `threshold`
///     (original_max_position_embeddings), / long_factor_i past it.
/// The op keeps rotary_frequencies (what the kernels read) equal to rope_rule_frequencies at
/// its sequence (dim -2 of its input): shape inference checks it, with_batch_seq recomputes it.
/// The rule models one forward of a freshly loaded transformers model: transformers' dynamic
/// rope keeps a grown inv_freq on the model object between forwards (until a sequence within
/// M resets it), a state across calls no graph carries.
///   autoshard::rope_rule r{autoshard::rope_rule_kind::longrope, 1.0, 32, short_f, long_f};
///   autoshard::rope_rule_frequencies(1e4, 64, r, 48);  // long factors: 48 > 32
#include <cmath>        // std::pow, std::isfinite
#include <cstddef>      // std::size_t
#include <cstdint>      // std::int64_t, std::uint8_t
#include <string>       // std::string, std::to_string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "../core/dtype.hpp"  // exact_number
#include "../core/error.hpp"  // graph_error

namespace autoshard {

/// Which sequence-dependent rope a rotary follows; none: its frequencies are fixed.
enum class rope_rule_kind : std::uint8_t { none, dynamic, longrope };
inline constexpr rope_rule_kind all_rope_rule_kinds[] = {rope_rule_kind::none, rope_rule_kind::dynamic, rope_rule_kind::longrope};

/// "none", "dynamic" or "longrope" (Hugging Face's rope_type, the graph file's spelling).
constexpr std::string_view to_string(rope_rule_kind k) noexcept {
  switch (k) {
    case rope_rule_kind::none: return "none";
    case rope_rule_kind::dynamic: return "dynamic";
    case rope_rule_kind::longrope: return "longrope";
  }
  return "?";
}

/// The largest threshold (positions) a rule may give: far beyond any context.
inline constexpr std::int64_t max_rope_threshold = std::int64_t{1} << 40;

/// A rotary's rule (see the file comment). Its base is the rotary's rotary_base; its R the
/// rotary's turned dims (rotary_width).
struct rope_rule {
  rope_rule_kind kind = rope_rule_kind::none;
  double factor = 1.0;         ///< dynamic: the scaling factor; longrope: unused (1)
  std::int64_t threshold = 0;  ///< dynamic: max_position_embeddings; longrope: original_max_position_embeddings
  /// longrope: pair i's divisor up to the threshold (short) and past it (long), R/2 each.
  std::vector<double> short_factor, long_factor;
  friend bool operator==(const rope_rule&, const rope_rule&) = default;
};

/// The rule in words, with its numbers: "dynamic (factor 2, max_position_embeddings 8)",
/// "longrope (original_max_position_embeddings 32)".
inline std::string to_string(const rope_rule& r) {
  switch (r.kind) {
    case rope_rule_kind::none: return "none";
    case rope_rule_kind::dynamic:
      return "dynamic (factor " + exact_number(r.factor) + ", max_position_embeddings " + std::to_string(r.threshold) + ")";
    case rope_rule_kind::longrope: return "longrope (original_max_position_embeddings " + std::to_string(r.threshold) + ")";
  }
  return "?";
}

/// What is wrong with rule `r` for a rotary turning R dims, in words naming the numbers, or ""
/// when it is sound: a threshold in [1, max_rope_threshold]; dynamic: a finite factor above 0,
/// R above 2 (its power R / (R - 2)) and no factor lists; longrope: factor 1 and R/2 short and
/// long factors, each finite and above 0.
inline std::string rope_rule_problem(const rope_rule& r, std::int64_t R) {
  if (r.kind == rope_rule_kind::none) return {};
  const std::string what = "rotary_rule " + to_string(r) + ": ";
  if (r.threshold < 1 || r.threshold > max_rope_threshold)
    return what + "threshold " + std::to_string(r.threshold) + " is not a number of positions in [1, " + std::to_string(max_rope_threshold) + "]";
  if (r.kind == rope_rule_kind::dynamic) {
    if (!(r.factor > 0.0) || !std::isfinite(r.factor)) return what + "factor " + exact_number(r.factor) + " is not a finite number above 0";
    if (R <= 2) return what + "turns " + std::to_string(R) + " dims: its base's power R / (R - 2) needs R above 2";
    if (!r.short_factor.empty() || !r.long_factor.empty())
      return what + "has " + std::to_string(r.short_factor.size()) + " short and " + std::to_string(r.long_factor.size()) +
             " long factors, which only a longrope rule has";
    return {};
  }
  if (r.factor != 1.0) return what + "factor " + exact_number(r.factor) + " is given, which only a dynamic rule has (longrope's is 1)";
  const std::size_t half = static_cast<std::size_t>(R / 2);
  for (const auto* list : {&r.short_factor, &r.long_factor}) {
    const char* name = list == &r.short_factor ? "short_factor" : "long_factor";
    if (list->size() != half)
      return what + std::to_string(list->size()) + " " + name + "s for " + std::to_string(R) + " turned dims: one a pair, " +
             std::to_string(half) + ", is needed";
    for (std::size_t i = 0; i < half; ++i)
      if (!((*list)[i] > 0.0) || !std::isfinite((*list)[i]))
        return what + name + "[" + std::to_string(i) + "] " + exact_number((*list)[i]) + " is not a finite number above 0";
  }
  return {};
}

/// The frequencies of a rotary's R/2 pairs under rule `r` at `base` for a run of `seq`
/// positions: empty where the rule leaves the default base^(-2i/R) (none; dynamic within its
/// threshold), else transformers' (modeling_rope_utils), computed in double:
///   longrope (_compute_longrope_parameters, and dynamic_rope_update's longrope_frequency_update):
///     base^(-2i/R) / ext_i, ext = long_factor where seq > threshold, else short_factor;
///   dynamic (_compute_dynamic_ntk_parameters, as dynamic_rope_update calls it in the forward
///     with seq_len = the largest position + 1 = seq): seq <= threshold (M): none (transformers
///     keeps its initial inv_freq, the default's); else base' ^ (-2i/R) with
///     base' = base x (factor x seq / M - (factor - 1)) ^ (R / (R - 2)), which transformers
///     computes on its seq_len tensor, so in float32 whatever the model's dtype (torch's
///     default dtype): each step rounded to float32, the power taken in double (torch's pow of
///     a float32 tensor by a double) and rounded, as here; R = 2 is refused (R - 2 = 0).
/// graph_error naming the numbers where the rule does not fit R or the grown base is not a
/// finite number above 1.
inline std::vector<double> rope_rule_frequencies(double base, std::int64_t R, const rope_rule& r, std::int64_t seq) {
  std::vector<double> f;
  if (r.kind == rope_rule_kind::none) return f;
  if (r.kind == rope_rule_kind::dynamic) {
    if (seq <= r.threshold) return f;
    const std::string what = "rope type \"dynamic\" (factor " + std::to_string(r.factor) + ", max_position_embeddings " +
                             std::to_string(r.threshold) + ") at sequence " + std::to_string(seq);
    if (R <= 2) throw graph_error(what + " turns " + std::to_string(R) + " dims: its base's power D / (D - 2) needs D above 2");
    float grown = static_cast<float>(r.factor) * static_cast<float>(seq);
    grown = grown / static_cast<float>(r.threshold);
    grown = grown - static_cast<float>(r.factor - 1);
    const float scaled = static_cast<float>(base) *
                         static_cast<float>(std::pow(static_cast<double>(grown), static_cast<double>(R) / static_cast<double>(R - 2)));
    if (!(scaled > 1.0f) || !std::isfinite(scaled))
      throw graph_error(what + ": its base " + std::to_string(base) + " scaled to " + std::to_string(scaled) +
                        " (float32, as transformers computes it) is not a finite number above 1");
    for (std::int64_t i = 0; i < R / 2; ++i)
      f.push_back(1.0 / std::pow(static_cast<double>(scaled), 2.0 * static_cast<double>(i) / static_cast<double>(R)));
    return f;
  }
  const std::vector<double>& ext = seq > r.threshold ? r.long_factor : r.short_factor;
  if (ext.size() != static_cast<std::size_t>(R / 2))
    throw graph_error("rope type \"longrope\": " + std::to_string(ext.size()) + " factors for " + std::to_string(R) +
                      " turned dims: one a pair, " + std::to_string(R / 2) + ", is needed");
  for (std::int64_t i = 0; i < R / 2; ++i)
    f.push_back(1.0 / (ext[static_cast<std::size_t>(i)] * std::pow(base, 2.0 * static_cast<double>(i) / static_cast<double>(R))));
  return f;
}

}  // namespace autoshard

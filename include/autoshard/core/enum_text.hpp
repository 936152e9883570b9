#pragma once
/// The text of a closed choice: an enum whose values are listed in an array (all_algos,
/// all_run_modes, ...) and spelled by its to_string, found by argument-dependent lookup.
///   std::optional<autoshard::algo> a = autoshard::parse_enum("zero3", autoshard::all_algos);
///   autoshard::enum_names(autoshard::all_algos);   // "\"alpa\", \"megatron\", ... or \"fully_replicated\""
#include <cstddef>      // std::size_t
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view

namespace autoshard {

/// The value of `all` that to_string spells `s`, or nullopt.
template <class E, std::size_t N>
constexpr std::optional<E> parse_enum(std::string_view s, const E (&all)[N]) noexcept {
  for (E e : all)
    if (to_string(e) == s) return e;
  return std::nullopt;
}

/// Every spelling of `all`, each in double quotes, the last after "or": for messages.
template <class E, std::size_t N>
std::string enum_names(const E (&all)[N]) {
  std::string s;
  for (std::size_t i = 0; i < N; ++i)
    s += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + "\"" + std::string(to_string(all[i])) + "\"";
  return s;
}

}  // namespace autoshard

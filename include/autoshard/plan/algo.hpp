#pragma once
/// How the auto-sharding pass chooses (the `algo` of MASE's options, what a plan file records):
/// the ILP over every strategy, or one of the baselines it is compared with, each the same ILP
/// over a restricted strategy set (pass/autosharding.hpp says which).
///   autoshard::algo a = autoshard::algo::megatron;
///   std::string_view s = autoshard::to_string(a);     // "megatron"
///   std::optional<autoshard::algo> b = autoshard::parse_algo("zero3");
#include <cstddef>      // std::size_t
#include <cstdint>      // std::uint8_t
#include <iterator>     // std::size
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "../core/enum_text.hpp"  // parse_enum, enum_names

namespace autoshard {

enum class algo : std::uint8_t { alpa, megatron, data_parallel, zero3, fully_replicated };
inline constexpr algo all_algos[] = {algo::alpa, algo::megatron, algo::data_parallel, algo::zero3, algo::fully_replicated};

/// "alpa", "megatron", "data_parallel", "zero3" or "fully_replicated".
constexpr std::string_view to_string(algo a) noexcept {
  constexpr std::string_view names[] = {"alpa", "megatron", "data_parallel", "zero3", "fully_replicated"};
  return static_cast<std::size_t>(a) < std::size(names) ? names[static_cast<std::size_t>(a)] : "?";
}

/// The algo to_string wrote, or nullopt.
constexpr std::optional<algo> parse_algo(std::string_view s) noexcept { return parse_enum(s, all_algos); }

/// The algo names in order, each in double quotes, the last after "or": for messages.
inline std::string algo_names() { return enum_names(all_algos); }

}  // namespace autoshard

#pragma once
/// Element types autoshard moves and prices: f32, f16, bf16, i32, i64, u8 (plus f64, bool).
///   static_assert(autoshard::dtype_size(autoshard::dtype::bf16) == 2);
#include <cstddef>      // std::size_t
#include <cstdint>      // std::int64_t
#include <optional>     // std::optional
#include <string_view>  // std::string_view

namespace autoshard {

enum class dtype : std::uint8_t { f32, f16, bf16, f64, i32, i64, u8, boolean };

inline constexpr dtype all_dtypes[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::f64,
                                       dtype::i32, dtype::i64, dtype::u8,   dtype::boolean};

/// Bytes per element.
constexpr std::size_t dtype_size(dtype t) noexcept {
  switch (t) {
    case dtype::f64:
    case dtype::i64: return 8;
    case dtype::f32:
    case dtype::i32: return 4;
    case dtype::f16:
    case dtype::bf16: return 2;
    case dtype::u8:
    case dtype::boolean: return 1;
  }
  return 0;
}

/// autoshard's short name ("f32", "bf16", ...).
constexpr std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::f64: return "f64";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
    case dtype::u8: return "u8";
    case dtype::boolean: return "bool";
  }
  return "?";
}

/// The safetensors spelling ("F32", "BF16", ...).
constexpr std::string_view safetensors_name(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "F32";
    case dtype::f16: return "F16";
    case dtype::bf16: return "BF16";
    case dtype::f64: return "F64";
    case dtype::i32: return "I32";
    case dtype::i64: return "I64";
    case dtype::u8: return "U8";
    case dtype::boolean: return "BOOL";
  }
  return "?";
}

/// Parses either spelling ("f32"/"F32", "bf16"/"BF16", also "float32", "float16", "bfloat16").
constexpr std::optional<dtype> parse_dtype(std::string_view s) noexcept {
  for (dtype t : all_dtypes)
    if (s == to_string(t) || s == safetensors_name(t)) return t;
  if (s == "float32" || s == "float") return dtype::f32;
  if (s == "float16" || s == "half" || s == "fp16") return dtype::f16;
  if (s == "bfloat16" || s == "bf16" || s == "BFloat16") return dtype::bf16;
  if (s == "float64" || s == "double") return dtype::f64;
  if (s == "int32") return dtype::i32;
  if (s == "int64") return dtype::i64;
  if (s == "uint8") return dtype::u8;
  return std::nullopt;
}

}  // namespace autoshard

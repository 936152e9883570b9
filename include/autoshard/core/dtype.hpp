#pragma once
/// Element types autoshard moves and prices: f32, f16, bf16, i32, i64, u8 (plus f64, bool).
///   static_assert(autoshard::dtype_size(autoshard::dtype::bf16) == 2);
#include <bit>          // std::bit_cast
#include <charconv>     // std::to_chars
#include <cstddef>      // std::size_t
#include <cstdint>      // std::int64_t
#include <cstdio>       // std::snprintf
#include <string>       // std::string
#include <optional>     // std::optional
#include <string_view>  // std::string_view

namespace autoshard {

enum class dtype : std::uint8_t { f32, f16, bf16, f64, i32, i64, u8, boolean };

inline constexpr dtype all_dtypes[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::f64,
                                       dtype::i32, dtype::i64, dtype::u8,   dtype::boolean};

/// A floating-point dtype (f32, f16, bf16, f64): what gradients, optimizer state and
/// conversions need.
constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::f32 || t == dtype::f64 || t == dtype::f16 || t == dtype::bf16;
}

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

// ---- sizes and times for people ----

/// Human-readable bytes in binary units: "1.50 MiB".
inline std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

/// The shortest decimal that reads back as exactly `x` ("0.25", "500000", "1e-06"), as
/// Python's repr writes it: for values a program parses again (Megatron-LM's arguments) and
/// messages that must name a number as given.
inline std::string exact_number(double x) {
  char buf[32];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, x).ptr);
}

/// Bytes as people and programs read them: "40.00 GiB (42949672960 bytes)".
inline std::string human_bytes_exact(std::int64_t b) {
  return human_bytes(static_cast<double>(b)) + " (" + std::to_string(b) + " bytes)";
}

/// Human-readable seconds: "12.3 us".
/// From a million seconds (11.6 days) on, and for inf or NaN, three significant digits
/// ("1.76e+08 s"): "%.2f" of 1.7e293 s had 297 characters, cut to 31 without its unit, and
/// figures of 10^7 s ran into the next column of a table. Below what "%.1f us" shows (0.05 us)
/// a positive time is nanoseconds, or under one, seconds ("12 ns", "1e-12 s"): it read "0.0 us",
/// a zero it is not (`solve --time-limit 1e-9`: "--time-limit of 0.0 us passed").
inline std::string human_seconds(double s) {
  char buf[32];
  if (s == 0) return "0";
  if (!(s < 1e6)) std::snprintf(buf, sizeof buf, "%.3g s", s);
  else if (s > 0 && s < 1e-9) std::snprintf(buf, sizeof buf, "%.3g s", s);
  else if (s > 0 && s < 0.05e-6) std::snprintf(buf, sizeof buf, "%.3g ns", s * 1e9);
  else if (s < 1e-3) std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  else if (s < 1.0) std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

// ---- half-precision conversions, bit for bit Eigen's (Eigen::half, Eigen::bfloat16) ----
// The core has no Eigen; tests/unit/tensor/half_test.cpp compares these with Eigen's on every
// 16-bit pattern and on the rounding boundaries of every f16 / bf16 value.

/// IEEE binary16 bits to float.
inline float f16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) {
        man <<= 1;
        --exp;
      }
      man &= 0x3ffu;
      bits = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return std::bit_cast<float>(bits);
}

/// float to IEEE binary16 bits, round to nearest even, overflow to infinity.
inline std::uint16_t float_to_f16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u)  // inf or nan
    return static_cast<std::uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  if (absx >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (absx < 0x38800000u) {  // result is subnormal or zero
    if (absx < 0x33000000u) return static_cast<std::uint16_t>(sign);
    const std::uint32_t exp = absx >> 23;
    const std::uint32_t man = (absx & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - exp;  // 14..24
    std::uint32_t r = man >> shift;
    const std::uint32_t rem = man & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t r = ((absx >> 13) - (112u << 10));
  const std::uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<std::uint16_t>(sign | r);
}

/// bfloat16 bits to float.
inline float bf16_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

/// float to bfloat16 bits, round to nearest even; a NaN becomes the quiet NaN of its sign
/// (0x7fc0 / 0xffc0), as Eigen::bfloat16 does.
inline std::uint16_t float_to_bf16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x & 0x80000000u) ? 0xffc0u : 0x7fc0u);
  const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + rounding) >> 16);
}

}  // namespace autoshard

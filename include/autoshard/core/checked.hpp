#pragma once
/// Checked arithmetic for every size, byte count, rank count and time that comes from a file or
/// a flag: overflow is an error naming the quantity and the operands, never a wrapped number.
///   std::int64_t b = autoshard::checked_mul(shape.numel(), 4, "bytes of tensor 'wte'");
///   std::int64_t n = autoshard::checked_numel(shape, "--shape");      // shape_error on overflow
///   auto ms = autoshard::checked_milliseconds(timeout_s, "--timeout");  // spec_error for inf, nan
#include <cmath>        // std::isfinite
#include <cstdint>      // std::int64_t
#include <limits>       // std::numeric_limits
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "error.hpp"  // shape_error, spec_error
#include "shape.hpp"  // tensor_shape

namespace autoshard {

namespace detail {
[[noreturn]] inline void overflow(std::string_view what, const std::string& how) {
  throw shape_error(std::string(what) + ": " + how + " exceeds 2^63-1");
}
}  // namespace detail

/// ceil(n / k) for n >= 0 and k >= 1, for every such n: (n + k - 1) / k, the form the layout
/// code used, overflowed (undefined behaviour) for a dim within k of 2^63-1.
constexpr std::int64_t ceil_div(std::int64_t n, std::int64_t k) noexcept { return n / k + (n % k != 0 ? 1 : 0); }

/// a * b, or shape_error "<what>: a x b exceeds 2^63-1".
constexpr std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) detail::overflow(what, std::to_string(a) + " x " + std::to_string(b));
  return r;
}

/// a + b, or shape_error "<what>: a + b exceeds 2^63-1".
constexpr std::int64_t checked_add(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) detail::overflow(what, std::to_string(a) + " + " + std::to_string(b));
  return r;
}

/// The number of elements of `s`, every prefix product checked.
constexpr std::int64_t checked_numel(const tensor_shape& s, std::string_view what) {
  std::int64_t n = 1;
  for (std::size_t i = 0; i < s.rank; ++i) {
    std::int64_t r = 0;
    if (__builtin_mul_overflow(n, s[i], &r)) detail::overflow(what, "the element count of " + to_string(s));
    n = r;
  }
  return n;
}

/// The bytes of a tensor of shape `s` and `elem_size`-byte elements, checked.
constexpr std::int64_t checked_bytes(const tensor_shape& s, std::int64_t elem_size, std::string_view what) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(checked_numel(s, what), elem_size, &r))
    detail::overflow(what, "the bytes of " + to_string(s) + " x " + std::to_string(elem_size));
  return r;
}

namespace detail {
template <class Range>
[[noreturn]] void too_many_ranks(const Range& sizes, std::string_view what) {
  std::string shown;
  for (auto s : sizes) shown += (shown.empty() ? "" : "x") + std::to_string(s);
  throw spec_error(std::string(what) + ": " + shown + " is more than 2147483647 ranks");
}
}  // namespace detail

/// The product of a mesh's axis sizes as an int (ranks are ints everywhere), checked; a
/// constant expression when the sizes are.
template <class Range>
constexpr int checked_rank_count(const Range& sizes, std::string_view what) {
  std::int64_t n = 1;
  for (auto s : sizes) {
    n *= static_cast<std::int64_t>(s);  // every factor is below 2^31 and n stays below 2^31 here
    if (n > std::numeric_limits<int>::max()) detail::too_many_ranks(sizes, what);
  }
  return static_cast<int>(n);
}

/// `seconds` as whole milliseconds (rounded up), for a time-out or a deadline: NaN, infinite,
/// negative or beyond 2^63-1 ms is a spec_error naming `what` (`verify --timeout inf` used to
/// print "-9223372036854775808 ms").
inline std::int64_t checked_milliseconds(double seconds, std::string_view what) {
  if (!(seconds >= 0) || !std::isfinite(seconds) || seconds * 1e3 >= 9.2e18)
    throw spec_error(std::string(what) + " must be a finite number of seconds >= 0 (at most 9.2e15), got " +
                     std::to_string(seconds));
  return static_cast<std::int64_t>(std::ceil(seconds * 1e3));
}

}  // namespace autoshard

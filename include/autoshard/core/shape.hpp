#pragma once
/// A tensor shape of rank 0..8 as a constexpr value (no allocation), e.g.
///   constexpr autoshard::tensor_shape s{1024, 768};  static_assert(s.numel() == 786432);
#include <algorithm>         // std::copy
#include <array>             // std::array
#include <cstddef>           // std::size_t
#include <cstdint>           // std::int64_t
#include <initializer_list>  // std::initializer_list
#include <ostream>           // std::ostream
#include <span>              // std::span
#include <string>            // std::string
#include <vector>            // std::vector

#include "error.hpp"  // shape_error

namespace autoshard {

inline constexpr std::size_t max_tensor_rank = 8;

/// Extents of a tensor; structural, so it can be a template argument.
struct tensor_shape {
  std::array<std::int64_t, max_tensor_rank> dims{};
  std::uint8_t rank = 0;

 private:
  template <class It>
  constexpr void assign(It first, It last) {
    std::size_t n = 0;
    for (; first != last; ++first) {
      if (n == max_tensor_rank) detail_too_many_dims();
      if (*first < 0) detail_negative_dim();
      dims[n++] = *first;
    }
    rank = static_cast<std::uint8_t>(n);
  }
  static void detail_too_many_dims() { throw shape_error("a tensor has at most 8 dims"); }
  static void detail_negative_dim() { throw shape_error("a tensor dim cannot be negative"); }
 public:
  constexpr tensor_shape() = default;
  constexpr tensor_shape(std::initializer_list<std::int64_t> d) { assign(d.begin(), d.end()); }
  explicit constexpr tensor_shape(std::span<const std::int64_t> d) { assign(d.begin(), d.end()); }
  explicit tensor_shape(const std::vector<std::int64_t>& d) { assign(d.begin(), d.end()); }

  constexpr std::int64_t operator[](std::size_t i) const { return dims[i]; }
  constexpr std::int64_t& operator[](std::size_t i) { return dims[i]; }
  constexpr std::size_t size() const noexcept { return rank; }
  constexpr const std::int64_t* begin() const noexcept { return dims.data(); }
  constexpr const std::int64_t* end() const noexcept { return dims.data() + rank; }

  constexpr std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (std::size_t i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  std::vector<std::int64_t> to_vector() const { return {begin(), end()}; }
  friend constexpr bool operator==(const tensor_shape& a, const tensor_shape& b) noexcept {
    if (a.rank != b.rank) return false;
    for (std::size_t i = 0; i < a.rank; ++i)
      if (a.dims[i] != b.dims[i]) return false;
    return true;
  }

};

/// "[1024,768]"
inline std::string to_string(const tensor_shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.rank; ++i) {
    if (i) out += ",";
    out += std::to_string(s.dims[i]);
  }
  return out + "]";
}
inline std::ostream& operator<<(std::ostream& os, const tensor_shape& s) { return os << to_string(s); }

}  // namespace autoshard

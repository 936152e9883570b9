#pragma once
/// Host tensors: a dense row-major block of one dtype, owning (host_tensor) or not
/// (tensor_view / const_tensor_view), with Eigen maps for math and float conversions.
///   autoshard::host_tensor t(autoshard::dtype::f32, {2, 3});
///   t.matrix<float>().setConstant(1.f);                     // Eigen::Map, row-major
///   autoshard::host_tensor h = autoshard::convert(t.view(), autoshard::dtype::bf16);
#include <cstddef>      // std::byte, std::size_t
#include <cstdint>      // std::int32_t, std::int64_t, std::uint8_t
#include <cstdlib>      // std::aligned_alloc, std::free
#include <cstring>      // std::memcpy
#include <memory>       // std::unique_ptr
#include <new>          // std::bad_alloc
#include <span>         // std::span
#include <string>       // std::string
#include <type_traits>  // std::is_same_v, std::conditional_t

#include <Eigen/Core>  // Eigen::Map, Eigen::half, Eigen::bfloat16

#include "../core/dtype.hpp"  // dtype, dtype_size
#include "../core/error.hpp"  // error, shape_error
#include "../core/shape.hpp"  // tensor_shape

namespace autoshard {

/// Host element types: Eigen::half / Eigen::bfloat16 stand for f16 / bf16 (core/typed.hpp has
/// storage-only tags for its constexpr descriptions; host tensors do math, so they use Eigen's).
template <class T>
inline constexpr bool is_host_element_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, Eigen::half> ||
    std::is_same_v<T, Eigen::bfloat16> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint8_t> || std::is_same_v<T, bool>;

/// host_dtype_of<float>() == dtype::f32, host_dtype_of<Eigen::bfloat16>() == dtype::bf16, ...
template <class T>
consteval dtype host_dtype_of() {
  static_assert(is_host_element_v<T>,
                "autoshard: element types are float, double, Eigen::half, Eigen::bfloat16, "
                "int32_t, int64_t, uint8_t and bool");
  if constexpr (std::is_same_v<T, float>) return dtype::f32;
  else if constexpr (std::is_same_v<T, double>) return dtype::f64;
  else if constexpr (std::is_same_v<T, Eigen::half>) return dtype::f16;
  else if constexpr (std::is_same_v<T, Eigen::bfloat16>) return dtype::bf16;
  else if constexpr (std::is_same_v<T, std::int32_t>) return dtype::i32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return dtype::i64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return dtype::u8;
  else return dtype::boolean;
}

namespace detail {
inline std::size_t checked_nbytes(const tensor_shape& s, dtype t) {
  return static_cast<std::size_t>(s.numel()) * dtype_size(t);
}
}  // namespace detail

/// A non-owning view: pointer + shape + dtype, dense row-major. `Const` views read only.
///   autoshard::const_tensor_view v(ptr, {4, 8}, autoshard::dtype::f16);
template <bool Const>
class basic_tensor_view {
 public:
  using byte_pointer = std::conditional_t<Const, const std::byte*, std::byte*>;

  constexpr basic_tensor_view() = default;
  basic_tensor_view(byte_pointer data, tensor_shape shape, dtype type) noexcept
      : data_(data), shape_(shape), type_(type) {}
  template <class T>
    requires is_host_element_v<std::remove_const_t<T>> && (Const || !std::is_const_v<T>)
  basic_tensor_view(T* data, tensor_shape shape) noexcept
      : data_(reinterpret_cast<byte_pointer>(data)), shape_(shape), type_(host_dtype_of<std::remove_const_t<T>>()) {}
  /// A mutable view converts to a const one.
  template <bool C = Const>
    requires C
  basic_tensor_view(const basic_tensor_view<false>& o) noexcept  // NOLINT(google-explicit-constructor)
      : data_(o.data()), shape_(o.shape()), type_(o.type()) {}

  byte_pointer data() const noexcept { return data_; }
  const tensor_shape& shape() const noexcept { return shape_; }
  dtype type() const noexcept { return type_; }
  std::int64_t numel() const noexcept { return shape_.numel(); }
  std::size_t nbytes() const noexcept { return detail::checked_nbytes(shape_, type_); }
  std::span<std::conditional_t<Const, const std::byte, std::byte>> bytes() const noexcept {
    return {data_, nbytes()};
  }

  /// Typed pointer; throws autoshard::error when T is not this view's dtype.
  template <class T>
  auto* as() const {
    check_type<T>();
    using P = std::conditional_t<Const, const T*, T*>;
    return reinterpret_cast<P>(data_);
  }
  /// All elements as an Eigen vector map.
  template <class T>
  auto vector() const {
    using V = Eigen::Matrix<T, Eigen::Dynamic, 1>;
    using M = Eigen::Map<std::conditional_t<Const, const V, V>>;
    return M(as<T>(), static_cast<Eigen::Index>(numel()));
  }
  /// Row-major matrix map: rank 2 as is, rank 1 as one row, rank n as [dim0, rest].
  template <class T>
  auto matrix() const {
    using R = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using M = Eigen::Map<std::conditional_t<Const, const R, R>>;
    std::int64_t rows = shape_.rank == 0 ? 1 : (shape_.rank == 1 ? 1 : shape_[0]);
    std::int64_t cols = rows == 0 ? 0 : numel() / (rows ? rows : 1);
    return M(as<T>(), static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
  }

 private:
  template <class T>
  void check_type() const {
    if (host_dtype_of<T>() != type_)
      throw error("tensor of dtype " + std::string(to_string(type_)) + " viewed as " +
                  std::string(to_string(host_dtype_of<T>())));
  }
  byte_pointer data_ = nullptr;
  tensor_shape shape_{};
  dtype type_ = dtype::f32;
};

using tensor_view = basic_tensor_view<false>;
using const_tensor_view = basic_tensor_view<true>;

/// An owning host tensor; 64-byte aligned storage, zero-initialised. Move-only.
class host_tensor {
 public:
  host_tensor() = default;
  host_tensor(dtype type, tensor_shape shape) : shape_(shape), type_(type) {
    std::size_t n = detail::checked_nbytes(shape, type);
    std::size_t rounded = (n + 63) / 64 * 64;
    if (rounded == 0) rounded = 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw std::bad_alloc();
    data_.reset(static_cast<std::byte*>(p));
    std::memset(p, 0, rounded);
  }
  /// A stand-in that holds a dtype and a shape but no bytes (data() is null): for code that
  /// reads only the shape of a tensor whose values are gone (a backward kernel that needs an
  /// operand's shape, not its values).
  static host_tensor shape_only(dtype type, tensor_shape shape) {
    host_tensor t;
    t.type_ = type;
    t.shape_ = shape;
    return t;
  }
  /// A copy of `v`'s bytes.
  static host_tensor copy_of(const_tensor_view v) {
    if (v.data() == nullptr) return {};  // a default (empty) tensor copies as empty
    host_tensor t(v.type(), v.shape());
    if (v.nbytes()) std::memcpy(t.data(), v.data(), v.nbytes());
    return t;
  }

  std::byte* data() noexcept { return data_.get(); }
  const std::byte* data() const noexcept { return data_.get(); }
  const tensor_shape& shape() const noexcept { return shape_; }
  dtype type() const noexcept { return type_; }
  std::int64_t numel() const noexcept { return shape_.numel(); }
  std::size_t nbytes() const noexcept { return detail::checked_nbytes(shape_, type_); }

  tensor_view view() noexcept { return {data_.get(), shape_, type_}; }
  const_tensor_view view() const noexcept { return {data_.get(), shape_, type_}; }
  operator tensor_view() noexcept { return view(); }              // NOLINT(google-explicit-constructor)
  operator const_tensor_view() const noexcept { return view(); }  // NOLINT(google-explicit-constructor)

  template <class T> T* as() { return view().as<T>(); }
  template <class T> const T* as() const { return view().as<T>(); }
  template <class T> auto vector() { return view().vector<T>(); }
  template <class T> auto vector() const { return view().vector<T>(); }
  template <class T> auto matrix() { return view().matrix<T>(); }
  template <class T> auto matrix() const { return view().matrix<T>(); }

 private:
  struct free_deleter {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<std::byte[], free_deleter> data_;
  tensor_shape shape_{};
  dtype type_ = dtype::f32;
};

/// True when both hold the same dtype, shape and bytes (bit for bit; NaNs compare by bits).
inline bool bitwise_equal(const_tensor_view a, const_tensor_view b) noexcept {
  if (a.type() != b.type() || !(a.shape() == b.shape())) return false;
  return a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

namespace detail {
inline bool is_float(dtype t) noexcept { return is_floating(t); }
template <class From, class To>
inline void convert_elements(const std::byte* src, std::byte* dst, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) {
    From f;
    std::memcpy(&f, src + i * static_cast<std::int64_t>(sizeof(From)), sizeof(From));
    // half/bfloat16 widen to float exactly; doubles stay double until the final rounding.
    using W = std::conditional_t<std::is_same_v<From, double>, double, float>;
    const To t = static_cast<To>(static_cast<W>(f));
    std::memcpy(dst + i * static_cast<std::int64_t>(sizeof(To)), &t, sizeof(To));
  }
}
template <class From>
inline void convert_from(const std::byte* src, std::byte* dst, std::int64_t n, dtype to) noexcept {
  switch (to) {
    case dtype::f32: convert_elements<From, float>(src, dst, n); break;
    case dtype::f64: convert_elements<From, double>(src, dst, n); break;
    case dtype::f16: convert_elements<From, Eigen::half>(src, dst, n); break;
    case dtype::bf16: convert_elements<From, Eigen::bfloat16>(src, dst, n); break;
    default: break;
  }
}
}  // namespace detail

/// Converts `n` elements between float dtypes (f32, f64, f16, bf16) into `dst`; the same
/// dtype is a plain copy. Rounding is to nearest even (what torch's .to() does).
inline void convert_into(const std::byte* src, dtype from, std::byte* dst, dtype to, std::int64_t n) {
  if (from == to) {
    if (n) std::memcpy(dst, src, static_cast<std::size_t>(n) * dtype_size(from));
    return;
  }
  if (!detail::is_float(from) || !detail::is_float(to))
    throw error("cannot convert " + std::string(to_string(from)) + " to " + std::string(to_string(to)) +
                ": only float dtypes (f32, f64, f16, bf16) convert");
  switch (from) {
    case dtype::f32: detail::convert_from<float>(src, dst, n, to); break;
    case dtype::f64: detail::convert_from<double>(src, dst, n, to); break;
    case dtype::f16: detail::convert_from<Eigen::half>(src, dst, n, to); break;
    case dtype::bf16: detail::convert_from<Eigen::bfloat16>(src, dst, n, to); break;
    default: break;
  }
}

/// A new tensor holding `v` converted to `to` (float dtypes only; same dtype copies).
inline host_tensor convert(const_tensor_view v, dtype to) {
  host_tensor out(to, v.shape());
  convert_into(v.data(), v.type(), out.data(), to, v.numel());
  return out;
}

}  // namespace autoshard

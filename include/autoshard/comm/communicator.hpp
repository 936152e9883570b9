#pragma once
/// The communicator concept every backend (Gloo here, NCCL in device/) satisfies, and
/// the element-wise reductions it needs for every dtype (f16/bf16 reduce through float).
///   static_assert(autoshard::communicator<autoshard::self_communicator>);
///   autoshard::all_reduce(comm, std::span<float>(grad), autoshard::reduce_op::sum);
/// Buffers are contiguous and typed by a dtype; counts are in elements.
#include <algorithm>    // std::max, std::min, std::copy_n
#include <bit>          // std::bit_cast
#include <concepts>     // std::convertible_to
#include <cstddef>      // std::size_t, std::byte
#include <cstdint>      // std::uint16_t, std::uint32_t
#include <cstring>      // std::memcpy
#include <limits>       // std::numeric_limits
#include <span>         // std::span
#include <string>       // std::string
#include <type_traits>  // std::is_same_v

#include "../core/dtype.hpp"      // dtype, dtype_size, f16_to_float, float_to_bf16, ...
#include "../core/error.hpp"      // comm_error
#include "../core/placement.hpp"  // reduce_op
#include "../core/typed.hpp"      // f16_t, bf16_t, dtype_of

namespace autoshard {

/// What a backend offers. Every operation is collective over the communicator's ranks,
/// blocks until done or until the backend's timeout, and throws comm_error on failure.
///   all_reduce(buf, n, t, op)            in place, n elements
///   all_gather(in, out, n, t)            n per rank in, size()*n out, rank order
///   reduce_scatter(in, out, n, t, op)    size()*n in, n out (block rank() of the reduction)
///   all_to_all(in, out, n, t)            block j of `in` goes to rank j; block i of `out` came from rank i
///   broadcast(buf, n, t, root)           root's buffer to every rank
///   barrier()
template <class C>
concept communicator = requires(C& c, const C& cc, void* p, const void* q, std::size_t n, dtype t,
                                reduce_op op, int root) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  c.all_reduce(p, n, t, op);
  c.all_gather(q, p, n, t);
  c.reduce_scatter(q, p, n, t, op);
  c.all_to_all(q, p, n, t);
  c.broadcast(p, n, t, root);
  c.barrier();
};

/// A communicator that also moves data point to point (a pipeline's stage-to-stage transfers):
///   send(buf, n, t, peer)   n elements to rank `peer`; returns at once (the bytes are copied),
///                           the transfer completes in the background
///   recv(buf, n, t, peer)   n elements from rank `peer`; blocks until they are here
///   wait_sends()            blocks until every send so far was delivered
/// Messages from one rank to another arrive in the order they were sent; sizes must agree.
template <class C>
concept point_to_point_communicator =
    communicator<C> && requires(C& c, void* p, const void* q, std::size_t n, dtype t, int peer) {
      c.send(q, n, t, peer);
      c.recv(p, n, t, peer);
      c.wait_sends();
    };

// The half-precision conversions (f16_to_float, float_to_f16, bf16_to_float, float_to_bf16)
// live in core/dtype.hpp: one set, bit-identical to Eigen's, with no Eigen in this area.

namespace detail {

template <class T, class Op>
void reduce_typed(void* out, const void* a, const void* b, std::size_t n, Op op) {
  // memcpy in and out: the buffers may be unaligned slices of a byte buffer.
  auto* o = static_cast<std::byte*>(out);
  const auto* x = static_cast<const std::byte*>(a);
  const auto* y = static_cast<const std::byte*>(b);
  for (std::size_t i = 0; i < n; ++i) {
    T u, v;
    std::memcpy(&u, x + i * sizeof(T), sizeof(T));
    std::memcpy(&v, y + i * sizeof(T), sizeof(T));
    const T r = op(u, v);
    std::memcpy(o + i * sizeof(T), &r, sizeof(T));
  }
}

template <class T>
void reduce_dispatch(void* out, const void* a, const void* b, std::size_t n, reduce_op op) {
  switch (op) {
    case reduce_op::sum: return reduce_typed<T>(out, a, b, n, [](T u, T v) { return static_cast<T>(u + v); });
    case reduce_op::max: return reduce_typed<T>(out, a, b, n, [](T u, T v) { return u < v ? v : u; });
    case reduce_op::min: return reduce_typed<T>(out, a, b, n, [](T u, T v) { return v < u ? v : u; });
  }
}

template <float (*ToF)(std::uint16_t) noexcept, std::uint16_t (*FromF)(float) noexcept>
void reduce_half(void* out, const void* a, const void* b, std::size_t n, reduce_op op) {
  auto f = [op](std::uint16_t u, std::uint16_t v) {
    const float x = ToF(u), y = ToF(v);
    switch (op) {
      case reduce_op::sum: return FromF(x + y);
      case reduce_op::max: return x < y ? v : u;
      case reduce_op::min: return y < x ? v : u;
    }
    return u;
  };
  reduce_typed<std::uint16_t>(out, a, b, n, f);
}

}  // namespace detail

/// out[i] = a[i] (op) b[i] for n elements of dtype t; out may alias a or b.
inline void reduce_elements(void* out, const void* a, const void* b, std::size_t n, dtype t, reduce_op op) {
  switch (t) {
    case dtype::f32: return detail::reduce_dispatch<float>(out, a, b, n, op);
    case dtype::f64: return detail::reduce_dispatch<double>(out, a, b, n, op);
    case dtype::i32: return detail::reduce_dispatch<std::int32_t>(out, a, b, n, op);
    case dtype::i64: return detail::reduce_dispatch<std::int64_t>(out, a, b, n, op);
    case dtype::u8: return detail::reduce_dispatch<std::uint8_t>(out, a, b, n, op);
    case dtype::boolean:  // sum and max are "or", min is "and"
      return detail::reduce_typed<std::uint8_t>(out, a, b, n, [op](std::uint8_t u, std::uint8_t v) {
        return static_cast<std::uint8_t>(op == reduce_op::min ? (u && v) : (u || v));
      });
    case dtype::f16: return detail::reduce_half<f16_to_float, float_to_f16>(out, a, b, n, op);
    case dtype::bf16: return detail::reduce_half<bf16_to_float, float_to_bf16>(out, a, b, n, op);
  }
}

/// Fills n elements with the identity of `op` (0 for sum, lowest for max, highest for min):
/// what the non-owning ranks of a Partial hold.
inline void fill_identity(void* out, std::size_t n, dtype t, reduce_op op) {
  auto fill = [&](auto v) {
    auto* o = static_cast<std::byte*>(out);
    for (std::size_t i = 0; i < n; ++i) std::memcpy(o + i * sizeof(v), &v, sizeof(v));
  };
  auto pick = [op](auto zero, auto lo, auto hi) { return op == reduce_op::sum ? zero : op == reduce_op::max ? lo : hi; };
  switch (t) {
    case dtype::f32:
      return fill(pick(0.0f, -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity()));
    case dtype::f64:
      return fill(pick(0.0, -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()));
    case dtype::i32:
      return fill(pick(std::int32_t{0}, std::numeric_limits<std::int32_t>::lowest(),
                       std::numeric_limits<std::int32_t>::max()));
    case dtype::i64:
      return fill(pick(std::int64_t{0}, std::numeric_limits<std::int64_t>::lowest(),
                       std::numeric_limits<std::int64_t>::max()));
    case dtype::u8: return fill(pick(std::uint8_t{0}, std::uint8_t{0}, std::uint8_t{255}));
    case dtype::boolean: return fill(pick(std::uint8_t{0}, std::uint8_t{0}, std::uint8_t{1}));
    case dtype::f16:
      return fill(pick(std::uint16_t{0}, std::uint16_t{0xfc00u}, std::uint16_t{0x7c00u}));
    case dtype::bf16:
      return fill(pick(std::uint16_t{0}, std::uint16_t{0xff80u}, std::uint16_t{0x7f80u}));
  }
}

/// The trivial communicator of one rank: every collective is a copy. Handy for
/// single-rank reference runs of code written against the concept.
class self_communicator {
 public:
  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }
  void all_reduce(void*, std::size_t, dtype, reduce_op) {}
  void all_gather(const void* in, void* out, std::size_t n, dtype t) { copy(in, out, n, t); }
  void reduce_scatter(const void* in, void* out, std::size_t n, dtype t, reduce_op) { copy(in, out, n, t); }
  void all_to_all(const void* in, void* out, std::size_t n, dtype t) { copy(in, out, n, t); }
  void broadcast(void*, std::size_t, dtype, int root) {
    if (root != 0) throw comm_error("rank 0: broadcast from root " + std::to_string(root) + " in a group of 1");
  }
  void barrier() {}

 private:
  static void copy(const void* in, void* out, std::size_t n, dtype t) {
    if (n != 0 && in != out) std::memmove(out, in, n * dtype_size(t));
  }
};

// ---- typed conveniences over any communicator ----

/// In-place all-reduce of a typed span.
template <communicator C, element_type T>
void all_reduce(C& c, std::span<T> buf, reduce_op op = reduce_op::sum) {
  c.all_reduce(buf.data(), buf.size(), dtype_of<T>(), op);
}

/// Gathers `in` from every rank into `out` (size() * in.size() elements, rank order).
template <communicator C, element_type T>
void all_gather(C& c, std::span<const T> in, std::span<T> out) {
  if (out.size() != in.size() * static_cast<std::size_t>(c.size()))
    throw comm_error("rank " + std::to_string(c.rank()) + ": all-gather output holds " +
                     std::to_string(out.size()) + " elements, needs " +
                     std::to_string(in.size() * static_cast<std::size_t>(c.size())));
  c.all_gather(in.data(), out.data(), in.size(), dtype_of<T>());
}

/// Reduces `in` (size() blocks) over the ranks; rank r receives block r in `out`.
template <communicator C, element_type T>
void reduce_scatter(C& c, std::span<const T> in, std::span<T> out, reduce_op op = reduce_op::sum) {
  if (in.size() != out.size() * static_cast<std::size_t>(c.size()))
    throw comm_error("rank " + std::to_string(c.rank()) + ": reduce-scatter input holds " +
                     std::to_string(in.size()) + " elements, needs " +
                     std::to_string(out.size() * static_cast<std::size_t>(c.size())));
  c.reduce_scatter(in.data(), out.data(), out.size(), dtype_of<T>(), op);
}

/// Block j of `in` goes to rank j; block i of `out` comes from rank i.
template <communicator C, element_type T>
void all_to_all(C& c, std::span<const T> in, std::span<T> out) {
  if (in.size() != out.size() || in.size() % static_cast<std::size_t>(c.size()) != 0)
    throw comm_error("rank " + std::to_string(c.rank()) + ": all-to-all buffers of " + std::to_string(in.size()) +
                     " and " + std::to_string(out.size()) + " elements do not split into " +
                     std::to_string(c.size()) + " equal blocks");
  c.all_to_all(in.data(), out.data(), in.size() / static_cast<std::size_t>(c.size()), dtype_of<T>());
}

/// Root's `buf` to every rank.
template <communicator C, element_type T>
void broadcast(C& c, std::span<T> buf, int root = 0) {
  c.broadcast(buf.data(), buf.size(), dtype_of<T>(), root);
}

static_assert(communicator<self_communicator>);

}  // namespace autoshard

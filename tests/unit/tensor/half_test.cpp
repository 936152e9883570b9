// The core's half-precision conversions (core/dtype.hpp, used by the Eigen-free comm area)
// against Eigen's own, bit for bit: every 16-bit pattern, and every rounding boundary.
#include <doctest/doctest.h>

#include <autoshard/core/dtype.hpp>

#include <Eigen/Core>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

namespace {

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }
std::uint16_t eigen_f16(float f) { return Eigen::numext::bit_cast<std::uint16_t>(Eigen::half(f)); }
std::uint16_t eigen_bf16(float f) { return Eigen::numext::bit_cast<std::uint16_t>(Eigen::bfloat16(f)); }
float eigen_from_f16(std::uint16_t h) { return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(h)); }
float eigen_from_bf16(std::uint16_t h) { return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(h)); }

/// The floats around one 16-bit value's neighbourhood: itself, its float neighbours, and the
/// midpoints to the next 16-bit value (exact ties) with their float neighbours.
template <class F>
void around(float x, float next, F&& check) {
  for (float y : {x, std::nextafter(x, INFINITY), std::nextafter(x, -INFINITY)}) check(y);
  if (std::isfinite(x) && std::isfinite(next)) {
    const float mid = x + (next - x) / 2;  // exact: one more mantissa bit than a 16-bit float has
    for (float y : {mid, std::nextafter(mid, INFINITY), std::nextafter(mid, -INFINITY)}) check(y);
  }
}

}  // namespace

TEST_CASE("half precision: f16 conversions are Eigen's, bit for bit") {
  int checked = 0;
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto h16 = static_cast<std::uint16_t>(h);
    const float mine = autoshard::f16_to_float(h16), eig = eigen_from_f16(h16);
    CAPTURE(h);
    REQUIRE(bits(mine) == bits(eig));
    const float next = autoshard::f16_to_float(static_cast<std::uint16_t>((h & 0x7fffu) == 0x7bffu ? h : h + 1));
    around(mine, next, [&](float y) {
      CAPTURE(bits(y));
      REQUIRE(autoshard::float_to_f16(y) == eigen_f16(y));
      ++checked;
    });
  }
  // Overflow, the largest finite, NaN payloads of both signs, random floats.
  for (float y : {65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e30f, -1e30f, INFINITY, -INFINITY,
                  std::bit_cast<float>(0x7f800001u), std::bit_cast<float>(0xffc00123u), 5.96e-8f, 2.98e-8f, 2.99e-8f})
    CHECK(autoshard::float_to_f16(y) == eigen_f16(y));
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const float y = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    REQUIRE(autoshard::float_to_f16(y) == eigen_f16(y));
  }
  CHECK(checked > 6 * 60000);
}

TEST_CASE("half precision: bf16 conversions are Eigen's, bit for bit") {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto h16 = static_cast<std::uint16_t>(h);
    const float mine = autoshard::bf16_to_float(h16), eig = eigen_from_bf16(h16);
    CAPTURE(h);
    REQUIRE(bits(mine) == bits(eig));
    const float next = autoshard::bf16_to_float(static_cast<std::uint16_t>((h & 0x7fffu) == 0x7f7fu ? h : h + 1));
    around(mine, next, [&](float y) {
      CAPTURE(bits(y));
      REQUIRE(autoshard::float_to_bf16(y) == eigen_bf16(y));
    });
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 200000; ++i) {
    const float y = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    REQUIRE(autoshard::float_to_bf16(y) == eigen_bf16(y));
  }
}

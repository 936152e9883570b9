#pragma once
/// ONNX's elementwise operators as functions of one element of each operand: one table for
/// the importer's evaluation of constants and the kernels of imported elementwise vertices.
///   const autoshard::elementwise_fn f = autoshard::onnx_elementwise_function("LessOrEqual", 2);
///   const double x[] = {3, 5};
///   f(x, 2);  // 1: 3 <= 5
#include <algorithm>    // std::max_element, std::min_element, std::min, std::max
#include <cmath>        // std::sin, std::exp, std::nearbyint, ...
#include <cstddef>      // std::size_t
#include <numeric>      // std::accumulate
#include <string_view>  // std::string_view
#include <utility>      // std::pair

namespace autoshard {

/// An elementwise function over one element of each operand, as doubles.
using elementwise_fn = double (*)(const double* x, std::size_t n);

/// The element function of ONNX's elementwise operator `op_type` over `n` operands: what
/// an imported opaque vertex runs (exec/kernels.hpp) and what the importer evaluates of values
/// computed from constants (onnx/constants.hpp). Null for an operator whose result needs an
/// attribute (Elu's alpha, IsInf's signs, Mod's fmod), for Clip with one bound (which one is
/// unknown), and for the Bitwise operators (their results depend on the element width). The
/// caller gives the result its type: a boolean is nonzero, an integer truncated toward 0.
inline elementwise_fn onnx_elementwise_function(std::string_view t, std::size_t n) {
  using table = std::pair<std::string_view, elementwise_fn>;
  static constexpr table unary[] = {
      {"Abs", [](const double* x, std::size_t) { return std::abs(x[0]); }},
      {"Neg", [](const double* x, std::size_t) { return -x[0]; }},
      {"Sin", [](const double* x, std::size_t) { return std::sin(x[0]); }},
      {"Cos", [](const double* x, std::size_t) { return std::cos(x[0]); }},
      {"Tan", [](const double* x, std::size_t) { return std::tan(x[0]); }},
      {"Asin", [](const double* x, std::size_t) { return std::asin(x[0]); }},
      {"Acos", [](const double* x, std::size_t) { return std::acos(x[0]); }},
      {"Atan", [](const double* x, std::size_t) { return std::atan(x[0]); }},
      {"Sinh", [](const double* x, std::size_t) { return std::sinh(x[0]); }},
      {"Cosh", [](const double* x, std::size_t) { return std::cosh(x[0]); }},
      {"Asinh", [](const double* x, std::size_t) { return std::asinh(x[0]); }},
      {"Acosh", [](const double* x, std::size_t) { return std::acosh(x[0]); }},
      {"Atanh", [](const double* x, std::size_t) { return std::atanh(x[0]); }},
      {"Sqrt", [](const double* x, std::size_t) { return std::sqrt(x[0]); }},
      {"Reciprocal", [](const double* x, std::size_t) { return 1.0 / x[0]; }},
      {"Log", [](const double* x, std::size_t) { return std::log(x[0]); }},
      {"Erf", [](const double* x, std::size_t) { return std::erf(x[0]); }},
      {"Floor", [](const double* x, std::size_t) { return std::floor(x[0]); }},
      {"Ceil", [](const double* x, std::size_t) { return std::ceil(x[0]); }},
      {"Round", [](const double* x, std::size_t) { return std::nearbyint(x[0]); }},  // half to even
      {"Sign", [](const double* x, std::size_t) { return x[0] > 0 ? 1.0 : x[0] < 0 ? -1.0 : 0.0; }},
      {"Sigmoid", [](const double* x, std::size_t) { return 1.0 / (1.0 + std::exp(-x[0])); }},
      {"Softplus", [](const double* x, std::size_t) { return std::log1p(std::exp(x[0])); }},
      {"Softsign", [](const double* x, std::size_t) { return x[0] / (1.0 + std::abs(x[0])); }},
      {"Mish", [](const double* x, std::size_t) { return x[0] * std::tanh(std::log1p(std::exp(x[0]))); }},
      {"HardSwish", [](const double* x, std::size_t) { return x[0] * std::max(0.0, std::min(1.0, x[0] / 6.0 + 0.5)); }},
      {"IsNaN", [](const double* x, std::size_t) { return std::isnan(x[0]) ? 1.0 : 0.0; }},
      {"Not", [](const double* x, std::size_t) { return x[0] == 0.0 ? 1.0 : 0.0; }},
      {"Cast", [](const double* x, std::size_t) { return x[0]; }},  // to the vertex's type
  };
  static constexpr table binary[] = {
      {"Add", [](const double* x, std::size_t) { return x[0] + x[1]; }},
      {"Sub", [](const double* x, std::size_t) { return x[0] - x[1]; }},
      {"Mul", [](const double* x, std::size_t) { return x[0] * x[1]; }},
      {"Div", [](const double* x, std::size_t) { return x[0] / x[1]; }},
      {"Pow", [](const double* x, std::size_t) { return std::pow(x[0], x[1]); }},
      {"Equal", [](const double* x, std::size_t) { return x[0] == x[1] ? 1.0 : 0.0; }},
      {"Less", [](const double* x, std::size_t) { return x[0] < x[1] ? 1.0 : 0.0; }},
      {"LessOrEqual", [](const double* x, std::size_t) { return x[0] <= x[1] ? 1.0 : 0.0; }},
      {"Greater", [](const double* x, std::size_t) { return x[0] > x[1] ? 1.0 : 0.0; }},
      {"GreaterOrEqual", [](const double* x, std::size_t) { return x[0] >= x[1] ? 1.0 : 0.0; }},
      {"And", [](const double* x, std::size_t) { return x[0] != 0.0 && x[1] != 0.0 ? 1.0 : 0.0; }},
      {"Or", [](const double* x, std::size_t) { return x[0] != 0.0 || x[1] != 0.0 ? 1.0 : 0.0; }},
      {"Xor", [](const double* x, std::size_t) { return (x[0] != 0.0) != (x[1] != 0.0) ? 1.0 : 0.0; }},
  };
  static constexpr table variadic[] = {  // one operand or more
      {"Max", [](const double* x, std::size_t n) { return *std::max_element(x, x + n); }},
      {"Min", [](const double* x, std::size_t n) { return *std::min_element(x, x + n); }},
      {"Sum", [](const double* x, std::size_t n) { return std::accumulate(x, x + n, 0.0); }},
      {"Mean", [](const double* x, std::size_t n) { return std::accumulate(x, x + n, 0.0) / static_cast<double>(n); }},
  };
  const auto find = [&](const auto& tab) -> elementwise_fn {
    for (const table& e : tab)
      if (e.first == t) return e.second;
    return nullptr;
  };
  if (n == 1)
    if (elementwise_fn f = find(unary)) return f;
  if (n == 2)
    if (elementwise_fn f = find(binary)) return f;
  if (n >= 1)
    if (elementwise_fn f = find(variadic)) return f;
  if (t == "Where" && n == 3) return [](const double* x, std::size_t) { return x[0] != 0.0 ? x[1] : x[2]; };
  if (t == "Clip" && n == 1) return [](const double* x, std::size_t) { return x[0]; };
  if (t == "Clip" && n == 3) return [](const double* x, std::size_t) { return std::min(std::max(x[0], x[1]), x[2]); };
  return nullptr;
}

}  // namespace autoshard

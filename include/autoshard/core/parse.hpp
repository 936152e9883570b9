#pragma once
/// Parsing and printing specs in both notations:
///   DTensor style, one placement per mesh axis: "[S(0), R]", "[Shard(1), Partial(max)]", "[R,P]",
///   and the way PyTorch prints placements: "(Replicate(), Shard(dim=1))", "(Shard(dim=0),)",
///   "[Shard(-1), Partial(sum)]", "Partial('max')". A negative Shard dim counts from the end
///   and is resolved while parsing, so it needs the tensor's rank (`tensor_rank`).
///   Alpa style, one token per tensor dim naming the mesh axes that split it: "S0R", "S01R", "RS1";
///   Partial axes follow as "P<axes>" (sum), "Pmax<axes>", "Pmin<axes>": "RRP0".
/// The same constexpr parser checks a literal at compile time and throws spec_error at run time:
///   constexpr auto s = "S0R"_spec;                       // compile-time checked
///   auto t = autoshard::parse_spec(user_text, 2, 2);     // throws autoshard::spec_error
#include <algorithm>    // std::min
#include <cstddef>      // std::size_t
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "error.hpp"  // spec_error
#include "spec.hpp"   // sharding_spec

namespace autoshard {

namespace bad_spec {
/// The spec as a message quotes it: whole up to 80 characters, else the 60 around `pos`, "..."
/// where cut, and its length (a 10 MB spec string in a plan file was quoted whole, twice: a
/// 20 MB message); escaped as quoted_text escapes (a control byte as \xHH).
inline std::string quote(std::string_view text, std::size_t pos) {
  constexpr std::size_t whole = 80, window = 60;
  if (text.size() <= whole) return quoted_text(text, whole);
  std::size_t from = std::min(pos > window / 2 ? pos - window / 2 : 0, text.size() - window), to = from + window;
  const auto inside = [&](std::size_t i) { return i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80; };
  while (from > 0 && inside(from)) --from;  // whole characters at both ends of the window
  while (inside(to)) ++to;
  std::string out = from > 0 ? "'..." : "'";
  detail::append_escaped(out, text, from, to);
  return out + (to < text.size() ? "..." : "") + "' (" + std::to_string(text.size()) + " characters)";
}
// Not constexpr on purpose: at compile time the compiler prints the function's name.
[[noreturn]] inline void fail(std::string_view text, std::size_t pos, const std::string& why) {
  throw spec_error(quote(text, pos) + " at position " + std::to_string(pos) + ": " + why);
}
[[noreturn]] inline void empty_spec(std::string_view text, std::size_t pos) {
  fail(text, pos, "the spec is empty");
}
[[noreturn]] inline void unexpected_character(std::string_view text, std::size_t pos) {
  if (pos >= text.size()) fail(text, pos, "unexpected end of the spec");
  fail(text, pos, "unexpected character " + quoted_char_at(text, pos));  // whole, not half of a UTF-8 one
}
[[noreturn]] inline void too_many_placements(std::string_view text, std::size_t pos) {
  fail(text, pos, "more than 4 placements (a mesh has at most 4 axes)");
}
[[noreturn]] inline void too_many_tensor_dims(std::string_view text, std::size_t pos) {
  fail(text, pos, "more than 8 tensor dims (a tensor has at most 8)");
}
[[noreturn]] inline void expected_closing_bracket(std::string_view text, std::size_t pos) {
  fail(text, pos, "expected ']' or ','");
}
[[noreturn]] inline void mesh_axis_used_twice(std::string_view text, std::size_t pos, int axis) {
  fail(text, pos, "mesh axis " + std::to_string(axis) + " used twice");
}
[[noreturn]] inline void mesh_axis_outside_mesh(std::string_view text, std::size_t pos, int axis, int mesh_rank) {
  fail(text, pos, "mesh axis " + std::to_string(axis) + " is outside a mesh of " +
                      std::to_string(mesh_rank) + " axes");
}
[[noreturn]] inline void mesh_axes_out_of_order(std::string_view text, std::size_t pos) {
  fail(text, pos, "mesh axes splitting one tensor dim must be listed outer first (S01, not S10)");
}
[[noreturn]] inline void shard_dim_outside_tensor(std::string_view text, std::size_t pos, int dim, int rank) {
  fail(text, pos, "Shard(" + std::to_string(dim) + ") is outside a tensor of rank " + std::to_string(rank));
}
[[noreturn]] inline void wrong_number_of_mesh_axes(std::string_view text, std::size_t got, int want) {
  fail(text, 0, "has " + std::to_string(got) + " placements but the mesh has " + std::to_string(want) + " axes");
}
[[noreturn]] inline void wrong_tensor_rank(std::string_view text, std::size_t got, int want) {
  fail(text, 0, "describes " + std::to_string(got) + " tensor dims but the tensor has rank " +
                    std::to_string(want));
}
[[noreturn]] inline void a_mesh_has_at_least_one_axis() {
  throw spec_error("a spec needs a mesh of at least one axis (mesh rank 0 was asked for)");
}
[[noreturn]] inline void number_too_large(std::string_view text, std::size_t pos) {
  fail(text, pos, "number too large");
}
[[noreturn]] inline void negative_shard_dim_needs_tensor_rank(std::string_view text, std::size_t pos, int dim) {
  fail(text, pos, "Shard(" + std::to_string(dim) +
                      ") counts from the end of the tensor's dims, so it needs the tensor's rank, which is not "
                      "known here (give the rank, or write the dim as a non-negative number)");
}
[[noreturn]] inline void negative_shard_dim_outside_tensor(std::string_view text, std::size_t pos, int dim, int rank) {
  fail(text, pos, "Shard(" + std::to_string(dim) + ") counts from the end but the tensor has rank " +
                      std::to_string(rank) + " (dims -1 to -" + std::to_string(rank) + ")");
}
[[noreturn]] inline void reduce_op_not_supported(std::string_view text, std::size_t pos) {
  std::size_t e = pos;
  while (e < text.size() && ((text[e] >= 'a' && text[e] <= 'z') || (text[e] >= 'A' && text[e] <= 'Z') || text[e] == '_')) ++e;
  fail(text, pos, "Partial(" + std::string(text.substr(pos, e - pos)) +
                      ") is not supported: the supported reduce ops are sum, max and min (PyTorch's avg and "
                      "product have no counterpart here)");
}
[[noreturn]] inline void unmatched_bracket(std::string_view text, std::size_t pos, char want) {
  fail(text, pos, std::string("expected '") + want + "' to close the list of placements");
}
[[noreturn]] inline void bare_placement(std::string_view text, std::size_t pos) {
  fail(text, pos,
       "a bare placement is not a spec: list one placement per mesh axis in brackets, DTensor style "
       "([S(0)], [Shard(0), Replicate()] or PyTorch's tuple (Shard(dim=0),)), or write Alpa's notation, one "
       "token per tensor dim (S0R)");
}
[[noreturn]] inline void strided_shard_not_supported(std::string_view text, std::size_t pos) {
  fail(text, pos, "_StridedShard (PyTorch's internal placement for FSDP + TP) is not supported: write the "
                  "nesting as [S(d),S(d)], outer mesh axis first");
}
}  // namespace bad_spec

namespace detail {

struct spec_lexer {
  std::string_view s;
  std::size_t i = 0;
  constexpr void skip_ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  }
  constexpr bool eat(std::string_view word) {
    if (s.substr(i, word.size()) == word) {
      i += word.size();
      return true;
    }
    return false;
  }
  constexpr bool at_digit() const { return i < s.size() && s[i] >= '0' && s[i] <= '9'; }
  constexpr bool at(char c) const { return i < s.size() && s[i] == c; }
  constexpr int number() {
    if (!at_digit()) bad_spec::unexpected_character(s, i);
    int v = 0;
    while (at_digit()) {
      v = v * 10 + (s[i++] - '0');
      if (v > 64) bad_spec::number_too_large(s, i);
    }
    return v;
  }
};

constexpr bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/// sum, max, min; optionally quoted ('max', "max") as PyTorch's Partial takes a string.
constexpr reduce_op parse_reduce(spec_lexer& lx) {
  char quote = 0;
  if (lx.at('\'') || lx.at('"')) quote = lx.s[lx.i++];
  const std::size_t pos = lx.i;
  reduce_op op = reduce_op::sum;
  if (lx.eat("sum")) op = reduce_op::sum;
  else if (lx.eat("max")) op = reduce_op::max;
  else if (lx.eat("min")) op = reduce_op::min;
  else if (lx.i < lx.s.size() && is_word_char(lx.s[lx.i])) bad_spec::reduce_op_not_supported(lx.s, pos);
  else bad_spec::unexpected_character(lx.s, lx.i);
  if (lx.i < lx.s.size() && is_word_char(lx.s[lx.i])) bad_spec::reduce_op_not_supported(lx.s, pos);  // "maximum"
  if (quote != 0 && !lx.eat(std::string_view(&quote, 1))) bad_spec::unexpected_character(lx.s, lx.i);
  return op;
}

/// One placement. A negative Shard dim counts from the end (PyTorch's Shard(-1)); it is
/// resolved here against `tensor_rank`, so it needs one (>= 0).
constexpr placement parse_placement(spec_lexer& lx, int tensor_rank) {
  lx.skip_ws();
  if (lx.s.substr(lx.i).starts_with("_StridedShard") || lx.s.substr(lx.i).starts_with("_S("))
    bad_spec::strided_shard_not_supported(lx.s, lx.i);
  if (lx.eat("Replicate()") || lx.eat("Replicate") || lx.eat("R")) return Replicate();
  if (lx.eat("Shard(") || lx.eat("S(")) {
    lx.skip_ws();
    if (lx.eat("dim")) {  // PyTorch's repr: Shard(dim=1)
      lx.skip_ws();
      if (!lx.eat("=")) bad_spec::unexpected_character(lx.s, lx.i);
      lx.skip_ws();
    }
    const std::size_t pos = lx.i;
    const bool negative = lx.eat("-");
    int d = lx.number();
    lx.skip_ws();
    if (!lx.eat(")")) bad_spec::unexpected_character(lx.s, lx.i);
    if (negative) {
      if (tensor_rank < 0) bad_spec::negative_shard_dim_needs_tensor_rank(lx.s, pos, -d);
      if (d == 0 || d > tensor_rank) bad_spec::negative_shard_dim_outside_tensor(lx.s, pos, -d, tensor_rank);
      d = tensor_rank - d;
    }
    return Shard(d);
  }
  if (lx.eat("Partial") || lx.eat("P")) {
    if (!lx.eat("(")) return Partial();
    lx.skip_ws();
    if (lx.eat(")")) return Partial();
    if (lx.eat("reduce_op")) {  // Partial(reduce_op="max"), as the constructor is called
      lx.skip_ws();
      if (!lx.eat("=")) bad_spec::unexpected_character(lx.s, lx.i);
      lx.skip_ws();
    }
    reduce_op op = parse_reduce(lx);
    lx.skip_ws();
    if (!lx.eat(")")) bad_spec::unexpected_character(lx.s, lx.i);
    return Partial(op);
  }
  bad_spec::unexpected_character(lx.s, lx.i);
}

constexpr sharding_spec parse_dtensor(std::string_view text, int mesh_rank, int tensor_rank) {
  spec_lexer lx{text, 0};
  lx.skip_ws();
  // "[...]" (a list) or "(...)" (the tuple PyTorch prints, "(Shard(dim=0),)" for one axis).
  char close = ']';
  if (lx.eat("(")) close = ')';
  else lx.eat("[");
  sharding_spec s;
  lx.skip_ws();
  if (lx.at(close)) bad_spec::empty_spec(text, lx.i);
  int max_dim = -1;
  for (;;) {
    lx.skip_ws();
    std::size_t pos = lx.i;
    if (s.mesh_rank > 0 && lx.at(close)) {  // a trailing comma: Python's (Shard(dim=0),)
      ++lx.i;
      break;
    }
    if (s.mesh_rank == max_mesh_rank) bad_spec::too_many_placements(text, pos);
    placement p = parse_placement(lx, tensor_rank);
    if (p.is_shard()) {
      if (tensor_rank >= 0 && p.dim >= tensor_rank) bad_spec::shard_dim_outside_tensor(text, pos, p.dim, tensor_rank);
      if (p.dim >= static_cast<int>(max_tensor_rank)) bad_spec::shard_dim_outside_tensor(text, pos, p.dim, max_tensor_rank);
      if (p.dim > max_dim) max_dim = p.dim;
    }
    s.placements[s.mesh_rank++] = p;
    lx.skip_ws();
    if (lx.eat(",")) continue;
    if (lx.at(close)) {
      ++lx.i;
      break;
    }
    if (lx.at(']') || lx.at(')') || close == ')') bad_spec::unmatched_bracket(text, lx.i, close);
    bad_spec::expected_closing_bracket(text, lx.i);
  }
  lx.skip_ws();
  if (lx.i != text.size()) bad_spec::unexpected_character(text, lx.i);
  if (mesh_rank >= 0 && s.mesh_rank != mesh_rank) bad_spec::wrong_number_of_mesh_axes(text, s.mesh_rank, mesh_rank);
  s.tensor_rank = static_cast<std::uint8_t>(tensor_rank >= 0 ? tensor_rank : max_dim + 1);
  return s;
}

constexpr sharding_spec parse_alpa(std::string_view text, int mesh_rank, int tensor_rank) {
  spec_lexer lx{text, 0};
  sharding_spec s;
  bool used[max_mesh_rank] = {};
  int max_axis = -1;
  int dims = 0;
  auto take_axis = [&](int dim_or_partial, reduce_op op, int prev) constexpr -> int {
    std::size_t pos = lx.i;
    int axis = lx.s[lx.i] - '0';
    ++lx.i;
    if (axis >= static_cast<int>(max_mesh_rank) || (mesh_rank >= 0 && axis >= mesh_rank))
      bad_spec::mesh_axis_outside_mesh(text, pos, axis, mesh_rank >= 0 ? mesh_rank : static_cast<int>(max_mesh_rank));
    if (used[axis]) bad_spec::mesh_axis_used_twice(text, pos, axis);
    if (axis < prev) bad_spec::mesh_axes_out_of_order(text, pos);
    used[axis] = true;
    if (axis > max_axis) max_axis = axis;
    s.placements[static_cast<std::size_t>(axis)] = dim_or_partial >= 0 ? Shard(dim_or_partial) : Partial(op);
    return axis;
  };
  lx.skip_ws();
  if (lx.i == text.size()) bad_spec::empty_spec(text, lx.i);
  while (lx.i < text.size()) {
    char c = text[lx.i];
    if ((c == 'R' || c == 'S') && dims >= static_cast<int>(max_tensor_rank))
      bad_spec::too_many_tensor_dims(text, lx.i);
    if (c == 'R') {
      ++lx.i;
      ++dims;
    } else if (c == 'S') {
      ++lx.i;
      if (!lx.at_digit()) bad_spec::unexpected_character(text, lx.i);
      int prev = -1;
      while (lx.at_digit()) prev = take_axis(dims, reduce_op::sum, prev);
      ++dims;
    } else if (c == 'P') {
      ++lx.i;
      reduce_op op = reduce_op::sum;
      if (lx.eat("max")) op = reduce_op::max;
      else if (lx.eat("min")) op = reduce_op::min;
      else lx.eat("sum");
      if (!lx.at_digit()) bad_spec::unexpected_character(text, lx.i);
      int prev = -1;
      while (lx.at_digit()) prev = take_axis(-1, op, prev);
    } else if (c == ' ' || c == '\t') {
      lx.skip_ws();
      if (lx.i != text.size()) bad_spec::unexpected_character(text, lx.i);
    } else {
      bad_spec::unexpected_character(text, lx.i);
    }
  }
  if (tensor_rank >= 0 && dims != tensor_rank) bad_spec::wrong_tensor_rank(text, static_cast<std::size_t>(dims), tensor_rank);
  s.tensor_rank = static_cast<std::uint8_t>(dims);
  s.mesh_rank = static_cast<std::uint8_t>(mesh_rank >= 0 ? mesh_rank : max_axis + 1);
  if (s.mesh_rank == 0) s.mesh_rank = 1;
  return s;
}

}  // namespace detail

/// Parses a spec in either notation. `mesh_rank` / `tensor_rank` of -1 are inferred:
/// DTensor notation gives the mesh rank, Alpa notation the tensor rank. A negative Shard
/// dim (Shard(-1): the last dim) is resolved here and needs `tensor_rank`; it prints back
/// as the non-negative dim.
constexpr sharding_spec parse_spec(std::string_view text, int mesh_rank = -1, int tensor_rank = -1) {
  std::size_t k = 0;
  while (k < text.size() && (text[k] == ' ' || text[k] == '\t')) ++k;
  if (k == text.size()) bad_spec::empty_spec(text, k);
  if (mesh_rank == 0) bad_spec::a_mesh_has_at_least_one_axis();
  if (mesh_rank > static_cast<int>(max_mesh_rank)) bad_spec::too_many_mesh_axes(static_cast<std::size_t>(mesh_rank));
  if (tensor_rank > static_cast<int>(max_tensor_rank)) bad_spec::tensor_rank_too_large(static_cast<std::size_t>(tensor_rank));
  if (text[k] == '[' || text[k] == '(') return detail::parse_dtensor(text, mesh_rank, tensor_rank);
  const std::string_view rest = text.substr(k);
  for (std::string_view word : {"Shard", "Replicate", "Partial", "S(", "P(", "R(", "_S"})
    if (rest.starts_with(word)) bad_spec::bare_placement(text, k);
  return detail::parse_alpa(text, mesh_rank, tensor_rank);
}

/// DTensor notation: "[S(0),R]".
inline std::string to_string(const sharding_spec& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.mesh_rank; ++i) out += (i ? "," : "") + to_string(s[i]);
  return out + "]";
}

/// Alpa notation: "S0R", "S01R", "RS1", with partial axes appended as "P0" / "Pmax0".
inline std::string to_alpa_string(const sharding_spec& s) {
  std::string out;
  for (int d = 0; d < s.tensor_rank; ++d) {
    std::string axes;
    for (std::size_t i = 0; i < s.mesh_rank; ++i)
      if (s[i].is_shard(d)) axes += static_cast<char>('0' + i);
    out += axes.empty() ? std::string("R") : "S" + axes;
  }
  for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min}) {
    std::string axes;
    for (std::size_t i = 0; i < s.mesh_rank; ++i)
      if (s[i].is_partial() && s[i].op == op) axes += static_cast<char>('0' + i);
    if (!axes.empty()) out += (op == reduce_op::sum ? std::string("P") : "P" + std::string(to_string(op))) + axes;
  }
  return out;
}

inline std::ostream& operator<<(std::ostream& os, const sharding_spec& s) { return os << to_string(s); }

/// A string usable as a template argument: sharded_tensor<float, M, "S0R", 8, 4>.
template <std::size_t N>
struct fixed_string {
  char data[N]{};
  consteval fixed_string(const char (&s)[N]) {
    for (std::size_t i = 0; i < N; ++i) data[i] = s[i];
  }
  constexpr std::string_view view() const noexcept { return {data, N - 1}; }
};

/// A spec argument checked at compile time, {fmt} style: void f(spec_literal s); f("S0R");
struct spec_literal {
  sharding_spec value;
  template <std::size_t N>
  consteval spec_literal(const char (&s)[N]) : value(parse_spec(std::string_view(s, N - 1))) {}
  constexpr operator sharding_spec() const noexcept { return value; }
};

inline namespace literals {
/// "S0R"_spec, "[S(0),R]"_spec: parsed and checked at compile time.
template <fixed_string S>
consteval sharding_spec operator""_spec() {
  return parse_spec(S.view());
}
}  // namespace literals

}  // namespace autoshard

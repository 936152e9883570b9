#pragma once
/// autoshard's one exception hierarchy. Every message names the tensor, the dimension
/// and the numbers involved, e.g.
///   throw shape_error("tensor 'wte': dim 0 of size 50257 does not divide over 4 ranks");
/// what() is "<kind> error: <message>" ("shape error: tensor 'wte': ..."); the program name
/// is not part of it: the `autoshard` tool prints "autoshard: " before it, and a message
/// nested in another ("plan file 'p.json': its graph is invalid: graph error: ...") reads
/// without it.
#include <stdexcept>  // std::runtime_error
#include <algorithm>  // std::min
#include <cstddef>    // std::size_t
#include <cstdio>     // std::snprintf
#include <string>     // std::string
#include <string_view>  // std::string_view
#include <type_traits>  // std::is_integral_v

namespace autoshard {

/// Base of every error autoshard throws.
class error : public std::runtime_error {
 public:
  explicit error(const std::string& what) : std::runtime_error(what) {}
  /// what() without its "<kind> error: " label, to nest one message in another of a
  /// different kind: graph_error("vertex 'fc': " + std::string(e.message())).
  std::string_view message() const noexcept { return std::string_view(what()).substr(label_); }

 protected:
  error(std::string_view label, const std::string& what)
      : std::runtime_error(std::string(label) + what), label_(label.size()) {}

 private:
  std::size_t label_ = 0;
};

/// A sharding spec that does not parse or does not fit its mesh or tensor.
class spec_error : public error {
 public:
  explicit spec_error(const std::string& what) : error("spec error: ", what) {}
};

/// A shape that does not fit: a rank mismatch, a size that does not divide.
class shape_error : public error {
 public:
  explicit shape_error(const std::string& what) : error("shape error: ", what) {}
};

/// The model graph is not valid: a cycle, an unknown operator, a missing operand.
class graph_error : public error {
 public:
  explicit graph_error(const std::string& what) : error("graph error: ", what) {}
};

/// The auto-sharding ILP failed: infeasible, time-out without incumbent, bad plan file.
class solver_error : public error {
 public:
  explicit solver_error(const std::string& what) : error("solver error: ", what) {}
  /// No answer was found, but none was proven not to exist (the search ran out of time).
  static solver_error none_found(const std::string& what) {
    solver_error e(what);
    e.unproven_ = true;
    return e;
  }
  /// No answer was found, and none cheaper than the solve's cutoff exists (solve_options::cutoff).
  static solver_error cut_off(const std::string& what) {
    solver_error e(what);
    e.cut_off_ = true;
    return e;
  }
  /// Whether this says only that no answer was found (none_found), not that none exists.
  bool unproven() const noexcept { return unproven_; }
  /// Whether this says that no answer cheaper than the cutoff exists (cut_off).
  bool beyond_cutoff() const noexcept { return cut_off_; }

 private:
  bool unproven_ = false;
  bool cut_off_ = false;
};

/// A file could not be read or written, or its contents are malformed.
class io_error : public error {
 public:
  explicit io_error(const std::string& what) : error("io error: ", what) {}
};

/// A collective failed: a peer died, timed out, or sent a mismatched size.
class comm_error : public error {
 public:
  explicit comm_error(const std::string& what) : error("comm error: ", what) {}
};

/// A CUDA or NCCL call failed, or no device is present.
class device_error : public error {
 public:
  explicit device_error(const std::string& what) : error("device error: ", what) {}
};

/// A failure while executing a graph: a kernel given pieces it cannot use, a plan whose
/// specs do not fit the graph, values missing for a source. Names the vertex.
class exec_error : public error {
 public:
  explicit exec_error(const std::string& what) : error("execution error: ", what) {}
};

/// Work this process cannot do within what the machine gives it: an allocation that failed,
/// or an estimate made before starting above the memory, threads or address space left.
/// Names the estimate and the limit.
class resource_error : public error {
 public:
  explicit resource_error(const std::string& what) : error("resource error: ", what) {}
};

/// The length of the UTF-8 character that starts at s[i] (RFC 3629: no overlong forms, no
/// surrogates, nothing above U+10FFFF), or 0 when the bytes there are not one.
constexpr std::size_t utf8_char_length(std::string_view s, std::size_t i) noexcept {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  if (i >= s.size()) return 0;
  const unsigned char c = byte(i);
  std::size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c == 0xE0) len = 3, lo = 0xA0;
  else if (c == 0xED) len = 3, hi = 0x9F;
  else if (c >= 0xE1 && c <= 0xEF) len = 3;
  else if (c == 0xF0) len = 4, lo = 0x90;
  else if (c == 0xF4) len = 4, hi = 0x8F;
  else if (c >= 0xF1 && c <= 0xF3) len = 4;
  else return 0;
  if (i + 1 >= s.size() || byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < len; ++k)
    if (i + k >= s.size() || byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return len;
}

/// The longest quoted name, in bytes, before quoted_text() cuts it.
inline constexpr std::size_t max_quoted_bytes = 80;

namespace detail {
/// text[i, end) onto `out`, whole characters only (stopping before one that would end past
/// `end`), a byte that is not valid UTF-8 and a control character as \xHH: C0 and DEL, and
/// C1 (U+0080..U+009F, its two bytes as \xC2\xHH), which some terminals obey as ESC's short
/// forms (U+009B is CSI). Returns where it stopped. The one escaper of every message and report.
inline std::size_t append_escaped(std::string& out, std::string_view text, std::size_t i, std::size_t end) {
  while (i < end) {
    const std::size_t n = utf8_char_length(text, i);
    const auto c = static_cast<unsigned char>(text[i]);
    if (n == 0 || (n == 1 && (c < 0x20 || c == 0x7F))) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", c);
      out += hex;
      ++i;
      continue;
    }
    if (i + n > end) break;  // a character that would end past the cut: cut before it
    if (n == 2 && c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0) {  // a C1 control
      for (const unsigned char b : {c, static_cast<unsigned char>(text[i + 1])}) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\x%02X", b);
        out += hex;
      }
      i += 2;
      continue;
    }
    out.append(text.substr(i, n));
    i += n;
  }
  return i;
}
}  // namespace detail

/// Text from a file or a flag (an operator's name, an op_type, a tensor's name) as a report's
/// table prints it: escaped as quoted_text escapes (a byte that is not valid UTF-8 and a
/// control character as \xHH, so a name never recolours the terminal or starts a line of its
/// own), without quotes and never cut, so an ordinary name reads as it is and its column lines
/// up as before: escaped_text("h.0.mlp") is "h.0.mlp", escaped_text("a\x1B[31m") "a\\x1B[31m".
/// JSON output keeps the raw name (its writer escapes it).
inline std::string escaped_text(std::string_view text) {
  std::string out;
  detail::append_escaped(out, text, 0, text.size());
  return out;
}

/// The longest name from a file, in bytes, that a report prints whole (escaped_name).
inline constexpr std::size_t max_echoed_name_bytes = 256;

/// A name from a file (an operator's or a tensor's, an IOPDDL problem's or node's, an op_type)
/// as a report prints it: escaped_text, whole up to max_echoed_name_bytes (every real name is
/// far shorter), else its first max_echoed_name_bytes bytes (never half a character), "..."
/// and its length: `xxxxxxxx... (5000000 bytes)`. A problem named by 5 MB of text was echoed
/// whole, and a table padded every row to its longest name. Messages quote names with
/// quoted_text (80 bytes); JSON output keeps the raw name.
inline std::string escaped_name(std::string_view text) {
  std::string out;
  const std::size_t i = detail::append_escaped(out, text, 0, std::min(text.size(), max_echoed_name_bytes));
  if (i == text.size()) return out;
  return out + "... (" + std::to_string(text.size()) + " bytes)";
}

/// Text a user gave (a name, a flag's value, a key read from a file) as every message quotes
/// it: in single quotes, whole when it has at most `max` bytes, else its first `max` bytes
/// (never half a character), "..." and its length: `'h.0.attn.c_attn.weightxxxx...' (100000
/// bytes)`. A byte that is not part of valid UTF-8, and a control character, is written as
/// \xHH: a message never holds half a character or a terminal's escape sequence. A message
/// that quoted a 100 KB --pin name whole was 100 KB long.
inline std::string quoted_text(std::string_view text, std::size_t max = max_quoted_bytes) {
  std::string out = "'";
  const std::size_t i = detail::append_escaped(out, text, 0, std::min(text.size(), max));
  if (i == text.size()) return out + "'";
  return out + "...' (" + std::to_string(text.size()) + " bytes)";
}

/// The longest path, in bytes, that quoted_path() quotes whole (PATH_MAX): a cut path names no
/// file, so paths are kept whole far beyond quoted_text's 80 bytes.
inline constexpr std::size_t max_quoted_path_bytes = 4096;

/// A file or directory path as every message quotes it: in single quotes, escaped as
/// quoted_text escapes (a newline, an ESC or a byte that is not UTF-8 as \xHH, so a path
/// never moves the cursor or recolours the terminal), whole up to max_quoted_path_bytes;
/// a longer one keeps its start and its end (the file's name), cut in the middle between
/// characters: `'/data/run...ck/model.safetensors' (9000 bytes)`.
inline std::string quoted_path(std::string_view path, std::size_t max = max_quoted_path_bytes) {
  std::string out = "'";
  if (path.size() <= max) {
    detail::append_escaped(out, path, 0, path.size());
    return out + "'";
  }
  detail::append_escaped(out, path, 0, max / 2);
  std::size_t tail = path.size() - (max - max / 2);  // the end's first whole character
  while (tail < path.size() && (static_cast<unsigned char>(path[tail]) & 0xC0) == 0x80) ++tail;
  out += "...";
  detail::append_escaped(out, path, tail, path.size());
  return out + "' (" + std::to_string(path.size()) + " bytes)";
}

/// A count and the noun it counts, singular when the count is 1: count_noun(1, "tensor") is
/// "1 tensor", count_noun(16, "tensor") "16 tensors"; `many` for a plural not made with "s":
/// count_noun(n, "shard entry", "shard entries"). A message read "its 1 tensors".
template <class Int>
std::string count_noun(Int n, std::string_view one, std::string_view many = {}) {
  static_assert(std::is_integral_v<Int>, "count_noun() counts with an integer");
  std::string out = std::to_string(n) + " ";
  if (n == 1) return out.append(one);
  return many.empty() ? out.append(one) + "s" : out.append(many);
}

/// The character at text[pos] quoted whole (one UTF-8 character, or the byte as \xHH when
/// none starts there): what a parser's "unexpected character" names: U+0662 is quoted as
/// `'٢'`, not as the half of it that a char would hold.
inline std::string quoted_char_at(std::string_view text, std::size_t pos) {
  if (pos >= text.size()) return "the end";
  const std::size_t n = utf8_char_length(text, pos);
  return quoted_text(text.substr(pos, n == 0 ? 1 : n));
}

}  // namespace autoshard

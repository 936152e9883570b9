#pragma once
/// Checked reading of JSON files: the one place where autoshard turns untrusted JSON into
/// numbers, strings and arrays. Every getter checks the type and the range before converting
/// (nlohmann's get<int> of 1e30, or of an integer beyond 2^63 that parses as a float, is
/// undefined behaviour, not an error), and every failure is an io_error naming where it was
/// read from, the JSON path and the offending value:
///   io error: plan file 'p.json': mesh.axes[2].bandwidth_Bps is -1, not a number in [1e-300, 1e+300]
///
///   const nlohmann::json j = autoshard::load_json_file("p.json", "plan file");
///   autoshard::json_in in(j, "plan file 'p.json'");
///   const std::int64_t v = in["version"].integer(1, 1000);
///   for (std::size_t i = 0; i < in["mesh"]["axes"].size(); ++i)
///     double bw = in["mesh"]["axes"][i]["bandwidth_Bps"].number(1e-300, 1e300);
/// A reader of texts too big to hold with their tree (the IOPDDL problems, solve/iopddl.hpp)
/// streams them to a SAX handler instead (sax_parse_json_file), with the same messages.
#include <algorithm>   // std::count, std::max, std::min
#include <cerrno>      // errno
#include <cmath>       // std::isfinite
#include <cstdint>     // std::int64_t, std::uint64_t
#include <cstdio>      // std::snprintf
#include <cstring>     // std::strerror, std::memchr
#include <functional>  // std::function
#include <istream>     // std::istream
#include <limits>      // std::numeric_limits
#include <optional>    // std::optional
#include <streambuf>   // std::streambuf
#include <string>      // std::string
#include <string_view>  // std::string_view
#include <unordered_set>  // std::unordered_set
#include <utility>     // std::move
#include <vector>      // std::vector

#include <fcntl.h>     // open, O_RDONLY, O_NONBLOCK
#include <sys/stat.h>  // fstat, S_ISREG
#include <unistd.h>    // read, close

#include <nlohmann/json.hpp>  // nlohmann::json

#include "../core/dtype.hpp"      // human_bytes
#include "../core/enum_text.hpp"  // parse_enum
#include "../core/error.hpp"    // io_error, resource_error, utf8_char_length, quoted_text
#include "../core/machine.hpp"  // machine_limits

namespace autoshard {

/// The deepest nesting of arrays and objects a JSON text autoshard reads may have (serde_json's
/// default limit; real plan files, model JSON, configs and IOPDDL requests nest fewer than 10
/// levels). Every reader refuses a deeper text before parsing it (check_json_depth), so
/// nothing that walks a parsed document (nlohmann's dump() and copy are recursive) can run
/// out of stack on one: a 100,000-deep `[[[...]]]` once crashed nine readers.
inline constexpr int max_json_depth = 128;

namespace detail {
/// Appends a compact rendering of `j` to `out`, stopping soon after `out` holds more than
/// `budget` characters: every level adds a character before it descends, so the recursion is
/// at most `budget` deep whatever the document's depth (nlohmann's dump() recurses all the way).
inline void append_excerpt(const nlohmann::json& j, std::string& out, std::size_t budget) {
  if (out.size() > budget) return;
  if (j.is_array() || j.is_object()) {
    const bool object = j.is_object();
    out += object ? '{' : '[';
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (out.size() > budget) return;
      if (!first) out += ',';
      first = false;
      if (object) out += nlohmann::json(it.key()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + ":";
      append_excerpt(*it, out, budget);
    }
    out += object ? '}' : ']';
    return;
  }
  out += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // a scalar: no recursion
}
/// A JSON value as a message shows it: compact, cut after 60 characters.
inline std::string json_excerpt(const nlohmann::json& j) {
  std::string s;
  try {
    append_excerpt(j, s, 60);
  } catch (const nlohmann::json::exception&) {
    s = "(unprintable)";
  }
  if (s.size() > 60) {
    std::size_t cut = 57;  // never half a UTF-8 character: back to the start of the one cut
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
    s = s.substr(0, cut) + "...";
  }
  return s;
}
}  // namespace detail

namespace detail {
/// The offset of the first byte of `s` that is not part of valid UTF-8 (RFC 3629: no overlong
/// forms, no surrogates, nothing above U+10FFFF), or npos. It is what nlohmann's dump()
/// accepts in a string (it throws type_error 316 on anything else), so a string that passes
/// can be written as JSON; a reader of a binary format (ONNX's protobuf does not check its
/// strings) refuses a name that fails before it reaches a file autoshard writes.
inline std::size_t invalid_utf8_at(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len = utf8_char_length(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}
/// `s` for a message: each byte that is not valid UTF-8 written as \xHH, cut after about 60 bytes.
inline std::string utf8_escaped(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && out.size() < 60;) {
    const std::size_t bad = invalid_utf8_at(s.substr(i));
    const std::size_t good = bad == std::string_view::npos ? s.size() - i : bad;
    out.append(s.substr(i, good));
    i += good;
    if (i < s.size()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", static_cast<unsigned char>(s[i]));
      out += hex;
      ++i;
    }
  }
  if (out.size() > 60) {
    std::size_t cut = 57;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
    out = out.substr(0, cut) + "...";
  }
  return out;
}

/// Appends one step to a JSON path as json_in spells it: `.key` (no dot first; `""` for an empty
/// key) inside an object, `[index]` inside an array. The key is the file's: escaped as
/// quoted_text escapes (a control character as \xHH), so a path never carries an ESC or a
/// newline of the file's into a message.
inline void json_path_step(std::string& path, bool object, const std::string& key, std::size_t index) {
  if (!object) {
    path += "[" + std::to_string(index) + "]";
    return;
  }
  if (!path.empty()) path += ".";
  if (key.empty()) path += "\"\"";
  else append_escaped(path, key, 0, key.size());
}
/// The error of a text nested deeper than `max_depth` at `path` (its middle cut when long): one
/// message for check_json_depth and the readers that count depth as they stream.
inline io_error json_too_deep(const std::string& source, int max_depth, std::string path) {
  if (path.size() > 160) path = path.substr(0, 100) + "..." + path.substr(path.size() - 50);
  return io_error((source.empty() ? std::string() : source + ": ") + "nested deeper than " + std::to_string(max_depth) +
                  " levels (arrays and objects) at " + (path.empty() ? std::string("the document") : path) +
                  "; no file autoshard reads nests that deep");
}
}  // namespace detail

/// Refuses, before it is parsed, a JSON text whose arrays and objects nest deeper than
/// `max_depth`: an io_error "<source>: nested deeper than 128 levels (arrays and objects) at
/// <path>", the path as json_in writes it (`a.b[0][0]...`, its middle cut when long). One
/// linear pass over the text that follows strings and escapes, so brackets inside strings
/// do not count; a text that is not JSON is left to the parser to report.
inline void check_json_depth(std::string_view text, const std::string& source, int max_depth = max_json_depth) {
  struct frame {
    bool object = false;
    bool expect_key = false;
    std::size_t index = 0;
    std::string key;
  };
  std::vector<frame> stack;
  bool in_string = false, escape = false, capture = false;
  std::string key;
  for (const char c : text) {
    if (in_string) {
      if (escape) escape = false;
      else if (c == '\\') escape = true;
      else if (c == '"') {
        in_string = false;
        if (capture) stack.back().key = std::move(key), stack.back().expect_key = false;
        capture = false;
        continue;
      }
      if (capture && key.size() < 40) key += c;
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        capture = !stack.empty() && stack.back().object && stack.back().expect_key;
        key.clear();
        break;
      case '[':
      case '{':
        if (static_cast<int>(stack.size()) >= max_depth) {
          std::string path;
          for (const frame& f : stack) detail::json_path_step(path, f.object, f.key, f.index);
          throw detail::json_too_deep(source, max_depth, std::move(path));
        }
        stack.push_back({c == '{', c == '{', 0, {}});
        break;
      case ']':
      case '}':
        if (!stack.empty()) stack.pop_back();
        break;
      case ',':
        if (!stack.empty()) {
          if (stack.back().object) stack.back().expect_key = true;
          else ++stack.back().index;
        }
        break;
      default:
        break;
    }
  }
}

/// `j` as an int64 when it is a JSON integer that fits one; nothing for a float (3.0, 1e30),
/// an integer beyond 2^63 - 1 (nlohmann stores it unsigned) or any other type. Every integer
/// read from JSON is range-checked here or in json_in::integer, which uses it: nlohmann's
/// get<std::int64_t>() of an unsigned value above 2^63 wraps, and of a float truncates.
inline std::optional<std::int64_t> json_int64(const nlohmann::json& j) noexcept {
  if (j.is_number_unsigned()) {
    const std::uint64_t u = j.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
    return static_cast<std::int64_t>(u);
  }
  if (j.is_number_integer()) return j.get<std::int64_t>();
  return std::nullopt;
}

/// `j` as a uint64 when it is a non-negative JSON integer (up to 2^64 - 1); nothing for a
/// negative one, a float or any other type.
inline std::optional<std::uint64_t> json_uint64(const nlohmann::json& j) noexcept {
  if (j.is_number_unsigned()) return j.get<std::uint64_t>();
  if (j.is_number_integer() && j.get<std::int64_t>() >= 0) return static_cast<std::uint64_t>(j.get<std::int64_t>());
  return std::nullopt;
}

/// A value inside a JSON document with the path it was reached by ("mesh.axes[2].latency_s")
/// and the document it came from ("plan file 'p.json'"). A view: the document must outlive it.
class json_in {
 public:
  json_in(const nlohmann::json& j, std::string source, std::string path = {})
      : j_(&j), source_(std::move(source)), path_(std::move(path)) {}

  const nlohmann::json& raw() const noexcept { return *j_; }
  /// "mesh.axes[2]"; "" for the document itself.
  const std::string& path() const noexcept { return path_; }
  const std::string& source() const noexcept { return source_; }

  /// Throws io_error "<source>: <path> <why>" (or "<source>: the document <why>").
  [[noreturn]] void fail(const std::string& why) const {
    std::string where = source_.empty() ? std::string() : source_ + ": ";
    throw io_error(where + (path_.empty() ? std::string("the document") : path_) + " " + why);
  }
  /// Throws io_error "<source>: <path> is <value>, not <expected>".
  [[noreturn]] void fail_expected(const std::string& expected) const {
    fail("is " + detail::json_excerpt(*j_) + ", not " + expected);
  }

  bool is_null() const noexcept { return j_->is_null(); }
  bool has(const char* key) const { return j_->is_object() && j_->contains(key); }

  /// The member `key` of this object; an error when this is not an object or has no such member.
  json_in operator[](const char* key) const {
    require_object();
    auto it = j_->find(key);
    if (it == j_->end()) fail(std::string("has no member \"") + key + "\"");
    return {*it, source_, child(key)};
  }
  json_in operator[](const std::string& key) const { return (*this)[key.c_str()]; }
  /// The member `key`, or nothing when it is absent (or null).
  std::optional<json_in> find(const char* key) const {
    require_object();
    auto it = j_->find(key);
    if (it == j_->end() || it->is_null()) return std::nullopt;
    return json_in{*it, source_, child(key)};
  }
  /// Element i of this array; an error when this is not an array or i is out of range.
  json_in operator[](std::size_t i) const {
    require_array();
    if (i >= j_->size()) fail("has " + std::to_string(j_->size()) + " elements, none at index " + std::to_string(i));
    return {(*j_)[i], source_, path_ + "[" + std::to_string(i) + "]"};
  }
  json_in operator[](int i) const {
    if (i < 0) fail("has no element at index " + std::to_string(i));
    return (*this)[static_cast<std::size_t>(i)];
  }
  /// The number of elements of this array (an error when it is not one, or holds more than max).
  std::size_t size(std::size_t max = std::numeric_limits<std::size_t>::max()) const {
    require_array();
    if (j_->size() > max) fail("has " + std::to_string(j_->size()) + " elements; at most " + std::to_string(max) + " are allowed");
    return j_->size();
  }
  /// Every element of this array, in order.
  std::vector<json_in> elements(std::size_t max = std::numeric_limits<std::size_t>::max()) const {
    std::vector<json_in> out;
    const std::size_t n = size(max);
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i) out.push_back((*this)[i]);
    return out;
  }
  /// Every member of this object, in the document's order.
  std::vector<std::pair<std::string, json_in>> members() const {
    require_object();
    std::vector<std::pair<std::string, json_in>> out;
    for (auto it = j_->begin(); it != j_->end(); ++it) out.emplace_back(it.key(), json_in{it.value(), source_, child(it.key())});
    return out;
  }

  const json_in& require_object() const {
    if (!j_->is_object()) fail_expected("an object");
    return *this;
  }
  const json_in& require_array() const {
    if (!j_->is_array()) fail_expected("an array");
    return *this;
  }

  /// An integer in [lo, hi]. A float (3.0, 1e30) or an integer beyond the range is an error.
  std::int64_t integer(std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                       std::int64_t hi = std::numeric_limits<std::int64_t>::max()) const {
    const std::optional<std::int64_t> v = json_int64(*j_);
    if (!v || *v < lo || *v > hi) fail_expected("an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return *v;
  }
  /// An int in [lo, hi] (the bounds must fit an int).
  int small_integer(int lo, int hi) const { return static_cast<int>(integer(lo, hi)); }
  /// The integers of this array, each in [lo, hi], at most max_size of them.
  std::vector<std::int64_t> integers(std::int64_t lo, std::int64_t hi,
                                     std::size_t max_size = std::numeric_limits<std::size_t>::max()) const {
    std::vector<std::int64_t> out;
    for (const json_in& e : elements(max_size)) out.push_back(e.integer(lo, hi));
    return out;
  }
  /// A finite number in [lo, hi] (an integer in the file is taken as its double).
  double number(double lo = -std::numeric_limits<double>::max(), double hi = std::numeric_limits<double>::max()) const {
    if (!j_->is_number()) fail_expected("a number in [" + fmt(lo) + ", " + fmt(hi) + "]");
    const double d = j_->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi) fail_expected("a number in [" + fmt(lo) + ", " + fmt(hi) + "]");
    return d;
  }
  std::string string() const {
    if (!j_->is_string()) fail_expected("a string");
    return j_->get<std::string>();
  }
  /// A string, one of `allowed` (the error lists them).
  std::string one_of(const std::vector<std::string>& allowed) const {
    std::string s = string();
    for (const std::string& a : allowed)
      if (s == a) return s;
    std::string list;
    for (std::size_t i = 0; i < allowed.size(); ++i) list += (i ? (i + 1 == allowed.size() ? " or \"" : ", \"") : "\"") + allowed[i] + "\"";
    fail_expected(list);
  }
  bool boolean() const {
    if (!j_->is_boolean()) fail_expected("true or false");
    return j_->get<bool>();
  }

 private:
  std::string child(const std::string& key) const {  // the key escaped, as json_path_step writes it
    std::string p = path_.empty() ? std::string() : path_ + ".";
    detail::append_escaped(p, key, 0, key.size());
    return p;
  }
  static std::string fmt(double d) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", d);
    return buf;
  }
  const nlohmann::json* j_;
  std::string source_, path_;
};

/// One of an enum's values, spelled as its to_string (found by argument-dependent lookup):
/// `enum_value(j["mode"], all_run_modes)`; io_error listing the spellings otherwise.
template <class E, std::size_t N>
E enum_value(const json_in& j, const E (&all)[N]) {
  std::vector<std::string> names;
  for (E e : all) names.push_back(std::string(to_string(e)));
  return *parse_enum(j.one_of(names), all);  // one_of accepted a spelling of `all`
}

/// The most memory nlohmann::json's tree of a JSON text takes, per byte of text. Measured
/// with glibc malloc: 3.7 for a real IOPDDL request (long arrays of numbers), about 10 for a
/// problem of many small nodes (arrays of short arrays), 16 for arrays of one-number arrays,
/// 21 for arrays of empty objects (the worst shape: 3 bytes of text, a 16-byte value and a
/// 48-byte map).
inline constexpr std::uint64_t json_tree_bytes_per_byte = 32;

/// Texts under this size are not checked for memory: at 32 bytes a byte they take at most 64 MiB.
inline constexpr std::uint64_t json_memory_check_from = std::uint64_t{2} << 20;

/// What a streaming reader leaves free of what the process can allocate: the rest of the
/// program's work (a solve checks its own need before it starts) and the allocator's slack.
inline constexpr std::uint64_t text_memory_reserve = std::uint64_t{32} << 20;

namespace detail {
/// The refusal of `text_bytes` of JSON whose reader may keep `need` bytes, more than `m` allows.
inline resource_error text_memory_refusal(std::uint64_t text_bytes, const std::string& source, std::uint64_t bytes_per_byte,
                                          const std::string& holds, const machine_limits& m) {
  const std::uint64_t need = text_bytes > std::numeric_limits<std::uint64_t>::max() / bytes_per_byte
                                 ? std::numeric_limits<std::uint64_t>::max()
                                 : text_bytes * bytes_per_byte;
  return resource_error(source + " has " + human_bytes(static_cast<double>(text_bytes)) +
                        " of JSON, whose " + holds + " may take up to " + human_bytes(static_cast<double>(need)) + " (" +
                        std::to_string(bytes_per_byte) + " bytes a byte); this process can allocate " +
                        human_bytes(static_cast<double>(m.memory())) + " more (" + m.memory_source() +
                        (m.memory_limited() ? "): free memory or raise the limit" : "): free memory"));
}
}  // namespace detail

/// Refuses `text_bytes` of JSON when what a reader keeps of it, at most `bytes_per_byte` bytes
/// a byte of text, may not fit what this process can still allocate (MemAvailable,
/// RLIMIT_AS): a resource_error "<source> has 12.02 MiB of JSON, whose <holds> may take up to
/// ... (<bytes_per_byte> bytes a byte); this process can allocate ... more (...)". Texts under
/// json_memory_check_from are not checked.
inline void check_text_memory(std::uint64_t text_bytes, const std::string& source, std::uint64_t bytes_per_byte,
                              const std::string& holds) {
  if (text_bytes < json_memory_check_from) return;
  const machine_limits m = machine_limits::memory_here();
  if (text_bytes <= m.memory() / bytes_per_byte) return;
  throw detail::text_memory_refusal(text_bytes, source, bytes_per_byte, holds, m);
}

/// Refuses, before parsing, a text whose tree may not fit what this process can still
/// allocate (MemAvailable, RLIMIT_AS): running out of memory inside the parser cannot be
/// recovered cleanly (the tree's destructor allocates while it unwinds). Texts under 2 MiB
/// are not checked (their trees take at most 64 MiB).
inline void check_json_memory(std::size_t text_bytes, const std::string& source) {
  check_text_memory(text_bytes, source, json_tree_bytes_per_byte, "tree");
}

namespace detail {
/// Refuses a text that starts as gzip does (the contest ships its requests as .json.gz).
inline void refuse_gzip(std::string_view first_bytes, const std::string& source) {
  if (first_bytes.size() >= 2 && static_cast<unsigned char>(first_bytes[0]) == 0x1f &&
      static_cast<unsigned char>(first_bytes[1]) == 0x8b)
    throw io_error(source + " is gzip-compressed, not JSON: decompress it first (gunzip -k FILE, or zcat FILE > FILE.json)");
}
}  // namespace detail

namespace detail {
/// "line 3, column 14" (both counted from 1), for messages; text_position: of the last of the
/// first `byte` bytes of `text`.
inline std::string line_and_column(std::uint64_t line, std::uint64_t column) {
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}
inline std::string text_position(std::string_view text, std::size_t byte) {
  const std::string_view before = text.substr(0, std::min(byte, text.size()));
  const std::size_t nl = before.rfind('\n');
  const auto lines = static_cast<std::uint64_t>(std::count(before.begin(), before.end(), '\n'));
  return line_and_column(lines + 1, before.size() - (nl == std::string_view::npos ? 0 : nl + 1));  // the byte read last's
}

/// The refusal of a NUL byte in a JSON text: JSON has none (a string writes it \u0000), but
/// nlohmann's lexer takes one as the end of the input, so `{"a": 1}` followed by a NUL and
/// anything at all was read as `{"a": 1}`, the rest unread without a word. `where` is the
/// byte's line and column (line_and_column).
inline io_error json_nul_byte(const std::string& source, std::uint64_t byte, const std::string& where) {
  return io_error(source + " is not valid JSON: a NUL byte (0x00) at offset " + std::to_string(byte) + " (" + where +
                  "), which no JSON text holds (a string writes it \\u0000)");
}

/// json_nul_byte for a text held whole: the first NUL of `text`, if it has one.
inline void refuse_nul_byte(std::string_view text, const std::string& source) {
  if (const std::size_t z = text.find('\0'); z != std::string_view::npos) throw json_nul_byte(source, z, text_position(text, z + 1));
}

/// A text's bytes as a stream for nlohmann's parser, which says how far the parser has read
/// (its position when a SAX event is handled: a key's event comes as its closing quote is read).
class text_view_source final : public std::streambuf {
 public:
  explicit text_view_source(std::string_view s) {
    char* p = const_cast<char*>(s.data());  // read only: a streambuf's get area is char*
    setg(p, p, p + s.size());
  }
  std::size_t consumed() const noexcept { return static_cast<std::size_t>(gptr() - eback()); }
};

/// The refusal of an object that names one member twice: nlohmann's parser keeps the last of
/// them without a word (`{"version": 99, "version": 3}` read as version 3), so a hand edit
/// appended below the original, or two tools' output concatenated, was read as the one
/// they did not mean.
inline io_error duplicate_key(const std::string& source, std::string path, const std::string& key, const std::string& where) {
  if (path.size() > 160) path = path.substr(0, 100) + "..." + path.substr(path.size() - 50);
  return io_error((source.empty() ? std::string() : source + ": ") + (path.empty() ? std::string("the document") : path) +
                  " has the member " + quoted_text(key) + " twice (the second ends at " + where +
                  "); an object names each member once: remove one of them");
}

/// The types nlohmann's SAX interface names, for the handlers below.
struct json_sax_types {
  using json = nlohmann::json;
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;
};

/// nlohmann's DOM builder (json_sax_dom_parser) with one change: a key an object already has
/// is refused (detail::duplicate_key) instead of overwriting the value. The same tree, the
/// same stack of open values; the check is the object's own lookup (std::map::try_emplace).
class unique_keys_tree : public json_sax_types {
 public:

  unique_keys_tree(json& root, const std::string& source, std::function<std::string()> where)
      : root_(root), source_(source), where_(std::move(where)) {}

  bool null() { return put(nullptr), true; }
  bool boolean(bool v) { return put(v), true; }
  bool number_integer(number_integer_t v) { return put(v), true; }
  bool number_unsigned(number_unsigned_t v) { return put(v), true; }
  bool number_float(number_float_t v, const string_t&) { return put(v), true; }
  bool string(string_t& v) { return put(std::move(v)), true; }
  bool binary(binary_t& v) { return put(std::move(v)), true; }
  bool start_object(std::size_t) { return open_.push_back({put(json::value_t::object), nullptr}), true; }
  bool start_array(std::size_t) { return open_.push_back({put(json::value_t::array), nullptr}), true; }
  bool end_object() { return open_.pop_back(), true; }
  bool end_array() { return open_.pop_back(), true; }
  bool key(string_t& k) {
    auto [it, fresh] = open_.back().value->get_ref<json::object_t&>().try_emplace(k);
    if (!fresh) {
      std::string path;
      for (std::size_t i = 0; i + 1 < open_.size(); ++i) {
        const bool object = open_[i].value->is_object();
        json_path_step(path, object, object ? *open_[i].key : std::string(), object ? 0 : open_[i].value->size() - 1);
      }
      throw duplicate_key(source_, std::move(path), k, where_());
    }
    open_.back().key = &it->first;
    element_ = &it->second;
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& e) {
    throw e;  // as nlohmann's parse throws it
  }

 private:
  struct level {
    json* value;
    const std::string* key;  // an object's member being read
  };
  json& root_;
  const std::string& source_;
  std::function<std::string()> where_;
  std::vector<level> open_;
  json* element_ = nullptr;

  template <class V>
  json* put(V&& v) {
    if (open_.empty()) {
      root_ = json(std::forward<V>(v));
      return &root_;
    }
    json& top = *open_.back().value;
    if (top.is_array()) {
      json::array_t& a = top.get_ref<json::array_t&>();
      a.emplace_back(std::forward<V>(v));
      return &a.back();
    }
    *element_ = json(std::forward<V>(v));
    return element_;
  }
};

/// A SAX handler in front of another that refuses a key an open object already has
/// (detail::duplicate_key), for the streaming readers: it keeps the keys of every open object
/// (a streaming reader's objects are few and small; its arrays, which hold the bulk, cost a
/// counter each) and passes every event on.
template <class Sax>
class unique_keys_filter : public json_sax_types {
 public:

  unique_keys_filter(Sax& sax, const std::string& source, std::function<std::string()> where)
      : sax_(sax), source_(source), where_(std::move(where)) {}

  bool null() { return value(), sax_.null(); }
  bool boolean(bool v) { return value(), sax_.boolean(v); }
  bool number_integer(number_integer_t v) { return value(), sax_.number_integer(v); }
  bool number_unsigned(number_unsigned_t v) { return value(), sax_.number_unsigned(v); }
  bool number_float(number_float_t v, const string_t& s) { return value(), sax_.number_float(v, s); }
  bool string(string_t& v) { return value(), sax_.string(v); }
  bool binary(binary_t& v) { return value(), sax_.binary(v); }
  bool start_object(std::size_t n) { return value(), open_.emplace_back(true), sax_.start_object(n); }
  bool start_array(std::size_t n) { return value(), open_.emplace_back(false), sax_.start_array(n); }
  bool end_object() { return open_.pop_back(), sax_.end_object(); }
  bool end_array() { return open_.pop_back(), sax_.end_array(); }
  bool key(string_t& k) {
    auto [it, fresh] = open_.back().keys.insert(k);
    if (!fresh) {
      std::string path;
      for (std::size_t i = 0; i + 1 < open_.size(); ++i)
        json_path_step(path, open_[i].object, open_[i].object ? *open_[i].key : std::string(), open_[i].count - 1);
      throw duplicate_key(source_, std::move(path), k, where_());
    }
    open_.back().key = &*it;
    return sax_.key(k);
  }
  template <class Exception>
  bool parse_error(std::size_t byte, const std::string& token, const Exception& e) {
    return sax_.parse_error(byte, token, e);
  }

 private:
  struct level {
    explicit level(bool o) : object(o) {}
    bool object;
    std::size_t count = 0;               // an array's elements so far
    const std::string* key = nullptr;    // an object's member being read
    std::unordered_set<std::string> keys;
  };
  Sax& sax_;
  const std::string& source_;
  std::function<std::string()> where_;
  std::vector<level> open_;

  void value() {
    if (!open_.empty() && !open_.back().object) ++open_.back().count;
  }
};

/// The tree of `text`, an object that names a member twice refused (duplicate_key, naming
/// `source`); a syntax error is nlohmann's exception, as json::parse throws it.
inline nlohmann::json parse_unique_keys(std::string_view text, const std::string& source) {
  refuse_nul_byte(text, source);
  text_view_source buf(text);
  std::istream in(&buf);
  nlohmann::json j;
  unique_keys_tree tree(j, source, [&] { return text_position(text, buf.consumed()); });
  nlohmann::json::sax_parse(in, &tree, nlohmann::json::input_format_t::json, true);
  return j;
}
}  // namespace detail

/// Parses JSON text; a syntax error (or a number beyond a double, 1e999) is an io_error
/// naming `source` ("plan file 'p.json'"), and so is a text nested deeper than
/// max_json_depth (check_json_depth), and so is an object that names a member twice
/// (detail::duplicate_key: "<source>: mesh has the member 'axes' twice (the second ends at
/// line 9, column 10); ..."); a text too big for the memory left is a resource_error
/// (check_json_memory). Every JSON reader of autoshard that keeps a tree parses through here;
/// a streaming reader goes through sax_parse_json.
inline nlohmann::json parse_json_text(std::string_view text, const std::string& source) {
  detail::refuse_gzip(text, source);
  check_json_memory(text.size(), source);
  check_json_depth(text, source);
  try {
    return detail::parse_unique_keys(text, source);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e999
    throw io_error(source + " is not valid JSON: " + e.what());
  }
}

namespace detail {
/// A regular file open for reading, closed on destruction: what read_regular_file and the
/// streaming readers open, with one set of checks and messages.
struct regular_file {
  int fd = -1;
  std::uint64_t size = 0;
  std::string name;  ///< "<what> '<path>'"
  regular_file() = default;
  regular_file(const regular_file&) = delete;
  regular_file& operator=(const regular_file&) = delete;
  ~regular_file() {
    if (fd >= 0) ::close(fd);
  }
};

/// Opens `path` when it is a regular file: a directory, a FIFO, a device or a socket is refused
/// without reading from it (it is opened non-blocking, so a FIFO without a writer cannot hang
/// the call). `what` names the file in messages ("plan file").
inline void open_regular_file(regular_file& f, const std::string& path, const std::string& what) {
  f.name = what + " " + quoted_path(path);
  f.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (f.fd < 0) throw io_error("cannot open " + f.name + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw io_error("cannot stat " + f.name + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw io_error(f.name + " is a directory, not a file");
  if (!S_ISREG(st.st_mode)) throw io_error(f.name + " is not a regular file (a FIFO, a device or a socket)");
  f.size = static_cast<std::uint64_t>(st.st_size);
}

/// Up to `n` bytes of `fd` (fewer only at its end); io_error naming `name` on a read error.
inline std::size_t read_some(int fd, char* p, std::size_t n, const std::string& name) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t k = ::read(fd, p + got, n - got);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) throw io_error("cannot read " + name + ": " + std::strerror(errno));
    if (k == 0) break;
    got += static_cast<std::size_t>(k);
  }
  return got;
}
}  // namespace detail

/// How far a file may read past the size it had when opened: a /proc or /sys file says 0
/// bytes and yields a few KiB.
inline constexpr std::uint64_t read_growth_allowance = std::uint64_t{1} << 20;

/// The bytes of a regular file, at most max_bytes. A directory, a FIFO, a device or a socket
/// is refused without reading from it (it is opened non-blocking, so a FIFO without a writer
/// cannot hang the call). `what` names the file in messages ("plan file"). A file that yields
/// more than its size and read_growth_allowance is refused there: the memory checks were made
/// for its size (/proc/self/pagemap, 0 bytes by its size, read 4 GiB in 10 s before).
inline std::string read_regular_file(const std::string& path, const std::string& what = "file",
                                     std::uint64_t max_bytes = std::uint64_t{1} << 32) {
  detail::regular_file f;
  detail::open_regular_file(f, path, what);
  if (f.size > max_bytes)
    throw io_error(f.name + " has " + std::to_string(f.size) + " bytes; at most " + std::to_string(max_bytes) + " are read");
  const std::uint64_t grown = f.size + read_growth_allowance;
  std::string out;
  out.reserve(static_cast<std::size_t>(f.size));
  char buf[1 << 16];
  for (;;) {
    const std::size_t k = detail::read_some(f.fd, buf, sizeof buf, f.name);
    if (k == 0) break;
    if (out.size() + k > max_bytes) throw io_error(f.name + " grew beyond " + std::to_string(max_bytes) + " bytes while read");
    if (out.size() + k > grown)
      throw io_error(f.name + " yields more than its size of " + std::to_string(f.size) + " bytes and " +
                     std::to_string(read_growth_allowance) +
                     " more: not a file autoshard reads (a /proc or /sys file, or one another program is still writing)");
    out.append(buf, k);
  }
  return out;
}

/// Opens, reads and parses a JSON file; every failure is an io_error naming it
/// ("cannot open plan file 'p.json': No such file or directory",
///  "plan file 'p.json' is not valid JSON: ..."). A file whose tree may not fit the memory left
/// is refused from its size before a byte of it is read (check_json_memory): reading a
/// 1.3 GB text first took 1.3 GB and 3 s only to refuse it.
inline nlohmann::json load_json_file(const std::string& path, const std::string& what = "file") {
  const std::string name = what + " " + quoted_path(path);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) check_json_memory(static_cast<std::size_t>(st.st_size), name);
  return parse_json_text(read_regular_file(path, what), name);
}

/// What a streaming reader keeps of a JSON text, at most: `bytes_per_byte` bytes a byte of text,
/// named `holds` in the refusal ("problem": "..., whose problem may take up to ...").
struct text_memory_bound {
  std::uint64_t bytes_per_byte = json_tree_bytes_per_byte;
  std::string holds = "tree";
};

/// The io_error of a syntax error a SAX parse met (a SAX handler's parse_error throws it):
/// "<source> is not valid JSON at byte 17: [json.exception.parse_error.101] ...".
inline io_error json_syntax_error(const std::string& source, std::size_t byte, const std::exception& e) {
  return io_error(source + " is not valid JSON at byte " + std::to_string(byte) + ": " + e.what());
}

namespace detail {
/// The text of a JSON stream for nlohmann's SAX parser, read 64 KiB at a time from a file's
/// descriptor or from another stream's buffer, so that neither the text nor a tree is held.
/// It keeps the reader's memory bound on what it hands out, checking against what the process
/// can allocate now, which falls as the reader stores what it read: once a text whose size is
/// known may take all it has left (`bytes_per_byte` a byte) it is read without further checks;
/// until then each check lets the reader take at most half of what is left above
/// `text_memory_reserve` before the next one, and the reading stops with a resource_error when
/// that is less than the next 64 KiB may take. So a text is refused before the memory it
/// would need is taken, but only when it really stores too much: a real request stores about
/// one byte a byte of text, a worst-shaped one 16 (iopddl_bytes_per_byte).
class json_text_source final : public std::streambuf {
 public:
  json_text_source(int fd, std::streambuf* from, std::string source, text_memory_bound bound,
                   std::optional<std::uint64_t> size)
      : fd_(fd), from_(from), source_(std::move(source)), bound_(std::move(bound)), size_(size),
        checked_(json_memory_check_from), buf_(std::size_t{1} << 16) {}
  /// The first two bytes of the text (fewer for a shorter one), read ahead: the gzip check's.
  std::string_view first_bytes() {
    if (sgetc() == traits_type::eof()) return {};
    return {eback(), std::min<std::size_t>(2, static_cast<std::size_t>(egptr() - eback()))};
  }

  /// Where the reading stands: "line 3, column 14" of the byte read last.
  std::string position() const {
    std::uint64_t lines = lines_, line_start = line_start_;
    const std::uint64_t chunk = read_ - static_cast<std::uint64_t>(egptr() - eback());  // the offset of eback()
    for (const char* p = eback(); p < gptr(); ++p)
      if (*p == '\n') ++lines, line_start = chunk + static_cast<std::uint64_t>(p - eback()) + 1;
    const std::uint64_t at = chunk + static_cast<std::uint64_t>(gptr() - eback());
    return line_and_column(lines + 1, at - line_start);
  }

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    const std::size_t k = fd_ >= 0 ? read_some(fd_, buf_.data(), buf_.size(), source_)
                                   : static_cast<std::size_t>(from_->sgetn(buf_.data(), static_cast<std::streamsize>(buf_.size())));
    if (k == 0) return traits_type::eof();
    count_lines(egptr());  // the chunk read up to now, before it is replaced
    read_ += k;
    if (read_ > checked_) check();
    setg(buf_.data(), buf_.data(), buf_.data() + k);
    // A NUL would end the parse as the end of the input does (detail::json_nul_byte). A gzip
    // file has one in its first bytes: it is refused as gzip (refuse_gzip), as before.
    if (char* z = static_cast<char*>(std::memchr(buf_.data(), 0, k))) {
      if (read_ == k) refuse_gzip(std::string_view(buf_.data(), k), source_);
      setg(buf_.data(), z + 1, buf_.data() + k);  // position() names the NUL
      throw json_nul_byte(source_, read_ - k + static_cast<std::uint64_t>(z - buf_.data()), position());
    }
    return traits_type::to_int_type(buf_[0]);
  }

 private:
  int fd_;
  std::streambuf* from_;
  std::string source_;
  text_memory_bound bound_;
  std::optional<std::uint64_t> size_;
  std::uint64_t checked_;  // bytes of text that may be read before the next check
  std::uint64_t read_ = 0;
  std::vector<char> buf_;
  std::uint64_t lines_ = 0, line_start_ = 0;  // the newlines before the current chunk; the offset after the last

  void count_lines(const char* end) {
    if (eback() == nullptr) return;
    const std::uint64_t chunk = read_ - static_cast<std::uint64_t>(egptr() - eback());
    const std::string_view seen(eback(), static_cast<std::size_t>(end - eback()));
    lines_ += static_cast<std::uint64_t>(std::count(seen.begin(), seen.end(), '\n'));
    if (const std::size_t nl = seen.rfind('\n'); nl != std::string_view::npos) line_start_ = chunk + nl + 1;
  }

  void check() {
    const machine_limits m = machine_limits::memory_here();
    const std::uint64_t have = m.memory(), bpb = bound_.bytes_per_byte;
    const std::uint64_t left = size_ && *size_ > read_ ? *size_ - read_ : 0;  // unknown size: 0
    if (size_ && read_ <= *size_ && left <= have / bpb) {  // the rest fits whatever it holds
      checked_ = std::numeric_limits<std::uint64_t>::max();
      return;
    }
    const std::uint64_t spare = have > text_memory_reserve ? have - text_memory_reserve : 0;
    if (spare / bpb < buf_.size()) {
      const std::string of = size_ ? " of its " + human_bytes(static_cast<double>(*size_)) : std::string();
      const std::string rest = size_ ? ", and the " + human_bytes(static_cast<double>(left)) + " left may take up to " +
                                           human_bytes(static_cast<double>(left) * static_cast<double>(bpb)) + " (" +
                                           std::to_string(bpb) + " bytes a byte)"
                                     : std::string();
      throw resource_error(source_ + ": reading stopped after " + human_bytes(static_cast<double>(read_)) + of +
                           " of JSON: the " + bound_.holds + " read so far leaves this process " +
                           human_bytes(static_cast<double>(have)) + " (" + m.memory_source() + "), less than the " +
                           human_bytes(static_cast<double>(text_memory_reserve)) + " kept free and the " +
                           human_bytes(static_cast<double>(buf_.size()) * static_cast<double>(bpb)) + " the next " +
                           human_bytes(static_cast<double>(buf_.size())) + " may take" + rest +
                           (m.memory_limited() ? ": free memory or raise the limit" : ": free memory"));
    }
    checked_ = read_ + spare / (2 * bpb);
  }
};

/// The bytes left in a stream whose buffer can seek (a file, a string), else nothing.
inline std::optional<std::uint64_t> bytes_left(std::streambuf& sb) {
  const auto at = sb.pubseekoff(0, std::ios::cur, std::ios::in);
  if (at == std::streampos(-1)) return std::nullopt;
  const auto end = sb.pubseekoff(0, std::ios::end, std::ios::in);
  sb.pubseekpos(at, std::ios::in);
  if (end == std::streampos(-1) || end < at) return std::nullopt;
  return static_cast<std::uint64_t>(end - at);
}

template <class Sax>
void sax_parse_source(json_text_source& text, const std::string& source, Sax& sax) {
  refuse_gzip(text.first_bytes(), source);
  std::istream in(&text);
  unique_keys_filter<Sax> unique(sax, source, [&] { return text.position(); });
  if (!nlohmann::json::sax_parse(in, &unique, nlohmann::json::input_format_t::json, true))
    throw io_error(source + " is not valid JSON");  // a handler that stops without saying why
}
}  // namespace detail

/// Parses the JSON text of `in` with a SAX handler (nlohmann's interface: null(), boolean(),
/// number_*(), string(), start_object(), key(), ... parse_error()), holding neither the text nor
/// a tree: a reader that stores what it needs as it goes. nlohmann's SAX parser keeps its own
/// stack of open arrays and objects (no recursion), so the handler bounds the depth (a handler
/// that skips unknown members counts them against max_json_depth and throws json_too_deep).
/// A gzip text is refused as parse_json_text refuses it; the handler's parse_error should
/// throw json_syntax_error. `bound` is what the handler keeps per byte of text at most: the
/// reading stops with a resource_error before what it may take next does not fit what the
/// process can allocate (detail::json_text_source says how).
///   my_sax sax;
///   autoshard::sax_parse_json(std::cin, "<stdin>", sax, {16, "problem"});
template <class Sax>
void sax_parse_json(std::istream& in, const std::string& source, Sax& sax, const text_memory_bound& bound) {
  std::streambuf* sb = in.rdbuf();
  if (sb == nullptr) throw io_error(source + " has no stream to read");
  detail::json_text_source text(-1, sb, source, bound, detail::bytes_left(*sb));
  detail::sax_parse_source(text, source, sax);
}

/// sax_parse_json for a regular file: refused (io_error) when it cannot be opened or is not a
/// regular file, as load_json_file does, and (resource_error) as sax_parse_json when what it
/// stores may not fit. Messages name the file as "<what> '<path>'".
template <class Sax>
void sax_parse_json_file(const std::string& path, const std::string& what, Sax& sax, const text_memory_bound& bound) {
  detail::regular_file f;
  detail::open_regular_file(f, path, what);
  detail::json_text_source text(f.fd, nullptr, f.name, bound, f.size);
  detail::sax_parse_source(text, f.name, sax);
}

/// Feeds a document already parsed to a SAX handler, the events sax_parse would give for its
/// text (members in the document's order), with its own stack instead of recursion: a
/// document built in memory may nest deeper than a text autoshard reads. Returns false when
/// the handler stopped it (an event returned false).
template <class Sax>
bool sax_walk_json(const nlohmann::json& doc, Sax& sax) {
  struct level {
    const nlohmann::json* j;
    nlohmann::json::const_iterator it;
  };
  std::vector<level> stack;
  const auto enter = [&](const nlohmann::json& v) -> bool {
    switch (v.type()) {
      case nlohmann::json::value_t::object:
        stack.push_back({&v, v.begin()});
        return sax.start_object(v.size());
      case nlohmann::json::value_t::array:
        stack.push_back({&v, v.begin()});
        return sax.start_array(v.size());
      case nlohmann::json::value_t::boolean:
        return sax.boolean(v.get<bool>());
      case nlohmann::json::value_t::number_integer:
        return sax.number_integer(v.get<std::int64_t>());
      case nlohmann::json::value_t::number_unsigned:
        return sax.number_unsigned(v.get<std::uint64_t>());
      case nlohmann::json::value_t::number_float:
        return sax.number_float(v.get<double>(), std::string());
      case nlohmann::json::value_t::string: {
        std::string s = v.get<std::string>();
        return sax.string(s);
      }
      case nlohmann::json::value_t::binary: {
        nlohmann::json::binary_t b = v.get_binary();
        return sax.binary(b);
      }
      case nlohmann::json::value_t::null:
      case nlohmann::json::value_t::discarded:
        return sax.null();
    }
    return sax.null();
  };
  if (!enter(doc)) return false;
  while (!stack.empty()) {
    level& l = stack.back();
    if (l.it == l.j->end()) {
      const bool object = l.j->is_object();
      stack.pop_back();
      if (!(object ? sax.end_object() : sax.end_array())) return false;
      continue;
    }
    const auto it = l.it++;
    if (l.j->is_object()) {
      std::string k = it.key();
      if (!sax.key(k)) return false;
    }
    if (!enter(*it)) return false;  // may grow the stack: `l` is not used after this
  }
  return true;
}

}  // namespace autoshard

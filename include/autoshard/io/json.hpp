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
#include <cerrno>      // errno
#include <cmath>       // std::isfinite
#include <cstdint>     // std::int64_t, std::uint64_t
#include <cstdio>      // std::snprintf
#include <cstring>     // std::strerror
#include <functional>  // std::function
#include <limits>      // std::numeric_limits
#include <optional>    // std::optional
#include <string>      // std::string
#include <string_view>  // std::string_view
#include <utility>     // std::move
#include <vector>      // std::vector

#include <fcntl.h>     // open, O_RDONLY, O_NONBLOCK
#include <sys/stat.h>  // fstat, S_ISREG
#include <unistd.h>    // read, close

#include <nlohmann/json.hpp>  // nlohmann::json

#include "../core/dtype.hpp"      // human_bytes
#include "../core/enum_text.hpp"  // parse_enum
#include "../core/error.hpp"    // io_error, resource_error
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
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
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
          for (const frame& f : stack)
            path += f.object ? (path.empty() ? "" : ".") + (f.key.empty() ? std::string("\"\"") : f.key)
                             : "[" + std::to_string(f.index) + "]";
          if (path.size() > 160) path = path.substr(0, 100) + "..." + path.substr(path.size() - 50);
          throw io_error((source.empty() ? std::string() : source + ": ") + "nested deeper than " +
                         std::to_string(max_depth) + " levels (arrays and objects) at " +
                         (path.empty() ? std::string("the document") : path) +
                         "; no file autoshard reads nests that deep");
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
  std::string child(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
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

/// Refuses, before parsing, a text whose tree may not fit what this process can still
/// allocate (MemAvailable, RLIMIT_AS): running out of memory inside the parser cannot be
/// recovered cleanly (the tree's destructor allocates while it unwinds). Texts under 2 MiB
/// are not checked (their trees take at most 64 MiB).
inline void check_json_memory(std::size_t text_bytes, const std::string& source) {
  const std::uint64_t need = static_cast<std::uint64_t>(text_bytes) * json_tree_bytes_per_byte;
  if (text_bytes < (std::size_t{2} << 20)) return;
  const machine_limits m = machine_limits::here();
  if (need <= m.memory()) return;
  throw resource_error(source + " has " + human_bytes(text_bytes) + " of JSON, whose tree may take up to " +
                       human_bytes(need) + " (" + std::to_string(json_tree_bytes_per_byte) + " bytes a byte); this process can allocate " +
                       human_bytes(m.memory()) + " more (" + m.memory_source() +
                       "): free memory or raise the limit");
}

/// Parses JSON text; a syntax error (or a number beyond a double, 1e999) is an io_error
/// naming `source` ("plan file 'p.json'"), and so is a text nested deeper than
/// max_json_depth (check_json_depth); a text too big for the memory left is a resource_error
/// (check_json_memory). Every JSON reader of autoshard parses through here.
inline nlohmann::json parse_json_text(std::string_view text, const std::string& source) {
  if (text.size() >= 2 && static_cast<unsigned char>(text[0]) == 0x1f && static_cast<unsigned char>(text[1]) == 0x8b)
    throw io_error(source + " is gzip-compressed, not JSON: decompress it first (gunzip -k FILE, or zcat FILE > FILE.json)");
  check_json_memory(text.size(), source);
  check_json_depth(text, source);
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e999
    throw io_error(source + " is not valid JSON: " + e.what());
  }
}

/// The bytes of a regular file, at most max_bytes. A directory, a FIFO, a device or a socket
/// is refused without reading from it (it is opened non-blocking, so a FIFO without a writer
/// cannot hang the call). `what` names the file in messages ("plan file").
inline std::string read_regular_file(const std::string& path, const std::string& what = "file",
                                     std::uint64_t max_bytes = std::uint64_t{1} << 32) {
  const std::string name = what + " '" + path + "'";
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw io_error("cannot open " + name + ": " + std::strerror(errno));
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw io_error("cannot stat " + name + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw io_error(name + " is a directory, not a file");
  if (!S_ISREG(st.st_mode)) throw io_error(name + " is not a regular file (a FIFO, a device or a socket)");
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes)
    throw io_error(name + " has " + std::to_string(st.st_size) + " bytes; at most " + std::to_string(max_bytes) + " are read");
  std::string out;
  out.reserve(static_cast<std::size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t k = ::read(fd, buf, sizeof buf);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) throw io_error("cannot read " + name + ": " + std::strerror(errno));
    if (k == 0) break;
    if (out.size() + static_cast<std::size_t>(k) > max_bytes) throw io_error(name + " grew beyond " + std::to_string(max_bytes) + " bytes while read");
    out.append(buf, static_cast<std::size_t>(k));
  }
  return out;
}

/// Opens, reads and parses a JSON file; every failure is an io_error naming it
/// ("cannot open plan file 'p.json': No such file or directory",
///  "plan file 'p.json' is not valid JSON: ...").
inline nlohmann::json load_json_file(const std::string& path, const std::string& what = "file") {
  return parse_json_text(read_regular_file(path, what), what + " '" + path + "'");
}

}  // namespace autoshard

#pragma once
/// safetensors files, byte for byte as Hugging Face's `safetensors` writes them:
/// 8-byte little-endian header length N, N bytes of JSON ({"__metadata__": {str: str},
/// name: {"dtype", "shape", "data_offsets": [begin, end]}}), padded with spaces to a multiple
/// of 8, then the data in offset order (tensors sorted by dtype, widest first, then by name).
/// Reading memory-maps the file and validates the whole header before anything is used.
///   autoshard::safetensors_file f("model.safetensors");
///   autoshard::const_tensor_view w = f.view("transformer.h.0.attn.c_attn.weight");
///   autoshard::save_safetensors("out.safetensors", {{"w", w}}, {{"format", "pt"}});
#include <fcntl.h>     // open
#include <setjmp.h>    // sigsetjmp, siglongjmp
#include <signal.h>    // sigaction, SIGBUS
#include <sys/mman.h>  // mmap, madvise
#include <sys/stat.h>  // fstat
#include <unistd.h>    // close, write, fsync

#include <algorithm>    // std::sort
#include <cerrno>       // errno
#include <cstddef>      // std::byte
#include <cstdint>      // std::uint64_t
#include <cstdio>       // std::fopen
#include <cstring>      // std::memcpy, std::strerror
#include <filesystem>   // std::filesystem::path
#include <map>          // std::map
#include <optional>     // std::optional
#include <set>          // std::set
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <unordered_set>  // std::unordered_set
#include <utility>      // std::pair, std::exchange
#include <vector>       // std::vector

#include <nlohmann/json.hpp>  // header JSON

#include "../core/dtype.hpp"  // dtype, parse_dtype, safetensors_name
#include "../core/error.hpp"  // io_error, resource_error
#include "../core/machine.hpp"  // machine_limits::maps_left
#include "../core/shape.hpp"  // tensor_shape
#include "../io/atomic_file.hpp"  // atomic_file, detail::sys_error
#include "../io/json.hpp"         // read_regular_file, parse_json_text, check_json_depth, json_uint64
#include "host_tensor.hpp"    // const_tensor_view, host_tensor

namespace autoshard {

/// Whether `name` (read from an index file) names a file in the index's own directory: not
/// empty, not "." or "..", no '/' and no NUL. An index may not send a reader elsewhere
/// ("../x", "/etc/passwd").
inline bool is_plain_file_name(std::string_view name) noexcept {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

/// Hugging Face's limit on the JSON header (safetensors' MAX_HEADER_SIZE).
inline constexpr std::uint64_t safetensors_max_header = 100'000'000;

/// One tensor of a safetensors file; offsets are relative to the start of the data.
struct safetensors_entry {
  std::string name;
  dtype type = dtype::f32;
  tensor_shape shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t nbytes() const noexcept { return end - begin; }
};

/// A validated header: entries in data order, the optional __metadata__, where data starts.
struct safetensors_header {
  std::vector<safetensors_entry> entries;
  std::map<std::string, std::string> metadata;
  std::uint64_t data_start = 0;  ///< 8 + header length
  std::uint64_t data_size = 0;
};

namespace detail {
[[noreturn]] inline void bad_file(std::string_view file, const std::string& why) {
  throw io_error("safetensors file " + quoted_path(std::string(file)) + ": " + why);
}
[[noreturn]] inline void bad_tensor(std::string_view file, std::string_view name, const std::string& why) {
  throw io_error("safetensors file " + quoted_path(std::string(file)) + ", tensor " + quoted_text(name) + ": " + why);
}
inline std::uint64_t read_le64(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint64_t>(p[i]);
  return v;
}
inline void write_le64(std::uint64_t v, char* out) noexcept {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
/// Hugging Face's dtype order (Rust enum Dtype); files list wider-ranked dtypes first.
inline int hf_dtype_rank(dtype t) noexcept {
  switch (t) {
    case dtype::boolean: return 0;
    case dtype::u8: return 1;
    case dtype::f16: return 2;
    case dtype::bf16: return 3;
    case dtype::i32: return 4;
    case dtype::f32: return 5;
    case dtype::f64: return 6;
    case dtype::i64: return 7;
  }
  return 0;
}
/// The first top-level key of a JSON object text that appears twice, or "" (also "" when the
/// text is not valid JSON: the real parse reports that). Linear in the text: a SAX pass that
/// keeps the depth-1 keys in a hash set and builds nothing else.
inline std::string first_duplicate_key(std::string_view text) {
  struct dup_sax : nlohmann::json_sax<nlohmann::json> {
    std::unordered_set<std::string> seen;
    std::string duplicate;
    int depth = 0;
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override { return ++depth, true; }
    bool end_object() override { return --depth, true; }
    bool start_array(std::size_t) override { return ++depth, true; }
    bool end_array() override { return --depth, true; }
    bool key(string_t& k) override {
      if (depth == 1 && !seen.insert(k).second) {
        duplicate = k;
        return false;  // stop: one is enough
      }
      return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
  } sax;
  (void)nlohmann::json::sax_parse(text.begin(), text.end(), &sax, nlohmann::json::input_format_t::json, false);
  return sax.duplicate;
}
/// SIGBUS while reading a mapped file (another program truncated it after it was mapped):
/// a thread that arms a guard jumps back to it instead of dying. The handler is installed once;
/// a SIGBUS outside a guard restores the previous action, so the fault repeats under it.
struct sigbus_guard {
  sigjmp_buf env;
};
inline thread_local sigbus_guard* armed_sigbus_guard = nullptr;
inline struct sigaction& previous_sigbus_action() {
  static struct sigaction a {};
  return a;
}
inline void on_sigbus(int, siginfo_t*, void*) {
  if (sigbus_guard* g = armed_sigbus_guard) {
    armed_sigbus_guard = nullptr;
    siglongjmp(g->env, 1);
  }
  ::sigaction(SIGBUS, &previous_sigbus_action(), nullptr);  // not ours: the fault repeats under it
}
inline void install_sigbus_handler() {
  static const bool installed = [] {
    struct sigaction a {};
    a.sa_sigaction = &on_sigbus;
    a.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&a.sa_mask);
    return ::sigaction(SIGBUS, &a, &previous_sigbus_action()) == 0;
  }();
  (void)installed;
}
/// Calls f(); true when it returned, false when a SIGBUS cut it short. Kept apart so that no
/// local of the caller lives across the jump.
template <class F>
[[gnu::noinline]] bool call_sigbus_guarded(F& f) {
  sigbus_guard g;
  if (sigsetjmp(g.env, 0) != 0) return false;
  armed_sigbus_guard = &g;
  f();
  armed_sigbus_guard = nullptr;
  return true;
}
}  // namespace detail

namespace detail {

/// The header's JSON (its length read and bounded by the file and the limit, duplicate names
/// refused, depth bounded); sets `length` to the header's length in bytes.
inline nlohmann::json safetensors_header_json(std::span<const std::byte> bytes, std::string_view file,
                                              std::uint64_t& length) {
  using nlohmann::json;
  if (bytes.size() < 8) bad_file(file, "only " + std::to_string(bytes.size()) + " bytes, no header length");
  const std::uint64_t n = read_le64(bytes.data());
  if (n > safetensors_max_header)
    bad_file(file, "header length " + std::to_string(n) + " exceeds the 100000000-byte limit");
  if (n > bytes.size() - 8)
    bad_file(file, "header length " + std::to_string(n) + " runs past the end of the file (" +
                       std::to_string(bytes.size()) + " bytes)");
  if (n < 2) bad_file(file, "header length " + std::to_string(n) + " is too short for a JSON object");
  std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), static_cast<std::size_t>(n));
  if (text.front() != '{') bad_file(file, "header does not start with '{'");
  // The format pads a header with spaces (0x20) after its JSON. A NUL is no JSON at all, but
  // nlohmann's parser took the first for the end of the text: a header padded with NULs, or
  // with a NUL and then anything, was read as the JSON before it.
  if (const std::size_t z = text.find('\0'); z != std::string_view::npos)
    bad_file(file, "header byte " + std::to_string(z) + " of its " + std::to_string(n) +
                       " is a NUL (0x00): a header is JSON, padded at its end with spaces (0x20) only");
  // Duplicate names first, in one linear pass (a hash set of the top-level keys): nlohmann's
  // callback parser rescans the whole object at the end of every entry (quadratic: 1,000,000
  // entries in a 90 MB header never finished), and its plain parser keeps the last duplicate.
  // A member named twice inside an entry ("dtype" twice) is refused by the parse
  // (parse_unique_keys), as in every JSON autoshard reads.
  const std::string source = "safetensors file " + quoted_path(std::string(file)) + ": header";
  check_json_depth(text, source);
  const std::string duplicate = first_duplicate_key(text);
  json h;
  try {
    h = duplicate.empty() ? parse_unique_keys(text, source) : json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    bad_file(file, std::string("header is not valid UTF-8 JSON: ") + e.what());
  }
  if (!duplicate.empty()) bad_tensor(file, duplicate, "name appears twice in the header");
  if (!h.is_object()) bad_file(file, "header is not a JSON object");
  length = n;
  return h;
}

/// The header's __metadata__: an object of strings.
inline void parse_safetensors_metadata(const nlohmann::json& v, std::string_view file,
                                       std::map<std::string, std::string>& metadata) {
  if (!v.is_object()) bad_file(file, "__metadata__ is not an object of strings");
  for (auto m = v.begin(); m != v.end(); ++m) {
    if (!m.value().is_string()) bad_file(file, "__metadata__ value of " + quoted_text(m.key()) + " is not a string");
    metadata[m.key()] = m.value().get<std::string>();
  }
}

/// One tensor's entry: a known dtype, a shape of at most 8 dims whose bytes fit 64 bits, and
/// data offsets that span exactly those bytes.
inline safetensors_entry parse_safetensors_entry(const std::string& name, const nlohmann::json& v,
                                                 std::string_view file) {
  if (!v.is_object()) bad_tensor(file, name, "entry is not an object");
  auto dt = v.find("dtype");
  auto sh = v.find("shape");
  auto off = v.find("data_offsets");
  if (dt == v.end() || sh == v.end() || off == v.end()) bad_tensor(file, name, "entry needs dtype, shape and data_offsets");
  if (!dt->is_string()) bad_tensor(file, name, "dtype is not a string");
  const std::string dts = dt->get<std::string>();
  auto t = parse_dtype(dts);
  if (!t || safetensors_name(*t) != dts) bad_tensor(file, name, "unknown or unsupported dtype " + quoted_text(dts));
  safetensors_entry e;
  e.name = name;
  e.type = *t;
  if (!sh->is_array()) bad_tensor(file, name, "shape is not an array");
  if (sh->size() > max_tensor_rank)
    bad_tensor(file, name, "shape has " + std::to_string(sh->size()) + " dims, at most 8 are supported");
  std::uint64_t numel = 1;
  bool overflow = false;
  e.shape.rank = static_cast<std::uint8_t>(sh->size());
  for (std::size_t i = 0; i < sh->size(); ++i) {
    const std::optional<std::uint64_t> d = json_uint64((*sh)[i]);
    if (!d || *d > (std::uint64_t{1} << 62))
      bad_tensor(file, name, "shape dim " + std::to_string(i) + " is not a non-negative integer");
    e.shape[i] = static_cast<std::int64_t>(*d);
    // Every prefix product must fit int64: tensor_shape::numel() multiplies in that type.
    overflow = overflow || __builtin_mul_overflow(numel, *d, &numel) || numel > static_cast<std::uint64_t>(INT64_MAX);
  }
  const std::optional<std::uint64_t> begin = off->is_array() && off->size() == 2 ? json_uint64((*off)[0]) : std::nullopt;
  const std::optional<std::uint64_t> end = off->is_array() && off->size() == 2 ? json_uint64((*off)[1]) : std::nullopt;
  if (!begin || !end) bad_tensor(file, name, "data_offsets is not a pair of non-negative integers");
  e.begin = *begin;
  e.end = *end;
  if (e.end < e.begin)
    bad_tensor(file, name, "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                               "] end before they begin");
  std::uint64_t want = 0;
  if (overflow || __builtin_mul_overflow(numel, dtype_size(e.type), &want) || want != e.end - e.begin)
    bad_tensor(file, name, "shape " + to_string(e.shape) + " of " + std::string(dts) + " needs " +
                               (overflow ? std::string("more than 2^64") : std::to_string(want)) +
                               " bytes but data_offsets span " + std::to_string(e.end - e.begin));
  return e;
}

/// Sorts the entries by offset and checks that they tile the data exactly: no overlap, no
/// gap, ending where the file does.
inline void check_safetensors_layout(safetensors_header& out, std::string_view file) {
  std::sort(out.entries.begin(), out.entries.end(), [](const safetensors_entry& a, const safetensors_entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t at = 0;
  for (const auto& e : out.entries) {
    if (e.begin != at)
      bad_tensor(file, e.name, "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] " +
                                   (e.begin < at ? "overlap the previous tensor" : "leave a gap") +
                                   " (expected to begin at " + std::to_string(at) + ")");
    at = e.end;
  }
  if (at != out.data_size)
    bad_file(file, "tensors cover " + std::to_string(at) + " data bytes but the file holds " +
                       std::to_string(out.data_size) + (at > out.data_size ? " (truncated)" : " (trailing bytes)"));
}

}  // namespace detail

/// Parses and validates the header of a safetensors file held in `bytes` (the whole file).
/// Every inconsistency is an io_error naming `file` and, where there is one, the tensor:
/// a header length beyond the file or above 100 MB, JSON that is not an object or not
/// UTF-8, duplicate names, unknown dtypes, bad shapes, offsets that overlap, leave gaps, are
/// out of order or end before/after the file, a span whose size is not numel * dtype size.
inline safetensors_header parse_safetensors_header(std::span<const std::byte> bytes, std::string_view file) {
  std::uint64_t n = 0;
  const nlohmann::json h = detail::safetensors_header_json(bytes, file, n);
  safetensors_header out;
  out.data_start = 8 + n;
  out.data_size = bytes.size() - out.data_start;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__")
      detail::parse_safetensors_metadata(it.value(), file, out.metadata);
    else
      out.entries.push_back(detail::parse_safetensors_entry(it.key(), it.value(), file));
  }
  detail::check_safetensors_layout(out, file);
  return out;
}

/// A read-only memory-mapped safetensors file, validated on open. Move-only.
/// Views point into the map: they live as long as the file object. Their data may be
/// unaligned when another writer did not sort by dtype; host_tensor::copy_of aligns.
class safetensors_file {
 public:
  explicit safetensors_file(const std::filesystem::path& path) : path_(path) {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw io_error(detail::sys_error("cannot open", path));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      throw io_error(detail::sys_error("cannot stat", path));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw io_error("cannot open " + quoted_path(path.string()) + ": not a regular file (a directory, FIFO or device)");
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        throw io_error(detail::sys_error("cannot mmap", path));
      }
      map_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);
    try {
      header_ = parse_safetensors_header({map_, size_}, path.string());
    } catch (...) {
      unmap();
      throw;
    }
    for (std::size_t i = 0; i < header_.entries.size(); ++i) index_[header_.entries[i].name] = i;
  }
  safetensors_file(safetensors_file&& o) noexcept
      : path_(std::move(o.path_)), map_(std::exchange(o.map_, nullptr)), size_(std::exchange(o.size_, 0)),
        header_(std::move(o.header_)), index_(std::move(o.index_)) {}
  safetensors_file& operator=(safetensors_file&& o) noexcept {
    if (this != &o) {
      unmap();
      path_ = std::move(o.path_);
      map_ = std::exchange(o.map_, nullptr);
      size_ = std::exchange(o.size_, 0);
      header_ = std::move(o.header_);
      index_ = std::move(o.index_);
    }
    return *this;
  }
  safetensors_file(const safetensors_file&) = delete;
  safetensors_file& operator=(const safetensors_file&) = delete;
  ~safetensors_file() { unmap(); }

  const std::filesystem::path& path() const noexcept { return path_; }
  /// Tensors in data order.
  const std::vector<safetensors_entry>& entries() const noexcept { return header_.entries; }
  const std::map<std::string, std::string>& metadata() const noexcept { return header_.metadata; }
  std::size_t file_size() const noexcept { return size_; }
  const safetensors_entry* find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : &header_.entries[it->second];
  }
  const safetensors_entry& entry(std::string_view name) const {
    if (const auto* e = find(name)) return *e;
    throw io_error("safetensors file " + quoted_path(path_.string()) + " has no tensor " + quoted_text(name));
  }
  /// The bytes of a tensor, in the map.
  std::span<const std::byte> bytes(const safetensors_entry& e) const noexcept {
    return {map_ + header_.data_start + e.begin, static_cast<std::size_t>(e.nbytes())};
  }
  const_tensor_view view(const safetensors_entry& e) const noexcept {
    return {map_ + header_.data_start + e.begin, e.shape, e.type};
  }
  const_tensor_view view(std::string_view name) const { return view(entry(name)); }
  /// Runs f, which reads this file's map: a SIGBUS (the file truncated by another program
  /// after it was mapped) becomes an io_error naming the file, and so does a failed write
  /// from the map (EFAULT) once the file is found shorter. f must not own what it allocates:
  /// the jump out of it runs no destructors (copy into buffers owned outside it).
  template <class F>
  void read_guarded(F&& f) const {
    detail::install_sigbus_handler();
    bool done = false;
    try {
      done = detail::call_sigbus_guarded(f);
    } catch (const io_error&) {
      detail::armed_sigbus_guard = nullptr;
      if (!shrunk()) throw;
    } catch (...) {
      detail::armed_sigbus_guard = nullptr;
      throw;
    }
    if (!done)
      throw io_error("safetensors file " + quoted_path(path_.string()) + " changed while it was read: it is " + current_size() +
                     " now, " + std::to_string(size_) + " bytes when it was opened (truncated by another program?)");
  }
  /// An aligned, owned copy of a tensor.
  host_tensor load(std::string_view name) const { return host_tensor::copy_of(view(name)); }
  /// Drops the tensor's pages from this process (they stay in the page cache): keeps the
  /// resident set near one tensor while streaming a whole checkpoint.
  void release(const safetensors_entry& e) const noexcept {
    if (!map_ || e.nbytes() == 0) return;
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    std::size_t lo = static_cast<std::size_t>(header_.data_start + e.begin) / page * page;
    std::size_t hi = static_cast<std::size_t>(header_.data_start + e.end);
    ::madvise(const_cast<std::byte*>(map_) + lo, hi - lo, MADV_DONTNEED);
  }

 private:
  void unmap() noexcept {
    if (map_) ::munmap(const_cast<std::byte*>(map_), size_);
    map_ = nullptr;
  }
  bool shrunk() const {
    struct stat st {};
    return ::stat(path_.c_str(), &st) != 0 || static_cast<std::size_t>(st.st_size) < size_;
  }
  std::string current_size() const {
    struct stat st {};
    return ::stat(path_.c_str(), &st) != 0 ? std::string("gone") : std::to_string(st.st_size) + " bytes";
  }
  std::filesystem::path path_;
  const std::byte* map_ = nullptr;
  std::size_t size_ = 0;
  safetensors_header header_;
  std::map<std::string, std::size_t> index_;
};

/// What a writer is told up front about one tensor.
struct safetensors_tensor_info {
  std::string name;
  dtype type = dtype::f32;
  tensor_shape shape;
};

/// Lays out a file as Hugging Face does: tensors sorted by dtype (widest-ranked first) then
/// name, offsets back to back, compact JSON with __metadata__ first, padded with spaces.
/// Returns the header bytes (length prefix included) and the entries in data order.
inline std::pair<std::string, std::vector<safetensors_entry>> make_safetensors_header(
    std::vector<safetensors_tensor_info> tensors, const std::map<std::string, std::string>& metadata) {
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    int ra = detail::hf_dtype_rank(a.type), rb = detail::hf_dtype_rank(b.type);
    return ra != rb ? ra > rb : a.name < b.name;
  });
  std::vector<safetensors_entry> entries;
  std::set<std::string_view> names;
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":";
    try {
      json += nlohmann::json(metadata).dump();
    } catch (const nlohmann::json::exception&) {
      throw io_error("cannot write __metadata__: a key or value is not valid UTF-8");
    }
  }
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__" || !names.insert(t.name).second)
      throw io_error("cannot write tensor " + quoted_text(t.name) + ": the name is reserved or used twice");
    safetensors_entry e{t.name, t.type, t.shape, at, at + static_cast<std::uint64_t>(t.shape.numel()) * dtype_size(t.type)};
    at = e.end;
    if (json.size() > 1) json += ",";
    std::string quoted;
    try {
      quoted = nlohmann::json(t.name).dump();
    } catch (const nlohmann::json::exception&) {
      throw io_error("cannot write tensor " + quoted_text(t.name) + ": the name is not valid UTF-8");
    }
    json += quoted + ":{\"dtype\":\"" + std::string(safetensors_name(t.type)) + "\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.rank; ++i) json += (i ? "," : "") + std::to_string(t.shape[i]);
    json += "],\"data_offsets\":[" + std::to_string(e.begin) + "," + std::to_string(e.end) + "]}";
    entries.push_back(std::move(e));
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  detail::write_le64(json.size(), out.data());
  return {out + json, std::move(entries)};
}

/// Streams one safetensors file: the header first, then each tensor's bytes in data order
/// (entries()), each call checked against the header. commit() publishes it atomically.
class safetensors_writer {
 public:
  safetensors_writer(std::filesystem::path path, std::vector<safetensors_tensor_info> tensors,
                     const std::map<std::string, std::string>& metadata = {})
      : file_(path), path_(std::move(path)) {
    auto [header, entries] = make_safetensors_header(std::move(tensors), metadata);
    entries_ = std::move(entries);
    file_.write(header);
  }
  /// Tensors in the order their bytes must be written.
  const std::vector<safetensors_entry>& entries() const noexcept { return entries_; }
  /// The next tensor's bytes, possibly in several calls (a tensor is done at its size).
  void write(std::span<const std::byte> data) {
    while (!data.empty()) {
      if (next_ == entries_.size())
        throw io_error(quoted_path(path_.string()) + ": " + std::to_string(data.size()) + " bytes past the last tensor");
      const auto& e = entries_[next_];
      std::uint64_t take = std::min<std::uint64_t>(e.nbytes() - done_, data.size());
      file_.write(data.first(static_cast<std::size_t>(take)));
      data = data.subspan(static_cast<std::size_t>(take));
      done_ += take;
      advance();
    }
    advance();
  }
  void finish() {
    advance();
    if (next_ != entries_.size())
      throw io_error(quoted_path(path_.string()) + ": tensor " + quoted_text(entries_[next_].name) + " was not written");
    file_.finish();
  }
  void commit() {
    finish();
    file_.commit();
  }

 private:
  void advance() {
    while (next_ < entries_.size() && done_ == entries_[next_].nbytes()) {
      ++next_;
      done_ = 0;
    }
  }
  atomic_file file_;
  std::filesystem::path path_;
  std::vector<safetensors_entry> entries_;
  std::size_t next_ = 0;
  std::uint64_t done_ = 0;
};

/// Writes named tensors to one safetensors file (atomically: temporary name, fsync, rename).
inline void save_safetensors(const std::filesystem::path& path,
                             const std::vector<std::pair<std::string, const_tensor_view>>& tensors,
                             const std::map<std::string, std::string>& metadata = {}) {
  std::vector<safetensors_tensor_info> infos;
  std::map<std::string, const_tensor_view> by_name;
  for (const auto& [name, v] : tensors) {
    infos.push_back({name, v.type(), v.shape()});
    by_name.emplace(name, v);
  }
  safetensors_writer w(path, std::move(infos), metadata);
  for (const auto& e : w.entries()) w.write(by_name.at(e.name).bytes());
  w.commit();
}

/// Mappings kept for everything but a checkpoint's files: the allocator maps its large blocks
/// and every thread's stack and arena, and fails with them (std::bad_alloc) past the limit.
inline constexpr std::uint64_t mappings_kept_free = 1024;

/// Refuses opening `files` safetensors files at once (each kept mapped while its checkpoint is
/// open) when this process may not map that many more and keep mappings_kept_free: an index
/// naming 70,000 files mapped 65,000 of them, then ended in "out of memory (an allocation failed
/// while another was being undone)", naming neither the file nor the limit. `what` names the
/// list ("index '…/model.safetensors.index.json'"); `maps_left` is machine_limits::maps_left().
inline void check_mappable_files(std::uint64_t files, const std::string& what, std::uint64_t maps_left = machine_limits::maps_left()) {
  if (maps_left == machine_limits::unlimited || files + mappings_kept_free <= maps_left) return;
  const std::uint64_t may = maps_left > mappings_kept_free ? maps_left - mappings_kept_free : 0;
  throw resource_error(what + " names " + std::to_string(files) + " safetensors files, each kept mapped while the checkpoint is open, " +
                       "but this process may map " + std::to_string(may) + " more (vm.max_map_count less the mappings it has and " +
                       std::to_string(mappings_kept_free) + " kept for its allocations): merge the files, or raise vm.max_map_count (sysctl)");
}

/// The checkpoint file of Hugging Face directory `dir`: model.safetensors.index.json, else
/// model.safetensors, or nullopt when neither is there. Present as anything, a link that leads
/// nowhere or loops included: it is opened, and its error names it ("cannot open
/// '…/model.safetensors': Too many levels of symbolic links"), where `exists` (which follows
/// links) threw the file system's bare words or said there was no checkpoint.
inline std::optional<std::filesystem::path> checkpoint_file_in(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  for (const char* name : {"model.safetensors.index.json", "model.safetensors"}) {
    std::error_code ec;
    if (fs::exists(fs::symlink_status(dir / name, ec))) return dir / name;
  }
  return std::nullopt;
}

/// A checkpoint: one safetensors file, or several joined by model.safetensors.index.json
/// (Hugging Face's {"weight_map": {tensor: file}}). Opening validates every file and the map.
///   autoshard::checkpoint ck("llama-dir");   // dir, index json, or single file
class checkpoint {
 public:
  explicit checkpoint(const std::filesystem::path& where) {
    namespace fs = std::filesystem;
    fs::path p = where;
    if (fs::is_directory(p)) {
      const std::optional<fs::path> file = checkpoint_file_in(p);
      if (!file) throw io_error("directory " + quoted_path(where.string()) + " has neither model.safetensors nor its index");
      p = *file;
    }
    if (p.extension() == ".json") open_index(p);
    else {
      files_.emplace_back(p);
      for (const auto& e : files_.back().entries()) map_[e.name] = {0, &e};
    }
  }
  checkpoint(checkpoint&&) = default;
  checkpoint& operator=(checkpoint&&) = default;

  struct ref {
    std::size_t file = 0;
    const safetensors_entry* entry = nullptr;
  };
  /// Tensor names, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (const auto& [k, v] : map_) n.push_back(k);
    return n;
  }
  std::size_t size() const noexcept { return map_.size(); }
  bool contains(std::string_view name) const { return map_.count(std::string(name)) != 0; }
  const safetensors_entry& entry(std::string_view name) const { return *at(name).entry; }
  const safetensors_file& file_of(std::string_view name) const { return files_[at(name).file]; }
  const_tensor_view view(std::string_view name) const { return file_of(name).view(entry(name)); }
  const std::vector<safetensors_file>& files() const noexcept { return files_; }
  /// __metadata__ of the first file.
  const std::map<std::string, std::string>& metadata() const { return files_.front().metadata(); }

 private:
  const ref& at(std::string_view name) const {
    auto it = map_.find(std::string(name));
    if (it == map_.end()) throw io_error("checkpoint has no tensor " + quoted_text(name));
    return it->second;
  }
  void open_index(const std::filesystem::path& index) {
    nlohmann::json j;
    {
      // A regular file (a FIFO would block, a directory reads as an error), read up to a bound:
      // Hugging Face's indexes are kilobytes; 256 MiB is far beyond any, and no more is read.
      const std::string text = read_regular_file(index.string(), "index", std::uint64_t{256} << 20);
      j = parse_json_text(text, "index " + quoted_path(index.string()));
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw io_error("index " + quoted_path(index.string()) + " has no weight_map object");
    if (j["weight_map"].empty())
      throw io_error("index " + quoted_path(index.string()) + " has an empty weight_map: it names no tensor and no file");
    std::map<std::string, std::size_t> file_ids;
    std::vector<std::string> file_names;  // in the order the weight_map first names them
    std::vector<std::pair<std::string, std::string>> wanted;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        throw io_error("index " + quoted_path(index.string()) + ": weight_map entry " + quoted_text(it.key()) + " is not a file name");
      const std::string fname = it.value().get<std::string>();
      if (!is_plain_file_name(fname))
        throw io_error("index " + quoted_path(index.string()) + ": file " + quoted_path(fname) + " of tensor " + quoted_text(it.key()) +
                       " is not a plain file name");
      if (file_ids.emplace(fname, file_names.size()).second) file_names.push_back(fname);
      wanted.emplace_back(it.key(), fname);
    }
    check_mappable_files(file_names.size(), "index " + quoted_path(index.string()));  // before any is mapped
    for (const std::string& fname : file_names) files_.emplace_back(index.parent_path() / fname);
    for (const auto& [name, fname] : wanted) {
      std::size_t id = file_ids[fname];
      const auto* e = files_[id].find(name);
      if (!e)
        throw io_error("index " + quoted_path(index.string()) + " maps tensor " + quoted_text(name) + " to " + quoted_path(fname) +
                       ", which does not hold it");
      map_[name] = {id, e};
    }
    // A tensor the index does not list would be dropped without a word by every reader, and
    // one that two files hold would be taken from whichever the weight_map names.
    for (std::size_t id = 0; id < files_.size(); ++id)
      for (const auto& e : files_[id].entries()) {
        const auto it = map_.find(e.name);
        if (it == map_.end())
          throw io_error("index " + quoted_path(index.string()) + ": file " + quoted_path(files_[id].path().filename().string()) +
                         " holds tensor " + quoted_text(e.name) + ", which the weight_map does not list (an incomplete index)");
        if (it->second.file != id)
          throw io_error("index " + quoted_path(index.string()) + ": tensor " + quoted_text(e.name) + " is in two files, " +
                         quoted_path(files_[it->second.file].path().filename().string()) + " (the weight_map's) and " +
                         quoted_path(files_[id].path().filename().string()) + ": which one holds the weights is ambiguous");
      }
  }
  std::vector<safetensors_file> files_;
  std::map<std::string, ref> map_;
};

}  // namespace autoshard

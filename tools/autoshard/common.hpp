#pragma once
// Shared pieces of the autoshard tool: mesh and shape options, exit codes, JSON output.
#include <autoshard/autoshard.hpp>
#include <autoshard/io/atomic_file.hpp>
#include <autoshard/io/json.hpp>
#include <autoshard/io/mesh_json.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <regex>
#include <spawn.h>     // posix_spawnp: programs run without a shell
#include <sys/wait.h>  // waitpid
#include <fcntl.h>     // O_WRONLY
#include <unistd.h>    // environ
#include <cerrno>
#include <filesystem>
#include <initializer_list>
#include <iomanip>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace autoshard::tool {

/// Exit codes: 0 success, 1 user error (one clear message on stderr), 2 usage error, 3 a plan
/// was made and written but does not fit the device's memory (`plan` under no budget or one
/// above the device's).
inline constexpr int exit_ok = 0;
inline constexpr int exit_user_error = 1;
inline constexpr int exit_usage = 2;
inline constexpr int exit_does_not_fit = 3;

/// The most ranks a picture or table for people names, one by one: `show`'s block map (in the
/// terminal or as SVG) and `explain`'s per-rank table. A 64x64 mesh's 4,096 are already more
/// than a reader takes in; the largest mesh a flag may give has 2^20. --json (for programs)
/// lists every rank.
inline constexpr int max_drawn_ranks = 4096;

/// A CLI11 check for a size flag: an int in [1, 2^31-1]. "0" or "-1" is a usage error
/// ("--layers: Value 0 not in range 1 to 2147483647"), never a silent fall back to a default.
inline CLI::Range positive_int() { return CLI::Range(1, std::numeric_limits<int>::max()); }

/// Whether `in` is written as a decimal number (digits, a point, an exponent, signs): strtod
/// also reads hexadecimal ("0x10", "0x1p3") and skips leading white space, which the integer
/// flags refuse ("0x2 is not a decimal integer").
inline bool decimal_number_text(const std::string& in) {
  return !in.empty() && in.find_first_not_of("0123456789.eE+-") == std::string::npos;
}

/// A CLI11 check for a real-valued flag: a finite decimal number in [lo, hi] (or (lo, hi]
/// when `open_low`). "nan", "inf", "1e400", "0x10", " 5" and numbers outside are usage errors
/// naming the range, e.g. "--mip-rel-gap: inf is not a finite number in [0, 1]".
inline CLI::Validator finite_in(double lo, double hi, bool open_low = false) {
  auto show = [](double v) {
    std::ostringstream s;
    s << v;
    return s.str();
  };
  const std::string range = (open_low ? "(" : "[") + show(lo) + ", " + show(hi) + "]";
  return CLI::Validator(
      [=](std::string& in) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = std::strtod(in.c_str(), &end);
        // ERANGE is also strtod's word for a number it rounds to a subnormal or to 0 ("4.9e-324",
        // "1e-400"): such a number is that close to 0, not out of range ("--time-limit: 4.9e-324
        // is not a finite number in (0, 1e+07]" refused a finite number inside it). Beyond the
        // largest double strtod gives infinity, which stays refused.
        const bool underflow = errno == ERANGE && std::fabs(v) <= std::numeric_limits<double>::min();
        const bool parsed = decimal_number_text(in) && end != in.c_str() && *end == '\0' && (errno != ERANGE || underflow);
        if (!parsed || !std::isfinite(v) || v < lo || v > hi || (open_low && v == lo))
          return in + " is not a finite number in " + range + (parsed && underflow ? " (it rounds to " + show(v) + ")" : "");
        return {};
      },
      "FINITE in " + range);
}

/// A CLI11 check for a whole number in [0, max], decimal digits only, named `noun` in the
/// message ("-1 is not a seed (an integer in [0, 4294967295])").
inline CLI::Validator whole_in(unsigned long long max, const std::string& noun, const std::string& desc) {
  return CLI::Validator(
      [max, noun](std::string& in) -> std::string {
        errno = 0;
        char* end = nullptr;
        const bool digits = !in.empty() && in.find_first_not_of("0123456789") == std::string::npos;
        const unsigned long long v = std::strtoull(in.c_str(), &end, 10);
        if (!digits || errno == ERANGE || v > max)
          return in + " is not " + noun + " (an integer in [0, " + std::to_string(max) + "])";
        return {};
      },
      desc);
}

/// A CLI11 check for a seed: decimal digits only, at most `max` ("-1" used to wrap to 2^64-1;
/// solve's seed, an unsigned, took "-1" or 2^32 as "Could not convert: --seed = -1").
inline CLI::Validator seed_value(unsigned long long max = std::numeric_limits<unsigned long long>::max()) {
  return whole_in(max, "a seed", "SEED");
}

/// Mesh and link options shared by every subcommand that prices communication; the defaults
/// are the library's (core/mesh.hpp: default_mesh_shape, cluster_links). Axis 0 crosses nodes
/// (inter-node link) on meshes of 2+ axes; the other axes stay inside a node. A 1-D mesh is
/// one node.
struct mesh_options {
  static constexpr double unset = std::numeric_limits<double>::quiet_NaN();
  std::string mesh = shape_text(device_mesh(std::vector<int>(default_mesh_shape.begin(), default_mesh_shape.end())));  // "2x4"
  /// Latencies and hops start as NaN, "not given": the backend's then (cluster_links' < 0).
  cluster_links links{.inter_node_latency = unset, .intra_node_latency = unset, .inter_node_hop = unset,
                      .intra_node_hop = unset};
  CLI::Option* inter_bw = nullptr;  ///< to know whether they were given
  CLI::Option* intra_bw = nullptr;

  /// --mesh, and with `links` the link options (a command that prices nothing, such as
  /// `show`, takes the mesh's shape only: an option that changes nothing is not offered).
  void add_to(CLI::App& cmd, bool with_links = true) {
    cmd.add_option("--mesh", mesh, "mesh shape, e.g. 2x4, or dp=2,tp=4 to name the axes (1 to 4 axes)")->capture_default_str();
    if (!with_links) return;
    // NaN, infinite, zero or negative links used to price every step as "nan s" or fall back to
    // the default without a word: refused as usage errors.
    // The ranges are the library's (core/mesh.hpp max_link_*), so the flag and the library
    // never disagree (`--intra-hop 2` passed the flag's [0, 3600] and then failed in the library).
    inter_bw = cmd.add_option("--inter-bw", links.inter_node_bandwidth, "inter-node bandwidth of mesh axis 0, bytes/s")
        ->capture_default_str()
        ->check(finite_in(min_link_bandwidth, max_link_bandwidth));
    intra_bw = cmd.add_option("--intra-bw", links.intra_node_bandwidth, "intra-node bandwidth of the other axes, bytes/s")
        ->capture_default_str()
        ->check(finite_in(min_link_bandwidth, max_link_bandwidth));
    cmd.add_option("--inter-lat", links.inter_node_latency, "inter-node latency, seconds (default: the backend's, nccl 2e-5)")
        ->check(finite_in(0, max_link_latency_s));
    cmd.add_option("--intra-lat", links.intra_node_latency, "intra-node latency, seconds (default: the backend's, nccl 5e-6)")
        ->check(finite_in(0, max_link_latency_s));
    cmd.add_option("--inter-hop", links.inter_node_hop, "inter-node latency per ring step, seconds (default: the backend's, nccl 2.7e-6)")
        ->check(finite_in(0, max_link_hop_s));
    cmd.add_option("--intra-hop", links.intra_node_hop, "intra-node latency per ring step, seconds (default: the backend's, nccl 6e-7)")
        ->check(finite_in(0, max_link_hop_s));
  }
  /// The first link option given on the command line, or nullptr.
  const char* given_link_flag() const {
    if (inter_bw && inter_bw->count() > 0) return "--inter-bw";
    if (intra_bw && intra_bw->count() > 0) return "--intra-bw";
    for (auto [value, flag] : {std::pair{links.inter_node_latency, "--inter-lat"}, std::pair{links.intra_node_latency, "--intra-lat"},
                               std::pair{links.inter_node_hop, "--inter-hop"}, std::pair{links.intra_node_hop, "--intra-hop"}})
      if (!std::isnan(value)) return flag;
    return nullptr;
  }
  /// Other defaults for the bandwidths (a device preset's), where --inter-bw / --intra-bw were not given.
  void default_bandwidths(double inter, double intra) {
    if (inter_bw && inter_bw->count() == 0) links.inter_node_bandwidth = inter;
    if (intra_bw && intra_bw->count() == 0) links.intra_node_bandwidth = intra;
  }
  /// The mesh --mesh names (parsed once: its sizes and axis names, dp=2,tp=4) with these links;
  /// `backend` ("nccl" or "gloo") supplies the default latencies.
  device_mesh build(std::string_view backend = "nccl") const {
    cluster_links c = links;
    c.communications_backend = backend;
    for (auto [value, flag] : {std::pair{&c.inter_node_latency, "--inter-lat"}, std::pair{&c.intra_node_latency, "--intra-lat"},
                               std::pair{&c.inter_node_hop, "--inter-hop"}, std::pair{&c.intra_node_hop, "--intra-hop"}}) {
      if (std::isnan(*value)) *value = -1;  // not given
      else if (!(*value >= 0)) throw spec_error(std::string(flag) + " must be >= 0 seconds, got " + std::to_string(*value));
    }
    return with_cluster_links(parse_mesh(mesh), c);
  }
};

/// What parse_shape_list reads: a shape's dims (`--shape`), or `--slice`'s indices.
struct shape_list_words {
  const char* list = "shape";      ///< how a message names the text
  const char* item = "a dim size";  ///< and each number in it
  const char* items = "dims";
  const char* example = "8,4";
};

/// "8,4" or "[8,4]" -> tensor_shape.
inline tensor_shape parse_shape_list(std::string s, const shape_list_words& w = {}) {
  if (!s.empty() && s.front() == '[') s.erase(0, 1);
  if (!s.empty() && s.back() == ']') s.pop_back();
  std::vector<std::int64_t> dims;
  std::size_t i = 0;
  const std::string what = std::string(w.list) + " " + quoted_text(s) + ": ";
  while (i <= s.size()) {
    std::size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    while (!tok.empty() && tok.front() == ' ') tok.erase(0, 1);
    while (!tok.empty() && tok.back() == ' ') tok.pop_back();
    if (tok.empty() || tok.find_first_not_of("0123456789") != std::string::npos)
      throw shape_error(what + quoted_text(tok) + " is not " + std::string(w.item) + " (write e.g. " + w.example + ")");
    if (tok.find_first_not_of('0') != std::string::npos && tok.size() - tok.find_first_not_of('0') > 15)
      throw shape_error(what + quoted_text(tok) + " has more than 15 digits: " + std::string(w.item) + " is at most 999999999999999 (10^15 - 1)");
    dims.push_back(std::stoll(tok));
    i = j + 1;
  }
  if (dims.size() > max_tensor_rank) throw shape_error(what + "at most 8 " + w.items);
  return tensor_shape(dims);
}

inline dtype parse_dtype_or_throw(const std::string& s) {
  auto t = parse_dtype(s);
  if (!t) throw spec_error("unknown dtype " + quoted_text(s) + " (f32, f16, bf16, f64, i32, i64, u8)");
  return *t;
}

inline nlohmann::json to_json(const tensor_shape& s) { return s.to_vector(); }
/// The mesh as every file spells it (io/mesh_json.hpp), plus its shape for readers' convenience.
inline nlohmann::json to_json(const device_mesh& m) {
  nlohmann::json j = mesh_to_json(m);
  j["shape"] = m.shape();
  return j;
}

/// Runs a program found on PATH with exactly these arguments, without a shell (no quoting,
/// no expansion: a path with a quote or a `$(...)` is just a path), its stderr discarded and
/// its stdout too, or written to `out_fd` (an atomic_file's temporary: atomic_file::fd()).
/// Returns its exit status, or -1 when it could not be started or was killed.
inline int run_program(const std::vector<std::string>& argv, int out_fd = -1) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  if (posix_spawn_file_actions_init(&fa) != 0) return -1;
  if (out_fd >= 0) posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
  else posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), ::environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// "16GiB", "512MiB", "8e9" -> the bytes it says, unrounded; nullopt when it is not a size.
inline std::optional<double> byte_count(const std::string& s) {
  static const std::regex re(R"(\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?\s*)");
  std::smatch m;
  if (!std::regex_match(s, m, re)) return std::nullopt;
  const double v = std::strtod(m[1].str().c_str(), nullptr);  // inf beyond double's range, refused by the callers
  const std::map<std::string, double> mult{{"", 1},       {"B", 1},          {"KB", 1e3},       {"MB", 1e6},
                                           {"GB", 1e9},   {"TB", 1e12},      {"KiB", 1024.0},   {"MiB", 1048576.0},
                                           {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  return v * mult.at(m[2].str());
}

/// Why `v` bytes is no count of bytes ("is 1.5 bytes, not a whole number of bytes"), "" when it
/// is whole: 1.5 was silently 1 byte, 0.1KiB 102.
inline std::string fractional_bytes(double v) {
  if (v == std::floor(v)) return {};
  std::ostringstream os;
  os << std::setprecision(12) << v;
  return "is " + os.str() + " bytes, not a whole number of bytes";
}

/// "16GiB", "512MiB", "8e9" -> bytes, a whole number in [1, 9e18]; `what` names the option in errors.
inline std::int64_t parse_bytes(const std::string& s, const std::string& what) {
  const std::optional<double> v = byte_count(s);
  if (!v) throw spec_error(what + " " + quoted_text(s) + " is not a size (e.g. 16GiB or 8e9)");
  if (!(*v >= 1 && *v <= 9e18)) throw spec_error(what + " " + quoted_text(s) + " is out of range (1 byte to 9e18)");
  if (const std::string f = fractional_bytes(*v); !f.empty()) throw spec_error(what + " " + quoted_text(s) + " " + f);
  return static_cast<std::int64_t>(*v);
}

/// CLI11 checks for a dtype and a byte size: a value that does not parse is a usage error
/// (exit 2) naming the option, as every malformed number is, not a user error after parsing.
inline CLI::Validator dtype_value(bool floating_only = false) {
  return CLI::Validator(
      [floating_only](std::string& in) -> std::string {
        const std::optional<dtype> t = parse_dtype(in);
        if (!t) return "unknown dtype " + quoted_text(in) + " (f32, f16, bf16, f64, i32, i64, u8)";
        if (floating_only && !is_floating(*t)) return quoted_text(in) + " is not a floating-point dtype (f32, f16, bf16, f64)";
        return {};
      },
      floating_only ? "FLOAT_DTYPE" : "DTYPE");
}
inline CLI::Validator byte_size() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        const std::optional<double> v = byte_count(in);
        if (!v || !(*v >= 1 && *v <= 9e18)) return quoted_text(in) + " is not a size from 1 byte to 9e18 (e.g. 16GiB, 512MiB or 8e9)";
        if (const std::string f = fractional_bytes(*v); !f.empty()) return quoted_text(in) + " " + f;
        return {};
      },
      "BYTES");
}

/// --follow-symlinks, on every command that writes files: an output path that is a symbolic
/// link is written through (the file it points to is replaced, only if it is a regular file
/// or absent); without it such an output is refused and nothing is written.
inline void add_follow_symlinks(CLI::App& cmd, bool& follow) {
  cmd.add_flag("--follow-symlinks", follow,
               "an output that is a symbolic link: write the file it points to (refused unless a regular file) "
               "instead of refusing");
}

/// A usage error (exit 2) naming the first of `names` that `cmd` was given: in the combination
/// its callback found, the option does nothing, and an option taken without a word promises
/// what the run does not do (`solve P --evaluate S --solution-out F` wrote no F, exit 0). `why`
/// says why it does nothing and what to do instead.
inline void refuse_given(const CLI::App& cmd, std::initializer_list<const char*> names, const std::string& why) {
  for (const char* name : names)
    if (cmd.get_option(name)->count() > 0) throw CLI::ValidationError(name, why);
}

// Subcommand registration: each returns the subcommand; `run` is set to its action.
using action = std::function<int()>;
void register_explain(CLI::App& app, action& run);
void register_show(CLI::App& app, action& run);
void register_plan(CLI::App& app, action& run);
void register_solve(CLI::App& app, action& run);
void register_shard(CLI::App& app, action& run);
void register_verify(CLI::App& app, action& run);
void register_calibrate(CLI::App& app, action& run);
void register_synth(CLI::App& app, action& run);
void register_export(CLI::App& app, action& run);
void register_completion(CLI::App& app, action& run);

}  // namespace autoshard::tool

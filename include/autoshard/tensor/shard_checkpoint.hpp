#pragma once
/// Sharding a safetensors checkpoint for N ranks, by tensor-parallel policy or by solved plan:
/// DIR/rank-<r>.safetensors (each rank's shards, replicated tensors whole) plus DIR/index.json
/// (which tensor went where: rule, spec, global shape, every rank's pieces and offsets).
/// Everything is validated before the output directory is touched; data streams from the
/// memory map one tensor at a time; every file is written under a temporary name, fsync'd
/// and renamed, so a failure never leaves a half file. Temporaries that a killed earlier run
/// left behind (`<file>.tmp.<pid>.<random>` of a pid that no longer exists) are removed by the next run.
///   autoshard::checkpoint in("gpt2/model.safetensors");
///   autoshard::shard_checkpoint(in, autoshard::policies::gpt2(), 4,
///                               autoshard::load_model_config("gpt2/config.json"), "out");
///   autoshard::sharded_checkpoint out("out");
///   autoshard::host_tensor w = out.gather("h.0.attn.c_attn.weight");   // bit for bit
#include <algorithm>    // std::none_of
#include <chrono>       // std::chrono::steady_clock
#include <cstdint>      // std::uint64_t
#include <cstdio>       // std::snprintf
#include <cstring>      // std::memcpy
#include <filesystem>   // std::filesystem
#include <functional>   // std::function
#include <map>          // std::map
#include <memory>       // std::unique_ptr
#include <optional>     // std::optional
#include <random>       // std::random_device
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <utility>      // std::exchange
#include <vector>       // std::vector

#include <nlohmann/json.hpp>  // index.json

#include "../core/error.hpp"  // io_error, resource_error
#include "../core/machine.hpp"  // machine_limits: the open-file limit, the memory left
#include "../core/mesh.hpp"   // check_mesh_size
#include "../core/parse.hpp"  // to_string(sharding_spec), parse_spec
#include "../io/atomic_file.hpp"  // atomic_file, remove_stale_temporaries, resolve_output_link
#include "../io/json.hpp"     // load_json_file, json_in
#include "../io/mesh_json.hpp"  // mesh_to_json: the index records the mesh
#include "host_tensor.hpp"    // host_tensor, convert_into
#include "policy.hpp"         // tp_policy, plan_policy, shards_of, tensor_shards
#include "safetensors.hpp"    // checkpoint, safetensors_writer
#include "slice.hpp"          // extract, insert, contiguous_span

namespace autoshard {

/// Reported after each tensor.
struct shard_progress {
  std::uint64_t bytes_done = 0;   ///< tensor bytes written so far, all ranks
  std::uint64_t bytes_total = 0;  ///< tensor bytes to write, all ranks
  double seconds = 0;
  double bytes_per_second = 0;
  std::string_view tensor;  ///< the tensor just written
};

struct shard_options {
  /// Convert float tensors (f32, f64, f16, bf16) to this dtype; others are kept as they are.
  std::optional<dtype> convert_to;
  std::function<void(const shard_progress&)> progress;
  /// Extra __metadata__ for every rank file.
  std::map<std::string, std::string> metadata;
  /// Require every numbered layer of the checkpoint ("h.0.", "h.1.", ...) to hold the same
  /// tensors, and (policy sharding) as many layers as the config's n_layer/num_hidden_layers:
  /// a missing tensor is an error instead of a silently smaller output. Off for models whose
  /// layers differ on purpose.
  bool check_layers = true;
  /// An output file (a rank file, index.json) that is a symbolic link: write the file it points
  /// to (replaced only if it is a regular file). Off: such an output is refused, as anything
  /// but a regular file is (io/atomic_file.hpp).
  bool follow_symlinks = false;
  /// Every tensor of the checkpoint must be planned (off: only the planned ones are written, as
  /// for a pipeline stage, which holds its layers' tensors only).
  bool every_tensor = true;
};

struct shard_report {
  int world_size = 0;
  std::uint64_t bytes_written = 0;  ///< tensor bytes, all ranks
  double seconds = 0;
  std::size_t largest_buffer = 0;   ///< the biggest staging copy made (bytes)
  std::map<std::string, std::int64_t> attributes;
  /// Stale temporaries of an earlier, killed run that were removed before writing, and rank
  /// files beyond this run's world size that an earlier run with more ranks left (removed after).
  std::vector<std::filesystem::path> removed_stale;
};

/// The file of rank r inside an output directory.
inline std::filesystem::path rank_file(const std::filesystem::path& dir, int r) {
  return dir / ("rank-" + std::to_string(r) + ".safetensors");
}

/// What a shard output's index.json says it is: "format" and the newest "version" this build
/// writes and reads (sharded_checkpoint refuses another format, and a newer version).
inline constexpr const char* shard_index_format = "autoshard-shards";
inline constexpr int shard_index_version = 3;

namespace detail {

inline nlohmann::json shape_json(const tensor_shape& s) { return s.to_vector(); }

/// A fresh generation id: 128 random bits in hex. Every file of one sharding run carries it.
inline std::string new_generation_id() {
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 4; ++i) {
    char buf[9];
    std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(rd()));
    id += buf;
  }
  return id;
}

/// Removes `dir/rank-<r>.safetensors` for r >= world: what an earlier run with more ranks left
/// beside a new, smaller output. Only a sharder's own rank file is removed: a regular file whose
/// safetensors header names a sharding run ("autoshard.generation" in its __metadata__), never
/// one of `keep` (the input's files, should one be named so). Any other file of such a name (a
/// user's checkpoint, a text file; they were deleted too) is left as it is. Returns the removed.
inline std::vector<std::filesystem::path> remove_extra_rank_files(const std::filesystem::path& dir, int world,
                                                                  const std::vector<std::filesystem::path>& keep) {
  namespace fs = std::filesystem;
  std::vector<fs::path> removed;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    const std::string pre = "rank-", post = ".safetensors";
    if (n.size() <= pre.size() + post.size() || n.compare(0, pre.size(), pre) != 0 ||
        n.compare(n.size() - post.size(), post.size(), post) != 0)
      continue;
    const std::string digits = n.substr(pre.size(), n.size() - pre.size() - post.size());
    if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code sec;
    if (std::stol(digits) < world || !fs::is_regular_file(it->symlink_status(sec))) continue;
    bool input = false;
    for (const auto& k : keep) input = input || fs::equivalent(k, it->path(), sec);
    if (input) continue;
    bool sharded = false;  // written by a sharding run?
    try {
      sharded = safetensors_file(it->path()).metadata().count("autoshard.generation") > 0;
    } catch (const io_error&) {
      // not a safetensors file (or unreadable): not ours to remove
    }
    if (!sharded) continue;
    std::error_code rec;
    if (fs::remove(it->path(), rec)) removed.push_back(it->path());
  }
  return removed;
}

inline dtype output_dtype(dtype in, const shard_options& o) {
  return o.convert_to && is_float(in) && is_float(*o.convert_to) ? *o.convert_to : in;
}

inline nlohmann::json index_json(const std::vector<tensor_shards>& plans, const device_mesh& mesh,
                                 const std::string& policy, const std::map<std::string, std::int64_t>& attrs,
                                 const shard_options& o, const std::string& generation) {
  nlohmann::json j;
  j["format"] = shard_index_format;
  j["version"] = shard_index_version;
  j["generation"] = generation;  // every rank file's __metadata__ "autoshard.generation"
  j["world_size"] = mesh.num_ranks();
  j["mesh"] = mesh_to_json(mesh, /*links=*/false);  // sizes and axis names: what the ranks are
  j["policy"] = policy;
  j["attributes"] = attrs;
  j["convert_to"] = o.convert_to ? nlohmann::json(std::string(to_string(*o.convert_to))) : nlohmann::json();
  for (int r = 0; r < mesh.num_ranks(); ++r) j["files"].push_back(rank_file("", r).string());
  nlohmann::json& ts = j["tensors"];
  ts = nlohmann::json::object();
  for (const auto& p : plans) {
    nlohmann::json t;
    t["dtype"] = std::string(safetensors_name(output_dtype(p.type, o)));
    t["source_dtype"] = std::string(safetensors_name(p.type));
    t["global_shape"] = shape_json(p.global);
    t["rule"] = p.rule;
    t["spec"] = to_string(p.spec);
    t["fused"] = p.fused;
    t["add_after_allreduce"] = p.add_after_allreduce;
    for (std::size_t r = 0; r < p.ranks.size(); ++r) {
      const auto& l = p.ranks[r];
      nlohmann::json s;
      s["rank"] = r;
      s["shape"] = shape_json(l.shape);
      s["concat_dim"] = l.concat_dim;
      for (const auto& pc : l.pieces)
        s["pieces"].push_back({{"offset", shape_json(pc.offset)}, {"shape", shape_json(pc.shape)}});
      t["shards"].push_back(std::move(s));
    }
    ts[p.name] = std::move(t);
  }
  return j;
}
}  // namespace detail

namespace detail {

/// Where output `p` is written: with opts.follow_symlinks, the file a symbolic link points to.
inline std::filesystem::path output_path(const std::filesystem::path& p, const shard_options& opts) {
  return opts.follow_symlinks ? resolve_output_link(p) : p;
}

/// The plans by tensor name, after checking everything before the output directory is touched:
/// each plan's tensor is in `in` with its shape and dtype and planned once, for `mesh`; every
/// tensor of `in` is planned (opts.every_tensor); `out_dir` is a directory or nothing yet; a
/// conversion is to a float dtype.
inline std::map<std::string, const tensor_shards*> check_shard_plans(const checkpoint& in, const std::vector<tensor_shards>& plans,
                                                                     const device_mesh& mesh, const std::filesystem::path& out_dir,
                                                                     const shard_options& opts) {
  namespace fs = std::filesystem;
  const int N = mesh.num_ranks();
  if (in.size() == 0) throw io_error("the checkpoint holds no tensor: nothing to shard");
  std::map<std::string, const tensor_shards*> by_name;
  for (const auto& p : plans) {
    if (!in.contains(p.name)) throw io_error("plan for tensor " + quoted_text(p.name) + ", which the checkpoint does not have");
    const auto& e = in.entry(p.name);
    if (!(e.shape == p.global) || e.type != p.type)
      throw shape_error("tensor " + quoted_text(p.name) + ": planned as " + to_string(p.global) + " " +
                        std::string(to_string(p.type)) + " but stored as " + to_string(e.shape) + " " +
                        std::string(to_string(e.type)));
    if (static_cast<int>(p.ranks.size()) != N || !(p.mesh == mesh))
      throw shape_error("tensor " + quoted_text(p.name) + ": planned for " + count_noun(p.ranks.size(), "rank") + ", not " +
                        std::to_string(N));
    if (!by_name.emplace(p.name, &p).second) throw io_error("tensor " + quoted_text(p.name) + " planned twice");
  }
  for (const auto& n : in.names())
    if (opts.every_tensor && !by_name.count(n)) throw io_error("tensor " + quoted_text(n) + " of the checkpoint has no plan");
  if (fs::exists(out_dir) && !fs::is_directory(out_dir))
    throw io_error("output " + quoted_path(out_dir.string()) + " exists and is not a directory");
  if (opts.convert_to && !is_float(*opts.convert_to))
    throw io_error("convert_to " + std::string(to_string(*opts.convert_to)) + ": only float dtypes are targets");
  return by_name;
}

/// The __metadata__ of every rank file of one run: the caller's, the input's "format", the
/// world size, the run's generation and the policy's name (when it has one).
inline std::map<std::string, std::string> rank_metadata(const checkpoint& in, const shard_options& opts, int world,
                                                        const std::string& generation, const std::string& policy_name) {
  std::map<std::string, std::string> meta = opts.metadata;
  if (in.files().front().metadata().count("format")) meta.emplace("format", in.files().front().metadata().at("format"));
  meta["autoshard.world_size"] = std::to_string(world);
  meta["autoshard.generation"] = generation;
  if (!policy_name.empty()) meta["autoshard.policy"] = policy_name;
  return meta;
}

/// A writer (under a temporary name) per rank of `plans` in `out_dir`: every tensor of `infos`
/// (names and output dtypes) at that rank's shard shape, and `meta` with the rank.
inline std::vector<std::unique_ptr<safetensors_writer>> open_rank_writers(const std::vector<tensor_shards>& plans,
                                                                          const std::vector<safetensors_tensor_info>& infos,
                                                                          const std::map<std::string, std::string>& meta,
                                                                          const std::filesystem::path& out_dir, int world,
                                                                          const shard_options& opts) {
  std::vector<std::unique_ptr<safetensors_writer>> writers;
  for (int r = 0; r < world; ++r) {
    auto rank_infos = infos;
    for (std::size_t i = 0; i < plans.size(); ++i) rank_infos[i].shape = plans[i].ranks[static_cast<std::size_t>(r)].shape;
    auto rank_meta = meta;
    rank_meta["autoshard.rank"] = std::to_string(r);
    writers.push_back(std::make_unique<safetensors_writer>(output_path(rank_file(out_dir, r), opts), std::move(rank_infos), rank_meta));
  }
  return writers;
}

/// The staging copies a run makes of shards that are not one contiguous span of their tensor,
/// or that change dtype (reused from tensor to tensor).
struct shard_staging {
  std::vector<std::byte> staging, converted;

  /// Rank r's shard of `p` from `src` (the tensor, stored as p.type), as bytes of dtype `to`:
  /// straight from the map when it is one span of it in its own dtype, else through the
  /// staging buffers (the largest copy recorded in `report`).
  std::span<const std::byte> shard_bytes(const_tensor_view src, const tensor_shards& p, int r, dtype to, shard_report& report) {
    const shard_layout& l = p.ranks[static_cast<std::size_t>(r)];
    std::span<const std::byte> out;
    auto span = contiguous_span(l, p.global, p.type);
    const std::size_t nb = static_cast<std::size_t>(l.shape.numel()) * dtype_size(p.type);
    if (span) {
      out = src.bytes().subspan(span->first, span->second);  // straight from the map
    } else {
      if (staging.size() < nb) staging.resize(nb);
      extract(src, l, tensor_view(staging.data(), l.shape, p.type));
      out = {staging.data(), nb};
      report.largest_buffer = std::max(report.largest_buffer, nb);
    }
    if (to != p.type) {
      const std::size_t cb = static_cast<std::size_t>(l.shape.numel()) * dtype_size(to);
      if (converted.size() < cb) converted.resize(cb);
      convert_into(out.data(), p.type, converted.data(), to, l.shape.numel());
      out = {converted.data(), cb};
      report.largest_buffer = std::max(report.largest_buffer, cb);
    }
    return out;
  }
};

/// Refuses a run whose memory does not fit what this process can still allocate, before
/// anything is made: the largest staging copy (a shard that is not one span of its tensor), the
/// largest conversion (a shard in another dtype) and the write buffers of `files` open files
/// (atomic_file: 64 MiB shared, 16 KiB to 1 MiB each); the input is mapped already. `shard
/// --dtype f64` of a 200 MB table under `ulimit -v 400000` ran out of memory with 120 MB
/// written (an empty directory left).
inline void check_shard_memory(const std::vector<tensor_shards>& plans, const shard_options& opts, std::uint64_t files) {
  std::uint64_t staging = 0, converted = 0;
  for (const auto& p : plans) {
    const dtype to = output_dtype(p.type, opts);
    for (const auto& l : p.ranks) {
      const auto n = static_cast<std::uint64_t>(l.shape.numel());
      if (!contiguous_span(l, p.global, p.type)) staging = std::max<std::uint64_t>(staging, n * dtype_size(p.type));
      if (to != p.type) converted = std::max<std::uint64_t>(converted, n * dtype_size(to));
    }
  }
  const std::uint64_t buffers = std::min(std::max(std::uint64_t{64} << 20, files * (std::uint64_t{16} << 10)), files << 20);
  const std::uint64_t heap = staging + converted + buffers;
  const machine_limits m = machine_limits::memory_here();
  if (heap <= m.memory()) return;
  throw resource_error("sharding holds about " + human_bytes(static_cast<double>(heap)) + " at once: a staging copy of " +
                       human_bytes(static_cast<double>(staging)) + " (the largest shard that is not one span of its tensor), " +
                       "a conversion of " + human_bytes(static_cast<double>(converted)) + " (the largest shard in another dtype) " +
                       "and write buffers of " + human_bytes(static_cast<double>(buffers)) + " for " + std::to_string(files) +
                       " files; but this process can allocate " + human_bytes(static_cast<double>(m.memory())) + " more (" +
                       m.memory_source() + (m.memory_limited() ? "): free memory or raise the limit" : "): free memory"));
}

/// Renames the finished rank files and then `index` (out_dir/index.json) into place. The old
/// index goes first: a run killed while renaming leaves no index (an incomplete directory every
/// reader refuses), never an old index over new rank files. Every rank file and the index carry
/// this run's generation, so any other mix is refused on reading too.
inline void commit_shard_files(std::vector<std::unique_ptr<safetensors_writer>>& writers, atomic_file& index) {
  namespace fs = std::filesystem;
  {
    std::error_code ec;
    if (fs::is_regular_file(fs::symlink_status(index.target(), ec))) fs::remove(index.target(), ec);
  }
  for (auto& w : writers) w->commit();
  index.commit();  // last: a directory with index.json is complete
}

}  // namespace detail

/// Refuses sharding onto `world` ranks when this process may not hold every rank file and the
/// index open at once (the open-file limit), before anything is sized by the ranks: a 65,536-rank
/// plan created 20,000 temporaries before "Too many open files" (ulimit -n 20000), and a 2^20-rank
/// plan built every rank's layout of every tensor first (17 s, then out of memory under
/// ulimit -v 4000000). Every shard_checkpoint overload checks it first (check_shard_count).
inline void check_rank_files(int world) {
  if (const std::uint64_t files = machine_limits::here().files; static_cast<std::uint64_t>(world) + 1 > files)
    throw resource_error("sharding onto " + count_noun(world, "rank") + " writes " + count_noun(world, "rank file") +
                         " and index.json at once, but the open-file limit (ulimit -n) lets this process open " +
                         std::to_string(files) + " more; raise it (ulimit -n " + std::to_string(static_cast<std::int64_t>(world) + 64) +
                         ") or shard onto fewer ranks");
}

/// What sharding holds for each shard (one tensor on one rank) besides its bytes: its layout,
/// its entry in index.json's tree and its text. Measured 1.8 to 2.1 KiB: a GPT-2 checkpoint of 16
/// tensors on 4,096 and 16,384 ranks held 140 MB for 65,536 shards and 560 MB for 262,144; one
/// of 40 tensors on 4,096 ranks, 295 MB for 163,840.
inline constexpr std::uint64_t shard_bookkeeping_bytes = 2560;
/// And for each rank file: its writer, its header and its path (measured about 5 KiB).
inline constexpr std::uint64_t rank_file_bookkeeping_bytes = 8192;

/// Refuses sharding `tensors` tensors onto `world` ranks when the open-file limit does not let
/// every rank file be open at once (check_rank_files), or when what sharding holds for its
/// tensors x world shards before a byte is written (shard_bookkeeping_bytes each, and
/// rank_file_bookkeeping_bytes a rank file) may not fit what this process can allocate: a
/// resource_error naming the shards, the files and both figures, before any layout is made.
/// With the open-file limit raised, a 2^20-rank plan of GPT-2 (about 150 tensors) had every
/// rank's layout of every tensor built, 157 million of them (some 300 GiB), with no estimate.
inline void check_shard_count(int world, std::size_t tensors) {
  check_rank_files(world);
  const auto ranks = static_cast<std::uint64_t>(world);
  const std::uint64_t shards = ranks * tensors;  // world <= 2^31, tensors < 2^32: no overflow
  const double need = static_cast<double>(shards) * static_cast<double>(shard_bookkeeping_bytes) +
                      static_cast<double>(ranks) * static_cast<double>(rank_file_bookkeeping_bytes);
  const machine_limits m = machine_limits::memory_here();
  if (need <= static_cast<double>(m.memory())) return;
  throw resource_error("sharding " + count_noun(tensors, "tensor") + " onto " + count_noun(world, "rank") + " makes " +
                       count_noun(shards, "shard") + " in " + count_noun(world, "rank file") + ", whose layouts and index take about " +
                       human_bytes(need) + " before a byte is written (" + human_bytes(static_cast<double>(shard_bookkeeping_bytes)) +
                       " a shard and " + human_bytes(static_cast<double>(rank_file_bookkeeping_bytes)) +
                       " a rank file); but this process can allocate " + human_bytes(static_cast<double>(m.memory())) + " more (" +
                       m.memory_source() + "): shard onto fewer ranks" +
                       (m.memory_limited() ? ", free memory or raise the limit" : " or free memory"));
}

/// index.json's text for one shard is at least this: its rank, shape and concat_dim, one
/// member on its own indented line, as index_json dumps it (a shard with one piece takes more).
inline constexpr std::uint64_t shard_index_min_bytes = 64;
/// And for each rank file, its name in "files" ("rank-0.safetensors", quoted, on its own line).
inline constexpr std::uint64_t rank_file_index_min_bytes = 24;

/// The least the output of sharding `tensors` (of `in`) onto `world` ranks takes on disk, known
/// before any layout is made: each tensor's bytes once in its output dtype (every element lands
/// on some rank; a replicated one on more) and index.json's text for each shard and rank file.
inline std::uint64_t shard_output_bytes_at_least(const checkpoint& in, const std::vector<std::string>& tensors, int world,
                                                 const shard_options& opts) {
  const auto ranks = static_cast<std::uint64_t>(world);
  std::uint64_t bytes = ranks * rank_file_index_min_bytes + ranks * tensors.size() * shard_index_min_bytes;
  for (const auto& n : tensors) {
    if (!in.contains(n)) continue;  // the plan's checks name it
    const auto& e = in.entry(n);
    bytes += static_cast<std::uint64_t>(e.shape.numel()) * dtype_size(detail::output_dtype(e.type, opts));
  }
  return bytes;
}

/// Refuses sharding `tensors` of `in` onto `world` ranks into `out_dir` when its file system has
/// less space available than the output takes at least (shard_output_bytes_at_least), before
/// any layout or the index is made: the free space was weighed only once every rank's layout of
/// every tensor and the whole index.json were built, which took the memory check's 2.5 KiB a
/// shard and the time for a job that could not be written. shard_checkpoint checks the exact
/// figure again once the layouts are known.
inline void check_shard_space(const checkpoint& in, const std::vector<std::string>& tensors, int world,
                              const std::filesystem::path& out_dir, const shard_options& opts) {
  const auto shards = static_cast<std::uint64_t>(world) * tensors.size();
  check_free_space(out_dir, shard_output_bytes_at_least(in, tensors, world, opts),
                   "the sharded checkpoint (at least its " + count_noun(tensors.size(), "tensor") + " once and index.json's " +
                       count_noun(shards, "shard entry", "shard entries") + ", in " + count_noun(world, "rank file") + ")");
}

class pending_shard_checkpoint;
inline pending_shard_checkpoint prepare_shard_checkpoint(const checkpoint& in, const std::vector<tensor_shards>& plans,
                                                         const device_mesh& mesh, const std::filesystem::path& out_dir,
                                                         const shard_options& opts = {}, const std::string& policy_name = "",
                                                         const std::map<std::string, std::int64_t>& attributes = {});

/// A sharded checkpoint written in full under temporary names in its directory but not yet in
/// place (prepare_shard_checkpoint): commit() renames it into place, as shard_checkpoint does at
/// its end. Destroyed uncommitted, it removes its temporaries (and the directories it made,
/// the output's and any missing above it, each when nothing else is there: made_directories):
/// the file system is as it was. A caller that writes several
/// outputs (a pipeline's stages) prepares every one before it commits any, so that a failure
/// in a later one leaves an earlier run's output whole. Each file is closed once written.
class pending_shard_checkpoint {
 public:
  pending_shard_checkpoint(pending_shard_checkpoint&& o) noexcept
      : out_dir_(std::move(o.out_dir_)), dirs_(std::move(o.dirs_)), t0_(o.t0_), writers_(std::move(o.writers_)),
        index_(std::move(o.index_)), inputs_(std::move(o.inputs_)), report_(std::move(o.report_)),
        committed_(std::exchange(o.committed_, true)) {}
  pending_shard_checkpoint& operator=(pending_shard_checkpoint&&) = delete;
  pending_shard_checkpoint(const pending_shard_checkpoint&) = delete;
  pending_shard_checkpoint& operator=(const pending_shard_checkpoint&) = delete;
  ~pending_shard_checkpoint() {
    if (committed_) return;
    writers_.clear();  // the temporaries first
    index_.reset();
    dirs_.remove();    // then the directories made, each only when empty
  }

  /// What was written (seconds: so far).
  const shard_report& report() const noexcept { return report_; }
  const std::filesystem::path& dir() const noexcept { return out_dir_; }

  /// Renames every rank file and then index.json into place, then removes the rank files an
  /// earlier run with more ranks left (never an input's). Once only.
  shard_report commit() {
    if (committed_) throw io_error("the sharded checkpoint in " + quoted_path(out_dir_.string()) + " was committed already");
    detail::commit_shard_files(writers_, *index_);
    committed_ = true;
    dirs_.keep();
    for (auto& p : detail::remove_extra_rank_files(out_dir_, report_.world_size, inputs_)) report_.removed_stale.push_back(std::move(p));
    report_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    return report_;
  }

 private:
  friend pending_shard_checkpoint prepare_shard_checkpoint(const checkpoint&, const std::vector<tensor_shards>&, const device_mesh&,
                                                           const std::filesystem::path&, const shard_options&, const std::string&,
                                                           const std::map<std::string, std::int64_t>&);
  pending_shard_checkpoint(std::filesystem::path dir, made_directories dirs, std::chrono::steady_clock::time_point t0)
      : out_dir_(std::move(dir)), dirs_(std::move(dirs)), t0_(t0) {}
  std::filesystem::path out_dir_;
  made_directories dirs_;
  std::chrono::steady_clock::time_point t0_;
  std::vector<std::unique_ptr<safetensors_writer>> writers_;
  std::unique_ptr<atomic_file> index_;
  std::vector<std::filesystem::path> inputs_;
  shard_report report_;
  bool committed_ = false;
};

/// Shards `in` by precomputed plans (one per tensor of `in`, all on `mesh`) into `out_dir`
/// under temporary names, every file finished: the output, not yet in place
/// (pending_shard_checkpoint). The general entry point; shard_checkpoint commits it at once.
inline pending_shard_checkpoint prepare_shard_checkpoint(const checkpoint& in, const std::vector<tensor_shards>& plans,
                                                         const device_mesh& mesh, const std::filesystem::path& out_dir,
                                                         const shard_options& opts, const std::string& policy_name,
                                                         const std::map<std::string, std::int64_t>& attributes) {
  namespace fs = std::filesystem;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const int N = mesh.num_ranks();
  check_shard_count(N, plans.size());  // before the index's tree is made of every shard
  // ---- validate everything before touching the output directory ----
  const std::map<std::string, const tensor_shards*> by_name = detail::check_shard_plans(in, plans, mesh, out_dir, opts);
  std::vector<safetensors_tensor_info> infos;
  std::uint64_t total = 0;
  for (const auto& p : plans) {
    infos.push_back({p.name, detail::output_dtype(p.type, opts), {}});
    for (const auto& l : p.ranks) total += static_cast<std::uint64_t>(l.shape.numel()) * dtype_size(infos.back().type);
  }
  // The layouts are known, the index not yet made: weigh the data and the index's least text.
  const std::string what = "the sharded checkpoint (" + count_noun(N, "rank file") + " and index.json)";
  check_free_space(out_dir, total + static_cast<std::uint64_t>(N) * (rank_file_index_min_bytes + plans.size() * shard_index_min_bytes), what);
  const std::string generation = detail::new_generation_id();
  const std::map<std::string, std::string> meta = detail::rank_metadata(in, opts, N, generation, policy_name);
  const std::string index_text = detail::index_json(plans, mesh, policy_name, attributes, opts, generation).dump(1);
  check_free_space(out_dir, total + index_text.size(), what);
  detail::check_shard_memory(plans, opts, static_cast<std::uint64_t>(N) + 1);

  // ---- write: temporary files, one tensor at a time from the map ----
  made_directories dirs;
  dirs.create(out_dir);
  pending_shard_checkpoint pending(out_dir, std::move(dirs), t0);
  std::vector<std::string> finals{"index.json"};
  for (int r = 0; r < N; ++r) finals.push_back(rank_file("", r).string());
  shard_report& report = pending.report_;
  report.world_size = N;
  report.attributes = attributes;
  report.removed_stale = remove_stale_temporaries(out_dir, finals);
  pending.writers_ = detail::open_rank_writers(plans, infos, meta, out_dir, N, opts);
  std::vector<std::unique_ptr<safetensors_writer>>& writers = pending.writers_;
  detail::shard_staging staging;
  for (const auto& e : writers.front()->entries()) {  // same order in every rank file
    const tensor_shards& p = *by_name.at(e.name);
    const auto& file = in.file_of(e.name);
    const auto& src_entry = in.entry(e.name);
    const_tensor_view src = file.view(src_entry);
    for (int r = 0; r < N; ++r) file.read_guarded([&] {  // truncated under us: an error naming it
      const std::span<const std::byte> out = staging.shard_bytes(src, p, r, e.type, report);
      writers[static_cast<std::size_t>(r)]->write(out);
      report.bytes_written += out.size();
    });
    file.release(src_entry);
    if (opts.progress) {
      const double s = std::chrono::duration<double>(clock::now() - t0).count();
      opts.progress({report.bytes_written, total, s, s > 0 ? static_cast<double>(report.bytes_written) / s : 0.0, e.name});
    }
  }
  for (auto& w : writers) w->finish();
  pending.index_ = std::make_unique<atomic_file>(detail::output_path(out_dir / "index.json", opts));
  pending.index_->write(index_text);
  pending.index_->finish();
  for (const auto& f : in.files()) pending.inputs_.push_back(f.path());
  report.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return pending;
}

/// Shards `in` by precomputed plans (one per tensor of `in`, all on `mesh`), the output put
/// in place at once (prepare_shard_checkpoint, then commit).
inline shard_report shard_checkpoint(const checkpoint& in, const std::vector<tensor_shards>& plans,
                                     const device_mesh& mesh, const std::filesystem::path& out_dir,
                                     const shard_options& opts = {}, const std::string& policy_name = "",
                                     const std::map<std::string, std::int64_t>& attributes = {}) {
  return prepare_shard_checkpoint(in, plans, mesh, out_dir, opts, policy_name, attributes).commit();
}

/// What shard_checkpoint checks of `in` before `policy` cuts it: the policy matches one of its
/// tensors at least (spec_error), and, with opts.check_layers, every numbered layer holds the
/// same tensors and a single stack has as many layers as `config`'s n_layer or
/// num_hidden_layers (io_error). A caller that checks more of the checkpoint (the tool: every
/// tensor against config.json) runs this first, for its more particular words.
inline void check_policy_fits(const checkpoint& in, const tp_policy& policy, const model_config& config, const shard_options& opts = {}) {
  const std::vector<std::string> names = in.names();
  if (!names.empty() && std::none_of(names.begin(), names.end(), [&](const std::string& n) { return policy.match(n); }))
    throw spec_error("policy " + quoted_text(policy.name) + " matches none of the checkpoint's " + count_noun(names.size(), "tensor") +
                     " (e.g. " + quoted_text(names.front()) + "): it is for another model; the config's model_type names "
                     "the policy that fits");
  if (opts.check_layers) {
    const auto stacks = check_layer_stacks(names, "the checkpoint");
    for (const char* key : {"n_layer", "num_hidden_layers"}) {
      auto it = config.find(key);
      if (it == config.end() || stacks.size() != 1) continue;
      if (stacks.begin()->second != it->second)
        throw io_error("the checkpoint has " + count_noun(stacks.begin()->second, "layer") + " (" +
                       quoted_text(stacks.begin()->first + "0..") + "), but its config says " + key + " = " +
                       std::to_string(it->second));
    }
  }
}

/// Shards by a tensor-parallel policy over `tp` ranks; `config` supplies heads and widths.
inline shard_report shard_checkpoint(const checkpoint& in, const tp_policy& policy, int tp, const model_config& config,
                                     const std::filesystem::path& out_dir, const shard_options& opts = {}) {
  check_mesh_size({tp}, "tensor-parallel size " + std::to_string(tp));  // before anything is sized by it
  check_shard_count(tp, in.size());
  const std::vector<std::string> names = in.names();
  check_shard_space(in, names, tp, out_dir, opts);  // before a layout is made
  auto attrs = rescale_attributes(policy, config, tp);
  check_policy_fits(in, policy, config, opts);
  std::vector<tensor_shards> plans;
  for (const auto& n : names) {
    const auto& e = in.entry(n);
    plans.push_back(shards_of(policy, n, e.shape, e.type, tp, config));
  }
  return shard_checkpoint(in, plans, device_mesh{tp}, out_dir, opts, policy.name, attrs);
}

namespace detail {
/// How each of `names` is cut by `plan`, after checking that every tensor it has a spec for is
/// in `in`.
inline std::vector<tensor_shards> plan_shards(const checkpoint& in, const plan_policy& plan, const std::vector<std::string>& names) {
  for (const auto& [n, s] : plan.specs)
    if (!in.contains(n)) throw io_error("plan has a spec for tensor " + quoted_text(n) + ", which the checkpoint does not have");
  std::vector<tensor_shards> out;
  for (const auto& n : names) {
    if (!in.contains(n)) throw io_error("tensor " + quoted_text(n) + " is not in the checkpoint");
    const auto& e = in.entry(n);
    out.push_back(shards_of(plan, n, e.shape, e.type));
  }
  return out;
}
}  // namespace detail

/// Shards by a solved plan (parameter name -> spec on the plan's mesh).
inline shard_report shard_checkpoint(const checkpoint& in, const plan_policy& plan, const std::filesystem::path& out_dir,
                                     const shard_options& opts = {}) {
  check_shard_count(plan.mesh.num_ranks(), in.size());
  const std::vector<std::string> names = in.names();
  check_shard_space(in, names, plan.mesh.num_ranks(), out_dir, opts);  // before a layout is made
  if (opts.check_layers) (void)check_layer_stacks(names, "the checkpoint");
  return shard_checkpoint(in, detail::plan_shards(in, plan, names), plan.mesh, out_dir, opts, "plan");
}

/// Shards the tensors `names` of `in` alone (a pipeline stage's) by a solved plan, not yet in
/// place: commit() puts it there.
inline pending_shard_checkpoint prepare_shard_checkpoint(const checkpoint& in, const plan_policy& plan, const std::vector<std::string>& names,
                                                         const std::filesystem::path& out_dir, shard_options opts = {}) {
  opts.every_tensor = false;
  check_shard_count(plan.mesh.num_ranks(), names.size());
  if (names.empty()) throw io_error("no tensor of the checkpoint is to be sharded");
  check_shard_space(in, names, plan.mesh.num_ranks(), out_dir, opts);  // before a layout is made
  return prepare_shard_checkpoint(in, detail::plan_shards(in, plan, names), plan.mesh, out_dir, opts, "plan");
}

/// Shards the tensors `names` of `in` alone (a pipeline stage's) by a solved plan.
inline shard_report shard_checkpoint(const checkpoint& in, const plan_policy& plan, const std::vector<std::string>& names,
                                     const std::filesystem::path& out_dir, const shard_options& opts = {}) {
  return prepare_shard_checkpoint(in, plan, names, out_dir, opts).commit();
}

/// A directory written by shard_checkpoint: its index and every rank file (validated).
class sharded_checkpoint {
 public:
  explicit sharded_checkpoint(const std::filesystem::path& dir) : dir_(dir) {
    const auto path = dir / "index.json";
    index_ = load_json_file(path.string(), "shard index");
    const json_in j = in();
    // Another tool's index, or one a newer autoshard wrote, is not read as this one.
    if (j.has("format")) (void)j["format"].one_of({shard_index_format});
    else j.fail("has no member \"format\" (\"" + std::string(shard_index_format) + "\"): it is not an autoshard shard index");
    if (j.has("version")) (void)j["version"].small_integer(1, shard_index_version);
    world_ = j["world_size"].small_integer(1, max_world_size);
    const json_in files = j["files"];
    if (files.size() != static_cast<std::size_t>(world_))
      files.fail("has " + count_noun(files.size(), "name") + " for a world of " + std::to_string(world_));
    check_mappable_files(files.size(), "shard index " + quoted_path(path.string()));  // before any is mapped
    for (int r = 0; r < world_; ++r) {
      const json_in name = files[static_cast<std::size_t>(r)];
      const std::string s = name.string();
      // Each rank file is in this directory: the index may not send the reader to another
      // file ("../x", "/etc/passwd"), which it would read as a rank when neither records a run.
      if (!is_plain_file_name(s)) name.fail("is " + quoted_text(s) + ", not a plain file name in " + quoted_path(dir.string()));
      files_.emplace_back(dir / s);
    }
    // One generation: a rank file of another sharding run (one killed while renaming, or an
    // older output the run replaced) disagrees with the index and is refused.
    const std::string gen = j.has("generation") ? j["generation"].string() : std::string();
    for (const auto& f : files_) {
      const auto it = f.metadata().find("autoshard.generation");
      const std::string fgen = it == f.metadata().end() ? "" : it->second;
      if (fgen != gen)
        throw io_error(quoted_path(f.path().string()) + " is of sharding run " + (fgen.empty() ? "(none)" : fgen) + " but " +
                       quoted_path(path.string()) + " of run " + (gen.empty() ? "(none)" : gen) +
                       ": the directory mixes the files of two runs (one was interrupted); shard again");
    }
    for (const auto& [name, t] : j["tensors"].members()) {
      names_.push_back(name);
      check_tensor(name);
    }
  }
  int world_size() const noexcept { return world_; }
  const std::vector<std::string>& names() const noexcept { return names_; }
  const nlohmann::json& index() const noexcept { return index_; }
  const safetensors_file& rank(int r) const { return files_.at(static_cast<std::size_t>(r)); }
  /// Rank r's shard of tensor `name`, in its file's map.
  const_tensor_view shard(int r, std::string_view name) const { return rank(r).view(name); }
  /// Where rank r's shard came from.
  shard_layout layout(const std::string& name, int r) const {
    const json_in s = tensor(name)["shards"][static_cast<std::size_t>(r)];
    shard_layout l;
    l.shape = shape_of(s["shape"]);
    l.concat_dim = s["concat_dim"].small_integer(-1, static_cast<int>(max_tensor_rank) - 1);
    for (const json_in& pc : s["pieces"].elements(max_pieces)) l.pieces.push_back({shape_of(pc["offset"]), shape_of(pc["shape"])});
    return l;
  }
  tensor_shape global_shape(const std::string& name) const { return shape_of(tensor(name)["global_shape"]); }
  bool add_after_allreduce(const std::string& name) const { return tensor(name)["add_after_allreduce"].boolean(); }
  /// Reassembles tensor `name` from every rank; replicated copies must agree bit for bit.
  host_tensor gather(const std::string& name) const {
    const tensor_shape g = global_shape(name);
    const_tensor_view s0 = shard(0, name);
    host_tensor out(s0.type(), g);
    for (int r = 0; r < world_; ++r) insert(shard(r, name), layout(name, r), out.view());
    for (int r = 0; r < world_; ++r) {
      shard_layout l = layout(name, r);
      host_tensor back = extract(out.view(), l);
      if (!bitwise_equal(back.view(), shard(r, name)))
        throw io_error("tensor " + quoted_text(name) + ": rank " + std::to_string(r) + "'s copy differs from the gathered tensor");
    }
    return out;
  }

 private:
  static constexpr int max_world_size = 1 << 20;
  static constexpr std::size_t max_pieces = std::size_t{1} << 20;
  json_in in() const { return json_in(index_, "shard index " + quoted_path((dir_ / "index.json").string())); }
  json_in tensor(const std::string& name) const { return in()["tensors"][name]; }
  /// Checks tensor `name`'s entry against itself and the rank files, so that gather copies
  /// inside both tensors and allocates no more than the files hold: its global shape has at
  /// most 2^63-1 elements (every prefix product); every rank's file holds the tensor at the
  /// layout's shape, with rank 0's dtype; each layout's concat_dim is a dim of the tensor, its
  /// pieces lie in the tensor and, concatenated along it, make the shard; and the pieces of all
  /// ranks hold at least every element. Before, the index was only type-checked: a global
  /// shape of 10^12 elements made gather allocate 4 TB, an offset of 2^63-1 overflowed, and a
  /// concat_dim of -1 indexed before the shape (seen reading it for fuzz_readers, which crashes on each).
  void check_tensor(const std::string& name) const {
    const json_in t = tensor(name);
    const tensor_shape g = global_shape(name);
    std::int64_t numel = 1;
    for (std::size_t d = 0; d < g.rank; ++d)
      if (__builtin_mul_overflow(numel, g[d], &numel))
        t["global_shape"].fail("is " + to_string(g) + ", more than 2^63-1 elements");
    const dtype type0 = files_.front().entry(name).type;
    std::int64_t held = 0;  // elements of the pieces of all ranks, up to numel
    for (int r = 0; r < world_; ++r) {
      const shard_layout l = layout(name, r);
      const json_in s = t["shards"][r];
      const safetensors_file& f = files_[static_cast<std::size_t>(r)];
      const safetensors_entry& e = f.entry(name);
      if (!(e.shape == l.shape) || e.type != type0)
        s["shape"].fail("is " + to_string(l.shape) + ", but " + quoted_path(f.path().string()) + " holds the tensor as " +
                        to_string(e.shape) + " " + std::string(to_string(e.type)) +
                        (e.type != type0 ? " (rank 0's is " + std::string(to_string(type0)) + ")" : std::string()));
      if (l.shape.rank != g.rank) s["shape"].fail("is " + to_string(l.shape) + ", not of the rank of global_shape " + to_string(g));
      if (l.concat_dim < 0 || l.concat_dim >= std::max(static_cast<int>(g.rank), 1))
        s["concat_dim"].fail("is " + std::to_string(l.concat_dim) + ", not a dim of global_shape " + to_string(g));
      const auto cd = static_cast<std::size_t>(l.concat_dim);
      tensor_shape made = l.shape;  // what the pieces make, along cd so far
      if (g.rank) made[cd] = 0;
      for (std::size_t i = 0; i < l.pieces.size(); ++i) {
        const shard_piece& p = l.pieces[i];
        const json_in pj = s["pieces"][i];
        bool inside = p.offset.rank == g.rank && p.shape.rank == g.rank;
        for (std::size_t d = 0; inside && d < g.rank; ++d) inside = p.offset[d] <= g[d] - p.shape[d];  // each in [0, 2^63-1]
        if (!inside)
          pj.fail("has offset " + to_string(p.offset) + " and shape " + to_string(p.shape) + ", not a block of global_shape " +
                  to_string(g));
        for (std::size_t d = 0; d < g.rank; ++d)
          if (d == cd ? p.shape[d] > l.shape[d] - made[d] : p.shape[d] != l.shape[d])
            pj.fail("has shape " + to_string(p.shape) + ", which does not fit the shard " + to_string(l.shape) +
                    " (the pieces are concatenated along dim " + std::to_string(cd) + ")");
        if (g.rank) made[cd] += p.shape[cd];
        held += std::min(p.shape.numel(), numel - held);  // inside g: its numel is at most g's
      }
      if (!(made == l.shape))
        s["pieces"].fail("make a shard of " + to_string(made) + ", not " + to_string(l.shape) + " (along dim " +
                         std::to_string(cd) + ")");
    }
    if (held < numel)
      t["shards"].fail("hold " + count_noun(held, "element") + " in all, fewer than the " + std::to_string(numel) +
                       " of global_shape " + to_string(g));
  }
  static tensor_shape shape_of(const json_in& j) {
    return tensor_shape(j.integers(0, std::numeric_limits<std::int64_t>::max(), max_tensor_rank));
  }
  std::filesystem::path dir_;
  nlohmann::json index_;
  int world_ = 0;
  std::vector<safetensors_file> files_;
  std::vector<std::string> names_;
};

}  // namespace autoshard

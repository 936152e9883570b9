// libFuzzer target: three readers of files the tool reads back, each through io's checked-JSON
// reader (load_json_file, json_in). The first byte picks the reader (its value mod 3); the rest
// is written to a scratch file and read from there, as the tool reads it:
//   0  a calibration file, `load_calibration` (gloo/calibration_file.hpp; what
//      `autoshard plan --calibration` reads). Only io_error may escape. A file that reads
//      writes back (calibration_to_json) to one that reads to the same JSON, and applies to
//      its own mesh (apply_calibration), whose links price every collective finitely.
//   1  a model config, `load_model_config` and `load_model_type` (tensor/policy.hpp; what
//      `autoshard shard --policy` reads beside the checkpoint). Only io_error may escape them.
//      The config then goes where the tool sends it: `rescale_attributes` and `shards_of`
//      (tp 2 and 4) of the built-in policy its model_type names, or without one of each policy
//      that reads a member of it, on that policy's tensors, shaped from the config's widths
//      (each at most 2^16); those may throw only shape_error or spec_error,
//      and a cut they return has one layout per rank whose pieces lie in the tensor, make the
//      rank's shard and together hold at least every element.
//   2  a shard index, `index.json` of a directory written by `shard_checkpoint` (class
//      sharded_checkpoint, tensor/shard_checkpoint.hpp), opened next to that run's two rank
//      files (a 2-way GPT-2 cut, made once in /dev/shm; their generation is set to "fuzz" so
//      the seeds' index matches them). Only io_error may escape opening it, and io_error or
//      shape_error gathering a tensor; a tensor that gathers has the index's global shape.
// Each reader's work and seeds are kept small (a 2-way cut of three tensors, few samples,
// the policies built once): the CI smoke builds the targets at -O0, where parsing dominates
// and a 4-way cut of six tensors made this target five times slower than the others.
//
// With AUTOSHARD_FUZZ_WRITE_SEEDS=<dir> set, it first writes the seeds it can make itself
// there (the calibration files and shard index that fuzz/corpus/readers/ was made of). With
// AUTOSHARD_FUZZ_VERBOSE set, it prints what each reader made of each input (run it on files:
// `fuzz_readers fuzz/corpus/readers/*` says which seeds read and why the others do not).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <autoshard/gloo/calibration_file.hpp>
#include <autoshard/tensor/policy.hpp>
#include <autoshard/tensor/shard_checkpoint.hpp>

#include "scratch.hpp"
#include "target.hpp"

namespace autoshard_fuzz::readers_target {
namespace fs = std::filesystem;
using autoshard::dtype;
using autoshard::tensor_shape;

const bool verbose = std::getenv("AUTOSHARD_FUZZ_VERBOSE") != nullptr;

/// With AUTOSHARD_FUZZ_VERBOSE: "<reader>: <what happened>" (a macro, so that the message is
/// not even built without it).
#define AUTOSHARD_FUZZ_SAY(reader, what) \
  do {                                   \
    if (verbose) std::fprintf(stderr, "fuzz_readers: %s: %s\n", reader, std::string(what).c_str()); \
  } while (0)

[[noreturn]] void fail(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "fuzz_readers: %s%s%s\n", what, detail.empty() ? "" : ": ", detail.c_str());
  std::abort();
}

void write_file(const fs::path& p, const void* data, std::size_t size) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// --- the shard output the index is read next to ------------------------------------------

const char* const generation = "fuzz";

/// A small GPT-2 checkpoint (2 heads of 2, one layer) with distinct values, sharded 2 ways
/// by the gpt2 policy into `dir` (a fused column cut in three pieces a rank, a row bias
/// added after the all-reduce, a replicated table); every rank file's generation is
/// then set to "fuzz" and index.json (generation "fuzz" too) is returned and removed.
std::string make_shard_output(const fs::path& dir) {
  const fs::path src = dir / "src.safetensors";
  std::vector<std::pair<std::string, autoshard::host_tensor>> ts;
  ts.emplace_back("h.0.attn.c_attn.weight", autoshard::host_tensor(dtype::f32, {4, 12}));
  ts.emplace_back("h.0.attn.c_proj.bias", autoshard::host_tensor(dtype::f16, {4}));
  ts.emplace_back("wte.weight", autoshard::host_tensor(dtype::bf16, {3, 4}));
  unsigned char v = 1;
  for (auto& [n, t] : ts)
    for (std::size_t i = 0; i < t.nbytes(); ++i) t.data()[i] = static_cast<std::byte>(v += 37);
  std::vector<std::pair<std::string, autoshard::const_tensor_view>> views;
  for (auto& [n, t] : ts) views.emplace_back(n, t.view());
  autoshard::save_safetensors(src, views, {{"format", "pt"}});
  const fs::path out = dir / "out";
  {
    const autoshard::checkpoint in(src);
    autoshard::shard_checkpoint(in, autoshard::policies::gpt2(), 2, {{"n_head", 2}, {"n_embd", 4}, {"n_layer", 1}}, out);
  }
  fs::remove(src);
  for (int r = 0; r < 2; ++r) {
    const fs::path p = out / ("rank-" + std::to_string(r) + ".safetensors");
    std::vector<std::pair<std::string, autoshard::host_tensor>> copies;
    std::map<std::string, std::string> meta;
    {
      const autoshard::safetensors_file f(p);
      for (const auto& e : f.entries()) copies.emplace_back(e.name, autoshard::host_tensor::copy_of(f.view(e.name)));
      meta = f.metadata();
    }
    meta["autoshard.generation"] = generation;
    std::vector<std::pair<std::string, autoshard::const_tensor_view>> cv;
    for (auto& [n, t] : copies) cv.emplace_back(n, t.view());
    autoshard::save_safetensors(p, cv, meta);
  }
  nlohmann::json index = nlohmann::json::parse(read_text(out / "index.json"));
  index["generation"] = generation;
  fs::remove(out / "index.json");
  return index.dump();
}

struct fixture {
  fs::path dir, shards, input;
  fixture() {
    dir = autoshard_fuzz::scratch_path("autoshard-fuzz-readers-");
    fs::create_directories(dir);
    shards = dir / "out";
    input = dir / "input.json";
    const std::string index = make_shard_output(dir);
    if (const char* seeds = std::getenv("AUTOSHARD_FUZZ_WRITE_SEEDS")) write_seeds(seeds, index);
  }
  static void write_seeds(const fs::path& to, const std::string& index) {
    fs::create_directories(to);
    auto seed = [&](const std::string& name, char prefix, const std::string& text) {
      std::ofstream(to / name, std::ios::binary) << prefix << text;
    };
    seed("shard-index-gpt2-tp2.json", '2', index);
    autoshard::calibration_result r;
    r.mesh = autoshard::device_mesh{2, 4};
    r.mesh.set_axis_name(0, "dp");
    r.mesh.set_axis_name(1, "tp");
    r.mesh.set_link(0, {2.5e-5, 1.2e10, 1e-6});
    r.mesh.set_link(1, {8e-6, 4.5e10, 0.0});
    r.backend = "gloo-tcp";
    for (int a = 0; a < 2; ++a) {
      autoshard::axis_calibration ac;
      ac.axis = a;
      ac.group_size = a ? 4 : 2;
      ac.measured = true;
      ac.holdout_bytes = 1 << 20;
      ac.holdout_relative_error = 0.04;
      ac.samples.push_back({autoshard::detail::sampled_collectives[a], 65536, 1.7e-5, false});
      ac.samples.push_back({autoshard::collective::all_to_all, 1048576, 1.2e-4, true});
      r.axes.push_back(ac);
    }
    seed("calibration-2x4-named.json", '0', autoshard::calibration_to_json(r).dump());
    autoshard::calibration_result one;
    one.mesh = autoshard::device_mesh{2};
    one.backend = "nccl";
    autoshard::axis_calibration ac;
    ac.group_size = 2;
    ac.samples.push_back({autoshard::collective::all_gather, 8, 2e-5, false});
    one.axes.push_back(ac);
    seed("calibration-1-unmeasured.json", '0', autoshard::calibration_to_json(one).dump());
  }
  ~fixture() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

fixture& the_fixture() {
  static fixture f;
  return f;
}

// --- 0: calibration files ----------------------------------------------------------------

/// Whether two calibrations are the same, field for field (the doubles exactly: JSON keeps them).
bool same(const autoshard::calibration_result& a, const autoshard::calibration_result& b) {
  if (!(a.mesh == b.mesh) || a.backend != b.backend || a.axes.size() != b.axes.size()) return false;
  if (a.mesh.has_axis_names() != b.mesh.has_axis_names()) return false;  // == compares sizes and links
  for (std::size_t i = 0; i < a.mesh.ndim(); ++i)
    if (a.mesh.axis_name(i) != b.mesh.axis_name(i)) return false;
  for (std::size_t i = 0; i < a.axes.size(); ++i) {
    const auto &x = a.axes[i], &y = b.axes[i];
    if (x.axis != y.axis || x.group_size != y.group_size || x.measured != y.measured || x.holdout_bytes != y.holdout_bytes ||
        x.holdout_relative_error != y.holdout_relative_error || x.samples.size() != y.samples.size())
      return false;
    for (std::size_t k = 0; k < x.samples.size(); ++k)
      if (x.samples[k].kind != y.samples[k].kind || x.samples[k].bytes != y.samples[k].bytes ||
          x.samples[k].seconds != y.samples[k].seconds || x.samples[k].held_out != y.samples[k].held_out)
        return false;
  }
  return true;
}

void read_calibration(const fs::path& path) {
  autoshard::calibration_result r;
  try {
    r = autoshard::load_calibration(path.string());
  } catch (const autoshard::io_error& e) {
    AUTOSHARD_FUZZ_SAY("calibration", e.what());
    return;
  }
  AUTOSHARD_FUZZ_SAY("calibration", "read: " + std::to_string(r.axes.size()) + " axes, backend " + r.backend);
  const nlohmann::json written = autoshard::calibration_to_json(r);
  autoshard::calibration_result again;
  try {
    again = autoshard::calibration_from_json(written, "written");
  } catch (const autoshard::error& e) {
    fail("a calibration written back does not read", std::string(e.what()) + "\n" + written.dump());
  }
  if (!same(again, r)) fail("a calibration changed when written and read back", written.dump());
  autoshard::device_mesh m = r.mesh;
  try {
    autoshard::apply_calibration(m, r);
  } catch (const autoshard::error& e) {
    fail("a calibration does not apply to its own mesh", e.what());
  }
  for (std::size_t a = 0; a < m.ndim(); ++a)
    for (auto k : autoshard::detail::sampled_collectives) {
      const double t = autoshard::collective_time(k, m.link(a), m.size(a), 1e9);
      if (!std::isfinite(t) || t < 0) fail("a calibrated link prices a collective at", std::to_string(t));
    }
}

// --- 1: model configs, and the policies they feed ----------------------------------------

/// config[key] for the first key it has, when in [1, 2^16]: a width the tensors are shaped by.
std::int64_t width(const autoshard::model_config& c, std::initializer_list<const char*> keys, std::int64_t fallback) {
  for (const char* k : keys)
    if (auto it = c.find(k); it != c.end()) return it->second >= 1 && it->second <= (1 << 16) ? it->second : fallback;
  return fallback;
}

/// Each built-in policy (built once) and tensors its rules match, shaped from the config.
std::vector<std::pair<const autoshard::tp_policy*, std::vector<std::pair<std::string, tensor_shape>>>> policy_tensors(
    const autoshard::model_config& c) {
  namespace P = autoshard::policies;
  static const autoshard::tp_policy gpt2 = P::gpt2(), bert = P::bert(), opt = P::opt(), gpt_neox = P::gpt_neox(),
                                    bloom = P::bloom(), llama = P::llama();
  const std::int64_t H = width(c, {"n_embd", "hidden_size"}, 64);
  const std::int64_t I = width(c, {"n_inner", "intermediate_size", "ffn_dim"}, 4 * H);
  const std::int64_t heads = width(c, {"num_attention_heads", "n_head"}, 4);
  const std::int64_t kv = width(c, {"num_key_value_heads"}, heads);
  const std::int64_t kvw = H % heads == 0 && H / heads * kv <= (1 << 16) ? H / heads * kv : H;
  return {
      {&gpt2,
       {{"h.0.attn.c_attn.weight", {H, 3 * H}}, {"h.0.attn.c_attn.bias", {3 * H}}, {"h.0.attn.c_proj.weight", {H, H}},
        {"h.0.attn.c_proj.bias", {H}}, {"h.0.mlp.c_fc.weight", {H, I}}, {"h.0.mlp.c_proj.weight", {I, H}}, {"wte.weight", {50, H}}}},
      {&bert,
       {{"encoder.layer.0.attention.self.query.weight", {H, H}}, {"encoder.layer.0.attention.self.key.bias", {H}},
        {"encoder.layer.0.attention.output.dense.weight", {H, H}}, {"encoder.layer.0.intermediate.dense.weight", {I, H}},
        {"encoder.layer.0.output.dense.weight", {H, I}}}},
      {&opt,
       {{"model.decoder.layers.0.self_attn.q_proj.weight", {H, H}}, {"model.decoder.layers.0.self_attn.v_proj.bias", {H}},
        {"model.decoder.layers.0.self_attn.out_proj.weight", {H, H}}, {"model.decoder.layers.0.fc1.weight", {I, H}},
        {"model.decoder.layers.0.fc2.weight", {H, I}}}},
      {&gpt_neox,
       {{"gpt_neox.layers.0.attention.query_key_value.weight", {3 * H, H}},
        {"gpt_neox.layers.0.attention.query_key_value.bias", {3 * H}}, {"gpt_neox.layers.0.attention.dense.weight", {H, H}},
        {"gpt_neox.layers.0.mlp.dense_h_to_4h.weight", {I, H}}, {"gpt_neox.layers.0.mlp.dense_4h_to_h.weight", {H, I}}}},
      {&bloom,
       {{"h.0.self_attention.query_key_value.weight", {3 * H, H}}, {"h.0.self_attention.dense.weight", {H, H}},
        {"h.0.mlp.dense_h_to_4h.weight", {4 * H, H}}}},
      {&llama,
       {{"model.layers.0.self_attn.q_proj.weight", {H, H}}, {"model.layers.0.self_attn.k_proj.weight", {kvw, H}},
        {"model.layers.0.self_attn.v_proj.weight", {kvw, H}}, {"model.layers.0.self_attn.o_proj.weight", {H, H}},
        {"model.layers.0.mlp.gate_proj.weight", {I, H}}, {"model.layers.0.mlp.down_proj.weight", {H, I}}}},
  };
}

/// Every rank has a layout whose pieces lie in the tensor, make its shard (concatenated along
/// concat_dim) and, over all ranks, hold at least every element.
void check_cut(const autoshard::tensor_shards& s, int tp) {
  if (static_cast<int>(s.ranks.size()) != tp) fail("a cut has the wrong number of ranks", s.name);
  double held = 0;
  for (const auto& l : s.ranks) {
    if (l.shape.rank != s.global.rank || l.concat_dim < 0 || l.concat_dim >= static_cast<int>(s.global.rank) + (s.global.rank == 0))
      fail("a rank's layout has the wrong rank or concat dim", s.name);
    tensor_shape made = l.shape;
    const auto cd = static_cast<std::size_t>(l.concat_dim);
    if (s.global.rank) made[cd] = 0;
    for (const auto& p : l.pieces) {
      if (p.offset.rank != s.global.rank || p.shape.rank != s.global.rank) fail("a piece has the wrong rank", s.name);
      for (std::size_t d = 0; d < s.global.rank; ++d) {
        if (p.offset[d] < 0 || p.shape[d] < 0 || p.offset[d] > s.global[d] - p.shape[d]) fail("a piece lies outside its tensor", s.name);
        if (d == cd) made[d] += p.shape[d];
        else if (p.shape[d] != l.shape[d]) fail("a piece does not fit its shard", s.name);
      }
      held += static_cast<double>(p.shape.numel());
    }
    if (!(made == l.shape)) fail("a rank's pieces do not make its shard", s.name);
  }
  if (held < static_cast<double>(s.global.numel())) fail("the ranks' pieces miss elements", s.name);
}

/// Whether policy `p` reads any member of `c` (an attribute it rescales, a head count).
bool reads_any(const autoshard::tp_policy& p, const autoshard::model_config& c) {
  for (const auto& a : p.attributes)
    if (c.count(a.from)) return true;
  for (const auto& [pattern, r] : p.rules) {
    for (const auto& h : r.part_heads)
      if (c.count(h)) return true;
    if (!r.interleaved_heads.empty() && c.count(r.interleaved_heads)) return true;
  }
  return false;
}

void read_model_config(const fs::path& path) {
  autoshard::model_config c;
  std::string type;
  try {
    c = autoshard::load_model_config(path);
    type = autoshard::load_model_type(path);
    AUTOSHARD_FUZZ_SAY("config", "read: " + std::to_string(c.size()) + " integers, model_type '" + type + "'");
  } catch (const autoshard::io_error& e) {
    AUTOSHARD_FUZZ_SAY("config", e.what());
    return;
  }
  for (char& ch : type)
    if (ch == '-') ch = '_';  // as `shard` spells it
  int cut = 0, refused = 0;
  for (const auto& [policy, tensors] : policy_tensors(c)) {
    // The policies `shard` would use with this config: the one its model_type names (it refuses
    // any other), or, without one, each policy that reads something of it (the others would
    // cut default shapes, whatever the config says).
    if (type.empty() ? !reads_any(*policy, c) : policy->name != type) continue;
    for (int tp : {2, 4}) {
      try {
        (void)autoshard::rescale_attributes(*policy, c, tp);
      } catch (const autoshard::shape_error&) {
      }
      for (const auto& [name, shape] : tensors) {
        try {
          check_cut(autoshard::shards_of(*policy, name, shape, dtype::f32, tp, c), tp);
          ++cut;
        } catch (const autoshard::shape_error&) {
          ++refused;
        } catch (const autoshard::spec_error&) {
          ++refused;
        }
      }
    }
  }
  AUTOSHARD_FUZZ_SAY("config", std::to_string(cut) + " tensors cut, " + std::to_string(refused) + " refused");
}

// --- 2: shard indexes ----------------------------------------------------------------------

void read_shard_index(const fs::path& dir) {
  std::optional<autoshard::sharded_checkpoint> sc;
  try {
    sc.emplace(dir);
  } catch (const autoshard::io_error& e) {
    AUTOSHARD_FUZZ_SAY("shard index", e.what());
    return;
  }
  int gathered = 0;
  for (const std::string& name : sc->names()) {
    try {
      const autoshard::host_tensor t = sc->gather(name);
      if (!(t.shape() == sc->global_shape(name))) fail("a gathered tensor is not of its global shape", name);
      ++gathered;
    } catch (const autoshard::io_error& e) {
      AUTOSHARD_FUZZ_SAY("shard index", e.what());
    } catch (const autoshard::shape_error& e) {
      AUTOSHARD_FUZZ_SAY("shard index", e.what());
    }
  }
  AUTOSHARD_FUZZ_SAY("shard index", "read: " + std::to_string(gathered) + " of " + std::to_string(sc->names().size()) + " tensors gathered");
}

int one_input(const std::uint8_t* data, std::size_t size) {
  fixture& f = the_fixture();
  if (size == 0) return 0;
  const int reader = data[0] % 3;
  const fs::path path = reader == 2 ? f.shards / "index.json" : f.input;
  write_file(path, data + 1, size - 1);
  switch (reader) {
    case 0: read_calibration(path); break;
    case 1: read_model_config(path); break;
    default: read_shard_index(f.shards); break;
  }
  return 0;
}

}  // namespace autoshard_fuzz::readers_target

AUTOSHARD_FUZZ_TARGET(readers)

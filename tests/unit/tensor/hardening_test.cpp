// Regressions of the hostile-input battery (issue 17): each case fed what crashed, hung or
// silently gave a wrong result before, and required to give a clear error now.
#include <autoshard/tensor/tensor.hpp>
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "unit/scratch.hpp"

using namespace autoshard;
using autoshard_test::scratch_dir;

namespace {
namespace fs = std::filesystem;

void hardening_write(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f << bytes;
}
std::string hardening_raw(const std::string& header, std::size_t data_bytes) {
  std::string s(8, '\0');
  for (std::size_t i = 0; i < 8; ++i) s[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return s + header + std::string(data_bytes, '\0');
}
template <class F>
std::string hardening_error(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.what();
  }
  return "(no error)";
}
bool has_text(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// A two-layer GPT-2-shaped checkpoint (Hugging Face names), tiny: n_embd 8, 2 heads.
std::vector<std::pair<std::string, host_tensor>> tiny_gpt2(int layers = 2) {
  std::vector<std::pair<std::string, host_tensor>> t;
  auto add = [&](const std::string& n, tensor_shape s) {
    host_tensor h(dtype::f32, s);
    for (std::int64_t i = 0; i < h.numel(); ++i) h.as<float>()[i] = static_cast<float>(i);
    t.emplace_back(n, std::move(h));
  };
  add("wte.weight", {16, 8});
  for (int l = 0; l < layers; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    add(p + "attn.c_attn.weight", {8, 24});
    add(p + "attn.c_attn.bias", {24});
    add(p + "attn.c_proj.weight", {8, 8});
    add(p + "mlp.c_fc.weight", {8, 32});
    add(p + "mlp.c_proj.weight", {32, 8});
  }
  return t;
}
void save_all(const fs::path& p, const std::vector<std::pair<std::string, host_tensor>>& ts, const std::string& skip = "") {
  std::vector<std::pair<std::string, const_tensor_view>> v;
  for (const auto& [n, h] : ts)
    if (n != skip) v.emplace_back(n, h.view());
  save_safetensors(p, v);
}
const model_config tiny_config{{"n_head", 2}, {"n_embd", 8}, {"n_layer", 2}};
}  // namespace

TEST_CASE("hardening: an index with an empty weight_map is an io_error, not a crash") {
  // Before: checkpoint opened with no file, and shard_checkpoint's files().front() segfaulted.
  scratch_dir dir;
  hardening_write(dir / "model.safetensors.index.json", R"({"weight_map":{}})");
  const std::string msg = hardening_error([&] { checkpoint ck(dir.path); });
  CHECK(has_text(msg, "io error: index '"));
  CHECK(has_text(msg, "empty weight_map"));
}

TEST_CASE("hardening: a tensor in a shard file that the weight_map does not list is an io_error") {
  // Before: the tensor was silently dropped from every output.
  scratch_dir dir;
  save_all(dir / "a.safetensors", tiny_gpt2(1));
  hardening_write(dir / "model.safetensors.index.json",
                  R"({"weight_map":{"wte.weight":"a.safetensors","h.0.attn.c_attn.weight":"a.safetensors"}})");
  const std::string msg = hardening_error([&] { checkpoint ck(dir.path); });
  CHECK(has_text(msg, "holds tensor 'h.0.attn.c_attn.bias', which the weight_map does not list"));
}

TEST_CASE("hardening: safetensors header parsing is linear in the number of entries") {
  // nlohmann's callback parser, used before for the duplicate check, rescanned the whole object
  // after every entry: 4,000 zero-size tensors took 8 s and 16,000 took 233 s in a debug build
  // (28x for 4x the entries); a 1,000,000-entry header never finished. The check is the growth,
  // not a time, so that it holds in every build: 4x the entries may cost at most 8x the time
  // (linear: ~4x, quadratic: 16x), the best of three runs each in this thread's CPU time (not wall time: other
  // processes' load does not count).
  auto header_of = [](int n) {
    std::string h = "{";
    for (int i = 0; i < n; ++i)
      h += (i ? ",\"t" : "\"t") + std::to_string(i) + R"(":{"dtype":"F32","shape":[0],"data_offsets":[0,0]})";
    return h + "}";
  };
  using autoshard_test::thread_cpu_seconds;
  auto best_seconds = [&](const std::string& bytes, std::size_t want) {
    double best = 1e9;
    for (int run = 0; run < 3; ++run) {
      const double t0 = thread_cpu_seconds();
      const auto hdr = parse_safetensors_header(std::as_bytes(std::span(bytes.data(), bytes.size())), "big");
      best = std::min(best, thread_cpu_seconds() - t0);
      REQUIRE(hdr.entries.size() == want);
    }
    return best;
  };
  const double small = best_seconds(hardening_raw(header_of(2000), 0), 2000);
  const double large = best_seconds(hardening_raw(header_of(8000), 0), 8000);
  INFO("2,000 entries: " << small << " s, 8,000 entries: " << large << " s");
  CHECK(large < 8 * small);
  // the duplicate check still works, at the end of a long header too
  const std::string h = header_of(8000);
  const std::string dup = hardening_raw(h.substr(0, h.size() - 1) + R"(,"t7":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})", 0);
  const std::string msg = hardening_error(
      [&] { (void)parse_safetensors_header(std::as_bytes(std::span(dup.data(), dup.size())), "dup"); });
  CHECK(has_text(msg, "tensor 't7': name appears twice"));
}

TEST_CASE("hardening: a policy that matches no tensor of the checkpoint is an error, not a replicated copy") {
  scratch_dir dir;
  save_all(dir / "m.safetensors", tiny_gpt2());
  checkpoint ck(dir / "m.safetensors");
  const std::string msg = hardening_error([&] { shard_checkpoint(ck, policies::llama(), 2, tiny_config, dir / "out"); });
  CHECK(has_text(msg, "policy 'llama' matches none of the checkpoint's 11 tensors"));
  CHECK(!fs::exists(dir / "out"));
  CHECK_NOTHROW(shard_checkpoint(ck, policies::gpt2(), 2, tiny_config, dir / "ok"));
}

TEST_CASE("hardening: a checkpoint missing one tensor of one layer, or a layer, is an error") {
  scratch_dir dir;
  save_all(dir / "m.safetensors", tiny_gpt2(), "h.0.attn.c_attn.bias");
  checkpoint ck(dir / "m.safetensors");
  std::string msg = hardening_error([&] { shard_checkpoint(ck, policies::gpt2(), 2, tiny_config, dir / "out"); });
  CHECK(has_text(msg, "has no tensor 'h.0.attn.c_attn.bias' but has 'h.1.attn.c_attn.bias'"));
  CHECK(!fs::exists(dir / "out"));
  // one layer where the config says two
  save_all(dir / "one.safetensors", tiny_gpt2(1));
  checkpoint one(dir / "one.safetensors");
  msg = hardening_error([&] { shard_checkpoint(one, policies::gpt2(), 2, tiny_config, dir / "out"); });
  CHECK(has_text(msg, "the checkpoint has 1 layer ('h.0..'), but its config says n_layer = 2"));
  // the check can be turned off for models whose layers differ on purpose
  shard_options o;
  o.check_layers = false;
  CHECK_NOTHROW(shard_checkpoint(ck, policies::gpt2(), 2, tiny_config, dir / "off", o));
}

TEST_CASE("hardening: split_layer_name and check_layer_stacks") {
  auto l = split_layer_name("model.layers.12.mlp.experts.3.w1");
  REQUIRE(l);
  CHECK(l->stack == "model.layers.");
  CHECK(l->index == 12);
  CHECK(l->rest == ".mlp.experts.3.w1");
  CHECK(!split_layer_name("wte.weight"));
  CHECK(!split_layer_name("0.weight"));  // a leading number is not a layer of a stack
  const auto c = check_layer_stacks({"h.0.a", "h.1.a", "h.2.a", "enc.0.b", "x"}, "t");
  CHECK(c.at("h.") == 3);
  CHECK(c.at("enc.") == 1);
  CHECK(has_text(hardening_error([] { (void)check_layer_stacks({"h.0.a", "h.2.a"}, "t"); }),
                 "t has no tensor 'h.1.a' but has 'h.0.a': every layer 'h.0..2' should hold the same tensors"));
  // A checkpoint's names reach the message escaped: no ESC or newline of the file's reaches the terminal.
  const std::string msg = hardening_error([] { (void)check_layer_stacks({"a\x1B[31mb\nc.0.w", "a\x1B[31mb\nc.1.w", "a\x1B[31mb\nc.1.v"}, "t"); });
  CHECK(has_text(msg, "t has no tensor 'a\\x1B[31mb\\x0Ac.0.v' but has 'a\\x1B[31mb\\x0Ac.1.v': every layer 'a\\x1B[31mb\\x0Ac.0..1'"));
  CHECK(msg.find_first_of("\x1B\n") == std::string::npos);
}

TEST_CASE("hardening: every file of a sharded output is of one run, and a smaller run removes the larger one's extra ranks") {
  scratch_dir dir;
  save_all(dir / "m.safetensors", tiny_gpt2());
  checkpoint ck(dir / "m.safetensors");
  shard_checkpoint(ck, policies::gpt2(), 2, tiny_config, dir / "a");
  shard_checkpoint(ck, policies::gpt2(), 2, tiny_config, dir / "b");
  CHECK_NOTHROW(sharded_checkpoint(dir / "a"));
  // A rank file of another run (what a run killed while renaming leaves, or an older output):
  // identical tensors, but not the same generation. Before, nothing could tell the mix.
  fs::copy_file(dir / "b" / "rank-1.safetensors", dir / "a" / "rank-1.safetensors",
                fs::copy_options::overwrite_existing);
  const std::string msg = hardening_error([&] { sharded_checkpoint s(dir / "a"); });
  CHECK(has_text(msg, "rank-1.safetensors' is of sharding run "));
  CHECK(has_text(msg, "mixes the files of two runs"));
  // A 2-rank run over a 4-rank output: rank-2 and rank-3 go, the output reads back whole.
  shard_checkpoint(ck, policies::gpt2(), 1, tiny_config, dir / "c");
  shard_checkpoint(ck, policies::gpt2(), 2, tiny_config, dir / "c");
  hardening_write(dir / "c" / "rank-7.safetensors.bak", "not ours");
  const shard_report r = shard_checkpoint(ck, policies::gpt2(), 1, tiny_config, dir / "c");
  CHECK(r.removed_stale == std::vector<fs::path>{dir / "c" / "rank-1.safetensors"});
  CHECK(!fs::exists(dir / "c" / "rank-1.safetensors"));
  CHECK(fs::exists(dir / "c" / "rank-7.safetensors.bak"));
  sharded_checkpoint c(dir / "c");
  CHECK(c.world_size() == 1);
  CHECK(bitwise_equal(c.gather("h.1.mlp.c_fc.weight").view(), ck.view("h.1.mlp.c_fc.weight")));
}

// A shard index names its rank files; each must be in the index's directory. Before, "../x"
// or an absolute path was followed, and any safetensors file read as a rank when neither it nor
// the index recorded a sharding run (found by reading, in the 2026-12-05 fuzz campaign).
TEST_CASE("hardening: a shard index that names a rank file outside its directory is refused") {
  scratch_dir dir;
  save_all(dir / "m.safetensors", tiny_gpt2());
  checkpoint ck(dir / "m.safetensors");
  shard_checkpoint(ck, policies::gpt2(), 2, tiny_config, dir / "a");
  CHECK_NOTHROW(sharded_checkpoint(dir / "a"));
  const std::string index = [&] {
    std::ifstream in(dir / "a" / "index.json");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const std::string name = "\"rank-1.safetensors\"";
  REQUIRE(index.find(name) != std::string::npos);
  for (const std::string bad : {"../m.safetensors", "/etc/passwd", "..", "."}) {
    CAPTURE(bad);
    std::string tampered = index;
    tampered.replace(tampered.find(name), name.size(), "\"" + bad + "\"");
    hardening_write(dir / "a" / "index.json", tampered);
    const std::string msg = hardening_error([&] { sharded_checkpoint s(dir / "a"); });
    CHECK(has_text(msg, "is '" + bad + "', not a plain file name in '"));
  }
  hardening_write(dir / "a" / "index.json", index);
  CHECK_NOTHROW(sharded_checkpoint(dir / "a"));
}

TEST_CASE("hardening: an input truncated after it was mapped is an io_error naming it, not SIGBUS") {
  for (const bool convert : {true, false}) {
    CAPTURE(convert);
    scratch_dir dir;
    save_all(dir / "m.safetensors", tiny_gpt2());
    checkpoint ck(dir / "m.safetensors");
    REQUIRE(::truncate((dir / "m.safetensors").c_str(), 1024) == 0);  // the data is gone
    shard_options o;
    if (convert) o.convert_to = dtype::bf16;
    const std::string msg =
        hardening_error([&] { shard_checkpoint(ck, policies::gpt2(), 2, tiny_config, dir / "out", o); });
    CHECK(has_text(msg, "io error: safetensors file '" + (dir / "m.safetensors").string() + "' changed while it was read"));
    CHECK_FALSE(fs::exists(dir / "out"));  // no final file, no temporary, not the directory it made
  }
}

TEST_CASE("hardening: sharding onto more shards than the memory holds is refused before a layout is made") {
  // 2^20 ranks of a 150-tensor GPT-2 made 157 million layouts until the memory ran out; here
  // 10^15 shards, beyond any machine's memory, in 100 rank files (within any open-file limit).
  const std::string e = hardening_error([] { check_shard_count(100, std::size_t{10'000'000'000'000}); });
  CHECK(e.rfind("resource error: sharding 10000000000000 tensors onto 100 ranks makes 1000000000000000 shards in 100 rank files, "
                "whose layouts and index take about ", 0) == 0);
  CHECK(e.find("(2.50 KiB a shard and 8.00 KiB a rank file); but this process can allocate ") != std::string::npos);
  CHECK_NOTHROW(check_shard_count(4, 16));
}

TEST_CASE("hardening: an output the disk cannot hold is refused before a layout or the index is made") {
  // The free space was weighed once every rank's layout and the whole index.json were built.
  // A 1 TiB tensor in a sparse file (it takes no disk) needs at least 1 TiB of output.
  scratch_dir dir;
  const std::uint64_t n = std::uint64_t{1} << 38;  // f32: 1 TiB
  const std::string header = "{\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(n / 1024) +
                             ",1024],\"data_offsets\":[0," + std::to_string(n * 4) + "]}}";
  hardening_write(dir / "big.safetensors", hardening_raw(header, 0));
  REQUIRE(::truncate((dir / "big.safetensors").c_str(), static_cast<off_t>(8 + header.size() + n * 4)) == 0);
  std::error_code ec;
  if (fs::space(dir.path, ec).available >= n * 4 || ec) return;  // a disk of more than 1 TiB free: nothing to refuse
  const checkpoint ck(dir / "big.safetensors");
  CHECK(shard_output_bytes_at_least(ck, ck.names(), 2, {}) == n * 4 + 2 * (shard_index_min_bytes + rank_file_index_min_bytes));
  const std::string msg = hardening_error([&] { shard_checkpoint(ck, policies::gpt2(), 2, tiny_config, dir / "out"); });
  CHECK(has_text(msg, "io error: the sharded checkpoint (at least its 1 tensor once and index.json's 2 shard entries, in 2 rank "
                      "files) needs 1.00 TiB (" + std::to_string(n * 4 + 176) + " bytes) but the file system of '"));
  CHECK_FALSE(fs::exists(dir / "out"));
  // The estimate is a floor: a real output of the tiny model takes more.
  save_all(dir / "m.safetensors", tiny_gpt2(1));
  const checkpoint small(dir / "m.safetensors");
  shard_options bf16;
  bf16.convert_to = dtype::bf16;
  shard_checkpoint(small, policies::gpt2(), 2, model_config{{"n_head", 2}, {"n_embd", 8}, {"n_layer", 1}}, dir / "s", bf16);
  std::uint64_t written = 0;
  for (const auto& e : fs::directory_iterator(dir / "s")) written += fs::file_size(e.path());
  CHECK(written >= shard_output_bytes_at_least(small, small.names(), 2, bf16));
}

// A 2-way GPT-2 shard output in dir/a, its index as written, and the error of opening it
// with the index changed by `tamper`.
struct sharded_gpt2 {
  scratch_dir dir;
  checkpoint ck;
  nlohmann::json index;
  sharded_gpt2() : ck((save_all(dir / "m.safetensors", tiny_gpt2(1)), dir / "m.safetensors")) {
    shard_checkpoint(ck, policies::gpt2(), 2, model_config{{"n_head", 2}, {"n_embd", 8}, {"n_layer", 1}}, dir / "a");
    index = nlohmann::json::parse(std::ifstream(dir / "a" / "index.json"));
  }
  template <class Tamper>
  std::string refused(Tamper&& tamper) const {
    nlohmann::json j = index;
    tamper(j);
    hardening_write(dir / "a" / "index.json", j.dump());
    return hardening_error([&] { sharded_checkpoint s(dir / "a"); });
  }
};

// A shard index was only type-checked: gather trusted its global shapes, offsets and concat
// dims (seen reading the reader while writing fuzz_readers, which crashes on each before the
// fix). Now the index is checked against itself and the rank files when it is opened.
TEST_CASE("hardening: a shard index whose layouts do not fit its tensors or rank files is refused") {
  sharded_gpt2 out;
  const scratch_dir& dir = out.dir;
  const checkpoint& ck = out.ck;
  const nlohmann::json& index = out.index;
  const auto refused = [&](auto&& tamper) { return out.refused(tamper); };
  // 10^12 x 8 elements: gather allocated 32 TB for it (ASan: allocation-size-too-big).
  std::string msg = refused([](nlohmann::json& j) { j["tensors"]["wte.weight"]["global_shape"] = {1000000000000, 8}; });
  CHECK(has_text(msg, "io error: shard index '"));
  CHECK(has_text(msg, "tensors.wte.weight.shards hold 256 elements in all, fewer than the 8000000000000 of global_shape"));
  // Its element count overflowed int64 (UBSan, in tensor_shape::numel).
  msg = refused([](nlohmann::json& j) { j["tensors"]["wte.weight"]["global_shape"] = {4611686018427387904, 8}; });
  CHECK(has_text(msg, "tensors.wte.weight.global_shape is "));
  CHECK(has_text(msg, "more than 2^63-1 elements"));
  // offset + shape overflowed int64 (UBSan, in copy_block's bounds check).
  msg = refused([](nlohmann::json& j) {
    j["tensors"]["wte.weight"]["shards"][0]["pieces"][0]["offset"] = {9223372036854775807, 0};
  });
  CHECK(has_text(msg, "tensors.wte.weight.shards[0].pieces[0] has offset"));
  CHECK(has_text(msg, "not a block of global_shape"));
  // concat_dim -1 indexed the shape's dims at -1 (UBSan: index out of bounds).
  msg = refused([](nlohmann::json& j) { j["tensors"]["h.0.attn.c_attn.bias"]["shards"][1]["concat_dim"] = -1; });
  CHECK(has_text(msg, "tensors.h.0.attn.c_attn.bias.shards[1].concat_dim is -1, not a dim of global_shape"));
  // A shard shape its rank file does not hold (gather allocated by the index, then failed).
  msg = refused([](nlohmann::json& j) { j["tensors"]["h.0.mlp.c_fc.weight"]["shards"][1]["shape"] = {8, 17}; });
  CHECK(has_text(msg, "tensors.h.0.mlp.c_fc.weight.shards[1].shape is "));
  CHECK(has_text(msg, "rank-1.safetensors' holds the tensor as "));
  // Pieces that do not make the shard.
  msg = refused([](nlohmann::json& j) {
    j["tensors"]["h.0.mlp.c_fc.weight"]["shards"][0]["pieces"][0]["shape"] = {8, 15};
  });
  CHECK(has_text(msg, "tensors.h.0.mlp.c_fc.weight.shards[0].pieces make a shard of "));
  hardening_write(dir / "a" / "index.json", index.dump(1));
  sharded_checkpoint sc(dir / "a");
  for (const auto& name : sc.names()) CHECK(bitwise_equal(sc.gather(name).view(), ck.view(name)));
}

// A config's integers are any int64: the policies multiplied and summed them unchecked (UBSan:
// signed integer overflow; found with fuzz_readers, which feeds every config to every policy).
TEST_CASE("hardening: config values whose products or sums overflow int64 are a shape_error") {
  const std::int64_t big = std::int64_t{1} << 62;
  // gpt2's mlp.width is n_embd x 4 when there is no n_inner.
  std::string msg = hardening_error([&] { (void)rescale_attributes(policies::gpt2(), {{"n_embd", big}}, 2); });
  CHECK(has_text(msg, "shape error: attribute 'n_embd' (for 'mlp.width'): 4611686018427387904 x 4 exceeds 2^63-1"));
  // c_attn's parts are n_head + n_head + n_head heads.
  msg = hardening_error(
      [&] { (void)shards_of(policies::gpt2(), "h.0.attn.c_attn.weight", {768, 2304}, dtype::f32, 2, {{"n_head", big}}); });
  CHECK(has_text(msg, "shape error: tensor 'h.0.attn.c_attn.weight': heads in all: "));
  CHECK(has_text(msg, "exceeds 2^63-1"));
  // BLOOM's query_key_value is n_head x 3 rows per head.
  msg = hardening_error([&] {
    (void)shards_of(policies::bloom(), "h.0.self_attention.query_key_value.weight", {2304, 768}, dtype::f32, 2,
                    {{"n_head", big}});
  });
  CHECK(has_text(msg, "shape error: tensor 'h.0.self_attention.query_key_value.weight': attribute 'n_head' heads x parts: "));
  // The same tensors with real values cut as before.
  CHECK(rescale_attributes(policies::gpt2(), {{"n_embd", 768}}, 2).at("mlp.width") == 1536);
  CHECK(shards_of(policies::bloom(), "h.0.self_attention.query_key_value.weight", {2304, 768}, dtype::f32, 2, {{"n_head", 12}})
            .ranks.size() == 2);
}

// An index.json that says it is not an autoshard shard index, or one a newer autoshard wrote,
// was read as this build's as long as its members parsed.
TEST_CASE("hardening: a shard index of another format, or of a newer version, is refused") {
  sharded_gpt2 out;
  const nlohmann::json& index = out.index;
  CHECK(index["format"] == shard_index_format);
  CHECK(index["version"] == shard_index_version);
  const auto refused = [&](auto&& tamper) { return out.refused(tamper); };
  CHECK(has_text(refused([](nlohmann::json& j) { j["format"] = "safetensors-index"; }),
                 "format is \"safetensors-index\", not \"autoshard-shards\""));
  CHECK(has_text(refused([](nlohmann::json& j) { j.erase("format"); }),
                 "has no member \"format\" (\"autoshard-shards\"): it is not an autoshard shard index"));
  CHECK(has_text(refused([](nlohmann::json& j) { j["version"] = shard_index_version + 1; }),
                 "version is 4, not an integer in [1, 3]"));
  hardening_write(out.dir / "a" / "index.json", index.dump(1));
  CHECK_NOTHROW(sharded_checkpoint(out.dir / "a"));
}

TEST_CASE("hardening: an index naming more files than this process may map is refused before any is mapped") {
  // 70,000 files (vm.max_map_count is 65,530 by default): 65,000 were mapped, then "out of
  // memory (an allocation failed while another was being undone)", naming nothing.
  const std::string why = hardening_error([] { check_mappable_files(70000, "index 'ck/model.safetensors.index.json'", 65400); });
  CHECK(why == "resource error: index 'ck/model.safetensors.index.json' names 70000 safetensors files, each kept mapped while the "
               "checkpoint is open, but this process may map 64376 more (vm.max_map_count less the mappings it has and 1024 kept "
               "for its allocations): merge the files, or raise vm.max_map_count (sysctl)");
  CHECK(hardening_error([] { check_mappable_files(10, "index 'x'", 1000); }).find("may map 0 more") != std::string::npos);
  CHECK_NOTHROW(check_mappable_files(64376, "index 'x'", 65400));
  CHECK_NOTHROW(check_mappable_files(1u << 30, "index 'x'", machine_limits::unlimited));
  // The count is taken from the weight_map before any file is opened: here none exists.
  const std::uint64_t left = machine_limits::maps_left();
  if (left == machine_limits::unlimited || left > 400000) return;  // /proc unreadable, or a limit raised far
  scratch_dir dir;
  std::string index = "{\"weight_map\": {";
  for (std::uint64_t i = 0; i < left; ++i) index += (i ? ", " : "") + std::string("\"w") + std::to_string(i) + "\": \"f" + std::to_string(i) + ".safetensors\"";
  hardening_write(dir / "model.safetensors.index.json", index + "}}");
  const std::string e = hardening_error([&] { checkpoint ck(dir.path); });
  CHECK(e.rfind("resource error: index '" + (dir / "model.safetensors.index.json").string() + "' names " + std::to_string(left) +
                    " safetensors files, each kept mapped",
                0) == 0);
}

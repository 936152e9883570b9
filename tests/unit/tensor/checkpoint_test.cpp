// safetensors reading/writing (byte-identical to Hugging Face's writer, checked against the
// Python package), header validation, sharded index checkpoints, and sharding checkpoints.
#include <autoshard/tensor/tensor.hpp>
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <iterator>
#include <string>
#include <vector>

#include "unit/scratch.hpp"

using namespace autoshard;
namespace fs = std::filesystem;
using autoshard_test::scratch_dir;

namespace {
std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f << bytes;
}
std::string le64(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}
std::string raw_file(const std::string& header, std::size_t data_bytes) {
  return le64(header.size()) + header + std::string(data_bytes, '\x01');
}
bool have_python_safetensors() {
  return std::system("python3 -c 'import safetensors, numpy' >/dev/null 2>&1") == 0;
}
// A tensor of `t` whose element i holds the value i (exact in every dtype for small i).
host_tensor iota(dtype t, tensor_shape s) {
  host_tensor f(dtype::f64, s);
  for (std::int64_t i = 0; i < f.numel(); ++i) f.as<double>()[i] = static_cast<double>(i % 200);
  if (t == dtype::f64 || t == dtype::f32 || t == dtype::f16 || t == dtype::bf16) return convert(f.view(), t);
  host_tensor o(t, s);
  for (std::int64_t i = 0; i < f.numel(); ++i) {
    if (t == dtype::i32) o.as<std::int32_t>()[i] = static_cast<std::int32_t>(i % 200);
    if (t == dtype::i64) o.as<std::int64_t>()[i] = i % 200;
    if (t == dtype::u8) o.as<std::uint8_t>()[i] = static_cast<std::uint8_t>(i % 200);
    if (t == dtype::boolean) o.data()[i] = std::byte{static_cast<unsigned char>(i % 2)};
  }
  return o;
}
}  // namespace

TEST_CASE("safetensors: write, mmap read, HF layout (dtype order, padding, __metadata__ first)") {
  scratch_dir dir;
  host_tensor a = iota(dtype::f32, {2, 3}), b = iota(dtype::i64, {3}), c = iota(dtype::bf16, {5}),
              d = iota(dtype::boolean, {3});
  save_safetensors(dir / "x.safetensors", {{"b", b.view()}, {"a", a.view()}, {"c", c.view()}, {"d", d.view()}},
                   {{"format", "pt"}});
  const std::string bytes = slurp(dir / "x.safetensors");
  const std::string header = bytes.substr(8, bytes.size() - 8 - 24 - 48 - 10 - 3);
  CHECK(header.size() % 8 == 0);
  CHECK(header.rfind(
            "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,24]},"
            "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[24,48]},",
            0) == 0);
  safetensors_file f(dir / "x.safetensors");
  REQUIRE(f.entries().size() == 4);
  CHECK(f.entries()[0].name == "b");
  CHECK(f.entries()[2].name == "c");  // BF16 before BOOL
  CHECK(f.metadata().at("format") == "pt");
  CHECK(bitwise_equal(f.view("a"), a.view()));
  CHECK(bitwise_equal(f.view("c"), c.view()));
  CHECK(bitwise_equal(f.load("d").view(), d.view()));
  CHECK_THROWS_AS(f.view("nope"), io_error);
  CHECK_THROWS_AS(save_safetensors(dir / "y.safetensors", {{"a", a.view()}, {"a", b.view()}}), io_error);
  CHECK_THROWS_AS(save_safetensors(dir / "y.safetensors", {{"bad\xff", a.view()}}), io_error);
  CHECK_THROWS_AS(save_safetensors(dir / "y.safetensors", {{"__metadata__", a.view()}}), io_error);
  // No temporary left behind.
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
}

TEST_CASE("safetensors: interop with Hugging Face's Python package, both directions") {
  if (!have_python_safetensors()) {
    MESSAGE("skipped: python3 with safetensors and numpy not found (scripts/setup.sh installs them)");
    return;
  }
  scratch_dir dir;
  std::vector<host_tensor> ts;
  std::vector<std::pair<std::string, const_tensor_view>> named;
  const dtype types[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::f64, dtype::i32, dtype::i64, dtype::u8, dtype::boolean};
  for (dtype t : types) ts.push_back(iota(t, {3, 4}));
  for (std::size_t i = 0; i < ts.size(); ++i)
    named.emplace_back("model.t_" + std::string(to_string(types[i])), ts[i].view());
  host_tensor empty(dtype::f32, {0, 4});
  named.emplace_back("empty", empty.view());
  save_safetensors(dir / "ours.safetensors", named, {{"format", "pt"}, {"k\xc3\xa9y", "v\"q"}});
  std::vector<std::pair<std::string, const_tensor_view>> numpy_named;
  for (const auto& n : named)
    if (n.second.type() != dtype::bf16) numpy_named.push_back(n);  // numpy has no bfloat16
  save_safetensors(dir / "ours_np.safetensors", numpy_named, {{"format", "np"}});
  // Python: load ours (values checked with numpy where numpy has the dtype), write it back
  // with HF's writer, and write a fresh numpy file for us to read.
  const std::string script = R"PY(
import sys, numpy as np, safetensors
from safetensors.numpy import load_file, save_file
d = sys.argv[1]
raw = open(d + '/ours.safetensors', 'rb').read()
items = dict(safetensors.deserialize(raw))
np_names = {'f32': np.float32, 'f16': np.float16, 'f64': np.float64, 'i32': np.int32, 'i64': np.int64, 'u8': np.uint8}
with safetensors.safe_open(d + '/ours.safetensors', framework='np') as f:
    assert f.metadata() == {'format': 'pt', 'k\u00e9y': 'v"q'}, f.metadata()
    for k, t in np_names.items():
        a = f.get_tensor('model.t_' + k)
        assert a.dtype == t and a.shape == (3, 4), (k, a.dtype, a.shape)
        assert np.array_equal(a, (np.arange(12) % 200).astype(t).reshape(3, 4)), k
    b = f.get_tensor('model.t_bool')
    assert b.dtype == np.bool_ and np.array_equal(b, (np.arange(12) % 2).astype(np.bool_).reshape(3, 4))
bf = items['model.t_bf16']
assert bf['dtype'] == 'BF16' and bf['shape'] == [3, 4]
assert bytes(bf['data']) == (np.arange(12, dtype=np.float32).view(np.uint32) >> 16).astype('<u2').tobytes()
save_file(load_file(d + '/ours_np.safetensors'), d + '/theirs.safetensors', metadata={'format': 'np'})
save_file({'x.weight': np.arange(24, dtype=np.float32).reshape(2, 3, 4), 'x.idx': np.arange(5, dtype=np.int64),
           'h': np.arange(6, dtype=np.float16)}, d + '/numpy.safetensors')
print('python ok')
)PY";
  spit(dir / "check.py", script);
  const std::string cmd = "python3 " + (dir / "check.py").string() + " " + dir.path.string();
  REQUIRE(std::system(cmd.c_str()) == 0);
  // HF's writer produced exactly our bytes.
  CHECK(slurp(dir / "ours_np.safetensors") == slurp(dir / "theirs.safetensors"));
  safetensors_file np(dir / "numpy.safetensors");
  host_tensor w = np.load("x.weight");
  REQUIRE(w.shape() == tensor_shape{2, 3, 4});
  for (int i = 0; i < 24; ++i) CHECK(w.as<float>()[i] == static_cast<float>(i));
  CHECK(np.load("x.idx").as<std::int64_t>()[4] == 4);
  CHECK(static_cast<float>(np.load("h").as<Eigen::half>()[5]) == 5.f);
}

TEST_CASE("safetensors: every malformed header is an io_error naming the file and tensor") {
  scratch_dir dir;
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  auto reject = [&](const std::string& bytes, const std::string& expect) {
    CAPTURE(expect);
    spit(dir / "bad.safetensors", bytes);
    try {
      safetensors_file f(dir / "bad.safetensors");
      FAIL_CHECK("accepted a malformed file");
    } catch (const io_error& e) {
      const std::string what = e.what();
      CHECK_MESSAGE(what.find(expect) != std::string::npos, what);
      CHECK(what.find("bad.safetensors") != std::string::npos);
    }
  };
  spit(dir / "good.safetensors", raw_file(ok, 8));
  CHECK_NOTHROW(safetensors_file(dir / "good.safetensors"));
  reject("abc", "no header length");
  reject(le64(200'000'000) + ok, "exceeds the 100000000-byte limit");
  reject(le64(ok.size() + 100) + ok + std::string(8, '\0'), "runs past the end of the file");
  reject(raw_file("[" + ok + "]", 8), "does not start with '{'");
  reject(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8), "not valid UTF-8 JSON");
  reject(raw_file("{\"\xff\xfe\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8), "not valid UTF-8 JSON");
  reject(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16),
         "tensor 'a': name appears twice");
  reject(raw_file(R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2), "tensor 'a': unknown or unsupported dtype 'F8_E4M3'");
  reject(raw_file(R"({"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", 8), "unknown or unsupported dtype 'f32'");
  reject(raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "tensor 'a': shape [3] of F32 needs 12 bytes but data_offsets span 8");
  reject(raw_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "shape dim 0 is not a non-negative integer");
  reject(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "end before they begin");
  reject(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
         "tensor 'b': data_offsets [4, 12] overlap");
  reject(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20),
         "tensor 'b': data_offsets [12, 20] leave a gap");
  reject(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12), "tensor 'a': data_offsets [4, 12] leave a gap");
  reject(raw_file(ok, 4), "(truncated)");
  reject(raw_file(ok, 12), "(trailing bytes)");
  reject(raw_file(R"({"__metadata__":{"format":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8), "__metadata__ value of 'format'");
  reject(raw_file(R"({"a":{"dtype":"F32","shape":[2]}})", 8), "tensor 'a': entry needs dtype, shape and data_offsets");
  reject(raw_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})", 8), "more than 2^64");
}

TEST_CASE("checkpoint: Hugging Face sharded index (weight_map)") {
  scratch_dir dir;
  host_tensor a = iota(dtype::f32, {4, 2}), b = iota(dtype::bf16, {3});
  save_safetensors(dir / "model-00001-of-00002.safetensors", {{"a", a.view()}});
  save_safetensors(dir / "model-00002-of-00002.safetensors", {{"b", b.view()}});
  spit(dir / "model.safetensors.index.json",
       R"({"metadata":{"total_size":38},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})");
  checkpoint ck(dir.path);
  CHECK(ck.names() == std::vector<std::string>{"a", "b"});
  CHECK(bitwise_equal(ck.view("a"), a.view()));
  CHECK(bitwise_equal(ck.view("b"), b.view()));
  spit(dir / "model.safetensors.index.json", R"({"weight_map":{"a":"model-00002-of-00002.safetensors"}})");
  CHECK_THROWS_AS(checkpoint(dir.path), io_error);
  spit(dir / "model.safetensors.index.json", R"({"weight_map":{"a":"../x.safetensors"}})");
  CHECK_THROWS_AS(checkpoint(dir.path), io_error);
  spit(dir / "model.safetensors.index.json", R"({"weight_map":{"a":"missing.safetensors"}})");
  CHECK_THROWS_AS(checkpoint(dir.path), io_error);
}

// ---------------------------------------------------------------------------------------------
// Sharding checkpoints: small models with real Hugging Face names and layouts.
namespace {
struct model_spec {
  std::vector<std::pair<std::string, tensor_shape>> params;
  dtype type = dtype::f32;
  model_config config;
};
void add_layers(int layers, const std::function<void(const std::string&)>& f) {
  for (int i = 0; i < layers; ++i) f(std::to_string(i));
}
// H = 16 wide, 4 heads, FFN 64, vocab 30: tiny, but every name and layout as Hugging Face has it.
model_spec gpt2_model() {
  model_spec m;
  m.config = {{"n_head", 4}, {"n_embd", 16}};
  auto& p = m.params;
  p = {{"transformer.wte.weight", {30, 16}}, {"transformer.wpe.weight", {8, 16}}};
  add_layers(2, [&](const std::string& i) {
    const std::string h = "transformer.h." + i + ".";
    p.insert(p.end(), {{h + "ln_1.weight", {16}}, {h + "ln_1.bias", {16}}, {h + "attn.c_attn.weight", {16, 48}},
                       {h + "attn.c_attn.bias", {48}}, {h + "attn.c_proj.weight", {16, 16}}, {h + "attn.c_proj.bias", {16}},
                       {h + "ln_2.weight", {16}}, {h + "ln_2.bias", {16}}, {h + "mlp.c_fc.weight", {16, 64}},
                       {h + "mlp.c_fc.bias", {64}}, {h + "mlp.c_proj.weight", {64, 16}}, {h + "mlp.c_proj.bias", {16}}});
  });
  p.insert(p.end(), {{"transformer.ln_f.weight", {16}}, {"transformer.ln_f.bias", {16}}, {"lm_head.weight", {30, 16}}});
  return m;
}
model_spec bert_model() {
  model_spec m;
  m.type = dtype::f16;
  m.config = {{"num_attention_heads", 4}, {"hidden_size", 16}, {"intermediate_size", 64}};
  auto& p = m.params;
  p = {{"bert.embeddings.word_embeddings.weight", {30, 16}}, {"bert.embeddings.position_embeddings.weight", {8, 16}},
       {"bert.embeddings.token_type_embeddings.weight", {2, 16}}, {"bert.embeddings.LayerNorm.weight", {16}},
       {"bert.embeddings.LayerNorm.bias", {16}}};
  add_layers(2, [&](const std::string& i) {
    const std::string l = "bert.encoder.layer." + i + ".";
    for (const char* q : {"query", "key", "value"})
      p.insert(p.end(), {{l + "attention.self." + q + ".weight", {16, 16}}, {l + "attention.self." + q + ".bias", {16}}});
    p.insert(p.end(), {{l + "attention.output.dense.weight", {16, 16}}, {l + "attention.output.dense.bias", {16}},
                       {l + "attention.output.LayerNorm.weight", {16}}, {l + "attention.output.LayerNorm.bias", {16}},
                       {l + "intermediate.dense.weight", {64, 16}}, {l + "intermediate.dense.bias", {64}},
                       {l + "output.dense.weight", {16, 64}}, {l + "output.dense.bias", {16}},
                       {l + "output.LayerNorm.weight", {16}}, {l + "output.LayerNorm.bias", {16}}});
  });
  p.insert(p.end(), {{"bert.pooler.dense.weight", {16, 16}}, {"bert.pooler.dense.bias", {16}}});
  return m;
}
model_spec llama_model() {  // grouped-query: 4 q heads, 2 kv heads, head_dim 4
  model_spec m;
  m.type = dtype::bf16;
  m.config = {{"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"hidden_size", 16}, {"intermediate_size", 40}};
  auto& p = m.params;
  p = {{"model.embed_tokens.weight", {30, 16}}};
  add_layers(2, [&](const std::string& i) {
    const std::string l = "model.layers." + i + ".";
    p.insert(p.end(), {{l + "input_layernorm.weight", {16}}, {l + "self_attn.q_proj.weight", {16, 16}},
                       {l + "self_attn.k_proj.weight", {8, 16}}, {l + "self_attn.v_proj.weight", {8, 16}},
                       {l + "self_attn.o_proj.weight", {16, 16}}, {l + "post_attention_layernorm.weight", {16}},
                       {l + "mlp.gate_proj.weight", {40, 16}}, {l + "mlp.up_proj.weight", {40, 16}},
                       {l + "mlp.down_proj.weight", {16, 40}}});
  });
  p.insert(p.end(), {{"model.norm.weight", {16}}, {"lm_head.weight", {30, 16}}});
  return m;
}
model_spec opt_model() {
  model_spec m;
  m.config = {{"num_attention_heads", 4}, {"hidden_size", 16}, {"ffn_dim", 64}};
  auto& p = m.params;
  p = {{"model.decoder.embed_tokens.weight", {30, 16}}, {"model.decoder.embed_positions.weight", {10, 16}}};
  add_layers(2, [&](const std::string& i) {
    const std::string l = "model.decoder.layers." + i + ".";
    for (const char* q : {"q_proj", "k_proj", "v_proj", "out_proj"})
      p.insert(p.end(), {{l + "self_attn." + q + ".weight", {16, 16}}, {l + "self_attn." + q + ".bias", {16}}});
    p.insert(p.end(), {{l + "self_attn_layer_norm.weight", {16}}, {l + "fc1.weight", {64, 16}}, {l + "fc1.bias", {64}},
                       {l + "fc2.weight", {16, 64}}, {l + "fc2.bias", {16}}, {l + "final_layer_norm.weight", {16}}});
  });
  p.push_back({"model.decoder.final_layer_norm.weight", {16}});
  return m;
}
model_spec neox_model() {
  model_spec m;
  m.type = dtype::f16;
  m.config = {{"num_attention_heads", 4}, {"hidden_size", 16}, {"intermediate_size", 64}};
  auto& p = m.params;
  p = {{"gpt_neox.embed_in.weight", {30, 16}}};
  add_layers(2, [&](const std::string& i) {
    const std::string l = "gpt_neox.layers." + i + ".";
    p.insert(p.end(), {{l + "input_layernorm.weight", {16}}, {l + "attention.query_key_value.weight", {48, 16}},
                       {l + "attention.query_key_value.bias", {48}}, {l + "attention.dense.weight", {16, 16}},
                       {l + "attention.dense.bias", {16}}, {l + "mlp.dense_h_to_4h.weight", {64, 16}},
                       {l + "mlp.dense_h_to_4h.bias", {64}}, {l + "mlp.dense_4h_to_h.weight", {16, 64}},
                       {l + "mlp.dense_4h_to_h.bias", {16}}});
  });
  p.insert(p.end(), {{"gpt_neox.final_layer_norm.weight", {16}}, {"embed_out.weight", {30, 16}}});
  return m;
}
model_spec bloom_model() {
  model_spec m;
  m.type = dtype::bf16;
  m.config = {{"n_head", 4}, {"hidden_size", 16}};
  auto& p = m.params;
  p = {{"transformer.word_embeddings.weight", {30, 16}}, {"transformer.word_embeddings_layernorm.weight", {16}}};
  add_layers(2, [&](const std::string& i) {
    const std::string l = "transformer.h." + i + ".";
    p.insert(p.end(), {{l + "input_layernorm.weight", {16}}, {l + "self_attention.query_key_value.weight", {48, 16}},
                       {l + "self_attention.query_key_value.bias", {48}}, {l + "self_attention.dense.weight", {16, 16}},
                       {l + "self_attention.dense.bias", {16}}, {l + "mlp.dense_h_to_4h.weight", {64, 16}},
                       {l + "mlp.dense_h_to_4h.bias", {64}}, {l + "mlp.dense_4h_to_h.weight", {16, 64}},
                       {l + "mlp.dense_4h_to_h.bias", {16}}});
  });
  p.push_back({"transformer.ln_f.weight", {16}});
  return m;
}
// Random bytes (NaN patterns included): only a bit-exact path survives them.
std::map<std::string, host_tensor> materialise(const model_spec& m, std::uint64_t seed) {
  std::map<std::string, host_tensor> out;
  for (const auto& [name, shape] : m.params) {
    host_tensor t(m.type, shape);
    for (std::size_t i = 0; i < t.nbytes(); ++i) {
      seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
      t.data()[i] = static_cast<std::byte>(seed >> 56);
    }
    out.emplace(name, std::move(t));
  }
  return out;
}
void save_model(const fs::path& file, const std::map<std::string, host_tensor>& ts) {
  std::vector<std::pair<std::string, const_tensor_view>> v;
  for (const auto& [n, t] : ts) v.emplace_back(n, t.view());
  save_safetensors(file, v, {{"format", "pt"}});
}
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> s;
  for (const auto& e : fs::directory_iterator(dir)) s[e.path().filename().string()] = slurp(e.path());
  return s;
}
void check_roundtrip(const fs::path& out, const std::map<std::string, host_tensor>& original, int world) {
  sharded_checkpoint sc(out);
  REQUIRE(sc.world_size() == world);
  CHECK(sc.names().size() == original.size());
  for (const auto& entry : original) {
    const std::string& name = entry.first;  // a named variable: clang 14 cannot capture bindings
    CAPTURE(name);
    host_tensor g = sc.gather(name);
    CHECK(bitwise_equal(g.view(), entry.second.view()));
  }
  for (int r = 0; r < world; ++r) CHECK(sc.rank(r).metadata().at("autoshard.rank") == std::to_string(r));
}
}  // namespace

TEST_CASE("shard_checkpoint: every built-in policy, gathered back bit for bit") {
  struct model_case {
    const char* name;
    model_spec spec;
    tp_policy policy;
  };
  const model_case cases[] = {{"gpt2", gpt2_model(), policies::gpt2()},         {"bert", bert_model(), policies::bert()},
                              {"llama", llama_model(), policies::llama()},      {"opt", opt_model(), policies::opt()},
                              {"gpt_neox", neox_model(), policies::gpt_neox()}, {"bloom", bloom_model(), policies::bloom()}};
  std::uint64_t seed = 1;
  for (const auto& c : cases) {
    CAPTURE(c.name);
    scratch_dir dir;
    auto model = materialise(c.spec, seed++);
    save_model(dir / "model.safetensors", model);
    checkpoint in(dir.path);
    for (int tp : {2, 4}) {
      if (c.spec.config.count("num_key_value_heads") && tp == 4) continue;  // 2 kv heads
      CAPTURE(tp);
      const fs::path out = dir / ("tp" + std::to_string(tp));
      auto report = shard_checkpoint(in, c.policy, tp, c.spec.config, out);
      CHECK(report.world_size == tp);
      check_roundtrip(out, model, tp);
      for (const auto& e : fs::directory_iterator(out))  // temporaries all renamed
        CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
    }
  }
}

TEST_CASE("shard_checkpoint: rank files hold Megatron's shards, index records rule, spec, offsets, bias") {
  scratch_dir dir;
  auto m = gpt2_model();
  auto model = materialise(m, 42);
  save_model(dir / "model.safetensors", model);
  checkpoint in(dir / "model.safetensors");
  std::vector<shard_progress> seen;
  shard_options o;
  o.progress = [&](const shard_progress& p) { seen.push_back(p); };
  shard_checkpoint(in, policies::gpt2(), 4, m.config, dir / "out", o);
  REQUIRE(!seen.empty());
  CHECK(seen.size() == model.size());
  for (std::size_t i = 1; i < seen.size(); ++i) CHECK(seen[i].bytes_done >= seen[i - 1].bytes_done);
  CHECK(seen.back().bytes_done == seen.back().bytes_total);
  sharded_checkpoint sc(dir / "out");
  // c_attn: rank r holds columns r*4..r*4+3 of q, k and v (16 wide each), concatenated.
  const auto& full = model.at("transformer.h.1.attn.c_attn.weight");
  for (int r = 0; r < 4; ++r) {
    const_tensor_view s = sc.shard(r, "transformer.h.1.attn.c_attn.weight");
    REQUIRE(s.shape() == tensor_shape{16, 12});
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 12; ++j)
        CHECK(std::memcmp(s.data() + (i * 12 + j) * 4, full.data() + (i * 48 + (j / 4) * 16 + r * 4 + j % 4) * 4, 4) == 0);
  }
  const auto& idx = sc.index();
  CHECK(idx["version"] == 3);
  CHECK(idx["mesh"] == nlohmann::json::parse(R"({"axes": [{"size": 4}]})"));  // the mesh's spelling, no links
  CHECK(idx["attributes"]["attn.num_heads"] == 1);
  CHECK(idx["tensors"]["transformer.h.0.attn.c_proj.bias"]["add_after_allreduce"] == true);
  CHECK(idx["tensors"]["transformer.h.0.mlp.c_fc.bias"]["add_after_allreduce"] == false);
  CHECK(idx["tensors"]["transformer.h.0.mlp.c_proj.weight"]["spec"] == "[S(0)]");
  CHECK(idx["tensors"]["transformer.h.0.attn.c_attn.weight"]["shards"][2]["pieces"][1]["offset"] ==
        nlohmann::json::array({0, 24}));
  CHECK(idx["tensors"]["transformer.wte.weight"]["rule"] == "replicate");
  CHECK(sc.add_after_allreduce("transformer.h.1.mlp.c_proj.bias"));
}

TEST_CASE("shard_checkpoint: Hugging Face sharded input, plan policy on a 2-D mesh, dtype conversion") {
  scratch_dir dir;
  auto m = llama_model();
  auto model = materialise(m, 7);
  {  // a two-file checkpoint with model.safetensors.index.json
    std::map<std::string, host_tensor> a, b;
    nlohmann::json wm;
    for (auto& [n, t] : model) {
      bool first = n.find("layers.1") == std::string::npos;
      wm[n] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
      (first ? a : b).emplace(n, host_tensor::copy_of(t.view()));
    }
    save_model(dir / "model-00001-of-00002.safetensors", a);
    save_model(dir / "model-00002-of-00002.safetensors", b);
    spit(dir / "model.safetensors.index.json", nlohmann::json{{"metadata", nlohmann::json::object()}, {"weight_map", wm}}.dump());
  }
  checkpoint in(dir.path);
  REQUIRE(in.files().size() == 2);
  SUBCASE("policy over a sharded input") {
    shard_checkpoint(in, policies::llama(), 2, m.config, dir / "tp2");
    check_roundtrip(dir / "tp2", model, 2);
  }
  SUBCASE("solved plan: S01R, RS1, S0S1 on mesh(2,2), uneven") {
    plan_policy plan{device_mesh{2, 2}, {}, split_rule::chunk};
    plan.mesh.set_axis_name(0, "dp").set_axis_name(1, "tp");  // the plan's names go into the index
    plan.specs["model.embed_tokens.weight"] = parse_spec("S01R", 2, 2);      // 30 -> 15|15 -> 8,7|8,7
    plan.specs["model.layers.0.mlp.up_proj.weight"] = parse_spec("S0S1", 2, 2);
    plan.specs["model.layers.1.self_attn.k_proj.weight"] = parse_spec("RS01", 2, 2);
    plan.specs["lm_head.weight"] = parse_spec("[S(0),S(0)]", 2, 2);
    shard_checkpoint(in, plan, dir / "plan");
    check_roundtrip(dir / "plan", model, 4);
    sharded_checkpoint sc(dir / "plan");
    CHECK(sc.shard(3, "model.embed_tokens.weight").shape() == tensor_shape{7, 16});
    CHECK(sc.index()["mesh"] == nlohmann::json::parse(R"({"axes": [{"size": 2}, {"size": 2}], "axis_names": ["dp", "tp"]})"));
    plan.specs["not.there"] = parse_spec("S0R", 2, 2);
    CHECK_THROWS_AS(shard_checkpoint(in, plan, dir / "plan2"), io_error);
    CHECK(!fs::exists(dir / "plan2"));
  }
  SUBCASE("conversion to f32 and back: every value survives") {
    shard_options o;
    o.convert_to = dtype::f32;
    shard_checkpoint(in, policies::llama(), 2, m.config, dir / "f32", o);
    sharded_checkpoint sc(dir / "f32");
    for (const auto& [n, t] : model) {
      host_tensor g = sc.gather(n);
      REQUIRE(g.type() == dtype::f32);
      CHECK(bitwise_equal(convert(g.view(), dtype::bf16).view(), convert(convert(t.view(), dtype::f32).view(), dtype::bf16).view()));
    }
  }
}

TEST_CASE("shard_checkpoint: invalid input never touches the output directory, failures leave no half file") {
  scratch_dir dir;
  auto m = gpt2_model();
  auto model = materialise(m, 3);
  save_model(dir / "model.safetensors", model);
  const fs::path out = dir / "out";
  fs::create_directories(out);
  spit(out / "rank-0.safetensors", "previous contents");
  spit(out / "notes.txt", "keep me");
  const auto before = snapshot(out);
  checkpoint in(dir / "model.safetensors");
  SUBCASE("heads that do not divide") {
    CHECK_THROWS_AS(shard_checkpoint(in, policies::gpt2(), 3, m.config, out), shape_error);
  }
  SUBCASE("missing config attribute") {
    CHECK_THROWS_AS(shard_checkpoint(in, policies::gpt2(), 2, {}, out), shape_error);
  }
  SUBCASE("a failure half-way (the progress callback throws after the third tensor)") {
    shard_options o;
    int calls = 0;
    o.progress = [&](const shard_progress&) {
      if (++calls == 3) throw std::runtime_error("interrupted");
    };
    CHECK_THROWS_AS(shard_checkpoint(in, policies::gpt2(), 2, m.config, out, o), std::runtime_error);
  }
  SUBCASE("malformed input files are rejected before sharding starts") {
    const std::string good = slurp(dir / "model.safetensors");
    std::string truncated = good.substr(0, good.size() - 5);
    std::string bad_len = le64(1ull << 40) + good.substr(8);
    std::string bad_json = good;
    bad_json[8 + 3] = '\xff';
    for (const std::string& bytes : {truncated, bad_len, bad_json}) {
      spit(dir / "bad.safetensors", bytes);
      CHECK_THROWS_AS(
          [&] {
            checkpoint bad(dir / "bad.safetensors");
            shard_checkpoint(bad, policies::gpt2(), 2, m.config, out);
          }(),
          io_error);
    }
  }
  CHECK(snapshot(out) == before);
}

TEST_CASE("shard_checkpoint: uneven plans with empty shards round-trip") {
  scratch_dir dir;
  model_spec m;
  m.params = {{"tiny", {3, 2}}, {"v", {5}}, {"s", {}}};
  auto model = materialise(m, 11);
  save_model(dir / "model.safetensors", model);
  checkpoint in(dir / "model.safetensors");
  plan_policy plan{device_mesh{2, 2}, {{"tiny", parse_spec("S01R", 2, 2)}, {"v", parse_spec("S01", 2, 1)}},
                   split_rule::chunk};
  shard_checkpoint(in, plan, dir / "out");
  sharded_checkpoint sc(dir / "out");
  CHECK(sc.shard(3, "tiny").shape() == tensor_shape{0, 2});  // 3 -> 2|1 -> 1,1|1,0
  CHECK(sc.shard(1, "v").shape() == tensor_shape{1});       // 5 -> 3|2 -> 2,1|1,1
  CHECK(sc.shard(2, "s").shape().rank == 0);                // scalars are replicated
  check_roundtrip(dir / "out", model, 4);
}

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
#include <iterator>
#include <string>
#include <vector>

#include "tensor_test_util.hpp"

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

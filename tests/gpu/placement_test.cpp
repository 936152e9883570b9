// Placement of checkpoint shards on CUDA devices (include/autoshard/device/placement.hpp):
// every uploaded shard is downloaded and compared bit for bit with the host shard.
// Several ranks may share one device, so one GPU exercises every path.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <autoshard/device/placement.hpp>

using namespace autoshard;
namespace fs = std::filesystem;

namespace {
struct temp_dir {
  fs::path path = fs::temp_directory_path() / ("autoshard-gpu-placement-" + std::to_string(::getpid()));
  temp_dir() { fs::create_directories(path); }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};
host_tensor random_tensor(dtype t, tensor_shape s, std::uint64_t seed) {
  host_tensor h(t, s);
  for (std::size_t i = 0; i < h.nbytes(); ++i) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    h.data()[i] = static_cast<std::byte>(seed >> 56);
  }
  return h;
}
// A small GPT-2 shaped checkpoint (width 16, 4 heads) in `dir`.
std::map<std::string, host_tensor> write_gpt2(const fs::path& file) {
  std::map<std::string, host_tensor> m;
  m.emplace("transformer.wte.weight", random_tensor(dtype::f32, {30, 16}, 1));
  m.emplace("transformer.h.0.attn.c_attn.weight", random_tensor(dtype::f32, {16, 48}, 2));
  m.emplace("transformer.h.0.attn.c_attn.bias", random_tensor(dtype::f32, {48}, 3));
  m.emplace("transformer.h.0.attn.c_proj.weight", random_tensor(dtype::f32, {16, 16}, 4));
  m.emplace("transformer.h.0.attn.c_proj.bias", random_tensor(dtype::f32, {16}, 5));
  m.emplace("transformer.h.0.mlp.c_fc.weight", random_tensor(dtype::f32, {16, 64}, 6));
  m.emplace("transformer.h.0.mlp.c_proj.weight", random_tensor(dtype::f32, {64, 16}, 7));
  std::vector<std::pair<std::string, const_tensor_view>> v;
  for (const auto& [n, t] : m) v.emplace_back(n, t.view());
  save_safetensors(file, v);
  return m;
}
}  // namespace

TEST_CASE("placement: policy shards on explicit devices equal the host shards bit for bit") {
  temp_dir dir;
  auto model = write_gpt2(dir.path / "model.safetensors");
  checkpoint in(dir.path / "model.safetensors");
  const int n = cuda_device_count();
  std::vector<int> devices;
  for (int r = 0; r < 4; ++r) devices.push_back((n - 1 - r % n + n) % n);  // explicit, reversed order
  const model_config cfg{{"n_head", 4}, {"n_embd", 16}};
  upload_options o;
  o.staging_bytes = 4096;  // forces several chunks through the double buffers
  auto ranks = upload_shards(in, policies::gpt2(), cfg, devices, o);
  REQUIRE(ranks.size() == 4);
  for (int r = 0; r < 4; ++r) {
    CHECK(ranks[static_cast<std::size_t>(r)].device == devices[static_cast<std::size_t>(r)]);
    for (const auto& entry : model) {
      const std::string& name = entry.first;  // clang 14 cannot capture structured bindings
      const host_tensor& t = entry.second;
      CAPTURE(name);
      CAPTURE(r);
      auto plan = shards_of(policies::gpt2(), name, t.shape(), t.type(), 4, cfg);
      host_tensor want = extract(t.view(), plan.ranks[static_cast<std::size_t>(r)]);
      const device_tensor& d = ranks[static_cast<std::size_t>(r)].tensors.at(name);
      CHECK(d.device() == devices[static_cast<std::size_t>(r)]);
      CHECK(bitwise_equal(d.download().view(), want.view()));
    }
  }
}

TEST_CASE("placement: solved plan on mesh(2,2), bf16 conversion, rank files, single tensors") {
  temp_dir dir;
  auto model = write_gpt2(dir.path / "model.safetensors");
  checkpoint in(dir.path / "model.safetensors");
  std::vector<int> devices(4, 0);
  plan_policy plan{device_mesh{2, 2}, {{"transformer.wte.weight", parse_spec("S01R", 2, 2)},
                                      {"transformer.h.0.mlp.c_fc.weight", parse_spec("S0S1", 2, 2)}},
                   split_rule::chunk};
  upload_options o;
  o.convert_to = dtype::bf16;
  auto ranks = upload_shards(in, plan, devices, o);
  for (int r = 0; r < 4; ++r)
    for (const auto& [name, t] : model) {
      auto p = shards_of(plan, name, t.shape(), t.type());
      host_tensor want = convert(extract(t.view(), p.ranks[static_cast<std::size_t>(r)]).view(), dtype::bf16);
      CHECK(bitwise_equal(ranks[static_cast<std::size_t>(r)].tensors.at(name).download().view(), want.view()));
    }
  shard_checkpoint(in, policies::gpt2(), 2, {{"n_head", 4}, {"n_embd", 16}}, dir.path / "tp2");
  sharded_checkpoint sc(dir.path / "tp2");
  auto r1 = upload_rank(sc, 1, 0);
  for (const auto& name : sc.names())
    CHECK(bitwise_equal(r1.tensors.at(name).download().view(), sc.shard(1, name)));
  host_tensor big = random_tensor(dtype::f16, {1000, 333}, 9);
  CHECK(bitwise_equal(upload(big.view(), 0).download().view(), big.view()));
}

TEST_SUITE("no_device") {
  TEST_CASE("placement: a missing device is a device_error, never a crash") {
    CHECK_THROWS_AS(require_cuda_device(cuda_device_count()), device_error);
    CHECK_THROWS_AS(require_cuda_device(-1), device_error);
    host_tensor t(dtype::f32, {4});
    try {
      (void)upload(t.view(), cuda_device_count());
      FAIL("upload to a device that does not exist did not throw");
    } catch (const device_error& e) {
      const std::string what = e.what();
      CHECK((what.find("no CUDA device") != std::string::npos || what.find("does not exist") != std::string::npos));
    }
  }
}

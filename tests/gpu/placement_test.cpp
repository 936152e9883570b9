// Placement of checkpoint shards on CUDA devices (include/autoshard/device/placement.hpp):
// every uploaded shard is downloaded and compared bit for bit with the host shard.
// Several ranks may share one device, so one GPU exercises every path.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
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

namespace {
/// Every 16-bit pattern as f16 or bf16, or f32 edge cases and random bit patterns: zeros,
/// infinities, NaNs with payloads (quiet and signalling), f32 subnormals, the f16 overflow
/// and subnormal boundaries, bf16 rounding ties.
host_tensor conversion_source(dtype t) {
  if (t != dtype::f32) {
    host_tensor h(t, {65536});
    for (std::uint32_t i = 0; i < 65536; ++i) {
      const auto b = static_cast<std::uint16_t>(i);
      std::memcpy(h.data() + 2 * i, &b, 2);
    }
    return h;
  }
  std::vector<std::uint32_t> bits{0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
                                  0x7f800001u, 0xff812345u, 0x7fbfffffu, 0x00000001u, 0x807fffffu, 0x00400000u,
                                  0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u, 0xc77ff000u, 0x33000000u,
                                  0x33000001u, 0x337fffffu, 0x387fe000u, 0x387ff000u, 0x38800000u, 0x3f808000u,
                                  0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7f8000u, 0x7f7f7fffu};
  std::uint64_t seed = 12345;
  while (bits.size() < (std::size_t{1} << 20)) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    bits.push_back(static_cast<std::uint32_t>(seed >> 32));
  }
  host_tensor h(dtype::f32, {static_cast<std::int64_t>(bits.size())});
  std::memcpy(h.data(), bits.data(), h.nbytes());
  return h;
}

/// "" when a and b hold the same bits, else how many elements differ and the first.
std::string bit_differences(const host_tensor& got, const host_tensor& want, const host_tensor& src) {
  if (got.type() != want.type() || !(got.shape() == want.shape())) return "different dtype or shape";
  const std::size_t es = dtype_size(got.type()), in_es = dtype_size(src.type());
  std::size_t wrong = 0, first = 0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(got.numel()); ++i)
    if (std::memcmp(got.data() + i * es, want.data() + i * es, es) != 0 && wrong++ == 0) first = i;
  if (wrong == 0) return {};
  auto hex = [](const std::byte* p, std::size_t n) {
    std::uint64_t v = 0;
    std::memcpy(&v, p, n);
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
    return std::string(buf);
  };
  return std::to_string(wrong) + " elements differ; the first, " + std::to_string(first) + ": source " +
         hex(src.data() + first * in_es, in_es) + " -> device " + hex(got.data() + first * es, es) + ", host " +
         hex(want.data() + first * es, es);
}
}  // namespace

TEST_CASE("placement: conversions on the device equal the host's bit for bit") {
  // The kernel is PTX the driver compiles; on a GPU machine it must load.
  REQUIRE_MESSAGE(device_converts(dtype::f32, dtype::bf16), device_conversion_error());
  for (dtype from : {dtype::f32, dtype::f16, dtype::bf16})
    for (dtype to : {dtype::f32, dtype::f16, dtype::bf16}) {
      if (from == to) continue;
      CAPTURE(to_string(from));
      CAPTURE(to_string(to));
      const host_tensor src = conversion_source(from);
      const host_tensor want = convert(src.view(), to);
      for (convert_site site : {convert_site::device, convert_site::host}) {
        CAPTURE(site == convert_site::device ? "device" : "host");
        upload_options o;
        o.convert_to = to;
        o.convert_on = site;
        o.staging_bytes = std::size_t{1} << 20;  // 128 KiB slots: several chunks
        const device_tensor d = upload(src.view(), 0, o);
        CHECK(d.type() == to);
        const host_tensor got = d.download();
        const std::string diff = bit_differences(got, want, src);
        CHECK_MESSAGE(diff.empty(), diff);
      }
    }
}

TEST_CASE("placement: a reused uploader streams many chunks on several threads, and uploads reuse pooled staging") {
  const int devices[1] = {0};
  upload_options o;
  o.staging_bytes = std::size_t{64} << 10;  // 8 slots of 8 KiB: each tensor passes through every slot many times
  o.staging_threads = 4;
  device_uploader up(devices, o);
  CHECK(up.staging_threads() == 4);
  CHECK(up.staging_bytes() == (std::size_t{64} << 10));
  std::vector<host_tensor> sources;
  std::vector<device_tensor> dests;
  std::vector<host_tensor> wants;
  for (int k = 0; k < 6; ++k) {
    const dtype from = k % 3 == 2 ? dtype::bf16 : dtype::f32;
    const dtype to = k % 3 == 1 ? dtype::bf16 : dtype::f32;
    sources.push_back(random_tensor(from, {333 + k, 517}, static_cast<std::uint64_t>(k) + 40));
    // Random bits hold NaNs: the host conversion is the reference either way.
    wants.push_back(convert(sources.back().view(), to));
    dests.emplace_back(0, to, sources.back().shape());
    up.copy(sources.back().data(), from, dests.back());  // no synchronize between copies
  }
  up.synchronize();
  for (std::size_t k = 0; k < sources.size(); ++k) {
    CAPTURE(k);
    const std::string diff = bit_differences(dests[k].download(), wants[k], sources[k]);
    CHECK_MESSAGE(diff.empty(), diff);
  }
  // upload() takes its staging from the pool: the second and later calls allocate none.
  const host_tensor t = random_tensor(dtype::f32, {1024, 1024}, 99);
  (void)upload(t.view(), 0);
  const std::size_t made = detail::cuda_staging_pool().made();
  for (int i = 0; i < 5; ++i) CHECK(bitwise_equal(upload(t.view(), 0).download().view(), t.view()));
  CHECK(detail::cuda_staging_pool().made() == made);
  release_upload_staging();
  CHECK(detail::cuda_staging_pool().idle({0, upload_options{}.staging_bytes}) == 0);
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

// The NCCL backend on device buffers: one rank per visible GPU (threads of this process),
// every collective checked against the host reference (reduce_elements, self_communicator
// semantics) bit for bit, fp16/bf16 conversions checked against CUDA's own, groups, mesh
// axes, host-buffer rejection, and timeouts that abort into comm_error.
#include <doctest/doctest.h>

#include <chrono>   // std::chrono
#include <cstdint>  // std::int32_t, std::int64_t, std::uint16_t, std::uint8_t
#include <cstring>  // std::memcpy, std::memcmp
#include <string>   // std::string
#include <vector>   // std::vector

#include <autoshard/comm/communicator.hpp>  // reduce_elements, float_to_f16, float_to_bf16
#include <autoshard/core/mesh.hpp>          // device_mesh
#include <autoshard/device/nccl.hpp>        // nccl_communicator, nccl_mesh_communicator

#include "gpu_test_util.hpp"  // device_bytes, upload, download, run_device_ranks
#include "kernels.hpp"        // fill_labels_f32, fill_labels_half

using namespace autoshard;
using namespace autoshard::gpu_test;
using namespace std::chrono_literals;

namespace {

/// Rank r's element i of dtype t as raw bytes: small integers, so that every sum over up
/// to 8 ranks is exact in every dtype (bf16 included) and the order NCCL adds in cannot
/// change a bit.
std::vector<std::byte> rank_values(dtype t, int r, std::size_t n) {
  std::vector<std::byte> out(n * dtype_size(t));
  for (std::size_t i = 0; i < n; ++i) {
    const int k = static_cast<int>((i * 7 + static_cast<std::size_t>(r) * 3) % 23);
    const float x = static_cast<float>(k - 11);
    auto put = [&](auto v) { std::memcpy(out.data() + i * sizeof(v), &v, sizeof(v)); };
    switch (t) {
      case dtype::f32: put(x); break;
      case dtype::f64: put(static_cast<double>(x)); break;
      case dtype::i32: put(static_cast<std::int32_t>(k - 11)); break;
      case dtype::i64: put(static_cast<std::int64_t>(k - 11) * 1000000007LL); break;
      case dtype::u8: put(static_cast<std::uint8_t>(k)); break;
      case dtype::boolean: put(static_cast<std::uint8_t>((i + static_cast<std::size_t>(r)) % 3 == 0)); break;
      case dtype::f16: put(float_to_f16(x)); break;
      case dtype::bf16: put(float_to_bf16(x)); break;
    }
  }
  return out;
}

/// True when f() throws comm_error (the ranks' threads report through exceptions, not doctest).
template <class F>
bool throws_comm_error(F&& f) {
  try {
    f();
  } catch (const comm_error&) {
    return true;
  }
  return false;
}

device_bytes upload_bytes(const std::vector<std::byte>& host) { return upload(host); }

std::vector<std::byte> download_bytes(const device_bytes& d) { return download<std::byte>(d, d.size()); }

template <class T>
std::vector<T> iota_values(std::size_t n, T start) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(start + static_cast<T>(i));
  return v;
}

}  // namespace

TEST_SUITE("no_device") {
  TEST_CASE("nccl: the library reports its version without a device") {
    CHECK(nccl_communicator::library_version() >= 21800);  // ncclCommSplit needs 2.18
  }

  TEST_CASE("nccl: without a device, connect throws device_error naming the rank") {
    if (nccl_communicator::device_count() > 0) {
      MESSAGE("a CUDA device is visible: the no-device path is not exercised here");
      return;
    }
    nccl_memory_store store;
    try {
      (void)nccl_communicator::connect(store, 0, 1);
      FAIL("connect without a device did not throw");
    } catch (const device_error& e) {
      const std::string what = e.what();
      CHECK(what.find("rank 0") != std::string::npos);
      CHECK(what.find("CUDA") != std::string::npos);
    }
  }

  TEST_CASE("nccl: a communicator that never connected throws comm_error, not a crash") {
    nccl_communicator c;
    CHECK_FALSE(c.is_open());
    CHECK_THROWS_AS(c.all_reduce(nullptr, 4, dtype::f32, reduce_op::sum), comm_error);
    CHECK_THROWS_AS(c.barrier(), comm_error);
    CHECK_THROWS_AS(c.broadcast(nullptr, 1, dtype::f32, 0), comm_error);
    nccl_communicator moved = std::move(c);
    CHECK_FALSE(moved.is_open());
  }
}

TEST_CASE("nccl: one communicator per device connects through the store") {
  const int n = test_ranks();
  REQUIRE(n >= 1);
  auto errors = run_device_ranks(n, [n](nccl_communicator& c) {
    if (c.size() != n || c.device() != c.rank() || !c.is_open() || c.stream() == nullptr)
      throw comm_error("unexpected communicator: " + c.who());
    if (c.who().find("cuda:" + std::to_string(c.device())) == std::string::npos) throw comm_error("who(): " + c.who());
    c.barrier();
  });
  CHECK_MESSAGE(first_error(errors).empty(), first_error(errors));
}

TEST_CASE("nccl: all-reduce of every dtype and op matches the host reduction bit for bit") {
  const int n = test_ranks();
  struct run_case {
    dtype t;
    reduce_op op;
    std::size_t count;
    std::vector<std::byte> expected;
  };
  std::vector<run_case> cases;
  for (dtype t : all_dtypes)
    for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min})
      for (std::size_t count : {std::size_t{1}, std::size_t{1023}, std::size_t{65537}}) {
        std::vector<std::byte> expected = rank_values(t, 0, count);
        for (int r = 1; r < n; ++r) {
          const auto other = rank_values(t, r, count);
          reduce_elements(expected.data(), expected.data(), other.data(), count, t, op);
        }
        cases.push_back({t, op, count, std::move(expected)});
      }
  std::vector<std::vector<std::string>> wrong(static_cast<std::size_t>(n));
  auto errors = run_device_ranks(n, [&](nccl_communicator& c) {
    for (const run_case& k : cases) {
      device_bytes buf = upload_bytes(rank_values(k.t, c.rank(), k.count));
      c.all_reduce(buf.get(), k.count, k.t, k.op);
      if (download_bytes(buf) != k.expected)
        wrong[static_cast<std::size_t>(c.rank())].push_back(c.who() + ": " + std::string(to_string(k.op)) + " of " +
                                                            std::to_string(k.count) + " " + std::string(to_string(k.t)));
    }
  });
  REQUIRE_MESSAGE(first_error(errors).empty(), first_error(errors));
  for (const auto& w : wrong) CHECK_MESSAGE(w.empty(), (w.empty() ? std::string() : w.front()) << " (" << w.size() << " cases wrong)");
}

TEST_CASE("nccl: fp16 and bf16 labels rounded on the device equal the host conversions") {
  nccl_memory_store store;
  nccl_communicator c = nccl_communicator::connect(store, 0, 1, {.device = 0});
  const std::size_t count = std::size_t{1} << 16;
  // Normal values, values below the f16 normal range (subnormals), and values past 65504.
  for (float scale : {0.0137f, 1e-6f, 3.0f}) {
    for (bool bf16 : {false, true}) {
      CAPTURE(scale);
      CAPTURE(bf16);
      const float offset = -static_cast<float>(count) / 3.0f;
      device_bytes d(count * 2);
      cuda_ok(fill_labels_half(d.as<std::uint16_t>(), count, offset, scale, bf16, c.stream()), "fill_labels_half");
      cuda_ok(cudaStreamSynchronize(c.stream()), "cudaStreamSynchronize");
      const auto device_bits = download<std::uint16_t>(d, count);
      std::size_t mismatches = 0, first = count;
      for (std::size_t i = 0; i < count; ++i) {
        const float v = (offset + static_cast<float>(i)) * scale;
        const std::uint16_t host = bf16 ? float_to_bf16(v) : float_to_f16(v);
        if (host != device_bits[i]) {
          ++mismatches;
          if (first == count) first = i;
        }
      }
      CHECK_MESSAGE(mismatches == 0, mismatches << " mismatches, first at " << first);
      // A max all-reduce of one rank's data with itself is exact: the values come back.
      const dtype t = bf16 ? dtype::bf16 : dtype::f16;
      c.all_reduce(d.get(), count, t, reduce_op::max);
      CHECK(download<std::uint16_t>(d, count) == device_bits);
      c.all_reduce(d.get(), count, t, reduce_op::sum);
      if (c.size() == 1) CHECK(download<std::uint16_t>(d, count) == device_bits);
    }
  }
}

TEST_CASE("nccl: all-gather, reduce-scatter, all-to-all and broadcast deliver the right labels") {
  const int n = test_ranks();
  const std::size_t count = 4099;  // per rank, odd on purpose
  const std::size_t total = count * static_cast<std::size_t>(n);
  auto errors = run_device_ranks(n, [&](nccl_communicator& c) {
    const int r = c.rank();
    auto expect = [&](bool ok, const std::string& what) {
      if (!ok) throw comm_error(c.who() + ": wrong result of " + what);
    };
    {  // all-gather of f32 labels: the result is 0 .. total-1 in rank order
      device_bytes in = upload(iota_values<float>(count, static_cast<float>(static_cast<std::size_t>(r) * count)));
      device_bytes out(total * sizeof(float));
      c.all_gather(in.get(), out.get(), count, dtype::f32);
      expect(download<float>(out, total) == iota_values<float>(total, 0.0f), "all-gather");
    }
    {  // reduce-scatter (sum) of i32: element j of the input of rank q is j + q
      device_bytes in = upload(iota_values<std::int32_t>(total, r));
      device_bytes out(count * sizeof(std::int32_t));
      c.reduce_scatter(in.get(), out.get(), count, dtype::i32, reduce_op::sum);
      std::vector<std::int32_t> want(count);
      for (std::size_t k = 0; k < count; ++k) {
        const auto j = static_cast<std::int32_t>(static_cast<std::size_t>(r) * count + k);
        want[k] = j * n + n * (n - 1) / 2;
      }
      expect(download<std::int32_t>(out, count) == want, "reduce-scatter");
    }
    {  // all-to-all of i64: block j of rank q holds q * 10^9 + j * count + k
      std::vector<std::int64_t> host(total);
      for (std::size_t j = 0; j < total; ++j) host[j] = static_cast<std::int64_t>(r) * 1000000000LL + static_cast<std::int64_t>(j);
      device_bytes in = upload(host);
      device_bytes out(total * sizeof(std::int64_t));
      c.all_to_all(in.get(), out.get(), count, dtype::i64);
      std::vector<std::int64_t> want(total);
      for (int q = 0; q < n; ++q)
        for (std::size_t k = 0; k < count; ++k)
          want[static_cast<std::size_t>(q) * count + k] =
              static_cast<std::int64_t>(q) * 1000000000LL + static_cast<std::int64_t>(static_cast<std::size_t>(r) * count + k);
      expect(download<std::int64_t>(out, total) == want, "all-to-all");
    }
    {  // broadcast from the last rank: bf16 labels everywhere
      const int root = n - 1;
      std::vector<std::uint16_t> labels(count);
      for (std::size_t k = 0; k < count; ++k) labels[k] = float_to_bf16(static_cast<float>(k) * 0.25f);
      device_bytes buf = upload(r == root ? labels : std::vector<std::uint16_t>(count, 0));
      c.broadcast(buf.get(), count, dtype::bf16, root);
      expect(download<std::uint16_t>(buf, count) == labels, "broadcast");
    }
    {  // zero elements: nothing moves, nothing fails
      c.all_reduce(nullptr, 0, dtype::f32, reduce_op::sum);
      c.all_gather(nullptr, nullptr, 0, dtype::f32);
      c.barrier();
    }
  });
  CHECK_MESSAGE(first_error(errors).empty(), first_error(errors));
}

TEST_CASE("nccl: a group launches several buffers as one step") {
  const int n = test_ranks();
  const std::size_t count = 10007;
  auto errors = run_device_ranks(n, [&](nccl_communicator& c) {
    device_bytes a = upload(std::vector<float>(count, 1.5f));
    device_bytes b = upload(std::vector<std::int64_t>(count, c.rank() + 1));
    device_bytes h = upload(std::vector<std::uint16_t>(count, float_to_f16(2.0f)));
    c.group([&] {
      c.all_reduce(a.get(), count, dtype::f32, reduce_op::sum);
      c.all_reduce(b.get(), count, dtype::i64, reduce_op::max);
      c.all_reduce(h.get(), count, dtype::f16, reduce_op::sum);
    });
    const bool ok = download<float>(a, count) == std::vector<float>(count, 1.5f * static_cast<float>(n)) &&
                    download<std::int64_t>(b, count) == std::vector<std::int64_t>(count, n) &&
                    download<std::uint16_t>(h, count) ==
                        std::vector<std::uint16_t>(count, float_to_f16(2.0f * static_cast<float>(n)));
    if (!ok) throw comm_error(c.who() + ": wrong result of the grouped all-reduces");
  });
  CHECK_MESSAGE(first_error(errors).empty(), first_error(errors));
}

TEST_CASE("nccl: mesh axes are sub-communicators of the mesh's groups, and a one-rank axis is local") {
  // 1xN, Nx1 and 2x(N/2) meshes: each axis holds device_mesh::group(axis, rank). Axes of one
  // rank are everywhere (1x8, a data-parallel axis of 1): they need no NCCL communicator,
  // and their collectives are the one-rank results: all-reduce and broadcast leave the
  // data, all-gather, reduce-scatter and all-to-all copy it.
  const int n = test_ranks();
  std::vector<device_mesh> meshes{device_mesh{1, n}};
  if (n > 1) meshes.push_back(device_mesh{n, 1});
  if (n >= 4 && n % 2 == 0) meshes.push_back(device_mesh{2, n / 2});
  const std::size_t count = 1031;
  for (const device_mesh& mesh : meshes) {
    CAPTURE(to_string(mesh));
    auto errors = run_device_ranks(n, [&](nccl_communicator& world) {
      const int me = world.rank();
      nccl_mesh_communicator mc(std::move(world), mesh);
      for (std::size_t a = 0; a < mesh.ndim(); ++a) {
        nccl_communicator& ax = mc.axis(a);
        const std::vector<int> group = mesh.group(a, me);
        const bool one = group.size() == 1;
        auto expect = [&](bool ok, const std::string& what) {
          if (!ok) throw comm_error(ax.who() + ": axis " + std::to_string(a) + ": " + what);
        };
        expect(ax.members() == group && ax.is_open(), "wrong members or closed");
        expect(ax.is_local() == one && (ax.native_handle() == nullptr) == one,
               one ? "a one-rank axis holds an NCCL communicator" : "a multi-rank axis has no NCCL communicator");
        const auto g = static_cast<std::size_t>(ax.size());
        std::vector<float> mine(count);
        for (std::size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(me * 100000) + static_cast<float>(i);
        {  // all-reduce (sum of the group's labels) and a broadcast from the group's rank 0
          device_bytes v = upload(mine);
          ax.all_reduce(v.get(), count, dtype::f32, reduce_op::sum);
          std::vector<float> want(count, 0.0f);
          for (int q : group)
            for (std::size_t i = 0; i < count; ++i) want[i] += static_cast<float>(q * 100000) + static_cast<float>(i);
          expect(download<float>(v, count) == want, "all-reduce");
          device_bytes b = upload(mine);
          ax.broadcast(b.get(), count, dtype::f32, 0);
          std::vector<float> root(count);
          for (std::size_t i = 0; i < count; ++i) root[i] = static_cast<float>(group[0] * 100000) + static_cast<float>(i);
          expect(download<float>(b, count) == root, "broadcast");
          if (one) expect(throws_comm_error([&] { ax.broadcast(b.get(), count, dtype::f32, 1); }), "root 1 accepted");
        }
        {  // all-gather into rank order, reduce-scatter of it back to this rank's block (times g)
          device_bytes in = upload(mine);
          device_bytes all(g * count * sizeof(float));
          ax.all_gather(in.get(), all.get(), count, dtype::f32);
          std::vector<float> want;
          for (int q : group)
            for (std::size_t i = 0; i < count; ++i) want.push_back(static_cast<float>(q * 100000) + static_cast<float>(i));
          expect(download<float>(all, g * count) == want, "all-gather");
          device_bytes out(count * sizeof(float));
          ax.reduce_scatter(all.get(), out.get(), count, dtype::f32, reduce_op::sum);
          std::vector<float> scaled(mine);
          for (float& x : scaled) x *= static_cast<float>(g);
          expect(download<float>(out, count) == scaled, "reduce-scatter");
        }
        {  // all-to-all, inside a group with an all-reduce: one step, waited for once
          std::vector<std::int32_t> blocks(g * count);
          for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = me * 1000000 + static_cast<std::int32_t>(i);
          device_bytes in = upload(blocks);
          device_bytes out(blocks.size() * sizeof(std::int32_t));
          device_bytes ones = upload(std::vector<std::int32_t>(count, 1));
          ax.group([&] {
            ax.all_to_all(in.get(), out.get(), count, dtype::i32);
            ax.all_reduce(ones.get(), count, dtype::i32, reduce_op::sum);
          });
          std::vector<std::int32_t> want(g * count);
          const auto my_index = static_cast<std::size_t>(ax.rank());
          for (std::size_t q = 0; q < g; ++q)
            for (std::size_t k = 0; k < count; ++k)
              want[q * count + k] = group[q] * 1000000 + static_cast<std::int32_t>(my_index * count + k);
          expect(download<std::int32_t>(out, g * count) == want, "all-to-all");
          expect(download<std::int32_t>(ones, count) == std::vector<std::int32_t>(count, static_cast<std::int32_t>(g)),
                 "grouped all-reduce");
        }
        ax.barrier();
        std::vector<float> host(16, 1.0f);  // a one-rank axis refuses host memory too
        expect(throws_comm_error([&] { ax.all_reduce(host.data(), host.size(), dtype::f32, reduce_op::sum); }),
               "a host buffer accepted");
      }
      mc.world().barrier();
    });
    CHECK_MESSAGE(first_error(errors).empty(), first_error(errors));
  }
}

TEST_CASE("nccl: a one-rank split of a one-rank world calls nothing and aborts like any other") {
  nccl_memory_store store;
  nccl_communicator world = nccl_communicator::connect(store, 0, 1, {.device = 0});
  nccl_communicator one = world.split({0}, "solo");
  CHECK(one.is_local());
  CHECK(one.is_open());
  CHECK(one.native_handle() == nullptr);
  CHECK(one.who().find("solo group [0]") != std::string::npos);
  nccl_communicator again = one.split({0}, "again");  // a split of a local group is local too
  CHECK(again.is_local());
  CHECK_THROWS_AS((void)one.split({1}, "outside"), comm_error);
  device_bytes v = upload(std::vector<float>(8, 2.0f));
  one.all_reduce(v.get(), 8, dtype::f32, reduce_op::sum);
  CHECK(download<float>(v, 8) == std::vector<float>(8, 2.0f));
  one.abort();
  CHECK_FALSE(one.is_open());
  try {
    one.all_reduce(v.get(), 8, dtype::f32, reduce_op::sum);
    FAIL("all-reduce on an aborted one-rank group");
  } catch (const comm_error& e) {
    CHECK(std::string(e.what()).find("aborted") != std::string::npos);
  }
  nccl_communicator moved = std::move(again);
  CHECK(moved.is_local());
  CHECK(moved.is_open());
  world.barrier();  // the world is untouched
}

TEST_CASE("nccl: host buffers are refused with comm_error naming the memory") {
  nccl_memory_store store;
  nccl_communicator c = nccl_communicator::connect(store, 0, 1, {.device = 0});
  std::vector<float> host(16, 1.0f);
  try {
    c.all_reduce(host.data(), host.size(), dtype::f32, reduce_op::sum);
    FAIL("a host buffer was accepted");
  } catch (const comm_error& e) {
    CHECK(std::string(e.what()).find("host memory") != std::string::npos);
  }
  CHECK(c.is_open());  // refusing a buffer does not break the communicator
  c.barrier();
}

TEST_CASE("nccl: an aborted communicator fails fast") {
  nccl_memory_store store;
  nccl_communicator c = nccl_communicator::connect(store, 0, 1, {.device = 0});
  c.abort();
  CHECK_FALSE(c.is_open());
  try {
    c.barrier();
    FAIL("barrier on an aborted communicator");
  } catch (const comm_error& e) {
    CHECK(std::string(e.what()).find("aborted") != std::string::npos);
  }
}

TEST_CASE("nccl: a peer that never comes times out into comm_error") {
  SUBCASE("no unique id: rank 1 waits for a rank 0 that never publishes") {
    nccl_memory_store store;
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS((void)nccl_communicator::connect(store, 1, 2, {.device = 0, .timeout = 500ms}), comm_error);
    CHECK(std::chrono::steady_clock::now() - start < 20s);
  }
  SUBCASE("init: rank 0 of 2 waits for a rank 1 that never joins, then aborts") {
    // In a child process: if aborting a pending init ever hung, only the child would.
    const child_result r = run_child("init-timeout", 60s);
    INFO(r.output);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("rank 0") != std::string::npos);
    CHECK(r.output.find("ncclCommInitRankConfig") != std::string::npos);
  }
}

TEST_CASE("nccl: an error inside a group closes the group and aborts the communicator") {
  nccl_memory_store store;
  nccl_communicator c = nccl_communicator::connect(store, 0, 1, {.device = 0});
  device_bytes ok = upload(std::vector<float>(64, 1.0f));
  std::vector<float> host(64, 1.0f);
  CHECK_THROWS_AS(c.group([&] {
    c.all_reduce(ok.get(), 64, dtype::f32, reduce_op::sum);
    c.all_reduce(host.data(), 64, dtype::f32, reduce_op::sum);  // refused: host memory
  }),
                  comm_error);
  CHECK_FALSE(c.is_open());
  // The thread's NCCL group is closed: a fresh communicator works normally.
  nccl_memory_store store2;
  nccl_communicator d = nccl_communicator::connect(store2, 0, 1, {.device = 0});
  d.all_reduce(ok.get(), 64, dtype::f32, reduce_op::max);
  CHECK(download<float>(ok, 64) == std::vector<float>(64, 1.0f));
}

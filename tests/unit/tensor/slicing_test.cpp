// Host tensors, float conversions, block copies, shard_of / gather over every kind of spec.
// Label tests: each element holds its global flat index, so a shard says exactly where it came from.
#include <autoshard/autoshard.hpp>
#include <autoshard/tensor/tensor.hpp>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

using namespace autoshard;

namespace {
host_tensor labels(tensor_shape s) {
  host_tensor t(dtype::i64, s);
  auto* p = t.as<std::int64_t>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = i;
  return t;
}
std::int64_t flat(const tensor_shape& g, const std::vector<std::int64_t>& idx) {
  std::int64_t f = 0;
  for (std::size_t d = 0; d < g.rank; ++d) f = f * g[d] + idx[d];
  return f;
}
// Every element of `shard` must be the label at offset + local index.
void check_box(const host_tensor& shard, const tensor_shape& global, const shard_box& box) {
  REQUIRE(shard.shape() == box.shape);
  const auto* p = shard.as<std::int64_t>();
  std::vector<std::int64_t> idx(global.rank, 0);
  for (std::int64_t i = 0; i < shard.numel(); ++i) {
    std::int64_t rem = i;
    for (std::size_t d = global.rank; d-- > 0;) {
      idx[d] = rem % box.shape[d] + box.offset[d];
      rem /= box.shape[d];
    }
    if (p[i] != flat(global, idx)) {
      FAIL_CHECK("element " << i << " holds label " << p[i] << ", expected " << flat(global, idx));
      return;
    }
  }
}
void roundtrip(const device_mesh& m, const sharding_spec& s, tensor_shape g) {
  CAPTURE(to_string(s));
  CAPTURE(to_string(g));
  host_tensor t = labels(g);
  std::vector<host_tensor> shards;
  for (int r = 0; r < m.num_ranks(); ++r) {
    shards.push_back(shard_of(t.view(), m, s, r));
    check_box(shards.back(), g, local_box(m, s, g, r));
  }
  std::vector<const_tensor_view> views(shards.begin(), shards.end());
  host_tensor back = gather(views, m, s, g);
  CHECK(bitwise_equal(back.view(), t.view()));
}
}  // namespace

TEST_CASE("host_tensor: owning, views, Eigen maps") {
  host_tensor t(dtype::f32, {2, 3});
  CHECK(t.nbytes() == 24);
  CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % 64 == 0);
  t.matrix<float>() << 1, 2, 3, 4, 5, 6;
  CHECK(t.as<float>()[3] == 4.f);  // row-major
  CHECK(t.matrix<float>().row(1).sum() == 15.f);
  const_tensor_view v = t.view();
  CHECK(v.vector<float>().size() == 6);
  CHECK_THROWS_AS(v.as<double>(), error);
  std::vector<std::int32_t> raw{1, 2, 3, 4};
  tensor_view rv(raw.data(), tensor_shape{4});
  CHECK(rv.type() == dtype::i32);
  rv.vector<std::int32_t>() *= 2;
  CHECK(raw[3] == 8);
  host_tensor c = host_tensor::copy_of(rv);
  CHECK(bitwise_equal(c.view(), rv));
  raw[0] = 7;
  CHECK(!bitwise_equal(c.view(), rv));
}

TEST_CASE("convert: float dtypes round to nearest even, like torch") {
  host_tensor t(dtype::f32, {4});
  t.vector<float>() << 1.0f, 1.00390625f /* 1+2^-8: a bf16 tie */, 3.14159265f, -65504.f;
  host_tensor b = convert(t.view(), dtype::bf16);
  const auto* bp = reinterpret_cast<const std::uint16_t*>(b.data());
  CHECK(bp[0] == 0x3f80);
  CHECK(bp[1] == 0x3f80);  // tie rounds to even
  CHECK(bp[2] == 0x4049);  // 3.140625
  host_tensor h = convert(t.view(), dtype::f16);
  const auto* hp = reinterpret_cast<const std::uint16_t*>(h.data());
  CHECK(hp[0] == 0x3c00);
  CHECK(hp[3] == 0xfbff);  // -65504, the largest finite half
  host_tensor back = convert(h.view(), dtype::f32);
  CHECK(back.as<float>()[3] == -65504.f);
  host_tensor d = convert(b.view(), dtype::f64);
  CHECK(d.as<double>()[2] == 3.140625);
  CHECK(bitwise_equal(convert(t.view(), dtype::f32).view(), t.view()));
  host_tensor i(dtype::i32, {2});
  CHECK_THROWS_AS(convert(i.view(), dtype::f32), error);
}

TEST_CASE("copy_block: inner runs, bounds and dtype checks") {
  host_tensor g = labels({3, 4, 5});
  host_tensor out(dtype::i64, {2, 2, 5});
  copy_block(g.view(), {1, 1, 0}, out.view(), {0, 0, 0}, {2, 2, 5});
  check_box(out, {3, 4, 5}, {{2, 2, 5}, {1, 1, 0}});
  host_tensor small(dtype::i64, {2, 2, 5});
  CHECK_THROWS_AS(copy_block(g.view(), {2, 1, 0}, small.view(), {0, 0, 0}, {2, 2, 5}), shape_error);
  host_tensor f(dtype::f32, {2, 2, 5});
  CHECK_THROWS_AS(copy_block(g.view(), {0, 0, 0}, f.view(), {0, 0, 0}, {2, 2, 5}), shape_error);
  host_tensor s0(dtype::i64, {});
  host_tensor s1(dtype::i64, {});
  s0.as<std::int64_t>()[0] = 42;
  copy_block(s0.view(), {}, s1.view(), {}, {});
  CHECK(s1.as<std::int64_t>()[0] == 42);
}

TEST_CASE("shard_of / gather: every spec kind on 1-D and 2-D meshes, labels checked") {
  SUBCASE("1-D mesh of 4, even and uneven (chunk rule 5/4 -> 2,2,1,0)") {
    device_mesh m{4};
    roundtrip(m, parse_spec("S0R", 1, 2), {8, 3});
    roundtrip(m, parse_spec("RS0", 1, 2), {3, 8});
    roundtrip(m, parse_spec("S0R", 1, 2), {5, 3});
    roundtrip(m, parse_spec("RS0", 1, 2), {3, 6});
    roundtrip(m, parse_spec("RR", 1, 2), {3, 6});
    roundtrip(m, parse_spec("S0", 1, 1), {5});
    CHECK(local_box(m, parse_spec("S0R", 1, 2), {5, 3}, 3).shape[0] == 0);
  }
  SUBCASE("2-D mesh: both axes, two axes on one dim, transposed order") {
    device_mesh m{2, 4};
    roundtrip(m, parse_spec("S0S1", 2, 2), {6, 8});
    roundtrip(m, parse_spec("S1S0", 2, 2), {7, 5});
    roundtrip(m, parse_spec("S01R", 2, 2), {10, 3});  // nested, uneven: 5 -> 2,2,1,0 per half
    roundtrip(m, parse_spec("RS01", 2, 2), {3, 16});
    roundtrip(m, parse_spec("S1R", 2, 2), {4, 3});
    roundtrip(m, parse_spec("RRS01", 2, 3), {2, 3, 9});
    roundtrip(m, parse_spec("[R,R]", 2, 3), {2, 3, 4});
  }
  SUBCASE("3-D mesh, rank-4 tensor") {
    device_mesh m{2, 2, 2};
    roundtrip(m, parse_spec("S0S2RS1", 3, 4), {4, 3, 5, 6});
  }
  SUBCASE("balanced rule on request") {
    device_mesh m{4};
    auto s = parse_spec("S0", 1, 1);
    host_tensor t = labels({6});
    host_tensor r3 = shard_of(t.view(), m, s, 3, split_rule::balanced);
    CHECK(r3.numel() == 1);
    CHECK(r3.as<std::int64_t>()[0] == 5);
  }
}

TEST_CASE("gather rejects wrong shard counts, shapes and diverging replicas") {
  device_mesh m{2};
  auto s = parse_spec("RS0", 1, 2);
  host_tensor t = labels({2, 4});
  host_tensor a = shard_of(t.view(), m, s, 0), b = shard_of(t.view(), m, s, 1);
  std::vector<const_tensor_view> one{a.view()};
  CHECK_THROWS_AS(gather(one, m, s, {2, 4}), shape_error);
  std::vector<const_tensor_view> swapped{a.view(), t.view()};
  CHECK_THROWS_AS(gather(swapped, m, s, {2, 4}), shape_error);
  auto rep = parse_spec("RR", 1, 2);
  host_tensor c = host_tensor::copy_of(t.view());
  c.as<std::int64_t>()[5] = -1;
  std::vector<const_tensor_view> diverged{t.view(), c.view()};
  CHECK_THROWS_AS(gather(diverged, m, rep, {2, 4}), shape_error);
  CHECK_THROWS_AS(shard_of(t.view(), m, parse_spec("[P]", 1, 2), 0), spec_error);
}

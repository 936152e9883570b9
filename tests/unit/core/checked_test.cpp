// The one checked-arithmetic helper (core/checked.hpp): overflow is an error naming the
// quantity, never a wrapped number; and the mesh sizes that used to wrap.
#include <autoshard/core/checked.hpp>
#include <autoshard/core/cost.hpp>
#include <autoshard/core/dtype.hpp>
#include <autoshard/core/mesh.hpp>
#include <autoshard/core/parse.hpp>
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

using namespace autoshard;

namespace {
template <class F>
std::string checked_error(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.what();
  }
  return "(no error)";
}
bool names(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("checked: products, sums and byte counts that overflow name the quantity") {
  constexpr std::int64_t big = std::int64_t{1} << 62;
  CHECK(checked_mul(3, 4, "x") == 12);
  CHECK(names(checked_error([&] { (void)checked_mul(big, 2, "bytes of 'w'"); }),
              "shape error: bytes of 'w': 4611686018427387904 x 2 exceeds 2^63-1"));
  CHECK(names(checked_error([&] { (void)checked_add(big, big, "sum"); }), "sum: 4611686018427387904 + 4611686018427387904"));
  CHECK(checked_numel(tensor_shape{1000000, 1000000}, "s") == 1000000000000);
  CHECK(names(checked_error([] { (void)checked_numel(tensor_shape{1000000000000, 1000000000000}, "--shape"); }),
              "--shape: the element count of [1000000000000,1000000000000] exceeds 2^63-1"));
  CHECK(names(checked_error([] { (void)checked_bytes(tensor_shape{std::int64_t{1} << 61, 2}, 8, "t"); }), "exceeds 2^63-1"));
  static_assert(checked_mul(6, 7, "static") == 42);  // the same function at compile time
}

TEST_CASE("checked: times in milliseconds refuse nan, inf and negative") {
  CHECK(checked_milliseconds(1.5, "--timeout") == 1500);
  CHECK(checked_milliseconds(0.0001, "--timeout") == 1);  // rounded up: never a zero wait
  for (double bad : {std::numeric_limits<double>::infinity(), std::nan(""), -1.0, 1e300})
    CHECK(names(checked_error([&] { (void)checked_milliseconds(bad, "--timeout"); }),
                "spec error: --timeout must be a finite number of seconds"));
}

TEST_CASE("checked: a mesh whose rank count does not fit an int, and meshes read from text, are refused") {
  // 46341 x 46341 = 2147488281 ranks: num_ranks() wrapped to -2147479015 before.
  CHECK(names(checked_error([] { device_mesh m{46341, 46341}; }), "is more than 2147483647 ranks"));
  CHECK(device_mesh{46340, 46340}.num_ranks() == 46340 * 46340);
  CHECK(names(checked_error([] { (void)parse_mesh("65536x65536"); }), "has more than 1048576 ranks"));
  CHECK(names(checked_error([] { check_mesh_size({99999999, 99999999}, "plan"); }),
              "plan: axis size 99999999 is not in [1, 1000000]"));
  CHECK_NOTHROW(check_mesh_size({1024, 1024}, "plan"));
}

TEST_CASE("checked: pricing a redistribution of a tensor beyond 2^63 bytes is an error, not negative bytes") {
  const device_mesh m{2, 2};
  const tensor_shape huge{1000000000000, 1000000000000};
  const auto src = parse_spec("S0S1", 2, 2), dst = parse_spec("RR", 2, 2);
  // Before: "bytes" -8.5e18 and a negative time, exit 0.
  CHECK(names(checked_error([&] { (void)price_plan(m, plan_redistribute(m, src, dst), huge, dtype::f64); }),
              "exceeds 2^63-1"));
}

TEST_CASE("numbers: a link's bandwidth is in [1, 1e18] bytes/s, as every plan and calibration reader takes it") {
  const auto links = [](double inter, double intra, std::string_view backend = "nccl") {
    cluster_links c;
    c.inter_node_bandwidth = inter;
    c.intra_node_bandwidth = intra;
    c.communications_backend = backend;
    return c;
  };
  // 0.5 B/s priced plans the plan reader then refused ("bandwidth_Bps is 0.5, not a number in
  // [1, 1e+18]"); 1e-300 B/s priced steps of 1e293 s.
  for (double bad : {0.5, 1e-300, 0.0, -1.0, 2e18, std::nan(""), std::numeric_limits<double>::infinity()})
    CHECK(names(checked_error([&] { (void)make_cluster_mesh({2, 2}, links(25e9, bad)); }), "spec error: intra_node_bandwidth is "));
  CHECK(names(checked_error([&] { (void)make_cluster_mesh({2, 2}, links(0.5, 300e9)); }),
              "inter_node_bandwidth is 0.5 bytes/s, not in [1, 1e+18]"));
  // gloo achieves half: the link the mesh gets must still be one a reader takes back.
  CHECK(names(checked_error([&] { (void)make_cluster_mesh({2, 2}, links(1.5, 300e9, "gloo")); }),
              "inter_node_bandwidth is 1.5 bytes/s, of which gloo achieves half, 0.75, below the least a link may have, 1 byte/s"));
  const device_mesh slow = make_cluster_mesh({2, 2}, links(min_link_bandwidth, max_link_bandwidth));
  CHECK(slow.link(0).beta == min_link_bandwidth);
  CHECK(slow.link(1).beta == max_link_bandwidth);
  CHECK(make_cluster_mesh({2, 2}, links(2, 300e9, "gloo")).link(0).beta == 1.0);
}

TEST_CASE("numbers: human_seconds keeps its unit and a table's width at any size") {
  CHECK(human_seconds(1.5e-6) == "1.5 us");
  CHECK(human_seconds(6e-8) == "0.1 us");
  // Below 0.05 us "%.1f us" read "0.0 us", a zero the time is not.
  CHECK(human_seconds(1e-9) == "1 ns");
  CHECK(human_seconds(4.26e-8) == "42.6 ns");
  CHECK(human_seconds(1e-12) == "1e-12 s");
  CHECK(human_seconds(4.9e-324) == "4.94e-324 s");
  CHECK(human_seconds(-2e-6) == "-2.0 us");
  CHECK(human_seconds(17568.0) == "17568.00 s");
  CHECK(human_seconds(999999.0) == "999999.00 s");
  // "%.2f" of 1.7e293 s had 297 characters, cut to 31 without its unit; 1.2e8 s ran into the
  // next column of plan's table.
  CHECK(human_seconds(1.7568e293) == "1.76e+293 s");
  CHECK(human_seconds(122064384.0) == "1.22e+08 s");
  CHECK(human_seconds(std::numeric_limits<double>::infinity()) == "inf s");
  CHECK(human_seconds(std::nan("")) == "nan s");
  for (double s : {1e6, 1e29, 1e300, std::numeric_limits<double>::max()}) CHECK(human_seconds(s).size() <= 11);
}

TEST_CASE("numbers: a dim within a mesh axis of 2^63-1 splits without overflow") {
  // (n + k - 1) / k overflowed for such a dim (undefined behaviour): at compile time, where
  // these are evaluated, an overflow is an error, so the static_asserts fail on such code.
  constexpr std::int64_t n = std::numeric_limits<std::int64_t>::max();
  static_assert(ceil_div(n, 2) == std::int64_t{1} << 62);
  static_assert(ceil_div(7, 2) == 4 && ceil_div(8, 2) == 4 && ceil_div(0, 3) == 0);
  static_assert(padded_piece(n, 3) == 3074457345618258603);
  static_assert(split_range(n, 2, 0) == dim_range{0, std::int64_t{1} << 62});
  static_assert(split_range(n, 2, 1) == dim_range{std::int64_t{1} << 62, (std::int64_t{1} << 62) - 1});
  static_assert(split_range(n, 1000000, 999999).offset + split_range(n, 1000000, 999999).size == n);
  const device_mesh m{2, 4};
  const sharding_spec s = parse_spec("S0S1", 2, 2);
  std::int64_t rows = 0;
  for (int r = 0; r < m.num_ranks(); r += 4) rows += local_box(m, s, tensor_shape{n, 8}, r).shape[0];
  CHECK(rows == n);  // the pieces of dim 0 over axis 0 make the dim
  CHECK(local_box(m, s, tensor_shape{n, 8}, 3).shape[1] == 2);
}
